"""A pruned copy of a model to take away: a layer's lowest-ranked neurons removed exactly as
the pruning curves remove them, so its metric on the data is the curve's point at k.

    pruned = at.prune(model, "fc2", scores, k=8, inputs=x)   # the 8 lowest-ranked removed
    at.save_pt2(pruned, x[:2], "pruned.pt2")                  # loads here like any .pt2

Where the layer owns the weights that produce its neurons (`layers.WEIGHT_LAYOUTS`: Linear,
Conv, norm layers, ...) and each removed neuron gets one value, the removal is folded into
those weights: the neuron's weight slice becomes 0 and its bias the value (0, or its mean),
so the copy has the model's modules and names. Elsewhere (a parameter-free layer, neurons
on another axis than the weight's, a conv channel's mean map, a weight shared with another
module) the layer's module is wrapped in `PrunedOutput`, which sets those neurons' outputs;
the layer's name then holds the wrapper and "name.layer" the original module.

Which neurons to remove is the ranking's call, and `prune_check` measures it the way the
pruning curves would: the metric with the k neurons removed, beside the unpruned model, k
random neurons (a band over seeded draws) and, given exact ablation's effects, the k neurons
whose removal changes the model least. A ranking whose removal does more damage than
random's is said to (`PruneCheck.damaged`). Front ends rank by `DEFAULT_PRUNE_REDUCE`, the
mean magnitude of each neuron's scores: a signed mean puts the neurons with the largest
negative effect at the bottom, which are among the most important.
"""
from __future__ import annotations

import copy
import inspect
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..defaults import (DEFAULT_ABLATION, DEFAULT_BATCH_SIZE, DEFAULT_N_RANDOM, DEFAULT_SEED)
from ..engine.guards import eval_mode
from ..engine.layers import (WEIGHT_LAYOUTS, module_kind, output_tensor, resolve_layer,
                             split_axis, with_output_tensor)
from ..engine.model_io import NamedInputs, logits_of, n_rows, output_key, repeat, to_model
from ..errors import AttributionError
from ..methods.passes import Inputs, LayerPass, model_device
from .pruning_curves import (ABLATIONS, BAND_PERCENTILES, HIGHER_IS_WORSE, _LayerPasses,
                      model_default_metric, neuron_vector, order_curves, random_orders)

REMOVALS = ("bottom", "top")
"""Which end of the ranking `prune` removes: the k lowest-scored neurons or the k highest."""


class PrunedOutput(nn.Module):
    """A layer module whose removed neurons output fixed values.

    Buffers: `removed` [n] bool (True = removed), `fill` [n, ...] (each neuron's value at
    each of its positions, neurons first) or a scalar; `axis` is the neuron axis of the
    layer's output (batch = dim 0). A tuple or ModelOutput output has its first tensor
    changed (`layers.output_tensor`), as the engine does.
    """

    def __init__(self, layer: nn.Module, removed: torch.Tensor, fill: torch.Tensor, axis: int):
        super().__init__()
        self.layer, self.axis = layer, axis
        self.register_buffer("removed", removed)
        self.register_buffer("fill", fill)

    def forward(self, *args, **kwargs):
        output = self.layer(*args, **kwargs)
        tensor = output_tensor(output)
        z = tensor.movedim(self.axis, 1)
        mask = self.removed.view((1, -1) + (1,) * (z.dim() - 2))
        pruned = torch.where(mask, self.fill.to(z.dtype), z).movedim(1, self.axis)
        return with_output_tensor(output, pruned)


def prune(model: nn.Module, layer, ranking, k: int, *, mode: str = "zero",
          remove: str = "bottom", inputs: Inputs = None,
          batch_size: int = DEFAULT_BATCH_SIZE, device=None) -> nn.Module:
    """A copy of `model` with `k` neurons of `layer` removed; the model is left as it was.

    Args:
        model: a classifier (an eager module or a loaded .pt2's).
        layer: dotted module name, "name:axis" or the module itself.
        ranking: one score per neuron [n] (as `pruning_curve` takes them: an array, tensor
            or a `cluster_scores` row); higher = more important.
        k: how many neurons to remove (0..n).
        mode: "zero" (their outputs become 0) or "mean" (their mean over `inputs` at each
            position, as `pruning_curve(ablation="mean")` computes it).
        remove: "bottom" removes the k lowest-ranked neurons (the curve's column "bottom"),
            "top" the k highest ("ranked"). Ties keep neuron order, as in the curves.
        inputs: [N, ...] samples (or batches) at which the layer's neuron axis is read and
            "mean" is taken; needed for "mean", and for "zero" unless the layer owns the
            weights that produce its neurons.
        batch_size, device: as in `pruning_curve` ("mean" only reads the data).
    Returns:
        The pruned copy in eval mode, on the model's device. Its metric on `inputs` equals
        `pruning_curve(model, layer, inputs, ..., ablation=mode)` at k, column `remove`
        ("bottom", or "ranked" for "top"), to float tolerance.
    """
    if mode not in ABLATIONS:
        raise AttributionError(f"Unknown mode {mode!r}; use one of {', '.join(ABLATIONS)}.")
    if remove not in REMOVALS:
        raise AttributionError(f"Unknown remove {remove!r}; use one of {', '.join(REMOVALS)}.")
    spec, module = resolve_layer(model, layer)
    name, chosen_axis = split_axis(spec)
    if inputs is not None:
        axis, n_dims, n_neurons, fill = _read_layer(model, spec, inputs, mode, batch_size,
                                                    device)
    elif mode == "mean":
        raise AttributionError("mode='mean' sets removed neurons to their mean over the data: "
                               "pass inputs=.")
    else:
        axis = n_dims = fill = None
        n_neurons = _weight_neurons(name, module, chosen_axis)
    values = neuron_vector(ranking, n_neurons)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n_neurons:
        raise AttributionError(f"k must be an integer in 0..{n_neurons} (the layer has "
                               f"{n_neurons} neurons); got {k!r}.")
    order = np.argsort(values if remove == "bottom" else -values, kind="stable")
    removed = torch.zeros(n_neurons, dtype=torch.bool)
    removed[torch.as_tensor(order[:int(k)], dtype=torch.long)] = True
    fill = torch.zeros(()) if fill is None else fill
    pruned = copy_model(model).eval()
    target = pruned.get_submodule(name)
    if _fold(pruned, name, target, removed, fill, axis, n_dims):
        return pruned
    if axis is None:
        raise AttributionError(f"The weights of layer {name!r} are shared with another "
                               "module, so its neurons are removed at its output, whose "
                               "axis is read from the data: pass inputs= (a batch is enough).")
    parent, _, child = name.rpartition(".")
    home = model_device(pruned)
    setattr(pruned.get_submodule(parent), child,
            PrunedOutput(target, removed.to(home), fill.to(home), axis))
    return pruned


@dataclass(frozen=True)
class PruneCheck:
    """What removing k neurons of a layer does to the model's metric, beside its baselines.

    Attributes:
        metric: what was measured ("accuracy", "target_logit", "loss", "squared_error").
        k, n_neurons: neurons removed, of the layer's.
        before: the unpruned model's metric.
        after: the metric with the ranking's k neurons removed (what `prune` returns).
        random_mean, random_low, random_high: k random neurons removed, the mean and the
            5th and 95th percentiles over `n_random` seeded draws (the curves' band).
        n_random: the draws.
        oracle: the k neurons whose exact removal changes the target least (smallest mean
            |ablation effect|) removed; None where exact ablation was not computed.
    """

    metric: str
    k: int
    n_neurons: int
    before: float
    after: float
    random_mean: float
    random_low: float
    random_high: float
    n_random: int
    oracle: Optional[float] = None

    def _damage(self, value: float) -> float:
        """How much worse than the unpruned model `value` is (positive = damage)."""
        return value - self.before if self.metric in HIGHER_IS_WORSE else self.before - value

    @property
    def damaged(self) -> bool:
        """Does removing the ranking's k neurons do more damage than the random band's
        damaging end (the 5th percentile of accuracy, the 95th of a loss)?"""
        worst = self.random_high if self.metric in HIGHER_IS_WORSE else self.random_low
        return self._damage(self.after) > self._damage(worst) + _TIE

    def words(self, shown: str = "{:.4f}") -> list[str]:
        """Sentences: the metric before and after, and beside its baselines."""
        value = shown.format
        said = [f"{self.metric} {value(self.before)} -> {value(self.after)} with these "
                f"{self.k} of {self.n_neurons} neurons removed.",
                f"{self.k} random neurons removed: {value(self.random_mean)} on average "
                f"({value(self.random_low)} to {value(self.random_high)}, 5-95% of "
                f"{self.n_random} draws)."]
        if self.oracle is not None:
            said.append(f"The {self.k} neurons whose exact removal changes the target least "
                        f"(mean |ablation effect|) removed: {value(self.oracle)}.")
        return said

    @property
    def warning(self) -> Optional[str]:
        """Where the removal is `damaged`, what that means (each front end says how to rank
        otherwise in its own words); else None."""
        if not self.damaged:
            return None
        return (f"Removing these {self.k} neurons does more damage than removing {self.k} "
                "random neurons: the ranking puts important neurons at its bottom.")


_TIE = 1e-9  # differences below this are float noise, not damage


def curve_checks(curves: pd.DataFrame, k: int) -> dict[str, PruneCheck]:
    """Per subset of a finished pruning curve ("all" for a single curve), the `PruneCheck`
    of `prune(..., k, remove="bottom")`: the curve's bottom point at k against its value at
    k = 0 and its random band at k (no oracle). KeyError where the curve lacks k or 0."""
    attrs = curves.attrs
    parts = (curves.groupby("subset", sort=False) if "subset" in curves.columns
             else [("all", curves)])
    checks = {}
    for subset, part in parts:
        at_k, at_0 = part[part["k"] == k], part[part["k"] == 0]
        if at_k.empty or at_0.empty:
            raise KeyError(f"the curve has no point at k = {k} and k = 0")
        row = at_k.iloc[0]
        checks[subset] = PruneCheck(
            metric=attrs["metric"], k=int(k), n_neurons=int(attrs["n_neurons"]),
            before=float(at_0.iloc[0]["bottom"]), after=float(row["bottom"]),
            random_mean=float(row["random_mean"]), random_low=float(row["random_lo"]),
            random_high=float(row["random_hi"]), n_random=int(attrs["n_random"]))
    return checks


def prune_check(model: nn.Module, layer, inputs: Inputs, targets, ranking, k: int, *,
                oracle=None, remove: str = "bottom", metric: Optional[str] = None,
                ablation: str = DEFAULT_ABLATION, n_random: int = DEFAULT_N_RANDOM,
                seed: int = DEFAULT_SEED, batch_size: int = DEFAULT_BATCH_SIZE,
                device=None) -> PruneCheck:
    """`PruneCheck` of `prune(model, layer, ranking, k, remove=remove, mode=ablation)`,
    measured in one pass of the layer's tail per removal (as `pruning_curve` measures it).

    Args:
        ranking: one score per neuron [n] (higher = more important), as `prune` takes it.
        oracle: each neuron's mean |exact ablation effect| [n] (`neuron_scores(...,
            "ablation")`, magnitudes averaged), or None: its k least important (for remove
            "top": most important) neurons form the check's `oracle`.
        targets, metric, ablation, n_random, seed, batch_size, device: as in
            `pruning_curve` (targets None = agreement with the unpruned model's classes;
            metric None = the head's default, `pruning_curves.chosen_metric`).
    """
    if remove not in REMOVALS:
        raise AttributionError(f"Unknown remove {remove!r}; use one of {', '.join(REMOVALS)}.")
    if n_random < 1:
        raise AttributionError("n_random must be a positive integer.")
    values = neuron_vector(ranking, None)
    n_neurons = len(values)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n_neurons:
        raise AttributionError(f"k must be an integer in 0..{n_neurons}; got {k!r}.")
    first = -1.0 if remove == "top" else 1.0  # removed first: the lowest (or highest)
    rankings = [values] + ([] if oracle is None else [neuron_vector(oracle, n_neurons)])
    orders = torch.cat([
        torch.as_tensor(np.stack([np.argsort(first * r, kind="stable") for r in rankings])),
        random_orders(n_neurons, n_random, seed)])
    metric = model_default_metric(model, inputs, targets, metric)
    curves = order_curves(model, layer, inputs, targets, orders, sorted({0, int(k)}),
                          ablation=ablation, metric=metric, batch_size=batch_size,
                          device=device)  # [O, 1 or 2]: at k = 0 (every order alike), at k
    draws = curves[len(rankings):, -1]
    low, high = np.percentile(draws, BAND_PERCENTILES)
    return PruneCheck(metric=metric, k=int(k), n_neurons=n_neurons, before=float(curves[0, 0]),
                      after=float(curves[0, -1]), random_mean=float(draws.mean()),
                      random_low=float(low), random_high=float(high), n_random=n_random,
                      oracle=None if oracle is None else float(curves[1, -1]))


def copy_model(model: nn.Module) -> nn.Module:
    """An independent copy of a model's modules, parameters and buffers, made outside
    inference mode (a copy made under the caller's torch.inference_mode would hold inference
    tensors, which no gradient can pass). torch.export's unflattened modules share their
    graphs (which hold symbolic shapes deepcopy cannot copy, and which nothing here changes)
    with the original."""
    shared: dict[int, Any] = {}
    for module in model.modules():
        for attribute in ("graph", "meta", "input_placeholders"):
            value = module.__dict__.get(attribute)
            if value is not None and not isinstance(value, torch.Tensor):
                shared[id(value)] = value
    try:
        with torch.inference_mode(False):
            return copy.deepcopy(model, shared)
    except Exception as error:  # noqa: BLE001 - whatever a custom module's copy raises
        raise AttributionError(f"This model cannot be copied ({type(error).__name__}: "
                               f"{error}), so no pruned copy can be made of it.") from None


def _read_layer(model: nn.Module, spec: str, inputs: Inputs, mode: str, batch_size: int,
                device) -> tuple[int, int, int, Optional[torch.Tensor]]:
    """(neuron axis of the layer's output (batch = dim 0), the output's number of dims, of
    neurons, the removed neurons' values [n, ...] for "mean" or None) of the layer, read from
    the data as the pruning curves read it: "mean" over all of it, else from one batch."""
    layer_pass = LayerPass(model, spec, inputs, batch_size=batch_size, device=device,
                           grad=False, what="prune on")
    with eval_mode(layer_pass.model):
        passes = _LayerPasses(layer_pass, None, 1)
        passes.kept = None  # nothing else is measured: keep no captures
        if mode == "mean":
            passes.first_pass(mean=True)
            z_dims = passes.z_sum.dim() + 1
        else:
            first = next(iter(passes))
            passes.n_neurons, z_dims = first.z.shape[1], first.z.dim()
    fill = None
    if mode == "mean":
        fill = (passes.z_sum / passes.z_count.clamp_min(1)).to(passes.z_dtype).cpu()
    return passes.runner.axis, z_dims, passes.n_neurons, fill


def _weight_neurons(name: str, module: nn.Module, chosen: Optional[int]) -> int:
    """The number of neurons of a layer that owns the weight producing them (the removal is
    then folded into that weight, on its own output axis); without data nothing else can
    be pruned."""
    kind = module_kind(name, module)
    weight = module._parameters.get("weight")
    if kind not in WEIGHT_LAYOUTS or weight is None:
        raise AttributionError(
            f"Layer {name!r} is a {kind} without weights of its own that produce its neurons; "
            "pass inputs= (a batch is enough) so that its neuron axis is read from its output.")
    if chosen is not None:
        raise AttributionError(f"A neuron axis chosen by hand ({name}:{chosen}) is read from "
                               "the layer's output: pass inputs= (a batch is enough).")
    return weight.shape[WEIGHT_LAYOUTS[kind][0]]


def _fold(model: nn.Module, name: str, module: nn.Module, removed: torch.Tensor,
          fill: torch.Tensor, axis: Optional[int], n_dims: Optional[int]) -> bool:
    """Fold the removal into `module`'s own weights where that is exact: each removed
    neuron's weight slice set to 0 and its bias to its one fill value. False (nothing
    changed) where it is not: no such weights, neurons on another axis than the weight's
    (`axis` of an output of `n_dims` dims; None = the weight's own), a fill that varies by
    position, a nonzero fill without a bias, a grouped transposed conv, or a weight or bias
    that another module also uses."""
    kind = module_kind(name, module)
    weight, bias = module._parameters.get("weight"), module._parameters.get("bias")
    if kind not in WEIGHT_LAYOUTS or weight is None or fill.dim() > 1:
        return False
    weight_axis, output_axis = WEIGHT_LAYOUTS[kind]
    if axis is not None and axis != output_axis % n_dims:
        return False
    if (weight.shape[weight_axis] != removed.shape[0] or _shared(model, [weight, bias])
            or (kind.startswith("ConvTranspose") and getattr(module, "groups", 1) != 1)):
        return False
    values = fill.expand(removed.shape[0])[removed]
    if bias is None and bool((values != 0).any()):
        return False
    with torch.no_grad():
        weight.movedim(weight_axis, 0)[removed.to(weight.device)] = 0
        if bias is not None:
            bias[removed.to(bias.device)] = values.to(bias.device, bias.dtype)
    return True


def _shared(model: nn.Module, tensors: Sequence[Optional[torch.Tensor]]) -> bool:
    """Does any of `tensors` appear more than once among the model's parameters (tied)?"""
    counts: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        counts[id(parameter)] = counts.get(id(parameter), 0) + 1
    return any(tensor is not None and counts.get(id(tensor), 0) > 1 for tensor in tensors)


def save_pt2(model: nn.Module, example: Any, path=None, *,
             class_names: Optional[Sequence[str]] = None) -> bytes:
    """The model as a torch.export .pt2 (batch dim dynamic, logits [B, n_classes] out),
    written to `path` when given, once torch.export has read it back.

    Args:
        model: any module torch.export can export (a pruned copy included).
        example: a batch of inputs [B, ...] (or `NamedInputs`); one sample is enough.
        path: where to write the file; None = only return the bytes.
        class_names: stored in the archive (extra/class_names.json), read back on loading.
    Returns:
        The archive's bytes. Refused (AttributionError, nothing written) where torch.export
        cannot read back what it wrote: a program whose shapes depend on the data's values
        (BART's head picks each row's <eos> by a boolean mask); `save_folder` keeps a
        Hugging Face model as a folder instead.
    """
    program = export_program(model, example)
    buffer = io.BytesIO()
    extra = {} if class_names is None else {"class_names.json": json.dumps(list(class_names))}
    torch.export.save(program, buffer, extra_files=extra)
    data = buffer.getvalue()
    try:
        torch.export.load(io.BytesIO(data))
    except Exception as error:  # noqa: BLE001 - any failure to read it back
        folder = (" Save it as a Hugging Face folder instead (save_folder; on the command line "
                  "--out a folder name without .pt2)." if _saves_as_folder(model) else "")
        raise AttributionError(
            "torch.export wrote this model but cannot read it back "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}): its shapes "
            "depend on the data's values, as where a model picks tokens by a boolean mask."
            + folder) from None
    if path is not None:
        with open(path, "wb") as file:
            file.write(data)
    return data


def save_folder(model: nn.Module, path, *, source=None) -> None:
    """A Hugging Face model (a pruned copy included) as a `save_pretrained` folder at `path`,
    which `load_model` reads as it read the original; the tokenizer's files are copied from
    the `source` folder when given. Refused where the copy is not the model's own class (its
    neurons removed by a `PrunedOutput` wrapper, which a config cannot describe)."""
    if not hasattr(model, "save_pretrained"):
        raise AttributionError("Only a Hugging Face model can be saved as a folder; save "
                               "this one as a .pt2 file (save_pt2).")
    if not _saves_as_folder(model):
        raise AttributionError(
            "The removed neurons are set by a wrapper around the layer (they are not one "
            "weight slice each), which a Hugging Face config cannot describe; save the "
            "pruned model as a .pt2 file (save_pt2) or prune a layer that owns its weights.")
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    if source is not None and Path(source).is_dir():
        for file in Path(source).iterdir():
            if file.is_file() and not file.is_symlink() and file.name in _TOKENIZER_FILES:
                shutil.copyfile(file, path / file.name)


_TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json",
    "preprocessor_config.json"})


def _saves_as_folder(model: nn.Module) -> bool:
    """A Hugging Face model whose modules are its own (no `PrunedOutput`)."""
    return hasattr(model, "save_pretrained") and not any(
        isinstance(module, PrunedOutput) for module in model.modules())


def export_program(model: nn.Module, example: Any) -> torch.export.ExportedProgram:
    """torch.export's program of `model` on `example` (cast to the model's float dtype), its
    batch dim dynamic, returning the logits tensor [B, n_classes] alone (`logits_of`, so a
    Hugging Face model's output class is not in the program); named inputs are taken by
    name, as the model takes them."""
    example = to_model(example, model, model_device(model))  # a dict as NamedInputs too
    rows = example if n_rows(example) >= 2 else repeat(example, 2)  # batch 1 would specialize
    batch = {0: torch.export.Dim.AUTO}
    if isinstance(rows, NamedInputs):
        traced, args, kwargs = _LogitsOf(model, list(rows.keys())), (), dict(rows.items())
        dims = {name: batch for name in rows.keys()}
    else:
        traced, args, kwargs = _LogitsOf(model), (rows,), {}
        dims = torch.export.ShapesCollection()  # matched by tensor: any forward signature
        dims[rows] = batch
    try:
        with eval_mode(model), torch.no_grad():
            return torch.export.export(traced, args, kwargs, dynamic_shapes=dims, strict=False)
    except Exception as error:  # noqa: BLE001 - torch.export's many refusals
        raise AttributionError(f"torch.export could not export this model "
                               f"({type(error).__name__}: {str(error).splitlines()[0]}).") from None


class _LogitsOf(nn.Module):
    """`model` returning its logits tensor alone (`logits_of` with its `output_key`), called
    with one positional input, or with keyword arguments named `names` (torch.export cannot
    give dynamic shapes to a forward(**kwargs), a loaded .pt2's, so this forward names each
    input). It shares the model's parameter, buffer and child tables, so the program's names
    are the model's own."""

    def __init__(self, model: nn.Module, names: Optional[Sequence[str]] = None):
        super().__init__()
        for table in ("_parameters", "_buffers", "_modules"):
            self.__dict__[table] = model.__dict__[table]
        self.training = model.training
        key = output_key(model)

        if names is None:
            def forward(x):
                return logits_of(model(x), key)
        else:
            def forward(**inputs):
                return logits_of(model(**inputs), key)

            forward.__signature__ = inspect.Signature(
                [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names])
        self.__dict__["forward"] = forward
