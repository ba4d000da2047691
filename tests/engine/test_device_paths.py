"""The GPU's code paths, run on the CPU: where reading a value stalls the device
(`shared.syncs_are_free` is False there), the hot loops read none per batch, and their
sync-free path gives the same scores, NaN rows included."""
import collections

import pytest
import torch

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution.methods import registry, shared

from tests.support.models import ResidualMLP, build, groups, methods_scoring

READS = ("item", "__float__", "__bool__", "__int__", "tolist")


@pytest.fixture
def host_reads(monkeypatch):
    """Counts every read of a tensor's value by the host (the calls that sync a GPU)."""
    counts = collections.Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


with torch.device("meta"):  # the methods that score residual_mlp
    MLP_METHODS = [m for m in methods_scoring("Linear", model=ResidualMLP()) if m != "random"]


@pytest.mark.parametrize("method", MLP_METHODS)
def test_where_reads_stall_the_device_no_method_reads_a_value_per_batch(method, host_reads,
                                                                        monkeypatch):
    model, x, y = build("residual_mlp")
    x = x.repeat(4, 1)
    x[5] = float("inf")  # a sample whose logits are not finite: NaN scores, as on the CPU
    y = y.repeat(4)
    summing = registry.REGISTRY[method].sums_to is not None
    n_steps = 64 if summing else 4  # every sample meets its sum: no batch is refined
    facts = ScoreFacts()
    on_cpu = at.neuron_scores(model, "fc2", x, y, method, batch_size=8, n_steps=n_steps,
                              clusters=groups(x), facts=facts)
    assert on_cpu[5].isnan().all() or not registry.REGISTRY[method].uses_gradients
    assert not summing or (facts.sums.steps == n_steps).all()
    monkeypatch.setattr(shared, "syncs_are_free", lambda device: False)
    reads = []
    for batch_size in (80, 8):  # 2 batches, then 20
        host_reads.clear()
        scores = at.neuron_scores(model, "fc2", x, y, method, batch_size=batch_size,
                                  n_steps=n_steps, clusters=groups(x))
        reads.append(sum(host_reads.values()))
        torch.testing.assert_close(scores, on_cpu, rtol=1e-4, atol=1e-6, equal_nan=True)
    # a path method that refines reads one value a batch: whether any sample misses its sum
    per_batch = 1 if registry.REGISTRY[method].refine_factor > 1 else 0
    assert reads[1] - reads[0] == per_batch * (20 - 2), \
        f"{method}: {reads[0]} reads for 2 batches, {reads[1]} for 20"
