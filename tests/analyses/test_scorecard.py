"""`scorecard`: every method on every layer against exact ablation. Its columns are checked
against an independent computation (scipy's correlations on `cluster_scores` tables, a slow
bootstrap loop, `pruning_curve` areas), its ends (the oracle scores 1, random about 0), and
the cascading-randomisation sanity check (activation survives it, gradients do not)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from torch import nn

import attribution as at
from attribution.analyses.pruning_curves import curve_summary
from attribution.analyses.ranks import interval
from attribution.analyses.scorecard import SCORECARD_COLUMNS, randomized_after, top_k_of
from attribution.analyses.settings import DEFAULT_N_STEPS
from tests.support.families import trained_cnn1d
from attribution.inputs.demo import load_demo
from tests.support.models import ResidualMLP

LAYER = "relu1"
METHODS = ("gradient", "activation", "gradient_x_activation", "ablation", "random")


@pytest.fixture(scope="module")
def demo():
    """(model, inputs, labels, clusters): 400 samples of the digits MLP, clusters = labels."""
    model, data = load_demo("digits_mlp")
    x, y = data.inputs[:400], data.labels[:400]
    return model.module, x, y, y.numpy()


@pytest.fixture(scope="module")
def card(demo):
    model, x, y, clusters = demo
    return at.scorecard(model, x, y, clusters, layers=[LAYER, "out"], methods=METHODS)


def test_one_row_per_layer_and_method_with_the_documented_columns(card, demo):
    assert tuple(card.columns) == SCORECARD_COLUMNS
    assert list(zip(card["layer"], card["method"])) == [
        (layer, method) for layer in (LAYER, "out") for method in METHODS]
    assert (card["n_clusters"] == len(np.unique(demo[3]))).all()
    default = at.scorecard(*demo, methods=["gradient"], n_boot=10)
    assert list(default["layer"]) == [info.name for info in
                                      at.list_layers(demo[0], demo[1][:2])]


def test_correlations_and_overlap_equal_scipy_on_cluster_scores(card, demo):
    model, x, y, clusters = demo
    oracle = at.cluster_scores(model, LAYER, x, y, clusters, "ablation", reduce="mean")
    neurons = [column for column in oracle.columns if column != "n"]
    k = max(1, math.floor(len(neurons) / 10 + 0.5))
    for method in METHODS:
        table = at.cluster_scores(model, LAYER, x, y, clusters, method, reduce="mean")
        spearman, kendall, overlap = [], [], []
        for cluster in oracle.index:
            a = table.loc[cluster, neurons].to_numpy(np.float64)
            b = oracle.loc[cluster, neurons].to_numpy(np.float64)
            spearman.append(stats.spearmanr(a, b).statistic)
            kendall.append(stats.kendalltau(a, b).statistic)
            overlap.append(len(set(np.argsort(-a, kind="stable")[:k])
                               & set(np.argsort(-b, kind="stable")[:k])) / k)
        row = card[(card["layer"] == LAYER) & (card["method"] == method)].iloc[0]
        assert row["spearman"] == pytest.approx(np.nanmean(spearman), abs=1e-9), method
        assert row["kendall"] == pytest.approx(np.nanmean(kendall), abs=1e-9), method
        assert row["top_overlap"] == pytest.approx(np.mean(overlap)), method


def test_the_interval_matches_a_slow_bootstrap(demo):
    """A loop resampling each cluster's samples with scipy's Spearman per draw: its
    bias-corrected percentile interval (z0 from the share of draws below the estimate)
    agrees with the vectorised one to Monte Carlo error."""
    model, x, y, clusters = demo
    card = at.scorecard(model, x, y, clusters, layers=[LAYER], methods=["gradient"],
                        n_boot=4000)
    scores = at.neuron_scores(model, LAYER, x, y, "gradient").numpy()
    oracle = at.neuron_scores(model, LAYER, x, y, "ablation").numpy()
    generator = np.random.default_rng(12345)  # not the scorecard's draws
    groups = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    means = []
    for _ in range(3000):
        rhos = []
        for rows in groups:
            drawn = generator.choice(rows, size=len(rows), replace=True)
            rhos.append(stats.spearmanr(scores[drawn].mean(0), oracle[drawn].mean(0)).statistic)
        means.append(np.nanmean(rhos))
    row = card.iloc[0]
    means = np.asarray(means)
    z0 = stats.norm.ppf(np.mean(means < row["spearman"])
                        + 0.5 * np.mean(means == row["spearman"]))
    levels = 100 * stats.norm.cdf(2 * z0 + np.array([-1.96, 1.96]))
    low, high = np.percentile(means, levels)
    width = high - low
    assert width > 0.005
    assert row["spearman_low"] == pytest.approx(low, abs=0.05 * width)
    assert row["spearman_high"] == pytest.approx(high, abs=0.05 * width)
    assert row["spearman_low"] <= row["spearman"] <= row["spearman_high"]


def test_the_oracle_scores_one_and_a_random_ranking_about_zero(card):
    oracle = card[card["method"] == "ablation"]
    for column in ("spearman", "kendall", "spearman_low", "spearman_high", "top_overlap",
                   "curve_area"):
        assert oracle[column].to_numpy() == pytest.approx(1.0), column
    random = card[card["method"] == "random"]
    assert (random["curve_area"] == 0).all()  # the random orders' own mean: by construction
    assert (random["spearman"].abs() < 0.2).all()
    assert (card[card["method"] == "gradient_x_activation"]["curve_area"] > 0.9).all()


def test_curve_area_equals_areas_of_pruning_curves(card, demo):
    """(A_random - A_method) / (A_random - A_ablation) per cluster from `pruning_curve`s at
    the scorecard's k values, with its random orders (same seed and count)."""
    model, x, y, clusters = demo
    ks, n_random = card.attrs["ks"][LAYER], card.attrs["n_random"]
    ratios = []
    for cluster in np.unique(clusters):
        rows = torch.from_numpy(np.flatnonzero(clusters == cluster))
        part, targets = x[rows], y[rows]

        def area(method):
            scores = at.neuron_scores(model, LAYER, part, targets, method).mean(0)
            curve = at.pruning_curve(model, LAYER, part, targets, scores, ks=ks,
                                     n_random=n_random)
            return curve_summary(curve).iloc[0]

        method, oracle = area("gradient"), area("ablation")
        ratios.append((method["area_random"] - method["area_ranked"])
                      / (oracle["area_random"] - oracle["area_ranked"]))
    row = card[(card["layer"] == LAYER) & (card["method"] == "gradient")].iloc[0]
    assert row["curve_area"] == pytest.approx(np.mean(ratios), rel=1e-6)


def test_activation_survives_randomisation_and_gradients_do_not(card):
    hidden = card[card["layer"] == LAYER].set_index("method")["after_randomization"]
    assert hidden["activation"] == pytest.approx(1.0)
    assert hidden["random"] == pytest.approx(1.0)  # it never reads the model
    for method in ("gradient", "gradient_x_activation", "ablation"):
        assert hidden[method] < 0.5, method
    assert card[card["layer"] == "out"]["after_randomization"].isna().all()  # nothing after
    assert card.attrs["reinitialised"] == {LAYER: ["fc2", "out"], "out": []}


def test_randomized_after_leaves_the_model_and_the_layer_output_alone():
    torch.manual_seed(0)
    model, x = ResidualMLP().eval(), torch.randn(16, 10)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    copy, changed = randomized_after(model, "act", x[:2], seed=3)
    assert changed == ["fc2", "out"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    taken = {}
    handles = [module.register_forward_hook(lambda m, a, out, key=key: taken.update({key: out}))
               for key, module in (("model", model.act), ("copy", copy.act))]
    try:
        with torch.no_grad():
            logits, copied = model(x), copy(x)
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(taken["model"], taken["copy"])
    assert not torch.allclose(logits, copied)
    again, _ = randomized_after(model, "act", x[:2], seed=3)  # seeded: the same copy
    for (name, value), other in zip(copy.state_dict().items(), again.state_dict().values()):
        assert torch.equal(value, other), name


class SharedTail(nn.Module):
    """`shared` runs before and after `mid`: re-initialising it would change mid's input."""

    def __init__(self):
        super().__init__()
        self.shared, self.mid, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.shared(torch.relu(self.mid(self.shared(x)))))


def test_a_module_shared_with_the_front_is_not_reinitialised():
    torch.manual_seed(0)
    model = SharedTail().eval()
    copy, changed = randomized_after(model, "mid", torch.randn(2, 4))
    assert changed == ["head"]
    assert torch.equal(copy.shared.weight, model.shared.weight)


def test_methods_that_refuse_a_layer_leave_their_rows_out(demo):
    model, x, y, clusters = demo
    card = at.scorecard(model, x, y, clusters, layers=[LAYER, "fc1"],
                        methods=["weight_norm", "gradient"], n_boot=20)
    assert list(zip(card["layer"], card["method"])) == [
        (LAYER, "gradient"), ("fc1", "weight_norm"), ("fc1", "gradient")]
    assert list(card.attrs["refused"]) == [f"{LAYER}/weight_norm"]
    with pytest.raises(at.AttributionError, match="No method could score"):
        at.scorecard(model, x, y, clusters, layers=[LAYER], methods=["bn_scale"])


def test_a_method_fitted_to_the_clusters_gets_its_row(demo):
    model, x, y, clusters = demo
    card = at.scorecard(model, x, y, clusters, layers=[LAYER], methods=["probe"], n_boot=50)
    row = card.iloc[0]
    assert row["method"] == "probe" and np.isfinite(row["spearman"])
    assert row["after_randomization"] == pytest.approx(1.0)  # it reads activations only


def test_inputs_must_be_in_memory(demo):
    model, x, y, clusters = demo
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50)
    with pytest.raises(at.AttributionError, match="in memory"):
        at.scorecard(model, loader, y, clusters)


def test_top_k_is_a_tenth_of_the_neurons_halves_rounded_up():
    assert [top_k_of(n) for n in (1, 4, 5, 15, 16, 25, 64)] == [1, 1, 1, 2, 2, 3, 6]


def test_progress_reports_each_method_scored_twice_per_layer(demo):
    seen = []
    at.scorecard(*demo, layers=[LAYER, "out"], methods=["gradient", "bn_scale"], n_boot=10,
                 progress=lambda fraction, table: seen.append((fraction, len(table))))
    # per layer: gradient scored, bn_scale refused (both its steps), gradient's row
    assert seen == [(1 / 8, 0), (2 / 8, 0), (3 / 8, 0), (4 / 8, 1), (5 / 8, 1), (6 / 8, 1),
                    (7 / 8, 1), (1.0, 2)]


class Stopped(Exception):
    """Raised by a progress callback: the caller's stop."""


@pytest.mark.parametrize("stop_after", [1, 7, 10, 17])
def test_a_stopped_card_resumes_from_its_layers_done_to_the_uninterrupted_card(card, demo,
                                                                               stop_after):
    """Ten calls a layer (five methods scored, then their rows with the randomised copy):
    stopped at the 1st or 7th call (no layer done), the 10th (relu1 done) or the 17th ("out"
    mid-way, two of its rows in): the resumed call measures only the layers not done, from
    the fraction where they start, and gives the uninterrupted card, attrs and all; a table
    that is not a progress table is refused."""
    model, x, y, clusters = demo
    kept, calls = [], []

    def stop(fraction, table):
        kept.append(table)
        if len(kept) == stop_after:
            raise Stopped

    with pytest.raises(Stopped):
        at.scorecard(model, x, y, clusters, layers=[LAYER, "out"], methods=METHODS,
                     progress=stop)
    partial = kept[-1]
    done = partial.attrs["layers_done"]
    assert done == ([] if stop_after < 10 else [LAYER])
    assert set(partial["layer"]) >= set(done)
    resumed = at.scorecard(model, x, y, clusters, layers=[LAYER, "out"], methods=METHODS,
                           resume=partial,
                           progress=lambda fraction, table: calls.append(fraction))
    pd.testing.assert_frame_equal(resumed, card)
    assert {key: resumed.attrs[key] for key in ("refused", "reinitialised", "ks")} == \
        {key: card.attrs[key] for key in ("refused", "reinitialised", "ks")}
    assert calls[0] == pytest.approx((len(done) * 2 * len(METHODS) + 1) / (4 * len(METHODS)))
    with pytest.raises(at.AttributionError, match="not a partial scorecard"):
        at.scorecard(model, x, y, clusters, layers=[LAYER, "out"], methods=METHODS,
                     resume=card.iloc[:0])


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_the_callers_grad_mode_changes_nothing(demo, mode):
    """Under the caller's no_grad or inference_mode the card is the same: the randomised
    copy is made outside inference mode, so gradients still pass through it."""
    model, x, y, clusters = demo
    options = dict(layers=[LAYER], methods=["gradient", "activation"], n_boot=50)
    expected = at.scorecard(model, x, y, clusters, **options)
    with mode():
        card = at.scorecard(model, x, y, clusters, **options)
    pd.testing.assert_frame_equal(card, expected)


def test_the_interval_holds_the_estimate_strictly_on_a_trained_1d_cnn():
    """Rank correlations on 8 and 16 channels take few values, and resampling biases them
    toward 0: plain percentiles put the estimate on an end (0.7196 [0.7196, 0.733] was
    reported). The bias-corrected interval holds it strictly inside, except at exactly 1."""
    model, x, y = trained_cnn1d()
    card = at.scorecard(model, x, y, y.numpy(), layers=["0", "3"],
                        methods=["gradient", "activation", "gradient_x_activation", "ablation",
                                 "random"], n_random=4)
    inside = card[card["spearman"].abs() < 1]
    assert len(inside) >= 6
    assert ((inside["spearman_low"] < inside["spearman"])
            & (inside["spearman"] < inside["spearman_high"])).all(), inside
    exact = card[card["spearman"] == 1]
    assert ((exact["spearman_low"] <= 1) & (exact["spearman_high"] == 1)).all()
    assert (card[card["method"] == "random"]["curve_area"] == 0).all()


def test_an_interval_around_a_statistic_with_an_atom_at_its_estimate():
    draws = np.r_[np.full(600, 0.5), np.linspace(0.51, 0.7, 400)]  # never below 0.5
    assert np.percentile(draws, 2.5) == 0.5  # a plain percentile sits on the estimate
    low, high = interval(draws, 0.55)
    assert low < 0.55 < high
    low, high = interval(np.r_[draws, np.linspace(0.3, 0.49, 200)], 0.5)
    assert low < 0.5 < high
    assert interval(np.ones(100), 1.0) == (1.0, 1.0)
    assert interval(np.linspace(0.1, 0.2, 50), 0.9)[1] == 0.9  # widened to reach it
    assert np.isnan(interval(np.full(5, np.nan), 0.3)).all()


class EqualNeurons(nn.Module):
    """Four identical neurons: every removal order gives the same curve."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(3, 4), nn.ReLU()
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, -1.0, 0.5]]).expand(4, 3))
            self.fc.bias.zero_()
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0], [-1.0]]).expand(2, 4))

    def forward(self, x):
        return self.head(self.act(self.fc(x)))


def test_curve_area_is_nan_where_the_oracle_does_no_more_damage_than_random():
    """A ratio over a span of float noise read -130 on a small CNN: here every order gives
    the same curve, so there is nothing to normalise by."""
    model = EqualNeurons()
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    card = at.scorecard(model, x, None, layers=["act"], methods=["gradient", "random"],
                        n_random=5, n_boot=50)
    assert card["curve_area"].isna().all()


def test_each_layer_takes_the_path_steps_it_is_given(demo):
    """n_steps as {"layer/method": steps}: that layer's rows are those of a card at those
    steps, the others' those of the default steps, and the n_steps column says which (empty
    for a method without steps)."""
    model, x, y, clusters = demo
    x, y, clusters = x[:120], y[:120], clusters[:120]
    methods = ("gradient", "integrated_gradients")
    options = dict(layers=[LAYER, "out"], methods=methods, n_boot=50, n_random=4)
    mixed = at.scorecard(model, x, y, clusters, n_steps={f"{LAYER}/integrated_gradients": 4},
                         **options)
    fewer = at.scorecard(model, x, y, clusters, n_steps=4, **options)
    default = at.scorecard(model, x, y, clusters, **options)
    assert list(mixed["n_steps"].astype(object).where(mixed["n_steps"].notna(), None)) == \
        [None, 4, None, DEFAULT_N_STEPS]
    assert mixed["n_steps"].dtype == "Int64"
    numbers = [c for c in SCORECARD_COLUMNS if c not in ("layer", "method", "n_steps")]
    pd.testing.assert_frame_equal(mixed.iloc[:2][numbers], fewer.iloc[:2][numbers])
    pd.testing.assert_frame_equal(mixed.iloc[2:][numbers], default.iloc[2:][numbers])
    steps_matter = ~np.isclose(fewer.iloc[:2][numbers].to_numpy(float),
                               default.iloc[:2][numbers].to_numpy(float), rtol=0, atol=0,
                               equal_nan=True)
    assert steps_matter.any()  # else the comparison above could not tell the steps apart
