"""Every result says which axis of the layer's output its neurons are (`split.layer_attrs`)."""
import json

import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution import cli
from attribution.analyses import distributed
from attribution.analyses.settings import AnalysisSettings
from attribution.presentation.report import assemble
from attribution.methods.scores import scored_layer
from tests.support.models import SequenceNet

N, T = 24, 5  # SequenceNet's per-position layers: [N, T=5, 6 features]


@pytest.fixture(scope="module")
def sequence():
    torch.manual_seed(0)
    return SequenceNet().eval(), torch.randn(N, T, 3), torch.arange(N) % 3


def results(model, layer, x, y):
    """Every entry point's frame for `layer` on one model."""
    clusters = np.where(np.arange(N) < 10, "a", "b")
    scores = at.cluster_scores(model, layer, x, y, clusters, "gradient")
    ranking = scores.loc[["a"]]
    return {
        "cluster_scores": scores,
        "pruning_curve": at.pruning_curve(model, layer, x, y, ranking, n_random=2, ks=[0, 1]),
        "cluster_pruning_curves": at.cluster_pruning_curves(
            model, layer, x, y, clusters, "a", ranking, n_random=2, ks=[0, 1]),
        "oracle_agreement": at.oracle_agreement(model, layer, x, y, methods=["gradient"],
                                                clusters=clusters),
        "distributed.cluster_scores": distributed.cluster_scores(model, layer, x, y, clusters,
                                                                 "gradient"),
        "distributed.cluster_pruning_curves": distributed.cluster_pruning_curves(
            model, layer, x, y, clusters, "a", ranking, n_random=2, ks=[0, 1]),
    }


@pytest.mark.parametrize("layer, expected", [
    ("proj", {"layer": "proj", "neuron_axis": 2}),
    ("proj:1", {"layer": "proj", "neuron_axis": 1, "axis_rule": "chosen"}),
    ("head", {"layer": "head", "neuron_axis": 1, "axis_rule": "only axis"}),
])
def test_every_result_records_the_neuron_axis_it_used(sequence, layer, expected):
    model, x, y = sequence
    found = {name: {key: frame.attrs.get(key) for key in ("layer", "neuron_axis", "axis_rule")}
             for name, frame in results(model, layer, x, y).items()}
    if "axis_rule" not in expected:  # found from the data: as list_layers says
        info = next(i for i in at.list_layers(model, x[:2]) if i.name == "proj")
        expected = {**expected, "axis_rule": info.axis_rule}
        assert info.neuron_axis == 2 and info.axis_rule != "chosen"
    assert found == {name: expected for name in found}
    assert scored_layer(model, layer, x) == expected


def test_the_report_and_the_cli_json_say_the_axis(sequence, tmp_path, capsys):
    model, x, y = sequence
    # compare=(): only the gradient was scored (the default compare adds gradient and ablation)
    settings = AnalysisSettings(layer="proj:1", method="gradient", compare=(),
                                cluster_source="label")
    per_sample = {"gradient": at.neuron_scores(model, "proj:1", x, y, "gradient").numpy()}
    clusters = y.numpy()
    content = assemble(settings.with_cluster_of(clusters), title="t", facts={},
                       layers=at.list_layers(model, x[:2]), per_sample=per_sample,
                       clusters=clusters)
    assert content.settings["neurons"] == "5 neurons along dim 1, chosen by hand"
    assert content.settings["layer"] == "proj:1"

    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "s.pt2")
    np.savez(tmp_path / "s.npz", inputs=x.numpy(), labels=y.numpy())
    common = ["--model", tmp_path / "s.pt2", "--data", tmp_path / "s.npz", "--layer", "proj",
              "--quiet"]
    cli.main([str(a) for a in ["diagnose", *common, "--neuron-axis", "1",
                               "--out", tmp_path / "d.json"]])
    cli.main([str(a) for a in ["curve", *common, "--ks", "0,1", "--n-random", "2",
                               "--out", tmp_path / "c.csv", "--summary", tmp_path / "c.json"]])
    capsys.readouterr()
    diagnosed = json.loads((tmp_path / "d.json").read_text())
    assert {k: diagnosed[k] for k in ("layer", "neuron_axis", "axis_rule")} == {
        "layer": "proj", "neuron_axis": 1, "axis_rule": "chosen"}
    summary = json.loads((tmp_path / "c.json").read_text())
    assert (summary["layer"], summary["neuron_axis"], summary["n_neurons"]) == ("proj", 2, 6)
    assert summary["axis_rule"] not in ("chosen", "channels first")


def test_the_words_for_an_axis_found_by_resizing_name_length_or_height_and_width(sequence):
    """A sequence layer's other axis follows the input's length; an image layer's follow its
    height and width (the words said "length" for images too)."""
    model, x, _ = sequence
    info = next(i for i in at.list_layers(model, x[:2]) if i.name == "proj")
    assert info.axis_rule == "lengths"
    assert info.axis_words() == ("6 features along dim 2, the other axis follows the input's "
                                 "length (found by resizing it)")
    image_model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                nn.Flatten(), nn.Linear(5, 2))
    conv = at.list_layers(image_model, torch.randn(2, 3, 8, 8))[0]
    assert conv.axis_rule == "lengths"
    assert conv.axis_words() == ("5 channels along dim 1, the other axes follow the input's "
                                 "height and width (found by resizing it)")


def test_a_layer_with_its_axis_chosen_by_hand(sequence):
    model, x, _ = sequence
    info = next(i for i in at.list_layers(model, x[:2]) if i.name == "proj")
    assert (info.shape, info.neuron_axis, info.spec, info.describe()) == (
        (T, 6), 2, "proj", f"{T} positions × 6 features")
    assert info.with_axis(2) is info
    chosen = info.with_axis(1)
    assert (chosen.n_neurons, chosen.spec, chosen.describe(), chosen.axis_words()) == (
        T, "proj:1", f"6 positions × {T} neurons", f"{T} neurons along dim 1, chosen by hand")
    settings = AnalysisSettings(layer="proj:1")
    assert settings.layer_info(at.list_layers(model, x[:2])) == chosen
    for axis in (0, 3, -1):
        with pytest.raises(at.AttributionError, match="choose 1..2"):
            info.with_axis(axis)
    with pytest.raises(at.AttributionError, match="Unknown layer 'nope'"):
        AnalysisSettings(layer="nope:1").layer_info(at.list_layers(model, x[:2]))
