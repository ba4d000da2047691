"""Which modules of a model have neurons, and turning a user's layer choice into a module."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import AttributionError
from .guards import eval_mode, forward_hooks
from .model_io import (NamedInputs, call, describe, device_of, float_dtype, is_batch,
                       is_floating, logits_of, n_rows, named, output_key, repeat, take,
                       to_device)


AXIS_RULES = {
    "only axis": "the output is [N, n], or n is its only axis longer than 1 (an axis of "
                 "length 1, such as a Linear's one output over a conv's length axis, would "
                 "rank a single neuron)",
    "lengths": "the other axes follow the length of the inputs (positions); when every axis "
               "follows an input dim, the rules below decide",
    "parameters": "the only axis whose size is a dim of the module's parameters",
    "input": "as the layer feeding it (same shape, no parameters of its own)",
    "users": "as the layers it feeds (same shape), where nothing above told its axes apart",
    "channels first": "dim 1, as for conv channels (nothing else told the axes apart)",
    "chosen": "given with the layer as 'name:axis'",
}
"""How a layer's neuron axis was found (`LayerInfo.axis_rule`), most data-driven first."""
WEIGHT_LAYOUTS = {
    "Linear": (0, -1), "Bilinear": (0, -1), "Conv1D": (1, -1), "Embedding": (1, -1),
    "Conv1d": (0, 1), "Conv2d": (0, 1), "Conv3d": (0, 1),
    "ConvTranspose1d": (1, 1), "ConvTranspose2d": (1, 1), "ConvTranspose3d": (1, 1),
    "BatchNorm1d": (0, 1), "BatchNorm2d": (0, 1), "BatchNorm3d": (0, 1),
    "SyncBatchNorm": (0, 1), "GroupNorm": (0, 1), "InstanceNorm1d": (0, 1),
    "InstanceNorm2d": (0, 1), "InstanceNorm3d": (0, 1), "LayerNorm": (0, -1),
    "RMSNorm": (0, -1)}
"""Modules whose own weight produces their outputs, by kind: (the weight's axis that runs
over the output neurons, the output axis those neurons are on). `weight_norm` reads the
slices; `prune` zeroes them."""
BATCH_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")
AXIS_FOUND = {
    "only axis": "its only axis besides the batch",
    "lengths": "the other axes follow the size of the input (found by resizing it)",
    "parameters": "found from the sizes of the layer's parameters",
    "input": "as the layer feeding it",
    "users": "as the layers it feeds",
    "channels first": "dim 1 by default (the data did not tell the axes apart)",
    "chosen": "chosen by hand",
}
"""`AXIS_RULES` in a user's words, for a sentence about a layer (`LayerInfo.axis_words`)."""


@dataclass(frozen=True)
class LayerInfo:
    """A module whose output has a neuron axis.

    Attributes:
        name: dotted name as in `model.named_modules()`.
        kind: the module's class name (e.g. "Linear", "Conv2d", "ReLU").
        n_neurons: size of the neuron axis (units of a Linear, channels of a Conv, features
            of a position-wise layer on a sequence).
        shape: output shape of one sample, without the batch dim, e.g. (32,) or (16, 8, 8).
        neuron_axis: the output dim of the neurons (batch = dim 0); the other dims are
            positions (a conv's pixels, a sequence's tokens), over which scores are pooled.
        axis_rule: how the axis was found, a key of `AXIS_RULES`.
        output_entry: how the layer's tensor is taken from the module's output, as Python
            indexing (`output_entry`): "" for a tensor, "[0]" for a tuple.
    """

    name: str
    kind: str
    n_neurons: int
    shape: tuple[int, ...]
    neuron_axis: int = 1
    axis_rule: str = "only axis"
    output_entry: str = ""

    @property
    def positions(self) -> tuple[int, ...]:
        """The shape of the position axes of one sample, () for [N, n]."""
        return tuple(s for axis, s in enumerate(self.shape, 1) if axis != self.neuron_axis)

    def describe(self) -> str:
        """E.g. "16 positions × 128 features", "8 × 8 positions × 16 channels", "32 neurons",
        "1 position × 2 channels" (a Linear with one output over [N, 2, L]: see
        `AXIS_RULES`, "only axis")."""
        if not self.positions:
            return f"{self.n_neurons} neurons"
        where = " × ".join(map(str, self.positions))
        noun = "position" if all(size == 1 for size in self.positions) else "positions"
        return f"{where} {noun} × {self.n_neurons} {self.unit}"

    @property
    def unit(self) -> str:
        """What one neuron is called: "neurons" ([N, n] or an axis chosen by hand),
        "channels" (dim 1) or "features"."""
        return "neurons" if not self.positions or self.axis_rule == "chosen" else (
            "channels" if self.neuron_axis == 1 else "features")

    def axis_words(self) -> str:
        """E.g. "128 features along dim 2, the other axis follows the input's length (found
        by resizing it)"; an image layer's follow its height and width."""
        found = AXIS_FOUND.get(self.axis_rule, self.axis_rule)
        if self.axis_rule == "only axis" and self.positions:
            found = "its only axis besides the batch longer than 1"
        elif self.axis_rule == "lengths" and len(self.positions) == 1:
            found = "the other axis follows the input's length (found by resizing it)"
        elif self.axis_rule == "lengths" and len(self.positions) == 2:
            found = "the other axes follow the input's height and width (found by resizing it)"
        return f"{self.n_neurons} {self.unit} along dim {self.neuron_axis}, {found}"

    def with_axis(self, axis: int) -> "LayerInfo":
        """This layer with neuron axis `axis` (1..len(shape)) chosen by hand; itself when
        `axis` is the axis already found. AttributionError for an axis it does not have."""
        if axis == self.neuron_axis:
            return self
        if not 1 <= axis <= len(self.shape):
            raise AttributionError(f"Neuron axis {axis} does not fit layer {self.name!r}, "
                                   f"whose output is [N, {', '.join(map(str, self.shape))}]; "
                                   f"choose 1..{len(self.shape)}.")
        return replace(self, neuron_axis=axis, n_neurons=self.shape[axis - 1],
                       axis_rule="chosen")

    @property
    def spec(self) -> str:
        """The layer spec of `resolve_layer`: the name, with ":axis" when chosen by hand."""
        return f"{self.name}:{self.neuron_axis}" if self.axis_rule == "chosen" else self.name


def run_model(model: nn.Module, inputs):
    """Call the model on a batch (`model_io.call`; floating-point inputs in the model's float
    dtype, as the engine runs it), turning the model's own error into an AttributionError."""
    if is_batch(named(inputs)):
        inputs = to_device(inputs, device_of(inputs), float_dtype(model))
    try:
        return call(model, inputs)
    except AttributionError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]  # not fx's dump
        if isinstance(error, TypeError) and "required positional argument" in reason:
            hint = ("The model's forward takes more than one input: pass a dict of named "
                    "inputs, {argument name: tensor [N, ...]} (in a .npz or .pt: one array "
                    "per argument, chosen with features=[...] / --input-names).")
        elif is_batch(inputs) and not is_floating(inputs):
            hint = "Integer inputs are ids: they must lie in the model's vocabulary (0..size-1)."
        else:
            hint = "Check the feature count / image shape the model expects."
        raise AttributionError(
            f"The model could not run on inputs of shape {describe(inputs)}: {reason}. {hint}"
        ) from error


def run_logits(model: nn.Module, inputs) -> torch.Tensor:
    """The model's logits [B, n_classes] for a batch: `run_model`, then the output entry
    that holds them (`model_io.logits_of`, as declared with `model_io.select_output`)."""
    return logits_of(run_model(model, inputs), output_key(model))


def module_kind(name: str, module: nn.Module) -> str:
    """The class name of a module; for torch.export's unflattened modules (all of class
    InterpreterModule) the original class, read from the graph's `nn_module_stack`."""
    graph = getattr(module, "graph", None)
    if graph is not None and type(module).__name__ == "InterpreterModule":
        for node in graph.nodes:
            for path, kind in (node.meta.get("nn_module_stack") or {}).values():
                if path == name:
                    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
                    return kind.rsplit(".", 1)[-1]
    return type(module).__name__


def list_layers(model: nn.Module, example_input) -> list[LayerInfo]:
    """Every module whose output has a neuron axis, in call order; for a tuple or ModelOutput
    output (attention, a transformers model inside a classifier), its `output_tensor`.

    Found by a forward pass of `example_input` ([B, ...], B >= 1; a tensor or named inputs),
    plus one pass per input dim with that dim halved, which tells position axes (they follow
    the input's length) from neuron axes; see `AXIS_RULES` for the order of the rules.
    Skipped: the model itself and containers whose output is the logits, modules that
    return their input unchanged (Identity, Dropout in eval), containers whose output is a
    listed child's output, and modules called more than once per forward (shared modules
    cannot be scored unambiguously); the innermost container passing on the output of such
    a shared module (a ResNet block ending in its twice-called ReLU) is listed in its place.
    An in-place module (ReLU(inplace=True)) after a listed layer is listed: it changed the
    values.
    """
    survey = _survey(model, named(example_input))  # a plain dict of tensors as NamedInputs
    return [info for name, info in survey.layers.items() if name in survey.listed]


def neuron_axis(model: nn.Module, name: str, example_input) -> tuple[int, str]:
    """(neuron axis, rule of `AXIS_RULES`) of module `name`'s output, listed or not; (1,
    "channels first") when the module gave no tensor output."""
    info = _survey(model, take(example_input, slice(0, 2))).layers.get(name)
    return (info.neuron_axis, info.axis_rule) if info is not None else (1, "channels first")


@dataclass
class _Survey:
    layers: dict[str, LayerInfo]  # every module with a tensor output of dim >= 2, call order
    listed: set[str]


def _survey(model: nn.Module, example_input) -> _Survey:
    example_input = named(example_input)
    if not is_batch(example_input):
        raise AttributionError(
            f"The example input is a {type(example_input).__name__}; give one batch: a tensor "
            "[B, ...], or for a forward() of several arguments a dict of named inputs "
            "{argument name: tensor [B, ...]}, not a tuple or list.")
    if n_rows(example_input) == 1:  # two rows tell a per-sample output from a broadcast one
        example_input = repeat(example_input, 2)
    rows = n_rows(example_input)
    names = {module: name for name, module in model.named_modules() if name}
    calls: dict[str, int] = {}
    shapes: dict[str, torch.Size] = {}  # the first output of each module
    entries: dict[str, str] = {}  # where in it the tensor is (`output_entry`)
    feeders: dict[str, str] = {}  # module -> the module whose output was its first input
    claims: dict[str, list[str]] = {}  # producer -> containers passing its output on
    passing: set[str] = set()  # modules returning their input unchanged
    # id -> (tensor, its version when seen, producer); holding the tensor keeps its id
    produced: dict[int, tuple[torch.Tensor, int, str]] = {}

    def record(name):
        def hook(module, args, returned):
            calls[name] = calls.get(name, 0) + 1
            output = output_tensor(returned)
            if (calls[name] > 1 or not isinstance(output, torch.Tensor) or output.dim() < 2
                    or output.shape[0] != rows):  # e.g. position embeddings [1, T, F]
                return None
            entries[name] = output_entry(returned)
            first_input = args[0] if args else None
            source = (produced.get(id(first_input)) if isinstance(first_input, torch.Tensor)
                      else None)
            if source is not None and source[1] == first_input._version:
                feeders[name] = source[2]
            earlier = produced.get(id(output))
            if earlier is not None and earlier[1] == output._version:
                claims.setdefault(earlier[2], []).append(name)  # a child's output passed on
                shapes[name] = output.shape
                return None
            if earlier is None and output is first_input:
                passing.add(name)  # the input passed on: Identity, Dropout in eval
                return None
            produced[id(output)] = (output, output._version, name)  # in-place ops bump it
            shapes[name] = output.shape
            return None
        return hook

    with eval_mode(model), torch.no_grad(), forward_hooks(
        {module: record(name) for module, name in names.items()}
    ):
        result = run_model(model, example_input)
    followed = _axes_following_lengths(model, example_input, names, shapes)
    layers: dict[str, LayerInfo] = {}
    for name, shape in shapes.items():  # call order: a feeder is decided before its users
        module = model.get_submodule(name)
        axis, rule = _neuron_axis(shape, followed.get(name, set()), module,
                                  layers.get(feeders.get(name, "")), list(layers.values()))
        layers[name] = LayerInfo(name, module_kind(name, module), int(shape[axis]),
                                 tuple(int(s) for s in shape[1:]), axis, rule, entries[name])
    _axes_from_users(layers, feeders)
    once = {name for name in layers if calls.get(name) == 1 and name not in passing}
    owners = [name for name in layers if name in once and not any(
        name in containers for containers in claims.values())]
    for producer, containers in claims.items():  # a shared module's output: innermost owner
        if producer not in once:
            owners += [c for c in containers if c in once][:1]
    try:  # a container returning the logits (in a tuple or ModelOutput too) is not a layer
        logits = logits_of(result, output_key(model))
    except AttributionError:
        logits = None
    listed = {name for name in owners if not (
        logits is not None and _is_container(model.get_submodule(name))
        and shapes[name] == logits.shape and _same_output(name, produced, claims, logits))}
    return _Survey(layers, listed)


def _axes_from_users(layers: dict[str, LayerInfo], feeders: dict[str, str]) -> None:
    """Give a layer that no rule told apart ("channels first", e.g. a ViT's embeddings: its
    parameters have both the patch count and the width) the axis of the layers it feeds
    when they share its shape and agree; then pass it on to the elementwise layers after
    it ("input"). Call order, in place."""
    users: dict[str, list[LayerInfo]] = {}
    for user, feeder in feeders.items():
        if user in layers:
            users.setdefault(feeder, []).append(layers[user])
    changed: set[str] = set()
    for name, info in layers.items():
        if info.axis_rule == "input" and feeders.get(name) in changed:
            axis, rule = layers[feeders[name]].neuron_axis, "input"
        elif info.axis_rule == "channels first":
            axes = {user.neuron_axis for user in users.get(name, ())
                    if user.shape == info.shape and user.axis_rule in ("lengths", "parameters")}
            if len(axes) != 1:
                continue
            axis, rule = axes.pop(), "users"
        else:
            continue
        if axis != info.neuron_axis:
            changed.add(name)
        layers[name] = replace(info, neuron_axis=axis, n_neurons=info.shape[axis - 1],
                               axis_rule=rule)


def _is_leaf(value: Any) -> bool:
    """Is `value` a leaf of an output's structure (not a tuple, list, dict or ModelOutput)?"""
    return not isinstance(value, (tuple, list, Mapping))


def output_tensor(output: Any) -> Optional[torch.Tensor]:
    """The tensor a module's output stands for as a layer: the output itself, or the first
    tensor of a tuple, list, dict or ModelOutput (depth first), by convention its main one
    (MultiheadAttention's attention output, a transformers module's hidden states). Where
    the model uses that entry, it is the tensor a .pt2 returns for the module: torch.export's
    unflattened modules return the values the model uses (sizes, ints, among them). None
    when the output holds no tensor."""
    if isinstance(output, torch.Tensor):
        return output
    leaves = pytree.tree_leaves(output, is_leaf=_is_leaf)
    return next((leaf for leaf in leaves if isinstance(leaf, torch.Tensor)), None)


def output_entry(output: Any) -> str:
    """Where `output_tensor` takes its tensor from a module's output, as Python indexing: ""
    for a tensor, e.g. "[0]" for a tuple, "['last_hidden_state']" for a ModelOutput."""
    if isinstance(output, torch.Tensor):
        return ""
    entries, _ = pytree.tree_flatten_with_path(output, is_leaf=_is_leaf)
    return next((pytree.keystr(path) for path, leaf in entries
                 if isinstance(leaf, torch.Tensor)), "")


def with_output_tensor(output: Any, tensor: torch.Tensor) -> Any:
    """`output` with its `output_tensor` replaced by `tensor`: `tensor` for a tensor output,
    else a new tuple / list / dict / ModelOutput of the same structure."""
    if isinstance(output, torch.Tensor):
        return tensor
    leaves, structure = pytree.tree_flatten(output, is_leaf=_is_leaf)
    first = next(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    return pytree.tree_unflatten([tensor if i == first else leaf
                                  for i, leaf in enumerate(leaves)], structure)


def _is_container(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


def _same_output(name: str, produced: dict, claims: dict, logits: torch.Tensor) -> bool:
    """Is the tensor `name` returned the model's own output (the logits)?"""
    entry = produced.get(id(logits))
    return entry is not None and (entry[2] == name or name in claims.get(entry[2], []))


def _resized(example_input, dim: int, size):
    """The inputs with dim `dim` cut or tiled to `size(length)` (None where it has no such
    dim, or the length would not change)."""
    def resize(value: torch.Tensor) -> torch.Tensor:
        length = size(value.shape[dim])
        return value.narrow(dim, 0, length) if length < value.shape[dim] else torch.cat(
            [value] * -(-length // value.shape[dim]), dim).narrow(dim, 0, length)

    if isinstance(example_input, NamedInputs):  # sequences: every entry of that length
        lengths = {v.shape[dim] for v in example_input.values() if v.dim() > dim}
        if len(lengths) != 1 or size(next(iter(lengths))) in (0, next(iter(lengths))):
            return None
        return example_input.map(lambda v: resize(v) if v.dim() > dim else v)
    if not isinstance(example_input, torch.Tensor) or example_input.dim() <= dim \
            or size(example_input.shape[dim]) in (0, example_input.shape[dim]):
        return None
    return resize(example_input)


def _axes_following_lengths(model: nn.Module, example_input, names: dict,
                            shapes: dict[str, torch.Size]) -> dict[str, set[int]]:
    """Module -> the axes of its output whose size changed when an input dim was halved or
    doubled.

    The model may refuse the other length part way (a fixed-size head, position embeddings
    of fixed count, a pooling window longer than the halved input): the modules that ran
    before it did still count, and the other resize reaches the modules the first did not
    (Captum's MaxPool_ReLU on [N, 2, 3]: a length of 1 is shorter than the window of 3, a
    length of 6 is not).
    """
    n_dims = max((v.dim() for v in example_input.values()), default=1) if isinstance(
        example_input, NamedInputs) else example_input.dim()
    followed: dict[str, set[int]] = {}
    for dim, size in ((dim, size) for dim in range(1, n_dims)
                      for size in (lambda length: length // 2,  # a length of 1 is no length
                                   lambda length: 2 * length if length > 1 else length)):
        resized = _resized(example_input, dim, size)
        if resized is None:
            continue
        seen: dict[str, torch.Size] = {}

        def record(name):
            def hook(module, args, output):
                output = output_tensor(output)
                if name not in seen and isinstance(output, torch.Tensor):
                    seen[name] = output.shape
            return hook

        with eval_mode(model), torch.no_grad(), forward_hooks(
                {module: record(name) for module, name in names.items()}):
            try:
                call(model, resized)
            except Exception:  # noqa: BLE001 - a probe: what ran before the failure counts
                pass
        for name, shape in seen.items():
            base = shapes.get(name)
            if base is not None and len(base) == len(shape) and base[0] == shape[0]:
                followed.setdefault(name, set()).update(
                    axis for axis in range(1, len(base)) if base[axis] != shape[axis])
    return followed


def _neuron_axis(shape: torch.Size, followed: set[int], module: nn.Module,
                 feeder: Optional[LayerInfo], earlier: list[LayerInfo]) -> tuple[int, str]:
    """(axis, rule) for an output of `shape` [B, ...], by the rules of `AXIS_RULES`."""
    if len(shape) == 2:
        return 1, "only axis"
    candidates = [axis for axis in range(1, len(shape)) if axis not in followed]
    if not candidates:  # every axis follows some input dim (a pooling keeps the channels):
        followed, candidates = set(), list(range(1, len(shape)))  # lengths tell nothing apart
    candidates = [axis for axis in candidates if shape[axis] > 1] or candidates
    if len(candidates) == 1:
        return candidates[0], "lengths" if followed else "only axis"
    sizes = {int(s) for p in module.parameters() for s in p.shape}
    matching = [axis for axis in candidates if shape[axis] in sizes]
    if len(matching) == 1:
        return matching[0], "parameters"
    if not sizes:  # elementwise: the axis of the layer feeding it (or the latest of its shape)
        same = [info for info in earlier if info.shape == tuple(shape[1:])]
        source = feeder if feeder is not None and feeder.shape == tuple(shape[1:]) else (
            same[-1] if same else None)
        if source is not None and source.neuron_axis in candidates:
            return source.neuron_axis, "input"
    return (1 if 1 in candidates else candidates[0]), "channels first"


def split_axis(layer: str | nn.Module) -> tuple[str | nn.Module, Optional[int]]:
    """A layer spec "name:axis" as (name, axis); (layer, None) without an axis."""
    if isinstance(layer, str) and ":" in layer:
        name, _, axis = layer.rpartition(":")
        if axis.lstrip("-").isdigit():
            return name, int(axis)
    return layer, None


def resolve_layer(model: nn.Module, layer: str | nn.Module) -> tuple[str, nn.Module]:
    """(layer spec, module) for a layer given by module object, dotted name, or "name:axis"
    (its neuron axis chosen by hand, e.g. "transformer.h.0.mlp.c_fc:2"; batch = dim 0).

    The spec is the dotted name, with ":axis" kept when one was given; `runner_for` reads it.
    """
    modules = dict(model.named_modules())
    if isinstance(layer, nn.Module):
        for name, module in modules.items():
            if module is layer and name:
                return name, module
        raise AttributionError("That module is not part of this model; pass one of its "
                               "submodules or its dotted name.")
    name, axis = split_axis(layer) if layer not in modules else (layer, None)
    if not isinstance(name, str) or name not in modules or name == "":
        valid = ", ".join(name for name in modules if name) or "(none)"
        raise AttributionError(f"Unknown layer {layer!r}. Valid layer names: {valid}; add "
                               "':axis' to choose the neuron axis (e.g. 'fc:2').")
    return (name if axis is None else f"{name}:{axis}"), modules[name]
