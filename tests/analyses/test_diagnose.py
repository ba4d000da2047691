"""The degeneracy check: every finding fires on a model built to trigger it, and stays quiet on
a healthy one, and catches the user's own hand-written loops (seeds 000 and 002, in
tests/support/diagnosis.py)."""
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses.findings import CHECKS, SEVERITIES
from tests.support import references
from tests.support.diagnosis import (WIDTH, HandSetNet, LeakyGradientAttribution, data,
                                     seed_000_stale_gradient_loop, seed_002_whole_batch_loop,
                                     seed_002_whole_batch_rows)
from tests.support.models import build
from attribution.analyses import settings
from attribution.analyses.verdict import verdict
from tests.support.families import family, trained_cnn1d


def by_code(findings):
    return {finding.code: finding for finding in findings}


def healthy_run(**kwargs):
    model, (x, y) = HandSetNet().eval(), data()
    return by_code(at.diagnose(model, "fc", x, y, "gradient", y.numpy(), **kwargs))


# ------------------------------------------------------------------------- healthy case

WITHOUT_SUM_OR_CAPTURE = [code for code in CHECKS
                          if code not in ("incomplete_integral", "suspicious_gradient_capture")]
"""The checks of a method without a sum, given no scores of one's own."""


def test_a_healthy_model_gets_all_ok_in_check_order():
    findings = at.diagnose(HandSetNet().eval(), "fc", *data(), "gradient", data()[1].numpy())
    assert [finding.code for finding in findings] == WITHOUT_SUM_OR_CAPTURE
    for finding in findings:
        assert finding.severity == "ok", finding
        assert finding.message and finding.hint == ""


def test_findings_carry_a_severity_a_sentence_a_value_and_a_hint():
    model, (x, y) = HandSetNet().eval(), data()
    findings = at.diagnose(model, "fc", x, y, "gradient")  # both classes in one cluster
    for finding in findings:
        assert finding.severity in SEVERITIES and isinstance(finding.value, float)
        assert finding.message.endswith(".")
        assert (finding.hint != "") == (finding.severity != "ok")


# -------------------------------------------------------------------------------- checks

def test_sign_cancellation_on_a_mixed_class_cluster():
    model, (x, y) = HandSetNet().eval(), data()
    mixed = by_code(at.diagnose(model, "fc", x, y, "gradient"))["sign_cancellation"]
    assert mixed.severity == "problem" and mixed.value == pytest.approx(0.0, abs=1e-6)
    assert "mean_abs" in mixed.hint
    per_class = healthy_run()["sign_cancellation"]
    assert per_class.severity == "ok" and per_class.value == pytest.approx(1.0)
    magnitudes = by_code(at.diagnose(model, "fc", x, y, "gradient", reduce="mean_abs"))
    assert magnitudes["sign_cancellation"].severity == "ok"


def test_sign_cancellation_warning_when_a_quarter_of_the_mass_has_the_other_sign():
    model, (x, _) = HandSetNet().eval(), data()
    targets = (torch.arange(40) % 3 == 0).long()  # 26 of class 0, 14 of class 1: |26-14|/40
    finding = by_code(at.diagnose(model, "fc", x, targets, "gradient"))["sign_cancellation"]
    assert finding.severity == "warning"
    assert finding.value == pytest.approx(12 / 40, abs=1e-6)


@pytest.mark.parametrize("layer", ["fc", "relu"])
def test_dead_neurons_from_a_bias_pushed_hugely_negative(layer):
    model, (x, y) = HandSetNet().eval(), data()
    with torch.no_grad():
        model.fc.bias[[1, 6]] = -1e4
    finding = by_code(at.diagnose(model, layer, x, y, "gradient", y.numpy()))["dead_neurons"]
    assert finding.severity == "warning" and finding.value == pytest.approx(2 / WIDTH)
    assert "neurons 1, 6" in finding.message
    if layer == "fc":  # pre-activation: only the gradient is 0, the output is far from it
        assert "neurons 1, 6 have a nonzero output, but the gradient of every logit" in \
            finding.message and "output exactly 0" not in finding.message
    else:
        assert "neurons 1, 6 output exactly 0." in finding.message and "gradient" not in \
            finding.message
    with torch.no_grad():
        model.fc.bias[:5] = -1e4
    finding = by_code(at.diagnose(model, layer, x, y, "gradient"))["dead_neurons"]
    assert finding.severity == "problem" and finding.value == pytest.approx(6 / WIDTH)


def test_the_other_logits_of_an_output_layer_are_not_dead_neurons():
    model, dataset = at.load_demo("digits_mlp")
    threes = dataset.labels == 3  # one class: only logit 3 moves the target
    x, y = dataset.inputs[threes], dataset.labels[threes]
    assert (at.neuron_scores(model.module, "out", x, y, "gradient") == 0).all(0).sum() == 9
    finding = by_code(at.diagnose(model.module, "out", x, y, "gradient"))["dead_neurons"]
    assert finding.severity == "ok" and finding.value == 0.0


def test_a_dead_conv_channel_is_found_and_every_check_runs_on_conv_layers():
    model, x, y = build("residual_conv")
    with torch.no_grad():
        model.bn1.bias[2] = -1e4  # channel 2 of relu's output is 0 at every position
    findings = at.diagnose(model, "relu", x, y, "gradient_x_activation", y.numpy())
    assert [finding.code for finding in findings] == WITHOUT_SUM_OR_CAPTURE
    dead = by_code(findings)["dead_neurons"]
    assert dead.severity == "warning" and "neuron 2 outputs exactly 0" in dead.message


def test_neurons_silent_on_one_cluster_only_are_reported_but_not_flagged():
    model, (x, y) = HandSetNet().eval(), data()
    with torch.no_grad():
        model.fc.weight[3] = torch.tensor([100.0, 0.0])  # on only where x0 > -0.02
        model.fc.bias[3] = 2.0
    clusters = np.where(x[:, 0].numpy() > 0, "positive", "negative")
    finding = by_code(at.diagnose(model, "fc", x, y, "gradient", clusters))["dead_neurons"]
    assert finding.severity == "ok" and "silent on this cluster only" in finding.message
    assert "'negative'" in finding.message


def test_tiny_scores_relative_to_the_logit_scale_and_to_float_precision():
    model, (x, y) = HandSetNet().eval(), data()
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([5.0, -5.0]))  # the logit scale, independent of fc
        model.head.weight.mul_(3e-4)
    small = by_code(at.diagnose(model, "fc", x, y, "gradient", y.numpy()))["tiny_scores"]
    assert small.severity == "warning" and 1.2e-4 < small.value < 0.01 / WIDTH
    with torch.no_grad():
        model.head.weight.mul_(1e-6)
    rounding = by_code(at.diagnose(model, "fc", x, y, "gradient_x_activation",
                                   y.numpy()))["tiny_scores"]
    assert rounding.severity == "problem" and rounding.value < 1.2e-4
    assert healthy_run()["tiny_scores"].severity == "ok"


def test_constant_scores_when_every_neuron_outputs_the_same():
    model, (x, y) = HandSetNet().eval(), data()
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.fill_(1.0)
    finding = by_code(at.diagnose(model, "fc", x, y, "activation", y.numpy()))["constant_scores"]
    assert finding.severity == "problem" and finding.value == 0.0
    assert healthy_run()["constant_scores"].severity == "ok"


def test_non_finite_scores_stop_the_other_checks():
    model, (x, y) = HandSetNet().eval(), data()
    with torch.no_grad():
        model.head.weight[0, 2] = float("nan")
    findings = at.diagnose(model, "fc", x, y, "gradient")
    assert [(f.code, f.severity) for f in findings] == [("non_finite", "problem")]
    # class 0's logit is NaN on every sample (0 * NaN at neuron 2): the samples are named
    assert findings[0].value == 1.0
    assert "logits are NaN or inf on samples 0, 1, 2" in findings[0].message
    assert healthy_run()["non_finite"].severity == "ok"


def test_random_scores_are_not_better_than_random():
    model, (x, y) = HandSetNet().eval(), data()
    verdicts = [by_code(at.diagnose(model, "fc", x, y, "random", y.numpy(), cluster=0,
                                    seed=seed))["not_better_than_random"]
                for seed in range(5)]
    assert sum(finding.severity != "ok" for finding in verdicts) >= 4
    assert healthy_run()["not_better_than_random"].value == 1.0


def test_a_ranking_reversed_against_the_ablation_oracle_disagrees():
    model = nn.Sequential(nn.Linear(2, 6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():  # activations rise 1..6, effects on logit 0 fall as 1/z
        model[0].weight.zero_()
        model[0].bias.copy_(torch.arange(1.0, 7.0))
        model[2].weight.copy_(torch.stack([1 / torch.arange(1.0, 7.0) ** 2, torch.zeros(6)]))
        model[2].bias.zero_()
    x, y = data()[0], torch.zeros(40, dtype=torch.long)
    finding = by_code(at.diagnose(model.eval(), "1", x, y, "activation"))
    assert finding["disagrees_with_ablation"].severity == "problem"
    assert finding["disagrees_with_ablation"].value == pytest.approx(-1.0)
    assert finding["not_better_than_random"].severity == "problem"
    assert healthy_run()["disagrees_with_ablation"].value == pytest.approx(1.0)


# ------------------------------------------------------------- the user's gradient code

def capture(model, user_scores, **kwargs):
    x, y = data()
    return by_code(at.diagnose(model, "fc", x, y, "gradient", user_scores=user_scores,
                               **kwargs))["suspicious_gradient_capture"]


def test_the_correct_per_sample_loop_matches_the_engine():
    model, (x, y) = HandSetNet().eval(), data()
    per_sample = references.per_sample_gradient(model, model.fc, x, y)
    finding = capture(model, per_sample)
    assert finding.severity == "ok" and finding.value < 1e-6
    assert capture(model, per_sample.mean(0).numpy()).severity == "ok"  # a cluster mean [n]


def test_the_whole_batch_loop_of_seed_002_is_caught_and_named():
    model, (x, y) = HandSetNet().eval(), data()
    scores = seed_002_whole_batch_loop(model, model.fc, x, y)
    finding = capture(model, scores)
    assert finding.severity == "problem"
    assert "divided by 40" in finding.message and "inputs[i].unsqueeze(0)" in finding.message
    rows = capture(model, seed_002_whole_batch_rows(model, model.fc, x, y))
    assert rows.severity == "problem" and "whole batch" in rows.message


def test_stale_gradients_accumulating_across_backward_calls_are_caught():
    model, (x, y) = HandSetNet().eval(), data()
    model.zero_grad()
    finding = capture(model, seed_000_stale_gradient_loop(model, model.fc, x, y))
    assert finding.severity == "problem" and "accumulate" in finding.message
    model.zero_grad()
    cluster_mean = seed_000_stale_gradient_loop(model, model.fc, x, y).mean(0)
    assert "accumulate" in capture(model, cluster_mean).message


def test_hooks_appended_across_calls_are_caught():
    model, (x, y) = HandSetNet().eval(), data()
    attribution = LeakyGradientAttribution(model)
    first = attribution.attribute(model.fc, x, y)
    assert capture(HandSetNet().eval(), first).severity == "ok"  # its weights, no hooks
    second = attribution.attribute(model.fc, x, y)
    with pytest.raises(at.AttributionError, match="Backward hooks are registered on 'fc'"):
        capture(model, second)  # the leaky model itself: its hooks would change our gradients
    finding = capture(HandSetNet().eval(), second)  # the same weights, without the hooks
    assert finding.severity == "problem" and finding.value == 3.0
    assert "hooks registered by earlier calls" in finding.message


def test_a_capture_array_of_the_wrong_shape_is_a_user_error():
    model = HandSetNet().eval()
    with pytest.raises(at.AttributionError, match=r"\[40, 8\]"):
        capture(model, np.zeros((40, 5)))
    with pytest.raises(at.AttributionError, match="one row per sample"):
        capture(model, np.zeros((41, 8)))


# ----------------------------------------------------------------------------- plumbing

def test_one_cluster_is_analysed_alone_when_named():
    model, (x, y) = HandSetNet().eval(), data()
    one = by_code(at.diagnose(model, "fc", x, y, "gradient", y.numpy(), cluster=1,
                              user_scores=references.per_sample_gradient(
                                  model, model.fc, x[y == 1], y[y == 1])))
    assert all(finding.severity == "ok" for finding in one.values())
    assert not one["sign_cancellation"].message.startswith("Cluster")
    every_row = references.per_sample_gradient(model, model.fc, x, y)  # all 40 samples' rows
    taken = by_code(at.diagnose(model, "fc", x, y, "gradient", y.numpy(), cluster=1,
                                user_scores=every_row))["suspicious_gradient_capture"]
    assert taken.severity == "ok" and taken.value < 1e-6


def test_a_raising_progress_propagates_and_leaves_the_model_untouched():
    model, (x, y) = HandSetNet(), data()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    updates = []

    def stop(fraction, findings):
        updates.append(fraction)
        if fraction >= 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        at.diagnose(model, "fc", x, y, "gradient", progress=stop)
    assert model.training and all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert updates == sorted(updates)


@pytest.mark.parametrize("change,match", [
    (dict(method="saliency"), "Unknown method"),
    (dict(reduce="median"), "reduce"),
    (dict(targets="all"), "one target per sample"),
    (dict(cluster=0), "clusters="),
    (dict(clusters=np.arange(40) % 2, cluster=7), "7 is not among"),
])
def test_user_mistakes_raise_one_actionable_error(change, match):
    model, (x, y) = HandSetNet().eval(), data()
    arguments = dict(targets=y)
    arguments.update(change)
    targets = arguments.pop("targets")
    with pytest.raises(at.AttributionError, match=match):
        at.diagnose(model, "fc", x, targets, **arguments)


class ZeroGammaNet(nn.Module):
    """conv -> BatchNorm whose gamma starts at 0 (timm's zero_init_last) -> ReLU -> head."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)
        nn.init.zeros_(self.bn.weight)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_live_channels_behind_a_zero_batchnorm_gamma_are_named_with_the_zero():
    torch.manual_seed(0)
    model, x = ZeroGammaNet().eval(), torch.randn(20, 1, 6, 6)
    assert (at.neuron_scores(model, "conv", x, None, "activation") != 0).all()  # live outputs
    finding = by_code(at.diagnose(model, "conv", x, None, "gradient"))["dead_neurons"]
    assert finding.severity == "problem"
    assert "neurons 0, 1, 2, 3 have a nonzero output, but the gradient of every logit" in \
        finding.message
    assert "a zero weight after this layer: bn.weight (4 of 4 channels)" in finding.message
    assert "output exactly 0" not in finding.message


API_WORDS = re.compile(r"reduce=|metric=|mean_abs|target_logit|gradient_x_activation|"
                       r"sign_cancellation|integrated_gradients")


def test_findings_speak_the_api_to_the_cli_and_the_screen_to_the_dashboard():
    model, dataset = at.load_demo("digits_mlp")
    findings = at.diagnose(model.module, "relu1", dataset.inputs[:200], dataset.labels[:200],
                           "gradient", reduce="mean")
    cancellation = by_code(findings)["sign_cancellation"]
    assert cancellation.severity != "ok"
    assert "reduce='mean_abs'" in cancellation.hint and "gradient_x_activation" in \
        cancellation.hint
    assert "mean |·|" in cancellation.words(screen=True)[1]
    assert "gradient × activation" in cancellation.words(screen=True)[1]
    assert "target logit" in by_code(findings)["not_better_than_random"].words(screen=True)[0]
    assert "metric='target_logit'" in by_code(findings)["not_better_than_random"].message
    for finding in findings:
        assert finding.words(screen=False) == (finding.message, finding.hint)
        for text in finding.words(screen=True):
            assert not API_WORDS.search(text), text
            assert "«" not in text and "«" not in finding.message + finding.hint


@pytest.mark.parametrize("method,reduce", [("gradient_x_activation", "mean"),
                                           ("gradient", "mean_abs")])
def test_the_evidence_curve_is_returned_as_the_diagnosis_page_drew_it(method, reduce):
    """not_better_than_random carries the pruning curve it measured: the curve the Diagnosis
    page (pages/diagnosis.py, `cluster_curve`) computed again from the page's own scores."""
    from attribution.analyses.pruning_curves import spaced_ks
    from attribution.presentation import plots

    loaded, dataset = at.load_demo("digits_mlp")
    model, layer = loaded.module, "relu2"
    focus = dataset.labels.numpy() == 3  # the page: the focus cluster's rows of every sample
    inputs, targets = dataset.inputs[torch.from_numpy(focus)], dataset.labels[focus]
    findings = by_code(at.diagnose(model, layer, inputs, targets, method, reduce=reduce,
                                   batch_size=256))  # as pages/common.py's _findings
    main = at.neuron_scores(model, layer, dataset.inputs, dataset.labels, method,
                            batch_size=256).numpy()[focus]
    row = plots.neuron_summary(main, reduce, method)["score"].to_numpy()
    drawn = at.pruning_curve(model, layer, inputs, targets, row, ks=spaced_ks(len(row), 32),
                             metric="target_logit")
    curve = findings["not_better_than_random"].curve
    pd.testing.assert_frame_equal(curve, drawn, rtol=1e-5, atol=1e-6)
    assert curve.attrs["metric"] == "target_logit" and curve.attrs["n_samples"] == focus.sum()
    assert all(finding.curve is None for code, finding in findings.items()
               if code != "not_better_than_random")


def test_among_clusters_the_evidence_curve_is_the_reported_clusters():
    model, (x, y) = HandSetNet().eval(), data()
    clusters = np.where(np.arange(40) < 30, "big", "small")
    finding = by_code(at.diagnose(model, "fc", x, y, "gradient", clusters,
                                  n_random=4))["not_better_than_random"]
    reported = re.match(r"Cluster '(\w+)'", finding.message).group(1)
    assert finding.curve.attrs["n_samples"] == (clusters == reported).sum()
    assert list(finding.curve["k"]) == list(range(WIDTH + 1))


class BarelyUsed(nn.Module):
    """A layer whose contribution to the logits is scaled down to a millionth of the rest:
    its curves are flat, whatever ranks its neurons."""

    def __init__(self):
        super().__init__()
        self.direct = nn.Linear(5, 3)
        self.fc, self.act, self.out = nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x):
        return self.direct(x) + 1e-6 * self.out(self.act(self.fc(x)))


def test_a_flat_output_leads_the_verdict_and_is_never_called_usable():
    torch.manual_seed(0)
    model, x = BarelyUsed().eval(), torch.randn(60, 5)
    findings = at.diagnose(model, "act", x, None, "gradient_x_activation")
    flat = next(f for f in findings if f.code == "flat_output")
    assert flat.severity == "problem" and flat.value < 1e-5
    assert "removing any of its neurons (all of them included) moves the metric='target_logit'" \
        in flat.message and "random weights" in flat.hint
    assert [f.code for f in findings][:2] == ["non_finite", "flat_output"]
    answer = verdict(findings, method="gradient_x_activation", reduce="mean")
    assert answer.severity == "problem" and answer.cause == "flat_output"
    assert answer.headline.startswith("The model's output does not depend on this layer")


def test_beats_random_and_inside_the_band_never_meet():
    """Over models of several families (trained, random weights, flat), a ranking called
    better than random has a curve beyond the random band somewhere, and one whose curve
    never leaves the band is not called better than random."""
    cases = [(trained_cnn1d()[:2], "2"), (family("separable_cnn"), "se.act")]
    for name in ("transformer_encoder", "cnn1d"):
        model, x = family(name)
        cases.append(((model, x), settings.default_layer(at.list_layers(model, x[:2]))))
    cases.append(((BarelyUsed().eval(), torch.randn(60, 5)), "act"))
    seen, inside = set(), 0
    for (model, x), layer in cases:
        for method in ("gradient", "gradient_x_activation"):
            finding = next(f for f in at.diagnose(model, layer, x[:120], None, method)
                           if f.code == "not_better_than_random")
            summary = at.curve_summary(finding.curve).iloc[0]
            seen.add(finding.severity)
            assert not ("beats random" in finding.message and "never beyond" in finding.message)
            if finding.severity == "ok":
                assert summary["outside_band"] > 0 and summary["p_value"] <= 0.1
            if summary["outside_band"] == 0:
                inside += 1
                assert finding.severity != "ok" and "never beyond" in finding.message
    assert "ok" in seen and inside  # both sides of the rule were met


def test_the_smallest_p_that_the_orders_allow_is_said_to_be_so():
    model, x, y = trained_cnn1d()
    finding = next(f for f in at.diagnose(model, "2", x, y, "gradient_x_activation")
                   if f.code == "not_better_than_random")
    assert finding.p_value == pytest.approx(1 / 21)
    assert "permutation p = 0.048, the smallest 20 random orders can give" in finding.message
    oracle = next(f for f in at.diagnose(model, "2", x, y, "gradient_x_activation")
                  if f.code == "disagrees_with_ablation")
    assert "p = 0)" not in oracle.message and "random ranking of 16 neurons" in oracle.message
