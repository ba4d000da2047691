"""Where even the fewest neurons pass the oracle's budget on every sample (a deep tail over
long sequences), exact ablation measures a share of each cluster's samples too, and the
evidence curve of diagnose is sized to its own budget: fewer k, then a share of the samples.
Every statistic is then computed on the samples measured, its interval resampling them."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses import costs, oracle_sample
from attribution.analyses.costs import FEWEST_SAMPLES, draw_samples, plan_curve
from attribution.analyses.oracle_sample import (FEWEST_ORACLE_NEURONS, OraclePlan,
                                                OracleSample, Resamples, agreement_draws,
                                                draw_neurons, plan_of_timing,
                                                sample_counts_of, sample_oracle,
                                                sampled_spearman)
from attribution.analyses.ranks import (CONFIDENCE, bootstrap_counts, interval,
                                        rank_correlation)


def _model(width: int = 96) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 32), nn.Tanh(),
                         nn.Linear(32, 5)).eval()


def test_samples_are_drawn_per_cluster_in_proportion_with_a_floor_and_again_for_a_seed():
    codes = np.repeat([0, 1, 2], [200, 40, 5])
    drawn = draw_samples(codes, 0.25, seed=3)
    counts = np.bincount(codes[drawn], minlength=3)
    assert counts.tolist() == [50, 10, 5]  # a quarter; at least FEWEST_SAMPLES; all of 5
    assert np.all(np.diff(drawn) > 0)
    assert np.array_equal(drawn, draw_samples(codes, 0.25, seed=3))
    assert not np.array_equal(drawn, draw_samples(codes, 0.25, seed=4))
    assert np.array_equal(draw_samples(codes, 1.0), np.arange(len(codes)))
    assert np.bincount(codes[draw_samples(codes, 1e-9)]).tolist() == [FEWEST_SAMPLES] * 2 + [5]


def test_the_plan_shares_the_samples_only_when_the_fewest_neurons_pass_the_budget():
    """A GPT-2-like tail: 5 s a neuron over 256 samples after 2 s. 32 neurons take 162 s, so
    30 s measure 47 of the 256 samples; a quick layer is measured on every sample."""
    codes = np.zeros(256, dtype=np.int64)
    plan = plan_of_timing(2.0, 5.0, 3072, codes, budget=30)
    assert plan.neurons == FEWEST_ORACLE_NEURONS and plan.share < 1
    assert plan.samples == 47 and plan.n_samples == 256
    assert plan.seconds == pytest.approx(162 * 47 / 256) and plan.seconds <= 30
    assert not plan.exact
    assert plan.words().startswith("32 of the 3,072 neurons on 47 of the 256 samples, drawn at "
                                   "random: as many as exact ablation fits in 30 s (every "
                                   "neuron on every sample: about 4.3 h)")
    quick = plan_of_timing(2.0, 0.5, 3072, codes, budget=30)
    assert quick.share == 1 and quick.samples == 256 and quick.neurons == 32
    assert "samples" not in quick.words()
    every = plan.exactly()
    assert every.exact and every.samples == 256 and every.seconds == every.exact_seconds
    assert plan.exactly(100).neurons == 100 and plan.exactly(100).share == 1


def test_the_evidence_curve_is_sized_to_its_budget_fewer_k_then_samples():
    codes = np.repeat([0, 1], [128, 128])
    full = plan_curve(0.1, 0.001, 3072, codes, n_random=20, points=32, budget=30)
    assert not full.reduced and full.points == 32 and full.words(3072) == ""
    fewer_k = plan_curve(1.0, 0.06, 3072, codes, n_random=20, points=32, budget=30)
    assert fewer_k.share == 1 and fewer_k.points < 32 and fewer_k.seconds <= 30
    one_cluster = np.zeros(256, dtype=np.int64)
    wide = plan_curve(10.0, 5.0, 3072, one_cluster, n_random=20, points=32, budget=30)
    assert wide.points == costs.FEWEST_CURVE_POINTS and wide.share < 1
    assert wide.seconds <= 30 * 1.05 and wide.n_random == 20  # the p-value's resolution kept
    masks = costs.distinct_masks(3072, 20, wide.ks(3072), 0)
    assert wide.seconds == pytest.approx((10 + 5 * masks) * wide.samples / 256)
    assert wide.words(3072).startswith(f"at 9 values of k on {wide.samples} of the 256 "
                                       "samples, drawn at random: as many as fit in 30 s")
    floor = plan_curve(10.0, 5.0, 3072, codes, n_random=20, points=32, budget=30)
    assert floor.samples == 2 * FEWEST_SAMPLES and floor.seconds > 30  # said, not hidden


def test_an_oracle_on_sampled_rows_maps_each_clusters_rows_to_its_measured_ones():
    effects = np.arange(12.0).reshape(6, 2)  # samples 1, 4, 6, 7, 8, 9 of 10 measured
    oracle = OracleSample(np.array([0, 5]), 8, effects, samples=np.array([1, 4, 6, 7, 8, 9]))
    part = oracle.rows(np.array([0, 1, 2, 7, 9]))
    assert part.samples.tolist() == [1, 3, 4]  # positions among the rows given
    assert part.effects.tolist() == [[0, 1], [6, 7], [10, 11]]
    assert part.of(np.arange(5) * 10).tolist() == [10, 30, 40] and not part.exact


def _noisy(n_neurons=256, n_samples=400, noise=3.0, seed=0):
    """Per-sample scores and effects [N, n] whose sample noise is large beside the neurons'
    spread: the samples drawn move the statistic as much as the neurons drawn."""
    generator = np.random.default_rng(seed)
    a = generator.normal(size=n_neurons)
    b = 0.7 * a + 0.7 * generator.normal(size=n_neurons)
    return (a + noise * generator.normal(size=(n_samples, n_neurons)),
            b + noise * generator.normal(size=(n_samples, n_neurons)))


@pytest.mark.parametrize("noise, share, sampled", [(3.0, 0.125, 64), (1.0, 0.125, 256),
                                                    (3.0, 0.125, 256), (0.3, 0.5, 32)])
def test_the_interval_on_sampled_neurons_and_samples_covers_the_exact_value(noise, share,
                                                                            sampled):
    """The exact value: Spearman on all 256 neurons and all 400 samples. 150 draws of m
    neurons and a share of the samples: the interval covers it at about its stated rate,
    though the means of fewer samples are noisier and attenuate the correlation (up to
    0.09 here); the bias-corrected percentile interval of the other draws, which cannot
    leave the resamples' side, covers it far less often where that bias is large."""
    scores, effects = _noisy(noise=noise)
    exact = rank_correlation("spearman", scores.mean(0), effects.mean(0))
    codes = np.zeros(400, dtype=np.int64)
    covered, percentile = [], []
    for seed in range(150):
        neurons, rows = draw_neurons(256, sampled, seed), draw_samples(codes, share, seed)
        oracle = OracleSample(neurons, 256, effects[rows][:, neurons], samples=rows)
        counts = bootstrap_counts(400, 300, np.random.default_rng([seed, 1]))
        agreement = sampled_spearman(scores, oracle, "mean", counts,
                                     np.random.default_rng([seed, 2]))
        assert (agreement.samples, agreement.n_samples) == (len(rows), 400)
        assert agreement.low <= agreement.value <= agreement.high
        covered.append(agreement.low <= exact <= agreement.high)
        if noise == 3.0 and sampled == 256:
            generator = np.random.default_rng([seed, 2])
            resamples = Resamples(oracle.effects, 256, sample_counts_of(len(rows), 400, 300,
                                                                        generator), generator)
            found = agreement_draws(scores[rows][:, neurons], resamples, "mean",
                                    conventions=("signed",), measures=("spearman",))
            low, high = interval(found["spearman", "signed"].draws, agreement.value)
            percentile.append(low <= exact <= high)
    assert np.mean(covered) >= CONFIDENCE - 0.08, np.mean(covered)
    if percentile:
        assert np.mean(percentile) < 0.5, np.mean(percentile)
    if sampled < 256:
        assert agreement.words().startswith(
            f"on {sampled} of 256 neurons and {len(rows)} of 400 samples: ρ = ")


def test_the_oracle_table_on_a_share_of_the_samples_is_the_exact_table_of_those():
    model, x = _model(), torch.randn(160, 12)
    targets = model(x).argmax(1)
    clusters = (x[:, 0] > 0).numpy().astype(int)
    plan = OraclePlan(24, 96, 1.0, share=0.5, samples=80, n_samples=160)
    table = at.oracle_agreement(model, "1", x, targets, methods=["gradient", "ablation"],
                                clusters=clusters, oracle_neurons=plan)
    chosen, rows = draw_neurons(96, 24), draw_samples(clusters, 0.5)
    effects = at.neuron_scores(model, "1", x, targets, "ablation").numpy()[:, chosen]
    scores = at.neuron_scores(model, "1", x, targets, "gradient").numpy()[:, chosen]
    for row in table.itertuples():
        measured = rows[clusters[rows] == row.cluster]
        assert row.samples == len(measured) and row.n == (clusters == row.cluster).sum()
        ranking = (scores if row.method == "gradient" else effects)[measured].mean(0)
        assert row.spearman_signed == pytest.approx(
            rank_correlation("spearman", ranking, effects[measured].mean(0)), abs=1e-6)
        assert row.spearman_signed_low <= row.spearman_signed <= row.spearman_signed_high
    from attribution.presentation import plots
    shown = plots.oracle_table(table)
    assert set(shown["samples compared"]) == {f"{len(rows[clusters[rows] == c])} of "
                                              f"{(clusters == c).sum()}" for c in (0, 1)}
    assert "24 of 96 neurons and 80 of 160 samples" in plots.oracle_sample_words(table)


def test_diagnose_on_a_deep_wide_tail_says_what_it_sampled(monkeypatch):
    """Budgets no work fits: the oracle measures 32 neurons on FEWEST_SAMPLES of each
    cluster, the evidence curve 9 values of k on as many; the findings say both."""
    monkeypatch.setattr(oracle_sample, "ORACLE_SECONDS", 1e-9)
    monkeypatch.setattr(costs, "CURVE_SECONDS", 1e-9)
    model, x = _model(), torch.randn(120, 12)
    targets = model(x).argmax(1)
    clusters = (x[:, 0] > 0).numpy().astype(int)
    plan = at.diagnose_plan(model, "1", x, targets, clusters)
    assert plan.oracle.neurons == 32 and plan.oracle.samples == 2 * FEWEST_SAMPLES
    assert plan.curve.points == costs.FEWEST_CURVE_POINTS and plan.curve.share < 1
    findings = {f.code: f for f in at.diagnose(model, "1", x, targets, "gradient", clusters,
                                                plan=plan)}
    oracle = findings["disagrees_with_ablation"]
    assert "on 32 of the 96 neurons and 8 of the cluster's" in oracle.message
    assert oracle.low <= oracle.value <= oracle.high
    random = findings["not_better_than_random"]
    assert len(random.curve) == 9 and random.curve.attrs["n_samples"] == FEWEST_SAMPLES
    assert "at 9 values of k on 8 of the cluster's" in random.message
    assert "as many as fit in 0 s" in random.message
    with pytest.raises(at.AttributionError, match="not both"):
        at.diagnose(model, "1", x, targets, "gradient", clusters, plan=plan, oracle_neurons=8)
    exact = {f.code: f for f in at.diagnose(model, "1", x, targets, "gradient", clusters,
                                             plan=plan.with_oracle_neurons())}
    assert "drawn at random" not in exact["disagrees_with_ablation"].message


def test_the_scorecard_measures_a_layer_on_its_oracles_samples():
    model, x = _model(), torch.randn(120, 12)
    targets = model(x).argmax(1)
    plan = OraclePlan(16, 96, 1.0, share=0.5, samples=60, n_samples=120)
    card = at.scorecard(model, x, targets, layers=["1", "3"],
                        methods=["gradient", "ablation", "random"], n_boot=200,
                        oracle_neurons={"1": plan, "3": 32})
    sampled, whole = card[card["layer"] == "1"], card[card["layer"] == "3"]
    assert (sampled["samples"] == 60).all() and (sampled["n_samples"] == 120).all()
    assert (whole["samples"] == 120).all()
    rows, chosen = draw_samples(np.zeros(120, dtype=np.int64), 0.5), draw_neurons(96, 16)
    scores = at.neuron_scores(model, "1", x, targets, "gradient").numpy()[rows][:, chosen]
    effects = at.neuron_scores(model, "1", x, targets, "ablation").numpy()[rows][:, chosen]
    assert sampled.set_index("method").loc["gradient", "spearman"] == pytest.approx(
        rank_correlation("spearman", scores.mean(0), effects.mean(0)), abs=1e-6)
    from attribution.presentation import plots
    assert "1: 16 of 96 neurons and 60 of 120 samples" in plots.oracle_sample_words(card)
    assert "60 of 120" in plots.scorecard_table(card)["samples measured"].tolist()


def test_sample_oracle_takes_a_plan_and_measures_its_share_of_each_cluster():
    model, x = _model(), torch.randn(100, 12)
    clusters = np.repeat(["a", "b"], [80, 20])
    oracle = sample_oracle(model, "1", x, None,
                           OraclePlan(8, 96, 1.0, share=0.25, samples=28, n_samples=100),
                           clusters)
    assert oracle.samples.tolist() == draw_samples(np.repeat([0, 1], [80, 20]), 0.25).tolist()
    assert oracle.effects.shape == (28, 8)  # 20 of a, 8 (the floor) of b
    every = at.neuron_scores(model, "1", x, None, "ablation").numpy()
    assert np.allclose(oracle.effects, every[oracle.samples][:, oracle.neurons], atol=1e-6)
