"""Dashboard: seconds to the first heatmap, `make run` against plain `streamlit run app.py`.

    python -m benchmarks.bench_first_chart [--launches 5] [--results FILE]

Each launch starts a fresh server on the built-in demo, and a fresh tab of headless Chromium
opens the dashboard; timed until the cluster heatmap ("score per cluster") is drawn. `make
run` starts scripts/serve.py, which is `streamlit run app.py` plus a thread that imports the
first page's libraries (torch, pandas, plotly, the attribution package) while the server
starts; under plain `streamlit run app.py` the first visitor's run imports them. Two visitors:
one already waiting, who opens the page the moment the server answers (timed from the
launch: the worst case for the warm-up, which then competes with the page loading for the
CPU), and one who arrives once the server is ready (plain: answering; the launcher: its
warm-up done), timed from opening the page, as someone who runs `make run` and then opens
the link. The two ways to start alternate launch by launch, so the noise of a shared machine
hits both alike; medians, with the fastest and slowest launch. Target: the first heatmap
under 5 s from the launch, on a 2-core machine.
"""
import argparse
import re
import statistics
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from benchmarks.common import note, record, run
from tests.support.browser import (ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, ENTRY_POINTS, Server,
                                   check_and_close, open_tab, streamlit_server)

WARMED = re.compile(r"Warm-up: .* in ([\d.]+) s")
NAMES = {"make run": "`make run` (scripts/serve.py)", "streamlit run": "`streamlit run app.py`"}


def warm_up_seconds(log: Path, server: Server, timeout_s: float = 120) -> float:
    """Wait for the launcher's warm-up line in its log; the seconds it reports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.process.returncode}")
        if found := WARMED.search(log.read_text()):
            return float(found.group(1))
        time.sleep(0.05)
    raise RuntimeError(f"no warm-up line in {log} within {timeout_s} s")


def first_heatmap(browser, entry_point: str, ready: bool) -> tuple[float, float, float | None]:
    """One fresh server: (seconds from the launch, seconds from opening the page, the
    launcher's warm-up seconds or None) to the first heatmap. With `ready`, the page opens
    once the launcher's warm-up is done, else as soon as the server answers."""
    log_name = f"bench-first-chart-{entry_point.replace(' ', '-')}.log"
    with streamlit_server(log_name, entry_point) as server:
        warm_up = None
        if ready and entry_point == "make run":
            warm_up = warm_up_seconds(ARTIFACTS / log_name, server)
        app, context = open_tab(browser, server)
        opened = app.open()
        app.wait_for_chart("score per cluster")
        drawn = time.monotonic()
        # the sidebar's widgets may draw after the heatmap (the browser loads their code)
        app.page.get_by_test_id("stSidebar").get_by_text("Model and data").wait_for()
        check_and_close(app, context)
        return drawn - server.started, drawn - opened, warm_up


def spread(seconds: list[float]) -> tuple[str, str]:
    return (f"{statistics.median(seconds):.2f} s",
            f"{min(seconds):.2f} – {max(seconds):.2f} s")


def show(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print a table and record it for docs/speed.md."""
    print(f"\n{title}")
    for row in [header, *rows]:
        print("  " + " | ".join(row))
    record(title, header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5)
    launches = parser.parse_args().launches
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for ready in (False, True):
            times = {entry_point: [] for entry_point in ENTRY_POINTS}
            for _ in range(launches):
                for entry_point, rows in times.items():
                    rows.append(first_heatmap(browser, entry_point, ready))
                    print(f"{'ready' if ready else 'waiting'} {entry_point}: "
                          f"{rows[-1][0]:.2f} s from the launch, {rows[-1][1]:.2f} s from "
                          "opening the page", flush=True)
            if ready:
                show(f"A visitor who opens the page once the server is ready: seconds from "
                       f"opening it to the first heatmap, {launches} launches each",
                       ("server started by", "median", "min – max"),
                       [(NAMES[entry_point], *spread([row[1] for row in rows]))
                        for entry_point, rows in times.items()])
                warm_ups = [row[2] for row in times["make run"]]
                warm_up = (f"The launcher's warm-up (its imports) took a median "
                           f"{statistics.median(warm_ups):.1f} s "
                           f"({min(warm_ups):.1f} – {max(warm_ups):.1f} s).")
                print(warm_up)
                note(warm_up)
            else:
                show(f"A visitor already waiting: seconds from launching the server to the "
                       f"first heatmap, {launches} launches each",
                       ("server started by", "median", "min – max",
                        "of which from opening the page (median)"),
                       [(NAMES[entry_point], *spread([row[0] for row in rows]),
                         f"{statistics.median(row[1] for row in rows):.2f} s")
                        for entry_point, rows in times.items()])
        browser.close()


if __name__ == "__main__":
    sys.exit(run(main, "bench_first_chart"))
