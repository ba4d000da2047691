"""The oracle and the baseline: `ablation` (exact: each neuron removed alone, the drop of
the target logit) and `random` (seeded noise that every ranking must beat)."""
from __future__ import annotations

import torch

from .registry import Batch, register
from .shared import check_neurons, resolve_targets, selected_logits, step_chunks


@register("ablation", "F(x) - F(x with neuron zeroed): exact, one neuron at a time",
          units="logit drop", colour="#CC6677", logit_effect="score")
def ablation(batch: Batch) -> torch.Tensor:
    """[B, m] or [B, C, m]: the drop of the target when each neuron of `batch.neurons` (all
    n when None) alone is zeroed; one masked pass of the tail per neuron."""
    runner = batch.runner
    z, state, logits = runner.capture(batch.x)
    targets = resolve_targets(batch.targets, logits)
    n_rows = z.shape[0]
    wanted = (torch.arange(z.shape[1], device=z.device) if batch.neurons is None
              else batch.neurons.to(z.device))
    if batch.neurons is not None:
        check_neurons(wanted, z.shape[1])
    base = selected_logits(logits, targets)  # [B] or [B, C]
    effects = []
    with torch.no_grad():
        for chunk in step_chunks(len(wanted), n_rows, batch.max_rows):
            neurons = wanted[chunk]
            ablated = selected_logits(runner.ablate(z, state, neurons), targets, len(neurons))
            effects.append(base.unsqueeze(0) - ablated.unflatten(0, (len(neurons), n_rows)))
    effect = torch.cat(effects)  # [m, B] or [m, B, C]
    return effect.movedim(0, -1)  # [B, m] or [B, C, m]


@register("random", "seeded uniform noise: the baseline every ranking must beat",
          label="random (baseline)", units="arbitrary units",
          colour="#AA4499")
def random(batch: Batch) -> torch.Tensor:
    z, _, logits = batch.runner.capture(batch.x)
    shape = (logits.shape[1], z.shape[1]) if isinstance(batch.targets, str) else (z.shape[1],)
    rows = []
    for index in range(batch.start, batch.start + z.shape[0]):  # per-sample seeds: batch-size free
        generator = torch.Generator().manual_seed(batch.seed * 1_000_003 + index)
        rows.append(torch.rand(shape, generator=generator, dtype=torch.float32))
    return torch.stack(rows).to(z.device)
