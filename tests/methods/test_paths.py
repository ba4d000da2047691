"""Path methods check their own sum: a sample's integrated gradients sum over the layer to
F(z) - F(0), its conductance to F(x) - F(0) where the layer carries every path. Samples that
miss by more than 1% are integrated again (integrated gradients with more steps, conductance
by bisecting its path); what still misses is reported, by the API (`ScoreFacts.sums`),
`diagnose`, the command line and the dashboard."""
import numpy as np
import pandas as pd
import pytest
import torch
from captum.attr import LayerConductance
from torch import nn

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution import cli
from attribution.methods.paths import (MAX_STEPS_FACTOR, SUM_FLOOR, SUM_TOLERANCE,
                                          sum_check)
from tests.support import references
from tests.support.app import assert_clean, run_app


class LayerNormMLP(nn.Module):
    """A tabular MLP: (Linear -> LayerNorm -> GELU) twice, with Dropout, then a Linear.
    LayerNorm ignores the scale of its input, so along 0 -> z at fc1 the logit jumps near 0:
    few nodes miss the jump."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm1 = nn.Linear(12, 32), nn.LayerNorm(32)
        self.drop = nn.Dropout(0.1)
        self.fc2, self.norm2 = nn.Linear(32, 16), nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def tail(self, z):
        """The model after fc1."""
        hidden = self.drop(nn.functional.gelu(self.norm1(z)))
        return self.out(nn.functional.gelu(self.norm2(self.fc2(hidden))))

    def forward(self, x):
        return self.tail(self.fc1(x))


class Bypass(nn.Module):
    """The input also reaches the output around fc1: conductance's sum does not apply there."""

    def __init__(self):
        super().__init__()
        self.fc1, self.skip, self.out = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.fc1(x)) + self.skip(x))


@pytest.fixture(scope="module")
def layer_norm_case():
    torch.manual_seed(0)
    model = LayerNormMLP().eval()
    x = torch.randn(24, 12)
    with torch.no_grad():
        logits = model(x)
        targets = logits.argmax(1)
        at_zero = model.tail(torch.zeros_like(model.fc1(x)))
    difference = (logits - at_zero).gather(1, targets[:, None])[:, 0]
    return model, x, targets, difference


def share(scores: torch.Tensor, difference: torch.Tensor) -> torch.Tensor:
    return (scores.sum(1) - difference).abs() / difference.abs().clamp_min(SUM_FLOOR)


def test_integrated_gradients_before_a_layernorm_meet_their_sum(layer_norm_case):
    """64 Gauss-Legendre nodes miss F(z) - F(0) by more than 10% on some samples; the engine
    takes more steps for those, and every sample is within 1%, equal to the slow loop at the
    steps it took."""
    model, x, targets, difference = layer_norm_case
    plain = references.integrated_gradients(model, model.fc1, x, targets, 64)
    assert share(plain, difference).max() > 0.10
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "fc1", x, targets, "integrated_gradients", n_steps=64,
                            facts=facts)
    assert share(ours, difference).max() <= SUM_TOLERANCE
    steps = facts.sums.steps
    assert (steps == 64).any() and steps.max() > 64
    torch.testing.assert_close(
        ours, references.integrated_gradients(model, model.fc1, x, targets, steps),
        rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(facts.sums.gap, (difference - ours.sum(1)).numpy(),
                               atol=1e-5)
    np.testing.assert_allclose(facts.sums.difference, difference.numpy(), rtol=1e-5)
    checked = sum_check(facts.sums, 64)
    assert checked.n_missing == 0 and checked.n_refined == int((steps > 64).sum())
    finding = next(f for f in at.diagnose(model, "fc1", x, targets, "integrated_gradients",
                                          n_steps=64) if f.code == "incomplete_integral")
    assert finding.severity == "ok" and "took more than the 64 steps" in finding.message


def test_a_sum_the_step_budget_cannot_meet_is_reported(layer_norm_case):
    """One step, so at most MAX_STEPS_FACTOR: the samples that still miss are counted and
    their gaps handed back; diagnose warns and says to raise n_steps."""
    model, x, targets, difference = layer_norm_case
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "fc1", x, targets, "integrated_gradients", n_steps=1,
                            facts=facts)
    missing = share(ours, difference) > SUM_TOLERANCE
    assert missing.any() and facts.sums.steps.max() <= MAX_STEPS_FACTOR
    checked = sum_check(facts.sums, 1)
    assert checked.n_missing == int(missing.sum())
    assert checked.worst == pytest.approx(float(share(ours, difference).max()), rel=1e-4)
    finding = next(f for f in at.diagnose(model, "fc1", x, targets, "integrated_gradients",
                                          n_steps=1) if f.code == "incomplete_integral")
    assert finding.severity == "warning"
    assert f"For {checked.n_missing} of 24 samples" in finding.message
    assert "Raise n_steps" in finding.hint and "--n-steps" in finding.hint


def test_every_class_is_checked(layer_norm_case):
    model, x, _, _ = layer_norm_case
    facts = ScoreFacts()
    scores = at.neuron_scores(model, "fc1", x, "all", "integrated_gradients", n_steps=16,
                              facts=facts)
    assert facts.sums.gap.shape == (24, 4) and scores.shape == (24, 4, 32)
    assert facts.sums.steps.max() > 16
    with torch.no_grad():
        difference = model(x) - model.tail(torch.zeros_like(model.fc1(x)))
    shares = (scores.sum(2) - difference).abs() / difference.abs().clamp_min(SUM_FLOOR)
    assert shares.max() <= SUM_TOLERANCE


def test_conductance_where_a_path_bypasses_the_layer_is_not_refined():
    """With a path around fc1 the sum F(x) - F(0) does not hold at any number of steps: the
    engine does not chase it (steps as asked, equal to Captum), and reports no gap (NaN)."""
    torch.manual_seed(1)
    model, x = Bypass().eval(), torch.randn(20, 6)
    targets = model(x).argmax(1)
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "fc1", x, targets, "conductance", n_steps=8, facts=facts)
    assert np.isnan(facts.sums.gap).all() and (facts.sums.steps == 8).all()
    expected = LayerConductance(model, model.fc1).attribute(x, target=targets, n_steps=8)
    torch.testing.assert_close(ours, expected.detach().float(), rtol=1e-4, atol=1e-5)
    checked = sum_check(facts.sums, 8)
    assert checked.n_bypassed == 20 and checked.n_samples == 0


def test_conductance_integrates_the_samples_that_miss_their_sum_again():
    """A smooth MLP: Captum's conductance at 32 steps misses F(x) - F(0) by more than 1% on
    some samples (its sum converges only as 1/steps). Those samples are integrated again by
    bisection; every sample then meets its sum, the others equal Captum at 32 steps, and the
    refined ones are nearer the integral (Captum at 4,096 steps) than Captum at 32."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    x = torch.randn(20, 6) * 2
    targets = torch.arange(20) % 3
    with torch.no_grad():
        difference = (model(x) - model(torch.zeros_like(x))).gather(1, targets[:, None])[:, 0]
    captum = {steps: LayerConductance(model, model[0]).attribute(
        x, target=targets, n_steps=steps).detach().float() for steps in (32, 4096)}
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "0", x, targets, "conductance", n_steps=32, facts=facts)
    refined = torch.from_numpy(np.asarray(facts.sums.steps) > 32)
    assert (share(captum[32], difference) > SUM_TOLERANCE).equal(refined)
    assert refined.any() and not refined.all()
    torch.testing.assert_close(ours[~refined], captum[32][~refined], rtol=1e-4, atol=1e-5)
    assert share(ours, difference).max() <= SUM_TOLERANCE
    assert sum_check(facts.sums, 32).n_missing == 0
    error = (ours - captum[4096])[refined].abs().amax(1)
    assert (error < (captum[32] - captum[4096])[refined].abs().amax(1)).all()
    scale = float(captum[4096].abs().max())
    torch.testing.assert_close(ours[refined], captum[4096][refined], rtol=0, atol=0.01 * scale)
    np.testing.assert_allclose(facts.sums.gap, (difference - ours.sum(1)).numpy(), atol=1e-5)


class ReluNet(nn.Module):
    """Two convs and ReLUs: along the path a x the ReLUs switch one after another, and each
    switch costs Captum's sum the jump it makes times a step."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 3), nn.Conv2d(6, 8, 3)
        self.out = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        hidden = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.out(hidden.flatten(1))


@pytest.mark.parametrize("targets", ["labels", "all"])
def test_conductance_bisects_the_path_where_relus_switch(targets):
    """Most samples of a ReLU net miss their sum at 16 steps, and 10 still miss it at 128
    (Captum's, 8x the rows); bisecting the intervals where the gradient jumps brings every
    one within 1% for under 3x the rows of 16 steps (counted as the rows the model ran). For
    every class at once each class's sum must hold, the small differences too: under 8x."""
    torch.manual_seed(3)
    model, x = ReluNet().eval(), torch.randn(40, 1, 8, 8) * 3
    targets = torch.arange(40) % 5 if targets == "labels" else "all"
    rows = []
    model.conv1.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    facts = ScoreFacts()
    at.neuron_scores(model, "conv2", x, targets, "conductance", n_steps=16, facts=facts,
                     batch_size=40)
    checked = sum_check(facts.sums, 16)
    assert checked.n_refined > 20 and checked.n_missing == 0
    assert sum(rows) < (8 if isinstance(targets, str) else 3) * 40 * 17
    if not isinstance(targets, str):
        with torch.no_grad():
            difference = (model(x) - model(torch.zeros_like(x))).gather(
                1, targets[:, None])[:, 0]
        captum = LayerConductance(model, model.conv2).attribute(x, target=targets, n_steps=128)
        assert (share(captum.detach().flatten(2).sum(-1), difference) > SUM_TOLERANCE).sum() >= 5
    assert (np.asarray(facts.sums.steps) <= 16 * MAX_STEPS_FACTOR).all()


def test_conductance_reports_what_its_step_budget_cannot_meet():
    """At 2 steps a sample may take 32 intervals: the ReLU net's samples that still miss
    are counted, with their gaps, and never returned as if they met their sum."""
    torch.manual_seed(3)
    model, x = ReluNet().eval(), torch.randn(40, 1, 8, 8) * 3
    targets = torch.arange(40) % 5
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "conv2", x, targets, "conductance", n_steps=2, facts=facts)
    with torch.no_grad():
        difference = (model(x) - model(torch.zeros_like(x))).gather(1, targets[:, None])[:, 0]
    missing = share(ours, difference) > SUM_TOLERANCE
    checked = sum_check(facts.sums, 2)
    assert missing.any() and checked.n_missing == int(missing.sum())
    assert np.asarray(facts.sums.steps).max() <= 2 * MAX_STEPS_FACTOR
    np.testing.assert_allclose(facts.sums.gap, (difference - ours.sum(1)).numpy(), atol=1e-4)


def test_the_command_line_counts_the_samples_that_miss_per_cluster(layer_norm_case, tmp_path,
                                                                   capsys):
    model, x, targets, difference = layer_norm_case
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "m.pt2")
    labels = np.arange(len(x)) % 2
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), labels=labels)
    common = ("score", "--model", tmp_path / "m.pt2", "--data", tmp_path / "d.npz",
              "--layer", "fc1", "--targets", "predicted", "--clusters", "label",
              "--trust-code")
    code = cli.main([str(a) for a in (*common, "--method", "integrated_gradients",
                                      "--n-steps", "1", "--out", tmp_path / "s.csv")])
    err = capsys.readouterr().err
    assert code == 0, err
    table = pd.read_csv(tmp_path / "s.csv")
    per_cluster = table.groupby("cluster")["sum_missing"].first()
    scores = at.neuron_scores(model, "fc1", x, targets, "integrated_gradients", n_steps=1)
    missing = (share(scores, difference) > SUM_TOLERANCE).numpy()
    assert per_cluster.to_dict() == {c: int(missing[labels == c].sum()) for c in (0, 1)}
    assert f"{int(missing.sum())} of 24 samples' scores miss F(z) - F(0)" in err
    code = cli.main([str(a) for a in (*common, "--method", "gradient", "--out",
                                      tmp_path / "g.csv")])
    assert code == 0 and "sum_missing" not in pd.read_csv(tmp_path / "g.csv")


def test_the_scores_page_says_whether_the_integral_met_its_sum():
    app = run_app({"method": "integrated_gradients"})
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    said = " ".join(caption.value for caption in app.caption)
    assert "integrated gradients scores sum to F(z) - F(0) at the layer within 1%" in said


def test_conductance_holds_at_most_its_intervals_budget(monkeypatch):
    """Each interval keeps z and dF/dz at both ends, so the intervals held at once are
    bounded (MAX_INTERVALS_FACTOR per node of the batch's first pass, or INTERVALS_MEMORY):
    at a tight budget the samples that met their sum let theirs go, rounds split only what
    fits, and a sample that could not be finished is reported, not returned as if it met
    its sum."""
    from attribution.methods import paths

    torch.manual_seed(3)
    model, x = ReluNet().eval(), torch.randn(40, 1, 8, 8) * 3
    targets = torch.arange(40) % 5
    held = []
    append = paths._Intervals.append

    def counted(self, *args):
        append(self, *args)
        held.append(self.size)

    monkeypatch.setattr(paths._Intervals, "append", counted)
    free_facts = ScoreFacts()
    at.neuron_scores(model, "conv2", x, targets, "conductance", n_steps=16, facts=free_facts,
                     batch_size=40)
    assert max(held) > 2 * 17 * 40  # INTERVALS_MEMORY holds more than 2 per node here
    monkeypatch.setattr(paths, "MAX_INTERVALS_FACTOR", 1.1)
    monkeypatch.setattr(paths, "INTERVALS_MEMORY", 0)
    held.clear()
    facts = ScoreFacts()
    ours = at.neuron_scores(model, "conv2", x, targets, "conductance", n_steps=16,
                            facts=facts, batch_size=40)
    assert max(held) <= 1.1 * 17 * 40
    with torch.no_grad():
        difference = (model(x) - model(torch.zeros_like(x))).gather(1, targets[:, None])[:, 0]
    checked = sum_check(facts.sums, 16)
    assert checked.n_missing == int((share(ours, difference) > SUM_TOLERANCE).sum())
    assert checked.n_missing >= sum_check(free_facts.sums, 16).n_missing
