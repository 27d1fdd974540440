"""The `scaler` command. Each subcommand lives in the part it belongs to; this only wires them."""

import argparse
import sys
from importlib.metadata import version

from scaler import replay
from scaler.cli import admin, node, up
from scaler.simulator import cli as simulate
from scaler.simulator import sweep
from scaler.traces import cli as trace

SUBCOMMANDS = {  # name: (module with add_arguments, run and a docstring, one-line help)
    "up": (up, "run the whole scaler on this machine"),
    "node": (node, "serve the gRPC Scaler service with the controller, in one process"),
    "replay": (replay, "rebuild the state from the event stream, show it or verify it"),
    "simulate": (simulate, "replay a dataset against the scaler and score it"),
    "sweep": (sweep, "simulate a policy as its knobs move, on every core: the trade-off curve and its page"),
    "trace": (trace, "convert the field's public traces (Azure 2019, 2021, Huawei) to datasets"),
    "functions": (admin.List, "list the functions the running nodes hold, with their instances by phase"),
    "instances": (admin.Instances, "a function's instances with their stats, from the node that owns it"),
    "restart": (admin.Restart, "restart a function's instances (idle ones now, busy ones when released), or one"),
    "stop": (admin.Stop, "stop one instance of a function (now, or once released)"),
    "set": (admin.Set, "set a function's limits, policy or version while it runs"),
    "delete": (admin.Delete, "delete a function: destroy its instances and refuse its calls until created again"),
    "create": (admin.Create, "create a deleted function again"),
    "delete-state": (admin.DeleteState, "delete a state: its route, and the instance that holds it"),
    "tenants": (admin.Tenants, "the tenants' quotas and what their functions hold on every node"),
    "quota": (admin.Quota, "set a tenant's quotas for every node"),
    "nodes": (admin.Nodes, "the running nodes, their partitions and how long ago their leases were renewed"),
    "drain": (admin.Drain, "make a node hand its partitions to the other nodes, then stop"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with its default, when it has one (a flag, or no value, has none to show)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if not action.option_strings or action.default in (None, False, "", argparse.SUPPRESS) or "%(default)" in help:
            return help
        return f"{help} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaler", description="An event-sourced autoscaler for serverless functions")
    parser.add_argument("--version", action="version", version=f"scaler {version('scaler')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help) in SUBCOMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help, description=module.__doc__, formatter_class=HelpFormatter))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    module, _ = SUBCOMMANDS[args.command]
    sys.exit(module.run(args))


if __name__ == "__main__":
    main()
