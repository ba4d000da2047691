"""Three model families the demo is not, uploaded in a real headless Chromium as a researcher
would bring them (a trained 1D-CNN for time series, a tabular model with two named inputs, a
regression head), each page opened until its content is drawn and screenshotted into
test-artifacts/ (families-<name>-<page>.png)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attribution as at
from tests.support import families

pytestmark = pytest.mark.browser


def _cnn1d(folder):
    model, x, y = families.trained_cnn1d()
    at.save_pt2(model, x[:2], folder / "cnn1d.pt2")
    np.savez(folder / "cnn1d.npz", inputs=x[:300].numpy(), labels=y[:300].numpy())


def _tabular(folder):
    model, x = families.family("tabular")
    with torch.no_grad():
        labels = model(**x).argmax(1)
    at.save_pt2(model, {key: value[:2] for key, value in x.items()}, folder / "tabular.pt2")
    np.savez(folder / "tabular.npz", **{key: value.numpy() for key, value in x.items()},
             labels=labels.numpy())


def _regression(folder):
    model, x = families.family("regression")
    at.save_pt2(model, x[:2], folder / "regression.pt2")
    np.savez(folder / "regression.npz", inputs=x.numpy(),
             labels=families.regression_targets(x).numpy())


FILES = {"cnn1d": _cnn1d, "tabular": _tabular, "regression": _regression}


@pytest.mark.parametrize("name", FILES)
def test_an_uploaded_family_shows_every_page(app, name, tmp_path):
    FILES[name](tmp_path)
    app.open_with_files(tmp_path / f"{name}.pt2", tmp_path / f"{name}.npz")
    app.screenshot(f"families-{name}-1-data")
    app.go_to("Neuron scores")
    app.wait_for_chart("score per cluster", timeout_s=120)
    app.screenshot(f"families-{name}-2-scores")
    app.go_to("Pruning curves")
    app.wait_for_text("Complete.", timeout_s=180)
    app.screenshot(f"families-{name}-3-pruning")
    app.go_to("Diagnosis")
    app.wait_for_text("Agreement with exact ablation", timeout_s=180)
    app.wait_for_chart("Do the methods rank neurons alike", timeout_s=180)
    assert app.page.get_by_test_id("stAlertContainer").count() >= 1  # the findings
    app.screenshot(f"families-{name}-4-diagnosis")
