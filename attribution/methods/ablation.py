"""The oracle and the baseline: `ablation` (exact: each neuron removed alone, the drop of
the target logit) and `random` (seeded noise that every ranking must beat)."""
from __future__ import annotations

import torch

from .registry import Batch, register
from .shared import resolve_targets, selected_logits, step_chunks


@register("ablation", "F(x) - F(x with neuron zeroed): exact, one neuron at a time",
          units="logit drop", colour="#CC6677", logit_effect="score")
def ablation(batch: Batch) -> torch.Tensor:
    runner = batch.runner
    z, state, logits = runner.capture(batch.x)
    targets = resolve_targets(batch.targets, logits)
    n_rows, n_neurons = z.shape[0], z.shape[1]
    base = selected_logits(logits, targets)  # [B] or [B, C]
    effects = []
    with torch.no_grad():
        for chunk in step_chunks(n_neurons, n_rows, batch.max_rows):
            neurons = torch.arange(chunk.start, chunk.stop, device=z.device)
            ablated = selected_logits(runner.ablate(z, state, neurons), targets, len(neurons))
            effects.append(base.unsqueeze(0) - ablated.unflatten(0, (len(neurons), n_rows)))
    effect = torch.cat(effects)  # [n, B] or [n, B, C]
    return effect.movedim(0, -1)  # [B, n] or [B, C, n]


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
