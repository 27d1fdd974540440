"""Render every page the scaler draws in headless Chromium and check a person would see something.

Not part of the test suite (a browser and a live run take a minute): run it by hand after
changing report/, simulator/report.py or controller/replay_page.py.

    apt-get install -y chromium            # Debian's; once
    .venv/bin/python scripts/render_check.py [--big ../shared/datasets/dataSet_3]

It makes the pages from the smoke trace: an offline report (policy demo), the same run compared
with policy histogram, a live report (a `scaler up` started here, at speed 5) and `scaler replay
--key K --html` of that live run's worst function. Each page is opened from disk with the network
off; it passes when the DOM holds a drawn plot for every plot div and the screenshot is not blank
(its pixels vary). One screenshot of each goes to docs/img/. With --big, it also reports a
dataset's offline page: its size and how long Chromium takes to open and draw it.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "fixtures" / "function_smoke_test"
IMG = ROOT / "docs" / "img"
SCALER = [sys.executable, "-m", "scaler.cli"]
WIDTH, HEIGHT = 1400, 2000


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("render_check: no Chromium found: apt-get install -y chromium")


def browse(page: Path, *args: str, height: int = HEIGHT) -> tuple[subprocess.CompletedProcess, float]:
    """Chromium headless on `page`, with no network; the run and how long it took."""
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--hide-scrollbars",
        "--enable-unsafe-swiftshader",  # WebGL (scattergl) in software: no GPU here
        "--use-angle=swiftshader",
        "--proxy-server=127.0.0.1:9",  # the network off: a page that loads anything fails to
        "--proxy-bypass-list=<-loopback>",
        f"--window-size={WIDTH},{height}",
        *args,
        page.as_uri(),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return done, time.perf_counter() - started


def pixels(png: Path) -> list[int]:
    """The grey levels of a PNG Chromium wrote (8-bit RGB or RGBA, not interlaced): stdlib only."""
    data = png.read_bytes()
    pos, idat, width = 8, b"", 0
    channels = 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6), f"{png}: unexpected PNG format"
            channels = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    prev, grey = bytearray(stride), []
    for row in range(len(raw) // (stride + 1)):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1 : (row + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if row % 4 == 0:  # every 4th row and column is plenty to tell a blank page
            grey += [sum(line[i : i + 3]) // 3 for i in range(0, stride, 4 * channels)]
        prev = line
    return grey


def check(name: str, page: Path, height: int = HEIGHT) -> None:
    """The page draws: every plot div holds a drawn plot, and its screenshot is not blank."""
    dom, took = browse(page, "--dump-dom")
    divs = len(re.findall(r'class="plotly-graph-div[^"]*"', dom.stdout))
    drawn = dom.stdout.count('class="main-svg"') // 2  # plotly draws two SVG layers per plot
    assert divs and drawn >= divs, f"{name}: {drawn} of {divs} plots drawn"
    shot = IMG / f"{name}.png"
    run, _ = browse(page, f"--screenshot={shot}", "--virtual-time-budget=5000", height=height)
    assert shot.exists(), f"{name}: no screenshot: {run.stderr[-500:]}"
    grey = pixels(shot)
    spread = statistics.pstdev(grey)
    assert spread > 20, f"{name}: the screenshot is blank (grey level spread {spread:.1f})"
    drawn_ms = re.search(r'data-drawn-ms="(\d+)"', dom.stdout)
    print(
        f"{name}: {page.stat().st_size / 1e6:.1f} MB, {divs} plots drawn, grey spread {spread:.0f},"
        f" opened and drawn in {took:.1f}s (in-page {drawn_ms.group(1) if drawn_ms else '?'} ms) -> {shot}"
    )


def scaler(*args: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([*SCALER, *map(str, args)], capture_output=True, text=True, cwd=ROOT, **kw)
    assert done.returncode == 0, f"scaler {' '.join(map(str, args))}: {done.stderr[-2000:]}"
    return done


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live(tmp: Path) -> tuple[Path, Path]:
    """A live run of the smoke trace against a `scaler up` started here, then the replay page of its worst function."""
    platform = free_port()
    up = subprocess.Popen(
        [*SCALER, "up", "--port", "0", "--speed", "5", "--platform", f"127.0.0.1:{platform}", "--data-dir", tmp / "up"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        for line in up.stderr:
            if m := re.search(r"scaler ready: gRPC ([\d.:]+),.* nats (\S+)", line):
                gateway, nats = m.groups()
                break
        else:
            raise AssertionError("scaler up did not start")
        page, saved = tmp / "live.html", tmp / "live.json"
        scaler(
            "simulate", SMOKE, "--speed", 5, "--gateway", gateway, "--platform-listen", f"127.0.0.1:{platform}",
            "--report", page, "--save-run", saved, "--nats", nats, timeout=600,
        )  # fmt: skip
        from simulator.report import load

        worst = load(saved.read_bytes()).functions[0].key
        replayed = tmp / "replay.html"
        scaler("replay", "--nats", nats, "--key", worst, "--html", replayed, timeout=120)
        return page, replayed
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", metavar="DATASET_DIR", help="also measure this dataset's offline report")
    parser.add_argument("--policy", default="learned", help="the policy of the --big run (default learned)")
    args = parser.parse_args()
    IMG.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="render_check.") as name:
        tmp = Path(name)
        demo, demo_run = tmp / "report.html", tmp / "demo.json"
        scaler("simulate", SMOKE, "--offline", "--policy", "demo", "--report", demo, "--save-run", demo_run)
        check("report", demo)
        compared = tmp / "compare.html"
        scaler("simulate", SMOKE, "--offline", "--policy", "histogram", "--report", compared, "--compare", demo_run)
        check("compare", compared, height=2600)  # down to the first function, side by side
        live_page, replayed = live(tmp)
        check("live", live_page)
        check("replay", replayed)
        if args.big:
            big = tmp / "big.html"
            started = time.perf_counter()
            scaler(
                "simulate", args.big, "--offline", "--policy", args.policy, "--report", big, "--progress-every", 600,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            print(f"{args.big}: simulated and drawn in {time.perf_counter() - started:.0f}s")
            _, baseline = browse(Path(os.devnull), "--dump-dom")
            check("big", big)
            print(f"(Chromium's own start, on an empty page: {baseline:.1f}s)")
    print("render_check: every page draws")


if __name__ == "__main__":
    main()
