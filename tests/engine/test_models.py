"""The models people study (ResNet-, ViT-, GPT-2- and BERT-style), eager and as a .pt2: every
layer on the fast split, the same layers and neuron axes in both forms, scores as Captum's."""
import pytest
import torch
from captum.attr import LayerGradientXActivation
from torch import nn

import attribution as at
from attribution.errors import AttributionError
from attribution.engine.guards import eval_mode, forward_hooks
from attribution.engine.runners import FxRunner, runner_for
from tests.support import references
from tests.support.models import ResNet, build_model, exported, randomize_batchnorm

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ["resnet", "vit", "gpt2", "bert"]
# a nested layer and a block output of each model, scored against Captum
SCORED = {"resnet": ["layer2.0.bn2", "layer3.0"], "vit": ["blocks.0.mlp.0", "blocks.1"],
          "gpt2": ["model.transformer.h.0.mlp.c_fc", "model.transformer.h.1"],
          "bert": ["model.bert.encoder.layer.0.intermediate.dense",
                   "model.bert.encoder.layer.1.output.LayerNorm"]}


def _forms(name, folder):
    """(name, eager model, the same model loaded from folder/model.pt2, inputs, targets)."""
    model, x, y = build_model(name, n=6)
    return name, model, exported(model, x, folder / "model.pt2"), x, y


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("gpt2")


@pytest.fixture(scope="module", params=MODELS)
def forms(request, tmp_path_factory):
    return _forms(request.param, tmp_path_factory.mktemp("pt2"))


@pytest.fixture(scope="module")
def gpt2(gpt2_folder):
    return _forms("gpt2", gpt2_folder)


def _layers(model, x):
    return {info.name: info for info in at.list_layers(model, x[:2])}


def test_every_layer_splits_fast_in_eager_and_pt2_form(forms):
    _, model, loaded, x, _ = forms
    for form in (model, loaded):
        modules = dict(form.named_modules())
        with eval_mode(form):
            slow = [name for name in _layers(form, x)
                    if not isinstance(runner_for(form, name, modules[name], x), FxRunner)]
        assert slow == []


def _structured_outputs(model, x, names) -> set[str]:
    """Those of modules `names` whose eager output is not one tensor (a tuple, ModelOutput)."""
    modules, kinds = dict(model.named_modules()), {}

    def record(name):
        def hook(module, args, output):
            kinds[name] = isinstance(output, torch.Tensor)
        return hook

    with torch.no_grad(), forward_hooks({modules[name]: record(name) for name in names}):
        model(x[:2])
    return {name for name, is_tensor in kinds.items() if not is_tensor}


def test_both_forms_list_the_same_layers_with_the_same_axes(forms):
    """A default .pt2 (no call signature kept) lists exactly the eager layers, in order, with
    the same neurons; a module whose eager output is a tuple or ModelOutput (ViT's
    MultiheadAttention, BERT's self-attention, GPT2Model) is listed in both by its first
    tensor, the one tensor the .pt2 returns for it."""
    name, model, loaded, x, _ = forms
    eager, from_file = _layers(model, x), _layers(loaded, x)
    assert list(from_file) == list(eager)
    for layer, info in eager.items():
        other = from_file[layer]
        assert (other.shape, other.neuron_axis, other.n_neurons, other.kind) == (
            info.shape, info.neuron_axis, info.n_neurons, info.kind), layer
    assert bool(_structured_outputs(model, x, eager)) == (name != "resnet")


def test_a_pt2_with_the_call_signatures_kept_lists_exactly_the_eager_layers(tmp_path):
    model, x, _ = build_model("vit", n=6)
    eager = _layers(model, x)
    attention = sorted(name for name, module in model.named_modules()
                       if isinstance(module, nn.MultiheadAttention))
    assert attention and set(attention) <= set(eager)
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},),
                                  preserve_module_call_signature=tuple(attention))
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.unflatten(torch.export.load(tmp_path / "model.pt2"))
    from_file = _layers(loaded, x)
    assert list(from_file) == list(eager)
    assert [(i.shape, i.neuron_axis, i.n_neurons) for i in from_file.values()] == [
        (i.shape, i.neuron_axis, i.n_neurons) for i in eager.values()]


def _captum_grad_x_activation(model, module, x, y, axis):
    """Captum's per-position attribution summed over the positions (our convention)."""
    result = LayerGradientXActivation(model, module).attribute(x, target=y).detach()
    result = result.movedim(axis, 1)
    return result.flatten(2).sum(2) if result.dim() > 2 else result


def test_scores_agree_with_captum_in_both_forms(forms):
    name, model, loaded, x, y = forms
    for layer in SCORED[name]:
        info = _layers(model, x)[layer]
        expected = _captum_grad_x_activation(model, model.get_submodule(layer), x, y,
                                             info.neuron_axis)
        for form in (model, loaded):
            ours = at.neuron_scores(form, layer, x, y, "gradient_x_activation", batch_size=5)
            assert ours.shape == (x.shape[0], info.n_neurons)
            torch.testing.assert_close(ours, expected, rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(at.neuron_scores(loaded, layer, x, y, "ablation"),
                                   at.neuron_scores(model, layer, x, y, "ablation"),
                                   rtol=1e-3, atol=1e-5)


def test_gpt2_mlp_neurons_are_its_features_not_its_positions(gpt2):
    _, model, loaded, x, y = gpt2
    layer = "model.transformer.h.0.mlp.c_fc"
    length, width = x.shape[1], 4 * model.model.config.n_embd
    eager, from_file = _layers(model, x)[layer], _layers(loaded, x)[layer]
    assert (eager.n_neurons, eager.neuron_axis, eager.axis_rule) == (width, 2, "lengths")
    # the .pt2 was exported for this length only: the parameters tell the axes apart
    assert (from_file.n_neurons, from_file.neuron_axis, from_file.axis_rule) == (
        width, 2, "parameters")
    assert eager.describe() == f"{length} positions × {width} features"
    for block in ("model.transformer.h.0", "model.transformer.h.0.mlp.c_proj"):
        assert _layers(model, x)[block].n_neurons == model.model.config.n_embd


def test_a_neuron_axis_chosen_by_hand(gpt2):
    _, model, _, x, y = gpt2
    layer = "model.transformer.h.0.mlp.c_fc"
    torch.testing.assert_close(at.neuron_scores(model, layer + ":2", x, y, "gradient"),
                               at.neuron_scores(model, layer, x, y, "gradient"))
    positions = at.neuron_scores(model, layer + ":1", x, y, "gradient_x_activation")
    assert positions.shape == (x.shape[0], x.shape[1])
    expected = LayerGradientXActivation(model, model.get_submodule(layer)).attribute(
        x, target=y).detach().sum(2)
    torch.testing.assert_close(positions, expected, rtol=1e-3, atol=1e-5)
    module = model.get_submodule(layer)
    with eval_mode(model):
        runner = runner_for(model, layer + ":-2", module, x)
    assert (runner.axis, runner.axis_rule) == (1, "chosen")
    with pytest.raises(AttributionError, match="choose 1..2"):
        at.neuron_scores(model, layer + ":3", x, y, "gradient")
    with pytest.raises(AttributionError, match="':axis'"):
        at.neuron_scores(model, "model.transformer.h.0.mlp.nothing:2", x, y, "gradient")


def test_position_embeddings_shared_by_the_batch_are_not_layers(gpt2):
    _, model, _, x, y = gpt2
    assert "model.transformer.wpe" not in _layers(model, x)
    with pytest.raises(AttributionError, match="no output per sample"):
        at.neuron_scores(model, "model.transformer.wpe", x, y, "gradient")


@pytest.mark.parametrize("inplace", [True, False])
def test_resnet_blocks_ending_in_a_twice_called_relu_are_listed(inplace):
    torch.manual_seed(0)
    model, x = ResNet(inplace=inplace).eval(), torch.randn(6, 3, 32, 32)
    y = torch.randint(0, 5, (6,))
    names = [info.name for info in at.list_layers(model, x[:2])]
    blocks = [name for name, module in model.named_modules() if type(module).__name__ ==
              "BasicBlock"]
    assert set(blocks) <= set(names)
    assert not any(name.endswith("relu") and name != "relu" for name in names)  # runs twice
    torch.testing.assert_close(
        at.neuron_scores(model, "layer3.0", x, y, "ablation"),
        references.ablation(model, model.get_submodule("layer3.0"), x, y), rtol=1e-4, atol=1e-5)


def test_an_eager_model_exported_for_one_length_is_exported_again_for_another():
    model, x, y = build_model("gpt2")
    layer = "model.transformer.h.1.mlp.c_fc"
    module = model.get_submodule(layer)
    with eval_mode(model):
        first = runner_for(model, layer, module, x)
        shorter = runner_for(model, layer, module, x[:, :8])
    assert isinstance(shorter, FxRunner) and shorter is not first
    expected = _captum_grad_x_activation(model, module, x[:, :8], y, 2)
    torch.testing.assert_close(at.neuron_scores(model, layer, x[:, :8], y,
                                                "gradient_x_activation"),
                               expected, rtol=1e-3, atol=1e-5)


def test_the_cli_shows_positions_and_features_and_takes_a_neuron_axis(gpt2, gpt2_folder,
                                                                      capsys):
    import json

    import numpy as np
    import pandas as pd

    from attribution import cli

    _, model, _, x, y = gpt2
    layer = "model.transformer.h.0.mlp.c_fc"
    np.savez(gpt2_folder / "ids.npz", inputs=x.numpy(), labels=y.numpy())
    model_file = gpt2_folder / "model.pt2"
    assert cli.main(["layers", "--model", str(model_file), "--format", "json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows[layer]["units"], rows[layer]["neuron_axis"]) == (
        f"{x.shape[1]} positions × 128 features", 2)
    for axis, width in (("1", x.shape[1]), ("2", 128)):
        out = gpt2_folder / f"scores{axis}.csv"
        assert cli.main(["score", "--model", str(model_file), "--data",
                         str(gpt2_folder / "ids.npz"), "--layer", layer, "--neuron-axis", axis,
                         "--method", "gradient_x_activation", "--clusters", "label",
                         "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
        assert pd.read_csv(out)["neuron"].nunique() == width


class SoftmaxAfter(nn.Module):
    """The op after the layer looks elementwise in the graph but mixes the neurons."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.softmax(torch.relu(self.bn(self.fc1(x))), dim=1))


@pytest.mark.parametrize("late_mixing", [False, True])
def test_ablation_runs_the_ops_that_act_on_each_neuron_once(late_mixing):
    """BatchNorm and ReLU after the layer run once on z and once on zeros, not on every
    ablated copy, and the Linear after them once plus one column per neuron; an op that
    mixes neurons (softmax) ends that chain and is not affine, checked on data."""
    torch.manual_seed(0)
    model = SoftmaxAfter() if late_mixing else nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = randomize_batchnorm(model).eval()
    layer = "fc1" if late_mixing else "0"
    x, y = torch.randn(20, 6), torch.randint(0, 3, (20,))
    torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "ablation"),
                               references.ablation(model, model.get_submodule(layer), x, y),
                               rtol=1e-4, atol=1e-6)
    with eval_mode(model):
        runner = runner_for(model, layer, model.get_submodule(layer), x)
    chain, affine, _ = runner._prefix
    assert len(chain) == 2  # BatchNorm, ReLU; never the softmax or the Linear
    # the Linear after them is affine: its output moves by one column per ablated neuron
    assert (affine is None) if late_mixing else (affine.target == "3")


def test_an_exported_eager_model_sees_its_weights_change_in_place():
    """The export that puts a transformers model on the fast split holds the model's own
    tensors: no second copy of the weights, and no stale scores after an in-place edit."""
    from attribution.engine.runners.fx_graph import _EXPORTS

    model, x, y = build_model("gpt2", n=4)
    layer = "model.transformer.h.1.mlp.c_fc"
    at.neuron_scores(model, layer, x, y, "gradient")
    copies = dict(_EXPORTS[model][1].named_parameters())
    assert all(tensor is model.get_parameter(name) for name, tensor in copies.items())
    with torch.no_grad():
        model.model.score.weight.mul_(-2)
    expected = _captum_grad_x_activation(model, model.get_submodule(layer), x, y, 2)
    torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "gradient_x_activation"),
                               expected, rtol=1e-3, atol=1e-5)
