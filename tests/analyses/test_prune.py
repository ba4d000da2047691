"""`at.prune`: a pruned copy whose metric on the data is the pruning curve's point at k, on
every kind of layer, through eager models, .pt2 files and a sequence model under a mask;
the original model untouched, and the refusals."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses.prune import PrunedOutput, copy_model
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
