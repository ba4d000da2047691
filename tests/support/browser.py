"""Driving the dashboard in a real headless Chromium: the server on a free port, started as
`make run` starts it (scripts/serve.py) or as plain `streamlit run app.py`, a tab that records
what went wrong in it, and the helpers the browser tests and benchmarks share
(the fixtures `browser`, `server` and `app` are in tests/conftest.py)."""
from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tests.support import ROOT

if TYPE_CHECKING:  # playwright is imported by the tests that drive a browser
    from playwright.sync_api import Browser, Page

BROWSER_TIMINGS: dict[str, float] = {}
"""Seconds measured by the browser tests, shown after the run (tests/conftest.py)."""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"
ENTRY_POINTS = {  # how a server starts: the flags each gets follow
    "make run": [sys.executable, str(ROOT / "scripts" / "serve.py")],
    "streamlit run": [sys.executable, "-m", "streamlit", "run", "app.py"]}
BASE_PATH_PROBE = re.compile(r"^http://localhost:\d+/[a-z]+/_stcore/(health|host-config)$")
SCRIPT_IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
"""The app when its frontend has no script run in progress, requested or running."""
COLD_START_S, REDRAW_S, FIRST_POINTS_S = 10.0, 2.0, 1.0  # on this 2-core machine, idle
# Other work on the machine (1-minute load average above the core count when the tests start)
# stretches every budget by the same factor, so a busy machine does not fail the app.
CONTENTION = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
CHART_WITH_TITLE = """([part, exact]) => [...document.querySelectorAll('.js-plotly-plot')]
    .some(e => { const t = (e.layout && e.layout.title && e.layout.title.text) || '';
                 return exact ? t.startsWith(part) : t.includes(part); })"""
CLICK_CLOCK = """() => { window.lastClick = null;
    document.addEventListener('click', () => { window.lastClick = performance.now(); }, true); }"""
RANKED_POINTS = """() => [...document.querySelectorAll('.js-plotly-plot')]
    .filter(e => ((e.layout && e.layout.title && e.layout.title.text) || '')
                 .includes('neurons are removed'))
    .flatMap(e => e._fullData.filter(t => (t.name || '').startsWith('top-k'))
                             .map(t => t.x.length))"""


@dataclass
class Server:
    url: str
    started: float
    process: subprocess.Popen
    log: Path | None = None  # what it printed
    dumps_stacks: bool = False  # started by scripts/serve.py, which dumps them on SIGUSR1

    def stacks(self) -> str:
        """Every thread's stack in the server now, from the end of its log: where a server
        that stopped answering is stuck ("" where it cannot say)."""
        if self.log is None or not self.dumps_stacks or self.process.poll() is not None:
            return ""
        size = self.log.stat().st_size
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.log.stat().st_size == size:
            time.sleep(0.1)  # the dump is written by the server's own signal handler
        time.sleep(0.5)
        with open(self.log, "rb") as log:
            log.seek(size)
            return log.read()[-20_000:].decode(errors="replace")


@dataclass
class App:
    """One browser tab on the dashboard, with what it logged."""

    page: Page
    server: Server
    problems: list[str] = field(default_factory=list)

    def open(self, path: str = "") -> float:
        started = time.monotonic()
        self.page.goto(self.server.url + path)
        return started

    def wait_for_chart(self, title_part: str, *, exact: bool = False,
                       timeout_s: float = 60) -> None:
        self.page.wait_for_function(CHART_WITH_TITLE, arg=[title_part, exact],
                                    timeout=timeout_s * 1000, polling=20)

    def seconds_since_click_to_charts(self, *title_parts: str) -> float:
        """Seconds from the page's last click event to charts titled with each of `title_parts`
        (a title starts with it) being drawn, timed in the page by its own clock after
        `start_click_clock`: Playwright's click (actionability checks, ~60 ms here) is left
        out."""
        every = " && ".join(f"({CHART_WITH_TITLE})([{part!r}, true])" for part in title_parts)
        return self.page.wait_for_function(
            f"() => window.lastClick !== null && {every} && performance.now() - window.lastClick",
            polling="raf", timeout=60_000).json_value() / 1000

    def start_click_clock(self) -> None:
        self.page.evaluate(CLICK_CLOCK)

    def chart_titles(self) -> list[str]:
        return self.page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .map(e => (e.layout && e.layout.title && e.layout.title.text) || '')""")

    def go_to(self, page_title: str) -> float:
        started = time.monotonic()
        self.page.get_by_role("link", name=page_title).click()
        return started

    def choose(self, label: str, option: str) -> float:
        """Pick `option` (its visible text, or its start) in the sidebar selectbox `label`."""
        label_text = self.page.get_by_test_id("stWidgetLabel").get_by_text(label, exact=True)
        box = self.page.get_by_test_id("stSidebar").get_by_test_id("stSelectbox").filter(
            has=label_text)
        box.click()
        choice = self.page.get_by_role("option").filter(has_text=option).first
        started = time.monotonic()
        choice.click()
        return started

    def upload(self, label: str, path: Path) -> None:
        """Upload through the real file input once no run is in progress (a run that ends
        redraws the uploaders and can drop a file given meanwhile); wait until the widget
        lists the file and no run is in progress again, so a following upload starts on a
        settled page. "No run" is the frontend's own script state on stApp: the status
        widget shows a run only after a delay, so its absence let an upload in mid-run."""
        idle = self.page.locator(SCRIPT_IDLE)
        idle.wait_for(timeout=120_000)
        uploader = self.page.get_by_test_id("stFileUploader").filter(has_text=label)
        uploader.locator("input[type=file]").set_input_files(path)
        uploader.get_by_text(path.name, exact=True).wait_for(timeout=120_000)
        idle.wait_for(timeout=120_000)

    def open_with_files(self, model: Path, data: Path) -> None:
        """The Model & data page with `model` and `data` uploaded through its file inputs,
        and in use (`wait_for_upload`)."""
        self.open("/data")
        self.page.get_by_text("Sample files").wait_for(timeout=60_000)
        self.upload("Model file", model)
        self.upload("Data file", data)
        self.wait_for_upload(f"{model.name} + {data.name}")

    def wait_for_upload(self, title: str, timeout_s: float = 180) -> None:
        """Wait until the uploaded files are in use (the page names them as `title`); if the
        page refuses them instead, fail with its message and a screenshot. The jail reads
        both files first, on a server that may still be importing transformers for its
        warm-up while earlier sessions' runs finish: minutes on a busy machine, not seconds."""
        named = self.page.get_by_text(title)
        refused = self.page.get_by_text("These files could not be used")
        named.or_(refused).first.wait_for(timeout=timeout_s * 1000)
        if not named.count():
            self.screenshot("upload-refused")
            raise AssertionError("the upload was refused: " + " | ".join(
                self.page.get_by_test_id("stAlertContainer").all_inner_texts()))

    def wait_for_text(self, text: str, timeout_s: float = 60) -> None:
        self.page.get_by_text(text, exact=False).first.wait_for(timeout=timeout_s * 1000)

    def ranked_points(self) -> list[int]:
        """The number of points of each top-k curve on the page, once a curve is drawn (a
        chart being redrawn is briefly missing from the page)."""
        return self.page.wait_for_function(
            f"() => {{ const n = ({RANKED_POINTS})(); return n.length ? n : null; }}",
            polling=20, timeout=30_000).json_value()

    def finished_curve_points(self) -> list[int]:
        """`ranked_points` of the finished pruning curve, once its page shows one chart:
        the finished run's chart stands where the computing run's stood, but the browser
        keeps an earlier run's elements, greyed, until the run that replaces them ends."""
        return self.page.wait_for_function(
            f"() => {{ const n = ({RANKED_POINTS})(); return n.length === 2 ? n : null; }}",
            polling=50, timeout=60_000).json_value()

    @contextmanager
    def server_paused_mid_curve(self) -> Iterator[list[int]]:
        """Freeze the Streamlit server (SIGSTOP) at the first points of the pruning curve it is
        computing, for the block: a click there lands mid-curve however fast the machine is
        (the browser's message waits in the socket, and the resumed server acts on it at its
        next yield). A demo curve ends 1-2 s after its first points and a busy browser can lag
        the server by more, so from the page's first run the server runs in short steps, each
        followed by a pause in which the browser draws what it was sent: the server is never
        more than a step ahead of the page. Yields the points then on the page, read once the
        paused page has stopped changing."""
        pid = self.server.process.pid
        stop_button = self.page.get_by_role("button", name="Stop the curve")
        deadline = time.monotonic() + 180
        os.kill(pid, signal.SIGSTOP)
        try:
            while not (stop_button.count() and any(self.page.evaluate(RANKED_POINTS))):
                assert time.monotonic() < deadline, "no curve points within 3 minutes"
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.03 if stop_button.count() else 0.1)
                os.kill(pid, signal.SIGSTOP)
                self.page.wait_for_timeout(250)
            points, settled = None, self.page.evaluate(RANKED_POINTS)
            while settled != points:
                points = settled
                self.page.wait_for_timeout(250)
                settled = self.page.evaluate(RANKED_POINTS)
            yield points
        finally:
            os.kill(pid, signal.SIGCONT)

    def screenshot(self, name: str) -> None:
        """The whole page (Streamlit scrolls inside its main block, so grow the window)."""
        height = self.page.evaluate(
            "document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        self.page.set_viewport_size({"width": 1440, "height": min(int(height) + 40, 8000)})
        self.page.wait_for_timeout(600)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
        self.page.set_viewport_size({"width": 1440, "height": 1000})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, log: Path,
                        timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"streamlit did not answer within {timeout_s} s")


@contextmanager
def streamlit_server(log_name: str, entry_point: str = "make run",
                     app_arguments: tuple[str, ...] = (), root: Path = ROOT) -> Iterator[Server]:
    """The dashboard on a free port, started by `entry_point` (a key of ENTRY_POINTS) with
    `app_arguments` after `--`, in `root` (another checkout's app.py and package, for
    "before" figures); its output in test-artifacts/<log_name>. `started` is when the
    process was launched."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    url = f"http://localhost:{port}"
    log_path = ARTIFACTS / log_name
    flags = ["--server.port", str(port), "--server.headless", "true"]
    with open(log_path, "w") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            ENTRY_POINTS[entry_point] + flags + (["--", *app_arguments] if app_arguments else []),
            cwd=root, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_healthy(url, process, log_path)
            yield Server(url, started, process, log_path, entry_point == "make run")
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def open_tab(browser: Browser, server: Server) -> tuple[App, object]:
    """A fresh tab (its own Streamlit session) that records console errors, page errors and
    failed requests. Opening a page's own address (/pruning) makes Streamlit's frontend
    probe /pruning/_stcore/health and /pruning/_stcore/host-config for a base path before it
    uses /; those two expected 404s (logged by Chromium as "Failed to load resource") are
    the only failures let through."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000},
                                  accept_downloads=True)
    app = App(context.new_page(), server)

    def on_console(message) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            app.problems.append(f"console {message.type}: {message.text}")

    def on_response(response) -> None:
        if response.status >= 400 and not BASE_PATH_PROBE.search(response.url):
            app.problems.append(f"HTTP {response.status}: {response.url}")

    app.page.on("console", on_console)
    app.page.on("response", on_response)
    app.page.on("requestfailed", lambda request: app.problems.append(
        f"request failed: {request.url} {request.failure}"))
    app.page.on("pageerror", lambda error: app.problems.append(f"page error: {error}"))
    return app, context


def check_and_close(app: App, context) -> None:
    exceptions = app.page.get_by_test_id("stException").all_inner_texts()
    # app.py ran (its pages in the top bar, its choices in the sidebar), not a page alone
    navigation = app.page.get_by_role("link", name="Neuron scores").count()
    choices = app.page.get_by_test_id("stSidebar").get_by_text("Model and data").count()
    context.close()
    assert not exceptions, exceptions
    assert navigation == 1 and choices == 1
    assert not app.problems, app.problems


IDLE_FLOOR_S = 3.0
"""`import torch` and loading the demo CNN's .pt2 in a new process on the idle machine the
budgets were set on (2.6 to 3.05 s in the sessions that set them,
`benchmarks/bench_layers_command.py`'s floor)."""


@functools.cache
def slower_machine() -> float:
    """How much slower than the machine the budgets were set on this one is, idle: that
    floor timed here (the faster of two runs, once per test session, before the first
    browser starts), as a factor (at least 1). A slower machine stretches every budget by
    it, as CONTENTION does for a busy one; an app slower than its machine is still
    caught."""
    from attribution.inputs.demo import DEMO_FILES

    (program,) = [f.path for f in DEMO_FILES if f.path.name == "digits_cnn.pt2"]
    floor = [sys.executable, "-c", f"import torch; torch.export.load({str(program)!r})"]
    fastest = float("inf")
    for _ in range(2):  # the faster of two: the first may read the files from disk
        started = time.perf_counter()
        subprocess.run(floor, check=True, capture_output=True)
        fastest = min(fastest, time.perf_counter() - started)
    return max(1.0, fastest / IDLE_FLOOR_S)


def within_budget(seconds: float, budget: float) -> bool:
    return seconds < budget * CONTENTION * slower_machine()
