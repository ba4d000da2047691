"""What the method families share: the logits of a batch's targets, their gradients with
respect to the layer (NaN where a logit is not finite; an error naming why where no gradient
reaches the layer), and the reduction of per-position scores to per-neuron ones (conv
positions, a sequence's real tokens).

Shapes: B samples, C classes, n neurons; R stacked variants of a batch (path points,
ablated copies) come copy-major, [R*B, ...].
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from ..engine import model_io
from ..errors import AttributionError
from .registry import Batch, Selected, Targets


def reduce_spatial(scores: torch.Tensor, neuron_dim: int, how: str,
                    mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Collapse the dims after `neuron_dim`: positions of a conv channel or tokens of a
    sequence ([B, (C,) n, ...] -> [B, (C,) n]). With an attention mask [B, T] and one
    position dim of size T only the real tokens count (sum, or mean over them), so padding
    changes no score."""
    if scores.dim() <= neuron_dim + 1:
        return scores
    dims = tuple(range(neuron_dim + 1, scores.dim()))
    if mask is not None and len(dims) == 1 and scores.shape[-1] == mask.shape[1]:
        weights = mask.to(scores.dtype).view(
            (mask.shape[0],) + (1,) * (scores.dim() - 2) + (mask.shape[1],))
        total = (scores * weights).sum(-1)
        return total if how == "sum" else total / weights.sum(-1).clamp_min(1)
    return scores.sum(dims) if how == "sum" else scores.mean(dims)


def batch_mask(batch: "Batch") -> Optional[torch.Tensor]:
    """The batch's attention mask [B, T] (1 = real token), or None."""
    return model_io.attention_mask(batch.x)


def resolve_targets(targets: Targets, logits: torch.Tensor) -> Targets:
    """LongTensor [B] or "all"; None becomes the predicted class."""
    if targets is None:
        return logits.argmax(1)
    return targets


def selected_logits(logits: torch.Tensor, targets: Targets, repeats: int = 1) -> torch.Tensor:
    """Target logits: [R*B] for class ids (repeated over R stacked variants), [R*B, C] for all."""
    if isinstance(targets, str):
        return logits
    if repeats == 1 and not targets.is_inference():
        return logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    # a copy (cat copies even one part, and costs less than repeat): gather saves its index for
    # backward, which an inference tensor cannot be
    return logits.gather(1, repeated_targets(targets, repeats)[:, None]).squeeze(1)


def target_gradients(batch: Batch, logits: torch.Tensor, z: torch.Tensor, targets: Targets,
               repeats: int = 1) -> torch.Tensor:
    """dF/dz: [R*B, n, ...] for class ids, [C, R*B, n, ...] for "all" (batched over classes).

    NaN where the differentiated logit is NaN or inf (its derivative describes no output);
    AttributionError when no gradient can flow from the logits back to z.
    """
    return target_gradients_of(batch, selected_logits(logits, targets, repeats), z, targets)


def target_gradients_of(batch: Batch, selected: Selected, z: torch.Tensor, targets: Targets,
                  total: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`target_gradients` of values already selected: [B] per sample (class ids), or [B, C]. For
    class ids, `total` may be given (their sum, as a fused op computes it), and `selected`
    then as a function giving them, called only where a NaN mask needs them."""
    if total is None:  # what a class-id backward starts from; finite iff they all are
        total = selected.sum()
    try:
        grad = _backward(selected, total, z, targets)
    except RuntimeError as error:
        if "modified by an inplace operation" not in str(error):
            raise
        raise AttributionError(
            "The model cannot be differentiated after this layer: an in-place operation "
            "overwrites a value its own backward pass needs (e.g. x.mul_() after "
            "relu(x, inplace=True)), so plain autograd on the model fails too. Make that "
            f"operation out of place, or use a method without gradients (ablation). ({error})"
        ) from None
    if grad is None:
        raise _no_gradient_path(batch)
    return nan_where_not_finite(grad, selected, targets, total)


def syncs_are_free(device: torch.device) -> bool:
    """Can the host read a value of `device` at no cost (the CPU), or does reading one stall
    the device's queue (a GPU)? The hot loops read no value per batch where they stall."""
    return device.type == "cpu"


def nan_where_not_finite(values: torch.Tensor, selected: Selected, targets: Targets,
                          total: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`values` [(C,) R*B, n, ...] with NaN where the logit they describe, `selected` [R*B]
    (or [R*B, C] for "all"; or a function giving them), is NaN or inf: its derivative
    describes no output.

    On the CPU one reduction decides whether any is, `total` (the sum of `selected`, when
    already computed): the sum of the logits is finite when every one is (a sum that
    overflows only costs the exact check). Elsewhere reading it would make the host wait for
    the device at every batch, so the fill always runs there (`syncs_are_free`)."""
    if syncs_are_free(values.device) and math.isfinite(
            (selected.detach().sum() if total is None else total).item()):
        return values
    broken = ~torch.isfinite((selected() if callable(selected) else selected).detach())
    broken = broken.T if isinstance(targets, str) else broken
    return values.masked_fill(broken.view(broken.shape + (1,) * (values.dim() - broken.dim())),
                              float("nan"))


def _backward(selected: torch.Tensor, total: torch.Tensor, z: torch.Tensor,
              targets: Targets) -> Optional[torch.Tensor]:
    """The gradient of `target_gradients` from its `selected_logits` (and their sum
    `total`), or None when they do not reach z in the graph."""
    if not (selected if isinstance(targets, str) else total).requires_grad:
        return None
    if not isinstance(targets, str):
        return torch.autograd.grad(total, z, allow_unused=True)[0]
    logits = selected  # [B, C]: "all" selects every logit
    n_classes = logits.shape[1]
    grad_outputs = _one_hot(n_classes, logits.dtype, logits.device)[:, None, :].expand(
        n_classes, *logits.shape)
    try:
        return torch.autograd.grad(logits, z, grad_outputs, is_grads_batched=True,
                                   allow_unused=True)[0]
    except RuntimeError:  # an op without a batching rule: one backward per class, one forward
        grads = [torch.autograd.grad(logits[:, c].sum(), z, retain_graph=c < n_classes - 1,
                                     allow_unused=True)[0] for c in range(n_classes)]
        if all(grad is None for grad in grads):
            return None
        return torch.stack([torch.zeros_like(z) if grad is None else grad for grad in grads])


@functools.lru_cache(maxsize=16)
def _one_hot(n_classes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[C, C] identity, made once per (C, dtype, device): read only (expanded views)."""
    return torch.eye(n_classes, dtype=dtype, device=device)


def _no_gradient_path(batch: Batch) -> AttributionError:
    """Why no gradient reaches the layer, told apart by zeroing the layer's whole output."""
    runner = batch.runner
    with torch.no_grad():
        z, state, logits = runner.capture(batch.x)
        zeroed = runner.tail(torch.zeros_like(z), state, 1)
    change = float((zeroed - logits).abs().nan_to_num(nan=float("inf")).max())
    if change > 0:
        return AttributionError(
            f"No gradient flows from the logits back to layer {runner.name!r}, yet zeroing "
            f"its output moves them (by up to {change:.3g}): the model cuts the graph after "
            "this layer (.detach(), torch.no_grad() or a NumPy round trip in forward), so "
            "every gradient would read 0. Remove the cut, or use ablation or activation.")
    return AttributionError(
        f"The logits do not depend on layer {runner.name!r}: zeroing its output changes "
        "none of them and no gradient reaches it (its output is computed but not used for "
        "the logits), so every score would be 0. Pick a layer that feeds the logits "
        "(list_layers).")


def classes_first(grad: torch.Tensor, targets: Targets) -> torch.Tensor:
    """[C, B, ...] -> [B, C, ...] for "all"; unchanged otherwise."""
    return grad.movedim(0, 1) if isinstance(targets, str) else grad


def with_class_axis(z: torch.Tensor, targets: Targets) -> torch.Tensor:
    return z.unsqueeze(1) if isinstance(targets, str) else z


def neuron_dim(targets: Targets) -> int:
    return 2 if isinstance(targets, str) else 1


def per_sample(values: torch.Tensor, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    """[B, n] -> [B, C, n] for targets "all" (a score that no class changes); else as is."""
    if isinstance(batch.targets, str):
        return values.unsqueeze(1).expand(-1, logits.shape[1], -1)
    return values


def check_neurons(neurons: torch.Tensor, n_neurons: int) -> None:
    """AttributionError unless the sorted indices `neurons` lie in 0..n_neurons-1."""
    if int(neurons[-1]) >= n_neurons:
        raise AttributionError(f"Neuron {int(neurons[-1])} is not among the layer's "
                               f"{n_neurons} neurons (0..{n_neurons - 1}).")


def step_chunks(n_steps: int, rows_per_step: int, max_rows: int):
    per_pass = max(1, max_rows // max(rows_per_step, 1))
    for begin in range(0, n_steps, per_pass):
        yield slice(begin, min(n_steps, begin + per_pass))


def repeated_targets(targets: Targets, repeats: int) -> Targets:
    """Class ids [B] -> [repeats*B] (copy-major, a copy even for one); "all" as it is."""
    return targets if isinstance(targets, str) else torch.cat([targets] * repeats)
