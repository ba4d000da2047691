"""One neuron up close: removal, examples and maps checked against hand-set models whose
answers are known, and against the pruning engine's zero ablation."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats
import torch
from torch import nn

import attribution as at
from attribution.analyses.neuron import INPUT_KINDS, input_kind, neuron_from_point, neuron_view


class Doubler(nn.Module):
    """x [N, 3] -> hidden = relu(x) (neuron j is feature j) -> logits = hidden @ W.

    Removing neuron j removes x_j's contribution W[j] to the logits."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.ReLU()
        self.head = nn.Linear(3, 2, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0]]))

    def forward(self, x):
        return self.head(self.hidden(x))


def doubler_data():
    x = torch.tensor([[1.0, 0.5, 0.0], [3.0, 1.0, 2.0], [0.2, 2.0, 1.0], [0.0, 4.0, 0.5],
                      [2.5, 0.2, 0.1], [0.1, 0.3, 5.0]])
    return x, torch.tensor([0, 0, 1, 1, 0, 1])


def view_of(neuron, in_cluster=None, model=None, x=None, targets=None, **kwargs):
    model = model or Doubler().eval()
    if x is None:
        x, targets = doubler_data()
    scores = at.neuron_scores(model, "hidden", x, targets, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "hidden", x, targets, "activation").numpy()
    in_cluster = np.asarray(targets) == 0 if in_cluster is None else in_cluster
    return neuron_view(model, "hidden", x, targets, scores, activations, in_cluster, neuron,
                       labels=targets, **kwargs)


def test_removing_a_neuron_alone_changes_the_logits_by_its_weight():
    x, y = doubler_data()
    view = view_of(0)
    removal = view.removal.set_index(["metric", "subset"])
    cluster = y.numpy() == 0
    logits = Doubler().eval()(x).detach()
    without = logits - x[:, :1].clamp(min=0) * torch.tensor([[2.0, 0.0]])
    for subset, rows in (("cluster", cluster), ("rest", ~cluster)):
        rows = torch.from_numpy(rows)
        expected = without[rows].gather(1, y[rows, None]).mean().item()
        assert removal.loc[("target_logit", subset), "removed"] == pytest.approx(expected)
        accuracy = (without[rows].argmax(1) == y[rows]).double().mean().item()
        assert removal.loc[("accuracy", subset), "removed"] == pytest.approx(accuracy)
    assert removal.loc[("target_logit", "cluster"), "change"] == pytest.approx(
        -2 * x[torch.from_numpy(cluster), 0].mean().item())
    drops = -2 * x[torch.from_numpy(cluster), 0].clamp(min=0).double().numpy()
    low, high = removal.loc[("target_logit", "cluster"), ["change_low", "change_high"]]
    half = stats.t.ppf(0.975, len(drops) - 1) * drops.std(ddof=1) / np.sqrt(len(drops))
    assert (low, high) == pytest.approx((drops.mean() - half, drops.mean() + half))


def test_removal_agrees_with_the_pruning_engine_at_k_1():
    loaded, data = at.load_demo("digits_mlp")
    model, x, y = loaded.module, data.inputs, data.labels
    focus = y.numpy() == 3
    scores = at.neuron_scores(model, "relu1", x, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "relu1", x, y, "activation").numpy()
    view = neuron_view(model, "relu1", x, y, scores, activations, focus, 11)
    only = np.eye(scores.shape[1])[11]
    for metric in ("accuracy", "target_logit"):
        curve = at.cluster_pruning_curves(model, "relu1", x, y, focus, True, only, ks=[0, 1],
                                          n_random=1, metric=metric)
        for subset, part in curve.groupby("subset"):
            row = view.removal.set_index(["metric", "subset"]).loc[(metric, subset)]
            assert row["intact"] == pytest.approx(part["ranked"].iloc[0], rel=1e-6)
            assert row["removed"] == pytest.approx(part["ranked"].iloc[1], rel=1e-6)


CALLER_MODES = {
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


@pytest.mark.parametrize("mode", list(CALLER_MODES))
def test_removal_equals_the_pruning_curve_under_the_callers_modes(mode):
    """Was: the removal ran under torch.no_grad() alone, so a caller's CPU bfloat16 autocast
    rounded its logits (the target logit 0.02 off the curve's on the digits MLP) while the
    curve ran in float32. Both now go through one LayerPass, under the engine's modes."""
    loaded, data = at.load_demo("digits_mlp")
    model, x, y = loaded.module, data.inputs, data.labels
    focus = y.numpy() == 3
    scores = at.neuron_scores(model, "relu1", x, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "relu1", x, y, "activation").numpy()
    only = np.eye(scores.shape[1])[11]
    plain = neuron_view(model, "relu1", x, y, scores, activations, focus, 11).removal
    with CALLER_MODES[mode]():
        removal = neuron_view(model, "relu1", x, y, scores, activations, focus, 11).removal
        curves = {metric: at.cluster_pruning_curves(model, "relu1", x, y, focus, True, only,
                                                    ks=[0, 1], n_random=1, metric=metric)
                  for metric in ("accuracy", "target_logit")}
    pd.testing.assert_frame_equal(removal, plain, check_exact=True)
    removal = removal.set_index(["metric", "subset"])
    for metric, curve in curves.items():
        for subset, part in curve.groupby("subset"):
            row = removal.loc[(metric, subset)]
            assert row["intact"] == pytest.approx(part["ranked"].iloc[0], rel=1e-12, abs=1e-12)
            assert row["removed"] == pytest.approx(part["ranked"].iloc[1], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", list(CALLER_MODES))
def test_the_examples_maps_ignore_the_callers_modes(mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, kernel_size=3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(2 * 16, 2)).eval()
    x, y = torch.rand(10, 1, 4, 4), torch.arange(10) % 2
    scores = at.neuron_scores(model, "1", x, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "1", x, y, "activation").numpy()
    arguments = (model, "1", x, y, scores, activations, np.arange(10) < 5, 1)
    plain = neuron_view(*arguments, n_examples=3)
    with CALLER_MODES[mode]():
        view = neuron_view(*arguments, n_examples=3)
    for ours, expected in zip(view.examples["positions"], plain.examples["positions"]):
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, expected)
    pd.testing.assert_frame_equal(view.removal, plain.removal, check_exact=True)


def test_the_examples_are_the_most_and_least_activating_samples():
    x, y = doubler_data()
    view = view_of(1, n_examples=2)
    most = view.examples[view.examples["side"] == "most"]
    least = view.examples[view.examples["side"] == "least"]
    assert most["sample"].tolist() == [3, 2]  # x[:, 1] = 4.0, 2.0
    assert least["sample"].tolist() == [4, 5]  # 0.2, 0.3
    assert most["activation"].tolist() == [4.0, 2.0]
    np.testing.assert_array_equal(most["input"].iloc[0], x[3].numpy())
    assert most["label"].tolist() == [1, 1] and most["in_cluster"].tolist() == [False, False]
    assert view.examples["positions"].isna().all()  # a layer without positions
    assert view.input_kind == "table"
    assert view.samples["activation"].tolist() == x[:, 1].tolist()


def test_a_conv_channel_brings_its_map_over_each_example():
    conv = nn.Conv2d(1, 2, kernel_size=1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(2 * 16, 2)).eval()
    x = torch.rand(10, 1, 4, 4)
    y = torch.arange(10) % 2
    scores = at.neuron_scores(model, "0", x, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "0", x, y, "activation").numpy()
    view = neuron_view(model, "0", x, y, scores, activations, np.ones(10, dtype=bool), 1,
                       n_examples=3)
    assert view.input_kind == "image"
    assert list(view.removal["subset"].unique()) == ["cluster"]  # no rest: every sample
    for _, example in view.examples.iterrows():
        np.testing.assert_allclose(example["positions"], -x[example["sample"], 0].numpy(),
                                   rtol=1e-6)
    means = -x.mean(dim=(1, 2, 3))
    assert view.examples["sample"].iloc[0] == int(means.argmax())


@pytest.mark.parametrize("point, neuron", [
    ({"x": 0.53, "y": "neuron 7", "point_index": 2}, 7),  # a horizontal bar
    ({"x": 5, "y": "3 (three)", "z": 0.1}, 5),  # a cluster heatmap cell
    ({"x": "12", "y": "401", "z": -0.2}, 12),  # a sample heatmap cell
    ({"x": 1.0, "y": "a cluster"}, None),  # nothing names a neuron
    ({"x": True, "y": None}, None),
])
def test_a_clicked_point_names_its_neuron(point, neuron):
    assert neuron_from_point(point) == neuron


def test_input_kinds_follow_the_input_shape():
    assert input_kind(torch.zeros(2, 3, 8, 8)) == "image"
    assert input_kind(torch.zeros(2, 64)) == "table"
    assert input_kind(torch.zeros(2, 12, dtype=torch.long)) == "tokens"
    assert input_kind(torch.zeros(2, 5, 7)) == "other"
    assert set(INPUT_KINDS) == {"image", "tokens", "table", "other"}


def test_a_neuron_outside_the_layer_or_mismatched_arrays_are_user_errors():
    with pytest.raises(at.AttributionError, match=r"0\.\.2"):
        view_of(3)
    x, y = doubler_data()
    with pytest.raises(at.AttributionError, match="same samples"):
        neuron_view(Doubler(), "hidden", x, y, np.zeros((6, 3)), np.zeros((5, 3)),
                    np.ones(6, dtype=bool), 0)


class TokenModel(nn.Module):
    """ids [N, T] -> embed [N, T, 4] -> proj (Linear, 3 features per token) -> mean over T
    -> head (2 logits). Feature j of proj at token t is the neuron's output there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, ids):
        return self.head(self.proj(self.embed(ids)).mean(1))


def test_a_token_models_examples_carry_the_neurons_output_at_each_token():
    model = TokenModel().eval()
    ids = torch.randint(0, 10, (12, 5), generator=torch.Generator().manual_seed(1))
    y = torch.arange(12) % 2
    scores = at.neuron_scores(model, "proj", ids, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "proj", ids, y, "activation").numpy()
    view = neuron_view(model, "proj", ids, y, scores, activations, y.numpy() == 0, 2,
                       n_examples=3, method="gradient_x_activation")
    assert view.input_kind == "tokens"
    for _, example in view.examples.iterrows():  # per-token scores that add up to the score
        sample = example["sample"]
        assert example["tokens"] == [str(i) for i in ids[sample].tolist()]
        assert example["token_scores"].sum() == pytest.approx(scores[sample, 2], rel=1e-4)
    assert neuron_view(model, "proj", ids, y, scores, activations, y.numpy() == 0, 2,
                       method="ablation").examples["token_scores"].isna().all()  # none per token
    per_token = model.proj(model.embed(ids))[..., 2].detach().numpy()  # [N, T]
    for _, example in view.examples.iterrows():
        assert example["input"].tolist() == ids[example["sample"]].tolist()
        np.testing.assert_allclose(example["positions"], per_token[example["sample"]],
                                   rtol=1e-5, atol=1e-6)
    assert view.examples["sample"].iloc[0] == int(per_token.mean(1).argmax())


def test_token_text_replaces_the_ids_when_the_data_has_it():
    model = TokenModel().eval()
    ids = torch.randint(0, 10, (8, 4), generator=torch.Generator().manual_seed(2))
    y = torch.arange(8) % 2
    words = np.array([[f"w{int(i)}" for i in row] for row in ids])
    scores = at.neuron_scores(model, "proj", ids, y, "gradient").numpy()
    activations = at.neuron_scores(model, "proj", ids, y, "activation").numpy()
    view = neuron_view(model, "proj", ids, y, scores, activations, y.numpy() == 1, 0,
                       n_examples=2, method="gradient", tokens=words)
    for _, example in view.examples.iterrows():
        assert example["tokens"] == words[example["sample"]].tolist()
