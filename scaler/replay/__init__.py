"""`scaler replay`: rebuild the controller's state from the EVENTS stream and show it, or check it.

Prints every function's state (instances, their phase, who holds them, keep-alive deadlines)
as replayed up to the end, a stream sequence (`--until-seq`) or a time (`--until`). With
`--key K`, also the timeline of that function's decisions (with `--html PATH`, drawn as a page:
scaler/replay/page.py). With `--verify`, compares the replay with the running controller's own
state and exits 1 on any difference. Reads a live NATS (`--nats`), or the store a stopped
`scaler up --data-dir DIR` left (`--data-dir`).

While the stream holds everything from seq 1, a replay folds it all. Once retention has dropped
its oldest batches, each partition starts from its snapshot, as the controller's start does
(scaler/controller/rebuild.py), so the replay is still exact; what came before the snapshots can no
longer be shown, and asking for it (`--until-seq`, `--until`) is refused.
"""

import argparse
import asyncio
import datetime
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiosqlite
import msgspec
import nats
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from scaler.controller import rebuild, state_service
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.state import FnState
from scaler.controller.leases import ranges
from scaler.controller.ledger import Ledger
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.proto import info
from scaler.proto.events import Batch
from scaler.proto.subjects import PARTITIONS, function_events, partition
from scaler.replay import explain, export
from scaler.report.timeline import Fold, Timeline
from scaler.runtime import service
from scaler.runtime.access import Nats, access
from scaler.runtime.bus import refusal
from scaler.runtime.natsd import NatsServer, StoreBusy, claim
from scaler.runtime.permissions import VIOLATION
from scaler.runtime.ports import nats_url, peer
from scaler.runtime.text import plural
from scaler.store import EventStore, UnreadableStream

SERVE_S = 30.0  # how long --verify waits for a node to load the partitions it holds (a take-over under way)


GATEWAY = "127.0.0.1:9001"  # where `scaler up` serves unless told
GATEWAY_WAIT_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--gateway",
        metavar="HOST:PORT",
        type=peer,
        help=f"a running node's gRPC address: its events are read on the NATS it says it uses (default {GATEWAY})",
    )
    source.add_argument("--nats", type=nats_url, help="NATS URL of a running scaler (instead of asking its node)")
    source.add_argument("--data-dir", help="the --data-dir of a stopped `scaler up`: its store is read offline")
    p.add_argument("--key", help="only this function, with the timeline of its decisions")
    until = p.add_mutually_exclusive_group()
    until.add_argument("--until-seq", type=_sequence, metavar="N", help="replay batches up to stream sequence N")
    until.add_argument("--until", metavar="TIME", help="replay batches decided up to TIME (ISO 8601, or epoch ms)")
    p.add_argument(
        "--html",
        metavar="PATH",
        help="with --key: also write the function's timeline as a page (instances on a time axis, each decision"
        " with its reason; see docs/reports.md)",
    )
    p.add_argument(
        "--verify", action="store_true", help="compare with the running controller's state; exit 1 if not equal"
    )
    service.add_nats_access(p)  # reading needs no more than a read-only user (docs/operations.md: NATS permissions)
    p.add_argument(
        "--sqlite",
        metavar="FILE",
        help="also write every decision replayed, one row per event with its reason, to the table `decisions` of"
        " this SQLite file (docs/reports.md)",
    )


def _sequence(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a stream sequence: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def parse_time(text: str) -> int:
    """Epoch ms from `1700000000000` or an ISO time (UTC unless it says otherwise)."""
    if text.isdigit():
        return int(text)
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--until {text!r} is neither epoch ms nor an ISO time like 2026-01-02T12:00:03") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return int(t.timestamp() * 1000)


@dataclass
class Origin:
    """Where a replay starts: the whole stream, or (once retention dropped batches) each partition's snapshot."""

    kept: rebuild.Kept
    snaps: dict[int, Snapshot | None]

    @property
    def newest(self) -> Snapshot | None:
        return max((s for s in self.snaps.values() if s is not None), key=lambda s: s.seq, default=None)

    def check(self, until_seq: int | None, until_ms: int | None) -> None:
        """Refuse a point before the snapshots: what led there is gone from the stream."""
        for snap in self.snaps.values():
            if snap is None:
                continue
            holds = max([snap.seq, *snap.last_seq.values()])
            if until_seq is not None and until_seq < holds:
                raise ValueError(f"--until-seq {until_seq} is {self._before(holds)}")
            if until_ms is not None and until_ms < snap.at_ms:
                when = datetime.datetime.fromtimestamp(snap.at_ms / 1000, datetime.UTC).isoformat(timespec="seconds")
                raise ValueError(f"--until is {self._before(holds)}, taken at {when.replace('+00:00', 'Z')}")

    def _before(self, holds: int) -> str:
        return (
            f"before what can be rebuilt: retention dropped EVENTS before seq {self.kept.first_seq:,}, and replay"
            f" starts from the snapshots, one of which holds batches up to seq {holds:,}"
        )


async def origin(nc: Client, key: str | None = None) -> Origin:
    """The snapshots a replay of `key` (None: everything) starts from, when the stream no longer begins at seq 1."""
    at = await EventStore(nc).kept()
    partitions = [partition(key)] if key is not None else list(range(PARTITIONS))
    if not at.truncated:
        return Origin(at, dict.fromkeys(partitions))
    store = SnapshotStore(nc.jetstream())
    await store.open(create=False)
    return Origin(at, await rebuild.snapshots(store, at, partitions))


@dataclass
class Replayed:
    ledger: Ledger = field(default_factory=Ledger)
    batches: int = 0
    events: int = 0
    origin: Origin | None = None

    @property
    def states(self) -> dict[str, FnState]:
        return self.ledger.states


async def replay(
    nc: Client,
    key: str | None = None,
    until_seq: int | None = None,
    until_ms: int | None = None,
    keep: Callable[[int, Batch], bool] | None = None,
    seen: Callable[[int, Batch], None] | None = None,
    start: Origin | None = None,
) -> Replayed:
    """Fold the stream into states, as the controller does at start; `keep` picks batches, `seen` watches them.

    From `start` (by default, where the stream and its snapshots allow: Origin); `key` alone when given.
    """
    start = start or await origin(nc, key)
    start.check(until_seq, until_ms)
    out = Replayed(origin=start)

    def fold(seq: int, batch: Batch) -> bool:
        if until_ms is not None and batch.at_ms > until_ms:
            return True
        if keep is not None and not keep(seq, batch):
            return False
        out.ledger.fold(seq, batch)
        out.batches += 1
        out.events += len(batch.events)
        if seen is not None:
            seen(seq, batch)
        return False

    snaps = start.snaps if key is None else {p: _only(snap, key) for p, snap in start.snaps.items()}
    after = rebuild.restore(out.ledger, snaps)
    subject = function_events(key) if key is not None else None
    await rebuild.fold_after(EventStore(nc), after, fold, subject, until_seq)
    return out


async def verify(nc: Client, key: str | None, out=sys.stdout) -> int:
    """Replay up to what the running controller has applied and compare, function by function."""
    start = await origin(nc, key)  # before the running state: the snapshots are older than it, never newer
    running = await state_service.fetch(nc, serve_s=SERVE_S)
    unserved = [p for p in running.unserved if key is None or p == partition(key)]
    if unserved:
        print(f"not compared: partitions {ranges(unserved)} are held by a node that does not serve them "
              f"(loading after {SERVE_S:g} s, or refused: see its log)", file=out)  # fmt: skip
        return 1
    # The controller holds every batch up to `seq`, and per function exactly up to its last_seq.
    end = max([running.seq, *running.last_seq.values()])
    replayed = await replay(
        nc, key, until_seq=end, keep=lambda seq, b: seq <= running.last_seq.get(b.key, running.seq), start=start
    )
    theirs = running.states if key is None else {k: v for k, v in running.states.items() if k == key}
    bad = 0
    for k in sorted(set(replayed.states) | set(theirs)):
        diffs = list(explain.differences(replayed.states.get(k), theirs.get(k)))
        learned = replayed.ledger.features_of(k), running.features.get(k, NO_STATS)  # none kept: none learned
        diffs += list(explain.differences(*learned, "features"))
        if diffs:
            bad += 1
            print(f"MISMATCH {explain.name(k)}:", file=out)
            for d in diffs:
                print(f"  {d}", file=out)
    if bad:
        print(f"{bad} of {plural(len(set(replayed.states) | set(theirs)), 'function')} differ", file=out)
        return 1
    equal = plural(len(theirs), "function")
    print(f"verified: {equal} equal to the running controller's state (up to seq {end})", file=out)
    return 0


class Told:
    """A function's decisions as they are folded: in words, and as a timeline to draw."""

    def __init__(self, key: str, start: Origin) -> None:
        self.fold = Fold(key)
        snap = start.snaps.get(partition(key))
        if snap is not None and key in snap.states:  # the stream's events begin after this snapshot
            self.fold.seed(snap.states[key], snap.at_ms)

    def __call__(self, seq: int, b: Batch) -> None:
        for d in b.decisions():  # a group commit stores several decisions of the function in one batch
            for e in d.events:
                self.fold.event(e)
            self.fold.step(d.at_ms, seq, explain.batch(seq, d))

    def timeline(self, st: FnStats | None) -> Timeline:
        return self.fold.done(st.gap_hist if st is not None else ())


async def timeline(nc: Client, key: str, until_seq: int | None = None, until_ms: int | None = None) -> Timeline | None:
    """One function's timeline from the stream (None when it has no events)."""
    start = await origin(nc, key)
    told = Told(key, start)
    replayed = await replay(nc, key, until_seq, until_ms, seen=told, start=start)
    return told.timeline(replayed.ledger.features_of(key)) if key in replayed.states else None


async def timelines(url: Nats, keys: list[str]) -> list[Timeline]:
    """The timelines of `keys` from the stream of the NATS at `url` (those with no events are left out)."""
    nc = await _connect(url)
    try:
        try:
            found = [await timeline(nc, key) for key in keys]
        except NotFoundError:
            raise ValueError(f"no EVENTS stream at {url}: nothing was recorded there") from None
    finally:
        await nc.close()
    return [t for t in found if t is not None]


async def show(
    nc: Client, key: str | None, until_seq: int | None, until_ms: int | None, out=sys.stdout, html: Path | None = None
) -> int:
    start = await origin(nc, key)
    told = Told(key, start) if key is not None else None
    replayed = await replay(nc, key, until_seq, until_ms, seen=told, start=start)
    since = _since(replayed.origin)
    if key is not None:
        if key not in replayed.states:
            print(f"no events for function {key!r}", file=out)
            return 1
        t = told.timeline(replayed.ledger.features_of(key))
        print(f"timeline of {key}{since}:", file=out)
        for step in t.steps:
            print(f"  {step.text}", file=out)
        print(file=out)
        if html is not None:
            upto = f" up to {explain.moment(until_ms)}" if until_ms is not None else ""
            upto = f" up to seq {until_seq:,}" if until_seq is not None else upto
            from scaler.replay.page import replay_page  # plotly: only to draw

            page = replay_page(
                t, replayed.states[key], replayed.ledger.features_of(key), f"{key}: replayed{upto}", since
            )
            _write(html, page)
            print(f"wrote {html}", file=out)
    for k in sorted(replayed.states):
        for line in explain.state(replayed.states[k], replayed.ledger.features_of(k), replayed.ledger.last_seq[k]):
            print(line, file=out)
    states, batches = plural(len(replayed.states), "function"), plural(replayed.batches, "batch", "batches")
    print(f"\n{states} from {batches}, {plural(replayed.events, 'event')}{since}", file=out)
    return 0


async def export_decisions(nc: Client, args: argparse.Namespace, until_ms: int | None, source: str) -> None:
    """--sqlite: the decisions replayed (of --key, up to --until...) as rows of the file's `decisions` table."""
    rows = export.Decisions(source)
    await replay(nc, args.key, args.until_seq, until_ms, seen=rows)
    try:
        await export.write(args.sqlite, rows.rows)
    except aiosqlite.Error as e:
        raise ValueError(f"{args.sqlite}: cannot write the decisions: {e}") from None
    print(f"wrote {plural(len(rows.rows), 'event')} of the decisions replayed to {args.sqlite}", file=sys.stderr)


def _write(path: Path, page: str) -> None:
    from scaler.report import draw  # plotly: only to draw

    try:
        draw.write(path, page)
    except OSError as e:
        raise ValueError(f"{path}: cannot write: {e.strerror}") from None


def _only(snap: Snapshot | None, key: str) -> Snapshot | None:
    """A partition's snapshot reduced to one of its functions."""
    if snap is None:
        return None

    def pick(by_key: dict) -> dict:
        return {k: v for k, v in by_key.items() if k == key}

    return msgspec.structs.replace(
        snap, states=pick(snap.states), features=pick(snap.features), last_seq=pick(snap.last_seq), wake=pick(snap.wake)
    )


def _since(start: Origin | None) -> str:
    """Where a replay started, when not at the stream's beginning."""
    newest = start.newest if start is not None else None
    if newest is None:
        return ""
    which = "its partition's snapshot at" if len(start.snaps) == 1 else "each partition's snapshot, the newest at"
    return f" (from {which} seq {newest.seq:,}: retention dropped EVENTS before seq {start.kept.first_seq:,})"


async def nats_of(gateway: str) -> str:
    """The NATS the node at `gateway` says it uses (scaler.Info)."""
    try:
        said = await info.ask(gateway, GATEWAY_WAIT_S)
    except info.NoAnswer as e:
        raise ValueError(f"{e}: pass --gateway HOST:PORT (the gRPC address `scaler up` said), or --nats URL") from None
    if not said.nats:
        raise ValueError(f"the scaler at {gateway} does not say where its NATS is: pass --nats URL")
    return said.nats


async def _connect(url: Nats):
    where = access(url)

    async def quiet(e: Exception) -> None:
        if VIOLATION in str(e).lower():  # what this reader is not permitted would otherwise show as a timeout
            print(f"scaler replay: {e}", file=sys.stderr)
        elif why := refusal(e):  # said at once: trying again would be refused again
            raise ValueError(f"NATS at {where} {why}")

    try:
        options = where.options()
        async with asyncio.timeout(5):
            return await nats.connect(
                where.servers, connect_timeout=2, max_reconnect_attempts=1, error_cb=quiet, **options
            )
    except ValueError:  # a file that cannot be read (CannotRead), a refusal
        raise
    except Exception as e:
        raise ValueError(f"cannot reach NATS at {where}: {e or type(e).__name__}") from None


async def _main(args: argparse.Namespace) -> int:
    if args.html and (not args.key or args.verify):
        raise ValueError("--html draws one function's timeline: give --key, and not --verify")
    if args.sqlite and args.verify:
        raise ValueError("--sqlite writes the decisions replayed; --verify compares states: one or the other")
    until_ms = parse_time(args.until) if args.until else None
    server = held = None
    if args.data_dir:
        if args.verify:
            raise ValueError("--verify compares with a running controller: use --nats, not --data-dir")
        store = Path(args.data_dir) / "nats"
        if not store.is_dir():
            raise ValueError(f"no NATS store in {store} (what `scaler up --data-dir {args.data_dir}` writes)")
        try:
            held = claim(args.data_dir)
        except StoreBusy as e:
            raise ValueError(f"{e}: read it live (`scaler replay` without --data-dir finds it)") from None
        server = NatsServer(store)
        url = await server.start()
    else:
        url = service.nats_access(args, "reader", args.nats or await nats_of(args.gateway or GATEWAY))
    try:
        try:
            nc = await _connect(url)
        except ValueError as e:
            if args.nats or args.data_dir:
                raise
            whose = f"the NATS the scaler at {args.gateway or GATEWAY} says it uses"
            raise ValueError(f"{e} ({whose}): pass --nats URL") from None
        try:
            try:
                if args.verify:
                    return await verify(nc, args.key)
                html = Path(args.html) if args.html else None
                if args.sqlite:
                    await export_decisions(nc, args, until_ms, args.data_dir or str(url))
                return await show(nc, args.key, args.until_seq, until_ms, html=html)
            except NotFoundError:
                raise ValueError(f"no EVENTS stream at {url}: nothing was recorded there") from None
            except TimeoutError:
                raise ValueError(f"no controller answered on {state_service.SUBJECT} at {url}") from None
        finally:
            await nc.close()
    finally:
        if server is not None:
            await server.stop()
        if held is not None:
            held.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (ValueError, UnreadableStream, rebuild.Uncovered) as e:
        print(f"scaler replay: {e}", file=sys.stderr)
        return 2
