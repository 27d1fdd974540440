"""The `scaler` command. Each subcommand lives in the part it belongs to; this only wires them."""

import argparse
import sys

from scaler import up
from simulator import cli as simulate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scaler", description="An event-sourced autoscaler for serverless functions")
    sub = parser.add_subparsers(dest="command", required=True)
    up.add_arguments(sub.add_parser("up", help="run the whole scaler on this machine", description=up.__doc__))
    simulate.add_arguments(
        sub.add_parser(
            "simulate",
            help="replay a dataset against the scaler and score it",
            description=simulate.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    commands = {"up": up.run, "simulate": simulate.run}
    sys.exit(commands[args.command](args))


if __name__ == "__main__":
    main()
