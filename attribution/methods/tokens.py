"""Per-token scores of one neuron of a sequence layer: which tokens drive it (for display).

The engine's scores pool a sequence layer's positions into one number per sample and neuron
(`methods`); here they stay per position, in a tidy table that a plot draws directly.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..errors import AttributionError
from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_METHOD
from .registry import REGISTRY, method_names
from ..engine.model_io import TEXT_INPUT, NamedInputs, attention_mask
from .passes import Inputs, LayerBatch, LayerPass


def token_methods() -> tuple[str, ...]:
    """The registered methods with a value at each token (`Method.token_value`, e.g. z,
    dF/dz and z * dF/dz, whose sum over a sample's real tokens is the sample's
    `gradient_x_activation` score), as registered now."""
    return method_names(lambda entry: entry.token_value is not None)


def token_scores(model: nn.Module, layer, inputs: Inputs, neuron: int,
                 targets: Optional[torch.Tensor] = None, *,
                 method: str = DEFAULT_METHOD, tokens: Optional[np.ndarray] = None,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> pd.DataFrame:
    """One neuron's score at every real token of every sample.

    Args:
        model: a classifier of token sequences (one tensor of ids, or named inputs).
        layer: a layer whose output has token positions ([N, T, F] or [N, F, T]).
        inputs: ids [N, T], or named inputs with an attention mask (padding is dropped).
        neuron: index along the layer's neuron axis (see `list_layers`).
        targets: LongTensor [N] of classes, or None (the predicted class).
        method: one of `token_methods()`.
        tokens: str [N, T], the token text at each position (`Dataset.tokens`); None = ids.
        batch_size: samples per pass.
    Returns:
        DataFrame with columns sample, position, token, score: one row per real token,
        samples in order.
    """
    if method not in token_methods():
        raise AttributionError(f"Per-token scores exist for {', '.join(token_methods())}; "
                               f"got {method!r}.")
    layer_pass = LayerPass(model, layer, inputs, targets, batch_size=batch_size, accepts=(),
                           need="Per-token scores are for one target per sample")

    def per_position(batch: LayerBatch) -> torch.Tensor:
        return _per_position(batch.runner, batch.x, neuron, method, batch.targets)

    parts = []
    for batch, values in layer_pass.run(per_position):
        x, start = batch.x, batch.start
        ids = x[TEXT_INPUT] if isinstance(x, NamedInputs) and TEXT_INPUT in x else x
        if values.dim() != 2 or values.shape[1] != ids.shape[-1]:
            raise AttributionError(f"Layer {layer_pass.name!r} has no token positions (its "
                                   "output per neuron is not one value per token); pick a "
                                   "layer before the positions are pooled.")
        mask = attention_mask(x)
        real = (mask != 0) if mask is not None else torch.ones_like(values, dtype=torch.bool)
        sample, position = real.nonzero(as_tuple=True)
        sample_cpu, position_cpu = sample.cpu().numpy(), position.cpu().numpy()
        text = (np.asarray(tokens)[start + sample_cpu, position_cpu].astype(str)
                if tokens is not None
                else ids[sample, position].cpu().numpy().astype(str) if not
                ids.is_floating_point() else position_cpu.astype(str))
        parts.append(pd.DataFrame({
            "sample": start + sample_cpu, "position": position_cpu, "token": text,
            "score": values[sample, position].detach().float().cpu().numpy()}))
    return pd.concat(parts, ignore_index=True)


def _per_position(runner, x, neuron: int, method: str, targets) -> torch.Tensor:
    """[B, T]: the neuron's value at each position (the registry's `token_value`)."""
    entry = REGISTRY[method]
    if not entry.uses_gradients:
        z, _, _ = runner.capture(x)
        _check_neuron(neuron, z.shape[1])
        return entry.token_value(z, None)[:, neuron]
    z, logits = runner.forward_with_leaf(x)
    _check_neuron(neuron, z.shape[1])
    chosen = logits.argmax(1) if targets is None else targets
    selected = logits.gather(1, chosen[:, None]).sum()
    grad = (torch.autograd.grad(selected, z)[0] if selected.requires_grad
            else torch.zeros_like(z))
    return entry.token_value(z.detach(), grad)[:, neuron]


def _check_neuron(neuron: int, n_neurons: int) -> None:
    if isinstance(neuron, bool) or not isinstance(neuron, (int, np.integer)) \
            or not 0 <= neuron < n_neurons:
        raise AttributionError(f"neuron must be an index 0..{n_neurons - 1} of this layer; "
                               f"got {neuron!r}.")
