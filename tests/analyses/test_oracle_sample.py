"""The sampled oracle: exact ablation of m of n neurons, and intervals that cover the exact
agreement at their stated rate."""
import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses.ranks import CONFIDENCE, bootstrap_counts, rank_correlation
from attribution.analyses.oracle_sample import (FEWEST_ORACLE_NEURONS, OracleSample,
                                                draw_neurons, neuron_draws, oracle_size,
                                                sample_oracle, sampled_spearman)


def _model(width: int = 96) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 32), nn.Tanh(),
                         nn.Linear(32, 5)).eval()


def test_neurons_are_drawn_sorted_without_repeats_and_again_for_the_same_seed():
    drawn = draw_neurons(3072, 256, seed=3)
    assert len(drawn) == 256 and len(set(drawn.tolist())) == 256
    assert np.all(np.diff(drawn) > 0) and drawn.min() >= 0 and drawn.max() < 3072
    assert np.array_equal(drawn, draw_neurons(3072, 256, seed=3))
    assert not np.array_equal(drawn, draw_neurons(3072, 256, seed=4))
    assert np.array_equal(draw_neurons(10, 10), np.arange(10))
    assert np.array_equal(draw_neurons(10, 99), np.arange(10))


def test_the_oracle_size_is_every_neuron_when_they_fit_else_a_power_of_two_that_fits():
    assert oracle_size(64, seconds_per_neuron=0.1, budget=30) == 64
    assert oracle_size(3072, seconds_per_neuron=0.1, budget=30) == 256  # 300 fit
    assert oracle_size(3072, seconds_per_neuron=0.1, budget=25.6) == 256
    assert oracle_size(3072, seconds_per_neuron=5.0, budget=30) == FEWEST_ORACLE_NEURONS
    assert oracle_size(20, seconds_per_neuron=5.0, budget=30) == 20  # fewer than the floor


def test_the_sampled_oracle_is_the_exact_oracle_on_the_neurons_drawn():
    model, x = _model(), torch.randn(70, 12)
    exact = at.neuron_scores(model, "1", x, None, "ablation").numpy()
    sampled = sample_oracle(model, "1", x, None, 16, seed=5, batch_size=32)
    assert not sampled.exact and sampled.words() == "on 16 of 96 neurons"
    np.testing.assert_allclose(sampled.effects, exact[:, sampled.neurons], rtol=1e-5,
                               atol=1e-6)
    whole = sample_oracle(model, "1", x, None, 500)
    assert whole.exact and whole.words() == "on all 96 neurons"
    np.testing.assert_array_equal(whole.effects, exact)


def test_a_budget_that_fits_every_neuron_gives_the_exact_oracle():
    model, x = _model(), torch.randn(40, 12)
    assert sample_oracle(model, "1", x, None, budget=600).exact
    assert len(sample_oracle(model, "1", x, None, budget=1e-9).neurons) == \
        FEWEST_ORACLE_NEURONS


def test_neuron_resamples_come_from_the_sample_replicated_to_the_layer():
    generator = np.random.default_rng(0)
    assert neuron_draws(50, 50, 10, generator) is None
    picks = neuron_draws(32, 96, 400, generator)  # each of the 32 stands for 3 neurons
    assert picks.shape == (400, 32) and picks.min() >= 0 and picks.max() < 32
    counts = np.stack([np.bincount(row, minlength=32) for row in picks])
    assert counts.max() <= 3  # drawn without replacement from 3 copies of each
    assert abs(counts.mean() - 1) < 1e-12
    # without replacement: fewer repeats than a plain bootstrap (variance (1 - m/n) smaller)
    plain = np.stack([np.bincount(row, minlength=32)
                      for row in generator.integers(0, 32, (400, 32))])
    assert counts.var() < 0.8 * plain.var()


def _agreement_draw(scores, effects, neurons, n_neurons, seed, draws=400):
    oracle = OracleSample(neurons, n_neurons, effects[:, neurons])
    counts = bootstrap_counts(len(scores), draws, np.random.default_rng([seed, 1]))
    return sampled_spearman(scores, oracle, "mean", counts, np.random.default_rng([seed, 2]))


def _synthetic(n_neurons=512, n_samples=300, noise=0.3, seed=0):
    """Per-sample scores and effects [N, n] whose neuron means correlate (rho about 0.6),
    with sample noise small beside the neurons' spread."""
    generator = np.random.default_rng(seed)
    a = generator.normal(size=n_neurons)
    b = 0.7 * a + 0.7 * generator.normal(size=n_neurons)
    scores = a + noise * generator.normal(size=(n_samples, n_neurons))
    effects = b + noise * generator.normal(size=(n_samples, n_neurons))
    return scores, effects


def test_at_m_equal_n_the_statistic_is_the_exact_one():
    scores, effects = _synthetic(n_neurons=64)
    exact = rank_correlation("spearman", scores.mean(0), effects.mean(0))
    agreement = _agreement_draw(scores, effects, np.arange(64), 64, seed=0)
    assert agreement.value == exact
    assert agreement.low <= exact <= agreement.high
    assert agreement.words().startswith("ρ = ")


@pytest.mark.parametrize("sampled", [32, 128])
def test_the_interval_covers_the_exact_value_at_its_stated_rate(sampled):
    """The exact value: Spearman on all 512 neurons with these samples. 200 draws of m
    neurons: a 95% interval that ignored the neurons drawn would cover it far less often
    (the samples' noise is small beside the neurons' spread)."""
    scores, effects = _synthetic()
    exact = rank_correlation("spearman", scores.mean(0), effects.mean(0))
    covered, samples_only = [], []
    for seed in range(200):
        neurons = draw_neurons(512, sampled, seed)
        agreement = _agreement_draw(scores, effects, neurons, 512, seed, draws=300)
        covered.append(agreement.low <= exact <= agreement.high)
        whole = _agreement_draw(scores[:, neurons], effects[:, neurons],
                                np.arange(sampled), sampled, seed, draws=300)
        samples_only.append(whole.low <= exact <= whole.high)
        assert agreement.words().startswith(f"on {sampled} of 512 neurons: ρ = ")
    assert 0.9 <= np.mean(covered) <= 1.0, np.mean(covered)
    assert np.mean(samples_only) < 0.75  # the neurons' part is what makes it cover


def test_the_interval_narrows_as_more_neurons_are_drawn():
    scores, effects = _synthetic()
    widths = {}
    for sampled in (32, 128, 512):
        agreements = [_agreement_draw(scores, effects, draw_neurons(512, sampled, seed), 512,
                                      seed, draws=300) for seed in range(20)]
        widths[sampled] = np.median([a.high - a.low for a in agreements])
    assert widths[32] > 1.5 * widths[128] > 1.5 * widths[512]


def test_a_real_layer_sampled_interval_covers_its_exact_agreement():
    """A layer small enough to ablate exactly: gradient scores against exact ablation on all
    96 neurons, then on 200 draws of 24 of them."""
    model, x = _model(), torch.randn(240, 12)
    targets = model(x).argmax(1)
    scores = at.neuron_scores(model, "1", x, targets, "gradient").numpy().astype(np.float64)
    effects = at.neuron_scores(model, "1", x, targets, "ablation").numpy().astype(np.float64)
    exact = rank_correlation("spearman", scores.mean(0), effects.mean(0))
    covered = [_agreement_draw(scores, effects, draw_neurons(96, 24, seed), 96, seed,
                               draws=300) for seed in range(200)]
    rate = np.mean([a.low <= exact <= a.high for a in covered])
    assert rate >= CONFIDENCE - 0.07, rate


def test_diagnose_says_how_many_neurons_its_oracle_rests_on():
    model, x = _model(), torch.randn(120, 12)
    targets = model(x).argmax(1)
    findings = {f.code: f for f in at.diagnose(model, "1", x, targets, "gradient",
                                                oracle_neurons=40)}
    sampled = findings["disagrees_with_ablation"]
    assert "on 40 of the 96 neurons drawn at random" in sampled.message
    assert sampled.low <= sampled.value <= sampled.high
    exact = {f.code: f for f in at.diagnose(model, "1", x, targets, "gradient")}
    assert "drawn at random" not in exact["disagrees_with_ablation"].message
    assert exact["disagrees_with_ablation"] == {
        f.code: f for f in at.diagnose(model, "1", x, targets, "gradient",
                                       oracle_neurons=96)}["disagrees_with_ablation"]


def test_a_weak_agreement_on_too_few_neurons_is_a_warning_to_ablate_more():
    """A random ranking on 16 of 96 neurons: rho 0.19 [-0.38, 0.72], p = 0.24.
    Too few neurons to tell: a warning whose hint asks for more (every one: 96), in the
    API's words and the page's toggle. On all 96 the same ranking is a problem."""
    model, x = _model(), torch.randn(120, 12)
    targets = model(x).argmax(1)

    def agreement(**options):
        return {f.code: f for f in at.diagnose(model, "1", x, targets, "random", seed=2,
                                               **options)}["disagrees_with_ablation"]

    sampled = agreement(oracle_neurons=16)
    assert sampled.p_value > 0.05 and sampled.high >= 0.6 and sampled.low < 0.3
    assert sampled.severity == "warning" and sampled.pattern == "too_few_neurons"
    assert sampled.message.startswith("Too few neurons were ablated to tell")
    assert sampled.hint.endswith("oracle_neurons=96 measures every one.")
    assert "“Ablate all 96 neurons exactly”" in sampled.words(screen=True)[1]
    exact = agreement()
    assert exact.high < 0.3 and exact.severity == "problem"


def test_the_oracle_table_on_a_sample_is_the_exact_table_of_those_neurons():
    """oracle_agreement on m of n neurons: each measure equals the same measure computed by
    hand on the m columns of the exact per-sample effects and scores; Spearman's interval
    holds it; the table says m of n; every neuron gives the exact table."""
    model, x = _model(), torch.randn(150, 12)
    targets = model(x).argmax(1)
    clusters = (x[:, 0] > 0).numpy().astype(int)
    table = at.oracle_agreement(model, "1", x, targets, methods=["gradient", "activation"],
                                clusters=clusters, oracle_neurons=24)
    chosen = draw_neurons(96, 24)
    effects = at.neuron_scores(model, "1", x, targets, "ablation").numpy()[:, chosen]
    assert (table["neurons"] == 24).all() and (table["n_neurons"] == 96).all()
    for row in table.itertuples():
        rows = clusters == row.cluster
        scores = at.neuron_scores(model, "1", x, targets, row.method).numpy()[:, chosen]
        a, b = scores[rows].mean(0), effects[rows].mean(0)
        assert row.spearman_signed == pytest.approx(rank_correlation("spearman", a, b))
        assert row.kendall_abs == pytest.approx(rank_correlation("kendall", abs(a), abs(b)))
        assert row.top_k == 10  # of 96; on 24 of them, the top round(10 * 24 / 96) = 3
        top = set(np.argsort(-a)[:3]) & set(np.argsort(-b)[:3])
        assert row.top_k_overlap_signed == pytest.approx(len(top) / 3)
        assert row.spearman_signed_low <= row.spearman_signed <= row.spearman_signed_high
    exact = at.oracle_agreement(model, "1", x, targets, methods=["gradient"],
                                clusters=clusters)
    assert (exact["neurons"] == 96).all()


def test_the_scorecard_on_a_sample_measures_its_neurons_and_removes_only_them():
    model, x = _model(), torch.randn(120, 12)
    targets = model(x).argmax(1)
    card = at.scorecard(model, x, targets, layers=["1", "3"],
                        methods=["gradient", "ablation", "random"], n_boot=200,
                        oracle_neurons={"1": 16})
    sampled, whole = card[card["layer"] == "1"], card[card["layer"] == "3"]
    assert (sampled["neurons"] == 16).all() and (sampled["n_neurons"] == 96).all()
    assert (whole["neurons"] == 32).all() and (whole["n_neurons"] == 32).all()
    assert card.attrs["ks"]["1"][-1] == 16  # the curves remove the 16 drawn, at most
    oracle = sampled.set_index("method").loc["ablation"]
    assert oracle["spearman"] == 1 and oracle["curve_area"] == pytest.approx(1.0)
    chosen = draw_neurons(96, 16)
    scores = at.neuron_scores(model, "1", x, targets, "gradient").numpy()[:, chosen]
    effects = at.neuron_scores(model, "1", x, targets, "ablation").numpy()[:, chosen]
    row = sampled.set_index("method").loc["gradient"]
    assert row["spearman"] == pytest.approx(
        rank_correlation("spearman", scores.mean(0), effects.mean(0)))
    for measure in ("spearman", "kendall", "top_overlap"):
        assert row[f"{measure}_low"] <= row[measure] <= row[f"{measure}_high"], measure
    from attribution.presentation import plots
    words = plots.oracle_sample_words(card)
    assert "1: 16 of 96" in words and "3:" not in words
    assert plots.oracle_sample_words(whole) == ""
    assert "16 of 96" in plots.scorecard_table(card)["neurons measured"].tolist()


def test_the_neuron_views_removal_effect_comes_with_its_interval():
    from attribution.analyses.neuron import change_interval
    changes = np.random.default_rng(0).normal(-0.5, 1.0, size=400)
    low, high = change_interval(changes)
    assert low < changes.mean() < high and high - low == pytest.approx(
        2 * 1.966 * changes.std(ddof=1) / 20, rel=1e-3)
    assert change_interval(np.zeros(50)) == (0.0, 0.0)
    assert np.isnan(change_interval(np.ones(1))).all()


def test_a_method_fitted_to_the_clusters_is_fitted_on_every_sample_for_one_cluster():
    """oracle_agreement(cluster=c) of the probe: fitted on every sample's clusters, its
    scores of c's samples compared; the same as its row of the every-cluster table."""
    model, x = _model(), torch.randn(160, 12)
    targets = model(x).argmax(1)
    clusters = (x[:, 0] > 0).numpy().astype(int)
    one = at.oracle_agreement(model, "1", x, targets, methods=["probe"], clusters=clusters,
                              cluster=1, oracle_neurons=40)
    every = at.oracle_agreement(model, "1", x, targets, methods=["probe"],
                                clusters=clusters, oracle_neurons=40)
    assert one["cluster"].tolist() == [1]
    mine = every[every["cluster"] == 1].iloc[0]
    for column in ("spearman_signed", "kendall_abs", "top_k_overlap_signed", "neurons"):
        assert one[column].iloc[0] == pytest.approx(mine[column]), column


def test_an_iterable_of_batches_gets_the_exact_table_and_its_layer_axis():
    """Batches from an iterable (a DataLoader; read once per method) cannot be timed ahead:
    every neuron is ablated, and the table equals the in-memory one, its neuron axis
    recorded."""
    model, x = _model(32), torch.randn(90, 12)
    targets = model(x).argmax(1)
    clusters = (x[:, 1] > 0).numpy().astype(int)
    batches = [x[start:start + 32] for start in range(0, 90, 32)]
    streamed = at.oracle_agreement(model, "1", batches, targets,
                                   methods=["gradient"], clusters=clusters)
    held = at.oracle_agreement(model, "1", x, targets, methods=["gradient"],
                               clusters=clusters)
    pd.testing.assert_frame_equal(streamed, held)
    assert streamed.attrs["neuron_axis"] == 1 and streamed.attrs["layer"] == "1"
    with pytest.raises(at.AttributionError, match="held in memory"):
        at.oracle_agreement(model, "1", batches, targets, methods=["gradient"],
                            clusters=clusters, oracle_neurons=8)
    with pytest.raises(at.AttributionError, match="not a one-shot iterator"):
        at.oracle_agreement(model, "1", (batch for batch in batches), targets,
                            methods=["gradient", "activation"], clusters=clusters)


def test_the_oracle_is_timed_as_a_fixed_part_and_a_part_per_neuron(monkeypatch):
    """One neuron and five timed on a batch: the difference is four neurons' share, the rest
    the passes any size pays (the model up to the layer), both scaled to every sample; the
    budget then buys as many neurons as fit after the fixed part."""
    from attribution.analyses import costs, oracle_sample
    clock = [0.0]

    def fake(model, layer, x, targets, method, *, neurons, **options):
        clock[0] += len(x) * (0.002 + 0.001 * len(neurons))  # per sample: 2 ms + 1 ms a neuron

    monkeypatch.setattr(oracle_sample, "neuron_scores", fake)
    monkeypatch.setattr(oracle_sample, "layer_width", lambda *args: 3072)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    x = torch.zeros(1000, 3)
    fixed, per_neuron, n = oracle_sample.oracle_timing(None, "fc", x, None, batch_size=100)
    assert (fixed, per_neuron, n) == (pytest.approx(2.0), pytest.approx(1.0), 3072)
    plan = oracle_sample.plan_oracle(None, "fc", x, None, batch_size=100, budget=80)
    assert plan.neurons == 64  # 78 s after the fixed 2 s: 78 neurons, 64 a power of two
    assert plan.seconds == pytest.approx(66.0) and plan.exact_seconds == pytest.approx(3074)
    assert "as many as exact ablation fits in 80 s (every neuron: about 51 min)" in \
        plan.words()
