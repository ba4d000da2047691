"""Runner selection: the fastest runner that reproduces the model, checked on a few rows and
cached per model and layer."""
from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch import nn

from ...errors import AttributionError
from ..guards import forward_hooks
from ..layers import neuron_axis, output_tensor, run_logits, run_model, split_axis
from ..model_io import n_rows, take
from .base import LayerRunner
from .fx import FxRunner
from .hook import HookRunner


CHECK_ROWS = 4
"""How many rows of the first batch `runner_for` checks a split on (`check_rows`)."""


def check_rows(x: Any) -> Any:
    """`CHECK_ROWS` rows of the batch x [N, ...] (of every named input alike), spread from
    its first row to its last, as padding and lengths vary over a batch; x itself when it
    has no more. A split right on them is right on the batch: a graph runs the same ops on
    any batch (fx and torch.export refuse data-dependent control flow; a graph specialized
    to the batch's size fails on fewer rows), and the engine runs the model in eval mode
    (BatchNorm on its running statistics, no Dropout). Two rows or more tell a per-sample
    output from one shared by the batch."""
    rows = n_rows(x)
    if rows <= CHECK_ROWS:
        return x
    return take(x, torch.linspace(0, rows - 1, CHECK_ROWS).round().long())


def _agrees(runner: LayerRunner, model: nn.Module, x: torch.Tensor) -> bool:
    """Does `runner` reproduce the model's logits on x (`check_rows` of a batch), alone and
    with two stacked variants, and split at the layer's `output_tensor` (of a tuple output,
    the entry hooks would replace)?"""
    seen = []

    def keep(module, args, output):
        tensor = output_tensor(output)
        if not seen:  # a copy: in-place ops after the layer
            seen.append(None if tensor is None else tensor.clone())

    with torch.no_grad(), forward_hooks({runner.module: keep}):
        reference = run_logits(model, x)
    with torch.no_grad():
        z, state, logits = runner.capture(x)
        doubled = runner.tail(torch.cat([z, z]), state, 2)
    tolerance = 1e-4 * (1 + reference.abs().max().item())
    hooked = seen[0] if seen else None
    return (hooked is not None and z.shape == hooked.shape
            and torch.allclose(z, hooked, rtol=1e-4, equal_nan=True,
                               atol=1e-4 * (1 + hooked.abs().max().item()))
            and logits.shape == reference.shape and doubled.shape[0] == 2 * x.shape[0]
            and torch.allclose(logits, reference, rtol=1e-4, atol=tolerance)
            and torch.allclose(doubled, reference.repeat(2, 1), rtol=1e-4, atol=tolerance))


def _fastest_runner(model: nn.Module, path: str, module: nn.Module, x: Any, rows: Any
                    ) -> LayerRunner:
    """An `FxRunner` split at the input shapes of the batch x, where it agrees with the
    model on `rows` (`check_rows(x)`), else a `HookRunner`."""
    try:
        runner = FxRunner(model, path, module, x)  # an export sees the batch's own size
        if _agrees(runner, model, rows):
            return runner
    except AttributionError:
        raise
    except Exception:  # noqa: BLE001 - untraceable (data-dependent control flow, ...): hooks
        pass
    return HookRunner(model, path, module)


_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict[str, LayerRunner]]" = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def runner_for(model: nn.Module, name: str, module: nn.Module, x: torch.Tensor) -> LayerRunner:
    """The fastest runner that reproduces the model on `x` (cached per model and layer),
    checked on `check_rows(x)`: the check costs a few rows, not a batch.

    `name` is a layer spec of `layers.resolve_layer`: "name" (the neuron axis found from the
    data, `layers.neuron_axis`) or "name:axis" (chosen). Call inside `eval_mode(model)`.
    """
    with _CACHE_LOCK:
        cached = _CACHE.get(model, {}).get(name)
    current = cached is not None and cached.is_current(module)
    if current and cached.accepts(x):
        cached.renew()
        return cached
    keep = not (current and n_rows(x) < 2)  # one row of a batch the cached runner runs
    path, chosen = split_axis(name)
    rows = check_rows(x)
    try:
        runner = _fastest_runner(model, path, module, x, rows)
        with torch.no_grad():
            z, _, logits = runner.capture(rows)  # a HookRunner raises "runs twice" here
    except AttributionError:
        if rows is not x:  # where the model fails on the rows, its message names the batch
            with torch.no_grad():
                run_model(model, x)
        raise
    if z.dim() < 2:
        raise AttributionError(
            f"Layer {path!r} has no neuron axis: its output has shape {list(z.shape)}. "
            "Pick a layer from list_layers()."
        )
    if z.shape[0] != n_rows(rows):
        raise AttributionError(
            f"Layer {path!r} has no output per sample: its output has shape "
            f"{list(z.shape)} for {n_rows(rows)} samples (e.g. position embeddings shared by "
            "the batch). Pick a layer from list_layers().")
    if chosen is not None:
        if not -z.dim() < chosen < z.dim() or chosen % z.dim() == 0:
            raise AttributionError(
                f"Neuron axis {chosen} does not fit layer {path!r}, whose output has shape "
                f"{list(z.shape)} (batch = dim 0); choose 1..{z.dim() - 1}.")
        runner.axis, runner.axis_rule = chosen % z.dim(), "chosen"
    elif z.dim() > 2:  # positions too: which axis holds the neurons is read from the data
        runner.axis, runner.axis_rule = neuron_axis(model, path, rows)
    runner.n_classes, runner.layer_size = logits.shape[1], z[0].numel()
    if keep:
        with _CACHE_LOCK:
            _CACHE.setdefault(model, {})[name] = runner
    return runner
