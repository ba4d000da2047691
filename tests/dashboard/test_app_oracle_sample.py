"""A layer too wide to ablate exactly in the oracle's budget: the Diagnosis and Trust pages
measure a random sample of its neurons (and, where even the fewest pass the budget, of the
samples), say so with the interval, and offer every neuron on every sample."""
import re

import numpy as np
import pytest
import torch
from torch import nn

from attribution.analyses import oracle_sample
from tests.support.app import OCTET, assert_clean, run_app, upload

WIDTH = 192


@pytest.fixture
def wide_app(tmp_path, monkeypatch):
    """The dashboard on a 12 -> 192 -> 5 MLP and 300 samples, with an oracle budget that fits
    none of its 192 neurons: the oracle measures FEWEST_ORACLE_NEURONS (32) of them, on
    FEWEST_SAMPLES (8) of each cluster's samples."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 5)).eval()
    x = torch.randn(300, 12)
    labels = model(x).argmax(1)
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "wide.pt2")
    np.savez(tmp_path / "wide.npz", inputs=x.numpy(), labels=labels.numpy())
    monkeypatch.setattr(oracle_sample, "ORACLE_SECONDS", 1e-9)
    app = upload(run_app(), ("wide.pt2", (tmp_path / "wide.pt2").read_bytes(), OCTET),
                 ("wide.npz", (tmp_path / "wide.npz").read_bytes(), OCTET))
    assert_clean(app)
    app.sidebar.selectbox(key="w_layer").set_value("1").run()
    return app


def test_the_diagnosis_page_says_its_sample_and_offers_every_neuron(wide_app):
    app = wide_app.switch_page("pages/diagnosis.py").run()
    assert_clean(app)
    captions = " ".join(caption.value for caption in app.caption).replace("\\", "")
    focus = int(re.search(r"\((\d+) samples\)", captions).group(1))
    assert f"32 of the {WIDTH} neurons on 8 of the {focus} samples, drawn at random" in captions
    table = app.dataframe[0].value
    assert set(table["neurons compared"]) == {f"32 of {WIDTH}"}
    assert set(table["samples compared"]) == {f"8 of {focus}"}
    interval = r"-?\d\.\d\d \[-?\d\.\d\d, -?\d\.\d\d\]"  # "0.71 [0.64, 0.77]"
    assert table["Spearman ρ (signed)"].str.fullmatch(interval).all()
    toggle = app.toggle(key="oracle_exact")
    assert toggle.value is False and f"Ablate all {WIDTH} neurons exactly" in toggle.label
    toggle.set_value(True).run()
    assert_clean(app)
    table = app.dataframe[0].value
    assert "neurons compared" not in table and "samples compared" not in table  # exact
    assert "drawn at random" not in " ".join(caption.value for caption in app.caption)


def test_the_trust_page_measures_a_sample_of_the_wide_layer_and_offers_every_neuron(wide_app):
    app = wide_app.switch_page("pages/trust.py").run()
    assert_clean(app)
    toggle = app.toggle(key="scorecard_exact")
    said = re.search(r"1, 32 of the 192 neurons on (\d+) of the 300 samples, drawn at random",
                     toggle.help.replace("\\", ""))
    assert toggle.value is False and said, toggle.help
    table = app.dataframe[0].value
    measured = dict(zip(table["layer"], table["neurons measured"]))
    assert measured["1"] == f"32 of {WIDTH}" and measured["2"] == "all 5"
    samples = dict(zip(table["layer"], table["samples measured"]))
    # the 5-neuron layer too: under a budget nothing fits, every neuron on a share of samples
    assert samples["1"] == samples["2"] == f"{said.group(1)} of 300"
    captions = " ".join(caption.value for caption in app.caption).replace("\\", "")
    assert f"1: 32 of {WIDTH} neurons" in captions  # as escaped for markdown, unescaped


def test_the_pruning_page_sizes_a_wide_curve_to_its_budget_and_offers_the_full_one(
        wide_app, monkeypatch):
    """A curve budget no curve fits: the page draws 9 values of k on FEWEST_SAMPLES of the
    focus cluster and of the rest, says so, and on request every k on every sample."""
    import streamlit as st

    from attribution.analyses import costs, settings
    from attribution.analyses.pruning_curves import spaced_ks

    monkeypatch.setattr(settings, "PAGE_CURVE_SECONDS", 1e-9)
    st.cache_data.clear()  # no plan kept from a run under another budget
    app = wide_app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    toggle = app.toggle(key="curve_full")
    assert toggle.value is False and toggle.label.startswith("Every k on every sample (")
    captions = " ".join(caption.value for caption in app.caption).replace("\\", "")
    said = re.search(r"sized to its budget: at 9 values of k on (\d+) of the 300 samples, "
                     r"drawn at random: as many as fit in 0 s \(the full curve: ", captions)
    assert said, captions
    finished = app.session_state["curves"]
    (sized,) = finished.values()
    assert sorted(sized["k"].unique()) == spaced_ks(WIDTH, costs.FEWEST_CURVE_POINTS)
    assert sized.attrs["n_samples"] == {"cluster": 8, "rest": 8} and said.group(1) == "16"
    toggle.set_value(True).run()
    assert_clean(app)
    (full,) = [curves for key, curves in finished.items() if key[-2:] == (128, 300)]
    assert full["k"].nunique() == 129 and sum(full.attrs["n_samples"].values()) == 300
    assert "sized to its budget" not in " ".join(caption.value for caption in app.caption)


def test_the_diagnosis_page_says_how_its_evidence_curve_was_sized(wide_app, monkeypatch):
    """A curve budget no curve fits: the checks' evidence curve is measured at 9 values of k
    on FEWEST_SAMPLES of the cluster's samples, and the page and the finding say so."""
    import streamlit as st

    from attribution.analyses import costs

    monkeypatch.setattr(costs, "CURVE_SECONDS", 1e-9)
    st.cache_data.clear()  # no plan kept from a run under another budget
    app = wide_app.switch_page("pages/diagnosis.py").run()
    assert_clean(app)
    captions = " ".join(caption.value for caption in app.caption).replace("\\", "")
    focus = int(re.search(r"\((\d+) samples\)", captions).group(1))
    assert ("The evidence curve of «not better than random» is measured at 9 values of k on "
            f"8 of the {focus} samples, drawn at random: as many as fit in 0 s") in captions
    shown = " ".join(element.value for kind in ("markdown", "success", "info", "warning",
                                                 "error", "caption")
                     for element in getattr(app, kind)).replace("\\", "")
    assert f"at 9 values of k on 8 of the cluster's {focus} samples" in shown


def _chart_place(app) -> int:
    """The place in the main area of the page's one chart."""
    (place,) = [index for index, node in app.main.children.items()
                if getattr(node, "type", None) == "plotly_chart"]
    return place


def test_the_pruning_chart_keeps_its_place_whether_or_not_the_curve_is_sized(
        wide_app, monkeypatch):
    """The sizing toggle is drawn only where the curve was sized to its budget, in a place held
    in every run: a browser keeps a replaced run's elements until the new run ends, so a chart
    one place lower (the plan changed between runs: a curve cost timed again on a busy
    machine) stood beside the last run's stale chart, the page showing two curves."""
    import streamlit as st

    from attribution.analyses import settings

    app = wide_app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    assert not app.toggle  # the curve fits: no toggle
    full_size = _chart_place(app)
    monkeypatch.setattr(settings, "PAGE_CURVE_SECONDS", 1e-9)
    st.cache_data.clear()
    app.run()
    assert_clean(app)
    assert app.toggle(key="curve_full").value is False
    assert _chart_place(app) == full_size
