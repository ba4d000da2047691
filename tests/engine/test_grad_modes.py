"""The caller's grad mode never changes a number: every method on both runners, every public
entry point and the command line give under `torch.no_grad()`, after
`torch.set_grad_enabled(False)` and under `torch.inference_mode()` what they give normally,
or (where autograd is impossible) an AttributionError that says so."""
import contextlib

import numpy as np
import pandas as pd
import pytest
import torch
from captum.attr import LayerGradientXActivation
from captum.testing.helpers.basic_models import BasicModel_MultiLayer

import attribution as at
from attribution import cli
from attribution.analyses import distributed
from attribution.analyses.neuron import neuron_view
from attribution.engine.runners import select as runner_selection
from attribution.analyses.clusters import predict_classes
from attribution.inputs.data import check_data
from attribution.inputs.data_files import load_data
from attribution.inputs.model_formats import load_model
from attribution.engine.runners import FxRunner, HookRunner, runner_for
from attribution.engine.guards import engine_modes, eval_mode
from attribution.methods.registry import REGISTRY

from tests.support.models import ResidualMLP, build, groups, methods_scoring
from tests.support import ROOT


@contextlib.contextmanager
def grad_disabled_by_a_call():
    """`torch.set_grad_enabled(False)` as a statement: off for the thread until undone."""
    torch.set_grad_enabled(False)
    try:
        yield
    finally:
        torch.set_grad_enabled(True)


GRAD_MODES = {"no_grad": torch.no_grad, "set_grad_enabled(False)": grad_disabled_by_a_call,
              "inference_mode": torch.inference_mode}
RUNNERS = {"fx": FxRunner, "hooks": HookRunner}
with torch.device("meta"):  # its modules, not weights: which methods score it
    LINEAR_METHODS = methods_scoring("Linear", model=ResidualMLP())
N_STEPS = 8


@pytest.fixture(params=list(GRAD_MODES))
def grad_mode(request):
    return GRAD_MODES[request.param]


@pytest.fixture(params=list(RUNNERS))
def runner_kind(request, monkeypatch):
    """The runner class every call of the test uses: fx, or hooks (fx made to fail)."""
    if request.param == "hooks":
        def untraceable(*args):
            raise TypeError("fx is switched off for this test")
        monkeypatch.setattr(runner_selection, "FxRunner", untraceable)
    return RUNNERS[request.param]


def made_in(mode, tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` made under `mode` (an inference tensor under inference_mode)."""
    with mode():
        return tensor.clone()


def assert_mode_kept(mode) -> None:
    """The caller's mode is still on after a call (nothing leaked out of the library)."""
    if mode is torch.inference_mode:
        assert torch.is_inference_mode_enabled()
    else:
        assert not torch.is_grad_enabled()


@pytest.mark.parametrize("method", LINEAR_METHODS)
@pytest.mark.parametrize("targets", ["labels", "all"])
def test_every_method_on_both_runners_ignores_the_callers_grad_mode(method, targets, grad_mode,
                                                                    runner_kind):
    model, x, y = build("residual_mlp")
    chosen = y if targets == "labels" else targets
    options = dict(n_steps=N_STEPS, batch_size=16, clusters=groups(x))
    if targets == "all" and REGISTRY[method].fit is not None:  # it scores no class
        inputs = made_in(grad_mode, x)
        with grad_mode():
            with pytest.raises(at.AttributionError, match="clusters, not classes"):
                at.neuron_scores(model, "fc1", inputs, chosen, method, **options)
            assert_mode_kept(grad_mode)
        return
    expected = at.neuron_scores(model, "fc1", x, chosen, method, **options)
    inputs = made_in(grad_mode, x)
    with grad_mode():
        scores = at.neuron_scores(model, "fc1", inputs, chosen, method, **options)
        assert_mode_kept(grad_mode)
    with eval_mode(model):
        assert isinstance(runner_for(model, "fc1", model.fc1, x[:4]), runner_kind)
    assert not scores.requires_grad
    assert scores.abs().sum() > 0
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-7)


def test_the_runners_give_a_gradient_under_every_mode(grad_mode, runner_kind):
    """The capture mechanism itself: `forward_with_leaf` hands out a leaf the logits depend
    on, whatever the caller's mode."""
    model, x, _ = build("residual_mlp")
    with eval_mode(model):
        runner = runner_for(model, "fc1", model.fc1, x)
        inputs = made_in(grad_mode, x)
        with grad_mode():
            z, logits = runner.forward_with_leaf(inputs)
            assert_mode_kept(grad_mode)
        assert isinstance(runner, runner_kind)
        assert z.requires_grad and logits.requires_grad and not z.is_inference()
        (grad,) = torch.autograd.grad(logits[:, 0].sum(), z)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("mode", list(GRAD_MODES.values()), ids=list(GRAD_MODES))
def test_captums_no_grad_case_gives_its_literal_scores(mode):
    """Captum's test_simple_input_gradient_activation_no_grad: [0, 400, 0] under no_grad
    (the engine gave [0, 0, 0]); Captum itself agrees in that mode."""
    net = BasicModel_MultiLayer()
    inputs = torch.tensor([[0.0, 100.0, 0.0]])
    with mode():
        ours = at.neuron_scores(net, "linear0", inputs.clone(), torch.tensor([0]),
                                "gradient_x_activation")  # inputs made in the mode
    torch.testing.assert_close(ours, torch.tensor([[0.0, 400.0, 0.0]]))
    with torch.no_grad():
        captum = LayerGradientXActivation(net, net.linear0).attribute(inputs, target=0)
    torch.testing.assert_close(ours, captum.detach())


def test_captums_frozen_parameters_case_gives_its_literal_scores(grad_mode):
    """Captum's test_simple_linear_gradient_activation_no_grad: every parameter frozen."""
    net = BasicModel_MultiLayer()
    for parameter in net.parameters():
        parameter.requires_grad = False
    with grad_mode():
        ours = at.neuron_scores(net, "linear1", torch.tensor([[0.0, 100.0, 0.0]]),
                                torch.tensor([0]), "gradient_x_activation")
    torch.testing.assert_close(ours, torch.tensor([[90.0, 101.0, 101.0, 101.0]]))


def entry_points(model, x, y, clusters):
    """Every public computation of one layer, as name -> zero-argument call."""
    order = np.random.default_rng(0).permutation(16).astype(float)
    curve = dict(ks=[0, 2, 4, 8, 16], n_random=4, metric="target_logit")
    return {
        "cluster_scores": lambda: at.cluster_scores(model, "fc1", x, y, clusters, "gradient",
                                                    reduce="mean_abs"),
        "pruning_curve": lambda: at.pruning_curve(model, "fc1", x, y, order, **curve),
        "cluster_pruning_curves": lambda: at.cluster_pruning_curves(
            model, "fc1", x, y, clusters, "a", order, **curve),
        "oracle_agreement": lambda: at.oracle_agreement(model, "fc1", x, y, clusters=clusters,
                                                        n_steps=N_STEPS),
        "diagnose": lambda: [(f.code, f.severity, round(f.value, 6), f.message) for f in
                             at.diagnose(model, "fc1", x, y, "gradient", clusters,
                                         n_random=4, n_steps=N_STEPS)],
        "distributed.cluster_scores": lambda: distributed.cluster_scores(
            model, "fc1", x, y, clusters, "conductance", n_steps=N_STEPS),
        "distributed.pruning_curve": lambda: distributed.pruning_curve(
            model, "fc1", x, y, order, **curve),
        "neuron_view": lambda: neuron_view(
            model, "fc1", x, y, np.zeros((len(x), 16)), np.zeros((len(x), 16)),
            clusters == "a", 3).removal,
    }


@pytest.mark.parametrize("entry", list(entry_points(None, None, None, None)))
def test_every_entry_point_ignores_the_callers_grad_mode(entry, grad_mode):
    model, x, y = build("residual_mlp")
    clusters = np.array(["a", "b"])[np.arange(len(x)) % 2]
    expected = entry_points(model, x, y, clusters)[entry]()
    with grad_mode():
        result = entry_points(model, x.clone(), y, clusters)[entry]()  # x made in the mode
        assert_mode_kept(grad_mode)
    if isinstance(expected, pd.DataFrame):
        pd.testing.assert_frame_equal(result, expected, rtol=1e-6)
    else:
        assert result == expected




def test_the_command_line_ignores_the_callers_grad_mode_and_leaks_none(tmp_path, grad_mode,
                                                                       capsys):
    """`cli.main` called from code that runs under a grad mode writes the same table, and
    loading and predicting (which use no_grad inside) leave the caller's mode as it was."""
    arguments = ["score", "--model", ROOT / "demo" / "digits_mlp.pt2", "--data",
                 ROOT / "demo" / "digits.npz", "--layer", "fc2", "--method", "gradient",
                 "conductance"]
    assert cli.main([str(a) for a in arguments + ["--out", tmp_path / "normal.csv"]]) == 0
    with grad_mode():
        code = cli.main([str(a) for a in arguments + ["--out", tmp_path / "mode.csv"]])
        assert_mode_kept(grad_mode)
    assert code == 0, capsys.readouterr().err
    expected = pd.read_csv(tmp_path / "normal.csv")
    assert expected["score"].abs().sum() > 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "mode.csv"), expected)
    loaded = load_model(ROOT / "demo" / "digits_mlp.pt2")
    predict_classes(loaded.module, check_data(load_data(ROOT / "demo" / "digits.npz"),
                                              loaded).inputs[:8])
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_a_model_built_under_inference_mode_is_refused_for_gradients_only(runner_kind):
    """Its parameters are inference tensors, which autograd cannot save: gradient methods
    say so; the methods without gradients still give the normal numbers."""
    model, x, y = build("residual_mlp")
    expected = {method: at.neuron_scores(model, "fc1", x, y, method, n_steps=N_STEPS,
                                         clusters=groups(x))
                for method in LINEAR_METHODS}
    with torch.inference_mode():
        frozen, _, _ = build("residual_mlp")  # the same weights (seeded), made in the mode
    for method in LINEAR_METHODS:
        if not REGISTRY[method].uses_gradients:
            torch.testing.assert_close(at.neuron_scores(frozen, "fc1", x, y, method,
                                                        clusters=groups(x)), expected[method])
            continue
        with pytest.raises(at.AttributionError, match="inference_mode.*activation, ablation"):
            at.neuron_scores(frozen, "fc1", x, y, method, n_steps=N_STEPS)


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


CALLER_SETTINGS = {"autocast(cpu, bfloat16)": lambda: torch.autocast("cpu", torch.bfloat16),
                   "set_default_dtype(float64)": lambda: default_dtype(torch.float64)}


@pytest.mark.parametrize("setting", list(CALLER_SETTINGS))
def test_the_callers_autocast_and_default_dtype_change_no_number(setting):
    """The caller's autocast (which would put conductance up to 7% off) and a float64 default
    dtype (which would give other random scores) change no score, curve or finding."""
    model, x, y = build("residual_mlp")
    clusters = np.array(["a", "b"])[np.arange(len(x)) % 2]
    expected = {method: at.neuron_scores(model, "fc1", x, y, method, n_steps=N_STEPS,
                                         clusters=clusters)
                for method in LINEAR_METHODS}
    calls = entry_points(model, x, y, clusters)
    expected_entries = {name: calls[name]() for name in ("pruning_curve", "diagnose",
                                                         "neuron_view")}
    with CALLER_SETTINGS[setting]():
        for method in LINEAR_METHODS:
            torch.testing.assert_close(
                at.neuron_scores(model, "fc1", x, y, method, n_steps=N_STEPS,
                                 clusters=clusters),
                expected[method], rtol=1e-6, atol=1e-7, msg=method)
        pd.testing.assert_frame_equal(calls["pruning_curve"](), expected_entries["pruning_curve"])
        pd.testing.assert_frame_equal(calls["neuron_view"](), expected_entries["neuron_view"])
        assert calls["diagnose"]() == expected_entries["diagnose"]


def test_predicted_classes_ignore_the_callers_autocast():
    """Class 1 wins by 0.1%, also under autocast(cpu, bfloat16), where both weights round to
    1.0 and class 0 would win: 'predicted class' clusters do not depend on the caller."""
    model = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0] * 4, [1.001] * 4]))
    inputs = torch.rand(6, 4) + 0.5
    assert predict_classes(model, inputs).tolist() == [1] * 6
    with torch.autocast("cpu", torch.bfloat16):
        assert predict_classes(model, inputs).tolist() == [1] * 6


def test_engine_modes_nested_in_themselves_switch_nothing_and_restore_everything(grad_mode):
    """score_batches holds the engine's modes for a whole batch, and the runners enter them
    again inside: the nested entry is free, and a caller's mode set in between still comes
    back on exit."""
    with grad_mode():
        with engine_modes():
            with engine_modes():
                assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            with torch.no_grad():
                with engine_modes():
                    assert torch.is_grad_enabled()
                assert not torch.is_grad_enabled()
            with torch.autocast("cpu"), engine_modes():
                assert not torch.is_autocast_enabled("cpu")
            assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
        assert_mode_kept(grad_mode)
