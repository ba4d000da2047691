"""A layer too wide to ablate exactly in the oracle's budget: the Diagnosis and Trust pages
measure a random sample of its neurons, say so with the interval, and offer every neuron."""
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
    none of its 192 neurons: the oracle measures FEWEST_ORACLE_NEURONS (32) of them."""
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
    captions = " ".join(caption.value for caption in app.caption)
    assert f"32 of the {WIDTH} neurons, drawn at random" in captions
    table = app.dataframe[0].value
    assert set(table["neurons compared"]) == {f"32 of {WIDTH}"}
    interval = r"-?\d\.\d\d \[-?\d\.\d\d, -?\d\.\d\d\]"  # "0.71 [0.64, 0.77]"
    assert table["Spearman ρ (signed)"].str.fullmatch(interval).all()
    toggle = app.toggle(key="oracle_exact")
    assert toggle.value is False and f"Ablate all {WIDTH} neurons exactly" in toggle.label
    toggle.set_value(True).run()
    assert_clean(app)
    table = app.dataframe[0].value
    assert "neurons compared" not in table  # every neuron: the exact table
    assert f"32 of the {WIDTH} neurons, drawn at random" not in " ".join(
        caption.value for caption in app.caption)


def test_the_trust_page_measures_a_sample_of_the_wide_layer_and_offers_every_neuron(wide_app):
    app = wide_app.switch_page("pages/trust.py").run()
    assert_clean(app)
    toggle = app.toggle(key="scorecard_exact")
    assert toggle.value is False and "32 of the 192 neurons" in toggle.help
    table = app.dataframe[0].value
    measured = dict(zip(table["layer"], table["neurons measured"]))
    assert measured["1"] == f"32 of {WIDTH}" and measured["2"] == "all 5"
    captions = " ".join(caption.value for caption in app.caption).replace("\\", "")
    assert f"1: 32 of {WIDTH} neurons" in captions  # as escaped for markdown, unescaped
