"""Dashboard: seconds from uploading a model and data to their first chart.

In headless Chromium, with the jail against an older checkout without it (`--before`,
default 0755354, the commit before the jail landed).

    python -m benchmarks.bench_upload_chart [--before REV] [--runs 3] [--results FILE]

Each run starts a fresh `streamlit run app.py` per checkout, the two alternating so the noise
of a shared machine hits both alike. In it, one tab opens the Model & data page and, once the
page is idle, uploads the demo's model and data (a first upload on a fresh server: the jail's
server, which the page starts, may still be warming up); timed from the model's upload to the
cluster heatmap ("score per cluster") on the Neuron scores page. A second tab then uploads a
100 MB .npz (48,828 rows of 512 features) and an MLP that takes it, timed the same way.
Medians, with the fastest and slowest run.
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from playwright.sync_api import sync_playwright
from torch import nn

from benchmarks.common import ROOT, record, run
from tests.support.browser import (CHROMIUM, CHROMIUM_ARGS, check_and_close, open_tab,
                                   streamlit_server)

FEATURES = 512


def big_upload(folder: Path, megabytes: float = 100) -> tuple[Path, Path]:
    """(a .pt2 MLP [N, 512] -> 10 classes, a .npz of `megabytes` MB of its inputs and
    labels)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    rows = int(megabytes * 1e6 / (FEATURES * 4))
    inputs = np.random.default_rng(0).random((rows, FEATURES), np.float32)
    program = torch.export.export(model, (torch.from_numpy(inputs[:8]),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, folder / "wide_mlp.pt2")
    np.savez(folder / "big.npz", inputs=inputs, labels=np.arange(rows) % 10)
    return folder / "wide_mlp.pt2", folder / "big.npz"


def upload_to_chart(browser, server, model: Path, data: Path) -> tuple[float, float]:
    """Seconds from uploading `model` (then `data`) in a fresh tab to (the page naming them
    as in use, the cluster heatmap)."""
    app, context = open_tab(browser, server)
    app.open("/data")
    app.page.get_by_text("Sample files").wait_for(timeout=120_000)
    app.page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(
        timeout=120_000)
    started = time.monotonic()
    try:
        app.upload("Model file", model)
        app.upload("Data file", data)
        app.wait_for_upload(f"{model.name} + {data.name}")
        in_use = time.monotonic() - started
        app.go_to("Neuron scores")
        app.wait_for_chart("score per cluster", timeout_s=300)
    except Exception:
        app.screenshot(f"bench-upload-{data.stem}")
        raise
    seconds = time.monotonic() - started
    check_and_close(app, context)
    return in_use, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="0755354")
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        before = folder / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", arguments.before],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        demo = (ROOT / "demo" / "digits_mlp.pt2", ROOT / "demo" / "digits.npz")
        big = big_upload(folder)
        roots = {f"before ({arguments.before}, no jail)": before, "now (the jail)": ROOT}
        times = {(name, case): [] for name in roots for case in ("demo", "100 MB")}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for _ in range(arguments.runs):
                for name, root in roots.items():
                    with streamlit_server("bench-upload-chart.log", "streamlit run",
                                          root=root) as server:
                        for case, files in (("demo", demo), ("100 MB", big)):
                            in_use, seconds = upload_to_chart(browser, server, *files)
                            times[name, case].append(seconds)
                            print(f"{name}, {case}: in use after {in_use:.2f} s, chart after "
                                  f"{seconds:.2f} s", flush=True)
            browser.close()
    rows = [(case, name, f"{statistics.median(seconds):.2f} s",
             f"{min(seconds):.2f} – {max(seconds):.2f} s")
            for (name, case), seconds in sorted(times.items(), key=lambda item: item[0][1])]
    title = (f"Upload to first chart in Chromium: seconds from uploading a model and data to "
             f"the cluster heatmap, {arguments.runs} runs each")
    print(f"\n{title}")
    for row in rows:
        print("  " + " | ".join(row))
    record(title, ("upload", "server", "median", "min – max"), rows)


if __name__ == "__main__":
    sys.exit(run(main, "bench_upload_chart"))
