"""`deeplift` against Captum's LayerDeepLift (zero input baseline, attributed to the layer's
output, summed over positions): Captum's own test_layer_deeplift.py models and inputs, mapped
to our conventions and compared with Captum at test time (its literals where they hold for a
zero baseline); then every rule (rescale, max-pool, softmax) chained as Captum's hooks chain
them, overlapping pools, in-place ReLUs, a .pt2, every class at once; the completeness
property that makes DeepLift worth having; and the refusals.

Captum's test_layer_deeplift.py, case by case (M = mapped, N = not applicable):
  M test_linear_layer_deeplift / _batch (l3's output, [[15.0]], a literal that holds)
  M test_relu_layer_deeplift, _add_args  (attribute_to_layer_input: the relu's input is the
                                          cat of l1 and l2, no module; its output instead)
  M test_relu_layer_deeplift_multiple_output (multi_relu's first output: [[0, -1, -1, -1]])
  M test_lin_maxpool_lin_classification  (baseline 0 instead of Captum's [1, 2, 3, 9] rows)
  M test_convnet_maxpool2d/3d_classification (pool1 and conv2 of the convnets)
  M test_inplace_maxpool_relu_with_custom_attr_func (the maxpool's attribution)
  N *_wo_inp_marginal_effects, *_custom_attr_func (multipliers alone: no such method),
    *deepliftshap* (a distribution of baselines)
"""
import pytest
import torch
from captum.attr import LayerDeepLift
from captum.testing.helpers.basic_models import (
    BasicModel_ConvNet, BasicModel_ConvNet_MaxPool3d, BasicModel_MaxPool_ReLU,
    BasicModel_MultiLayer, LinearMaxPoolLinearModel, ReLULinearModel)
from torch import nn

import attribution as at
from tests.support.models import TokenNet, build, build_model, exported


def captum(model, layer, x, targets):
    """Captum's LayerDeepLift from a zero baseline, summed over positions: [N, n]."""
    module = model.get_submodule(layer)
    if isinstance(x, dict):
        names = list(x)
        method = LayerDeepLift(model, module)
        method.forward_func = lambda *values: model(**dict(zip(names, values)))
        inputs = tuple(x.values())
        attribution = method.attribute(inputs, tuple(torch.zeros_like(v) for v in inputs),
                                       target=targets)
    else:
        attribution = LayerDeepLift(model, module).attribute(x, torch.zeros_like(x),
                                                             target=targets)
    if isinstance(attribution, tuple):
        attribution = attribution[0]
    example = at.NamedInputs(x) if isinstance(x, dict) else x
    axis = next((info.neuron_axis for info in at.list_layers(model, example)
                 if info.name == layer), 1)  # the layer's neurons, as we take them
    attribution = attribution.movedim(axis, 1)
    return attribution.flatten(2).sum(2) if attribution.dim() > 2 else attribution


def ours(model, layer, x, targets):
    return at.neuron_scores(model, layer, x, targets, "deeplift")


X1, X2 = torch.tensor([[-10.0, 1.0, -5.0]]), torch.tensor([[3.0, 3.0, 1.0]])
CAPTUM_CASES = [  # (case, model, layer, inputs, targets)
    ("linear_layer_deeplift", lambda: ReLULinearModel(inplace=True), "l3",
     {"x1": X1, "x2": X2}, torch.tensor([0])),
    ("relu_layer_deeplift", lambda: ReLULinearModel(inplace=True), "relu",
     {"x1": X1, "x2": X2}, torch.tensor([0])),
    ("linear_layer_deeplift_batch", lambda: ReLULinearModel(), "relu",
     {"x1": X1.repeat(3, 1), "x2": X2.repeat(3, 1)}, torch.zeros(3, dtype=torch.long)),
    ("multiple_output", lambda: BasicModel_MultiLayer(multi_input_module=True), "multi_relu",
     X1, torch.tensor([0])),
    ("lin_maxpool_lin", LinearMaxPoolLinearModel, "pool1", torch.ones(2, 4),
     torch.tensor([0, 0])),
    ("lin_maxpool_lin_lin1", LinearMaxPoolLinearModel, "lin1",
     torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 8.0, 6.0, 7.0]]), torch.tensor([0, 0])),
    ("convnet_pool1", BasicModel_ConvNet, "pool1", 100 * torch.randn(2, 1, 10, 10),
     torch.tensor([0, 3])),
    ("convnet_conv2", BasicModel_ConvNet, "conv2", 100 * torch.randn(2, 1, 10, 10),
     torch.tensor([0, 3])),
    ("convnet_conv1", BasicModel_ConvNet, "conv1", torch.randn(4, 1, 10, 10),
     torch.tensor([0, 1, 2, 3])),
    ("convnet3d_pool1", BasicModel_ConvNet_MaxPool3d, "pool1",
     100 * torch.randn(2, 1, 10, 10, 10), torch.tensor([0, 0])),
    ("inplace_maxpool_relu", lambda: BasicModel_MaxPool_ReLU(inplace=True), "maxpool",
     torch.tensor([[[1.0, 2.0, -4.0], [-3.0, -2.0, -1.0]]]), torch.tensor([0])),
]


@pytest.mark.parametrize("case", CAPTUM_CASES, ids=[case[0] for case in CAPTUM_CASES])
def test_captums_own_cases_match_captum(case):
    _, build_model_, layer, x, targets = case
    torch.manual_seed(0)
    model = build_model_().eval()
    expected = captum(model, layer, x, targets)
    assert torch.allclose(ours(model, layer, x, targets), expected, atol=1e-5, rtol=1e-5)


def test_captums_literals_hold_for_a_zero_baseline():
    model = ReLULinearModel(inplace=True)
    got = ours(model, "l3", {"x1": X1, "x2": X2}, torch.tensor([0]))
    assert got.tolist() == [[15.0]]
    multi = BasicModel_MultiLayer(multi_input_module=True)
    assert ours(multi, "multi_relu", X1, torch.tensor([0])).tolist() == [[0.0, -1.0, -1.0,
                                                                         -1.0]]


class Chains(nn.Module):
    """Every rule, chained as models chain them: conv -> max-pool -> Tanh (two ruled modules
    in a row), a Conv1d -> ELU -> MaxPool1d, Linear -> Sigmoid -> Softplus -> LeakyReLU,
    then a Softmax over the logits; `pool` sets the first pool's window (overlapping or not)."""

    def __init__(self, pool=(2, 2, 0)):
        super().__init__()
        self.conv, self.pool, self.act = nn.Conv2d(2, 4, 3, padding=1), nn.MaxPool2d(*pool), \
            nn.Tanh()
        self.conv2, self.elu, self.pool1 = nn.Conv1d(4, 3, 2), nn.ELU(), nn.MaxPool1d(2)
        self.fc, self.sig, self.soft, self.leaky = nn.LazyLinear(6), nn.Sigmoid(), \
            nn.Softplus(), nn.LeakyReLU(0.1)
        self.out, self.softmax = nn.Linear(6, 3), nn.Softmax(dim=1)

    def forward(self, x):
        h = self.act(self.pool(self.conv(x))).flatten(2)
        h = self.pool1(self.elu(self.conv2(h)))
        h = self.leaky(self.soft(self.sig(self.fc(h.flatten(1)))))
        return self.softmax(self.out(h))


def _chains(pool):
    torch.manual_seed(0)
    model, x = Chains(pool), torch.randn(10, 2, 8, 8)
    model(x)  # materialise the lazy layer
    return model.eval(), x, torch.randint(0, 3, (10,))


@pytest.mark.parametrize("pool", [(2, 2, 0), (3, 2, 1)], ids=["windows apart",
                                                              "windows overlap"])
@pytest.mark.parametrize("layer", ["conv", "pool", "act", "conv2", "elu", "fc", "sig", "out"])
def test_every_rule_chained_as_in_captum(pool, layer):
    model, x, y = _chains(pool)
    assert torch.allclose(ours(model, layer, x, y), captum(model, layer, x, y), atol=1e-6)


def test_every_class_at_once_and_a_pt2_match_captum(tmp_path):
    model, x, y = _chains((3, 2, 1))
    every = at.neuron_scores(model, "fc", x, "all", "deeplift")  # [N, C, n]
    for c in range(3):
        assert torch.allclose(every[:, c], captum(model, "fc", x, torch.full((10,), c)),
                              atol=1e-6)
    loaded = exported(model, x, tmp_path / "chains.pt2")  # rules found by module kind
    for layer in ("conv", "fc"):
        assert torch.allclose(ours(loaded, layer, x, y), captum(model, layer, x, y), atol=1e-6)


def test_an_inplace_relu_after_the_layer_is_rescaled_like_a_plain_one():
    model, x, y = build("residual_mlp")  # act2 is ReLU(inplace=True)
    inplace = ours(model, "fc2", x, y)
    model.act2.inplace = False
    assert torch.equal(ours(model, "fc2", x, y), inplace)
    assert torch.allclose(inplace, captum(model, "fc2", x, y), atol=1e-6)


def test_the_scores_add_up_to_the_change_of_the_logit():
    """Completeness: through ReLUs with nothing chained, the rescale rule's scores at a layer
    sum to F(x) - F(baseline) for each sample."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 4)).eval()
    x, y = torch.randn(12, 6), torch.randint(0, 4, (12,))
    with torch.no_grad():
        change = (model(x) - model(torch.zeros_like(x))).gather(1, y[:, None])[:, 0]
    for layer in ("0", "1", "2"):
        assert torch.allclose(ours(model, layer, x, y).sum(1), change, atol=1e-5)
    gradient_x_activation = at.neuron_scores(model, "0", x, y, "gradient_x_activation")
    assert not torch.allclose(gradient_x_activation.sum(1), change, atol=1e-3)


def test_a_rule_module_run_twice_after_the_layer_is_refused_with_the_reason():
    model, x, y = build_model("resnet", n=4)  # a block's ReLU runs twice
    with pytest.raises(at.AttributionError, match=r"'layer1\.0\.relu' \(ReLU\) runs more than "
                                                  r"once after layer 'layer1\.0\.conv1'"):
        ours(model, "layer1.0.conv1", x, y)
    assert ours(model, "layer4.0.bn2", x, y).shape == (4, 32)  # its relu runs once after it


def test_token_ids_have_no_zero_baseline_to_start_from():
    assert "deeplift" not in at.methods_for(torch.long)
    model, ids = TokenNet().eval(), torch.randint(0, 10, (4, 5))
    with pytest.raises(at.AttributionError, match="deeplift starts from a zero baseline of the "
                                                  "inputs themselves, which torch.int64"):
        at.neuron_scores(model, "embed", ids, None, "deeplift")


class MaskedMean(nn.Module):
    """Features [N, T, F] averaged over the real tokens of an attention mask [N, T]."""

    def __init__(self):
        super().__init__()
        self.proj, self.act, self.out = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)

    def forward(self, features, attention_mask):
        hidden = self.act(self.proj(features))
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.out((hidden * weights).sum(1) / weights.sum(1))


def test_the_baseline_runs_once_where_every_sample_shares_it():
    """A zero baseline of float inputs is one row for every sample: the model runs on B + 1
    rows, not Captum's 2B, with Captum's scores. An attention mask stays as it is in the
    baseline, so there each sample's baseline runs on its own row, as in Captum."""
    model, x, targets = build("residual_mlp")
    x, targets = x[:10], targets[:10]
    rows = []
    first = next(module for module in model.modules() if isinstance(module, nn.Linear))
    handle = first.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    try:
        scores = ours(model, "fc1", x, targets)
    finally:
        handle.remove()
    assert max(rows) == 11  # (smaller calls: the layer found on a few examples)
    torch.testing.assert_close(scores, captum(model, "fc1", x, targets).detach(),
                               rtol=1e-4, atol=1e-6)
    masked = MaskedMean().eval()
    features = torch.randn(6, 5, 4)
    mask = (torch.arange(5) < torch.tensor([5, 3, 4, 2, 5, 1])[:, None]).long()
    rows.clear()
    handle = masked.proj.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    try:
        scores = ours(masked, "proj", at.NamedInputs(
            {"features": features, "attention_mask": mask}), torch.arange(6) % 3)
    finally:
        handle.remove()
    assert max(rows) == 12
    method = LayerDeepLift(masked, masked.proj)
    expected = method.attribute(features, torch.zeros_like(features), target=torch.arange(6) % 3,
                                additional_forward_args=(mask,))
    weights = mask.unsqueeze(-1).float()
    torch.testing.assert_close(scores, (expected * weights).sum(1).detach(), rtol=1e-4,
                               atol=1e-6)
