"""Pruning curves: against one hooked forward per (order, k), and the promises users rely on."""
import numpy as np
import pandas as pd
import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.nn import functional
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

import attribution as at
from attribution.analyses import pruning_curves
from attribution.analyses.pruning_curves import CURVE_COLUMNS, refinement_rounds, spaced_ks

from tests.support import references
from tests.support.models import build

CASES = [("residual_mlp", "fc2"), ("residual_mlp", "bn"), ("residual_conv", "conv1"),
         ("branching", "left.0"), ("untraceable", "fc1")]


def hooked_curve(model, module, x, targets, order, ks, fill, metric):
    """The obvious reference: one full forward per k with the first k of `order` replaced."""
    values = []
    with torch.no_grad():
        for k in ks:
            removed = torch.as_tensor(np.asarray(order[:k]), dtype=torch.long)

            def replace(out, removed=removed):
                out = out.clone()
                out[:, removed] = 0 if fill is None else fill[removed]
                return out

            with references.replaced_output(module, replace):
                logits = model(x)
            if metric == "accuracy":
                values.append((logits.argmax(1) == targets).double().mean().item())
            elif metric == "target_logit":
                values.append(logits.gather(1, targets[:, None]).double().mean().item())
            else:
                values.append(functional.cross_entropy(logits.double(), targets).item())
    return np.array(values)


def scores_for(model, layer, x, y):
    return at.neuron_scores(model, layer, x, y, "gradient_x_activation").mean(0).numpy()


@pytest.mark.parametrize("arch,layer", CASES)
@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("metric", ["accuracy", "target_logit", "loss"])
def test_matches_one_hooked_forward_per_order_and_k(arch, layer, ablation, metric):
    model, x, y = build(arch)
    module = dict(model.named_modules())[layer]
    scores = scores_for(model, layer, x, y)
    curve = at.pruning_curve(model, layer, x, y, scores, n_random=3, seed=5, ablation=ablation,
                             metric=metric, batch_size=16)
    ks = curve["k"].tolist()
    fill = references.layer_output(model, module, x).mean(0) if ablation == "mean" else None
    expected = {
        "ranked": hooked_curve(model, module, x, y, np.argsort(-scores, kind="stable"), ks, fill,
                               metric),
        "bottom": hooked_curve(model, module, x, y, np.argsort(scores, kind="stable"), ks, fill,
                               metric),
    }
    for column, values in expected.items():
        np.testing.assert_allclose(curve[column], values, rtol=1e-5, atol=1e-5)
    draws = [hooked_curve(model, module, x, y, order, ks, fill, metric)
             for order in curve.attrs["random_orders"]]
    np.testing.assert_allclose(curve.attrs["random_curves"], draws, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(curve["random_mean"], np.mean(draws, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(curve["random_lo"], np.percentile(draws, 5, axis=0), atol=1e-5)
    np.testing.assert_allclose(curve["random_hi"], np.percentile(draws, 95, axis=0), atol=1e-5)


def test_columns_every_k_and_shared_end_points():
    model, x, y = build("residual_mlp")
    curve = at.pruning_curve(model, "fc2", x, y, scores_for(model, "fc2", x, y),
                             metric="target_logit")
    assert list(curve.columns) == list(CURVE_COLUMNS)
    assert curve["k"].tolist() == list(range(17))
    unpruned = model(x).gather(1, y[:, None]).mean().item()
    for row in (curve.iloc[0], curve.iloc[-1]):  # nothing removed / everything removed
        assert row["ranked"] == row["bottom"] == row["random_lo"] == row["random_hi"]
        assert row["random_mean"] == pytest.approx(row["ranked"], rel=1e-12)
    assert curve.iloc[0]["ranked"] == pytest.approx(unpruned, rel=1e-5)
    assert (curve["random_lo"] <= curve["random_mean"] + 1e-12).all()
    assert (curve["random_mean"] <= curve["random_hi"] + 1e-12).all()
    assert curve.attrs["n_samples"] == 40 and curve.attrs["n_neurons"] == 16


def test_curve_frames_concatenate_and_merge():
    model, x, y = build("residual_mlp")
    scores = scores_for(model, "fc2", x, y)
    first = at.pruning_curve(model, "fc2", x, y, scores, ks=[0, 8, 16])
    second = at.pruning_curve(model, "fc2", x, y, -scores, ks=[0, 8, 16])
    assert len(pd.concat([first.assign(method="a"), second.assign(method="b")])) == 6
    assert len(first.merge(second, on="k")) == 3


def test_ks_may_be_whole_floats_and_come_back_sorted_without_repeats():
    model, x, y = build("residual_mlp")
    curve = at.pruning_curve(model, "fc2", x, y, np.arange(16.0),
                             ks=np.linspace(0, 16, 9).round()[::-1].tolist() + [4.0])
    assert curve["k"].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 16]


def test_accuracy_against_the_predicted_class_starts_at_one():
    model, x, y = build("branching")
    curve = at.pruning_curve(model, "right.0", x, None, np.arange(7.0), ks=[0, 3, 7])
    assert curve["ranked"].iloc[0] == 1.0


def test_same_seed_same_curve_and_the_seed_moves_only_the_band():
    model, x, y = build("residual_mlp")
    scores = scores_for(model, "fc2", x, y)
    first = at.pruning_curve(model, "fc2", x, y, scores, seed=3, metric="loss")
    again = at.pruning_curve(model, "fc2", x, y, scores, seed=3, metric="loss")
    other = at.pruning_curve(model, "fc2", x, y, scores, seed=4, metric="loss")
    pd.testing.assert_frame_equal(first, again)
    pd.testing.assert_series_equal(first["ranked"], other["ranked"])
    assert not np.allclose(first["random_mean"], other["random_mean"])


def test_results_do_not_depend_on_batching_or_input_kind():
    model, x, y = build("residual_conv")
    scores = scores_for(model, "conv1", x, y)
    options = dict(n_random=4, ablation="mean", metric="target_logit")
    reference = at.pruning_curve(model, "conv1", x, y, scores, batch_size=256, **options)
    small = at.pruning_curve(model, "conv1", x, y, scores, batch_size=5, **options)
    array = at.pruning_curve(model, "conv1", x.numpy(), y, scores, **options)
    loader = DataLoader(TensorDataset(x, y), batch_size=7)
    labelled = at.pruning_curve(model, "conv1", loader, "labels", scores, **options)
    for frame in (small, array, labelled):
        pd.testing.assert_frame_equal(frame, reference, rtol=1e-5, atol=1e-6)


def test_inputs_too_big_to_keep_are_read_again_each_round(monkeypatch):
    model, x, y = build("residual_mlp")
    scores = scores_for(model, "fc2", x, y)
    kept = at.pruning_curve(model, "fc2", x, y, scores, ablation="mean", batch_size=8)
    monkeypatch.setattr(pruning_curves, "_CACHE_BYTES", 0)
    updates = []
    reread = at.pruning_curve(model, "fc2", x, y, scores, ablation="mean", batch_size=8,
                              progress=lambda fraction, part: updates.append(len(part)))
    pd.testing.assert_frame_equal(reread, kept)
    assert updates == [5, 17]  # a coarse round, then the rest: each round reads the inputs
    one_shot = (x[i:i + 8] for i in range(0, 40, 8))
    with pytest.raises(at.AttributionError, match="one-shot iterator"):
        at.pruning_curve(model, "fc2", one_shot, y, scores)


def test_a_one_shot_iterator_of_batches_works_when_it_fits_in_memory():
    model, x, y = build("residual_mlp")
    scores = scores_for(model, "fc2", x, y)
    batches = (x[i:i + 8] for i in range(0, 40, 8))
    pd.testing.assert_frame_equal(at.pruning_curve(model, "fc2", batches, y, scores),
                                  at.pruning_curve(model, "fc2", x, y, scores))


def test_a_row_of_cluster_scores_is_accepted_and_its_size_column_ignored():
    model, x, y = build("residual_mlp")
    table = at.cluster_scores(model, "fc2", x, y, y.numpy(), "gradient_x_activation")
    from_row = at.pruning_curve(model, "fc2", x, y, table.loc[1], ks=[0, 4, 8])
    from_array = at.pruning_curve(model, "fc2", x, y, table.loc[1].drop("n").to_numpy(),
                                  ks=[0, 4, 8])
    pd.testing.assert_frame_equal(from_row, from_array)


def test_masks_run_only_the_tail_once_per_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(),
                          nn.Linear(8, 3)).eval()
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    at.pruning_curve(model, "2", x, y, np.arange(8.0), ks=[0, 1])  # build the runner
    front_calls = []
    handle = model[0].register_forward_hook(lambda *args: front_calls.append(1))
    try:
        at.pruning_curve(model, "2", x, y, np.arange(8.0), n_random=20, batch_size=10)
    finally:
        handle.remove()
    assert len(front_calls) == 3  # one capture per batch for 22 orders x 9 k



class _Float64Sizes(TorchDispatchMode):
    """Records the element count of every float64 tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                self.sizes.append(value.numel())
        return out


def test_zero_ablation_makes_no_float64_copy_of_the_layer_output():
    # the mean of z is for "mean" ablation only; for "zero" it cost a float64 copy of every
    # batch's z (1.2 GB transient for 256 GPT-2 sequences at a 3072-wide MLP)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 3)).eval()
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    at.pruning_curve(model, "1", x, y, np.arange(64.0), ks=[0, 1])  # build the runner
    for ablation, copies_z in (("zero", False), ("mean", True)):
        with _Float64Sizes() as recorded:
            at.pruning_curve(model, "1", x, y, np.arange(64.0), ks=[0, 32, 64], n_random=2,
                             ablation=ablation, batch_size=40)
        assert (max(recorded.sizes) >= x.shape[0] * 64) == copies_z, ablation


@pytest.mark.parametrize("kind", ["tensor", "loader with labels"])
@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_a_wide_layer_is_captured_in_row_chunks_on_a_cpu(monkeypatch, kind, ablation):
    # one capture of 256 GPT-2 sequences (128 tokens x 3072 at h.0.mlp.act) made blocks that
    # every masked pass page-faulted in afresh: 24% of the curve's CPU time
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(),
                          nn.Linear(8, 3)).eval()
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    inputs = x if kind == "tensor" else DataLoader(TensorDataset(x, y), batch_size=30)
    targets = y if kind == "tensor" else "labels"

    def curve():
        return at.pruning_curve(model, "2", inputs, targets, np.arange(8.0), n_random=4,
                                ablation=ablation, metric="target_logit", batch_size=30)

    whole = curve()
    monkeypatch.setattr(pruning_curves, "_CPU_ELEMENTS_PER_CAPTURE", 7 * 8)  # 7 rows of 8 neurons
    rows = []
    handle = model[0].register_forward_hook(lambda module, args, out: rows.append(len(out)))
    try:
        chunked = curve()
    finally:
        handle.remove()
    assert rows == [6, 6, 6, 6, 6]  # at most 7, in equal chunks
    pd.testing.assert_frame_equal(chunked, whole, rtol=1e-6, atol=1e-6)

def test_progress_is_coarse_first_and_streams_final_values():
    model, x, y = build("residual_mlp")
    scores = scores_for(model, "fc2", x, y)
    updates = []
    curve = at.pruning_curve(model, "fc2", x, y, scores, metric="target_logit",
                             progress=lambda fraction, part: updates.append((fraction, part)))
    fractions = [fraction for fraction, _ in updates]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(updates) >= 3
    first = updates[0][1]
    assert first["k"].min() == 0 and first["k"].max() == 16 and len(first) <= 5
    for _, part in updates:
        assert list(part.columns) == list(CURVE_COLUMNS)
        final = curve.set_index("k").loc[part["k"]]
        np.testing.assert_allclose(part["ranked"], final["ranked"])
        np.testing.assert_allclose(part["random_hi"], final["random_hi"])
    pd.testing.assert_frame_equal(updates[-1][1], curve)


@pytest.mark.parametrize("arch,layer", [("residual_mlp", "fc2"), ("untraceable", "fc1")])
def test_a_raising_progress_propagates_and_leaves_the_model_untouched(arch, layer):
    model, x, y = build(arch)
    model.train()
    before = {name: value.clone() for name, value in model.state_dict().items()}

    class Stop(Exception):
        pass

    def stop(fraction, part):
        raise Stop

    with pytest.raises(Stop):
        at.pruning_curve(model, layer, x, y, np.arange(8.0 if arch == "untraceable" else 16.0),
                         ablation="mean", progress=stop)
    assert all(module.training for module in model.modules())
    assert all(not module._forward_hooks for module in model.modules())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_cluster_and_rest_equal_separate_curves_on_each_subset():
    model, x, y = build("residual_mlp")
    clusters = np.array(["a", "b", "c", "d"] * 10)
    scores = scores_for(model, "fc2", x, y)
    tidy = at.cluster_pruning_curves(model, "fc2", x, y, clusters, "b", scores, n_random=5,
                                     metric="target_logit")
    assert list(tidy.columns) == ["subset", *CURVE_COLUMNS]
    assert tidy["subset"].unique().tolist() == ["cluster", "rest"]
    assert tidy.attrs["n_samples"] == {"cluster": 10, "rest": 30}
    for subset, rows in {"cluster": clusters == "b", "rest": clusters != "b"}.items():
        alone = at.pruning_curve(model, "fc2", x[rows], y[rows], scores, n_random=5,
                                 metric="target_logit")
        part = tidy[tidy["subset"] == subset].drop(columns="subset").reset_index(drop=True)
        pd.testing.assert_frame_equal(part, alone, rtol=1e-6, atol=1e-6)


def test_cluster_mean_ablation_uses_the_mean_over_all_inputs():
    model, x, y = build("residual_mlp")
    clusters = np.arange(40) % 3
    module = model.fc2
    scores = scores_for(model, "fc2", x, y)
    tidy = at.cluster_pruning_curves(model, "fc2", x, y, clusters, 0, scores, ablation="mean",
                                     metric="loss", ks=[0, 5, 11])
    fill = references.layer_output(model, module, x).mean(0)
    rows = clusters == 0
    expected = hooked_curve(model, module, x[rows], y[rows], np.argsort(-scores, kind="stable"),
                            [0, 5, 11], fill, "loss")
    np.testing.assert_allclose(tidy[tidy["subset"] == "cluster"]["ranked"], expected, rtol=1e-5)


def test_a_cluster_holding_every_sample_has_no_rest():
    model, x, y = build("branching")
    tidy = at.cluster_pruning_curves(model, "left.0", x, y, np.zeros(40), 0.0, np.arange(5.0))
    assert tidy["subset"].unique().tolist() == ["cluster"]


def test_summary_areas_gap_and_random_orders_beaten():
    curve = pd.DataFrame({"k": [0, 1, 2], "ranked": [1.0, 0.5, 0.0], "bottom": [1.0, 1.0, 1.0],
                          "random_mean": [1.0, 0.75, 0.5], "random_lo": [1.0, 0.7, 0.4],
                          "random_hi": [1.0, 0.8, 0.6]})
    curve.attrs = {"metric": "accuracy", "random_curves": np.array(
        [[1.0, 0.5, 0.0], [1.0, 0.8, 0.6], [1.0, 0.7, 0.4], [1.0, 1.0, 1.0]])}
    summary = at.curve_summary(curve)
    assert summary.index.tolist() == ["all"]
    row = summary.loc["all"]
    assert row["area_ranked"] == pytest.approx(0.5)
    assert row["area_bottom"] == pytest.approx(1.0)
    assert row["area_random"] == pytest.approx(0.75)
    assert row["gap_vs_random"] == pytest.approx(0.25)
    assert row["fraction_random_beaten"] == pytest.approx(3.5 / 4)  # one tie counts half
    as_loss = at.curve_summary(curve, metric="loss").loc["all"]  # higher loss = damage
    assert as_loss["gap_vs_random"] == pytest.approx(-0.25)
    assert as_loss["fraction_random_beaten"] == pytest.approx(0.5 / 4)
    curve.attrs = {}
    assert np.isnan(at.curve_summary(curve, metric="accuracy").loc["all", "fraction_random_beaten"])
    with pytest.raises(at.AttributionError, match="metric"):
        at.curve_summary(curve)


def test_summary_per_subset_and_a_good_ranking_beats_random():
    model, x, y = build("residual_mlp")
    ablation_scores = at.neuron_scores(model, "fc2", x, y, "ablation").mean(0).numpy()
    tidy = at.cluster_pruning_curves(model, "fc2", x, y, np.arange(40) % 2, 0, ablation_scores,
                                     metric="target_logit")
    summary = at.curve_summary(tidy)
    assert summary.index.tolist() == ["cluster", "rest"]
    worst = at.pruning_curve(model, "fc2", x, y, -ablation_scores, metric="target_logit")
    assert at.curve_summary(worst).loc["all", "gap_vs_random"] < 0
    best = at.pruning_curve(model, "fc2", x, y, ablation_scores, metric="target_logit")
    assert at.curve_summary(best).loc["all", "fraction_random_beaten"] == 1.0


def test_refinement_rounds_cover_each_position_once_coarse_first():
    for count in range(0, 70):
        rounds = refinement_rounds(count)
        flat = [position for round_ in rounds for position in round_]
        assert sorted(flat) == list(range(count))
        if count >= 3:
            assert rounds[0][:3] == [0, count - 1, (count - 1) // 2]


@pytest.mark.parametrize("change,match", [
    (dict(scores=np.arange(3.0)), "16 neurons"),
    (dict(scores=np.full(16, np.nan)), "NaN"),
    (dict(ks=[0, 17]), "0..16"),
    (dict(ks=[]), "non-empty"),
    (dict(ks=[0.5, 2.0]), "integers"),
    (dict(ablation="one"), "ablation"),
    (dict(metric="f1"), "metric"),
    (dict(targets="all"), "one target per sample"),
    (dict(n_random=0), "n_random"),
    (dict(targets=torch.full((40,), 9)), "0..2"),
])
def test_user_mistakes_raise_one_actionable_error(change, match):
    model, x, y = build("residual_mlp")
    arguments = dict(targets=y, scores=np.arange(16.0))
    arguments.update(change)
    scores, targets = arguments.pop("scores"), arguments.pop("targets")
    with pytest.raises(at.AttributionError, match=match):
        at.pruning_curve(model, "fc2", x, targets, scores, **arguments)


def test_an_unknown_cluster_is_named():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match="'z' is not among"):
        at.cluster_pruning_curves(model, "fc2", x, y, np.array(["a", "b"] * 20), "z",
                                  np.arange(16.0))


def test_spaced_ks_keep_every_k_of_narrow_layers_and_both_ends_of_wide_ones():
    assert spaced_ks(16, 128) == list(range(17))
    wide = spaced_ks(1024, 128)
    assert len(wide) == 129 and wide[0] == 0 and wide[-1] == 1024
    assert set(np.diff(wide)) == {8}
