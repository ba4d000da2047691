"""A module whose output is a tuple or ModelOutput (attention, a transformers model inside a
classifier) is a layer in eager and .pt2 form alike: scored by its first tensor, the one the
.pt2 returns for it, replaced alone (the other entries stay) on the fast split and on hooks,
with every method agreeing across the forms and with a slow hooked loop. (That both forms
list the same layers with the same axes: test_models.test_both_forms_list_the_same_layers_
with_the_same_axes.)"""
import pytest
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

import attribution as at
from attribution.engine.guards import eval_mode
from attribution.methods.registry import methods_for
from attribution.engine.runners import FxRunner, HookRunner, runner_for
from tests.support.models import build_model, exported, groups

pytestmark = pytest.mark.usefixtures("one_thread")

# a layer of each model whose eager output is a tuple (value, None) or a ModelOutput
TUPLE_LAYERS = {"vit": "blocks.0.attn", "bert": "model.bert.encoder.layer.0.attention.self",
                "gpt2": "model.transformer"}


@pytest.fixture(scope="module", params=sorted(TUPLE_LAYERS))
def forms(request, tmp_path_factory):
    """(eager model, its default .pt2 loaded back, layer, inputs [4, ...], targets [4])."""
    model, x, y = build_model(request.param, n=4)
    loaded = exported(model, x, tmp_path_factory.mktemp("pt2") / "model.pt2")
    return model, loaded, TUPLE_LAYERS[request.param], x, y


def _first(output):
    """The reference's own reading of a structured output: entry 0 / the first field."""
    return output[0]


def _with_first(output, value):
    """`output` with entry 0 / its first field set to `value`, rebuilt by hand."""
    if isinstance(output, tuple):
        return (value, *output[1:])
    fields = dict(output)
    fields[next(iter(fields))] = value
    return type(output)(**fields)


def _hooked(module, make_output):
    return module.register_forward_hook(lambda m, args, output: make_output(output))


def slow_gradient_x_activation(model, module, x, targets, axis):
    """Per sample: z * dF/dz, summed over the positions, z the first tensor replaced by a
    leaf of its values (as ablation replaces it: other entries made from it stay). [N, n]"""
    rows = []
    for i in range(len(x)):
        store = {}

        def to_leaf(output):
            store["z"] = _first(output).detach().requires_grad_(True)
            return _with_first(output, store["z"] * 1)

        handle = _hooked(module, to_leaf)
        try:
            logit = model(x[i:i + 1])[0, targets[i]]
        finally:
            handle.remove()
        (grad,) = torch.autograd.grad(logit, store["z"])
        rows.append((store["z"] * grad)[0].movedim(axis - 1, 0).flatten(1).sum(1))
    return torch.stack(rows)


def slow_ablation(model, module, x, targets, axis, n_neurons):
    """Per sample and neuron: F(x) - F(x with that neuron of the first tensor zeroed). [N, n]"""
    rows = []
    with torch.no_grad():
        for i in range(len(x)):
            base = model(x[i:i + 1])[0, targets[i]]
            effects = []
            for j in range(n_neurons):
                def zeroed(output, j=j):
                    value = _first(output).clone()
                    value.narrow(axis, j, 1).zero_()
                    return _with_first(output, value)

                handle = _hooked(module, zeroed)
                try:
                    effects.append(base - model(x[i:i + 1])[0, targets[i]])
                finally:
                    handle.remove()
            rows.append(torch.stack(effects))
    return torch.stack(rows)


def test_a_tuple_output_layer_scores_alike_in_both_forms_and_as_a_slow_loop(forms):
    model, loaded, layer, x, y = forms
    module = model.get_submodule(layer)
    info = {i.name: i for i in at.list_layers(model, x[:2])}[layer]
    assert not isinstance(_output_of(model, module, x), torch.Tensor)  # a tuple / ModelOutput
    for form in (model, loaded):
        with eval_mode(form):
            assert isinstance(runner_for(form, layer, form.get_submodule(layer), x), FxRunner)
    for method in methods_for(x.dtype, info.kind, model):  # loaded: its kind from the graph
        options = dict(n_steps=8, clusters=groups(x))
        eager = at.neuron_scores(model, layer, x, y, method, **options)
        assert eager.shape == (len(x), info.n_neurons)
        torch.testing.assert_close(at.neuron_scores(loaded, layer, x, y, method, **options),
                                   eager, rtol=1e-3, atol=1e-5, msg=method)
    torch.testing.assert_close(
        at.neuron_scores(model, layer, x, y, "gradient_x_activation"),
        slow_gradient_x_activation(model, module, x, y, info.neuron_axis), rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(
        at.neuron_scores(model, layer, x, y, "ablation"),
        slow_ablation(model, module, x, y, info.neuron_axis, info.n_neurons),
        rtol=1e-3, atol=1e-5)


def _output_of(model, module, x):
    store = {}
    handle = _hooked(module, lambda output: store.update(output=output))
    try:
        with torch.no_grad():
            model(x[:2])
    finally:
        handle.remove()
    return store["output"]


class Encoder(nn.Module):
    """Returns a ModelOutput: hidden states [N, T, F] and a pooled [N, F] made from the same
    values, or (`from_first`) from the hidden states it returns."""

    def __init__(self, width: int, from_first: bool):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.from_first = from_first

    def forward(self, x):
        hidden = torch.tanh(self.dense(x))
        first = hidden * 2
        return BaseModelOutputWithPooling(last_hidden_state=first, pooler_output=(
            first if self.from_first else hidden).mean(1))


class Reader(nn.Module):
    """Reads both fields of the encoder's output; `untraceable` adds data-dependent control
    flow (neither fx nor torch.export can split it: hooks)."""

    def __init__(self, width: int = 6, n_classes: int = 3, untraceable: bool = False,
                 from_first: bool = False):
        super().__init__()
        self.encoder = Encoder(width, from_first)
        self.head = nn.Linear(width, n_classes)
        self.untraceable = untraceable

    def forward(self, x):
        out = self.encoder(x)
        if self.untraceable and bool(x.sum() > -1e9):
            x = x * 1.0
        return self.head(out.last_hidden_state.relu().sum(1) + out.pooler_output)


@pytest.mark.parametrize("untraceable, from_first, fast", [
    (False, False, True), (True, False, False), (False, True, False)])
def test_only_the_first_field_of_a_model_output_is_replaced(untraceable, from_first, fast):
    """Zeroing a neuron of `encoder` zeroes it in last_hidden_state only: pooler_output, made
    inside the encoder, is passed on as it was, on both runners. Where it is made from
    last_hidden_state itself, a split would recompute it from the zeroed values: hooks."""
    torch.manual_seed(0)
    model = Reader(untraceable=untraceable, from_first=from_first).eval()
    x, y = torch.randn(5, 4, 6), torch.randint(0, 3, (5,))
    (info,) = [i for i in at.list_layers(model, x) if i.name == "encoder"]
    assert (info.shape, info.neuron_axis) == ((4, 6), 2)
    with eval_mode(model):
        runner = runner_for(model, "encoder", model.encoder, x)
    assert isinstance(runner, FxRunner if fast else HookRunner)
    torch.testing.assert_close(
        at.neuron_scores(model, "encoder", x, y, "ablation"),
        slow_ablation(model, model.encoder, x, y, 2, 6), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        at.neuron_scores(model, "encoder", x, y, "gradient_x_activation"),
        slow_gradient_x_activation(model, model.encoder, x, y, 2), rtol=1e-4, atol=1e-6)
    hidden = model.encoder(x).last_hidden_state
    torch.testing.assert_close(at.neuron_scores(model, "encoder", x, y, "activation"),
                               hidden.mean(1), rtol=1e-5, atol=1e-6)


class Counts(nn.Module):
    """Returns (None, a size): no tensor to score."""

    def forward(self, x):
        return None, x.shape[1]


class CountsThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.counts, self.fc = Counts(), nn.Linear(4, 3)

    def forward(self, x):
        _, width = self.counts(x)
        return self.fc(x[:, :width])


def test_a_module_whose_output_holds_no_tensor_is_not_a_layer():
    model, x = CountsThenLinear().eval(), torch.randn(5, 4)
    assert [info.name for info in at.list_layers(model, x)] == ["fc"]
    with pytest.raises(at.AttributionError, match="'counts' has no neuron axis: its output "
                                                  "is a tuple holding no tensor"):
        at.neuron_scores(model, "counts", x, torch.zeros(5, dtype=torch.long), "gradient")
