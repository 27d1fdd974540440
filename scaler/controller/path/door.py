"""The door: where every command comes in, is routed, admitted once, and handed to its function's lane.

Calls come two ways: `call` from the gateway in the same process (the hot path: no NATS hop but the
append) and `on_request`, core NATS requests on `cmd.<partition>` (front gateways, other nodes, the
workers' reports). A call for a partition served elsewhere is forwarded to its owner; a new Assign is
refused at once while the node is behind (admission.py). An Assign whose caller stops waiting is
cancelled, and an Idle answered before its release could be stored has that release stored all the
same, both in the background and through an outage (`persist`).
"""

import asyncio
import logging
from collections.abc import Callable

from msgspec.structs import replace
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from scaler.controller.core import reconcile
from scaler.controller.partitions import NotServing, Partitions
from scaler.controller.path.admission import Admission
from scaler.controller.path.lanes import Lanes, Told
from scaler.controller.path.replies import Replies
from scaler.controller.path.writer import Writer
from scaler.controller.policies import policy_problem
from scaler.proto.commands import (
    OPERATOR,
    Admin,
    AnyCommand,
    Assign,
    Cancel,
    Code,
    Configure,
    Idle,
    Reconcile,
    Reply,
    SlotCreated,
    command_id,
    decode_command,
    decode_report,
    encode,
)
from scaler.proto.subjects import partition
from scaler.runtime.bus import Unavailable, gave_up_why, send
from scaler.runtime.forward import Forwarder
from scaler.store import TooBig

log = logging.getLogger("scaler.controller")

PERSIST_PATIENCE_S = 120.0  # how long a Cancel, or a release answered early, is retried through an outage
RETRY_FIRST_S = 0.05  # a persist's first wait before it is tried again, doubled each time up to RETRY_MAX_S
RETRY_MAX_S = 2.0


class Door:
    def __init__(
        self,
        nc: Client,
        node: str,
        lanes: Lanes,
        replies: Replies,
        partitions: Partitions,
        admission: Admission,
        writer: Writer,
        forwarder: Forwarder,
    ) -> None:
        self.nc = nc
        self.node = node
        self.lanes = lanes
        self.replies = replies
        self.partitions = partitions
        self.admission = admission
        self.writer = writer
        self.forwarder = forwarder

    async def call(self, cmd: Assign | Idle | Admin, timeout_s: float | None) -> Reply:
        """Decide a call from this process and wait for its answer (an Assign may wait for an instance).

        An Assign whose caller stops waiting (timeout, cancellation, or the event store away when its
        outcome is unknown) is cancelled in the background, so a stored request never holds an instance
        for nobody."""
        if (refused := self.refused(cmd)) is not None:  # passed on or not: a node behind takes no new Assign
            return refused
        if not self.partitions.serves(cmd.key):
            return await self.forwarder.call(cmd, timeout_s)
        if isinstance(cmd, Idle) and self._released_surely(cmd):  # answered now, queued in its lane right behind
            asyncio.get_running_loop().call_soon(self._release_behind, cmd)
            return Reply(to="", request_id=cmd.request_id)
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        to = self.replies.expect(answer)
        cmd = replace(cmd, reply_to=to)
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    done = self.lanes.submit(cmd)
                    if isinstance(cmd, Idle):  # answered once its release is decided, before it is stored
                        done.add_done_callback(lambda f: self._stored_behind(cmd, f, answer))
                        return await answer
                    await done  # decided and stored (a caller leaving drops it if still queued: it is cancelled)
                except NotServing:  # the partition went elsewhere just now, or while it queued: its new owner decides
                    self.replies.forget(to)
                    return await self.forwarder.call(cmd, timeout_s)
                except TooBig as e:
                    return unstorable(cmd, to, e)
                return await self._instance_for(answer)  # an Assign may wait for an instance to be ready
        except (TimeoutError, asyncio.CancelledError, Unavailable) as e:
            if isinstance(cmd, Assign) and self.replies.waits(to):
                self.give_up(cmd, gave_up_why(e, "event store unavailable"))
            raise
        finally:
            self.replies.forget(to)

    def _release_behind(self, cmd: Idle) -> None:
        """An Idle answered before its lane had it, queued there once the answer is on its way: nothing of the
        node's work sits between the caller and its answer. Stored all the same should its lane not store it."""
        try:
            done = self.lanes.submit(cmd)
        except NotServing:  # the partition went meanwhile: stored through its owner
            self.persist(cmd)
        else:
            done.add_done_callback(lambda f: self._stored_behind(cmd, f, None))

    def _released_surely(self, cmd: Idle) -> bool:
        """Whether the Idle can only be decided as a release: its request holds its instance in the decided state (an
        Idle comes after its Assign was stored), and its reason, carried twice in the release's batch, takes less than
        half a message (the rest of that batch is small), so the batch will fit."""
        state = self.lanes.ledger.states.get(cmd.key)
        inst = state.instances.get(cmd.instance_id) if state is not None else None
        fits = 4 * len(cmd.reason.encode()) < self.writer.store.room
        return inst is not None and inst.serves(cmd.request_id) and fits

    async def _instance_for(self, answer: asyncio.Future[Reply]) -> Reply:
        """A stored Assign's answer, once an instance serves it; Unavailable once it has waited `store_wait_s` while
        the event store does not answer: no instance can be reported ready meanwhile, so its caller learns the
        store is away within its own deadline (and the Assign is cancelled, as any it gives up)."""
        if answer.done():  # a warm Assign, an Idle: answered with the decision, no timer to set for it
            return answer.result()
        wait_s = self.lanes.store_wait_s
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(answer), wait_s)
            except TimeoutError:
                if self.writer.troubled(wait_s, own_lag_s=self.admission.lag_s):
                    raise Unavailable(f"the event store did not answer within {wait_s:g}s while the call waited for an"
                                      " instance") from None  # fmt: skip

    def _stored_behind(self, cmd: Idle, done: asyncio.Future, answer: asyncio.Future | None) -> None:
        """An Idle answered before its release was stored (`answer` done, or None: answered before it was queued),
        and then nothing was: store it all the same. One not answered yet, whose decision failed, is told why."""
        if done.cancelled() or (e := done.exception()) is None:
            return
        answered = answer is None or answer.done()
        if isinstance(e, Told) or (answered and not isinstance(e, TooBig)):  # answered: stored behind it
            self.persist(replace(cmd, reply_to=""))
        elif not answered:
            answer.set_exception(e)
        else:
            log.error("%s was answered, but its release cannot be stored: %s", command_id(cmd), e)

    def refused(self, cmd: AnyCommand) -> Reply | None:
        """The answer refusing `cmd` before it is decided, or None to take it: a function's policy this node
        cannot load (the core checks only a name's form), or a new Assign while the node is overloaded."""
        if isinstance(cmd, Configure) and cmd.policy and (problem := policy_problem(cmd.policy)) is not None:
            return Reply(to=cmd.reply_to, request_id=command_id(cmd), code=Code.INVALID_ARGUMENT, message=problem)
        return self.overloaded(cmd)

    def overloaded(self, cmd: AnyCommand) -> Reply | None:
        """Refuse a new Assign at once when the node is behind, rather than let every call queue for seconds."""
        if not isinstance(cmd, Assign) or not self.admission.over():  # the store's health is asked only then
            return None
        lag = self.admission.lag_s
        behind = max(self.admission.behind_s(), lag)  # a backlog from the store's outage is its own
        return self.admission.refuse(cmd, self.node, self.writer.troubled(behind, own_lag_s=lag))

    async def handle(self, cmd: AnyCommand):
        """Decide one command and wait until it is stored (a partition-wide Reconcile: each of its functions)."""
        if isinstance(cmd, Reconcile) and cmd.partition >= 0:
            return await self._reconcile(cmd)
        return await asyncio.shield(self.lanes.submit(cmd))

    async def on_request(self, msg: Msg) -> None:
        """A command from another process: a gateway's call, or a worker's report."""
        await self._take(msg, decode_command)

    async def on_report(self, msg: Msg) -> None:
        """A worker's report, on the subjects where a worker may send nothing else."""
        await self._take(msg, decode_report)

    async def _take(self, msg: Msg, decode: Callable[[bytes], AnyCommand]) -> None:
        try:
            cmd = decode(msg.data)
        except Exception as e:
            log.error("refusing a command on %s: %s", msg.subject, e)
            if msg.reply:
                await self._answer(Reply(to=msg.reply, request_id="", code=Code.INVALID_ARGUMENT, message=str(e)))
            return
        self.lanes.spawn(self._serve(cmd, msg))

    async def _serve(self, cmd: AnyCommand, msg: Msg) -> None:
        """Calls are answered by their decision (now or, for a waiting Assign, later); reports once stored (a
        SlotCreated by its decision too: it says whether to go on with Init)."""
        is_call = isinstance(cmd, Assign | Idle | SlotCreated) or isinstance(cmd, OPERATOR)
        if is_call:
            cmd = replace(cmd, reply_to=msg.reply)
            if (refused := self.refused(cmd)) is not None:
                await self._answer(refused)
                return
        try:
            await self.handle(cmd)
        except Told:  # answered already: stored behind its answer
            self.persist(replace(cmd, reply_to=""))
            return
        except Unavailable as e:  # the sender tries again
            log.info("could not handle %s: %s", command_id(cmd), e)
            if msg.reply:
                request_id = getattr(cmd, "request_id", "")
                await self._answer(Reply(to=msg.reply, request_id=request_id, code=Code.UNAVAILABLE, message=str(e)))
            return
        except TooBig as e:  # refused once: sending it again would fail again
            if msg.reply:
                await self._answer(unstorable(cmd, msg.reply, e))
            return
        if not is_call and msg.reply:
            await self._answer(Reply(to=msg.reply, request_id=command_id(cmd)))

    async def _answer(self, reply: Reply) -> None:
        """An answer over NATS, or none while NATS is away: its sender sends the command again."""
        try:
            await self.nc.publish(reply.to, encode(reply))
        except NatsError as e:
            log.info("could not answer %s (%s sends it again): %r", reply.request_id, reply.to, e)

    async def _reconcile(self, cmd: Reconcile) -> None:
        """The platform's list for one partition, put to each of its functions in turn (those the list names
        and those it doesn't), each deciding alone, so a repeat after a crash half-way repeats only no-ops."""
        self.partitions.check(cmd.partition)
        known = self.partitions.keys([cmd.partition])
        for key, slots in reconcile.by_function(cmd.slots, known).items():
            await self.handle(replace(cmd, key=key, slots=slots, partition=-1))
        log.debug("reconciled partition %d: %d functions, %d platform slots", cmd.partition, len(known), len(cmd.slots))

    def give_up(self, cmd: Assign, why: str) -> None:
        self.persist(Cancel(key=cmd.key, request_id=cmd.request_id, reply_to=cmd.reply_to, reason=why))

    def persist(self, cmd: Cancel | Idle) -> None:
        self.lanes.spawn(self._persist(cmd))

    async def _persist(self, cmd: Cancel | Idle) -> None:
        """Store a command through an outage or a hand-over: a Cancel (the Assign may have been stored all the
        same), or a release its caller was told of before it was stored.

        One that failed, or waits on its partition's owner, because this node could not decide its partition (a
        lease lapsed or late, a reload) is decided here as soon as this node can, not at the end of a wait grown
        through the outage: until then its instance is held for nobody."""
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + PERSIST_PATIENCE_S, RETRY_FIRST_S
        while True:
            try:
                if self.partitions.serves(cmd.key):
                    await self.handle(cmd)
                elif not await self._sent(cmd, deadline - loop.time()):
                    continue  # served here again meanwhile: decided here
                return
            except TooBig as e:
                log.error("could not store %s: %s", command_id(cmd), e)
                return
            except (Unavailable, TimeoutError, NatsError) as e:  # NATS away, or the partition between owners
                if loop.time() > deadline:
                    log.warning("could not store %s: %s", command_id(cmd), e)
                    return
                await self.partitions.reopened(partition(cmd.key), delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _sent(self, cmd: Cancel | Idle, patience_s: float) -> bool:
        """Send a command to its partition's owner; False, the sending given up, once this node may decide that
        partition again (a try that reached an owner meanwhile makes the second decision a no-op)."""
        p = partition(cmd.key)
        sending = asyncio.ensure_future(send(self.nc, cmd, patience_s=max(0.1, patience_s)))
        opened = asyncio.ensure_future(self.partitions.reopened(p, patience_s))
        try:
            await asyncio.wait({sending, opened}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sending, opened):
                task.cancel()
            await asyncio.gather(sending, opened, return_exceptions=True)
        if not sending.cancelled():
            sending.result()  # raises what stopped it
            return True
        if self.partitions.decides(p):
            return False
        raise TimeoutError(f"no owner of partition {p} answered")


def unstorable(cmd: AnyCommand, to: str, e: TooBig) -> Reply:
    """The answer to a command whose decision no NATS message can hold: refused, not to be tried again."""
    log.error("%s refused: its decision cannot be stored: %s", command_id(cmd), e)
    message = f"the decision cannot be stored: {e}"
    return Reply(to=to, request_id=getattr(cmd, "request_id", ""), code=Code.INTERNAL, message=message)
