"""`scaler trace import FORMAT SRC OUT`: convert a public trace to the dataset format `scaler simulate` reads.

Formats: azure2019 (SRC: the folder of the Azure Functions 2019 CSVs, or of a vHive In-Vitro sample
of them, or its invocations file), azure2021 (the invocation trace's file, an excerpt of it such as
In-Vitro's Azure2021_30.csv, or their folder) and huawei (Huawei Cloud 2023's private_dataset or
public_dataset folder). Files are known by their columns. Init times, which no trace gives, come from
--init-from: a constant, a log-uniform range, or Huawei 2025's cold starts. The same seed gives the same
dataset; --sample N takes N functions across the trace's popularity (stratified by invocations). Every
assumption (arrival times within a minute or second, durations and memory drawn from percentiles,
init times) is in docs/traces.md.
"""

import argparse
import statistics
import sys
from pathlib import Path

from scaler.runtime.service import positive
from scaler.traces import azure2019, azure2021, huawei, inits
from scaler.traces.build import DEFAULT_INIT_MS, DEFAULT_MEMORY_MB, Fill, TraceError, convert, sample, write

FORMATS = ("azure2019", "azure2021", "huawei")
DEFAULT_DURATION_MS = 100  # huawei's public set, which has no execution times


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    i = sub.add_parser("import", help="convert a public trace to a dataset folder", description=__doc__)
    i.formatter_class = p.formatter_class
    i.add_argument("format", choices=FORMATS, help="the trace's format")
    i.add_argument("src", metavar="SRC", type=Path, help="the trace's folder, or its (invocations) file")
    i.add_argument("out", metavar="OUT", type=Path, help="the dataset folder to write (`metas` and `requests`)")
    i.add_argument("--seed", type=int, default=0, help="seeds every draw: the same seed, the same dataset")
    i.add_argument("--sample", type=_count, metavar="N", help="take N functions, stratified by invocations")
    i.add_argument(
        "--day", type=int, metavar="N", help="azure2019, huawei: the day to read, of several (default: the first)"
    )
    i.add_argument(
        "--window",
        type=_window,
        metavar="FROM-TO",
        help="only requests starting in these minutes from the start of the day (azure2021: of the trace), e.g. 0-60",
    )
    i.add_argument(
        "--memory-mb", type=_count, default=DEFAULT_MEMORY_MB, metavar="MB", help="memory where the trace has none"
    )
    i.add_argument(
        "--init-from",
        type=inits.named,
        default=str(DEFAULT_INIT_MS),
        metavar="SPEC",
        help=f"where each function's init time is drawn from: {inits.SPECS}; docs/traces.md",
    )
    i.add_argument(
        "--duration-ms",
        type=_count,
        default=DEFAULT_DURATION_MS,
        metavar="MS",
        help="huawei: execution time where the trace has none (the public set)",
    )


def _count(text: str) -> int:
    value = positive(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def _window(text: str) -> tuple[int, int]:
    try:
        lo, hi = (float(part) for part in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not FROM-TO in minutes: {text!r}") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"FROM must be 0 or more and below TO: {text!r}")
    return round(lo * 60_000), round(hi * 60_000)


def _s(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def run(args: argparse.Namespace) -> int:
    try:
        fill = Fill(args.memory_mb, inits.load(args.init_from))
        if args.format == "azure2019":
            functions, base_ms, used = azure2019.read(args.src, args.day, args.window)
        elif args.format == "azure2021":
            if args.day is not None:
                raise TraceError("--day: the 2021 trace is one file over two weeks; use --window")
            functions, base_ms, used = azure2021.read(args.src, args.window)
        else:
            functions, base_ms, used = huawei.read(args.src, args.day, args.window, args.duration_ms)
        picked = sample(functions, args.sample, args.seed)
        converted = convert(picked, base_ms, args.seed, fill)
        if not converted.requests:
            raise TraceError(f"{args.src}: no requests in what was asked (window, day)")
        write(args.out, converted)
    except TraceError as e:
        print(f"scaler trace import: error: {e}", file=sys.stderr)
        return 1
    span_s = (converted.requests[-1].start_time - converted.requests[0].start_time) / 1000
    print(
        f"{args.out}: {len(converted.metas):,} functions (of {sum(1 for f in functions if f.invocations):,}),"
        f" {len(converted.requests):,} requests over {span_s:,.0f} s, seed {args.seed}"
    )
    if used:
        print(f"  {used}")
    for what, n in converted.filled.items():
        print(f"  {what}: {n:,} functions")
    starts = sorted(m.init_duration_in_ms for m in converted.metas)
    spread = f"{_s(starts[0])} to {_s(starts[-1])}, median {_s(statistics.median(starts))}"
    print(f"  init {fill.inits}" + (f"; {len(starts):,} functions, {spread}" if starts[0] != starts[-1] else ""))
    print(f"next: scaler simulate {args.out} --offline")
    return 0
