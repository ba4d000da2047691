"""Captum's own layer-attribution tests (pytorch/captum, tests/attr/layer/), held against
`neuron_scores`: the same models (captum.testing.helpers.basic_models), inputs, targets and,
where our quantity is Captum's, its literal expected numbers.

How each Captum case is carried over (P = ported: literal numbers; M = mapped to our
conventions: literal numbers re-derived, or Captum computed here at test time; N = not
applicable, with the reason):

test_layer_gradient_x_activation.py (LayerGradientXActivation == gradient_x_activation;
    its multiply_by_inputs=False half == gradient, compared with Captum at test time)
  P test_simple_input_gradient_activation          P ..._input_gradient_activation_no_grad
  P test_simple_linear_gradient_activation         P ..._linear_gradient_activation_no_grad
  M test_multi_layer_linear_gradient_activation    (a list of layers: one call per layer)
  M test_simple_multi_gradient_activation          (multi_relu returns a tuple: its two
                                                    outputs are multi_relu.relu1 / .relu2)
  P test_simple_relu_gradient_activation           P test_simple_output_gradient_activation
  M test_multi_layer_multi_gradient_activation     (list of layers + tuple output, as above)
  M test_simple_gradient_activation_multi_input_linear2 / _relu (named inputs x1..x3; the
                                                    int `scale` is bound by a wrapper)
  M test_gradient_activation_embedding / _no_grad  (Captum checks the shape only; the model
                                                    returns [N]: wrapped to [N, 1]; values
                                                    compared with Captum at test time)
  M test_simple_multi_gradient_activation_with_unused_layer (Captum materializes zeros for
                                                    the unused `relu`; we refuse it with
                                                    AttributionError: a deliberate difference)
test_layer_conductance.py (LayerConductance, zero input baseline == conductance)
  P test_simple_input_conductance                  P ..._with_scalar_baseline_conductance
  M test_simple_input_multi_conductance            (multi_relu -> relu1 / relu2)
  P test_simple_linear_conductance   P test_simple_relu_conductance   P ..._output_conductance
  M test_simple_multi_input_linear2_conductance    (named inputs, scale bound)
  M test_simple_multi_input_relu_conductance       (Captum keeps the additional input x3
                                                    fixed; we interpolate every float input:
                                                    x3 = 0 here, so the literal holds)
  M test_simple_multi_input_relu_conductance_batch / test_layer_conductance_with_unused_layer
                                                   (row 2 has x3 != 0: from a zero baseline for
                                                    x3 too, the literal becomes
                                                    [115, 125, 125, 125]; also vs Captum with
                                                    x3 as an interpolated input)
  M test_matching_conv1/pool1/conv2/pool2_conductance, ..._conv_multi_input_conductance
                                                   (Captum's LayerConductance at test time,
                                                    summed over positions for conv channels;
                                                    per-sample vs batched as Captum checks)
  M test_matching_conv_with_baseline_conductance   (random input baseline -> zero baseline)
test_layer_activation.py (LayerActivation == activation; conv channels averaged)
  P test_simple_input_activation  P test_simple_linear_activation  P test_simple_relu_activation
  P test_simple_output_activation  P test_simple_linear_activation_inplace
  M test_simple_multi_linear_activation, test_simple_multi_layer_multi_output_activation
                                                   (one call per layer; tuple -> relu1/relu2)
  M test_simple_relu_activation_input_inplace      (attribute_to_layer_input: relu's input
                                                    is linear1's output, scored there)
  M test_simple_multi_output_activation            (multi_relu -> relu1 / relu2)
  M test_simple_multi_input_activation             (multi_relu's inputs are the outputs of
                                                    linear1 and linear1_alt)
  M test_simple_multi_input_linear2_activation / _relu_activation (named inputs, scale bound)
  M test_sequential_in_place                       (Sequential ends in a conv map, not logits:
                                                    a Flatten + Linear head is added; the
                                                    channel mean of model[0](input))
  M test_sequential_module                         (Conv1dSeqModel returns [N, 2, 1]: wrapped
                                                    to [N, 2]; layer `seq` is the whole model)
test_layer_ablation.py (LayerFeatureAblation, zero baseline, one neuron at a time == ablation)
  N test_simple_ablation_with_mask                 (layer_mask ablates groups of neurons at
                                                    once; and attribute_to_layer_input)
  M test_multi_input_ablation                      (baseline [1, 2, 3] -> zero baseline,
                                                    Captum at test time; linear1's input
                                                    is linear0's output)
  N test_multi_input_ablation_with_layer_mask      (groups of neurons, non-zero baseline)
  M test_simple_multi_input_conv_intermediate      (Captum ablates each position; a channel
                                                    is one neuron here: Captum at test time
                                                    with a one-group-per-channel layer_mask;
                                                    its baseline / layer-input and 2x2-group
                                                    variants are N: non-zero baseline, groups)
  M test_simple_multi_output_ablation              (multi_relu -> relu1 / relu2)
  M test_simple_multi_output_input_ablation        (its inputs: linear1, linear1_alt outputs)
test_layer_integrated_gradients.py (LayerIntegratedGradients starts at the layer's value at
    the input baseline; ours starts at z = 0. Mapped by Captum's IntegratedGradients over the
    model's tail z -> logits with a zero baseline, computed at test time)
  M test_compare_with_emb_patching / _batch        (Captum's own check is LIG == IG on the
                                                    patched embedding; ours == IG on the
                                                    patched embedding from zero)
  N test_compare_with_emb_patching_wo_mult_by_inputs, test_multiple_tensors_compare_with_exp_
    wo_mult_by_inputs                              (multiply_by_inputs=False: no such method)
  M test_compare_with_layer_conductance_attr_to_outputs (LIG == LC needs LIG's input
                                                    baseline; ours from z = 0 vs IG on the tail)
  N test_compare_with_layer_conductance_attr_to_inputs (attribute_to_layer_input)
  M test_multiple_tensors_compare_with_expected    (relu1 / relu2; from z = 0 the literal is
                                                    [90, 101, 101, 101], not Captum's 100s,
                                                    which start at relu(linear1(0)) = [0,1,1,1])
  M test_multiple_layers_single_inputs             (one embedding at a time)
  M test_multiple_layers_multiple_inputs_shared_input / _multiple_input_outputs (layer
                                                    outputs of m1 and m234 one at a time; the
                                                    attribute_to_layer_input halves are N)
test_internal_influence.py (13 cases)              N: InternalInfluence integrates dF/dz over the
                                                    input path without multiplying by z: none
                                                    of our methods is that quantity
test_layer_deeplift.py, test_layer_lrp.py         see tests/methods/test_deeplift.py, test_lrp.py
test_grad_cam.py, test_layer_gradient_shap.py,
test_layer_feature_permutation.py                  N: methods we do not have

Of the 72 cases in the five files we share a quantity with and test_internal_influence.py:
16 ported, 38 mapped, 18 not applicable. Added beside them: a layer with a tuple output is
scored by its first tensor for every method (Captum's first element); gradient x activation
before an in-place ReLU; integrated gradients through a softmax (Captum's LIG cases all have
linear tails, where it equals gradient x activation, so they alone could not tell the two
apart).
"""
import pytest
import torch
from captum.attr import (IntegratedGradients, LayerActivation, LayerConductance,
                         LayerFeatureAblation, LayerGradientXActivation)
from captum.testing.helpers.basic_models import (
    BasicEmbeddingModel, BasicModel_ConvNet, BasicModel_ConvNet_One_Conv, BasicModel_MaxPool_ReLU,
    BasicModel_MultiLayer, BasicModel_MultiLayer_MultiInput, BasicModel_MultiLayer_TrueMultiInput,
    Conv1dSeqModel)
from torch import nn

from attribution import (AttributionError, NamedInputs, list_layers, methods_for,
                         neuron_scores)
from attribution.engine.guards import eval_mode
from attribution.engine.runners import FxRunner, runner_for
from tests.support.models import groups
from tests.support.references import replaced_output


class Bound(nn.Module):
    """`model` with some keyword arguments fixed (Captum's non-tensor additional_forward_args,
    e.g. the int `scale`); the rest arrive as named inputs."""

    def __init__(self, model: nn.Module, **fixed):
        super().__init__()
        self.model, self.fixed = model, fixed

    def forward(self, **inputs):
        return self.model(**inputs, **self.fixed)


class AsLogits(nn.Module):
    """`model` whose output [N] or [N, C, 1] is reshaped to logits [N, C]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        return output.reshape(output.shape[0], -1)


def ours(model, layer, x, method, target=0, n_steps=32, **options):
    """neuron_scores with one target class for every sample (and three clusters, for a
    method fitted to them): [N, n_neurons]."""
    rows = NamedInputs(x).shape[0] if isinstance(x, dict) else x.shape[0]
    return neuron_scores(model, layer, x, torch.full((rows,), target), method,
                         n_steps=n_steps, clusters=groups(x), **options)


def captum_call(model, x):
    """(forward function, inputs tuple) for Captum, named inputs passed by position."""
    if not isinstance(x, dict):
        return model, (x,)
    names = list(x)
    return (lambda *values: model(**dict(zip(names, values)))), tuple(x.values())


def per_neuron(attribution, axis=1):
    """Captum's [N, ...] layer attribution summed to [N, n_neurons] (positions of a conv
    channel or tokens of a sequence), neurons at `axis`."""
    attribution = attribution.movedim(axis, 1)
    return attribution.flatten(2).sum(2) if attribution.dim() > 2 else attribution


def literal(values):
    return torch.tensor(values, dtype=torch.float32)


def multi_layer(**options):
    return BasicModel_MultiLayer(**options)


def multi_input(scale):
    return Bound(BasicModel_MultiLayer_MultiInput(), scale=scale)


SIMPLE = torch.tensor([[0.0, 100.0, 0.0]])
RELU_INPUT = torch.tensor([[3.0, 4.0, 0.0]])
LINEAR2_INPUTS = {"x1": torch.tensor([[0.0, 10.0, 0.0]]), "x2": torch.tensor([[0.0, 10.0, 0.0]]),
                  "x3": torch.tensor([[0.0, 5.0, 0.0]])}
RELU_INPUTS = {"x1": torch.tensor([[0.0, 10.0, 1.0]]), "x2": torch.tensor([[0.0, 4.0, 5.0]]),
               "x3": torch.tensor([[0.0, 0.0, 0.0]])}
RELU_BATCH = {"x1": torch.tensor([[0.0, 10.0, 1.0], [0.0, 0.0, 10.0]]),
              "x2": torch.tensor([[0.0, 4.0, 5.0], [0.0, 0.0, 10.0]]),
              "x3": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]])}

# --------------------------------------------------- LayerGradientXActivation (literal)

# (Captum test, model factory, layer, inputs, expected gradient x activation)
GRADIENT_X_ACTIVATION = [
    ("input", multi_layer, "linear0", SIMPLE, [[0.0, 400.0, 0.0]]),
    ("linear", multi_layer, "linear1", SIMPLE, [[90.0, 101.0, 101.0, 101.0]]),
    ("multi_layer_linear_0", multi_layer, "linear0", SIMPLE, [[0.0, 400.0, 0.0]]),
    ("multi_layer_linear_1", multi_layer, "linear1", SIMPLE, [[90.0, 101.0, 101.0, 101.0]]),
    ("multi_relu1", lambda: multi_layer(multi_input_module=True), "multi_relu.relu1",
     RELU_INPUT, [[0.0, 8.0, 8.0, 8.0]]),
    ("multi_relu2", lambda: multi_layer(multi_input_module=True), "multi_relu.relu2",
     RELU_INPUT, [[0.0, 8.0, 8.0, 8.0]]),
    ("relu", multi_layer, "relu", RELU_INPUT, [[0.0, 8.0, 8.0, 8.0]]),
    ("multi_layer_multi_linear0", lambda: multi_layer(multi_input_module=True), "linear0",
     RELU_INPUT, [[9.0, 12.0, 0.0]]),
    ("output", multi_layer, "linear2", SIMPLE, [[392.0, 0.0]]),
    ("multi_input_linear2", lambda: multi_input(4), "model.model.linear2", LINEAR2_INPUTS,
     [[392.0, 0.0]]),
    ("multi_input_relu", lambda: multi_input(5), "model.model.relu", RELU_INPUTS,
     [[90.0, 101.0, 101.0, 101.0]]),
    # not a Captum GxA case: the in-place model and input of test_simple_linear_activation_
    # inplace; linear1 = [-9, 2, 2, 2] before ReLU(inplace=True), whose mask is [0, 1, 1, 1]
    ("linear_inplace_relu", lambda: multi_layer(inplace=True), "linear1",
     torch.tensor([[2.0, -5.0, 4.0]]), [[0.0, 2.0, 2.0, 2.0]]),
]


@pytest.mark.parametrize("method", ["gradient", "gradient_x_activation", "activation",
                                    "integrated_gradients", "conductance", "ablation"])
def test_a_layer_with_several_outputs_is_scored_by_its_first(method):
    """multi_relu returns a tuple (relu1's output, relu2's); as a transformers module returning
    a ModelOutput, it is scored by its first tensor, replaced alone (the second stays): the
    scores of multi_relu.relu1, which makes that tensor, on the fast split too."""
    model = BasicModel_MultiLayer(multi_input_module=True)
    torch.testing.assert_close(ours(model, "multi_relu", RELU_INPUT, method),
                               ours(model, "multi_relu.relu1", RELU_INPUT, method))
    with eval_mode(model):
        runner = runner_for(model, "multi_relu", model.multi_relu, RELU_INPUT)
    assert isinstance(runner, FxRunner)


def test_a_layer_with_several_outputs_gives_captums_first_attribution():
    """Captum attributes each element of a tuple output; ours is the first's."""
    model = BasicModel_MultiLayer(multi_input_module=True)
    x = torch.tensor([[3.0, 4.0, 0.0], [-1.0, 2.0, 5.0], [2.0, -3.0, 1.0]])
    for target in range(2):
        first, second = LayerGradientXActivation(model, model.multi_relu).attribute(
            x, target=target)
        assert first.shape == second.shape
        torch.testing.assert_close(ours(model, "multi_relu", x, "gradient_x_activation",
                                        target), per_neuron(first))


@pytest.mark.parametrize("case", GRADIENT_X_ACTIVATION, ids=[c[0] for c in GRADIENT_X_ACTIVATION])
def test_gradient_x_activation_gives_captums_literals(case):
    _, make, layer, x, expected = case
    model = make()
    torch.testing.assert_close(ours(model, layer, x, "gradient_x_activation"),
                               literal(expected), atol=0.01, rtol=0)


@pytest.mark.parametrize("case", GRADIENT_X_ACTIVATION, ids=[c[0] for c in GRADIENT_X_ACTIVATION])
def test_gradient_and_activation_match_captum_and_multiply_to_the_product(case):
    """Captum's helper: LayerGradientXActivation(multiply_by_inputs=False) is the layer
    gradient and LayerActivation the activation; their product is the attribution."""
    _, make, layer, x, expected = case
    model = make()
    module = model.get_submodule(layer)
    forward, inputs = captum_call(model, x)
    captum_gradient = LayerGradientXActivation(forward, module, multiply_by_inputs=False)
    captum_activation = LayerActivation(forward, module).attribute(inputs)
    gradient = ours(model, layer, x, "gradient")
    activation = ours(model, layer, x, "activation")
    torch.testing.assert_close(gradient, captum_gradient.attribute(inputs, target=0).detach())
    torch.testing.assert_close(activation, captum_activation)
    torch.testing.assert_close(gradient * activation, literal(expected), atol=0.01, rtol=0)


@pytest.mark.parametrize("layer, expected", [("linear0", [[0.0, 400.0, 0.0]]),
                                             ("linear1", [[90.0, 101.0, 101.0, 101.0]])])
@pytest.mark.parametrize("context", ["no_grad", "frozen_parameters", "both"])
def test_gradient_x_activation_under_no_grad_and_frozen_parameters(layer, expected, context):
    """Captum's _no_grad (torch.no_grad() around the call) and
    test_simple_linear_gradient_activation_no_grad (parameters with requires_grad=False)."""
    model = BasicModel_MultiLayer()
    if context != "no_grad":
        for parameter in model.parameters():
            parameter.requires_grad = False
    with torch.no_grad() if context != "frozen_parameters" else torch.enable_grad():
        scores = ours(model, layer, SIMPLE, "gradient_x_activation")
    torch.testing.assert_close(scores, literal(expected), atol=0.01, rtol=0)
    assert all(p.requires_grad == (context == "no_grad") for p in model.parameters())


def test_gradient_x_activation_with_an_unused_layer():
    """test_simple_multi_gradient_activation_with_unused_layer: `relu` is called but its output
    feeds nothing. Captum (materialize_grads) gives zeros; we refuse, and linear1 still
    scores [0, 8, 8, 8] (linear1 = [-3, 8, 8, 8], relu'd then summed into logit 0)."""
    model = BasicModel_MultiLayer(multi_input_module=True)
    x = torch.tensor([[3.0, 4.0, 0.0]])
    captum = LayerGradientXActivation(model, [model.linear1, model.relu]).attribute(
        x, target=0, grad_kwargs={"materialize_grads": True})
    assert float(captum[1].detach().abs().sum()) == 0.0
    torch.testing.assert_close(ours(model, "linear1", x, "gradient_x_activation"),
                               literal([[0.0, 8.0, 8.0, 8.0]]))
    torch.testing.assert_close(ours(model, "linear1", x, "gradient_x_activation"),
                               captum[0].detach())
    with pytest.raises(AttributionError, match="do not depend on layer 'relu'"):
        ours(model, "relu", x, "gradient_x_activation")


@pytest.mark.parametrize("frozen", [False, True])
def test_gradient_x_activation_on_an_embedding_matches_captum(frozen):
    """test_gradient_activation_embedding(_no_grad): two id inputs [4]; the model returns [4],
    wrapped to [4, 1]. Captum checks the shape [4, 100]; we compare the values."""
    torch.manual_seed(0)
    model = AsLogits(BasicEmbeddingModel())
    if frozen:
        for parameter in model.parameters():
            parameter.requires_grad = False
    x = {"input1": torch.tensor([2, 5, 0, 1]), "input2": torch.tensor([3, 0, 0, 2])}
    forward, inputs = captum_call(model, x)
    with torch.no_grad() if frozen else torch.enable_grad():
        scores = ours(model, "model.embedding1", x, "gradient_x_activation")
        captum = LayerGradientXActivation(forward, model.model.embedding1).attribute(
            inputs, target=0)
    assert scores.shape == (4, 100)
    assert float(scores.abs().max()) > 0
    torch.testing.assert_close(scores, captum.detach())


# ----------------------------------------------------------------------- LayerConductance

CONDUCTANCE = [
    ("input", multi_layer, "linear0", SIMPLE, [[0.0, 390.0, 0.0]]),
    ("multi_relu1", lambda: multi_layer(multi_input_module=True), "multi_relu.relu1", SIMPLE,
     [[90.0, 100.0, 100.0, 100.0]]),
    ("multi_relu2", lambda: multi_layer(multi_input_module=True), "multi_relu.relu2", SIMPLE,
     [[90.0, 100.0, 100.0, 100.0]]),
    ("linear", multi_layer, "linear1", SIMPLE, [[90.0, 100.0, 100.0, 100.0]]),
    ("relu", multi_layer, "relu", SIMPLE, [[90.0, 100.0, 100.0, 100.0]]),
    ("output", multi_layer, "linear2", SIMPLE, [[390.0, 0.0]]),
    ("multi_input_linear2", lambda: multi_input(4), "model.model.linear2", LINEAR2_INPUTS,
     [[390.0, 0.0]]),
    ("multi_input_relu", lambda: multi_input(5), "model.model.relu", RELU_INPUTS,
     [[90.0, 100.0, 100.0, 100.0]]),
    # Captum: [[90, 100, 100, 100], [100, 100, 100, 100]] with x3 held at [0, 0, 5]; from a
    # zero baseline for x3 too, row 2 runs linear1 from [-10, 1, 1, 1] to [115, 126, 126, 126]
    ("multi_input_relu_batch", lambda: multi_input(5), "model.model.relu", RELU_BATCH,
     [[90.0, 100.0, 100.0, 100.0], [115.0, 125.0, 125.0, 125.0]]),
]


@pytest.mark.parametrize("case", CONDUCTANCE, ids=[c[0] for c in CONDUCTANCE])
def test_conductance_gives_captums_literals(case):
    """Captum: n_steps=500, gausslegendre, delta=0.1; completeness: the scores add up to
    F(x) - F(0) as Captum's convergence delta (< 0.01) asserts."""
    _, make, layer, x, expected = case
    model = make()
    scores = ours(model, layer, x, "conductance", n_steps=500, batch_size=1)
    torch.testing.assert_close(scores, literal(expected), atol=0.1, rtol=0)
    total = scores.sum(1)
    if layer.startswith("multi_relu."):  # Captum's delta is over both outputs of multi_relu
        other = "multi_relu.relu2" if layer.endswith("1") else "multi_relu.relu1"
        total = total + ours(model, other, x, "conductance", n_steps=500).sum(1)
    forward, inputs = captum_call(model, x)
    with torch.no_grad():
        gap = forward(*inputs)[:, 0] - forward(*(torch.zeros_like(v) for v in inputs))[:, 0]
    torch.testing.assert_close(total, gap, atol=0.01, rtol=0)


def test_conductance_with_a_nonzero_extra_input_matches_captum_interpolating_it():
    """The batch case again, against Captum with x3 an interpolated input (zero baseline)."""
    model = multi_input(5)
    forward, inputs = captum_call(model, RELU_BATCH)
    captum = LayerConductance(forward, model.model.model.relu).attribute(
        inputs, target=0, n_steps=500)
    scores = ours(model, "model.model.relu", RELU_BATCH, "conductance", n_steps=500)
    torch.testing.assert_close(scores, captum, atol=0.01, rtol=0)


CONV_LAYERS = [("conv1", 1, 100), ("pool1", 1, 300), ("conv2", 1, 300), ("pool2", 1, 300),
               ("relu3", 4, 300), ("fc1", 3, 300)]


@pytest.mark.parametrize("fc2", ["captums_ones", "randn"])
@pytest.mark.parametrize("layer, rows, n_steps", CONV_LAYERS, ids=[c[0] for c in CONV_LAYERS])
def test_conductance_matches_captum_on_the_convnet(layer, rows, n_steps, fc2):
    """test_matching_*_conductance: 100 * randn images, target = argmax of the summed
    softmax; Captum's LayerConductance summed over each channel's positions. Also Captum's
    checks that one sample at a time gives the batched scores and that the scores add up to
    F(x) - F(0). Captum's fc2 weights are all ones, so every logit moves alike and the
    softmax depends on no layer: its scores are float noise (~1e-6). The "randn" variant
    sets fc2 = 0.01 * randn so the comparison has signal."""
    torch.manual_seed(7)
    model = BasicModel_ConvNet()
    if fc2 == "randn":
        model.fc2.weight = nn.Parameter(0.01 * torch.randn(10, 8))
    x = 100 * torch.randn(rows, 1, 10, 10)
    with torch.no_grad():
        target = int(model(x).sum(0).argmax())
    captum = per_neuron(LayerConductance(model, model.get_submodule(layer)).attribute(
        x, target=target, n_steps=n_steps, method="gausslegendre").detach())
    scores = ours(model, layer, x, "conductance", target=target, n_steps=n_steps)
    if fc2 == "randn":
        assert float(scores.abs().max()) > 1e-2
    else:
        assert float(scores.abs().max()) < 1e-4
    scale = float(captum.abs().max())
    torch.testing.assert_close(scores, captum, atol=1e-4 * scale, rtol=1e-3)
    with torch.no_grad():  # Captum's convergence delta < 0.005 (every layer here is a cut)
        gap = model(x)[:, target] - model(torch.zeros_like(x))[:, target]
    torch.testing.assert_close(scores.sum(1), gap, atol=0.005, rtol=0)
    one_at_a_time = ours(model, layer, x, "conductance", target=target, n_steps=n_steps,
                         batch_size=1)
    torch.testing.assert_close(one_at_a_time, scores, atol=1e-4 * scale, rtol=1e-3)


# ------------------------------------------------------------------------ LayerActivation

ACTIVATION = [
    ("input", multi_layer, "linear0", SIMPLE, [[0.0, 100.0, 0.0]]),
    ("linear", multi_layer, "linear1", SIMPLE, [[90.0, 101.0, 101.0, 101.0]]),
    # test_simple_relu_activation_input_inplace: relu's input, attribute_to_layer_input
    ("relu_input_inplace", lambda: multi_layer(inplace=True), "linear1",
     torch.tensor([[2.0, -5.0, 4.0]]), [[-9.0, 2.0, 2.0, 2.0]]),
    ("linear_inplace", lambda: multi_layer(inplace=True), "linear1",
     torch.tensor([[2.0, -5.0, 4.0]]), [[-9.0, 2.0, 2.0, 2.0]]),
    ("relu", multi_layer, "relu", RELU_INPUT, [[0.0, 8.0, 8.0, 8.0]]),
    ("output", multi_layer, "linear2", SIMPLE, [[392.0, 394.0]]),
    ("multi_output_relu1", lambda: multi_layer(multi_input_module=True), "multi_relu.relu1",
     torch.tensor([[0.0, 6.0, 0.0]]), [[0.0, 7.0, 7.0, 7.0]]),
    ("multi_output_relu2", lambda: multi_layer(multi_input_module=True), "multi_relu.relu2",
     torch.tensor([[0.0, 6.0, 0.0]]), [[0.0, 7.0, 7.0, 7.0]]),
    ("multi_layer_multi_output_linear0", lambda: multi_layer(multi_input_module=True),
     "linear0", torch.tensor([[0.0, 6.0, 0.0]]), [[0.0, 6.0, 0.0]]),
    # test_simple_multi_input_activation: multi_relu's two inputs
    ("multi_input_linear1", lambda: multi_layer(multi_input_module=True), "linear1",
     torch.tensor([[0.0, 6.0, 0.0]]), [[-4.0, 7.0, 7.0, 7.0]]),
    ("multi_input_linear1_alt", lambda: multi_layer(multi_input_module=True), "linear1_alt",
     torch.tensor([[0.0, 6.0, 0.0]]), [[-4.0, 7.0, 7.0, 7.0]]),
    ("multi_input_linear2", lambda: multi_input(4), "model.model.linear2", LINEAR2_INPUTS,
     [[392.0, 394.0]]),
    ("multi_input_relu", lambda: multi_input(5), "model.model.relu", RELU_INPUTS,
     [[90.0, 101.0, 101.0, 101.0]]),
]


@pytest.mark.parametrize("case", ACTIVATION, ids=[c[0] for c in ACTIVATION])
def test_activation_gives_captums_literals(case):
    _, make, layer, x, expected = case
    torch.testing.assert_close(ours(make(), layer, x, "activation"), literal(expected),
                               atol=0.01, rtol=0)


def test_activation_before_an_inplace_relu_in_a_sequential():
    """test_sequential_in_place with a head added (the model must return logits): the
    conv's output is kept before ReLU(inplace=True) overwrites it; channels averaged."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Flatten(),
                          nn.Linear(36, 2))
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        expected = model[0](x).mean((2, 3))
    assert float(expected.min()) < 0  # the in-place ReLU would have changed these
    torch.testing.assert_close(ours(model, "0", x, "activation"), expected)


def test_activation_of_a_sequential_that_is_the_whole_model():
    """test_sequential_module: Conv1dSeqModel's `seq` output [2, 2, 1] is the model's."""
    torch.manual_seed(0)
    model = AsLogits(Conv1dSeqModel())
    x = torch.randn(2, 4, 1000)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(ours(model, "model.seq", x, "activation"), expected)


def test_a_linear_over_a_conv_length_axis_keeps_the_conv_channels_as_its_neurons():
    """Conv1dSeqModel's Linear(1000, 1) runs over the conv's length axis: [N, 2, 1000] ->
    [N, 2, 1]. Its one output per channel would rank a single neuron, so the neurons are the
    2 channels (AXIS_RULES "only axis"), as for the conv before it and as Captum's layer
    methods keep dim 1; describe() and axis_words() say so."""
    torch.manual_seed(0)
    model, x = AsLogits(Conv1dSeqModel()).eval(), torch.randn(3, 4, 1000)
    info = {info.name: info for info in list_layers(model, x)}["model.seq.2"]
    assert (info.neuron_axis, info.n_neurons, info.axis_rule) == (1, 2, "only axis")
    assert info.describe() == "1 position × 2 channels"
    assert info.axis_words() == ("2 channels along dim 1, its only axis besides the batch "
                                 "longer than 1")
    captum = LayerGradientXActivation(model, model.model.seq[2]).attribute(x, target=1)
    torch.testing.assert_close(ours(model, "model.seq.2", x, "gradient_x_activation", target=1),
                               per_neuron(captum))


# ------------------------------------------------------------------- LayerFeatureAblation

ABLATION = [
    ("multi_output_relu1", "multi_relu.relu1", [[0.0, 7.0, 7.0, 7.0]]),
    ("multi_output_relu2", "multi_relu.relu2", [[0.0, 7.0, 7.0, 7.0]]),
    ("multi_output_input_linear1", "linear1", [[0.0, 7.0, 7.0, 7.0]]),
    ("multi_output_input_linear1_alt", "linear1_alt", [[0.0, 7.0, 7.0, 7.0]]),
]


@pytest.mark.parametrize("case", ABLATION, ids=[c[0] for c in ABLATION])
def test_ablation_gives_captums_literals(case):
    """test_simple_multi_output(_input)_ablation: input [0, 6, 0], target 0."""
    _, layer, expected = case
    model = BasicModel_MultiLayer(multi_input_module=True)
    torch.testing.assert_close(ours(model, layer, torch.tensor([[0.0, 6.0, 0.0]]), "ablation"),
                               literal(expected), atol=1e-4, rtol=0)


def test_ablation_with_named_inputs_matches_captum_with_a_zero_baseline():
    """test_multi_input_ablation with the layer baseline 0 instead of [1, 2, 3]; linear1's
    input (attribute_to_layer_input) is linear0's output."""
    model = multi_input(1)
    x = {"x1": torch.tensor([[23.0, 100.0, 0.0], [20.0, 50.0, 30.0]]),
         "x2": torch.tensor([[20.0, 50.0, 30.0], [0.0, 100.0, 0.0]]),
         "x3": torch.tensor([[0.0, 100.0, 10.0], [2.0, 10.0, 3.0]])}
    forward, inputs = captum_call(model, x)
    for module, attribute_to_layer_input in [(model.model.model.linear0, False),
                                             (model.model.model.linear1, True)]:
        captum = LayerFeatureAblation(forward, module).attribute(
            inputs, target=0, attribute_to_layer_input=attribute_to_layer_input)
        torch.testing.assert_close(ours(model, "model.model.linear0", x, "ablation"), captum)
    # hand check, row 1: x = [43, 250, 40]; linear0's neuron 1 carries 250 into 4 relus
    torch.testing.assert_close(ours(model, "model.model.linear0", x, "ablation")[0, 1],
                               torch.tensor(1000.0))


def test_ablation_of_conv_channels_matches_captum_with_one_group_per_channel():
    """test_simple_multi_input_conv_intermediate: ConvNet_One_Conv with an in-place relu1,
    inputs x and x2 added; Captum's per-position ablation grouped into whole channels."""
    model = BasicModel_ConvNet_One_Conv(inplace=True)
    x = {"x": torch.arange(16, dtype=torch.float).view(1, 1, 4, 4),
         "x2": torch.ones((1, 1, 4, 4))}
    forward, inputs = captum_call(model, x)
    channels = torch.tensor([[[[0, 0], [0, 0]], [[1, 1], [1, 1]]]])
    captum = LayerFeatureAblation(forward, model.relu1).attribute(
        inputs, target=0, layer_mask=channels)
    scores = ours(model, "relu1", x, "ablation")
    torch.testing.assert_close(scores, captum[:, :, 0, 0])
    per_position = LayerFeatureAblation(forward, model.relu1).attribute(inputs, target=0)
    torch.testing.assert_close(per_position, literal(  # Captum's literal, as a check of the port
        [[[[4.0, 13.0], [40.0, 49.0]], [[0, 0], [-15.0, -24.0]]]]))


# --------------------------------------------------------------- LayerIntegratedGradients

def captum_ig_from_zero(model, module, x, target, n_steps, neuron_axis=1):
    """Captum's IntegratedGradients over the model's tail z -> logits, baseline z = 0
    (gausslegendre), summed to [N, n_neurons]: our integrated_gradients' quantity."""
    forward, inputs = captum_call(model, x)
    with torch.no_grad():
        z = {}
        with replaced_output(module, lambda out: z.setdefault("z", out.clone())):
            forward(*inputs)
    z = z["z"]

    def tail(leaf, *values):
        with replaced_output(module, lambda out: leaf):
            return forward(*values)

    attribution = IntegratedGradients(tail).attribute(
        z, baselines=torch.zeros_like(z), target=target, n_steps=n_steps,
        method="gausslegendre", additional_forward_args=inputs)
    return per_neuron(attribution.detach(), neuron_axis)


def test_integrated_gradients_from_zero_at_multi_relu():
    """test_multiple_tensors_compare_with_expected: input [0, 100, 0], target 0. Captum's
    [90, 100, 100, 100] starts at relu(linear1(0)) = [0, 1, 1, 1]; ours starts at 0 and the
    tail is linear, so each neuron gets its whole value [90, 101, 101, 101]."""
    model = BasicModel_MultiLayer(multi_input_module=True)
    for layer in ("multi_relu.relu1", "multi_relu.relu2"):
        scores = ours(model, layer, SIMPLE, "integrated_gradients")
        torch.testing.assert_close(scores, literal([[90.0, 101.0, 101.0, 101.0]]),
                                   atol=0.01, rtol=0)
        torch.testing.assert_close(scores, captum_ig_from_zero(
            model, model.get_submodule(layer), SIMPLE, 0, 32))


@pytest.mark.parametrize("layer", ["linear2", "relu"])
def test_integrated_gradients_where_captum_compares_with_conductance(layer):
    """test_compare_with_layer_conductance_attr_to_outputs: input [50, 50, 50], 1500 steps
    there; ours from z = 0 against Captum's IG over the tail (relu: linear2's input)."""
    model = BasicModel_MultiLayer()
    x = torch.tensor([[50.0, 50.0, 50.0]])
    scores = ours(model, layer, x, "integrated_gradients", n_steps=64)
    expected = captum_ig_from_zero(model, model.get_submodule(layer), x, 0, 64)
    torch.testing.assert_close(scores, expected)
    # linear1 = [140, 151, 151, 151] (relu keeps it), linear2 = [592, 594]; the tail is linear
    by_hand = {"linear2": [[592.0, 0.0]], "relu": [[140.0, 151.0, 151.0, 151.0]]}[layer]
    torch.testing.assert_close(scores, literal(by_hand), atol=0.01, rtol=0)


@pytest.mark.parametrize("layer", ["conv1", "conv2", "fc1"])
def test_integrated_gradients_match_captum_through_a_softmax(layer):
    """Not a Captum LIG case (its cases have linear tails, where IG from 0 equals gradient x
    activation): the conductance tests' ConvNet with fc2 = 0.01 * randn, a nonlinear tail."""
    torch.manual_seed(7)
    model = BasicModel_ConvNet()
    model.fc2.weight = nn.Parameter(0.01 * torch.randn(10, 8))
    x = 100 * torch.randn(3, 1, 10, 10)
    scores = ours(model, layer, x, "integrated_gradients", target=2, n_steps=64)
    expected = captum_ig_from_zero(model, model.get_submodule(layer), x, 2, 64)
    assert float(expected.abs().max()) > 1e-2
    torch.testing.assert_close(scores, expected, atol=1e-4 * float(expected.abs().max()),
                               rtol=1e-3)
    assert not torch.allclose(scores, ours(model, layer, x, "gradient_x_activation", target=2),
                              atol=1e-3, rtol=1e-2)


EMBEDDING_CASES = {
    "single": ({"input1": torch.tensor([[2, 5, 0, 1]]), "input2": torch.tensor([[0, 2, 4, 1]]),
                "input3": torch.tensor([[2, 3, 0, 1]])}, ["embedding1"]),
    "batch": ({"input1": torch.tensor([[2, 5, 0, 1], [3, 1, 1, 0]]),
               "input2": torch.tensor([[0, 2, 4, 1], [2, 3, 5, 7]]),
               "input3": torch.tensor([[3, 5, 6, 7], [2, 3, 0, 1]])}, ["embedding1"]),
    "multiple_layers": ({"input1": torch.tensor([[2, 5, 0, 1], [3, 1, 1, 0]]),
                         "input2": torch.tensor([[0, 2, 4, 1], [2, 3, 5, 7]]),
                         "input3": torch.tensor([[3, 5, 6, 7], [2, 3, 0, 1]])},
                        ["embedding1", "embedding2"]),
}


@pytest.mark.parametrize("case", list(EMBEDDING_CASES))
def test_integrated_gradients_at_embeddings_match_captum(case):
    """test_compare_with_emb_patching(_batch), test_multiple_layers_single_inputs:
    BasicEmbeddingModel(nested_second_embedding=True), three id inputs [N, 4]; a neuron is
    an embedding feature, summed over the 4 tokens."""
    torch.manual_seed(0)
    model = BasicEmbeddingModel(nested_second_embedding=True)
    x, layers = EMBEDDING_CASES[case]
    for layer in layers:
        scores = ours(model, layer, x, "integrated_gradients")
        expected = captum_ig_from_zero(model, model.get_submodule(layer), x, 0, 32,
                                       neuron_axis=2)
        assert scores.shape == (len(x["input1"]), 100)
        assert float(scores.abs().max()) > 1e-3
        torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("four_inputs", [False, True])
def test_integrated_gradients_at_submodels_with_named_inputs(four_inputs):
    """test_multiple_layers_multiple_inputs_shared_input / _multiple_input_outputs: the
    outputs of m1 and m234 (the logits are their sum), randn inputs [5, 3]."""
    torch.manual_seed(0)
    model = BasicModel_MultiLayer_TrueMultiInput()
    names = ["x1", "x2", "x3", "x4"] if four_inputs else ["x1", "x2", "x3"]
    x = {name: torch.randn(5, 3) for name in names}
    for layer in ("m1", "m234"):
        scores = ours(model, layer, x, "integrated_gradients")
        expected = captum_ig_from_zero(model, model.get_submodule(layer), x, 0, 32)
        torch.testing.assert_close(scores, expected)
        with torch.no_grad():  # the tail is z + other: linear, so IG from 0 is z[:, 0]
            z = model.m1(x["x1"]) if layer == "m1" else model.m234(
                x["x2"], x["x3"], x.get("x4", x["x1"]), scale=1)
        torch.testing.assert_close(scores[:, 0], z[:, 0])
        assert float(scores[:, 1].abs().max()) == 0.0


@pytest.mark.parametrize("channels, length", [(1, 6), (3, 6), (2, 3)])
def test_parameter_free_layers_whose_every_axis_follows_the_input(channels, length):
    """BasicModel_MaxPool_ReLU on [N, C, L]: MaxPool1d and ReLU keep the input's channels and
    the model sums over them at the end, so resizing either input dim changes each output
    axis. The channels are the neurons (as Captum's layer methods keep them), every method
    scores them, and gradient x activation equals Captum's summed over positions. [N, 2, 3]
    is the input of Captum's own MaxPool_ReLU test: halved to a length of 1 it is shorter
    than the pooling window, so only a doubled length shows the position axis."""
    torch.manual_seed(0)
    model, x = BasicModel_MaxPool_ReLU().eval(), torch.randn(4, channels, length)
    layers = {info.name: info for info in list_layers(model, x)}
    assert {name: (info.neuron_axis, info.n_neurons) for name, info in layers.items()} == {
        "maxpool": (1, channels), "relu": (1, channels)}
    for layer, info in layers.items():
        for method in methods_for(x.dtype, info.kind):  # all but the weights' methods
            assert ours(model, layer, x, method).shape == (4, channels), (layer, method)
        captum = LayerGradientXActivation(model, getattr(model, layer)).attribute(x, target=0)
        torch.testing.assert_close(ours(model, layer, x, "gradient_x_activation"),
                                   per_neuron(captum))
