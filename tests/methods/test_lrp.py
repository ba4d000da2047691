"""`lrp` against Captum's LayerLRP with its default rules (epsilon 1e-9 for Linear, Conv2d,
BatchNorm2d and the pools; ReLU, Tanh and Dropout passed through), summed over positions:
Captum's own test_layer_lrp.py literals and models, then conv nets with BatchNorm, in-place
ReLUs and pools, a .pt2, every class at once, relevance conservation, and the refusals.

Captum's test_layer_lrp.py, case by case (P = ported literal, M = mapped, N = not applicable):
  P test_lrp_basic_attributions      (conv1 of BasicModel_ConvNet_One_Conv: [75, -21] summed
                                      over positions from Captum's per-position literal)
  P test_lrp_simple_tanh             (tanh passed through: 0.0537 for each neuron)
  M test_lrp_simple_attributions, _inplaceReLU (relevance at the relu's output = Captum's
                                      at linear2's input; in place or not)
  N test_lrp_simple_attributions_all_layers(_delta) (its literal [18, 36, 54] is the
                                      relevance at the model's input: attribute_to_layer_input)
  M test_lrp_simple_repeat_attributions (the model is unchanged after: weights and outputs)
  M test_lrp_creator_activation      (Captum refuses a Sigmoid child the forward never calls;
                                      we refuse a module without a rule that the relevance
                                      passes through, and only that)
  N test_lrp_creator, *_GammaRule, *_AlphaBeta (rules set by hand: only the default rules)
"""
import pytest
import torch
from captum.attr import LayerLRP
from captum.testing.helpers.basic_models import BasicModel_ConvNet_One_Conv, SimpleLRPModel
from torch import nn

import attribution as at
from tests.support.models import build, exported, randomize_batchnorm

pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require")


def captum(model, layer, x, targets, to_input=False):
    """Captum's LayerLRP, summed over positions: [N, n]."""
    relevance = LayerLRP(model, model.get_submodule(layer)).attribute(
        x, target=targets, attribute_to_layer_input=to_input)
    relevance = relevance[0] if isinstance(relevance, (tuple, list)) else relevance
    return relevance.flatten(2).sum(2) if relevance.dim() > 2 else relevance


def ours(model, layer, x, targets):
    return at.neuron_scores(model, layer, x, targets, "lrp")


def test_captums_conv_literal():
    model, x = BasicModel_ConvNet_One_Conv(), torch.arange(16.0).view(1, 1, 4, 4)
    target = model(x).argmax(1)
    assert ours(model, "conv1", x, target).tolist() == [[75.0, -21.0]]


def test_captums_tanh_literal_passes_the_relevance_through_tanh():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3, bias=False)
            self.linear.weight.data.fill_(0.1)
            self.tanh = nn.Tanh()
            self.linear2 = nn.Linear(3, 1, bias=False)
            self.linear2.weight.data.fill_(0.1)

        def forward(self, x):
            return self.linear2(self.tanh(self.linear(x)))

    got = ours(Model(), "linear", torch.tensor([[1.0, 2.0, 3.0]]), None)
    assert torch.allclose(got, torch.full((1, 3), 0.0537), atol=1e-4)


@pytest.mark.parametrize("inplace", [False, True])
def test_relevance_at_a_relu_is_what_the_next_layer_takes_in(inplace):
    model = SimpleLRPModel(inplace).eval()
    x = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])
    at_relu = ours(model, "relu", x, None)
    assert torch.allclose(at_relu, captum(model, "linear2", x, 0, to_input=True))
    assert at_relu.tolist() == [[36.0, 36.0, 36.0], [72.0, 72.0, 72.0]]  # 108 = 3 x 36
    assert torch.allclose(ours(model, "linear", x, None), captum(model, "linear", x, 0))


class ConvNet(nn.Module):
    """Conv2d -> BatchNorm2d -> in-place ReLU -> MaxPool2d -> Conv2d -> ReLU ->
    AdaptiveAvgPool2d -> Dropout -> Linear: every default rule."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.relu, self.pool = nn.ReLU(inplace=True), nn.MaxPool2d(2)
        self.conv2, self.relu2 = nn.Conv2d(4, 6, 3), nn.ReLU()
        self.avg, self.drop, self.fc = nn.AdaptiveAvgPool2d(1), nn.Dropout(), nn.Linear(6, 3)

    def forward(self, x):
        h = self.pool(self.relu(self.bn(self.conv1(x))))
        return self.fc(self.drop(self.avg(self.relu2(self.conv2(h))).flatten(1)))


def _conv_net():
    torch.manual_seed(0)
    model = randomize_batchnorm(ConvNet()).eval()
    return model, torch.randn(6, 2, 8, 8), torch.randint(0, 3, (6,))


@pytest.mark.parametrize("layer", ["conv1", "bn", "pool", "conv2", "avg", "fc"])
def test_every_default_rule_matches_captum(layer):
    model, x, y = _conv_net()
    assert torch.allclose(ours(model, layer, x, y), captum(model, layer, x, y), atol=1e-6)


def test_every_class_at_once_and_a_pt2_match_captum(tmp_path):
    model, x, y = _conv_net()
    every = at.neuron_scores(model, "conv2", x, "all", "lrp")
    for c in range(3):
        assert torch.allclose(every[:, c], captum(model, "conv2", x, torch.full((6,), c)),
                              atol=1e-6)
    loaded = exported(model, x, tmp_path / "conv.pt2")
    assert torch.allclose(ours(loaded, "conv1", x, y), captum(model, "conv1", x, y), atol=1e-6)


def test_relevance_is_conserved_through_bias_free_layers():
    """The epsilon rule conserves relevance where nothing absorbs it (no biases, eps ~ 0):
    each layer's relevances sum to the target logit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8, bias=False), nn.ReLU(), nn.Linear(8, 5, bias=False),
                          nn.ReLU(), nn.Linear(5, 3, bias=False)).eval()
    x, y = torch.randn(9, 6), torch.randint(0, 3, (9,))
    with torch.no_grad():
        logit = model(x).gather(1, y[:, None])[:, 0]
    for layer in ("0", "1", "2", "4"):
        assert torch.allclose(ours(model, layer, x, y).sum(1), logit, atol=1e-4), layer


def test_the_model_is_left_as_it_was():
    model, x, y = _conv_net()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ours(model, "conv1", x, y)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_model_with_a_module_without_a_default_rule_is_refused_with_the_reason():
    """As Captum: every leaf module of the model needs a rule (test_lrp_creator_activation:
    a Sigmoid child refuses the model even where the forward never calls it)."""
    model, x = BasicModel_ConvNet_One_Conv(), torch.arange(16.0).view(1, 1, 4, 4)
    model.add_module("sigmoid", nn.Sigmoid())
    with pytest.raises(at.AttributionError, match=r"lrp: Captum's LRP has no default rule for "
                                                  r"module 'sigmoid' \(Sigmoid\)"):
        ours(model, "conv1", x, None)
    assert "lrp" not in at.methods_for(torch.float32, "Conv2d", model)
    assert "lrp" in at.methods_for(torch.float32, "Conv2d", BasicModel_ConvNet_One_Conv())
    residual, x_mlp, y_mlp = build("residual_mlp")
    with pytest.raises(at.AttributionError, match=r"'bn' \(BatchNorm1d\)"):
        ours(residual, "fc2", x_mlp, y_mlp)


def test_each_computation_reads_the_model_as_it_is_now():
    """The modules with a rule are found once per computation, not per batch: a module
    swapped between two computations is seen by the second (refused here: GELU has no rule),
    and swapped back, the scores are as before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x, targets = torch.randn(40, 5), torch.arange(40) % 3
    before = at.neuron_scores(model, "0", x, targets, "lrp", batch_size=8)
    torch.testing.assert_close(before, captum(model, "0", x, targets).detach())
    relu = model[1]
    model[1] = nn.GELU()
    with pytest.raises(at.AttributionError, match="'1' \\(GELU\\)"):
        at.neuron_scores(model, "0", x, targets, "lrp", batch_size=8)
    model[1] = relu
    torch.testing.assert_close(at.neuron_scores(model, "0", x, targets, "lrp", batch_size=8),
                               before)
