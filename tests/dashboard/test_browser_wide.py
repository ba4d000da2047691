"""A research-size layer in a real headless Chromium: an MLP with a 16,384-neuron hidden
layer uploaded as a researcher brings it. The Diagnosis page measures exact ablation on a
random sample of its neurons, as many as fit the oracle's budget, and says so before its
checks run; a second visitor's page draws while they run; and they stop on the page's
button. Screenshot in test-artifacts/wide-diagnosis-stopped.png. (The intervals on the
sample, on this page and the Trust page, are the AppTests' of test_app_oracle_sample.py: in
the browser they come after minutes of budgeted work.)"""
from __future__ import annotations

import re
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import attribution as at
from tests.support.browser import (BROWSER_TIMINGS, COLD_START_S, SCRIPT_IDLE, check_and_close,
                                   open_tab, within_budget)

pytestmark = pytest.mark.browser

WIDTH, SAMPLES = 16384, 300


@pytest.fixture
def wide_files(tmp_path):
    """wide.pt2 (64 -> 16,384 -> 10, random weights) and wide.npz (300 digits, the
    model's own predictions as labels, so that "correct vs misclassified" makes one cluster
    of every sample)."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        fc1=nn.Linear(64, WIDTH), relu1=nn.ReLU(), out=nn.Linear(WIDTH, 10))).eval()
    x = torch.tensor(load_digits().data[:SAMPLES], dtype=torch.float32) / 16
    with torch.no_grad():
        labels = model(x).argmax(1)
    at.save_pt2(model, x[:2], tmp_path / "wide.pt2")
    np.savez(tmp_path / "wide.npz", inputs=x.numpy(), labels=labels.numpy())
    return tmp_path


def test_a_wide_layer_is_sampled_said_stoppable_and_blocks_no_other_visitor(
        app, browser, server, wide_files):
    """The Diagnosis page says the sample of neurons exact ablation measures (and offers
    every neuron) before its checks run; while they run, a second visitor's first page draws
    its charts, and the checks then stop on the page's button, those that had run kept."""
    folder = wide_files
    try:
        app.open_with_files(folder / "wide.pt2", folder / "wide.npz")
        app.choose("Layer", "relu1 · ")
        app.page.locator(SCRIPT_IDLE).wait_for(timeout=120_000)
        app.choose("Clusters from", "correct vs misclassified")  # one cluster: all 300

        app.go_to("Diagnosis")
        app.page.get_by_text(re.compile(rf"Exact ablation measures [\d,]+ of the {WIDTH:,} "
                                        r"neurons, drawn at random")).wait_for(timeout=180_000)
        app.wait_for_text(f"Ablate all {WIDTH:,} neurons exactly")
        stop = app.page.get_by_role("button", name="Stop the checks")
        stop.wait_for(timeout=300_000)

        other, context = open_tab(browser, server)  # meanwhile, another visitor
        opened = other.open()
        other.wait_for_chart("score per cluster", timeout_s=300)
        waited = time.monotonic() - opened
        assert stop.count() == 1, "the checks ended before the other page drew: no evidence"
        BROWSER_TIMINGS["a second visitor's first charts while a wide layer's checks run"] = \
            waited
        check_and_close(other, context)
        assert within_budget(waited, 2 * COLD_START_S), waited

        stop.click()
        app.page.get_by_text(re.compile(r"Stopped: the \d+ checks that had run|Stopped before "
                                        r"the first check had run")).wait_for(timeout=120_000)
        app.page.get_by_role("button", name="Run the checks again").wait_for()
        assert app.page.get_by_text("Agreement with exact ablation").count() == 0
        app.screenshot("wide-diagnosis-stopped")
    except Exception:  # what the page showed when it failed
        app.screenshot("wide-failed")
        raise
