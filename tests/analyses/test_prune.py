"""`at.prune`: a pruned copy whose metric on the data is the pruning curve's point at k, on
every kind of layer, through eager models, .pt2 files and a sequence model under a mask;
the original model untouched, and the refusals."""
import json

import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution import cli
from attribution.analyses.prune import PruneCheck, PrunedOutput, copy_model, prune_check
from tests.support.families import family, trained_cnn1d
from tests.support.models import SequenceNet, build, build_model, exported

CASES = [  # (model, layer): Linear, conv, BatchNorm, parameter-free, residual, attention
    ("residual_mlp", "fc1"), ("residual_mlp", "act"), ("residual_conv", "conv1"),
    ("residual_conv", "bn1"), ("residual_conv", "relu"), ("resnet", "layer1.0.conv2"),
    ("resnet", "layer2.0.downsample.1"), ("vit", "blocks.0.mlp.0"), ("vit", "blocks.1.attn"),
]


def _model(name):
    if name in ("resnet", "vit"):
        return build_model(name, n=24)
    return build(name)


def _measured(model, x, targets, metric):
    return at.model_metric(model, x, targets, metric, batch_size=7)


@pytest.mark.parametrize("name,layer", CASES)
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_a_pruned_copy_measures_what_the_curve_says(name, layer, mode):
    model, x, targets = _model(name)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    scores = at.neuron_scores(model, layer, x, targets, "gradient").abs().mean(0)
    n = scores.shape[0]
    ks = sorted({0, 1, n // 3, n - 1, n})
    curve = at.pruning_curve(model, layer, x, targets, scores, ks=ks, ablation=mode,
                             metric="target_logit", n_random=1)
    for remove, column in (("bottom", "bottom"), ("top", "ranked")):
        for k, expected in zip(curve["k"], curve[column]):
            pruned = at.prune(model, layer, scores, int(k), mode=mode, remove=remove, inputs=x)
            assert _measured(pruned, x, targets, "target_logit") == pytest.approx(
                expected, abs=1e-5), (remove, k)
    for key, value in model.state_dict().items():  # the original is left as it was
        assert torch.equal(value, before[key]), key


def test_weights_of_their_own_are_folded_other_layers_wrapped():
    model, x, targets = build("residual_conv")
    scores = torch.arange(6.0)
    folded = at.prune(model, "conv1", scores, 3, inputs=x)
    assert type(folded.conv1) is nn.Conv2d
    assert folded.conv1.weight[:3].abs().sum() == 0 and folded.conv1.bias[:3].abs().sum() == 0
    assert torch.equal(folded.conv1.weight[3:], model.conv1.weight[3:])
    norm = at.prune(model, "bn1", scores, 2, inputs=x)  # gamma and beta of the two zeroed
    assert type(norm.bn1) is nn.BatchNorm2d and norm.bn1.weight[:2].abs().sum() == 0
    mean_map = at.prune(model, "conv1", scores, 3, mode="mean", inputs=x)  # a map per channel
    assert isinstance(mean_map.conv1, PrunedOutput) and mean_map.conv1.fill.dim() == 3
    free = at.prune(model, "relu", scores, 3, inputs=x)
    assert isinstance(free.relu, PrunedOutput) and free.relu.removed.sum() == 3
    mlp, x_mlp, _ = build("residual_mlp")
    mean = at.prune(mlp, "fc1", torch.arange(16.0), 5, mode="mean", inputs=x_mlp)
    assert type(mean.fc1) is nn.Linear and mean.fc1.weight[:5].abs().sum() == 0
    with torch.no_grad():
        expected = mlp.fc1(x_mlp)[:, :5].mean(0)
    assert torch.allclose(mean.fc1.bias[:5], expected, atol=1e-6)


def test_without_data_a_layer_of_its_own_weights_is_folded_the_same():
    model, x, targets = build("residual_mlp")
    scores = torch.randn(16, generator=torch.Generator().manual_seed(1))
    no_data = at.prune(model, "fc1", scores, 9)
    with_data = at.prune(model, "fc1", scores, 9, inputs=x)
    assert torch.equal(no_data.fc1.weight, with_data.fc1.weight)
    with pytest.raises(at.AttributionError, match="pass inputs="):
        at.prune(model, "act", scores, 9)  # a ReLU: its axis comes from its output
    with pytest.raises(at.AttributionError, match="pass inputs="):
        at.prune(model, "fc1", scores, 9, mode="mean")


def test_a_weight_shared_with_another_module_is_not_changed():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 6)
            self.head = nn.Linear(6, 20, bias=False)
            self.head.weight = self.embed.weight
            self.out = nn.Linear(20, 3)

        def forward(self, ids):
            return self.out(self.head(self.embed(ids).mean(1)))

    model = Tied().eval()
    ids = torch.randint(0, 20, (16, 5))
    targets = at.predict_classes(model, ids)
    pruned = at.prune(model, "embed", torch.arange(6.0), 2, inputs=ids)
    assert isinstance(pruned.embed, PrunedOutput)
    assert torch.equal(pruned.head.weight, model.head.weight)
    curve = at.pruning_curve(model, "embed", ids, targets, torch.arange(6.0), ks=[2],
                             metric="target_logit", n_random=1)
    assert _measured(pruned, ids, targets, "target_logit") == pytest.approx(
        curve["bottom"].iloc[0], abs=1e-5)


def test_a_sequence_layer_takes_a_mean_per_position():
    torch.manual_seed(0)
    model = SequenceNet().eval()
    x = torch.randn(20, 7, 3)
    targets = at.predict_classes(model, x)
    scores = at.neuron_scores(model, "mix", x, targets).abs().mean(0)
    curve = at.pruning_curve(model, "mix", x, targets, scores, ks=[4], ablation="mean",
                             metric="target_logit", n_random=1)
    pruned = at.prune(model, "mix", scores, 4, mode="mean", inputs=x)
    assert isinstance(pruned.mix, PrunedOutput)  # a mean per position: [6, 7]
    assert _measured(pruned, x, targets, "target_logit") == pytest.approx(
        curve["bottom"].iloc[0], abs=1e-5)


def test_a_pt2_is_pruned_saved_and_loaded_back_with_the_same_outputs(tmp_path):
    model, x, targets = build("residual_conv")
    loaded = exported(model, x, tmp_path / "model.pt2")
    scores = at.neuron_scores(loaded, "conv1", x, targets).abs().mean(0)
    for layer, mode in (("conv1", "zero"), ("conv1", "mean"), ("relu", "zero")):
        pruned = at.prune(loaded, layer, scores, 3, mode=mode, inputs=x)
        data = at.save_pt2(pruned, x[:1], tmp_path / "pruned.pt2", class_names="abcd")
        assert (tmp_path / "pruned.pt2").read_bytes() == data
        back = at.load_model(tmp_path / "pruned.pt2")
        assert back.class_names == tuple("abcd")
        with torch.no_grad():
            assert torch.allclose(back.module(x), pruned(x), atol=1e-6)
        curve = at.pruning_curve(loaded, layer, x, targets, scores, ks=[3], ablation=mode,
                                 n_random=1)
        again = at.pruning_curve(back.module, "conv2", x, targets, torch.zeros(6), ks=[0],
                                 n_random=1)
        assert again["bottom"].iloc[0] == pytest.approx(curve["bottom"].iloc[0], abs=1e-9)


def test_copies_are_independent():
    model, x, _ = build("residual_mlp")
    copy = copy_model(model)
    with torch.no_grad():
        copy.fc1.weight.zero_()
    assert model.fc1.weight.abs().sum() > 0


@pytest.mark.parametrize("call,match", [
    (lambda m, x: at.prune(m, "fc1", torch.zeros(16), 17, inputs=x), r"0\.\.16"),
    (lambda m, x: at.prune(m, "fc1", torch.zeros(16), -1, inputs=x), r"0\.\.16"),
    (lambda m, x: at.prune(m, "fc1", torch.zeros(16), 2.5, inputs=x), "integer"),
    (lambda m, x: at.prune(m, "fc1", torch.zeros(15), 2, inputs=x), "15 values"),
    (lambda m, x: at.prune(m, "fc1", torch.zeros(16), 2, mode="half", inputs=x), "mode"),
    (lambda m, x: at.prune(m, "fc1", torch.zeros(16), 2, remove="middle"), "remove"),
    (lambda m, x: at.prune(m, "nope", torch.zeros(16), 2, inputs=x), "Unknown layer"),
    (lambda m, x: at.prune(m, "fc1", np.full(16, np.nan), 2, inputs=x), "NaN"),
])
def test_refusals_say_what_to_change(call, match):
    model, x, _ = build("residual_mlp")
    with pytest.raises(at.AttributionError, match=match):
        call(model, x)


# ---------------------------------------------------------------- the check beside a prune

@pytest.fixture(scope="module")
def trained():
    """A trained 1D-CNN, its series and classes, and its conv2's per-sample gradient x
    activation and exact ablation effects."""
    model, x, y = trained_cnn1d()
    scores = at.neuron_scores(model, "2", x, y, "gradient_x_activation").numpy()
    effects = at.neuron_scores(model, "2", x, y, "ablation").numpy()
    return model, x, y, scores, np.abs(effects).mean(0)


def test_the_check_measures_what_prune_removes(trained):
    model, x, y, scores, oracle = trained
    ranking = np.abs(scores).mean(0)
    for remove in ("bottom", "top"):
        check = prune_check(model, "2", x, y, ranking, 5, oracle=oracle, remove=remove,
                            n_random=7, seed=3)
        pruned = at.prune(model, "2", ranking, 5, remove=remove, inputs=x)
        assert check.after == pytest.approx(at.model_metric(pruned, x, y), abs=1e-12)
        assert check.before == pytest.approx(at.model_metric(model, x, y), abs=1e-12)
        least = at.prune(model, "2", oracle if remove == "bottom" else -oracle, 5,
                         remove="bottom", inputs=x)
        assert check.oracle == pytest.approx(at.model_metric(least, x, y), abs=1e-12)
        curve = at.pruning_curve(model, "2", x, y, ranking, ks=[0, 5], n_random=7, seed=3)
        at_k = curve[curve["k"] == 5].iloc[0]
        assert (check.random_mean, check.random_low, check.random_high) == pytest.approx(
            (at_k["random_mean"], at_k["random_lo"], at_k["random_hi"]), abs=1e-12)
        if remove == "bottom":  # the dashboard's check, read off a finished curve
            from_curve = at.curve_checks(curve, 5)["all"]
            assert from_curve.oracle is None and from_curve.damaged == check.damaged
            for field in ("metric", "k", "n_neurons", "n_random"):
                assert getattr(from_curve, field) == getattr(check, field)
            for field in ("before", "after", "random_mean", "random_low", "random_high"):
                assert getattr(from_curve, field) == pytest.approx(getattr(check, field),
                                                                   abs=1e-12)
    assert prune_check(model, "2", x, y, ranking, 0, n_random=2).after == check.before


def test_the_default_prune_keeps_what_the_oracles_least_important_keep(trained, tmp_path,
                                                                        capsys):
    """The command line's prune without options ranks by mean |gradient x activation|: its
    accuracy is at least that of removing the k neurons exact ablation finds least
    important. The signed mean ranked the two most negative neurons lowest, and removing them
    lost half the accuracy: that prune is flagged, on stderr and in the summary."""
    model, x, y, scores, _ = trained
    (tmp_path / "m.pt2").write_bytes(at.save_pt2(model, x[:2]))
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), labels=y.numpy())
    common = ("prune", "--model", tmp_path / "m.pt2", "--data", tmp_path / "d.npz",
              "--layer", "2", "--k", "2", "--quiet")
    code = cli.main([str(a) for a in (*common, "--out", tmp_path / "p.pt2",
                                      "--summary", tmp_path / "p.json")])
    first = capsys.readouterr()
    out = first.out
    assert code == 0
    summary = json.loads((tmp_path / "p.json").read_text())
    assert summary["reduce"] == "mean_abs" and summary["oracle"] is not None
    assert summary["after"] >= summary["oracle"] - 0.01 and summary["after"] > 0.95
    assert not summary["damaged"] and "Warning" not in out + first.err
    assert "the lowest-ranked by gradient_x_activation (mean |·|)" in out
    assert f"{summary['before']:.4f} -> {summary['after']:.4f}" in out
    code = cli.main([str(a) for a in (*common, "--reduce", "mean", "--oracle", "off",
                                      "--out", tmp_path / "signed.pt2",
                                      "--summary", tmp_path / "signed.json")])
    captured = capsys.readouterr()
    signed = json.loads((tmp_path / "signed.json").read_text())
    assert code == 0 and signed["oracle"] is None
    assert signed["after"] < signed["random_low"] and signed["damaged"]
    assert "more damage than removing 2 random neurons" in captured.err
    lowest = set(np.argsort(scores.mean(0))[:2])
    magnitudes = np.argsort(-np.abs(scores).mean(0))
    assert lowest <= set(magnitudes[:8])  # the signed mean's bottom: important neurons


def test_damage_follows_the_metric_direction():
    common = dict(k=2, n_neurons=8, n_random=5)
    loss = PruneCheck("loss", before=0.1, after=0.9, random_mean=0.3, random_low=0.2,
                      random_high=0.5, **common)
    assert loss.damaged
    assert not PruneCheck("loss", before=0.1, after=0.4, random_mean=0.3, random_low=0.2,
                          random_high=0.5, **common).damaged
    accuracy = PruneCheck("accuracy", before=0.9, after=0.6, random_mean=0.7, random_low=0.6,
                          random_high=0.8, oracle=0.85, **common)
    assert not accuracy.damaged  # at the band's end is inside it
    assert accuracy.warning is None
    assert "more damage" in PruneCheck("accuracy", before=0.9, after=0.5, random_mean=0.7,
                                       random_low=0.6, random_high=0.8, **common).warning


@pytest.mark.parametrize("name", ["tabular", "graph", "bfloat16_cnn"])
def test_a_pruned_model_of_named_inputs_or_bfloat16_is_taken_away_and_loads(name, tmp_path):
    """Named inputs (an eager model and its loaded .pt2, whose forward takes **kwargs) and a
    bfloat16 model given float32 data are exported with a dynamic batch and load back."""
    model, x = family(name)
    first = {key: value[:3] for key, value in x.items()} if isinstance(x, dict) else x[:3]
    (tmp_path / "m.pt2").write_bytes(at.save_pt2(model, first))
    loaded = at.load_model(tmp_path / "m.pt2").module
    layer = "act" if isinstance(x, dict) else "2"
    as_float = first if isinstance(x, dict) else first.float()  # the data as a file holds it
    for source in (model, loaded):
        pruned = at.prune(source, layer, torch.arange(16.0), 3, inputs=x)
        (tmp_path / "p.pt2").write_bytes(at.save_pt2(pruned, as_float))
        back = at.load_model(tmp_path / "p.pt2").module
        more = {key: value[:7] for key, value in x.items()} if isinstance(x, dict) else x[:7]
        with torch.no_grad():
            expected = pruned(**more) if isinstance(more, dict) else pruned(more)
            got = back(**more) if isinstance(more, dict) else back(more)
        assert got.shape == (7, 3) and torch.allclose(got.float(), expected.float(), atol=1e-2)
