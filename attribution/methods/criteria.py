"""Pruning criteria that read no gradient: a neuron's active fraction (1 - APoZ), and the
layer's own weights (`weight_norm`, `bn_scale`: data-free)."""
from __future__ import annotations

import torch

from ..engine.layers import BATCH_NORMS, WEIGHT_LAYOUTS, module_kind
from ..errors import AttributionError
from .registry import REGISTRY, Batch, register
from .shared import batch_mask, per_sample, reduce_spatial


@register("active_fraction", "share of a neuron's positions where z > 0 (1 - APoZ, Hu 2016)",
          label="active fraction", units="share of positions", colour="#BBBBBB")
def active_fraction(batch: Batch) -> torch.Tensor:
    z, _, logits = batch.runner.capture(batch.x)
    return per_sample(reduce_spatial((z > 0).to(z.dtype), 1, "mean", batch_mask(batch)), batch,
                       logits)




def _own_weight(batch: Batch, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the layer module's own weight with its neurons' axis first [n, ...], logits [B, C]),
    checked against the layer's neurons: the layer is of a kind `method` scores
    (`Method.layer_kinds`), has the weight, its neurons are the axis the scores use, and
    there are as many."""
    runner = batch.runner
    kind = module_kind(runner.name, runner.module)
    if kind not in REGISTRY[method].layer_kinds:
        what = ("BatchNorm layers by |gamma|" if method == "bn_scale" else
                "layers by the weights that produce each neuron (Linear, Conv, Embedding, "
                "norm layers)")
        raise AttributionError(f"{method} scores {what}; layer {runner.name!r} is a {kind}. "
                               "Score the layer that owns those weights (list_layers), or "
                               "use a method that reads the data.")
    weight = runner.module._parameters.get("weight")
    if weight is None:
        raise AttributionError(f"{method}: layer {runner.name!r} ({kind}) has no weight of "
                               "its own (affine=False or elementwise_affine=False), so there "
                               "is nothing to score; use a method that reads the data.")
    weight_axis, output_axis = WEIGHT_LAYOUTS[kind]
    if kind.startswith("ConvTranspose") and getattr(runner.module, "groups", 1) != 1:
        raise AttributionError(f"{method}: layer {runner.name!r} is a grouped {kind}, whose "
                               "weight does not hold one slice per output channel.")
    z, _, logits = runner.capture(batch.x)
    neurons_at = 1 if output_axis == 1 else z.dim() - 1
    per_neuron = weight.detach().movedim(weight_axis, 0)
    if runner.axis != neurons_at or per_neuron.shape[0] != z.shape[1]:
        raise AttributionError(
            f"{method}: the neurons of layer {runner.name!r} are taken on output axis "
            f"{runner.axis} ({z.shape[1]} of them), but its {kind} weight produces the "
            f"{per_neuron.shape[0]} values of axis {neurons_at}; score it as "
            f"'{runner.name}:{neurons_at}'.")
    return per_neuron, logits


@register("weight_norm", "L1 norm of the layer's own weights that produce each neuron "
          "(data-free; Li et al. 2017)", label="weight L1 norm", units="weight L1 norm",
          colour="#8C6D31", layer_kinds=tuple(WEIGHT_LAYOUTS))
def weight_norm(batch: Batch) -> torch.Tensor:
    per_neuron, logits = _own_weight(batch, "weight_norm")
    norms = per_neuron.abs().reshape(per_neuron.shape[0], -1).sum(1).to(torch.float32)
    return per_sample(norms.expand(logits.shape[0], -1), batch, logits)


@register("bn_scale", "|gamma| of a BatchNorm layer (data-free; network slimming, Liu 2017)",
          label="BatchNorm |γ|", units="|γ|", colour="#6B6ECF", layer_kinds=BATCH_NORMS)
def bn_scale(batch: Batch) -> torch.Tensor:
    gamma, logits = _own_weight(batch, "bn_scale")
    return per_sample(gamma.abs().to(torch.float32).expand(logits.shape[0], -1), batch,
                       logits)
