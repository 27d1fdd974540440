"""`scaler simulate`: replay a dataset and score it like the 2023 serverless scaler challenge.

Live (default): serve the Platform API, drive a running scaler's gateway through the trace, and
measure. Start the scaler first, at the same speed, pointed at this platform:
    scaler up --platform 127.0.0.1:50051 --speed N      then      scaler simulate DIR --speed N
Offline (--offline): run the controller's pure core and a policy on a virtual clock, no NATS or
gRPC; deterministic, seconds for hours of trace; with `--latency FILE`, on the latency a live run
measured (`--latency-out FILE`; scaler/simulator/latency.py). Both end in the same scoring code.
`--report PATH.html` draws the run as a page (scaler/simulator/report.py; docs/reports.md), `--save-run`
keeps it for a later `--compare`.
Exit status: 0 when the run completed (whatever the score), 1 when it could not be done, 2 for a
command line argparse refuses, 130 after Ctrl-C (a live run first prints its statistics so far, marked
partial) and 143 after SIGTERM (`docker stop`).
"""

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec

from scaler import replay
from scaler.controller import policies
from scaler.controller.core.policy import DEFAULT_POLICY, Policy
from scaler.controller.knobs import KnobError, knob_arg, tuned
from scaler.controller.policies import get_policy
from scaler.report.timeline import Folds, Timeline
from scaler.runtime import service
from scaler.runtime.ports import address, nats_url, peer, port
from scaler.runtime.service import positive
from scaler.simulator import latency as latencies
from scaler.simulator import runs
from scaler.simulator.dataset import Dataset, DatasetError, load_dataset
from scaler.simulator.live import LiveError, LiveRun, run_live
from scaler.simulator.offline import Simulation
from scaler.simulator.progress import EVERY_S, Progress
from scaler.simulator.saved import DRAWN, SavedRun, load, save
from scaler.simulator.score import SUCCESS_THRESHOLD, FunctionRow, Run, Stats, worst_functions

DEFAULT_GATEWAY = "127.0.0.1:9001"
DEFAULT_HOST = "127.0.0.1"  # what the Platform API and /stats bind unless told: this machine only
PLATFORM_PORT = 50051
CREATE_LATENCY_MS = 100  # the platform's CreateSlot latency, in both modes
WORST = 10  # functions listed as the worst offenders
PAPERS_FIRST = "coldStartRate"  # the papers' metrics start here in the printed statistics, after a blank line
T = TypeVar("T")


@dataclass
class Recorded:
    """What a run's page is drawn from besides its statistics: the functions' timelines."""

    title: str
    timelines: list[Timeline]
    origin_ms: int  # add to the timelines' times for epoch ms
    end_ms: int  # the end of the run, in the timelines' times
    note: str = ""
    policy: str = ""  # as the runs store names it: the offline policy, or the one the live scaler said it runs

    def saved(self, heading: list[str], stats: Stats, functions: list[FunctionRow]) -> SavedRun:
        return SavedRun(
            title=self.title,
            heading=heading,
            stats=stats,
            functions=functions,
            timelines=self.timelines,
            origin_ms=self.origin_ms,
            end_ms=self.end_ms,
            note=self.note,
        )


class Failure(Exception):
    """The run could not be done; said in one line."""


class Terminated(Exception):
    """SIGTERM (`docker stop`, compose stopping the stack). As PID 1 in a container a signal with no
    handler does nothing, so the simulator would run on until Docker kills it after the grace period."""


class Interrupted(Exception):
    """Ctrl-C during a live run: the statistics of the requests done so far are still worth printing."""

    def __init__(self, run: Run, heading: list[str]) -> None:
        super().__init__("interrupted")
        self.run = run
        self.heading = heading


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


async def _until_terminated(run: Awaitable[T]) -> T:
    """Await `run`; on SIGTERM cancel it, so that its cleanup runs, and raise Terminated."""
    task = asyncio.ensure_future(run)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)  # wakes the loop, whichever thread gets the signal
    try:
        return await task
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise  # cancelled from outside, not by SIGTERM
        raise Terminated from None
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", metavar="DATASET_DIR", help="a folder with `metas` and `requests` (JSON lines)")
    p.add_argument("--offline", action="store_true", help="simulate the pure core on a virtual clock")
    p.add_argument(
        "--policy",
        metavar="NAME",
        type=policies.checked,
        help=f"offline: the policy to score (default {DEFAULT_POLICY}; {policies.choices()}); live mode"
        " measures the running scaler's policy (scaler up --policy)",
    )
    p.add_argument(
        "--exchange-rate",
        type=policies.rate_arg,
        metavar="GB_S",
        help="offline, learned: slot GB·s one second of waiting is worth (default: the run's own; docs/policies.md)",
    )
    p.add_argument(
        "--knob",
        action="append",
        type=knob_arg,
        metavar="NAME=VALUE",
        help="offline: a knob of the policy's config, e.g. between_share=0.01 (`scaler sweep --knobs` lists them);"
        " again for more",
    )
    p.add_argument(
        "--speed", type=positive, metavar="N", help="live: replay N times faster; the scaler must run at --speed N too"
    )
    p.add_argument(
        "--gateway", metavar="HOST:PORT", type=peer, help=f"live: the scaler's gRPC address (default {DEFAULT_GATEWAY})"
    )
    p.add_argument(
        "--platform-listen",
        metavar="HOST:PORT",
        type=address,
        help=f"live: where to serve the Platform API (default HOST:{PLATFORM_PORT}, HOST being --host)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="live: the address the Platform API and the statistics bind (0.0.0.0: every interface)",
    )
    p.add_argument(
        "--latency",
        metavar="FILE",
        help="offline: play the run on a live scaler's own latency, measured with --latency-out (docs/simulation.md)",
    )
    p.add_argument("--latency-seed", type=int, default=0, metavar="N", help="offline, with --latency: the delays' seed")
    p.add_argument(
        "--latency-out",
        metavar="FILE",
        help="live, speed 1: measure the scaler's own latency in this run (its calls, starts and timers, from this"
        " run's records and the scaler's events) and write it to FILE, for --offline --latency",
    )
    p.add_argument("--json", metavar="PATH", help="also write the statistics as a JSON object to PATH")
    p.add_argument(
        "--report",
        metavar="PATH.html",
        help="write the run as a page to look at: its score, and the functions that lost the most on a time axis"
        " (an HTML file, plotly.js written beside it; see docs/reports.md)",
    )
    p.add_argument(
        "--save-run",
        metavar="PATH",
        help="write the run (statistics, every function's figures and timeline) for a later --compare: PATH.json,"
        " or PATH.sqlite to add it to a runs store that SQL can query (docs/simulation.md)",
    )
    p.add_argument(
        "--nats",
        metavar="URL",
        type=nats_url,
        help="live, with --report or --save-run: the scaler's NATS, where its decisions and their reasons are read"
        " (default: the one the scaler at --gateway says it uses)",
    )
    p.add_argument(
        "--compare",
        metavar="OTHER",
        help="with --report: put a run saved with --save-run beside this one, on this run's worst functions:"
        " OTHER.json, or STORE.sqlite[:ID] (by default its newest run saved with --save-run)",
    )
    p.add_argument(
        "--stats-port",
        type=port,
        metavar="N",
        help="live: serve the statistics so far on http://HOST:N/stats (JSON) while it runs (0: any free port)",
    )
    p.add_argument(
        "--progress-every",
        type=positive,
        default=EVERY_S,
        metavar="S",
        help="progress: a bar on a terminal, else a line every S seconds",
    )
    service.add_client_tls(p, "gateway", "GATEWAY", "the scaler (live)")
    service.add_server_tls(p, "the Platform API (live)")
    service.add_nats_access(p)  # for --nats


def to_json(stats: Stats, functions: list[FunctionRow]) -> bytes:
    """The challenge's statistics under their own names, plus the worst functions."""
    fields = msgspec.to_builtins(stats)
    fields["functions"] = msgspec.to_builtins(functions)
    return msgspec.json.format(msgspec.json.encode(fields), indent=2) + b"\n"


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)  # offline; live mode's event loop has its own handler
    try:
        if args.compare and not args.report:
            raise Failure("--compare puts another run beside this one in the --report page: give --report too")
        other = _load_run(Path(args.compare)) if args.compare else None
        dataset = load_dataset(args.dataset)
        drawing = bool(args.report or args.save_run)
        outcome, heading, recorded = _offline(dataset, args, drawing) if args.offline else _live(dataset, args, drawing)
        stats = outcome.stats()
        functions = worst_functions(outcome.invocations, outcome.slot_gb_s_by_key, stats, WORST)
        written: list[str] = []  # said once the statistics are printed
        if args.json:
            written.append(_write(Path(args.json), to_json(stats, functions), "the statistics"))
        if drawing:
            every = worst_functions(outcome.invocations, outcome.slot_gb_s_by_key, stats, len(dataset.metas))
            saved = recorded.saved(heading, stats, every)
            if args.save_run:
                mode = "offline" if args.offline else "live"
                written.append(_save(Path(args.save_run), dataset.name, recorded.policy, mode, saved))
            if args.report:
                written.append(_write_page(Path(args.report), _drawing().page(saved, other)))
    except (DatasetError, LiveError, Failure) as e:
        print(f"scaler simulate: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:  # the statistics so far, said to be partial
        stats = e.run.stats()
        print("\n".join(e.heading))
        print(render(stats, worst_functions(e.run.invocations, e.run.slot_gb_s_by_key, stats, WORST)))
        print("scaler simulate: interrupted; the statistics above are partial", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("scaler simulate: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("scaler simulate: stopped by SIGTERM", file=sys.stderr)
        return 143
    print("\n".join(heading))
    print(render(stats, functions))
    for line in written:
        print(line, file=sys.stderr)
    return 0


def _save(path: Path, trace: str, policy: str, mode: str, saved: SavedRun) -> str:
    """--save-run: to a JSON file, or into a runs store, page data included; the line that says where."""
    if not runs.is_store(path):
        return _write(path, save(saved), "the run (for --compare)")
    record = runs.Record(trace, policy, saved.stats, saved.functions, mode=mode, title=saved.title, saved=saved)
    [run_id] = _stored(lambda runs: asyncio.run(runs.record(path, [record])))
    return f"scaler simulate: kept as run {run_id} in {path.resolve()}"


def _note(flags: list[str], why: str) -> None:
    if flags:
        print(f"note: {', '.join(flags)} {'is' if len(flags) == 1 else 'are'} ignored: {why}", file=sys.stderr)


def _load_run(path: Path) -> SavedRun:
    if runs.is_store(path):  # FILE.sqlite, or FILE.sqlite:ID
        name, _, which = str(path).partition(":")
        if which and not which.isdigit():
            raise Failure(f"--compare {path}: after the store's name, a run's id (FILE.sqlite:ID)")
        return _stored(lambda runs: asyncio.run(runs.saved_run(Path(name), int(which) if which else None)))
    try:
        return load(path.read_bytes())
    except OSError as e:
        raise Failure(f"{path}: cannot read: {e.strerror}") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Failure(f"{path}: not a run saved with --save-run: {e}") from None


def _tuned(name: str, rate: float | None, knobs: list[tuple[str, str]] | None) -> Policy:
    """The policy with the knobs and the exchange rate asked for (--knob, --exchange-rate): refused as a node refuses
    them (a knob the policy lacks, a value it cannot take, an exchange rate of a policy without one)."""
    try:
        return tuned(get_policy(name), rate, knobs or [])
    except KnobError as e:
        raise Failure(str(e)) from None


def _offline(dataset: Dataset, args: argparse.Namespace, drawing: bool) -> tuple[Run, list[str], Recorded | None]:
    name = args.policy or DEFAULT_POLICY
    given = [flag for flag, value in (("--speed", args.speed), ("--gateway", args.gateway)) if value is not None]
    given += ["--platform-listen"] if args.platform_listen is not None else []
    given += ["--stats-port"] if args.stats_port is not None else []
    given += ["--latency-out"] if args.latency_out is not None else []
    _note(given, "offline mode runs no scaler and no clock")
    model = None
    if args.latency is not None:
        try:
            model = latencies.load(args.latency)
        except ValueError as e:
            raise Failure(str(e)) from None
    started = time.perf_counter()
    progress = Progress(len(dataset.requests), dataset.span_ms, args.progress_every)
    sim = Simulation(
        dataset,
        _tuned(name, args.exchange_rate, args.knob),
        CREATE_LATENCY_MS,
        progress=progress,
        folds=Folds() if drawing else None,
        latency=model,
        seed=args.latency_seed,
    )
    run = sim.run()
    took = time.perf_counter() - started
    recorded = None
    if sim.folds is not None:
        recorded = Recorded(
            f"{dataset.name}: offline, policy {name}",
            [fold.done(sim.ledger_of(key).features_of(key).gap_hist) for key, fold in sim.folds.by_key.items()],
            dataset.start_ms,
            sim.end_ms,
            policy=name,
        )
    return (
        run,
        [
            f"{dataset.name}: offline, policy {name}, {len(dataset.requests)} requests, simulated in {took:.1f}s",
            f"schedule time: CreateSlot ({CREATE_LATENCY_MS} ms) + Init waits in trace time; "
            + (
                "the scaler's own latency counts as zero offline"
                if model is None
                else f"the scaler's own latency drawn from {args.latency} (seed {args.latency_seed}: {model.source})"
            ),
        ],
        recorded,
    )


def _live(dataset: Dataset, args: argparse.Namespace, drawing: bool) -> tuple[Run, list[str], Recorded | None]:
    if args.policy is not None:
        name = args.policy
        _note(["--policy"], f"live mode measures the running scaler's policy; start it with `--policy {name}`")
    if args.exchange_rate is not None or args.knob:
        flags = [f for f, v in (("--exchange-rate", args.exchange_rate), ("--knob", args.knob)) if v]
        _note(flags, f"live mode measures the running scaler's; start it with `{' '.join(flags)}`")
    if args.latency is not None:
        _note(["--latency"], "live mode measures the scaler's own latency (--latency-out writes it)")
    speed = args.speed or 1.0
    gateway = args.gateway or DEFAULT_GATEWAY
    started = time.perf_counter()
    stats = f"{args.host}:{args.stats_port}" if args.stats_port is not None else None
    drivers: list[LiveRun] = []
    try:
        outcome = asyncio.run(
            _until_terminated(
                run_live(
                    dataset,
                    gateway,
                    speed,
                    args.platform_listen or f"{args.host}:{PLATFORM_PORT}",
                    CREATE_LATENCY_MS,
                    Progress(len(dataset.requests), dataset.span_ms, args.progress_every),
                    stats,
                    said=lambda line: print(line, file=sys.stderr, flush=True),
                    began=drivers.append,
                    gateway_tls=service.client_tls(args, "gateway"),
                    platform_tls=service.server_tls(args),
                    latency=args.latency_out is not None,
                    events=args.nats,
                )
            )
        )
    except KeyboardInterrupt:
        if drivers:
            drivers[0].show_progress(final=True)  # the bar as it ends, on a line of its own
        if not drivers or not drivers[0].done:
            raise
        driver = drivers[0]
        raise Interrupted(
            driver.partial(),
            [
                f"{dataset.name}: PARTIAL, interrupted after {driver.done:,} of {len(dataset.requests):,} requests"
                f" (live against {gateway} at speed {speed:g}); slots charged until the interruption"
            ],
        ) from None
    took = time.perf_counter() - started
    run, says = outcome.run, outcome.info
    policy = f", policy {says.policy}" if says.policy else ""
    heading = [
        f"{dataset.name}: live against {gateway} at speed {speed:g}{policy}, {len(dataset.requests)} requests"
        f" in {took:.0f}s"
    ]
    if speed == 1:
        heading.append("schedule time: measured Assign time, CreateSlot + Init + the scaler's own latency")
    else:
        heading.append(
            f"schedule time at speed {speed:g}: CreateSlot + Init (and waits for executions) in trace time, the"
            f" scaler's own latency unscaled (as measured, not x{speed:g}); idle time unscaled too"
        )
    if outcome.retried:
        calls = ", ".join(f"{n:,} x {what}" for what, n in outcome.retried.most_common())
        heading.append(f"retried, each with the same request, as a platform does: {calls}")
    for message, count in outcome.errors.most_common(3):
        heading.append(f"failed: {count} x {message}")
    if outcome.latency is not None:
        try:
            latencies.dump(outcome.latency, args.latency_out)
        except OSError as e:
            raise Failure(f"{args.latency_out}: cannot write: {e.strerror}") from None
        heading.append(f"the scaler's own latency, written to {args.latency_out} (for --offline --latency):")
        heading += [f"  {line}" for line in outcome.latency.rows()]
    recorded = None
    if drawing:
        title = f"{dataset.name}: live{policy}, speed {speed:g}"
        worst = worst_functions(run.invocations, run.slot_gb_s_by_key, run.stats(), DRAWN)
        recorded = asyncio.run(_from_stream(title, args, args.nats or says.nats, gateway, [f.key for f in worst]))
        recorded.policy = says.policy or ""
    return run, heading, recorded


async def _from_stream(title: str, args: argparse.Namespace, url: str, gateway: str, keys: list[str]) -> Recorded:
    """The timelines of `keys` read back from the scaler's EVENTS stream (at `url`, the NATS the scaler at
    `gateway` said it uses, or --nats; with this command's NATS access): the reasons are only there."""
    try:
        if not url:
            raise ValueError(f"the scaler at {gateway} does not say where its NATS is")
        timelines = await replay.timelines(service.nats_access(args, "reader", url), keys)
    except (ValueError, replay.UnreadableStream, replay.rebuild.Uncovered) as e:
        note = f"no timelines: the scaler's events could not be read ({e}); pass --nats URL"
        print(f"scaler simulate: {note}", file=sys.stderr)
        return Recorded(title, [], 0, 0, note)
    end = max((t.last_ms for t in timelines), default=0)
    return Recorded(title, timelines, 0, end, "times are the scaler's clock (trace time under --speed)")


def _drawing():
    """scaler/simulator/report.py: it needs plotly, which an image running only the scaler lacks (compose's)."""
    try:
        from scaler.simulator import report
    except ImportError as e:
        raise Failure(f"--report, --save-run and --compare need plotly ({e}): pip install plotly") from None
    return report


def _stored(work):
    """`work(runs)`, a runs store's errors said as the command's."""
    try:
        return work(runs)
    except runs.RunsError as e:
        raise Failure(str(e)) from None


def _write_page(path: Path, page: str) -> str:
    """Write a page (and plotly.js beside it); the line that says where it went."""
    from scaler.report import draw

    try:
        draw.write(path, page)
    except OSError as e:
        raise Failure(f"{path}: cannot write: {e.strerror}") from None
    return f"scaler simulate: the report written to {path.resolve()}"


def _write(path: Path, data: bytes, what: str) -> str:
    """Write `data` to `path`; the line that says where `what` went."""
    try:
        path.write_bytes(data)
    except OSError as e:
        raise Failure(f"{path}: cannot write: {e.strerror}") from None
    return f"scaler simulate: {what} written to {path.resolve()}"


def render(stats: Stats, functions: list[FunctionRow]) -> str:
    """The statistics as a two-column table, then the worst functions."""
    fields: list[tuple[str, float | int | str]] = []
    for name, value in msgspec.to_builtins(stats).items():
        if name == "failuresByCause":  # one line each, under failedRequestsCount
            fields += [(f"  {cause}", count) for cause, count in value.items()]
        elif name == PAPERS_FIRST:
            fields += [("", ""), (name, f"{value:.2%}")]  # the papers' metrics, apart from the challenge's
        else:
            fields.append((name, value))
    width = max(len(name) for name, _ in fields)
    lines = [f"  {name:<{width}}  {_number(value)}".rstrip() for name, value in fields]
    if stats.success_rate < SUCCESS_THRESHOLD:
        why = f"success rate {stats.success_rate:.2%} is below {SUCCESS_THRESHOLD:.2%}"
        lines.append(f"  score 0: {why} (the sub-scores are what the run would have scored)")
    if functions:
        lines += ["", "worst functions (score lost to idle slots and waiting):"]
        header = (
            "metaKey",
            "requests",
            "coldStarts",
            "scheduleSecs",
            "waitP99Ms",
            "executionGBs",
            "slotGBs",
            "lostScore",
        )
        rows = [
            (
                f.key,
                f.requests,
                f.cold_starts,
                f.schedule_secs,
                f.wait_p99_ms,
                f.execution_g_bs,
                f.slot_g_bs,
                f.lost_score,
            )
            for f in functions
        ]
        key_width = max(len(header[0]), *(len(r[0]) for r in rows))
        lines.append(f"  {header[0]:<{key_width}}" + "".join(f"{h:>14}" for h in header[1:]))
        lines += [f"  {r[0]:<{key_width}}" + "".join(f"{_number(v):>14}" for v in r[1:]) for r in rows]
    return "\n".join(lines)


def _number(value: float | int | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4f}" if abs(value) < 1 else f"{value:,.2f}"
