"""The engine: every registered method, against independent references and invariants."""
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from captum.attr import LayerActivation, LayerConductance, LayerGradientXActivation
from torch import nn

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution.engine.runners import FxRunner, HookRunner, runner_for
from attribution.engine.guards import eval_mode
from attribution.methods import paths
from attribution.methods.paths import gauss_legendre
from attribution.methods.registry import REGISTRY

from tests.support import references
from tests.support.models import (ResidualMLP, SequenceNet, ThreeBranchNet, TokenNet,
                                  UntraceableSequenceNet, build, groups, methods_scoring)

ARCHITECTURES = ["residual_mlp", "residual_conv", "branching", "untraceable"]
LAYERS = {"residual_mlp": ["fc1", "bn", "fc2"], "residual_conv": ["conv1", "conv2"],
          "branching": ["left.0", "right.0"], "untraceable": ["fc1"]}
CASES = [(arch, layer) for arch in ARCHITECTURES for layer in LAYERS[arch]]


with torch.device("meta"):  # the methods that score these models (lrp: see test_lrp.py)
    EVERY_METHOD = methods_scoring("Linear", "Conv2d", model=ResidualMLP())


@pytest.fixture(params=EVERY_METHOD)
def method(request):
    return request.param


def captum_scores(model, module, x, targets, method, n_steps=32):
    """Captum's per-position attribution reduced to one value per neuron (our convention)."""
    if method == "gradient":
        result = LayerGradientXActivation(model, module, multiply_by_inputs=False).attribute(
            x, target=targets)
    elif method == "gradient_x_activation":
        result = LayerGradientXActivation(model, module).attribute(x, target=targets)
    elif method == "activation":
        # Captum's LayerActivation keeps the live output tensor, which an in-place ReLU after
        # the layer (fc2 -> ReLU(inplace=True) here) overwrites; it matches wherever nothing does.
        result = LayerActivation(model, module).attribute(x)
        if any(getattr(m, "inplace", False) for m in model.modules()):
            result = references.layer_output(model, module, x)
        return result.flatten(2).mean(2) if result.dim() > 2 else result
    elif method == "conductance":
        result = LayerConductance(model, module).attribute(x, target=targets, n_steps=n_steps)
    else:
        raise KeyError(method)
    return result.detach().flatten(2).sum(2) if result.dim() > 2 else result.detach()


# ---------------------------------------------------------------- independent references

@pytest.mark.parametrize("arch,layer", CASES)
@pytest.mark.parametrize("name", ["gradient", "activation", "gradient_x_activation", "conductance"])
def test_matches_captum(arch, layer, name):
    """Equal to Captum; a path method's sample against Captum at the steps it took (more
    than 16 where 16 missed its sum). Conductance integrates a sample that missed by
    bisecting its path (`references.assert_conductance_matches`)."""
    model, x, y = build(arch)
    module = dict(model.named_modules())[layer]
    facts = ScoreFacts()
    ours = at.neuron_scores(model, layer, x, y, name, n_steps=16, batch_size=16, facts=facts)
    steps = facts.sums.steps if facts.sums else np.full(len(x), 16)
    if name == "conductance":
        references.assert_conductance_matches(ours, steps, 16, lambda rows, n_steps: (
            captum_scores(model, module, x[rows], y[rows], name, n_steps=n_steps)))
        return
    expected = torch.empty_like(ours)
    for n_steps in np.unique(steps):
        rows = torch.from_numpy(np.flatnonzero(steps == n_steps))
        expected[rows] = captum_scores(model, module, x[rows], y[rows], name,
                                       n_steps=int(n_steps)).float()
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch,layer", CASES)
def test_integrated_gradients_matches_per_sample_loop(arch, layer):
    model, x, y = build(arch)
    x, y = x[:6], y[:6]
    module = dict(model.named_modules())[layer]
    facts = ScoreFacts()
    ours = at.neuron_scores(model, layer, x, y, "integrated_gradients", n_steps=8, batch_size=4,
                            facts=facts)
    expected = references.integrated_gradients(model, module, x, y, facts.sums.steps)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch,layer", CASES)
def test_ablation_matches_per_sample_per_neuron_loop(arch, layer):
    model, x, y = build(arch)
    x, y = x[:8], y[:8]
    module = dict(model.named_modules())[layer]
    ours = at.neuron_scores(model, layer, x, y, "ablation", batch_size=3)
    expected = references.ablation(model, module, x, y)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch,layer", CASES)
def test_gradient_matches_correct_hand_written_loop(arch, layer):
    model, x, y = build(arch)
    module = dict(model.named_modules())[layer]
    expected = references.per_sample_gradient(model, module, x[:10], y[:10])
    torch.testing.assert_close(at.neuron_scores(model, layer, x[:10], y[:10], "gradient"), expected,
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch,layer", [("residual_mlp", "fc2"), ("residual_conv", "conv2")])
def test_integrated_gradients_completeness(arch, layer):
    """sum_j IG_j = F(x) - F(x with the layer output set to 0), up to quadrature error."""
    model, x, y = build(arch)
    module = dict(model.named_modules())[layer]
    scores = at.neuron_scores(model, layer, x, y, "integrated_gradients", n_steps=64)
    with torch.no_grad():
        full = model(x).gather(1, y[:, None])[:, 0]
        with references.replaced_output(module, torch.zeros_like):
            zeroed = model(x).gather(1, y[:, None])[:, 0]
    torch.testing.assert_close(scores.sum(1), full - zeroed, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("n", [1, 2, 7, 32, 33, 64, 256, 1024])
def test_gauss_legendre_nodes_equal_numpys_without_calling_numpys_lapack(n, monkeypatch):
    """Equal to NumPy's leggauss to float32 rounding, computed in torch: NumPy's LAPACK call
    woke its OpenBLAS threads, which spun beside torch's and slowed the next batches 3x."""
    nodes, weights = np.polynomial.legendre.leggauss(n)
    paths._gauss_legendre_on_cpu.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("NumPy's LAPACK is called")
    monkeypatch.setattr(np.linalg, "eigvalsh", refuse)
    monkeypatch.setattr(np.polynomial.legendre, "leggauss", refuse)
    ours_weights, alphas = gauss_legendre(n)
    assert ours_weights.dtype == alphas.dtype == torch.float32
    np.testing.assert_allclose(ours_weights.double(), 0.5 * weights, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(alphas.double(), 0.5 * (nodes + 1), rtol=0, atol=6e-8)
    assert (alphas.diff() > 0).all() and abs(float(ours_weights.double().sum()) - 1) < 1e-6


def test_hand_set_weights_give_literal_scores():
    """z = x (identity), F_1 = 3 relu(z_0) + 4 relu(z_1): at x = (1, -1) everything is exact."""
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(2))
        model[2].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    x, y = torch.tensor([[1.0, -1.0]]), torch.tensor([1])
    expected = {
        "gradient": [3.0, 0.0],
        "activation": [1.0, -1.0],
        "gradient_x_activation": [3.0, 0.0],
        "integrated_gradients": [3.0, 0.0],
        "ablation": [3.0, 0.0],
    }
    for name, values in expected.items():
        torch.testing.assert_close(at.neuron_scores(model, "0", x, y, name),
                                   torch.tensor([values]), msg=name)
    # Captum's conductance integrates over the Gauss-Legendre nodes alpha_0 .. alpha_S, which
    # stop short of 0 and 1, so it recovers 3 * (alpha_S - alpha_0) rather than exactly 3.
    _, alphas = gauss_legendre(33)
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "conductance", n_steps=32),
                               torch.tensor([[3.0 * float(alphas[-1] - alphas[0]), 0.0]]))
    all_classes = at.neuron_scores(model, "0", x, "all", "gradient")
    torch.testing.assert_close(all_classes, torch.tensor([[[1.0, 0.0], [3.0, 0.0]]]))


def test_conv_channel_conventions():
    """A conv neuron is a channel: gradients summed over positions, activations averaged."""
    model = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.Flatten(), nn.Linear(8, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1))
        model[2].weight.copy_(torch.ones(2, 8))
    x = torch.arange(4.0).view(1, 1, 2, 2)  # positions 0, 1, 2, 3
    y = torch.tensor([0])
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "gradient"),
                               torch.tensor([[4.0, 4.0]]))
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "activation"),
                               torch.tensor([[1.5, 3.0]]))
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "ablation"),
                               torch.tensor([[6.0, 12.0]]))


# ---------------------------------------------------------------- every registered method

@pytest.mark.parametrize("arch,layer", [("residual_mlp", "fc2"), ("residual_conv", "conv1")])
def test_every_method_shape_dtype_and_batch_size_independence(method, arch, layer):
    model, x, y = build(arch)
    options = dict(clusters=groups(x), n_steps=8)
    small = at.neuron_scores(model, layer, x, y, method, batch_size=7, **options)
    large = at.neuron_scores(model, layer, x, y, method, batch_size=64, **options)
    assert small.dtype == torch.float32 and small.device.type == "cpu"
    assert small.shape[0] == x.shape[0]
    torch.testing.assert_close(small, large, rtol=1e-4, atol=1e-5)
    assert torch.isfinite(small).all()


def test_every_method_all_classes_equals_one_class_at_a_time(method):
    model, x, _ = build("residual_mlp")
    if REGISTRY[method].fit is not None:  # fitted to clusters: it scores no class
        with pytest.raises(at.AttributionError, match="scores clusters, not classes"):
            at.neuron_scores(model, "fc2", x, "all", method, clusters=groups(x))
        return
    every = at.neuron_scores(model, "fc2", x, "all", method, n_steps=8)
    assert every.shape == (x.shape[0], 3, 16)
    if method == "random":
        assert not torch.equal(every[:, 0], every[:, 1])
        return
    for c in range(3):
        one = at.neuron_scores(model, "fc2", x, torch.full((x.shape[0],), c), method, n_steps=8)
        torch.testing.assert_close(every[:, c], one, rtol=1e-4, atol=1e-5)


def test_every_method_predicted_class_when_targets_is_none(method):
    model, x, _ = build("branching")
    predicted = model(x).argmax(1)
    torch.testing.assert_close(at.neuron_scores(model, "right.0", x, None, method, n_steps=8,
                                                clusters=groups(x)),
                               at.neuron_scores(model, "right.0", x, predicted, method, n_steps=8,
                                                clusters=groups(x)))


def _model_state(model):
    return {
        "training": [m.training for m in model.modules()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     for m in model.modules()),
        "grads": [p.grad for p in model.parameters()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "buffers": [b.detach().clone() for b in model.buffers()],
    }


def _assert_same_state(before, after):
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"] == 0
    assert all(g is None for g in after["grads"])
    assert after["requires_grad"] == before["requires_grad"]
    for a, b in zip(before["params"] + before["buffers"], after["params"] + after["buffers"]):
        assert torch.equal(a, b)


def test_every_method_leaves_model_and_inputs_untouched(method):
    model, x, y = build("residual_conv")
    model.train()
    model.conv2.eval()  # mixed modes must come back exactly
    before, x_before = _model_state(model), x.clone()
    at.neuron_scores(model, "conv2", x, y, method, n_steps=4, clusters=groups(x))
    at.cluster_scores(model, "conv2", x, y, y.numpy() % 2, method, n_steps=4)
    _assert_same_state(before, _model_state(model))
    assert torch.equal(x, x_before)


def test_every_method_interrupted_by_progress_leaves_model_untouched(method):
    model, x, y = build("residual_mlp")
    model.train()
    before = _model_state(model)

    def stop(fraction):
        raise KeyboardInterrupt("user pressed stop")

    with pytest.raises(KeyboardInterrupt):
        at.neuron_scores(model, "fc2", x, y, method, batch_size=8, progress=stop,
                         clusters=groups(x))
    with pytest.raises(KeyboardInterrupt):
        at.cluster_scores(model, "fc2", x, y, y.numpy(), method, batch_size=8, progress=stop)
    _assert_same_state(before, _model_state(model))


def test_progress_reports_increasing_fractions_up_to_one():
    model, x, y = build("residual_mlp")
    seen = []
    at.neuron_scores(model, "fc1", x, y, "gradient", batch_size=16, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == 3


def test_eval_mode_is_used_even_when_the_caller_is_in_train_mode():
    model, x, y = build("residual_mlp")
    expected = at.neuron_scores(model, "fc2", x, y, "gradient")
    model.train()
    torch.testing.assert_close(at.neuron_scores(model, "fc2", x, y, "gradient"), expected)
    assert model.training and model.bn.training


def test_threads_sharing_one_model_get_sequential_results():
    model, x, y = build("residual_conv")
    model.train()  # every call must still compute in eval mode, and train mode come back
    jobs = [(layer, name) for layer in ("conv1", "conv2") for name in
            ("gradient", "integrated_gradients", "ablation", "activation")]
    expected = {job: at.neuron_scores(model, job[0], x, y, job[1], n_steps=8) for job in jobs}
    results, errors = {}, []

    def work(job, repeat):
        try:
            results[job, repeat] = at.neuron_scores(model, job[0], x, y, job[1], n_steps=8,
                                                    batch_size=5)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(job, r)) for r in range(3) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for (job, _), value in results.items():
        torch.testing.assert_close(value, expected[job], rtol=1e-4, atol=1e-5)
    assert model.training and _model_state(model)["hooks"] == 0


def test_threads_on_the_hook_path_do_not_see_each_others_hooks():
    model, x, y = build("untraceable")
    with eval_mode(model):
        assert isinstance(runner_for(model, "fc1", model.fc1, x), HookRunner)
    expected = {name: at.neuron_scores(model, "fc1", x, y, name)
                for name in ("gradient", "ablation")}
    results, barrier = [], threading.Barrier(6)

    def work(name):
        barrier.wait()
        for _ in range(5):
            results.append((name, at.neuron_scores(model, "fc1", x, y, name, batch_size=4)))

    threads = [threading.Thread(target=work, args=(n,)) for n in ("gradient", "ablation") * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 30
    for name, value in results:
        torch.testing.assert_close(value, expected[name])


# ---------------------------------------------------------------- runners

def test_fx_runner_is_used_for_traceable_models_and_reproduces_them():
    model, x, y = build("residual_conv")
    with eval_mode(model):
        runner = runner_for(model, "conv1", model.conv1, x)
        assert isinstance(runner, FxRunner)
        z, state, logits = runner.capture(x)
        torch.testing.assert_close(logits, model(x))
        stacked = runner.tail(torch.cat([z, torch.zeros_like(z)]), state, 2)
        torch.testing.assert_close(stacked[:x.shape[0]], model(x))


class BatchSizeInTheTail(nn.Module):
    """The tail reshapes by the batch size read before the layer: stacked variants break it."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        batch = x.shape[0]
        return self.fc2(torch.relu(self.fc1(x))).reshape(batch, 3)


def test_a_split_that_cannot_stack_variants_falls_back_quietly(capfd):
    torch.manual_seed(0)
    model, x = BatchSizeInTheTail().eval(), torch.randn(8, 4)
    y = torch.randint(0, 3, (8,))
    with eval_mode(model):
        assert isinstance(runner_for(model, "fc1", model.fc1, x), HookRunner)
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "ablation"),
                               references.ablation(model, model.fc1, x, y))
    assert capfd.readouterr().err == ""  # no traceback from the failed fx check


def test_exported_program_keeps_layer_names_and_scores(tmp_path):
    model, x, y = build("residual_mlp")
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.unflatten(torch.export.load(tmp_path / "model.pt2"))
    names = [info.name for info in at.list_layers(loaded, x[:2])]
    assert {"fc1", "fc2", "out"} <= set(names)
    for name in ("gradient", "ablation", "integrated_gradients"):
        torch.testing.assert_close(at.neuron_scores(loaded, "fc2", x, y, name, n_steps=8),
                                   at.neuron_scores(model, "fc2", x, y, name, n_steps=8),
                                   rtol=1e-4, atol=1e-5)
    with eval_mode(loaded):
        assert isinstance(runner_for(loaded, "fc2", loaded.fc2, x), FxRunner)


def test_cached_runners_do_not_keep_a_model_alive():
    import gc
    import weakref

    model, x, y = build("residual_mlp")
    at.neuron_scores(model, "fc2", x, y, "ablation")
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


class InPlaceAfterLayer(nn.Module):
    """fc1 -> ReLU(inplace=True): the op after the layer overwrites its output tensor."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_an_in_place_op_after_the_layer_does_not_change_what_is_captured():
    torch.manual_seed(0)
    model, x = InPlaceAfterLayer().eval(), torch.randn(40, 6)
    y = torch.randint(0, 3, (40,))
    with torch.no_grad():
        z = model.fc1(x)
    assert (z < 0).any()
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "activation"), z)
    curve = at.pruning_curve(model, "fc1", x, y, torch.arange(8.0), ks=[8], n_random=1,
                             ablation="mean", metric="target_logit")
    with torch.no_grad():  # every unit replaced by its mean over the inputs
        expected = model.fc2(torch.relu(z.mean(0)).expand(40, 8)).gather(1, y[:, None]).mean()
    assert curve["ranked"].iloc[0] == pytest.approx(float(expected), abs=1e-6)


class UndifferentiableAfterLayer(nn.Module):
    """`h += skip(x)`, relu_(h), h.mul_(2): mul_ overwrites what relu's backward needs."""

    def __init__(self):
        super().__init__()
        self.fc1, self.skip, self.fc2 = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc1(x)
        h += self.skip(x)
        h = torch.relu_(h)
        h.mul_(2)
        return self.fc2(h)


def test_a_model_autograd_cannot_differentiate_gets_a_clear_message_not_a_traceback():
    torch.manual_seed(0)
    model, x = UndifferentiableAfterLayer().eval(), torch.randn(7, 4)
    y = torch.randint(0, 3, (7,))
    with pytest.raises(RuntimeError, match="inplace operation"):  # plain autograd fails too
        model(x.requires_grad_(True)).sum().backward()
    x = x.detach()
    for name in (m for m in at.method_names() if REGISTRY[m].uses_gradients):
        with pytest.raises(at.AttributionError, match="in-place operation.*ablation"):
            at.neuron_scores(model, "fc1", x, y, name, batch_size=3)
    with torch.no_grad():  # gradient-free methods are exact, in-place ops and all
        z = model.fc1(x)
        torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "activation"), z)
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "ablation", batch_size=3),
                               references.ablation(model, model.fc1, x, y), rtol=1e-4, atol=1e-6)


class ScaleReadTwice(nn.Module):
    """A learned per-unit scale [8] read before the layer and again after it."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * self.scale
        return self.head(torch.relu(self.fc2(h)) * self.scale)


@pytest.mark.parametrize("batch_size", [32, 8, 40])
def test_a_parameter_the_size_of_a_batch_is_not_taken_for_per_sample_data(batch_size):
    torch.manual_seed(0)
    model, x = ScaleReadTwice().eval(), torch.randn(40, 5)  # the last batch of 32 has 8 rows
    y = torch.randint(0, 3, (40,))
    torch.testing.assert_close(
        at.neuron_scores(model, "fc2", x, y, "ablation", batch_size=batch_size),
        references.ablation(model, model.fc2, x, y), rtol=1e-4, atol=1e-6)
    at.pruning_curve(model, "fc2", x, y, torch.arange(8.0), n_random=2, batch_size=batch_size)


class Tempered(InPlaceAfterLayer):
    """Logits divided by a temperature buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("temperature", torch.ones(3))

    def forward(self, x):
        return super().forward(x) / self.temperature


def test_a_replaced_submodule_or_buffer_is_used_by_the_next_call():
    torch.manual_seed(0)
    model, x = InPlaceAfterLayer().eval(), torch.randn(10, 6)
    y = torch.randint(0, 3, (10,))
    at.neuron_scores(model, "fc1", x, y, "gradient")
    model.fc2 = nn.Linear(8, 3)  # e.g. a retrained head
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "gradient"),
                               references.per_sample_gradient(model, model.fc1, x, y))
    torch.testing.assert_close(at.neuron_scores(model, "fc1", x, y, "ablation"),
                               references.ablation(model, model.fc1, x, y))
    tempered = Tempered().eval()
    before = at.neuron_scores(tempered, "fc1", x, y, "gradient")
    tempered.temperature = torch.full((3,), 10.0)  # a buffer replaced by another tensor
    torch.testing.assert_close(at.neuron_scores(tempered, "fc1", x, y, "gradient"), before / 10)


def test_stacked_passes_are_bounded_by_the_size_of_the_layer(monkeypatch):
    model = nn.Sequential(nn.Linear(4, 2048), nn.ReLU(), nn.Linear(2048, 3)).eval()
    x = torch.randn(64, 4)
    rows = []
    real_tail = FxRunner.tail
    monkeypatch.setattr(FxRunner, "tail", lambda self, z, state, repeats: (
        rows.append(z.numel()), real_tail(self, z, state, repeats))[1])
    at.neuron_scores(model, "0", x, method="ablation", batch_size=64)
    assert max(rows) <= (1 << 20) and len(rows) > 1  # on a CPU 4 MiB of float32 per pass


def test_integer_inputs_score_with_every_method_but_those_from_a_zero_input_which_say_why():
    torch.manual_seed(0)
    model, ids = TokenNet().eval(), torch.randint(0, 20, (16, 5))
    labels = torch.randint(0, 3, (16,))
    for name in methods_scoring("Linear", model=model):
        if REGISTRY[name].needs_float_inputs:
            with pytest.raises(at.AttributionError, match="int64 inputs.*use integrated_gradients"):
                at.neuron_scores(model, "fc1", ids, labels, name)
        else:
            assert at.neuron_scores(model, "fc1", ids, labels, name,
                                    clusters=groups(ids)).shape == (16, 6)
    assert [m for m in at.method_names() if REGISTRY[m].needs_float_inputs] == ["conductance",
                                                                         "deeplift"]
    table = at.oracle_agreement(model, "fc1", ids, labels)  # all methods: those that apply
    refused = table.attrs["refused"]
    assert list(table["method"]) == [m for m in at.methods_for(torch.int64, "Linear", model)
                                     if m not in refused]
    assert "Embedding" in refused["lrp"]  # an oracle of every method says why
    assert "one cluster" in refused["probe"]  # one cluster: nothing for a probe to tell apart
    assert "conductance" not in list(table["method"])
    with pytest.raises(at.AttributionError, match="conductance starts from a zero"):
        at.oracle_agreement(model, "fc1", ids, labels, methods=["gradient", "conductance"])


@pytest.mark.parametrize("network", [SequenceNet, UntraceableSequenceNet])
def test_layers_on_a_sequence_have_their_features_as_neurons(network):
    torch.manual_seed(0)
    model, x = network().eval(), torch.randn(12, 9, 3)
    y = torch.randint(0, 3, (12,))
    assert [(i.name, i.n_neurons, i.neuron_axis) for i in at.list_layers(model, x[:2])] == [
        ("proj", 6, 2), ("act", 6, 2), ("norm", 6, 2), ("mix", 6, 2), ("head", 3, 1)]
    for layer in ("proj", "act", "mix"):
        module = dict(model.named_modules())[layer]
        per_position = {  # Captum's [N, T, F], summed (averaged for activation) over positions
            "gradient": LayerGradientXActivation(model, module, multiply_by_inputs=False)
            .attribute(x, target=y).sum(1),
            "gradient_x_activation": LayerGradientXActivation(model, module)
            .attribute(x, target=y).sum(1),
            "activation": LayerActivation(model, module).attribute(x).mean(1)}
        for name, expected in per_position.items():
            scores = at.neuron_scores(model, layer, x, y, name, n_steps=8)
            torch.testing.assert_close(scores, expected.detach(), rtol=1e-4, atol=1e-5)
        facts = ScoreFacts()
        scores = at.neuron_scores(model, layer, x, y, "conductance", n_steps=8, facts=facts)
        references.assert_conductance_matches(
            scores, facts.sums.steps, 8, lambda rows, n_steps, module=module: (
                LayerConductance(model, module).attribute(x[rows], target=y[rows],
                                                          n_steps=n_steps).detach().sum(1)))
        with torch.no_grad():  # ablation: feature j zeroed at every position
            base = model(x).gather(1, y[:, None])[:, 0]
            effects = []
            for j in range(6):
                def zero_feature(out, j=j):
                    out = out.clone()
                    out[..., j] = 0
                    return out
                with references.replaced_output(module, zero_feature):
                    effects.append(base - model(x).gather(1, y[:, None])[:, 0])
        torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "ablation"),
                                   torch.stack(effects, 1), rtol=1e-4, atol=1e-6)
    with eval_mode(model):
        runner = runner_for(model, "mix", model.mix, x)
    assert isinstance(runner, HookRunner if network is UntraceableSequenceNet else FxRunner)


# ---------------------------------------------------------------- sanity model

def test_sanity_model_ranks_the_informative_branch_first():
    torch.manual_seed(0)
    features = torch.randn(200, 3)
    labels = (features[:, 1] > 0).long()
    model = ThreeBranchNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(10):
        for batch in torch.randperm(200).split(16):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(features[batch]), labels[batch]).backward()
            optimizer.step()
    importance = {
        branch: at.neuron_scores(model, f"{branch}.0", features, labels,
                                 "gradient").abs().mean().item()
        for branch in ("branch0", "branch1", "branch2")
    }
    assert max(importance, key=importance.get) == "branch1", importance


# ---------------------------------------------------------------- clusters

@pytest.mark.parametrize("reduce", at.REDUCTIONS)
def test_cluster_scores_equal_a_groupby_of_per_sample_scores(reduce):
    model, x, y = build("residual_mlp")
    clusters = np.array(["a", "b", "c", "d"])[np.arange(40) % 4]
    table = at.cluster_scores(model, "fc2", x, y, clusters, "gradient_x_activation",
                              reduce=reduce, batch_size=6)
    per_sample = pd.DataFrame(at.neuron_scores(model, "fc2", x, y, "gradient_x_activation").numpy())
    grouped = {"mean": per_sample.groupby(clusters).mean(),
               "mean_abs": per_sample.abs().groupby(clusters).mean(),
               "std": per_sample.groupby(clusters).std()}[reduce]
    assert list(table.index) == ["a", "b", "c", "d"] and table.index.name == "cluster"
    assert table["n"].tolist() == [10, 10, 10, 10]
    np.testing.assert_allclose(table.drop(columns="n").to_numpy(), grouped.to_numpy(),
                               rtol=1e-4, atol=1e-6)


def test_cluster_scores_stream_from_an_iterable_of_batches():
    model, x, y = build("residual_mlp")
    clusters = y.numpy()
    in_memory = at.cluster_scores(model, "fc1", x, y, clusters, "gradient")
    streamed = at.cluster_scores(model, "fc1", (chunk for chunk in x.split(9)), y, clusters,
                                 "gradient")
    pd.testing.assert_frame_equal(in_memory, streamed)


def test_cluster_scores_for_all_classes_is_a_table_per_cluster():
    model, x, _ = build("residual_mlp")
    clusters = np.arange(40) % 2
    table = at.cluster_scores(model, "fc2", x, "all", clusters, "gradient")
    assert table.index.names == ["cluster", "class"] and table.shape == (6, 17)
    per_sample = at.neuron_scores(model, "fc2", x, "all", "gradient")
    np.testing.assert_allclose(table.loc[1].drop(columns="n").to_numpy(),
                               per_sample[clusters == 1].mean(0).numpy(), rtol=1e-4, atol=1e-6)


def test_single_sample_cluster_has_nan_std_not_a_crash():
    model, x, y = build("residual_mlp")
    clusters = np.zeros(40, dtype=int)
    clusters[0] = 7
    table = at.cluster_scores(model, "fc1", x, y, clusters, "gradient", reduce="std")
    assert table.loc[7, "n"] == 1 and table.loc[7].drop("n").isna().all()


# ---------------------------------------------------------------- errors a user can cause

def test_a_layer_may_be_given_as_its_module():
    model, x, y = build("branching")
    torch.testing.assert_close(at.neuron_scores(model, model.right[0], x, y, "gradient"),
                               at.neuron_scores(model, "right.0", x, y, "gradient"))
    with pytest.raises(at.AttributionError, match="not part of this model"):
        at.neuron_scores(model, nn.Linear(6, 7), x, y, "gradient")


def test_unknown_layer_lists_the_valid_names():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match="Valid layer names: fc1, bn, act, fc2"):
        at.neuron_scores(model, "fc3", x, y, "gradient")


def test_unknown_method_lists_the_methods():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match="Methods: gradient, activation"):
        at.neuron_scores(model, "fc1", x, y, "saliency")


def test_targets_out_of_range_and_of_the_wrong_type():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match=r"0\.\.2"):
        at.neuron_scores(model, "fc1", x, torch.full((40,), 3), "gradient")
    with pytest.raises(at.AttributionError, match="LongTensor"):
        at.neuron_scores(model, "fc1", x, y.float(), "gradient")
    with pytest.raises(at.AttributionError, match="LongTensor"):
        at.neuron_scores(model, "fc1", x, y.tolist(), "gradient")
    with pytest.raises(at.AttributionError, match="40 samples"):
        at.neuron_scores(model, "fc1", x, y[:5], "gradient")


def test_inputs_the_model_cannot_take_include_the_models_message():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match=r"shape \[40, 7\].*mat1 and mat2"):
        at.neuron_scores(model, "fc1", x[:, :7], y, "gradient")


def test_layer_without_a_neuron_axis_and_a_layer_that_runs_twice():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.shared = nn.ReLU()
            self.total = nn.Flatten(0)

        def forward(self, x):
            h = self.shared(self.shared(self.fc(x)))
            self.total(h)  # a 1-D output that the head does not use
            return h

    model, x = Odd(), torch.randn(5, 4)
    assert [info.name for info in at.list_layers(model, x)] == ["fc"]
    with pytest.raises(at.AttributionError, match="more than once"):
        at.neuron_scores(model, "shared", x, method="gradient")
    with pytest.raises(at.AttributionError, match="no neuron axis"):
        at.neuron_scores(model, "total", x, method="gradient")


def test_non_finite_scores_are_not_hidden():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with torch.no_grad():
        model[1].weight.fill_(float("inf"))
    scores = at.neuron_scores(model, "0", torch.ones(3, 2), torch.zeros(3, dtype=torch.long),
                              "gradient")
    assert not torch.isfinite(scores).all()


def test_list_layers_lists_in_place_modules_but_not_pass_throughs():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(inplace=True),
                          nn.Dropout(0.5), nn.Identity(), nn.Linear(6, 3)).eval()
    assert [(i.name, i.kind) for i in at.list_layers(model, torch.randn(2, 4))] == [
        ("0", "Linear"), ("1", "BatchNorm1d"), ("2", "ReLU"), ("5", "Linear")]
    x = torch.randn(8, 4)
    with torch.no_grad():
        expected = torch.relu(model[1](model[0](x)))
    torch.testing.assert_close(at.neuron_scores(model, "2", x, method="activation"), expected)
    torch.testing.assert_close(  # and the layer before it keeps its own values
        at.neuron_scores(model, "1", x, method="activation"), model[1](model[0](x)).detach())


def test_list_layers_reports_names_kinds_and_shapes():
    model, x, _ = build("residual_conv")
    layers = at.list_layers(model, x[:2])
    assert [(i.name, i.kind, i.n_neurons, i.shape) for i in layers] == [
        ("conv1", "Conv2d", 6, (6, 6, 6)), ("bn1", "BatchNorm2d", 6, (6, 6, 6)),
        ("relu", "ReLU", 6, (6, 6, 6)), ("conv2", "Conv2d", 6, (6, 6, 6)),
        ("relu2", "ReLU", 6, (6, 6, 6)), ("head", "Linear", 4, (4,)),
    ]
    assert _model_state(model)["hooks"] == 0


def test_per_batch_work_does_not_list_the_models_parameters():
    """Facts about the model (such as its float dtype) are read once per call, not per batch
    (listing every parameter costs more as the model grows): one batch or forty list the
    parameters equally often."""
    model, x, y = build("residual_mlp")
    listed = []
    parameters = model.parameters

    def counted(*args, **kwargs):
        listed.append(1)
        return parameters(*args, **kwargs)

    model.parameters = counted
    counts = []
    for batch_size in (len(x), 1):
        listed.clear()
        scores = at.neuron_scores(model, "fc1", x, y, "gradient", batch_size=batch_size)
        counts.append(len(listed))
    del model.parameters
    assert counts[0] == counts[1]
    torch.testing.assert_close(scores, at.neuron_scores(model, "fc1", x, y, "gradient"))


def test_a_failure_while_storing_scores_restores_the_model_at_once(monkeypatch):
    """neuron_scores writes each batch into one result tensor; when that fails (no memory
    for the result), the suspended batches must not keep the model in eval mode for as long
    as the error's traceback lives."""
    model, x, y = build("residual_mlp")
    model.train()
    real_n_samples = at.methods.scores.n_samples

    def failing_on_the_result(inputs):
        if not model.training:  # the result's size, asked while the batches are suspended
            raise RuntimeError("not enough memory for the result")
        return real_n_samples(inputs)

    monkeypatch.setattr(at.methods.scores, "n_samples", failing_on_the_result)
    with pytest.raises(RuntimeError, match="not enough memory") as failure:
        at.neuron_scores(model, "fc1", x, y, "gradient", batch_size=8)
    assert failure.value is not None  # the traceback (and its frames) still alive here
    assert model.training and all(module.training for module in model.modules())


class ImageAndTable(nn.Module):
    """forward(image [N, 1, 4, 4], table [N, 3]) -> logits [N, 2]: two inputs."""

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(16, 4)
        self.head = nn.Linear(7, 2)

    def forward(self, image, table):
        return self.head(torch.cat([self.image(image.flatten(1)), table], dim=1))


def test_a_model_with_two_inputs_given_one_is_told_to_pass_named_inputs():
    model, image, table = ImageAndTable(), torch.randn(5, 1, 4, 4), torch.randn(5, 3)
    with pytest.raises(at.AttributionError, match="dict of named inputs"):
        at.list_layers(model, image)
    named = {"image": image, "table": table}
    assert [info.name for info in at.list_layers(model, named)] == ["image", "head"]
    assert at.neuron_scores(model, "image", named, torch.zeros(5, dtype=torch.long)).shape == (
        5, 4)


def test_a_batch_is_scored_in_equal_row_chunks_with_the_same_scores(method, monkeypatch):
    """On a CPU, rows x layer size above `_LAYER_ELEMENTS_PER_CHUNK` splits a batch into
    equal chunks (here 30 rows of a 16-unit layer, at most 7 rows: 5 chunks of 6); no score
    depends on it."""
    from attribution.methods import scores as scoring

    model, x, y = build("residual_mlp")
    x, y = x[:30], y[:30]
    whole = at.neuron_scores(model, "fc2", x, y, method, batch_size=30, n_steps=4,
                             clusters=groups(x))
    monkeypatch.setattr(scoring, "_LAYER_ELEMENTS_PER_CHUNK", 7 * 16)
    rows = []
    handle = model.fc1.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    try:
        chunked = at.neuron_scores(model, "fc2", x, y, method, batch_size=30, n_steps=4,
                             clusters=groups(x))
    finally:
        handle.remove()
    # conductance: each chunk once, then its n_steps + 1 interpolated copies together;
    # deeplift: each chunk stacked on the zero baseline, one row that every sample shares
    expected = {"conductance": {6, 30}, "deeplift": {7}}.get(method, {6})
    assert rows and set(rows) == expected, rows
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
