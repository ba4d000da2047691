"""Paths where a plausible-looking number would hide what really happened: each gives the
right numbers or an AttributionError that says what happened."""
import numpy as np
import pytest
import torch
import torch.nn.utils.prune
from captum.testing.helpers.basic_models import BasicModel_MultiLayer
from torch import nn

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution.engine.runners import select as runner_selection
from attribution.engine.guards import eval_mode
from attribution.engine.runners import FxRunner, HookRunner, runner_for
from attribution.methods.registry import REGISTRY

from tests.support.models import ResidualMLP, build, groups, methods_scoring

GRADIENT_METHODS = tuple(name for name in at.method_names() if REGISTRY[name].uses_gradients)
with torch.device("meta"):  # its modules, not weights: which methods score it
    LINEAR_METHODS = methods_scoring("Linear", model=ResidualMLP())  # the layers here: Linear
MLP_GRADIENT_METHODS = tuple(name for name in LINEAR_METHODS if REGISTRY[name].uses_gradients)


class DetachedTail(nn.Module):
    """The head reads fc1's output through .detach(): gradients stop, the effect does not."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)).detach())


@pytest.mark.parametrize("method", GRADIENT_METHODS)
@pytest.mark.parametrize("frozen", [False, True])
def test_a_detached_tail_is_named_not_scored_zero(method, frozen):
    """An AttributionError that names the cut, neither zeros (frozen parameters) nor torch's
    'appears to not have been used' error."""
    torch.manual_seed(0)
    model = DetachedTail().eval()
    for parameter in model.parameters():
        parameter.requires_grad_(not frozen)
    x = torch.randn(12, 10)
    assert at.neuron_scores(model, "fc1", x, None, "ablation").abs().sum() > 0  # it matters
    with pytest.raises(at.AttributionError, match="cuts the graph after this layer"):
        at.neuron_scores(model, "fc1", x, None, method, n_steps=4)


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_a_layer_the_logits_do_not_use_is_named_not_scored_zero(method):
    """Captum's unused-layer model: `relu` runs but the output uses `multi_relu`."""
    model = BasicModel_MultiLayer(multi_input_module=True)
    x = torch.tensor([[3.0, 4.0, 0.0], [1.0, -2.0, 5.0]])
    assert at.neuron_scores(model, "relu", x, None, "ablation").abs().sum() == 0
    with pytest.raises(at.AttributionError, match="do not depend on layer 'relu'"):
        at.neuron_scores(model, "relu", x, torch.tensor([0, 1]), method, n_steps=4)


@pytest.mark.parametrize("method", LINEAR_METHODS)
def test_frozen_parameters_give_the_same_scores(method):
    model, x, y = build("residual_mlp")
    expected = at.neuron_scores(model, "fc1", x, y, method, n_steps=8,
                                 clusters=groups(x))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, method, n_steps=8,
                                 clusters=groups(x)),
                               expected)


def test_a_sample_with_nan_logits_gets_nan_gradient_scores_and_is_named_by_diagnose():
    """The NaN sample's gradient scores are NaN (not finite), the others finite, and diagnose
    names the sample."""
    model, x, y = build("residual_mlp")
    x = x.clone()
    x[[3, 17]] = float("nan")
    for method in MLP_GRADIENT_METHODS + ("ablation",):
        scores = at.neuron_scores(model, "fc1", x, y, method, n_steps=4)
        assert not torch.isfinite(scores[[3, 17]]).any(), method
        others = torch.ones(len(x), dtype=torch.bool)
        others[[3, 17]] = False
        assert torch.isfinite(scores[others]).all(), method
    (finding,) = at.diagnose(model, "fc1", x, y, "gradient")
    assert (finding.code, finding.severity) == ("non_finite", "problem")
    assert "logits are NaN or inf on samples 3, 17" in finding.message
    assert finding.value == pytest.approx(2 / len(x))


def test_an_infinite_logit_makes_only_the_scores_that_read_it_nan():
    """Class 0's logit is +inf everywhere: gradients of class 0 are NaN, of the other
    classes exact; diagnose names the samples even for activation, which reads no logit."""
    model, x, y = build("residual_mlp")
    reference = at.neuron_scores(model, "fc2", x, "all", "gradient")
    with torch.no_grad():
        model.out.bias[0] = float("inf")
    scores = at.neuron_scores(model, "fc2", x, "all", "gradient")
    assert torch.isnan(scores[:, 0]).all()
    torch.testing.assert_close(scores[:, 1:], reference[:, 1:])
    (finding,) = at.diagnose(model, "fc2", x, y, "activation", cluster=None)
    assert finding.code == "non_finite" and "samples 0, 1, 2" in finding.message
    assert finding.value == 1.0


def test_the_sample_ids_of_non_finite_logits_are_positions_in_the_inputs():
    model, x, y = build("residual_mlp")
    x = x.clone()
    x[5] = float("inf")
    clusters = np.arange(len(x)) % 2  # sample 5 is in cluster 1, as its 3rd member
    (finding,) = at.diagnose(model, "fc1", x, y, "gradient", clusters, cluster=1)
    assert "logits are NaN or inf on sample 5;" in finding.message


def test_a_pruning_curve_refuses_samples_with_nan_logits():
    """Refused, naming the sample: an accuracy curve would count it as correct or wrong at
    random."""
    model, x, y = build("residual_mlp")
    x = x.clone()
    x[7] = float("nan")
    with pytest.raises(at.AttributionError, match="NaN or inf on sample.s. 7 before"):
        at.pruning_curve(model, "fc1", x, y, np.arange(16.0), n_random=2)


def test_a_forward_hook_on_the_model_counts_on_both_runners_even_when_added_later():
    """A forward hook on the model added after the fx runner was cached still counts: the
    layer moves to the hook runner and the scores double."""
    model, x, y = build("residual_mlp")
    plain = at.neuron_scores(model, "fc1", x, y, "gradient")
    with eval_mode(model):
        assert isinstance(runner_for(model, "fc1", model.fc1, x), FxRunner)
    handle = model.register_forward_hook(lambda module, args, output: 2 * output)
    try:
        doubled = at.neuron_scores(model, "fc1", x, y, "gradient")
        with eval_mode(model):
            assert isinstance(runner_for(model, "fc1", model.fc1, x), HookRunner)
    finally:
        handle.remove()
    torch.testing.assert_close(doubled, 2 * plain)


def test_forward_hooks_on_submodules_and_pre_hooks_count_the_same_on_both_runners():
    """Forward hooks are part of the model's function: both runners see them (e.g.
    torch.nn.utils.prune's pre-hook)."""
    results = {}
    for name in ("fx", "hooks"):
        model, x, y = build("residual_mlp")
        torch.nn.utils.prune.l1_unstructured(model.fc2, "weight", amount=0.5)
        model.out.register_forward_hook(lambda module, args, output: output - output.mean())
        model.fc1.register_forward_hook(lambda module, args, output: 1.5 * output)  # the layer
        with eval_mode(model):
            runner = runner_for(model, "fc1", model.fc1, x)
            if name == "hooks":
                runner = HookRunner(model, "fc1", model.fc1)
                runner.n_classes, runner.layer_size = 3, 16
                runner_selection._CACHE[model]["fc1"] = runner
        results[name] = {method: at.neuron_scores(model, "fc1", x, y, method, n_steps=4,
                                 clusters=groups(x))
                         for method in LINEAR_METHODS}
    for method in LINEAR_METHODS:
        torch.testing.assert_close(results["fx"][method], results["hooks"][method])


@pytest.mark.parametrize("register", [
    lambda model: model.fc1.register_full_backward_pre_hook(lambda m, grad: (3 * grad[0],)),
    lambda model: model.out.register_full_backward_hook(lambda m, gin, gout: (5 * gin[0],)),
    lambda model: model.register_full_backward_hook(lambda m, gin, gout: None),
], ids=["pre-hook on the layer", "hook after the layer", "hook on the model"])
@pytest.mark.parametrize("runner_kind", ["fx", "hooks"])
def test_backward_hooks_are_refused_for_gradients_on_both_runners(register, runner_kind):
    """A backward hook changes gradients without changing the model's derivatives (x3 on the
    hook runner but x1 on fx for a pre-hook on the layer, x5 on both for a hook after it), so
    gradient methods refuse it on both runners; activation and ablation are unaffected."""
    model, x, y = build("residual_mlp")
    expected = {method: at.neuron_scores(model, "fc1", x, y, method, n_steps=4)
                for method in ("activation", "ablation")}
    if runner_kind == "hooks":
        with eval_mode(model):
            runner = HookRunner(model, "fc1", model.fc1)
            runner.n_classes, runner.layer_size = 3, 16
            runner_selection._CACHE[model]["fc1"] = runner
    handle = register(model)
    try:
        for method in MLP_GRADIENT_METHODS:
            with pytest.raises(at.AttributionError, match="Backward hooks are registered"):
                at.neuron_scores(model, "fc1", x, y, method, n_steps=4)
        for method, scores in expected.items():  # no gradient, nothing to refuse
            torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, method), scores)
    finally:
        handle.remove()
    at.neuron_scores(model, "fc1", x, y, "gradient")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_every_method_runs_a_model_of_another_float_dtype(dtype):
    """Every method, integrated_gradients and conductance included (their interpolation steps
    take the model's dtype), scores float64, float16 and bfloat16 models as float32. Enough
    steps that the path methods' sums hold in every dtype: near 1% a rounding could send one
    dtype's sample to more steps than the other's. Their sum checks come back as NumPy
    floats (bfloat16 has no NumPy dtype: it crashed the sums there)."""
    model, x, y = build("residual_mlp")
    tolerance = {torch.float64: 1e-5, torch.float16: 2e-2, torch.bfloat16: 0.15}[dtype]
    cast = build("residual_mlp")[0].to(dtype)
    for method in LINEAR_METHODS:
        expected = at.neuron_scores(model, "fc1", x, y, method, n_steps=32,
                                 clusters=groups(x))
        facts = ScoreFacts()
        scores = at.neuron_scores(cast, "fc1", x, y, method, n_steps=32,
                                 clusters=groups(x), facts=facts)
        assert scores.dtype == torch.float32
        if REGISTRY[method].sums_to is not None:
            assert facts.sums.gap.dtype in (np.float32, np.float64)
        if method == "active_fraction":  # a step at z = 0: a value near it may round across
            assert (scores != expected).float().mean() <= 0.05
            continue
        scale = expected.abs().max()
        assert (scores - expected).abs().max() <= tolerance * scale, method


def test_a_model_on_the_meta_device_is_refused_with_what_to_do():
    """An AttributionError that says what to do (to_empty), not torch's 'Tensor.item() cannot
    be called on meta tensors'."""
    with torch.device("meta"):
        model = ResidualMLP()
    x, y = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    for call in (lambda: at.neuron_scores(model, "fc1", x, y, "gradient"),
                 lambda: at.pruning_curve(model, "fc1", x, y, np.arange(16.0)),
                 lambda: at.diagnose(model, "fc1", x, y, "gradient")):
        with pytest.raises(at.AttributionError, match="meta device.*to_empty"):
            call()


def test_inputs_that_require_grad_are_scored_the_same_and_get_no_grad():
    model, x, y = build("residual_mlp")
    expected = {method: at.neuron_scores(model, "fc1", x, y, method, n_steps=4,
                                 clusters=groups(x))
                for method in LINEAR_METHODS}
    leaf = x.clone().requires_grad_(True)
    for method in LINEAR_METHODS:
        torch.testing.assert_close(at.neuron_scores(model, "fc1", leaf, y, method, n_steps=4,
                                 clusters=groups(x)),
                                   expected[method])
    assert leaf.grad is None and all(p.grad is None for p in model.parameters())


def test_a_model_left_in_train_mode_with_dropout_scores_as_in_eval_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))
    x = torch.randn(20, 6)
    expected = {method: at.neuron_scores(model.eval(), "0", x, None, method, n_steps=4,
                                 clusters=groups(x))
                for method in LINEAR_METHODS}
    model.train()
    for method in LINEAR_METHODS:
        torch.testing.assert_close(at.neuron_scores(model, "0", x, None, method, n_steps=4,
                                 clusters=groups(x)),
                                   expected[method])
    assert model.training


class NanAtTheRealInput(nn.Module):
    """Logits are NaN where the hidden sum reaches `limit`: set just under a sample's own sum,
    only the real input (alpha = 1) is NaN; every interpolation step of integrated gradients
    (z scaled) and conductance (x scaled; no bias) stays finite."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6, bias=False)
        self.out = nn.Linear(6, 2)
        self.register_buffer("limit", torch.tensor(float("inf")))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        logits = self.out(h)
        return torch.where(h.sum(1, keepdim=True) >= self.limit, float("nan"), logits)


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_a_logit_that_is_nan_only_at_the_real_input_gives_nan_path_scores(method):
    """NaN path scores for the samples whose logit is NaN at the real input, even though the
    interpolation steps never reach alpha = 1; finite scores for the others."""
    torch.manual_seed(0)
    model = NanAtTheRealInput().eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        sums = torch.relu(model.fc1(x)).sum(1)
        model.limit.fill_(float(sums[1]) * (1 - 1e-6))  # sample 1 (and larger sums) only
    broken = sums >= model.limit
    assert broken[1] and not broken.all()
    scores = at.neuron_scores(model, "fc1", x, torch.zeros(3, dtype=torch.long), method,
                              n_steps=16)
    assert torch.isnan(scores[broken]).all()
    assert torch.isfinite(scores[~broken]).all()


@pytest.mark.parametrize("targets", ["labels", "all"])
def test_finite_logits_whose_sum_overflows_keep_their_gradients(targets):
    """The NaN/inf check is decided by one sum of the differentiated logits: logits near
    float32's largest value are finite although their sum is inf, so the exact check runs and
    must leave every gradient as it is (the bias moves no gradient)."""
    model, x, y = build("residual_mlp")
    chosen = y if targets == "labels" else "all"
    expected = at.neuron_scores(model, "fc2", x, chosen, "gradient")
    with torch.no_grad():
        model.out.bias.fill_(3e38)
    logits = model(x)
    assert torch.isfinite(logits).all() and not torch.isfinite(logits.sum())
    torch.testing.assert_close(at.neuron_scores(model, "fc2", x, chosen, "gradient"), expected)
