"""Scores-page redraws on a wide layer in headless Chromium, checkouts side by side.

    python -m benchmarks.bench_wide_scores [--rounds 6] [--width 3072] [CHECKOUT ...]
                                           [--results FILE]

An MLP on the digits with one `--width`-wide hidden layer (fc1; untrained, seeded; 3072 is a
transformer MLP's width) and the held-out digits without clusters (one per label: 10) are
uploaded through the Model & data page of each checkout (default: this one), each served by
its own `streamlit run`. Then, in alternation, each tab changes the method (ablation <->
gradient x activation) and the cluster (7 <-> 3); recorded per checkout: seconds from the
page's click event to the charts drawn, and the browser's long tasks (main-thread work over
50 ms) within that time. Medians. What keeps a wide layer's redraw short: the cluster
heatmap shows at most 128 neurons (each cluster's largest |score| in turn, said in its axis
title) instead of a click target for every one of 30,720 sub-pixel cells. To compare with a
past commit: `git archive COMMIT | tar -x -C DIR` and pass DIR as a second checkout.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from playwright.sync_api import sync_playwright
from torch import nn

from attribution.inputs.demo import DEMO_DIR
from benchmarks.common import record, run
from tests.support import ROOT
from tests.support.browser import (CHROMIUM, CHROMIUM_ARGS, App, Server, free_port, open_tab,
                                   wait_until_healthy)

METHODS = ("ablation", "gradient × activation")
CLUSTERS = ("7 (seven)", "3 (three)")
LONG_TASKS = """() => { window.longTasks = []; new PerformanceObserver(list =>
    window.longTasks.push(...list.getEntries().map(e => [e.startTime, e.duration])))
    .observe({type: 'longtask'}); }"""
LONG_SECONDS = """(s) => window.longTasks.filter(([t, d]) => t >= window.lastClick
    && t < window.lastClick + s * 1000).reduce((sum, [t, d]) => sum + d, 0) / 1000"""


def write_files(folder: Path, width: int) -> tuple[Path, Path]:
    """A .pt2 of a 64 -> width -> 10 MLP and an .npz of the held-out digits (no clusters)."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(64, width))
    model.add_module("relu1", nn.ReLU())
    model.add_module("out", nn.Linear(width, 10))
    digits = np.load(DEMO_DIR / "digits.npz")
    program = torch.export.export(model.eval(), (torch.tensor(digits["inputs"][:8]),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    model_file, data_file = folder / "wide_mlp.pt2", folder / "wide_digits.npz"
    torch.export.save(program, model_file)
    np.savez(data_file, inputs=digits["inputs"], labels=digits["labels"],
             class_names=digits["class_names"])
    return model_file, data_file


@contextmanager
def served(checkout: Path, log: Path) -> Iterator[Server]:
    port = free_port()
    url = f"http://localhost:{port}"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.headless", "true"], cwd=checkout, stdout=output,
            stderr=subprocess.STDOUT)
        try:
            wait_until_healthy(url, process, log)
            yield Server(url, time.monotonic(), process)
        finally:
            process.terminate()
            process.wait(15)


def prepare(app: App, model_file: Path, data_file: Path) -> None:
    """Upload, choose fc1, open the Scores page and compute both methods' scores once."""
    app.open("/data")
    app.page.get_by_text("Sample files").wait_for(timeout=60_000)
    app.upload("Model file", model_file)
    app.upload("Data file", data_file)
    app.page.get_by_text(f"{model_file.name} + {data_file.name}").wait_for(timeout=120_000)
    app.choose("Layer", "fc1")
    app.page.wait_for_url("**layer=fc1**", timeout=60_000)
    app.go_to("Neuron scores")
    app.wait_for_chart("Each sample of cluster", timeout_s=300)
    for method in METHODS:
        app.choose("Method", method)
        app.wait_for_chart(f"{method} score per cluster", exact=True, timeout_s=600)
    app.page.wait_for_timeout(1500)
    app.start_click_clock()
    app.page.evaluate(LONG_TASKS)


def one_round(app: App, index: int) -> tuple[float, float, float, float]:
    """(method redraw, its long tasks, cluster redraw, its long tasks), seconds."""
    method = METHODS[index % 2]
    app.choose("Method", method)
    method_s = app.seconds_since_click_to_charts(f"{method} score per cluster",
                                                 f"Highest 15 neurons by {method}")
    method_long = app.page.evaluate(LONG_SECONDS, method_s)
    app.page.wait_for_timeout(700)
    cluster = CLUSTERS[index % 2]
    app.choose("Cluster", cluster)
    cluster_s = app.seconds_since_click_to_charts(f"Each sample of cluster {cluster}")
    cluster_long = app.page.evaluate(LONG_SECONDS, cluster_s)
    app.page.wait_for_timeout(700)
    return method_s, method_long, cluster_s, cluster_long


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", type=Path, default=[ROOT])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--width", type=int, default=3072)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright, \
            ExitStack() as stack:
        model_file, data_file = write_files(Path(folder), args.width)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        apps = []
        for number, checkout in enumerate(args.checkouts):
            server = stack.enter_context(served(checkout, Path(folder) / f"server{number}.log"))
            app, _ = open_tab(browser, server)
            prepare(app, model_file, data_file)
            apps.append(app)
        results = [[] for _ in apps]
        for index in range(args.rounds):
            for app, rows in zip(apps, results):
                rows.append(one_round(app, index))
        table = []
        for checkout, rows in zip(args.checkouts, results):
            method_s, method_long, cluster_s, cluster_long = np.median(rows, axis=0)
            print(f"{checkout}: method change {method_s:.3f} s (browser long tasks "
                  f"{method_long:.3f} s), cluster change {cluster_s:.3f} s ({cluster_long:.3f} s);"
                  f" medians of {args.rounds}, {args.width}-wide layer, 10 clusters")
            table.append(("this checkout" if checkout == ROOT else str(checkout),
                          f"{method_s:.3f} s", f"{method_long:.3f} s", f"{cluster_s:.3f} s",
                          f"{cluster_long:.3f} s"))
        record(f"Scores-page redraw, {args.width}-wide layer, 10 clusters, medians of "
               f"{args.rounds}", ("checkout", "method change", "its long tasks",
                                  "cluster change", "its long tasks"), table)
        browser.close()


if __name__ == "__main__":
    sys.exit(run(main, "bench_wide_scores"))
