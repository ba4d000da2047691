"""The registry of neuron-scoring methods: the types every method shares (`Batch`, what it
sees; `Method`, the facts every view reads), `register` (one decorator line per method) and
`REGISTRY`. The methods themselves live in their families' modules (`methods/__init__.py`
lists them).

A method maps one batch to per-neuron scores: [B, n_neurons], or [B, n_classes, n_neurons]
when `batch.targets == "all"`. For conv layers a neuron is a channel: per-position scores are
summed over spatial positions (the effect of the whole channel), except `activation`, which
is averaged; `ablation` zeroes the whole channel. Sequences likewise: a neuron is a feature at
every token; with an attention mask only real tokens are summed or averaged, and `ablation`
zeroes the feature at every position (padding included: a model that masks padding ignores it).

Methods run under `guards.engine_modes` (autograd on whatever the caller's mode). A gradient
of a NaN/inf logit is NaN; a layer no gradient reaches raises AttributionError, never zeros.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ..engine.layers import module_kind
from ..engine.runners import LayerRunner

Targets = Union[torch.Tensor, str, None]  # LongTensor [B], "all", or None (= predicted class)
Selected = Union[torch.Tensor, Callable[[], torch.Tensor]]  # differentiated values, or a
# function giving them (`shared.target_gradients_of`)


@dataclass
class Batch:
    """What a method sees: the runner for the layer and one batch of work.

    Attributes:
        runner: runs the model around the layer.
        x: inputs [B, ...] on the model's device (a tensor or `model_io.NamedInputs`).
        targets: LongTensor [B], None (predicted class) or "all".
        n_steps: integration steps for path methods.
        start: index of the batch's first sample in the whole dataset.
        seed: seed for the `random` method.
        max_rows: rows per stacked pass when variants are batched.
        codes: for a method fitted to clusters (`Method.fit`), the cluster index of each
            sample [B] (int64, on the CPU) among the ids it was fitted to; else None.
        fitted: what that method's `fit` returned; else None.
        report_sums: where a path method's sums of the batch go (`paths.PathSums` of
            tensors), if its caller wants them; else None.
        neurons: the neurons wanted, int64 [m] sorted, on the device; None = all. A method
            may score only these ([B, m]: `ablation` does, whose cost grows with them) or
            every neuron, of which the engine keeps these.
    """

    runner: LayerRunner
    x: torch.Tensor
    targets: Targets
    n_steps: int
    start: int
    seed: int
    max_rows: int
    codes: Optional[torch.Tensor] = None
    fitted: Any = None
    report_sums: Optional[Callable[[Any], None]] = None
    neurons: Optional[torch.Tensor] = None


ScoringFunction = Callable[[Batch], torch.Tensor]
FitFunction = Callable[..., Any]
"""fit(model, layer, inputs, codes [N], ids, *, batch_size, seed, device) -> an object with a
`note` (one sentence on how well the fit went) and `usable` (False: the fit failed, so its
scores rank nothing), passed to every batch as `Batch.fitted`."""


TokenValue = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
LOGIT_EFFECTS = ("score", "times_activation")


@dataclass(frozen=True)
class Method:
    """A scoring method and the facts every view of it reads: adding a method is one
    function plus one `register` line, and every list of methods, menu and check follows.

    Attributes:
        name: the registry key.
        function: Batch -> scores (see the module docstring).
        summary: one line on what it computes.
        label: how figures, tables and menus name it.
        units: the units of its scores (axis titles, colour bars).
        colour: its colour where methods are drawn side by side.
        needs_float_inputs: it interpolates the inputs themselves, so it cannot score
            integer inputs such as token ids (`methods_for`).
        uses_gradients: it differentiates the logits with respect to the layer's output.
        token_value: its value at each token, from z [B, n, T] and grad = dF/dz (None
            unless `uses_gradients`), [B, n, T], whose sum (activation: mean) over a
            sample's real tokens is its score; None when it has none (`tokens.token_methods`).
        logit_effect: how a neuron's score becomes its effect in logits (the tiny_scores
            check of `diagnose`): "score" (the score is one), "times_activation" (|score| x
            mean |activation|: logits per unit activation), None (no logit units; checked
            against float precision only).
        score_line: the per-sample score as one Python expression of z and grad = dF/dz
            ([1, n, ...] -> [n]), the reference line of the own-code check's slow loop
            (`verdict.expected_loop`); None when it has none (the loop leaves a placeholder).
        layer_kinds: the kinds of layer it scores (`layers.module_kind`: "Linear",
            "BatchNorm2d", ...); None: any layer (`methods_for`).
        module_kinds: the kinds of module its rules cover: a model with a leaf module of
            another kind is refused (as Captum's LRP refuses it); None: any model
            (`methods_for` with a model, `uncovered_modules`).
        fit: for a method fitted to a partition of the samples into clusters (a probe), the
            pre-pass over all the data that fits it (`FitFunction`); every entry point then
            needs the clusters, and a sample's score depends on its cluster. None: a
            sample's score depends on that sample alone.
        sums_to: for a path method, the difference its scores of a sample sum to over the
            layer, in words ("F(z) - F(0) at the layer"); it checks that sum on every batch
            (`paths.sum_misses`) and reports what remains (`paths.PathSums`). None: no such
            property.
        refine_factor: for a path method, how far it integrates a sample that misses its
            sum again, as a factor of `n_steps` (up to `paths.MAX_STEPS_FACTOR`, per sample,
            so a score never depends on its batch); 1: it checks and reports, never refines.
    """

    name: str
    function: ScoringFunction
    summary: str
    label: str
    units: str
    colour: str
    needs_float_inputs: bool = False
    uses_gradients: bool = False
    token_value: Optional[TokenValue] = None
    logit_effect: Optional[str] = None
    score_line: Optional[str] = None
    layer_kinds: Optional[tuple[str, ...]] = None
    module_kinds: Optional[tuple[str, ...]] = None
    fit: Optional[FitFunction] = None
    sums_to: Optional[str] = None
    refine_factor: int = 1


REGISTRY: dict[str, Method] = {}

_FALLBACK_COLOURS = ("#555555", "#882255", "#661100", "#6699CC", "#888888")


def colour_from_name(name: str) -> str:
    """One of a fixed set of colours, picked from the name (a method that gives none)."""
    return _FALLBACK_COLOURS[sum(map(ord, name)) % len(_FALLBACK_COLOURS)]


def register(name: str, summary: str, *, label: Optional[str] = None,
             units: str = "arbitrary units", colour: Optional[str] = None,
             needs_float_inputs: bool = False, uses_gradients: bool = False,
             token_value: Optional[TokenValue] = None, logit_effect: Optional[str] = None,
             score_line: Optional[str] = None, layer_kinds: Optional[Sequence[str]] = None,
             module_kinds: Optional[Sequence[str]] = None, fit: Optional[FitFunction] = None,
             sums_to: Optional[str] = None, refine_factor: int = 1
             ) -> Callable[[ScoringFunction], ScoringFunction]:
    """Add a scoring function to the registry under `name`, with the facts of `Method`;
    `label` defaults to the name, `colour` to one of a fixed set picked from the name."""
    if logit_effect is not None and logit_effect not in LOGIT_EFFECTS:
        raise ValueError(f"logit_effect must be one of {LOGIT_EFFECTS} or None; got "
                         f"{logit_effect!r}.")

    def add(function: ScoringFunction) -> ScoringFunction:
        REGISTRY[name] = Method(
            name, function, summary, label=label or name, units=units,
            colour=colour or colour_from_name(name), needs_float_inputs=needs_float_inputs,
            uses_gradients=uses_gradients, token_value=token_value,
            logit_effect=logit_effect, score_line=score_line,
            layer_kinds=None if layer_kinds is None else tuple(layer_kinds),
            module_kinds=None if module_kinds is None else tuple(module_kinds), fit=fit,
            sums_to=sums_to, refine_factor=refine_factor)
        return function
    return add


def method_names(where: Optional[Callable[[Method], bool]] = None) -> tuple[str, ...]:
    """The names of the registered methods (those `where` accepts), in registration order,
    read from the registry now: a method registered later is in the next call's."""
    return tuple(name for name, entry in REGISTRY.items() if where is None or where(entry))


def method_label(method: str) -> str:
    """How views name `method` (the registry's label; an unknown name as it is)."""
    entry = REGISTRY.get(method)
    return entry.label if entry is not None else method


def methods_for(input_dtype: torch.dtype, layer_kind: Optional[str] = None,
                model: Optional[nn.Module] = None) -> tuple[str, ...]:
    """The methods that can score inputs of `input_dtype` (integer ids: all but those that
    need floating-point inputs) at a layer of `layer_kind` (`layers.module_kind`; None: any
    kind) of `model` (its modules covered by the method's rules, `Method.module_kinds`;
    None: any model), read from the registry now."""
    return tuple(name for name, entry in REGISTRY.items()
                 if (input_dtype.is_floating_point or not entry.needs_float_inputs)
                 and (layer_kind is None or entry.layer_kinds is None
                      or layer_kind in entry.layer_kinds)
                 and (model is None or not uncovered_modules(model, name)))


def uncovered_modules(model: nn.Module, method: str) -> dict[str, str]:
    """{name: kind} of the model's leaf modules that `method`'s rules do not cover
    (`Method.module_kinds`); empty for a method that covers any model."""
    kinds = REGISTRY[method].module_kinds
    if kinds is None:
        return {}
    leaves = ((name, module) for name, module in model.named_modules()
              if name and next(module.children(), None) is None)
    return {name: kind for name, kind in ((name, module_kind(name, module))
                                          for name, module in leaves) if kind not in kinds}
