"""The pruning literature's loss-based criteria, `taylor` (Molchanov et al. 2017) and `fisher`
(Theis et al. 2018), against a slow per-sample loop of their definitions and a hand-set model:
s_ij = sum_p z_ijp * dL_i/dz_ijp, L_i the cross-entropy of sample i against its target;
taylor = |s_ij| (absolute value per sample, before any averaging), fisher = s_ij^2 / 2."""
import math

import pytest
import torch
from torch import nn

import attribution as at

from tests.support import references
from tests.support.models import (SequenceNet, TokenNet, UntraceableSequenceNet, build,
                                  build_model, exported)

CASES = [("residual_mlp", "fc1"), ("residual_mlp", "bn"), ("residual_mlp", "fc2"),
         ("residual_conv", "conv1"), ("residual_conv", "conv2"), ("branching", "left.0"),
         ("untraceable", "fc1")]


def expected(criterion: str, term: torch.Tensor) -> torch.Tensor:
    return term.abs() if criterion == "taylor" else 0.5 * term.square()


@pytest.mark.parametrize("criterion", ["taylor", "fisher"])
@pytest.mark.parametrize("arch,layer", CASES)
def test_loss_criteria_match_a_per_sample_loop(criterion, arch, layer):
    model, x, y = build(arch)
    x, y = x[:10], y[:10]
    module = dict(model.named_modules())[layer]
    term = references.per_sample_loss_taylor(model, module, x, y)
    torch.testing.assert_close(at.neuron_scores(model, layer, x, y, criterion, batch_size=4),
                               expected(criterion, term), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("network", [SequenceNet, UntraceableSequenceNet])
def test_loss_criteria_on_a_sequence_sum_each_feature_over_its_positions(network):
    torch.manual_seed(0)
    model, x, y = network().eval(), torch.randn(8, 9, 3), torch.randint(0, 3, (8,))
    for layer in ("proj", "mix"):
        term = references.per_sample_loss_taylor(model, dict(model.named_modules())[layer],
                                                 x, y, neuron_axis=2)
        for criterion in ("taylor", "fisher"):
            torch.testing.assert_close(at.neuron_scores(model, layer, x, y, criterion),
                                       expected(criterion, term), rtol=1e-4, atol=1e-6)


def test_loss_criteria_score_token_ids_exported_programs_and_transformers(tmp_path):
    torch.manual_seed(0)
    tokens, ids = TokenNet().eval(), torch.randint(0, 20, (10, 5))
    labels = torch.randint(0, 3, (10,))
    term = references.per_sample_loss_taylor(tokens, tokens.fc1, ids, labels)
    torch.testing.assert_close(at.neuron_scores(tokens, "fc1", ids, labels, "taylor"),
                               term.abs(), rtol=1e-4, atol=1e-6)

    model, x, y = build("residual_conv")
    program = exported(model, x, tmp_path / "conv.pt2")
    torch.testing.assert_close(at.neuron_scores(program, "conv2", x, y, "fisher"),
                               at.neuron_scores(model, "conv2", x, y, "fisher"),
                               rtol=1e-4, atol=1e-7)

    gpt2, ids, labels = build_model("gpt2", n=4)
    layer = "model.transformer.h.0.mlp.c_fc"
    term = references.per_sample_loss_taylor(gpt2, dict(gpt2.named_modules())[layer], ids,
                                             labels, neuron_axis=2)
    torch.testing.assert_close(at.neuron_scores(gpt2, layer, ids, labels, "taylor"),
                               term.abs(), rtol=1e-4, atol=1e-6)


def test_hand_set_model_gives_the_literal_criteria():
    """z = x = [1, 2] feeds logits equal to z; against class 0, dL/dz = softmax(z) - e_0 =
    [-q, q] with q = sigmoid(1), so z * dL/dz = [-q, 2q]."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with torch.no_grad():
        for linear in model:
            linear.weight.copy_(torch.eye(2))
            linear.bias.zero_()
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    q = 1 / (1 + math.exp(-1))
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "taylor"),
                               torch.tensor([[q, 2 * q]]))
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "fisher"),
                               torch.tensor([[q * q / 2, 2 * q * q]]))


def test_taylor_takes_the_absolute_value_per_sample_before_averaging():
    """Two samples whose signed terms have opposite signs, -2(1 - s) and 2s with s =
    sigmoid(2) (-0.238 and +1.762): the cluster's mean Taylor score is the mean of their
    magnitudes, 1.0, not the magnitude of their mean, 2s - 1."""
    model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 2))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
        model[1].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        model[1].bias.zero_()
    x, y = torch.tensor([[1.0], [-1.0]]), torch.tensor([0, 0])
    term = references.per_sample_loss_taylor(model, model[0], x, y)[:, 0]
    s = 1 / (1 + math.exp(-2))
    torch.testing.assert_close(term, torch.tensor([-2 * (1 - s), 2 * s]))
    table = at.cluster_scores(model, "0", x, y, torch.zeros(2, dtype=torch.long), "taylor")
    assert float(table[0].iloc[0]) == pytest.approx(1.0)
    assert float(term.mean().abs()) == pytest.approx(2 * s - 1)
