"""The command path, counted: which functions a warm Assign and an Idle go through in the node, and what each makes.

    python bench/path.py [--policy demo] [--list]

A node in this process (embedded nats-server syncing every write, the platform stub, the workers, the
controller and its gRPC gateway), one function warmed up, then one warm Assign and one Idle, each from
the gateway's handler to its answer and until nothing of it is under way any more (an Idle's release and
plan stored), traced with `sys.setprofile`: every Python function entered meanwhile, by this process's
event loop, whatever task runs it (the lease rounds and timers of the node included, should they run). A
table per call: the functions and files of the scaler entered, those of the libraries (nats.py, gRPC's
Python, msgspec's), and the tasks, futures and timers made; then each of those by who made it (the first
caller outside asyncio: the scaler's, or a library's). `--list` prints the scaler's functions in the order
first entered: the command path as a call takes it.
"""

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.proto import serverless_sim_pb2 as pb  # noqa: E402
from scaler.runtime.natsd import NatsServer  # noqa: E402
from tests.stack import Stack  # noqa: E402

SCALER = str(ROOT / "scaler")
ASYNCIO = str(Path(asyncio.__file__).parent)
MADE = {"create_task": "tasks", "create_future": "futures", "call_at": "timers"}  # BaseEventLoop's methods


class Context:
    """The gRPC servicer context as the gateway reads it: no deadline, no metadata."""

    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple:
        return ()

    async def abort(self, code, details) -> None:
        raise RuntimeError(f"{code}: {details}")


class Trace:
    def __init__(self) -> None:
        self.entered: dict[tuple[str, str], int] = {}  # (file, function) -> order first entered
        self.made: Counter[str] = Counter()
        self.makers: Counter[tuple[str, str]] = Counter()  # (what, who made it) -> how many

    def __call__(self, frame, event: str, arg) -> None:
        if event == "call":
            code = frame.f_code
            self.entered.setdefault((code.co_filename, code.co_qualname), len(self.entered))
            if code.co_qualname.startswith("BaseEventLoop.") and (what := MADE.get(code.co_name)):
                self.made[what] += 1
                self.makers[what, maker(frame.f_back)] += 1

    def ours(self) -> list[tuple[str, str]]:
        return sorted((k for k in self.entered if k[0].startswith(SCALER)), key=self.entered.get)

    def row(self, call: str) -> str:
        ours = self.ours()
        files = {f for f, _ in ours}
        libraries = [k for k in self.entered if "site-packages" in k[0] or "/lib/python" in k[0]]
        made = ", ".join(f"{self.made[k]} {k}" for k in ("tasks", "futures", "timers"))
        return f"| {call} | {len(ours)} | {len(files)} | {len(libraries)} | {made} |"


def maker(frame) -> str:
    """Who made a task, future or timer: the first caller outside asyncio, the scaler's or a library's."""
    while frame is not None and frame.f_code.co_filename.startswith(ASYNCIO):
        frame = frame.f_back
    if frame is None:
        return "asyncio"
    file, name = frame.f_code.co_filename, frame.f_code.co_qualname
    if file.startswith(SCALER):
        return f"scaler: {Path(file).relative_to(ROOT)} {name}"
    return f"{file.split('site-packages/')[-1]} {name}"


async def traced(stack: Stack, call) -> Trace:
    trace = Trace()
    sys.setprofile(trace)
    try:
        await call()
        for _ in range(10_000):  # what the call left behind its answer (an Idle's release, the plans) stored
            await asyncio.sleep(0)
            if not stack.controller.lanes.busy:
                break
    finally:
        sys.setprofile(None)
    return trace


async def main(policy: str, listed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            NatsServer(Path(tmp) / "nats") as nats,
            Stack(nats.url, policy=policy, nats_monitor=nats.monitor_url) as stack,
        ):
            for n in range(5):  # the function warm, its history learned
                await stack.idle(await stack.assign(f"warm-{n}"))
                await stack.settled()
            gateway, meta = stack.gateway, pb.Meta(key="fn", runtime="python", memory_in_mb=256, timeout_in_secs=60)
            replies = []

            async def assign() -> None:
                replies.append(await gateway.Assign(pb.AssignRequest(request_id="r", meta_data=meta), Context()))

            async def idle() -> None:
                result = pb.Result(status_code=200, duration_in_ms=10)
                await gateway.Idle(pb.IdleRequest(assigment=replies[0].assigment, result=result), Context())

            traces = {"warm Assign": await traced(stack, assign), "Idle": await traced(stack, idle)}
    print(f"policy {policy}")
    print("| call | scaler functions | in files | library functions | made |")
    print("|---|---:|---:|---:|---|")
    for call, trace in traces.items():
        print(trace.row(call))
    print()
    print("| call | made | by | how many |")
    print("|---|---|---|---:|")
    for call, trace in traces.items():
        for (what, who), n in sorted(trace.makers.items(), key=lambda kv: (not kv[0][1].startswith("scaler"), kv[0])):
            print(f"| {call} | {what[:-1]} | {who} | {n} |")
    if listed:
        for call, trace in traces.items():
            print(f"\n{call}:")
            for file, function in trace.ours():
                print(f"  {Path(file).relative_to(ROOT)}: {function}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="learned")
    p.add_argument("--list", action="store_true", help="the scaler's functions entered, in order")
    a = p.parse_args()
    asyncio.run(main(a.policy, a.list))
