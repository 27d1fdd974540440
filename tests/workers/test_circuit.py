"""The platform worker's circuit toward a failing platform (scaler/workers/circuit.py)."""

import asyncio

import grpc

from scaler.platform_stub.server import Faults
from scaler.proto import serverless_sim_pb2 as pb
from scaler.workers.circuit import Circuit, Circuits
from tests.stack import Stack, eventually


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_opens_after_failures_in_a_row_and_half_opens_for_one_probe_at_a_time():
    clock = Clock()
    c = Circuit("Init of 'fn'", trip=3, first_open_s=1, longest_open_s=4, clock=clock)
    for _ in range(2):
        assert c.refuses() == 0
        c.failed("InternalError")
    c.succeeded()  # a success in between: the count starts again
    for _ in range(3):
        assert c.refuses() == 0
        c.failed("InternalError")
    assert c.refuses() == 1.0  # open: refused, and the next try is a second away
    clock.now += 0.4
    assert round(c.refuses(), 3) == 0.6
    clock.now += 0.6
    assert c.refuses() == 0  # half-open: this one is the probe ...
    assert c.refuses() > 0  # ... and the others still wait for its verdict
    c.failed("InternalError")  # the probe failed: open again, for twice as long
    assert c.refuses() == 2.0
    clock.now += 2
    assert c.refuses() == 0
    c.abandoned()  # the probe was cancelled: no verdict, the next call probes
    assert c.refuses() == 0
    c.failed("InternalError")
    assert c.refuses() == 4.0
    clock.now += 4
    assert c.refuses() == 0
    c.failed("InternalError")
    assert c.refuses() == 4.0  # at most longest_open_s
    clock.now += 4
    assert c.refuses() == 0
    c.succeeded()
    assert c.closed and c.refuses() == 0 and c.refuses() == 0


def test_a_function_whose_starts_work_costs_nothing():
    circuits = Circuits(trip=2)
    with circuits.starting("ok"):
        circuits.init("ok").succeeded()
    with circuits.starting("broken"):
        circuits.init("broken").failed("InternalError")
    assert list(circuits._init) == ["broken"]  # it remembers the failure, for the next start


async def callers(stack: Stack, key: str, failures: int, clients: int = 8) -> list[str]:
    """`clients` callers each repeating an Assign of `key` until `failures` were refused in all; their errors (a
    gRPC error, or a reply whose status is not Ok, as "THROTTLE: ...")."""
    errors: list[str] = []

    async def one(n: int) -> None:
        i = 0
        while len(errors) < failures:
            i += 1
            try:
                reply = await stack.assign(f"{key}-c{n}-{i}", key=key)
            except grpc.aio.AioRpcError as e:
                errors.append(f"{e.code().name}: {e.details()}")
                continue
            if reply.status != pb.Ok:
                errors.append(f"{pb.Status.Name(reply.status).upper()}: {reply.error_message}")
                continue
            await stack.idle(reply)

    await asyncio.gather(*(one(n) for n in range(clients)))
    return errors


async def test_a_platform_failing_every_init_is_not_hammered_and_other_functions_still_start(nats_url):
    """Init answers InternalError for one function: after TRIP failures in a row the worker stops calling Init for
    it (the circuit stays open the whole test here); a start after that is refused at once, and the function's
    starts are held as long as the circuit says (issue 41, item 5): its requests hear Throttle at once, with a
    message that says why, and start nothing. Another function's starts go on."""
    inits: dict[str, int] = {}

    def failing_init(request) -> str | None:
        inits[request.meta_data.key] = inits.get(request.meta_data.key, 0) + 1
        return "the runtime is broken" if request.meta_data.key == "broken" else None

    async with Stack(nats_url, faults=Faults(init=failing_init)) as stack:
        stack.platform_worker.circuits = Circuits(trip=5, first_open_s=600, hold_s=0)  # refused at once
        errors = await callers(stack, "broken", failures=30)
        # Not one Init per refused request: the 5 that opened it, and those already under way meanwhile (8 callers)
        assert 5 <= inits["broken"] <= 5 + 7, inits
        assert stack.stub.accounting.created == inits["broken"]  # nor a slot
        failed = "INTERNAL: the platform could not start an instance"
        throttled = "THROTTLE: throttled: no start of the function for"
        assert all(e.startswith((failed, throttled)) for e in errors), errors[:3]
        assert sum(e.startswith(throttled) for e in errors) >= 15, errors  # once held, nothing more is started
        assert "the platform's circuit open (" in errors[-1] and "the runtime is broken" in errors[-1], errors[-1]
        await stack.idle(await stack.assign("ok-1", key="ok"))  # its own circuit is closed
        assert inits["ok"] == 1


async def test_a_platform_failing_create_slot_is_tried_again_and_the_circuit_closes_when_it_works(nats_url):
    failing = True

    def create(_) -> str | None:
        return "out of capacity" if failing else None

    async with Stack(nats_url, faults=Faults(create=create)) as stack:
        stack.platform_worker.circuits = Circuits(trip=3, first_open_s=0.2, longest_open_s=0.5, hold_s=0)
        errors = await callers(stack, "fa", failures=30)
        assert "circuit open (CreateSlot" in errors[-1] and "out of capacity" in errors[-1], errors[-1]
        failing = False
        served: list[str] = []

        async def again() -> None:
            try:
                reply = await stack.assign("again", key="fb")
            except grpc.aio.AioRpcError:
                return
            if reply.status == pb.Ok:
                served.append(reply.assigment.instance_id)
            else:  # refused by the open circuit: fb's starts held (0.5 s at most), its calls throttled meanwhile
                assert "the platform's circuit open (CreateSlot" in reply.error_message, reply.error_message
                await asyncio.sleep(0.05)

        while not served:  # a start refused while the circuit is still open fails; the probe after it works
            await again()
        await eventually(lambda: stack.platform_worker.circuits.create.closed)


async def test_a_start_waits_for_an_open_circuit_and_goes_through_once_the_platform_works(nats_url):
    """While a circuit is open no start of the function is tried (the controller holds them as long as the worker's
    `retry_after_ms` says, a start already sent waits in the worker up to `hold_s`) rather than fail request after
    request: once the platform works again, the next start, the circuit's probe, serves the request waiting."""
    failing = True

    def init(_) -> str | None:
        return "the runtime is broken" if failing else None

    async with Stack(nats_url, faults=Faults(init=init)) as stack:
        stack.platform_worker.circuits = Circuits(trip=3, first_open_s=2, hold_s=60)
        for n in range(3):  # three failed starts in a row: open (the third's request throttled: fa's starts held)
            try:
                reply = await stack.assign(f"r{n}", key="fa")
            except grpc.aio.AioRpcError:
                continue
            assert reply.status == pb.Throttle, reply
        assert not stack.platform_worker.circuits.init("fa").closed
        failing = False  # the platform works again, while the circuit is still open
        reply = await stack.assign("held", key="fa")
        assert reply.assigment.instance_id
