"""A pruning curve's cost, said before it runs: its passes counted as the engine runs them,
and the cheaper settings each priced and smaller."""
import numpy as np
import pandas as pd
import pytest
import torch

import attribution as at
from attribution.analyses.oracle_sample import OraclePlan
from attribution.analyses import costs, pruning_curves
from attribution.analyses.settings import evidence_ks
from tests.support.models import build


def counted_masks(monkeypatch) -> list[int]:
    """Patch the engine's masked passes to count the masks each evaluates."""
    seen, masked_sums = [], pruning_curves._masked_sums

    def counting(runner, captured, removed, *args):
        seen.append(int(removed.shape[0]))
        return masked_sums(runner, captured, removed, *args)
    monkeypatch.setattr(pruning_curves, "_masked_sums", counting)
    return seen


@pytest.mark.parametrize("ks", [None, [0, 1, 5, 16], [3, 7]])
@pytest.mark.parametrize("n_random", [1, 6])
def test_the_masks_counted_are_the_masks_a_curve_evaluates(ks, n_random, monkeypatch):
    model, x, y = build("residual_mlp")
    seen = counted_masks(monkeypatch)
    scores = -np.arange(16.0)  # ranked 0, 1, ..., 15 (any ranking: up to a random order's
    # masks that happen to equal its own)
    at.pruning_curve(model, "fc2", x, y, scores, ks=ks, n_random=n_random, batch_size=10**4)
    evaluated, n_ks = sum(seen), len(pruning_curves.check_ks(ks, 16))
    assert costs.distinct_masks(16, n_random, pruning_curves.check_ks(ks, 16), seed=0) == evaluated
    cost = costs.curve_cost(model, "fc2", x, y, ks=ks, n_random=n_random)
    assert (cost.masks, cost.n_orders, cost.n_ks, cost.n_samples, cost.n_neurons) == (
        evaluated, 2 + n_random, n_ks, x.shape[0], 16)
    assert cost.seconds > 0 and 0 <= cost.front_share <= 1


def test_exact_ablation_adds_a_pass_per_neuron_and_a_rule_of_k_is_not_offered(monkeypatch):
    model, x, y = build("residual_conv")
    monkeypatch.setattr(costs, "WORTH_SAYING_SECONDS", 0.0)
    curve = costs.curve_cost(model, "conv1", x, y, ks=evidence_ks, n_random=8)
    n = curve.n_neurons
    assert curve.n_ks == len(evidence_ks(n))
    diagnosis = costs.curve_cost(model, "conv1", x, y, ks=evidence_ks, n_random=8,
                                 exact_ablation=True)
    assert diagnosis.masks == curve.masks + n
    assert not any(choice.option.startswith("--ks") for choice in diagnosis.cheaper)


def test_cheaper_settings_are_priced_below_the_curve_and_named_as_flags(monkeypatch):
    model, x, y = build("residual_mlp")
    x, y = x.repeat(8, 1), y.repeat(8)  # more samples than a sample of CHEAPER_SAMPLES
    monkeypatch.setattr(costs, "WORTH_SAYING_SECONDS", 0.0)
    cost = costs.curve_cost(model, "fc2", x, y, n_random=20)
    options = [choice.option for choice in cost.cheaper]
    assert options == [f"--n-random {costs.CHEAPER_N_RANDOM}",
                       "--ks " + ",".join(map(str, pruning_curves.spaced_ks(
                           16, costs.CHEAPER_K_POINTS))),
                       f"--sample {costs.CHEAPER_SAMPLES}"]
    assert all(choice.seconds <= cost.seconds for choice in cost.cheaper)
    words = cost.words(command_line=True)
    assert f"{cost.masks} masked passes" in words and "--n-random 5 (" in words
    assert "5 random orders (" in cost.words()
    monkeypatch.setattr(costs, "WORTH_SAYING_SECONDS", float("inf"))  # a quick curve
    assert "cheaper" not in costs.curve_cost(model, "fc2", x, y).words()


def test_named_inputs_are_probed_and_scaled_by_their_rows():
    model, x, y = build("residual_mlp")
    named = at.NamedInputs({"x": x})

    class Keyword(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner(x)
    cost = costs.curve_cost(Keyword().eval(), "inner.fc2", named, y, ks=[0, 4], n_random=2)
    assert cost.n_samples == x.shape[0] and cost.masks == costs.distinct_masks(16, 2, [0, 4], 0)


def test_a_diagnosis_is_priced_by_timing_it_on_samples_that_keep_every_cluster(monkeypatch):
    """Where its plan ablates every neuron and draws its curve on every sample, diagnose_cost
    times diagnose itself on one batch and on two (about 5% of the samples, whole batches),
    each keeping every cluster in proportion, after an untimed run on two samples a
    cluster, and extrapolates the time linearly: a diagnosis costing 0.5 s + 1 ms a sample
    is priced at exactly that. The plan is made once, on every sample
    (`diagnose.diagnose_plan`): every timed run ablates as many neurons and draws the same
    curve."""
    from attribution.analyses import diagnose as diagnosis

    clock = [0.0]
    seen = []

    def fake(view, **options):
        plan, x = options["plan"], view.inputs
        seen.append((len(x), sorted(set(view.clusters)), len(view.targets),
                     plan.oracle.neurons))
        clock[0] += 0.5 + 0.001 * len(x)

    def timing(model, layer, x, targets, **options):
        assert len(x) == 10_000 and len(targets) == 10_000
        return 0.2, 0.001, 3072  # every neuron on every sample fits, and the curve

    monkeypatch.setattr(diagnosis, "diagnose_on", fake)
    monkeypatch.setattr(diagnosis, "oracle_timing", timing)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    x, targets = torch.zeros(10_000, 3), torch.zeros(10_000, dtype=torch.long)
    clusters = np.repeat(["a", "b", "c", "d"], [7000, 2000, 900, 100])
    cost = diagnosis.diagnose_cost(None, "fc", x, targets, "gradient", clusters,
                                   n_random=4)
    # each cluster in proportion (rounded), at least two; a timing over
    # REPEAT_WHILE_SECONDS is not repeated
    assert [rows for rows, _, _, _ in seen] == [8, 256, 511]
    assert all(found == ["a", "b", "c", "d"] and n == rows and neurons == 3072
               for rows, found, n, neurons in seen)
    assert cost.seconds == pytest.approx(0.5 + 0.001 * 10_000)
    assert cost.timed == (256, 511) and "timed on 256 and 511 of the 10000" in cost.words()


def test_a_diagnosis_sampled_by_its_plan_is_priced_by_the_plan_and_its_scores_timed(
        monkeypatch):
    """Where its plan measures a share of the samples, diagnose_cost takes exact ablation and
    the evidence curve at the seconds their plan
    says (the plan made once, on every sample: `diagnose.diagnose_plan`), and times the rest
    (the scores, gradients, activations, logits: `diagnose._measure`; the bootstrap and the
    agreement on the scores in the ablation's place) on one batch and on two
    (about 5% of the samples, in whole batches), each keeping every cluster in proportion,
    after an untimed run on two samples a cluster, extrapolated linearly: a measurement
    costing 0.3 s + 1 ms a sample is priced at exactly that, plus the plan. Nothing is
    ablated."""
    from attribution.analyses import diagnose as diagnosis, findings

    clock = [0.0]
    seen = []

    def fake(model, layer, x, targets, method, clusters, codes, options):
        seen.append((len(x), sorted(set(clusters)), len(targets), len(codes)))
        clock[0] += 0.3 + 0.001 * len(x)
        scores = np.random.default_rng(0).normal(size=(len(x), 4))
        return diagnosis._Measured(x, targets, scores, torch.zeros(len(x), 2), scores,
                                   scores, {})

    def timing(model, layer, x, targets, **options):
        assert len(x) == 10_000 and len(targets) == 10_000
        return 2.0, 5.0, 3072  # 32 neurons on a share of the samples

    def never(*args, **kwargs):
        raise AssertionError("the estimate ran exact ablation or a curve")

    monkeypatch.setattr(diagnosis, "_measure", fake)
    monkeypatch.setattr(diagnosis, "_materialise", lambda model, x, targets, size: (x, targets))
    monkeypatch.setattr(diagnosis.View, "placed", lambda view: view.model)
    monkeypatch.setattr(diagnosis, "oracle_timing", timing)
    for name in ("sample_oracle", "diagnose_on"):
        monkeypatch.setattr(diagnosis, name, never)
    monkeypatch.setattr(findings, "pruning_curve", never)  # the evidence curve
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    x, targets = torch.zeros(10_000, 3), torch.zeros(10_000, dtype=torch.long)
    clusters = np.repeat(["a", "b", "c", "d"], [7000, 2000, 900, 100])
    plan = diagnosis.diagnose_plan(None, "fc", x, targets, clusters)
    assert plan.oracle.neurons == 32 and plan.oracle.share < 1 and plan.curve.share < 1
    cost = diagnosis.diagnose_cost(None, "fc", x, targets, "gradient", clusters)
    # each cluster in proportion (rounded), at least two; a timing over
    # REPEAT_WHILE_SECONDS is not repeated
    assert [rows for rows, _, _, _ in seen] == [8, 256, 511]
    assert all(found == ["a", "b", "c", "d"] and n == rows == codes
               for rows, found, n, codes in seen)
    assert cost.planned == (("exact ablation", plan.oracle.seconds),
                            ("the evidence curve", plan.curve.seconds))
    assert cost.seconds == pytest.approx(0.3 + 0.001 * 10_000 + plan.oracle.seconds
                                         + plan.curve.seconds)
    words = cost.words()
    assert words.startswith(f"{costs.seconds_words(cost.seconds)}: exact ablation "
                            f"{costs.seconds_words(plan.oracle.seconds)}, the evidence curve ")
    assert f"as planned, and {costs.seconds_words(10.3)} more (the scores timed on 256 and " \
           "511 of the 10000 samples" in words
    seen.clear()
    exact = diagnosis.diagnose_cost(None, "fc", x, targets, "ablation", clusters, plan=plan)
    assert [what for what, _ in exact.planned] == ["the evidence curve"]  # its scores ablate


def test_a_diagnosis_of_one_batch_is_priced_without_running_it(monkeypatch):
    """On data this small a timed sample would be all of it (`costs.probe_sizes`: at least
    COST_PROBE_ROWS samples, and the ResNet stage's 64 images are one batch): exact
    ablation and the curve
    are taken at their plan's seconds even where they run on every sample, and only the
    rest is timed, so the estimate costs the scores, not the diagnosis."""
    from attribution.analyses import diagnose as diagnosis, findings

    def never(*args, **kwargs):
        raise AssertionError("the estimate ran the diagnosis, exact ablation or a curve")

    for name in ("sample_oracle", "diagnose_on"):
        monkeypatch.setattr(diagnosis, name, never)
    monkeypatch.setattr(findings, "pruning_curve", never)  # the evidence curve
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.ReLU(),
                                torch.nn.Linear(24, 3)).eval()
    x = torch.randn(costs.COST_PROBE_ROWS, 6)
    plan = diagnosis.diagnose_plan(model, "1", x)
    assert plan.oracle.share == plan.curve.share == 1
    cost = diagnosis.diagnose_cost(model, "1", x, plan=plan)
    assert cost.planned == (("exact ablation", plan.oracle.seconds),
                            ("the evidence curve", plan.curve.seconds))
    rows = costs.COST_PROBE_ROWS  # timed on an eighth and a quarter, extrapolated
    assert cost.timed == (rows // 8, rows // 4) and \
        f"the scores timed on {rows // 8} and {rows // 4} of the {rows} samples" in cost.words()


def test_a_scorecard_is_priced_on_samples_with_its_curve_targets_sampled_alike(monkeypatch):
    """scorecard_cost times the scorecard itself on the same stratified samples, its
    per-sample curve targets taken at the same rows as the inputs, and every run ablates
    every neuron on every sample, as planned once per layer."""
    from attribution.analyses import scorecard as card

    clock = [0.0]
    seen = []

    def fake(view, **options):
        x = view.inputs
        curve = options["curve_targets"]
        assert torch.equal(curve, x[:, 0].long()) and options["progress"] is None
        assert options["oracle_neurons"] == {"fc": OraclePlan(2048, 2048, 1.0)}
        seen.append(len(x))
        clock[0] += 0.2 + 0.002 * len(x)

    def sizes(view, layers):
        assert len(view.inputs) == 5_000
        return {"fc": OraclePlan(2048, 2048, 1.0)}

    monkeypatch.setattr(card, "scorecard_on", fake)
    monkeypatch.setattr(card, "scorecard_oracle_plans_on", sizes)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    x = torch.arange(5_000.0)[:, None].repeat(1, 3)
    clusters = np.repeat([0, 1], [4_000, 1_000])
    cost = card.scorecard_cost(None, x, None, clusters, curve_targets=x[:, 0].long(),
                               batch_size=128)
    assert seen == [4, 128, 128, 256]  # a run under REPEAT_WHILE_SECONDS is timed twice
    assert cost.seconds == pytest.approx(0.2 + 0.002 * 5_000)
    assert cost.words().startswith("about 10 s (scorecard timed on 128 and 256 of the 5000")


@pytest.mark.parametrize("per_mask, orders", [
    (1e-2, [1, 4]),  # 32 masks add a measurable 320 ms
    (1e-3, [1, 4, 10]),  # 32 add 32 ms, 80 add 80 ms
    (1e-5, [1, 4, 10, 34]),  # quick masks: 272 of them, four times as many would pass a
    # quarter of the curve's 1,383
])
def test_the_curve_probe_adds_orders_until_their_passes_can_be_timed(per_mask, orders,
                                                                     monkeypatch):
    """A few masked passes of a cheap tail take less time than a timing's noise: the
    probe adds random orders until their passes take MEASURABLE_SECONDS, or a quarter of
    the masks of the curve it prices; the passes' share is then read exactly."""
    clock, seen = [0.0], []

    def fake(model, layer, x, targets, order_of, ks, **options):
        seen.append(len(order_of))
        clock[0] += 0.01 + per_mask * costs._count_masks(order_of, ks)

    monkeypatch.setattr(costs, "order_curves", fake)
    monkeypatch.setattr(costs, "layer_width", lambda *args: 64)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    cost = costs.curve_cost(None, "fc", torch.zeros(1_000, 3), n_random=20)
    assert list(dict.fromkeys(seen)) == orders
    assert cost.seconds_of_masks(cost.masks) == pytest.approx(
        per_mask * cost.masks * 1_000 / 256)


@pytest.mark.parametrize("per_row_mask, rows", [
    (1e-4, [32, 256]),  # 32 passes of the batch: 1.6 s, within PROBE_SECONDS
    (3e-3, [32, 80]),  # 25 s: timed on 80 samples (8 s of passes)
    (1.0, [32]),  # hours: on an eighth of the batch, the fewest it takes, and only there
])
def test_a_slow_tail_is_probed_on_fewer_samples_and_scaled_to_all(per_row_mask, rows,
                                                                  monkeypatch):
    """The probe's first curve runs on an eighth of the first batch; where 32 masked passes
    of the whole batch would pass PROBE_SECONDS, both its curves run on fewer of its
    samples (that eighth at the least: a slow tail never runs a pass of the whole batch),
    and the estimate scales them to every sample: the same seconds as a probe of the whole
    batch gives."""
    clock, seen = [0.0], []

    def fake(model, layer, x, targets, order_of, ks, **options):
        seen.append(len(x))
        clock[0] += len(x) * (1e-4 + per_row_mask * costs._count_masks(order_of, ks))

    monkeypatch.setattr(costs, "order_curves", fake)
    monkeypatch.setattr(costs, "layer_width", lambda *args: 64)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    cost = costs.curve_cost(None, "fc", torch.zeros(1_000, 3), n_random=20, batch_size=256)
    assert list(dict.fromkeys(seen)) == rows
    assert cost.seconds == pytest.approx(1_000 * (1e-4 + per_row_mask * cost.masks))


@pytest.mark.parametrize("share, runs", [(0.25, [2, 256, 256, 512, 512]),
                                         (1.0, [2, 256, 512])])  # 0.56 s and more: once
def test_a_scorecard_whose_oracle_is_sized_to_its_budget_times_only_the_rest(monkeypatch,
                                                                             share, runs):
    """Where a layer's plan measures a sample of its neurons (on every sample, or on a
    share of them), its exact ablation (on the model and on the randomised copy) is taken
    at the plan's seconds, never run, and the rest of the scorecard is timed without the
    ablation method, on stand-in effects of the plan's neurons over the same share of each
    timed sample."""
    from attribution.analyses import scorecard as card

    clock, seen = [0.0], []
    plan = OraclePlan(32, 3072, 0.5, 1.0, share=share, samples=int(10_000 * share),
                      n_samples=10_000)

    def fake(view, **options):
        x = view.inputs
        oracle = options["oracle_neurons"]["h"]
        assert isinstance(oracle, card.OracleSample) and len(oracle.neurons) == 32
        rows = len(x) if oracle.samples is None else len(oracle.samples)
        assert oracle.n_neurons == 3072 and oracle.effects.shape == (rows, 32)
        assert rows == pytest.approx(len(x) * share, abs=2)
        assert options["methods"] == ["gradient", "random"]
        seen.append(len(x))
        clock[0] += 0.3 + 0.001 * rows

    monkeypatch.setattr(card, "scorecard_on", fake)
    monkeypatch.setattr(card, "sample_oracle", None)  # never called
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    x = torch.zeros(10_000, 3)
    cost = card.scorecard_cost(None, x, None, None, methods=["gradient", "ablation", "random"],
                               oracle_neurons={"h": plan})
    assert seen == runs  # runs under REPEAT_WHILE_SECONDS, twice
    assert cost.planned == (("exact ablation of h (twice: the model and its randomised "
                             "copy)", 2 * plan.seconds),)
    assert cost.seconds == pytest.approx(0.3 + 10 * share + 2 * plan.seconds, rel=0.01)
    without = card.scorecard_cost(None, x, None, None, methods=["gradient", "random"],
                                  oracle_neurons={"h": plan})
    assert without.planned == (("exact ablation of h", plan.seconds),)


def test_a_scorecard_of_one_batch_is_priced_on_parts_of_it(monkeypatch):
    """On one batch of samples the rest of the scorecard is timed on an eighth and a
    quarter of them and extrapolated; exact ablation is never run, and the estimate is
    within 1.5x of the scorecard it prices."""
    from attribution.analyses import scorecard as card

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.ReLU(),
                                torch.nn.Linear(24, 3)).eval()
    x = torch.randn(costs.COST_PROBE_ROWS, 6)
    plans = card.scorecard_oracle_plans(model, x, layers=["1"])
    sizes = []
    real = card.scorecard_on

    def counting(view, **options):
        sizes.append(len(view.inputs))
        return real(view, **options)

    monkeypatch.setattr(card, "scorecard_on", counting)
    monkeypatch.setattr(card, "sample_oracle", None)
    cost = card.scorecard_cost(model, x, layers=["1"], methods=["gradient", "ablation"],
                               oracle_neurons=plans)
    assert sizes == [2, 8, 8, 16, 16] and cost.timed == (8, 16)
    assert "as planned" in cost.words() and "timed on 8 and 16 of the 64 samples" \
        in cost.words()


def test_a_scorecard_uses_an_oracle_given_and_refuses_one_of_other_samples():
    """An oracle already measured (`sample_oracle`) serves the scorecard as the one it
    would measure; one measured on other samples is refused."""
    model, x, y = build("residual_mlp")
    oracle = at.sample_oracle(model, "fc2", x, y, 8)
    given = at.scorecard(model, x, y, layers=["fc2"], methods=["gradient", "ablation"],
                         oracle_neurons={"fc2": oracle})
    measured = at.scorecard(model, x, y, layers=["fc2"], methods=["gradient", "ablation"],
                            oracle_neurons=8)
    pd.testing.assert_frame_equal(given, measured)
    with pytest.raises(at.AttributionError, match="does not fit these"):
        at.scorecard(model, x[:-1], y[:-1], layers=["fc2"], oracle_neurons={"fc2": oracle})


@pytest.mark.parametrize("total, batch_size, sizes", [
    (100_000, 256, (256, 4864)),  # about 1/20 of the samples, in whole batches
    (4_800, 256, (256, 512)),  # at least two batches
    (3_000, 256, (256, 256)),  # no room for two batches within a quarter of the work
    (1_000, 256, (256, 256)),
    (300, 256, (64, 64)),  # under two batches: an eighth, at least 64
    (40, 256, (40, 40)),
])
def test_the_samples_timed_are_whole_batches_and_a_quarter_of_the_work_at_most(total,
                                                                               batch_size,
                                                                               sizes):
    small, large = costs.probe_sizes(total, batch_size)
    assert (small, large) == sizes
    assert small + large <= max(total / 4, 2 * small)


def fake_work(monkeypatch, seconds_per_sample: float, fixed: float = 0.0) -> list[int]:
    """A work of `fixed` + `seconds_per_sample` a sample on a fake clock; the rows of each
    run."""
    clock, seen = [0.0], []
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])

    def run(sample) -> None:
        rows = len(sample(torch.zeros(total, 1)))
        seen.append(rows)
        clock[0] += fixed + seconds_per_sample * rows
    total = 10_000
    return run, seen


def test_a_quick_work_is_said_as_an_upper_bound_from_one_sample(monkeypatch):
    run, seen = fake_work(monkeypatch, 1e-4, fixed=0.1)  # 1.1 s in all
    cost = costs.sampled_cost("diagnose", run, torch.zeros(10_000, 1))
    assert seen == [2, 256, 256] and cost.bound  # the short timing twice, no larger one
    assert cost.seconds == pytest.approx((0.1 + 0.0256) * 10_000 / 256)  # >= the 1.1 s
    assert cost.words().startswith("at most 5 s (diagnose timed on 256 of the 10000")


def test_a_work_with_no_room_for_a_second_size_is_bounded_from_part_of_it(monkeypatch):
    run, seen = fake_work(monkeypatch, 0.1, fixed=1.0)  # a slow model: 1 s + 0.1 s a sample
    cost = costs.sampled_cost("scorecard", run, torch.zeros(300, 1))
    assert seen == [2, 64] and cost.bound  # never all of it
    assert cost.seconds == pytest.approx((1.0 + 6.4) * 300 / 64)  # >= the 31 s it takes
    assert cost.words().startswith("at most 35 s (scorecard timed on 64 of the 300 samples")


@pytest.mark.parametrize("priced_in", [0.0, 40.0, 500.0])
def test_the_pruning_pages_budget_is_the_whole_wait_its_estimate_included(priced_in):
    """The Pruning page's curves fit PAGE_CURVE_SECONDS less what their estimate took: a
    curve whose full size (about 4 min here) passes the budget keeps fewer k the longer it
    was priced, and none is planned over what is left."""
    from attribution.analyses.settings import PAGE_CURVE_SECONDS, AnalysisSettings

    clusters = np.repeat([0, 1], 200)
    settings = AnalysisSettings(layer="fc", cluster=0)
    masks = costs.distinct_masks(1024, settings.n_random, settings.curve_ks(1024),
                                 settings.seed)
    cost = costs.CurveCost(seconds=240.0, n_samples=400, n_neurons=1024,
                           n_orders=settings.n_random + 2, n_ks=129, masks=masks,
                           front_share=0.0, cheaper=(), priced_in=priced_in)
    plan = settings.curve_plan(cost, clusters)
    left = max(PAGE_CURVE_SECONDS - priced_in, 0.0)
    assert plan.budget == left and plan.reduced
    assert plan.seconds <= left or (plan.points == costs.FEWEST_CURVE_POINTS
                                    and plan.samples < plan.n_samples)
    assert settings.curve_plan(cost, clusters, full=True).points == plan.full_points
