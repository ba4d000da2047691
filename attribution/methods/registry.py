"""The registry of neuron-scoring methods: one signature, one decorator line per method.

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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from ..engine import model_io
from ..engine.layers import BATCH_NORMS, WEIGHT_LAYOUTS, module_kind
from ..errors import AttributionError
from ..engine.runners import LayerRunner

Targets = Union[torch.Tensor, str, None]  # LongTensor [B], "all", or None (= predicted class)
Selected = Union[torch.Tensor, Callable[[], torch.Tensor]]  # differentiated values, or a
# function giving them (`_gradients_of`)


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
        notes: a dict the method fills with per-sample facts about its scores, if given:
            a path method's sum check (`SUM_KEYS`).
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
    notes: Optional[dict] = None


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
            sample's real tokens is its score; None when it has none (`tokens.TOKEN_METHODS`).
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
            (`sum_misses`) and reports what remains (`SUM_KEYS`). None: no such property.
        refine_factor: for a path method, how far it integrates a sample that misses its
            sum again, as a factor of `n_steps` (up to `MAX_STEPS_FACTOR`, per sample, so a
            score never depends on its batch); 1: it checks and reports, never refines.
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


class MethodNames(Sequence):
    """The names of the registered methods (those `where` accepts), in registration order,
    read from the registry at every use: a method registered after import is in it.
    `tuple(names)` takes a snapshot."""

    def __init__(self, where: Optional[Callable[[Method], bool]] = None):
        self._where = where

    def _names(self) -> tuple[str, ...]:
        return tuple(name for name, entry in REGISTRY.items()
                     if self._where is None or self._where(entry))

    def __len__(self) -> int:
        return len(self._names())

    def __getitem__(self, index):
        return self._names()[index]

    def __iter__(self):
        return iter(self._names())

    def __contains__(self, name) -> bool:
        entry = REGISTRY.get(name) if isinstance(name, str) else None
        return entry is not None and (self._where is None or self._where(entry))

    def __eq__(self, other) -> bool:
        if isinstance(other, (MethodNames, tuple, list)):
            return self._names() == tuple(other)
        return NotImplemented

    __hash__ = None  # its contents change as methods are registered

    def __repr__(self) -> str:
        return repr(self._names())


METHODS: Sequence[str] = MethodNames()
"""Every registered method's name (a live view of `REGISTRY`)."""


def method_label(method: str) -> str:
    """How views name `method` (the registry's label; an unknown name as it is)."""
    entry = REGISTRY.get(method)
    return entry.label if entry is not None else method


def _reduce_spatial(scores: torch.Tensor, neuron_dim: int, how: str,
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


def _mask(batch: "Batch") -> Optional[torch.Tensor]:
    """The batch's attention mask [B, T] (1 = real token), or None."""
    return model_io.attention_mask(batch.x)


def _resolve_targets(targets: Targets, logits: torch.Tensor) -> Targets:
    """LongTensor [B] or "all"; None becomes the predicted class."""
    if targets is None:
        return logits.argmax(1)
    return targets


def _selected(logits: torch.Tensor, targets: Targets, repeats: int = 1) -> torch.Tensor:
    """Target logits: [R*B] for class ids (repeated over R stacked variants), [R*B, C] for all."""
    if isinstance(targets, str):
        return logits
    if repeats == 1 and not targets.is_inference():
        return logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    # a copy (cat copies even one part; repeat costs ~5x more): gather saves its index for
    # backward, which an inference tensor cannot be
    return logits.gather(1, _repeated(targets, repeats)[:, None]).squeeze(1)


def _gradients(batch: Batch, logits: torch.Tensor, z: torch.Tensor, targets: Targets,
               repeats: int = 1) -> torch.Tensor:
    """dF/dz: [R*B, n, ...] for class ids, [C, R*B, n, ...] for "all" (batched over classes).

    NaN where the differentiated logit is NaN or inf (its derivative describes no output);
    AttributionError when no gradient can flow from the logits back to z.
    """
    return _gradients_of(batch, _selected(logits, targets, repeats), z, targets)


def _gradients_of(batch: Batch, selected: Selected, z: torch.Tensor, targets: Targets,
                  total: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`_gradients` of values already selected: [B] per sample (class ids), or [B, C]. For
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
    return _nan_where_not_finite(grad, selected, targets, total)


def syncs_are_free(device: torch.device) -> bool:
    """Can the host read a value of `device` at no cost (the CPU), or does reading one stall
    the device's queue (a GPU)? The hot loops read no value per batch where they stall."""
    return device.type == "cpu"


def _nan_where_not_finite(values: torch.Tensor, selected: Selected, targets: Targets,
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
    """The gradient of `_gradients` from its `_selected` logits (and their sum `total`), or
    None when they do not reach z in the graph."""
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


def gauss_legendre(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n], alphas [n]) of Gauss-Legendre quadrature on [0, 1], alphas ascending."""
    weights, alphas = _gauss_legendre_on_cpu(n)
    return weights.to(device), alphas.to(device)


@functools.lru_cache(maxsize=64)
def _gauss_legendre_on_cpu(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Golub-Welsch in torch, float64, once per n. Not NumPy's `leggauss`: its LAPACK call
    wakes NumPy's own OpenBLAS threads, which then spin beside torch's on the same cores (on
    2 cores, each batch integrated again slowed the batches after it 3x)."""
    k = torch.arange(1, n, dtype=torch.float64)
    off_diagonal = k / torch.sqrt(4 * k * k - 1)
    jacobi = torch.diag(off_diagonal, 1) + torch.diag(off_diagonal, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    weights = 2 * vectors[0] ** 2
    nodes, weights = (nodes - nodes.flip(0)) / 2, (weights + weights.flip(0)) / 2  # symmetric
    return (0.5 * weights).float(), (0.5 * (nodes + 1)).float()


def _classes_first(grad: torch.Tensor, targets: Targets) -> torch.Tensor:
    """[C, B, ...] -> [B, C, ...] for "all"; unchanged otherwise."""
    return grad.movedim(0, 1) if isinstance(targets, str) else grad


def _with_class_axis(z: torch.Tensor, targets: Targets) -> torch.Tensor:
    return z.unsqueeze(1) if isinstance(targets, str) else z


def _neuron_dim(targets: Targets) -> int:
    return 2 if isinstance(targets, str) else 1


@register("gradient", "dF/dz: gradient of the target logit w.r.t. the layer output",
          units="logit per unit activation", colour="#332288", uses_gradients=True,
          token_value=lambda z, grad: grad, logit_effect="times_activation",
          score_line="grad.flatten(2).sum(-1)[0] if grad.dim() > 2 else grad[0]")
def gradient(batch: Batch) -> torch.Tensor:
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = _resolve_targets(batch.targets, logits)
    grad = _classes_first(_gradients(batch, logits, z, targets), targets)
    return _reduce_spatial(grad, _neuron_dim(targets), "sum", _mask(batch))


def _per_sample(values: torch.Tensor, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    """[B, n] -> [B, C, n] for targets "all" (a score that no class changes); else as is."""
    if isinstance(batch.targets, str):
        return values.unsqueeze(1).expand(-1, logits.shape[1], -1)
    return values


@register("activation", "z: the layer output itself (averaged over positions for conv)",
          units="activation units", colour="#117733", token_value=lambda z, grad: z,
          score_line="z.flatten(2).mean(-1)[0] if z.dim() > 2 else z[0]")
def activation(batch: Batch) -> torch.Tensor:
    z, _, logits = batch.runner.capture(batch.x)
    return _per_sample(_reduce_spatial(z, 1, "mean", _mask(batch)), batch, logits)


@register("gradient_x_activation", "z * dF/dz: first-order Taylor estimate of removing a neuron",
          label="gradient × activation", units="logits", colour="#44AA99",
          uses_gradients=True, token_value=lambda z, grad: z * grad, logit_effect="score",
          score_line="(z * grad).flatten(2).sum(-1)[0] if z.dim() > 2 else (z * grad)[0]")
def gradient_x_activation(batch: Batch) -> torch.Tensor:
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = _resolve_targets(batch.targets, logits)
    grad = _classes_first(_gradients(batch, logits, z, targets), targets)
    return _reduce_spatial(_times_activation(z, grad, targets), _neuron_dim(targets), "sum",
                           _mask(batch))


def _times_activation(z: torch.Tensor, grad: torch.Tensor, targets: Targets) -> torch.Tensor:
    """z * grad: [B, (C,) n, ...] from z [B, n, ...] and its gradient (per class for "all").
    Written into `grad` where it is a dense tensor of its own, as autograd hands out for
    class ids (a new product per batch cost ~4% of a small MLP's floor), else a new one."""
    z = _with_class_axis(z.detach(), targets)
    if grad._base is None and grad.is_contiguous() and grad.shape == z.shape:
        return grad.mul_(z)
    return z * grad


def _loss_taylor_terms(batch: Batch) -> torch.Tensor:
    """sum_p z * dL/dz per neuron, L the cross-entropy of each sample against its target
    class (per class for "all"): [B, n] or [B, C, n]. One forward and one backward of the
    losses, differentiated as `_gradients` differentiates logits; for class ids, of torch's
    fused cross-entropy summed over the batch (a log-softmax, then a gather, took 1.27-1.36x
    the floor on a small MLP; per-sample losses then their sum 1.22x; this 1.15x)."""
    z, logits = batch.runner.forward_with_leaf(batch.x)
    targets = _resolve_targets(batch.targets, logits)
    if isinstance(targets, str):  # the loss against each class [B, C]
        grad = _gradients(batch, -torch.log_softmax(logits, 1), z, targets)
    else:  # the batch's summed loss, fused: each sample's only where a NaN mask needs it
        grad = _gradients_of(
            batch, lambda: functional.cross_entropy(logits, targets, reduction="none"), z,
            targets, total=functional.cross_entropy(logits, targets, reduction="sum"))
    return _reduce_spatial(_times_activation(z, _classes_first(grad, targets), targets),
                           _neuron_dim(targets), "sum", _mask(batch))


@register("taylor", "|sum_p z * dL/dz|: first-order Taylor change of the loss (Molchanov 2017)",
          label="Taylor (loss)", units="loss (nats)", colour="#DDCC77", uses_gradients=True)
def taylor(batch: Batch) -> torch.Tensor:
    return _loss_taylor_terms(batch).abs_()  # a fresh tensor: no second one


@register("fisher", "(sum_p z * dL/dz)^2 / 2: the Fisher pruning signal (Theis 2018)",
          label="Fisher (loss)", units="squared loss (nats²)", colour="#882255",
          uses_gradients=True)
def fisher(batch: Batch) -> torch.Tensor:
    return _loss_taylor_terms(batch).square_().mul_(0.5)  # a fresh tensor: no second one


@register("active_fraction", "share of a neuron's positions where z > 0 (1 - APoZ, Hu 2016)",
          label="active fraction", units="share of positions", colour="#BBBBBB")
def active_fraction(batch: Batch) -> torch.Tensor:
    z, _, logits = batch.runner.capture(batch.x)
    return _per_sample(_reduce_spatial((z > 0).to(z.dtype), 1, "mean", _mask(batch)), batch,
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
    return _per_sample(norms.expand(logits.shape[0], -1), batch, logits)


@register("bn_scale", "|gamma| of a BatchNorm layer (data-free; network slimming, Liu 2017)",
          label="BatchNorm |γ|", units="|γ|", colour="#6B6ECF", layer_kinds=BATCH_NORMS)
def bn_scale(batch: Batch) -> torch.Tensor:
    gamma, logits = _own_weight(batch, "bn_scale")
    return _per_sample(gamma.abs().to(torch.float32).expand(logits.shape[0], -1), batch,
                       logits)


def _step_chunks(n_steps: int, rows_per_step: int, max_rows: int):
    per_pass = max(1, max_rows // max(rows_per_step, 1))
    for begin in range(0, n_steps, per_pass):
        yield slice(begin, min(n_steps, begin + per_pass))


SUM_TOLERANCE = 0.01
"""How far a path method's scores of a sample may miss, summed over the layer, the difference
they integrate (`Method.sums_to`), as a share of that difference; a sample that misses it
is integrated again where the method refines (`Method.refine_factor`: integrated gradients
with twice the steps, conductance by bisection), and counted where it still misses."""
SUM_KEYS = ("sum_gap", "sum_difference", "sum_steps")
"""What a path method reports per sample (`Batch.notes`): the difference minus the scores'
sum, the difference (logits; [B] or [B, C] for every class), the steps it took [B]."""
SUM_FLOOR = 1e-3
"""Logits: a difference smaller than this is held to SUM_TOLERANCE of it (float rounding)."""
MAX_STEPS_FACTOR = 16
"""A sample integrated again may take up to this many times `n_steps` steps."""


def sum_misses(gap: torch.Tensor, difference: torch.Tensor) -> torch.Tensor:
    """Which samples' scores miss their sum: |gap| > SUM_TOLERANCE x max(|difference|,
    SUM_FLOOR); [B] from [B] or [B, C] (any class), False where the logit is not finite."""
    misses = gap.abs() > SUM_TOLERANCE * difference.abs().clamp_min(SUM_FLOOR)
    return misses if misses.dim() == 1 else misses.any(1)


@dataclass(frozen=True)
class SumCheck:
    """A path method's sum check over the samples of one computation (`sum_check`).

    Attributes:
        n_samples: samples checked (those whose sum applies: conductance's does not where a
            path bypasses the layer).
        n_bypassed: samples whose sum does not apply.
        n_refined: samples that took more than the `n_steps` asked for.
        most_steps: the most steps a sample took.
        n_missing: samples whose scores still miss their sum by more than SUM_TOLERANCE.
        worst: the largest miss, as a share of the difference (`sum_misses`' scale).
    """

    n_samples: int
    n_bypassed: int
    n_refined: int
    most_steps: int
    n_missing: int
    worst: float


def sum_check(about: dict, n_steps: int) -> Optional[SumCheck]:
    """The sum check of a computation whose `about` dict received `SUM_KEYS` (None when it
    did not: a method without a sum)."""
    if not all(key in about for key in SUM_KEYS):
        return None
    share = sum_shares(about)
    bypassed = np.isnan(share)
    steps = np.asarray(about["sum_steps"])
    checked = share[~bypassed]
    return SumCheck(int(checked.size), int(bypassed.sum()), int((steps > n_steps).sum()),
                    int(steps.max()) if steps.size else n_steps,
                    int((checked > SUM_TOLERANCE).sum()),
                    float(checked.max()) if checked.size else 0.0)


def sum_shares(about: dict) -> np.ndarray:
    """float64 [N]: by how much each sample's scores miss their sum (`SUM_KEYS` in `about`),
    as a share of the difference on `sum_misses`' scale (every class: the largest); NaN
    where the sum does not apply."""
    gap, difference = (np.asarray(about[key], dtype=np.float64)
                       for key in ("sum_gap", "sum_difference"))
    share = np.abs(gap) / np.maximum(np.abs(difference), SUM_FLOOR)
    return np.max(share, axis=1) if share.ndim > 1 else share


def _checked_sum(batch: Batch, attribution: torch.Tensor, difference: torch.Tensor,
                 targets: Targets, steps: torch.Tensor, applies: torch.Tensor) -> torch.Tensor:
    """Scores [B, (C,) n] of a path method whose scores sum over the layer to a difference
    of the target logit, from its scores at every position [B, (C,) n, ...], that
    difference [B] or [B, C], the resolved targets, the steps each sample took [B] and where
    the sum applies [B] (bool, False for a sample with a path around the layer). What the
    scores miss of it goes to `batch.notes` (its gap NaN where the sum does not apply)."""
    if batch.notes is not None:
        gap = difference - _layer_sum(attribution, targets)
        where = applies if gap.dim() == 1 else applies.unsqueeze(1)
        batch.notes.update(sum_gap=gap.where(where, gap.new_tensor(float("nan"))),
                           sum_difference=difference, sum_steps=steps)
    return _reduce_spatial(attribution, _neuron_dim(targets), "sum", _mask(batch))


def _refined(batch: Batch, positions: Callable[[Batch], tuple], max_steps: int,
             previous_gap: Optional[torch.Tensor] = None) -> tuple:
    """(scores at every position [B, (C,) n, ...], difference, targets, steps [B], where the
    sum applies) of a path method whose `positions(batch)` gives the first four but steps:
    the samples that miss their sum (`sum_misses`) are integrated again with twice the
    steps, recursively on a batch of those samples alone, up to `max_steps`, while more
    steps still change their gap (a gap they no longer change is not the quadrature's)."""
    attribution, difference, targets, applies = positions(batch)
    gap = difference - _layer_sum(attribution, targets)
    steps = torch.full((gap.shape[0],), batch.n_steps, dtype=torch.int32, device=gap.device)
    again = sum_misses(gap, difference) & applies
    if previous_gap is not None:  # a gap more steps no longer change is not the quadrature's
        again &= _row_size(gap - previous_gap) > SUM_TOLERANCE * _row_size(previous_gap)
    # the one value a path method reads per batch, also where reads stall the device: a
    # batch of n_steps passes pays for it once
    if batch.n_steps * 2 > max_steps or not bool(again.any()):
        return attribution, difference, targets, steps, applies
    rows = again.nonzero()[:, 0]
    fewer = replace(batch, x=model_io.take(batch.x, rows), n_steps=batch.n_steps * 2,
                    targets=targets if isinstance(targets, str) else targets[rows],
                    codes=None, notes=None)
    better, _, _, more_steps, _ = _refined(fewer, positions, max_steps, gap[rows])
    attribution[rows] = better
    steps[rows] = more_steps
    return attribution, difference, targets, steps, applies


def _layer_sum(attribution: torch.Tensor, targets: Targets) -> torch.Tensor:
    """Scores at every position [B, (C,) n, ...] summed over the layer: [B] or [B, C]."""
    return attribution.flatten(_neuron_dim(targets)).sum(-1)


def _row_size(gap: torch.Tensor) -> torch.Tensor:
    """|gap| per sample [B] (the largest over classes)."""
    return gap.abs() if gap.dim() == 1 else gap.abs().amax(1)


@register("integrated_gradients",
          "z * integral of dF/dz along 0 -> z (zero baseline at the layer); checks that the "
          "scores sum to F(z) - F(0), with more steps where they do not",
          label="integrated gradients", units="logits", colour="#88CCEE",
          uses_gradients=True, logit_effect="score", sums_to="F(z) - F(0) at the layer",
          refine_factor=MAX_STEPS_FACTOR)  # Gauss-Legendre converges fast: a miss is a sharp
# feature (a LayerNorm after the layer) that a few doublings resolve
def integrated_gradients(batch: Batch) -> torch.Tensor:
    max_steps = batch.n_steps * REGISTRY["integrated_gradients"].refine_factor
    return _checked_sum(batch, *_refined(batch, _integrated_positions, max_steps))


def _integrated_positions(batch: Batch) -> tuple:
    """Integrated gradients at every position [B, (C,) n, ...], F(z) - F(0) at the layer,
    targets."""
    runner = batch.runner
    z, state, logits = runner.capture(batch.x)  # the front runs once per batch
    targets = _resolve_targets(batch.targets, logits)
    weights, alphas = gauss_legendre(batch.n_steps, z.device)
    n_rows = z.shape[0]
    total = None
    for steps in _step_chunks(batch.n_steps, n_rows, batch.max_rows):
        shape = (-1,) + (1,) * z.dim()
        scaled = (alphas[steps].view(shape) * z.unsqueeze(0)).flatten(0, 1)
        scaled = scaled.to(z.dtype).requires_grad_(True)  # a half-precision model stays half
        repeats = alphas[steps].numel()
        step_logits = runner.tail(scaled, state, repeats)  # score_batches turned autograd on
        grad = _gradients(batch, step_logits, scaled, targets, repeats)
        grad = grad.unflatten(-z.dim(), (repeats, n_rows))  # [(C,) S, B, n, ...]
        moved = grad.movedim(-z.dim() - 1, 0)  # [S, (C,) B, n, ...]
        weighted = (weights[steps].view((-1,) + (1,) * (moved.dim() - 1)) * moved).sum(0)
        total = weighted if total is None else total + weighted
    total = _nan_where_not_finite(total, _selected(logits, targets), targets)  # alpha = 1 too
    with torch.no_grad():
        at_zero = _selected(runner.tail(torch.zeros_like(z), state, 1), targets)
    return (_with_class_axis(z, targets) * _classes_first(total, targets),
            _selected(logits, targets) - at_zero, targets,
            torch.ones(n_rows, dtype=torch.bool, device=z.device))  # a path integral: always


@register("conductance",
          "Layer conductance with a zero input baseline (Dhamdhere et al.; as Captum); checks "
          "that the scores sum to F(x) - F(0), bisecting the path where they do not",
          units="logits", colour="#999933", needs_float_inputs=True, uses_gradients=True,
          logit_effect="score", sums_to="F(x) - F(0) at the inputs",
          refine_factor=MAX_STEPS_FACTOR)
def conductance(batch: Batch) -> torch.Tensor:
    max_steps = batch.n_steps * REGISTRY["conductance"].refine_factor
    return _checked_sum(batch, *_conductance_refined(batch, max_steps))


def _conductance_refined(batch: Batch, max_steps: int) -> tuple:
    """(conductance at every position [B, (C,) n, ...], F(x) - F(0) at the inputs [B] or
    [B, C], targets, steps [B], where the sum applies [B]).

    First Captum's sum: sum_k (z(a_k+1) - z(a_k)) dF/dz(a_k) over `n_steps` + 1
    Gauss-Legendre nodes a_k of the path a x. It converges only as 1/steps: each ReLU that
    switches along the path adds an error of its jump times a step. The samples that miss
    their sum are integrated again (`_bisected`), each on its own path."""
    runner, x = batch.runner, batch.x
    real_z, _, real_logits = runner.capture(x)  # the quadrature's steps never reach alpha = 1
    targets = _resolve_targets(batch.targets, real_logits)
    n, n_nodes = model_io.n_rows(x), batch.n_steps + 1
    _, alphas = gauss_legendre(n_nodes, model_io.device_of(x))
    z_path, grad_path = _path_points(batch, model_io.interpolate(x, alphas),
                                     _repeated(targets, n_nodes))
    z_steps = z_path.unflatten(0, (n_nodes, n))  # [S+1, B, n, ...]
    grad_steps = grad_path.unflatten(-z_path.dim(), (n_nodes, n))  # [(C,) S+1, B, n, ...]
    rise = z_steps[1:] - z_steps[:-1]  # [S, B, n, ...]
    if isinstance(targets, str):
        attribution = (rise.unsqueeze(0) * grad_steps[:, :-1]).sum(1)  # [C, B, n, ...]
    else:
        attribution = (rise * grad_steps[:-1]).sum(0)
    attribution = _classes_first(
        _nan_where_not_finite(attribution, _selected(real_logits, targets), targets), targets)
    with torch.no_grad():
        real = _selected(real_logits, targets)
        _, state_at_zero, at_zero = runner.capture(model_io.interpolate(x, alphas.new_zeros(1)))
        start_with_real_layer = _selected(runner.tail(real_z, state_at_zero, 1), targets)
    difference = real - _selected(at_zero, targets)
    # the sum holds where the layer carries every path: with the layer's output of x, the
    # rest of the model run from the zero input gives F(x)
    applies = ~sum_misses(real - start_with_real_layer, difference)
    steps = torch.full((n,), batch.n_steps, dtype=torch.int32, device=difference.device)
    gap = difference - _layer_sum(attribution, targets)
    again = sum_misses(gap, difference) & applies
    # the one value a path method reads per batch (see _refined)
    if max_steps <= n_nodes or not bool(again.any()):
        return attribution, difference, targets, steps, applies
    rows = again.nonzero()[:, 0]
    point_dim = _neuron_dim(targets) - 1  # of grad_steps' S+1 and B dims, the first
    better, better_steps = _bisected(
        batch, model_io.take(x, rows), targets if isinstance(targets, str) else targets[rows],
        alphas, z_steps[:, rows], grad_steps.index_select(point_dim + 1, rows),
        difference[rows], max_steps, _interval_budget(grad_steps, n_nodes * n))
    improves = _row_size((difference[rows] - _layer_sum(better, targets))
                         / difference[rows].abs().clamp_min(SUM_FLOOR)) < _row_size(
        gap[rows] / difference[rows].abs().clamp_min(SUM_FLOOR))
    attribution[rows] = torch.where(_broadcast_rows(improves, better), better,
                                    attribution[rows])
    steps[rows] = torch.where(improves, better_steps, steps[rows])
    return attribution, difference, targets, steps, applies


MAX_BISECTIONS = 24
"""Rounds of bisection `_bisected` runs at most (each one model pass over the new nodes)."""
MAX_INTERVALS_FACTOR = 2
INTERVALS_MEMORY = 256 << 20
"""`_bisected` holds at most MAX_INTERVALS_FACTOR intervals per node of the batch's first
pass (each keeps z and dF/dz at both ends: twice that pass's memory), or as many as fit in
INTERVALS_MEMORY bytes where that is more; the intervals of samples that met their sum are
let go first, then a round splits only the largest errors that fit."""


def _interval_budget(grad_nodes: torch.Tensor, n_nodes: int) -> int:
    """How many intervals `_bisected` may hold, after a first pass of `n_nodes` nodes
    (S+1 times B) whose dF/dz is `grad_nodes` [(C,) S+1, B, n, ...]."""
    node_bytes = 2 * grad_nodes.numel() * grad_nodes.element_size() // n_nodes  # z, dF/dz
    return max(int(MAX_INTERVALS_FACTOR * n_nodes), INTERVALS_MEMORY // max(2 * node_bytes, 1))


def _bisected(batch: Batch, x: Any, targets: Targets, alphas: torch.Tensor,
              z_nodes: torch.Tensor, grad_nodes: torch.Tensor, difference: torch.Tensor,
              max_steps: int, max_intervals: int) -> tuple:
    """Conductance at every position [R, (C,) n, ...] and the intervals it took [R] of R
    samples `x` whose Captum sum over `alphas` [S+1] (z there [S+1, R, n, ...], dF/dz
    [(C,) S+1, R, n, ...]) missed `difference` [R] or [R, C], holding at most
    `max_intervals` intervals at a time.

    Adaptive quadrature on the path 0 -> 1 with both ends: the trapezoid rule
    (z(b) - z(a)) (dF/dz(a) + dF/dz(b)) / 2 over each interval [a, b], whose error is at
    most |sum_j (z_j(b) - z_j(a)) (dF/dz_j(b) - dF/dz_j(a))| / 2 (the rule's distance to
    either one-sided rule). Each round bisects, in every sample still missing its sum, the
    intervals whose error bound exceeds SUM_TOLERANCE / (its number of intervals) of the
    difference (at least its largest), up to `max_steps` intervals a sample, until the sum
    holds or MAX_BISECTIONS rounds. (A gap that is not the quadrature's, a path around the
    layer, never comes here: the sum does not apply.) A round's work is that of the
    intervals it splits: a sample's scores are a running total, and each interval keeps its
    bound. On the digits CNN at 32 steps the layers took 1.2-1.9x Captum's sum alone, and
    all but one of 719 samples met their sums (doubling the steps instead took 2.8x the
    passes, and missed)."""
    n_samples, point_dim = model_io.n_rows(x), _neuron_dim(targets) - 1
    ends = alphas.new_tensor([0.0, 1.0]).repeat_interleave(n_samples)
    z_ends, grad_ends = _path_points(
        batch, model_io.scale_rows(model_io.repeat(x, 2), ends), _repeated(targets, 2))
    z_path = torch.cat([z_ends[:n_samples].unsqueeze(0), z_nodes,
                        z_ends[n_samples:].unsqueeze(0)])  # [S+3, R, n, ...]
    grad_ends = grad_ends.movedim(point_dim, 0)  # points first: [2R, (C,) n, ...]
    grad_path = torch.cat([grad_ends[:n_samples].unsqueeze(0),
                           grad_nodes.movedim((point_dim, point_dim + 1), (0, 1)),
                           grad_ends[n_samples:].unsqueeze(0)])  # [S+3, R, (C,) n, ...]
    alpha_path = torch.cat([alphas.new_zeros(1), alphas, alphas.new_ones(1)]).double()
    n_first = alpha_path.numel() - 1
    scale = difference.abs().clamp_min(SUM_FLOOR)
    intervals = _Intervals(isinstance(targets, str), scale)
    intervals.append(torch.arange(n_samples, device=alphas.device).repeat(n_first),
                     alpha_path[:-1].repeat_interleave(n_samples),
                     alpha_path[1:].repeat_interleave(n_samples),
                     z_path[:-1].flatten(0, 1), z_path[1:].flatten(0, 1),
                     grad_path[:-1].flatten(0, 1), grad_path[1:].flatten(0, 1))
    n_intervals = torch.full((n_samples,), n_first, device=alphas.device)
    for bisections in range(MAX_BISECTIONS + 1):
        attribution = intervals.total
        gap = (difference - _layer_sum(attribution, targets)) / scale
        refining = (_row_size(gap) > SUM_TOLERANCE) & (n_intervals < max_steps)
        if 2 * intervals.size > max_intervals:  # a sample's total stays: its intervals go
            intervals.keep(refining[intervals.owner])
        owner, error = intervals.owner, intervals.error * refining[intervals.owner]
        largest = torch.zeros(n_samples, dtype=error.dtype, device=error.device).scatter_reduce(
            0, owner, error, "amax")
        bar = torch.minimum(SUM_TOLERANCE / n_intervals, largest)[owner]
        chosen = ((error >= bar) & (error > 0)).nonzero()[:, 0]
        chosen = _within(chosen, owner[chosen], error[chosen], max_steps - n_intervals)
        room = max(0, max_intervals - intervals.size)  # the largest errors that fit
        chosen = chosen[error[chosen].argsort(descending=True)[:room]]
        if not len(chosen) or bisections == MAX_BISECTIONS:
            break
        split_owner, lo, hi = owner[chosen], intervals.lo[chosen], intervals.hi[chosen]
        middle = (lo + hi) / 2
        z_mid, grad_mid = _path_points(
            batch, model_io.scale_rows(model_io.take(x, split_owner), middle.to(alphas.dtype)),
            targets if isinstance(targets, str) else targets[split_owner])
        intervals.split(chosen, middle, z_mid, grad_mid.movedim(point_dim, 0))
        n_intervals += torch.bincount(split_owner, minlength=n_samples)
    return attribution.clone(), n_intervals.int()


class _Intervals:
    """`_bisected`'s intervals [lo, hi] of its samples' paths, with z and dF/dz at both ends
    (in buffers that grow by doubling, so a round's work is that of its splits), each
    interval's error bound, and per sample the trapezoid rule's total over its intervals.

    Attributes (I intervals of R samples): owner, lo, hi, error [I] (the bound as a share of
    the sample's difference, the largest over classes); z_lo, z_hi [I, n, ...]; grad_lo,
    grad_hi [I, (C,) n, ...]; total [R, (C,) n, ...]."""

    COLUMNS = ("owner", "lo", "hi", "error", "z_lo", "z_hi", "grad_lo", "grad_hi")

    def __init__(self, every_class: bool, scale: torch.Tensor):
        self.every_class, self.scale = every_class, scale
        self.size, self.buffers, self.total = 0, None, None

    def __getattr__(self, name: str) -> torch.Tensor:
        if name not in _Intervals.COLUMNS or self.buffers is None:
            raise AttributeError(name)
        return self.buffers[name][:self.size]

    def _pieces(self, z_lo, z_hi, grad_lo, grad_hi) -> tuple:
        """The trapezoid rule over intervals [K, (C,) n, ...] and their error bounds as a
        share of their samples' differences [K, (C,)]."""
        rise = (z_hi - z_lo).unsqueeze(1) if self.every_class else z_hi - z_lo
        neurons = 2 if self.every_class else 1
        bound = (rise * (grad_hi - grad_lo)).flatten(neurons).sum(-1).abs() / 2
        return rise * (grad_lo + grad_hi) / 2, bound

    def append(self, owner, lo, hi, z_lo, z_hi, grad_lo, grad_hi) -> None:
        """New intervals (their pieces join their samples' totals)."""
        pieces, bound = self._pieces(z_lo, z_hi, grad_lo, grad_hi)
        if self.total is None:
            self.total = pieces.new_zeros((len(self.scale),) + pieces.shape[1:])
        self.total.index_add_(0, owner, pieces)
        values = dict(owner=owner, lo=lo, hi=hi, error=_row_size(bound / self.scale[owner]),
                      z_lo=z_lo, z_hi=z_hi, grad_lo=grad_lo, grad_hi=grad_hi)
        count = len(owner)
        if self.buffers is None or self.size + count > len(self.buffers["owner"]):
            capacity = max(2 * (self.size + count), 64)
            grown = {name: value.new_empty((capacity,) + value.shape[1:])
                     for name, value in values.items()}
            for name in grown if self.size else ():
                grown[name][:self.size] = getattr(self, name)
            self.buffers = grown
        for name, value in values.items():
            self.buffers[name][self.size:self.size + count] = value
        self.size += count

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the intervals `rows` (bool [I]); the samples' totals stay as they are."""
        self.buffers = {name: getattr(self, name)[rows] for name in _Intervals.COLUMNS}
        self.size = len(self.buffers["owner"])

    def split(self, index: torch.Tensor, middle: torch.Tensor, z_mid: torch.Tensor,
              grad_mid: torch.Tensor) -> None:
        """Split intervals `index` [K] at `middle` [K] (z there [K, n, ...], dF/dz
        [K, (C,) n, ...]): each becomes its left half, and its right half is appended."""
        owner, hi = self.owner[index], self.hi[index]
        z_lo, z_hi, grad_lo, grad_hi = (self.z_lo[index], self.z_hi[index],
                                        self.grad_lo[index], self.grad_hi[index])
        self.total.index_add_(0, owner, self._pieces(z_lo, z_hi, grad_lo, grad_hi)[0],
                              alpha=-1)
        pieces, bound = self._pieces(z_lo, z_mid, grad_lo, grad_mid)
        self.total.index_add_(0, owner, pieces)
        self.hi[index], self.z_hi[index], self.grad_hi[index] = middle, z_mid, grad_mid
        self.error[index] = _row_size(bound / self.scale[owner])
        self.append(owner, middle, hi, z_mid, z_hi, grad_mid, grad_hi)


def _within(chosen: torch.Tensor, owner: torch.Tensor, error: torch.Tensor,
            room: torch.Tensor) -> torch.Tensor:
    """The intervals `chosen` (of samples `owner`), keeping in each sample only its `room`
    [R] largest `error`s."""
    by_error = torch.argsort(error, descending=True)
    order = by_error[torch.argsort(owner[by_error], stable=True)]  # by sample, largest first
    owner = owner[order]
    counts = torch.bincount(owner, minlength=len(room))
    rank = torch.arange(len(order), device=order.device) - (counts.cumsum(0) - counts)[owner]
    return chosen[order[rank < room[owner]]]


def _path_points(batch: Batch, points: Any, targets: Targets) -> tuple:
    """z [P, n, ...] and dF/dz [(C,) P, n, ...] at P points of a path (inputs [P, ...]; one
    target each [P], or "all"), in passes of at most `batch.max_rows` rows."""
    n_points, zs, grads = model_io.n_rows(points), [], []
    for begin in range(0, n_points, batch.max_rows):
        part = slice(begin, min(n_points, begin + batch.max_rows))
        z, logits = batch.runner.forward_with_leaf(model_io.take(points, part))
        grads.append(_gradients(
            batch, logits, z, targets if isinstance(targets, str) else targets[part]).detach())
        zs.append(z.detach())
    return torch.cat(zs), torch.cat(grads, dim=1 if isinstance(targets, str) else 0)


def _repeated(targets: Targets, repeats: int) -> Targets:
    """Class ids [B] -> [repeats*B] (copy-major, a copy even for one); "all" as it is."""
    return targets if isinstance(targets, str) else torch.cat([targets] * repeats)


def _broadcast_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A bool [R] shaped to broadcast over `like` [R, ...]."""
    return rows.view((-1,) + (1,) * (like.dim() - 1))


@register("ablation", "F(x) - F(x with neuron zeroed): exact, one neuron at a time",
          units="logit drop", colour="#CC6677", logit_effect="score")
def ablation(batch: Batch) -> torch.Tensor:
    runner = batch.runner
    z, state, logits = runner.capture(batch.x)
    targets = _resolve_targets(batch.targets, logits)
    n_rows, n_neurons = z.shape[0], z.shape[1]
    base = _selected(logits, targets)  # [B] or [B, C]
    effects = []
    with torch.no_grad():
        for chunk in _step_chunks(n_neurons, n_rows, batch.max_rows):
            neurons = torch.arange(chunk.start, chunk.stop, device=z.device)
            ablated = _selected(runner.ablate(z, state, neurons), targets, len(neurons))
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
