"""The pruning literature's structural criteria, against their definitions on hand-set models
and on the test zoo: `active_fraction` (1 - APoZ, Hu et al. 2016), `weight_norm` (the L1
norm of a layer's own weights producing each neuron, Li et al. 2017, data-free) and
`bn_scale` (|gamma| of a BatchNorm, Liu et al. 2017, data-free); the layers they refuse,
with the reason; and the methods each layer kind is offered (`methods_for`)."""
import pytest
import torch
from torch import nn

import attribution as at

from tests.support import references
from tests.support.models import SequenceNet, build, build_model, exported


def test_active_fraction_is_the_share_of_positive_positions():
    torch.manual_seed(0)
    for model, layer, x, y in [
            (*build("residual_mlp")[:1], "fc1", *build("residual_mlp")[1:]),
            (*build("residual_conv")[:1], "conv1", *build("residual_conv")[1:])]:
        z = references.layer_output(model, dict(model.named_modules())[layer], x)
        expected = (z > 0).float().flatten(2).mean(2) if z.dim() > 2 else (z > 0).float()
        torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "active_fraction"),
                                   expected)
    sequence, x = SequenceNet().eval(), torch.randn(6, 9, 3)
    z = references.layer_output(sequence, sequence.proj, x)  # [N, T, F]: features are neurons
    torch.testing.assert_close(at.neuron_scores(sequence, "proj", x, None, "active_fraction"),
                               (z > 0).float().mean(1))


def hand_set() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -2.0, 3.0], [0.0, 0.0, -1.0]]))
        model[1].weight.copy_(torch.tensor([-2.0, 0.5]))
    return model.eval()


def test_the_weights_criteria_are_literal_and_the_same_for_every_sample():
    model, x = hand_set(), torch.randn(5, 3)
    y = torch.randint(0, 2, (5,))
    torch.testing.assert_close(at.neuron_scores(model, "0", x, y, "weight_norm"),
                               torch.tensor([[6.0, 1.0]]).expand(5, 2))
    torch.testing.assert_close(at.neuron_scores(model, "1", x, y, "bn_scale"),
                               torch.tensor([[2.0, 0.5]]).expand(5, 2))
    torch.testing.assert_close(at.neuron_scores(model, "1", x, y, "weight_norm"),  # |gamma|
                               torch.tensor([[2.0, 0.5]]).expand(5, 2))
    every = at.neuron_scores(model, "0", x, "all", "weight_norm")
    assert every.shape == (5, 2, 2) and torch.equal(every[:, 1], every[:, 0])


def test_weight_norm_reads_each_layouts_output_axis():
    torch.manual_seed(0)
    conv_model, x, y = build("residual_conv")
    conv = conv_model.conv1  # weight [out, in, kh, kw]: filter j
    torch.testing.assert_close(at.neuron_scores(conv_model, "conv1", x, y, "weight_norm")[0],
                               conv.weight.detach().abs().flatten(1).sum(1))
    gpt2, ids, labels = build_model("gpt2", n=4)
    layer = "model.transformer.h.0.mlp.c_fc"  # transformers' Conv1D: weight [in, out]
    weight = gpt2.get_submodule(layer).weight.detach()
    torch.testing.assert_close(at.neuron_scores(gpt2, layer, ids, labels, "weight_norm")[0],
                               weight.abs().sum(0))
    embedding = "model.transformer.wte"  # weight [vocabulary, features]: column j
    torch.testing.assert_close(
        at.neuron_scores(gpt2, embedding, ids, labels, "weight_norm")[0],
        gpt2.get_submodule(embedding).weight.detach().abs().sum(0))


def test_exported_programs_keep_their_layers_kinds(tmp_path):
    model, x, y = build("residual_mlp")
    program = exported(model, x, tmp_path / "mlp.pt2")
    for layer, method in (("fc1", "weight_norm"), ("bn", "bn_scale"), ("fc2", "active_fraction")):
        torch.testing.assert_close(at.neuron_scores(program, layer, x, y, method),
                                   at.neuron_scores(model, layer, x, y, method))


def test_layers_they_cannot_score_are_refused_with_the_reason():
    model, x = hand_set(), torch.randn(4, 3)
    with pytest.raises(at.AttributionError, match="layer '2' is a ReLU"):
        at.neuron_scores(model, "2", x, None, "weight_norm")
    with pytest.raises(at.AttributionError, match="bn_scale scores BatchNorm.*'0' is a Linear"):
        at.neuron_scores(model, "0", x, None, "bn_scale")
    plain = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2))
    with pytest.raises(at.AttributionError, match="no weight of its own"):
        at.neuron_scores(plain.eval(), "1", x, None, "bn_scale")
    over_length = nn.Sequential(nn.Conv1d(2, 3, 1), nn.Linear(5, 3), nn.Flatten(),
                                nn.Linear(9, 2)).eval()  # [N, 3, 5] -> Linear -> [N, 3, 3]
    signal = torch.randn(4, 2, 5)
    with pytest.raises(at.AttributionError, match="score it as '1:2'"):
        at.neuron_scores(over_length, "1:1", signal, None, "weight_norm")
    torch.testing.assert_close(
        at.neuron_scores(over_length, "1:2", signal, None, "weight_norm")[0],
        over_length[1].weight.detach().abs().sum(1))


def test_each_layer_is_offered_the_methods_that_score_it():
    assert "bn_scale" in at.methods_for(torch.float32, "BatchNorm2d")
    assert "bn_scale" not in at.methods_for(torch.float32, "Linear")
    assert "weight_norm" not in at.methods_for(torch.float32, "ReLU")
    assert {"active_fraction", "taylor", "gradient"} <= set(at.methods_for(torch.float32, "ReLU"))
    assert "bn_scale" in at.methods_for(torch.float32)  # no kind given: every method
    model, x, y = build("residual_mlp")
    on_linear = at.oracle_agreement(model, "fc1", x, y)
    on_batch_norm = at.oracle_agreement(model, "bn", x, y)
    assert "bn_scale" not in set(on_linear["method"]) and "weight_norm" in set(on_linear["method"])
    assert "bn_scale" in set(on_batch_norm["method"])
