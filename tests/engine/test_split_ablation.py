"""Ablation's shortcut after the layer (`FxRunner.ablate`): the per-neuron ops and the affine
op after the layer run once per batch, with values computed from the weights once per
computation; a cached runner must still see every weight edit and module swap."""
import operator

import pytest
import torch
from torch import nn

import attribution as at
from attribution.engine.guards import eval_mode
from attribution.engine.runners import FxRunner, ablation, runner_for

from tests.support import references
from tests.support.models import randomize_batchnorm


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return randomize_batchnorm(nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))).eval()


def _runner(model, layer, x):
    with eval_mode(model):
        return runner_for(model, layer, model.get_submodule(layer), x)


def _ablation_and_reference(model, layer, x, y):
    ours = at.neuron_scores(model, layer, x, y, "ablation", batch_size=7)
    return ours, references.ablation(model, model.get_submodule(layer), x, y)


EDITS = {  # in-place edits a cached runner cannot see by object identity
    "the affine op's weight through .data (no version bump)":
        lambda model: model[3].weight.data.mul_(-2),
    "BatchNorm's running mean through .data": lambda model: model[1].running_mean.data.add_(1),
    "BatchNorm's bias in place": lambda model: model[1].bias.add_(0.5),
    "BatchNorm's weight in place": lambda model: model[1].weight.mul_(-1),
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_scores_follow_weights_edited_between_two_calls(edit):
    """The same cached runner, with its shortcut (BatchNorm, ReLU, then the Linear's columns),
    gives the new scores after an edit of the weights it computed its columns from."""
    model, x, y = _mlp(), torch.randn(20, 6), torch.randint(0, 3, (20,))
    before, expected = _ablation_and_reference(model, "0", x, y)
    torch.testing.assert_close(before, expected, rtol=1e-4, atol=1e-5)
    runner = _runner(model, "0", x)
    chain, affine, _ = runner._prefix
    assert isinstance(runner, FxRunner) and len(chain) == 2 and affine is not None
    with torch.no_grad():
        edit(model)
    after, expected = _ablation_and_reference(model, "0", x, y)
    assert _runner(model, "0", x) is runner  # the cache was used, not a new split
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(after, before, atol=1e-3)


@pytest.mark.parametrize("position", [1, 3])
def test_a_module_swapped_between_calls_is_not_run_by_the_old_runner(position):
    """Replacing the BatchNorm of the chain or the Linear after it gives a new runner, and
    the scores of the new module tree."""
    model, x, y = _mlp(), torch.randn(20, 6), torch.randint(0, 3, (20,))
    before, _ = _ablation_and_reference(model, "0", x, y)
    runner = _runner(model, "0", x)
    torch.manual_seed(1)
    model[position] = randomize_batchnorm(nn.BatchNorm1d(8), seed=1).eval() if position == 1 \
        else nn.Linear(8, 3)
    after, expected = _ablation_and_reference(model, "0", x, y)
    assert _runner(model, "0", x) is not runner
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(after, before, atol=1e-3)


def test_batches_of_other_lengths_in_one_call_use_their_own_zero_values():
    """A conv layer [B, C, T] with BatchNorm and ReLU after it: the chain's value at zero is
    [1, C, T], so batches of another length T in the same computation need their own."""
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Linear(4, 3))).eval()
    batches = [(torch.randn(5, 2, length), torch.randint(0, 3, (5,))) for length in (8, 12, 8)]
    ours = at.neuron_scores(model, "0", batches, "labels", "ablation")
    expected = torch.cat([references.ablation(model, model[0], x, y) for x, y in batches])
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    chain, affine, _ = _runner(model, "0", batches[0][0])._prefix
    assert len(chain) == 2 and affine is None  # BatchNorm, ReLU; the pooling is not affine


class SharedScale(nn.Module):
    """A parameter read by the per-neuron chain (z * scale) and again after the Linear: fx
    reads it once, before the chain, so the rest of the tail must read it from there."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.rand(8) - 0.3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x) * self.scale)) + self.scale.sum()


def test_a_parameter_read_in_the_chain_and_after_it():
    torch.manual_seed(0)
    model, x, y = SharedScale().eval(), torch.randn(12, 6), torch.randint(0, 3, (12,))
    ours, expected = _ablation_and_reference(model, "fc1", x, y)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    chain, affine, _ = _runner(model, "fc1", x)._prefix
    assert [node.target for node in chain] == [operator.mul, torch.relu]
    assert affine.target == "fc2"


def test_the_shortcuts_checks_hold_a_bounded_block_of_copies_on_a_wide_layer(monkeypatch):
    """On a 4,096-wide layer (every copy at once: 4,096 x 2 x 4,096 values) the checks of the
    per-neuron chain, of the affine op and its columns run on at most CHECK_ELEMENTS values
    at a time, find the whole shortcut (BatchNorm and ReLU, then the Linear), and with every
    neuron checked alone (a block of one) the same; the scores are exact ablation's."""
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(
        nn.Linear(8, 4096), nn.BatchNorm1d(4096), nn.ReLU(), nn.Linear(4096, 3))).eval()
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    held, original = [], ablation.run_nodes

    def recording(owner, nodes, value):
        held.append(value.numel())
        return original(owner, nodes, value)

    monkeypatch.setattr(ablation, "run_nodes", recording)
    with torch.no_grad():
        z = model[0](x[:2])
    for elements in (ablation.CHECK_ELEMENTS, 1):
        monkeypatch.setattr(ablation, "CHECK_ELEMENTS", elements)
        held.clear()
        chain, affine, _ = ablation.per_neuron_prefix(_runner(model, "0", x), z)
        assert len(chain) == 2 and affine is not None
        assert max(held) <= max(elements, 2 * 4096)  # one copy of the two samples at least
    ours, expected = _ablation_and_reference(model, "0", x, y)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
