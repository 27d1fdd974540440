"""What a scaler's processes spend a live run on, recorded from inside them (`python bench/live.py --probe`).

Python imports `sitecustomize` at start from the first folder of its path that has one: bench/live.py puts this
folder first on the PYTHONPATH of the scalers it starts, and sets SCALER_PROBE_DIR. Every Python process they
start then records, until it exits, into SCALER_PROBE_DIR/<pid>.json:
- every callback its asyncio event loop ran, timed: how many, how long in all, by length, and which tasks the
  long ones (0.25 ms or more) were, by their coroutines' chain at the end of the step;
- every `nc.request` of nats-py (appends, KV writes, JetStream's API, the workers' reports), timed, by its
  subject's first two tokens (a number as `*`);
- every full collection of the garbage collector: when it came, how long it took;
- in the node (`scaler node`), each command's wait from its lane's queue to its decision and the decision itself,
  by command kind, and each plan's decision; in the lean node (bench/lean_node.py) the decisions and plans;
- in the process serving the Scaler service (the node, a reference), when each Assign and Idle entered its handler
  (`time.monotonic()`, CLOCK_MONOTONIC: the same clock in every process of the machine) and how long it took there,
  by request id: bench/live.py, which records when it sent each call and had its answer, splits a call's time into
  its way to the handler (gRPC's transport, and its server taking the call in), the handler, and its way back.

The node and the workers run on asyncio's own loop here, not uvloop's (whose callbacks cannot be timed from
Python): the node measured the same either way on this machine (docs/benchmarks.md). The probe costs a microsecond
or two a callback, so a probed run's score is not comparable with an unprobed one's; compare probed runs with each
other. A `sitecustomize` of the interpreter's own is not imported while this one is on the path.
"""

import os
import sys

OUT = os.environ.get("SCALER_PROBE_DIR")


def _install(out: str) -> None:
    import asyncio
    import atexit
    import bisect
    import gc
    import itertools
    import json
    import time

    from scaler.runtime.tasks import awaited

    clock = time.monotonic  # the clock bench/live.py stamps its calls with: CLOCK_MONOTONIC, one for the machine
    bounds_ms = (0.1, 0.25, 0.5, 1, 2, 5, 10)
    loop_counts = [0] * (len(bounds_ms) + 1)
    loop_ms = [0.0]
    long_by_task: dict[str, list[float]] = {}  # where -> [count, ms]
    requests: dict[str, list[float]] = {}
    lanes: dict[str, list[float]] = {}
    handled: dict[str, list[tuple[float, float, str]]] = {"Assign": [], "Idle": []}  # (entered, ms, request id)

    def where(callback) -> str:
        task = getattr(callback, "__self__", None)
        if not isinstance(task, asyncio.Task):
            return str(getattr(callback, "__qualname__", type(callback).__name__))
        chain = itertools.islice(awaited(task.get_coro()), 8)
        return ">".join(str(getattr(c, "__qualname__", None) or type(c).__name__) for c in chain)

    run = asyncio.events.Handle._run

    def timed_run(self) -> None:
        began = clock()
        run(self)
        ms = (clock() - began) * 1000
        loop_ms[0] += ms
        loop_counts[bisect.bisect_right(bounds_ms, ms)] += 1
        if ms >= 0.25:
            try:
                seen = long_by_task.setdefault(where(self._callback), [0, 0.0])
            except Exception as e:  # a callback of an odd kind: named by the error, never raised into the loop
                seen = long_by_task.setdefault(f"? {e!r}", [0, 0.0])
            seen[0] += 1
            seen[1] += ms

    asyncio.events.Handle._run = timed_run

    collecting = [0.0]  # when the collection under way began
    started = clock()
    full: list[tuple[float, float]] = []  # each full collection: s into the process's life, ms

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            collecting[0] = clock()
            return
        if info.get("generation") == 2:
            full.append((collecting[0] - started, (clock() - collecting[0]) * 1000))

    gc.callbacks.append(collected)

    import nats.aio.client

    request = nats.aio.client.Client.request

    async def timed_request(self, subject: str, *args, **kwargs):
        began = clock()
        try:
            return await request(self, subject, *args, **kwargs)
        finally:
            head = ".".join("*" if t.isdigit() else t for t in subject.split(".")[:2])  # report.*: one row
            requests.setdefault(head, []).append((clock() - began) * 1000)

    nats.aio.client.Client.request = timed_request

    _on_asyncio()
    _probe_handlers(handled, clock)
    if sys.argv[1:2] == ["node"] or sys.argv[0].endswith("lean_node.py"):  # a node's argv[0] is still "-m" here
        _probe_node(lanes, clock)

    def dump() -> None:
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump(
                {
                    "argv": sys.argv,
                    "loop": {"callbacks": loop_counts, "bounds_ms": bounds_ms, "ms": loop_ms[0]},
                    "long": long_by_task,
                    "requests": requests,
                    "full": full,
                    "lanes": lanes,
                    "handled": handled,
                },
                f,
            )

    atexit.register(dump)


def _on_asyncio() -> None:
    """Our components (the node, the workers: scaler.runtime.service runs them) on asyncio's own loop: uvloop's
    callbacks cannot be timed from Python."""
    import asyncio

    import scaler.runtime.service as service

    service.run = asyncio.run


def _probe_handlers(handled: dict[str, list[tuple[float, float, str]]], clock) -> None:
    """The Scaler service's handlers, in whichever process serves it: when each call entered, for how long."""
    from scaler.proto import serverless_sim_pb2_grpc as pb_grpc

    add = pb_grpc.add_ScalerServicer_to_server

    def timed(method: str, handler, request_id):
        async def handle(request, context):
            began = clock()
            try:
                return await handler(request, context)
            finally:
                handled[method].append((began, (clock() - began) * 1000, request_id(request)))

        return handle

    def add_timed(servicer, server) -> None:
        servicer.Assign = timed("Assign", servicer.Assign, lambda r: r.request_id)
        servicer.Idle = timed("Idle", servicer.Idle, lambda r: r.assigment.request_id)
        add(servicer, server)

    pb_grpc.add_ScalerServicer_to_server = add_timed


def _probe_node(lanes: dict[str, list[float]], clock) -> None:
    """The node's lanes: a command's wait from its queue to its decision, the decision, the plans."""
    from scaler.controller import ledger
    from scaler.controller.path import lanes as path_lanes

    queued: dict[int, float] = {}
    submit = path_lanes.Lanes.submit

    def timed_submit(self, cmd):
        queued[id(cmd)] = clock()
        return submit(self, cmd)

    path_lanes.Lanes.submit = timed_submit
    decide = ledger.Ledger.decide

    def timed_decide(self, cmd, *args, **kwargs):
        began = clock()
        kind = type(cmd).__name__
        if (at := queued.pop(id(cmd), None)) is not None:
            lanes.setdefault(f"{kind}: queued, to its decision", []).append((began - at) * 1000)
        try:
            return decide(self, cmd, *args, **kwargs)
        finally:
            lanes.setdefault(f"{kind}: decided", []).append((clock() - began) * 1000)

    ledger.Ledger.decide = timed_decide
    plan = ledger.Ledger.plan

    def timed_plan(self, *args, **kwargs):
        began = clock()
        try:
            return plan(self, *args, **kwargs)
        finally:
            lanes.setdefault("a plan: decided", []).append((clock() - began) * 1000)

    ledger.Ledger.plan = timed_plan


if OUT:
    _install(OUT)
