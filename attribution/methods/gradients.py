"""The layer's output and its first derivative: `gradient` (dF/dz), `activation` (z),
`gradient_x_activation` (z * dF/dz) and the loss's Taylor terms (`taylor`, `fisher`).
One forward and at most one backward per batch."""
from __future__ import annotations

import torch
from torch.nn import functional

from .registry import Batch, Targets, register
from .shared import (batch_mask, classes_first, per_sample, reduce_spatial, resolve_targets,
                     target_gradients, target_gradients_of, with_class_axis, neuron_dim)


@register("gradient", "dF/dz: gradient of the target logit w.r.t. the layer output",
          units="logit per unit activation", colour="#332288", uses_gradients=True,
          token_value=lambda z, grad: grad, logit_effect="times_activation",
          score_line="grad.flatten(2).sum(-1)[0] if grad.dim() > 2 else grad[0]")
def gradient(batch: Batch) -> torch.Tensor:
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = resolve_targets(batch.targets, logits)
    grad = classes_first(target_gradients(batch, logits, z, targets), targets)
    return reduce_spatial(grad, neuron_dim(targets), "sum", batch_mask(batch))


@register("activation", "z: the layer output itself (averaged over positions for conv)",
          units="activation units", colour="#117733", token_value=lambda z, grad: z,
          score_line="z.flatten(2).mean(-1)[0] if z.dim() > 2 else z[0]")
def activation(batch: Batch) -> torch.Tensor:
    z, _, logits = batch.runner.capture(batch.x)
    return per_sample(reduce_spatial(z, 1, "mean", batch_mask(batch)), batch, logits)


@register("gradient_x_activation", "z * dF/dz: first-order Taylor estimate of removing a neuron",
          label="gradient × activation", units="logits", colour="#44AA99",
          uses_gradients=True, token_value=lambda z, grad: z * grad, logit_effect="score",
          score_line="(z * grad).flatten(2).sum(-1)[0] if z.dim() > 2 else (z * grad)[0]")
def gradient_x_activation(batch: Batch) -> torch.Tensor:
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = resolve_targets(batch.targets, logits)
    grad = classes_first(target_gradients(batch, logits, z, targets), targets)
    return reduce_spatial(_times_activation(z, grad, targets), neuron_dim(targets), "sum",
                           batch_mask(batch))


def _times_activation(z: torch.Tensor, grad: torch.Tensor, targets: Targets) -> torch.Tensor:
    """z * grad: [B, (C,) n, ...] from z [B, n, ...] and its gradient (per class for "all").
    Written into `grad` where it is a dense tensor of its own, as autograd hands out for
    class ids (a new product per batch is a visible share of a small model's floor), else a
    new one."""
    z = with_class_axis(z.detach(), targets)
    if grad._base is None and grad.is_contiguous() and grad.shape == z.shape:
        return grad.mul_(z)
    return z * grad


def _loss_taylor_terms(batch: Batch) -> torch.Tensor:
    """sum_p z * dL/dz per neuron, L the cross-entropy of each sample against its target
    class (per class for "all"): [B, n] or [B, C, n]. One forward and one backward of the
    losses, differentiated as `target_gradients` differentiates logits; for class ids, of torch's
    fused cross-entropy summed over the batch (the closest to the floor of the ways tried:
    docs/speed.md)."""
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = resolve_targets(batch.targets, logits)
    if isinstance(targets, str):  # the loss against each class [B, C]
        grad = target_gradients(batch, -torch.log_softmax(logits, 1), z, targets)
    else:  # the batch's summed loss, fused: each sample's only where a NaN mask needs it
        grad = target_gradients_of(
            batch, lambda: functional.cross_entropy(logits, targets, reduction="none"), z,
            targets, total=functional.cross_entropy(logits, targets, reduction="sum"))
    return reduce_spatial(_times_activation(z, classes_first(grad, targets), targets),
                           neuron_dim(targets), "sum", batch_mask(batch))


@register("taylor", "|sum_p z * dL/dz|: first-order Taylor change of the loss (Molchanov 2017)",
          label="Taylor (loss)", units="loss (nats)", colour="#DDCC77", uses_gradients=True)
def taylor(batch: Batch) -> torch.Tensor:
    return _loss_taylor_terms(batch).abs_()  # a fresh tensor: no second one


@register("fisher", "(sum_p z * dL/dz)^2 / 2: the Fisher pruning signal (Theis 2018)",
          label="Fisher (loss)", units="squared loss (nats²)", colour="#882255",
          uses_gradients=True)
def fisher(batch: Batch) -> torch.Tensor:
    return _loss_taylor_terms(batch).square_().mul_(0.5)  # a fresh tensor: no second one
