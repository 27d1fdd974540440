"""Render every page the scaler draws in headless Chromium and check a person would see something.

Not part of the test suite (a browser and a live run take a minute): run it by hand after
changing scaler/report/, scaler/simulator/report.py or scaler/replay/page.py.

    apt-get install -y chromium            # Debian's; once
    .venv/bin/python scripts/render_check.py [--big ../shared/datasets/dataSet_3]

It makes the pages from the smoke trace: an offline report (policy demo), the same run compared
with policy histogram, a sweep's page (`--sweep DATASET_DIR`: of demo and fixed10 over three
keep-alives, with every policy at its defaults), a live report (a `scaler up` started here, at speed
5; `--no-live` leaves it out) and `scaler replay --key K --html` of that live run's worst function.
Each page is opened from disk with the network off (it must fetch nothing but plotly.js, from the file
beside it); it passes when every plot div holds a drawn plot, the screenshot is not blank (its pixels
vary) and, on a page with lanes, zooming them re-bins them to the zoom and the rows below follow.
It prints how long the first screen took to draw from navigation, and every figure (`#all`). One
screenshot of each goes to docs/img/. With --big, it does the same for a dataset's offline page (its
size, how long it takes to open).
"""

import argparse
import base64
import json
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

from scaler.report.draw import PLOTLY_JS

ROOT = Path(__file__).resolve().parents[1]

SMOKE = ROOT / "tests" / "fixtures" / "function_smoke_test"
IMG = ROOT / "docs" / "img"
SCALER = [sys.executable, "-m", "scaler"]
WIDTH, HEIGHT = 1400, 2000
OPENS = 3  # the first screen's time is the median of this many opens (a loaded machine is noisy)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("render_check: no Chromium found: apt-get install -y chromium")


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: fds 3
    and 4, JSON messages ended by NUL), so the script needs nothing beyond the standard library."""

    def __init__(self, height: int = HEIGHT) -> None:
        ours_in, chrome_out = os.pipe()  # Chromium writes replies on its fd 4
        chrome_in, ours_out = os.pipe()  # ... and reads commands on its fd 3
        command = [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            "--enable-unsafe-swiftshader",  # WebGL (scattergl) in software: no GPU here
            "--use-angle=swiftshader",
            "--proxy-server=127.0.0.1:9",  # the network off: a page that loads anything fails to
            "--proxy-bypass-list=<-loopback>",
            f"--window-size={WIDTH},{height}",
            f"--user-data-dir={tempfile.mkdtemp(prefix='render_check.chromium.')}",
        ]
        self.proc = subprocess.Popen(
            command,
            pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(chrome_in, 3), os.dup2(chrome_out, 4)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(chrome_in)
        os.close(chrome_out)
        self.reader, self.writer = os.fdopen(ours_in, "rb"), os.fdopen(ours_out, "wb")
        self.next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def call(self, method: str, session: bool = False, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.writer.write(json.dumps(message).encode() + b"\0")
        self.writer.flush()
        buffered = b""
        while True:
            while b"\0" not in buffered:
                chunk = os.read(self.reader.fileno(), 1 << 20)
                assert chunk, "Chromium went away"
                buffered += chunk
            raw, _, buffered = buffered.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]

    def evaluate(self, expression: str, wait: bool = False):
        """The expression's value (with `wait`, the value its promise resolves to)."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=wait
        )
        return result["result"].get("value")

    def open(self, url: str, timeout_s: float = 120) -> float:
        """Navigate and wait until the page says its figures are drawn (data-drawn-ms); the seconds it took."""
        self.call("Page.navigate", session=True, url="about:blank")  # a fresh load, even of the same page
        while self.evaluate("location.href") != "about:blank":
            time.sleep(0.05)
        started = time.perf_counter()
        self.call("Page.navigate", session=True, url=url)
        while not self.evaluate("document.body && document.body.dataset.drawnMs"):
            assert time.perf_counter() - started < timeout_s, f"{url}: not drawn in {timeout_s:g}s"
            time.sleep(0.05)
        return time.perf_counter() - started

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png")["data"]))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


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


# Zoom the first lanes figure to a tenth of its span: its columns must be re-binned to the zoom (its first
# column inside the span, as many columns as before) and the figure it leads must show the same span.
ZOOM = """(async () => {
  const d = document.querySelector('div.plot[data-rebin]');
  if (!d) return null;
  const r = JSON.parse(document.getElementById(d.id + '-rebin').textContent);
  const lo = r.origin + r.lo, hi = lo + (r.hi - r.lo) / 10, width = (hi - lo) / r.columns;
  await Plotly.relayout(d, {'xaxis.range': [lo, hi]});
  await new Promise((done) => setTimeout(done, 200));
  const x = d.data[0].x, follower = document.getElementById(d.dataset.follow);
  if (!(x[0] >= lo && x[0] <= lo + width)) return `first column at ${x[0]}, not in [${lo}, ${lo + width}]`;
  if (x.length < r.columns - 1) return `${x.length} columns after the zoom`;
  if (!follower || follower.layout.xaxis.autorange) return 'the instances below did not follow the zoom';
  return 'ok';
})()"""


def check(name: str, page: Path, height: int = HEIGHT) -> None:
    """The page draws: every plot div holds a drawn plot, and its screenshot is not blank."""
    browser = Browser(height)
    try:
        first = statistics.median(browser.open(page.as_uri()) for _ in range(OPENS))  # the first screen
        whole = browser.open(page.as_uri() + "#all")  # every figure
        divs = browser.evaluate("document.querySelectorAll('div.plot').length")
        drawn = browser.evaluate("document.querySelectorAll('div.plot .main-svg').length") // 2  # 2 SVGs each
        fetched = browser.evaluate(
            "performance.getEntriesByType('resource').map((r) => r.name).filter((n) => !n.startsWith('data:'))"
        )
        fetched = [url for url in fetched if url != (page.parent / PLOTLY_JS).as_uri()]  # plotly.js, beside it
        shot = IMG / f"{name}.png"  # of the page with every figure drawn (#all, as it is now)
        browser.screenshot(shot)
        zoomed = browser.evaluate(ZOOM, wait=True)
    finally:
        browser.close()
    assert divs and drawn >= divs, f"{name}: {drawn} of {divs} plots drawn"
    assert not fetched, f"{name}: the page fetched {fetched} (only plotly.js beside it may be)"
    assert zoomed in (None, "ok"), f"{name}: zooming the lanes: {zoomed}"
    spread = statistics.pstdev(pixels(shot))
    assert spread > 20, f"{name}: the screenshot is blank (grey level spread {spread:.1f})"
    print(
        f"{name}: {page.stat().st_size / 1e6:.1f} MB, {divs} plots, first screen drawn in {first:.1f}s"
        f" (median of {OPENS}), every plot in {whole:.1f}s, grey spread {spread:.0f} -> {shot}"
    )


def scaler(*args: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([*SCALER, *map(str, args)], capture_output=True, text=True, cwd=ROOT, **kw)
    assert done.returncode == 0, f"scaler {' '.join(map(str, args))}: {done.stderr[-2000:]}"
    return done


def live(tmp: Path) -> tuple[Path, Path]:
    """A live run of the smoke trace against a `scaler up` started here, then the replay page of its worst function."""
    from scaler.runtime.ports import free_port  # the project is on sys.path once main() ran

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
        from scaler.simulator.report import load

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
    parser.add_argument("--sweep", default=SMOKE, metavar="DATASET_DIR", help="the dataset of the sweep page")
    parser.add_argument("--no-live", action="store_true", help="leave out the live run and its replay page")
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
        swept = tmp / "sweep.html"
        started = time.perf_counter()
        done = scaler(
            "sweep", args.sweep, "--policy", "demo", "--policy", "fixed10", "--vary", "keep_alive_ms=1min,10min,1h",
            "--compare", "--db", tmp / "runs.sqlite", "--page", swept, timeout=3600,
        )  # fmt: skip
        print(done.stdout.rstrip())
        print(f"sweep of {args.sweep}: {time.perf_counter() - started:.0f}s")
        check("sweep", swept, height=1400)
        if not args.no_live:
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
            check("big", big)
    print("render_check: every page draws")


if __name__ == "__main__":
    main()
