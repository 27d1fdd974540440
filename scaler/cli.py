"""The `scaler` command. Each subcommand lives in the part it belongs to; this only wires them."""

import argparse
import sys

from controller import replay
from scaler import up
from simulator import cli as simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaler", description="An event-sourced autoscaler for serverless functions")
    sub = parser.add_subparsers(dest="command", required=True)
    up.add_arguments(sub.add_parser("up", help="run the whole scaler on this machine", description=up.__doc__))
    replay.add_arguments(
        sub.add_parser(
            "replay",
            help="rebuild the state from the event stream, show it or verify it",
            description=replay.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    simulate.add_arguments(
        sub.add_parser(
            "simulate",
            help="replay a dataset against the scaler and score it",
            description=simulate.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    commands = {"up": up.run, "replay": replay.run, "simulate": simulate.run}
    sys.exit(commands[args.command](args))


if __name__ == "__main__":
    main()
