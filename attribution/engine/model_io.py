"""How the library calls a model and reads its logits.

Inputs: one tensor [N, ...], or `NamedInputs`: named per-sample tensors that a model takes as
keywords (transformers' `input_ids`, `attention_mask`, `token_type_ids`, `pixel_values`).
Every part of the library that slices, moves, repeats, joins or feeds inputs uses the
functions here, so both kinds flow through scoring, curves, shards and clusters alike:

    n_rows(x), row_size(x), take(x, rows), to_model(x, model, device), repeat(x, r), cat(parts),
    call(model, x), attention_mask(x), interpolate(x, alphas)

Each takes a plain dict of arrays too (as `NamedInputs`).

Outputs: a tensor [N, C]; a transformers `ModelOutput` or a dict (its "logits"); a tuple,
list or namedtuple (its `logits` field, else its first [N, C] tensor). `select_output` names
the entry explicitly for a model whose logits are elsewhere.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import math

import numpy as np
import torch
from torch import nn

from ..errors import AttributionError

Array = Union[torch.Tensor, np.ndarray]
OutputKey = Union[str, int, None]
MASK_NAME = "attention_mask"
"""The input that marks real tokens (1) and padding (0) in a [N, T] batch of sequences."""
TEXT_INPUT = "input_ids"
"""The token ids [N, T] of a text model (what a Dataset's `tokens` spell out)."""
TEXT_INPUTS = (TEXT_INPUT, MASK_NAME, "token_type_ids")
"""The named inputs of transformers' text classifiers, found in data by these names."""


class NamedInputs:
    """Named per-sample arrays or tensors sharing their first (batch) dim N.

    Slices like an array: `x[10:20]` or `x[index_tensor]` takes those rows of every entry,
    `x["input_ids"]` is one entry; `shape` is (N,) and `len(x)` is N. The model is called as
    `model(**x)`.

    Args:
        entries: name -> tensor or array [N, ...]; names are the model's keyword arguments.
    """

    def __init__(self, entries: Mapping[str, Array]):
        items = dict(entries)
        if not items:
            raise AttributionError("Named inputs need at least one entry, e.g. "
                                   "{'input_ids': ids [N, T]}.")
        for name, value in items.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise AttributionError(f"Input names must be keyword names of the model's "
                                       f"forward(); got {name!r}.")
            if not isinstance(value, (torch.Tensor, np.ndarray)) or value.ndim < 1:
                raise AttributionError(f"Input {name!r} must be a tensor or array [N, ...] "
                                       f"(batch first); got {type(value).__name__}"
                                       f"{list(getattr(value, 'shape', []))}.")
        sizes = {name: int(value.shape[0]) for name, value in items.items()}
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{name} {size}" for name, size in sizes.items())
            raise AttributionError(f"Named inputs must have the same number of samples "
                                   f"(first dim); got {shown}.")
        self._entries = items

    @property
    def shape(self) -> tuple[int]:
        return (int(next(iter(self._entries.values())).shape[0]),)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the first entry a path method can scale (`_scaled`: floating point,
        not the attention mask), else the first entry's (int64 for token ids)."""
        scaled = [_dtype(value) for name, value in self._entries.items() if _scaled(name, value)]
        return scaled[0] if scaled else _dtype(next(iter(self._entries.values())))

    def keys(self):
        return self._entries.keys()

    def items(self):
        return self._entries.items()

    def values(self):
        return self._entries.values()

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._entries[key]
        return NamedInputs({name: value[key] for name, value in self._entries.items()})

    def map(self, function) -> "NamedInputs":
        """The same names, each value passed through `function`."""
        return NamedInputs({name: function(value) for name, value in self._entries.items()})

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}: {list(value.shape)} {value.dtype}"
                          for name, value in self._entries.items())
        return f"NamedInputs({shown})"


def named(inputs: Any) -> Any:
    """A plain mapping of arrays as `NamedInputs`; anything else unchanged."""
    if isinstance(inputs, (torch.Tensor, np.ndarray, NamedInputs)):  # no ABC check per batch
        return inputs
    if isinstance(inputs, Mapping):
        return NamedInputs(inputs)
    return inputs


def is_batch(x: Any) -> bool:
    """Is `x` one in-memory batch of inputs (tensor, array or NamedInputs), not an iterable?"""
    return isinstance(x, (torch.Tensor, np.ndarray, NamedInputs))


def sample_values(x: Any, index: int) -> Any:
    """Sample `index` of a batch on the CPU as NumPy: an array [...], or {name: array} for
    named inputs (each of its own shape)."""
    x = named(x)
    if isinstance(x, NamedInputs):
        return {name: _tensor(value[index]).detach().cpu().numpy() for name, value in x.items()}
    return _tensor(x[index]).detach().cpu().numpy()


def n_rows(x: Any) -> int:
    """N of a batch [N, ...]."""
    x = named(x)
    return int(x.shape[0])


def row_size(x: Any) -> int:
    """Elements of one sample (over every named entry)."""
    x = named(x)
    values = x.values() if isinstance(x, NamedInputs) else [x]
    return sum(math.prod(value.shape[1:]) for value in values)


def take(x: Any, rows) -> Any:
    """Rows of a batch: a slice or an index tensor/array."""
    x = named(x)
    return x[rows]


def _dtype(value: Array) -> torch.dtype:
    """The torch dtype of a tensor or array, without copying the array."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.empty(0, value.dtype)).dtype
    return _tensor(value).dtype


def _tensor(value: Array) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
        return torch.from_numpy(value if value.flags.writeable else value.copy())  # mmap: r/o
    if isinstance(value, torch.Tensor):
        return value
    raise AttributionError(f"Inputs must be tensors or NumPy arrays; got "
                           f"{type(value).__name__}.")


def float_dtype(model: nn.Module) -> Optional[torch.dtype]:
    """The dtype of the model's first floating-point parameter (None if it has none), in
    `model.parameters()` order; stops at the first one, so it costs next to nothing per
    batch."""
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None and parameter.is_floating_point():
                return parameter.dtype
    return None


def to_model(x: Any, model: nn.Module, device: torch.device) -> Any:
    """A batch as tensors on `device`; floating-point ones in the model's float dtype."""
    return to_device(x, device, float_dtype(model))


def to_device(x: Any, device: torch.device, dtype: Optional[torch.dtype]) -> Any:
    """A batch as tensors on `device`; floating-point ones in `dtype` (None: as they are)."""
    x = named(x)

    def convert(value):
        value = _tensor(value)
        wanted = dtype if dtype is not None and value.is_floating_point() else value.dtype
        if value.dtype == wanted and value.device == device:
            return value  # as .to() would, without its call (a batch's inputs, every batch)
        return value.to(device=device, dtype=wanted)

    if isinstance(x, NamedInputs):
        return x.map(convert)
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise AttributionError(f"Inputs must be a tensor, a NumPy array, a dict of them "
                               f"(named inputs) or an iterable of batches; got "
                               f"{type(x).__name__}.")
    return convert(x)


def is_floating(x: Any) -> bool:
    """Does the batch hold inputs that a path method can scale (`_scaled`: floating point,
    not the attention mask)? The one rule `methods_for` reads through `NamedInputs.dtype`."""
    x = named(x)
    if isinstance(x, NamedInputs):
        return any(_scaled(name, value) for name, value in x.items())
    return _dtype(x).is_floating_point


def repeat(x: Any, repeats: int) -> Any:
    """`repeats` stacked copies of a batch [N, ...] -> [repeats*N, ...], copy-major."""
    x = named(x)
    def stacked(value: torch.Tensor) -> torch.Tensor:
        return value.repeat(repeats, *([1] * (value.dim() - 1)))

    return x.map(stacked) if isinstance(x, NamedInputs) else stacked(x)


def cat(parts: list) -> Any:
    """Batches joined along the batch dim (named ones name by name)."""
    parts = [named(part) for part in parts]
    if parts and isinstance(parts[0], NamedInputs):
        names = list(parts[0].keys())
        if any(list(part.keys()) != names for part in parts):
            raise AttributionError("Every batch of named inputs must have the same names.")
        return NamedInputs({name: torch.cat([_tensor(part[name]) for part in parts])
                            for name in names})
    return torch.cat([_tensor(part) for part in parts])


def call(model: nn.Module, x: Any) -> Any:
    """`model(**x)` for named inputs (or a plain dict of them), `model(x)` for one tensor."""
    x = named(x)
    if not isinstance(x, NamedInputs):
        return model(x)
    positional = _positional_names(model)
    if positional:
        return model(*(x[name] for name in positional),
                     **{name: value for name, value in x.items() if name not in positional})
    return model(**dict(x.items()))


def _positional_names(model: Any) -> list[str]:
    """The inputs that a torch.export module exported with positional arguments takes by
    position (it refuses them as keywords); [] for any other module."""
    calls = getattr(model, "module_call_graph", None)
    if not calls:
        return []
    count = calls[0].signature.in_spec.children()[0].num_children
    placeholders = [node.name for node in model.graph.nodes if node.op == "placeholder"]
    return placeholders[:count]


def attention_mask(x: Any) -> Optional[torch.Tensor]:
    """The [N, T] attention mask of named inputs (1 = real token), else None."""
    x = named(x)
    if isinstance(x, NamedInputs) and MASK_NAME in x:
        mask = _tensor(x[MASK_NAME])
        return mask if mask.dim() == 2 else None
    return None


def interpolate(x: Any, alphas: torch.Tensor) -> Any:
    """[S*N, ...]: the batch with its floating-point inputs scaled by each of the S alphas
    (step-major); integer inputs (ids, masks) and the attention mask are repeated as they are."""
    def scaled(value: torch.Tensor) -> torch.Tensor:
        scaled = alphas.view((-1,) + (1,) * value.dim()) * value.unsqueeze(0)
        return scaled.to(value.dtype).flatten(0, 1)  # a half-precision model stays half

    return _map_floats(x, scaled, lambda value: repeat(value, alphas.numel()))


def scale_rows(x: Any, alphas: torch.Tensor) -> Any:
    """[N, ...]: row i of the batch with its floating-point inputs scaled by alphas[i] [N];
    integer inputs and the attention mask as they are."""
    def scaled(value: torch.Tensor) -> torch.Tensor:
        return (alphas.view((-1,) + (1,) * (value.dim() - 1)) * value).to(value.dtype)

    return _map_floats(x, scaled, lambda value: value)


def _map_floats(x: Any, on_floats: Callable, on_others: Callable) -> Any:
    """The batch with `on_floats` applied to the inputs a path scales (`_scaled`) and
    `on_others` to the rest."""
    x = named(x)
    if isinstance(x, NamedInputs):
        return NamedInputs({name: on_floats(value) if _scaled(name, value) else on_others(value)
                            for name, value in x.items()})
    return on_floats(x)


def all_scaled(x: Any) -> bool:
    """Does a path from zero (`interpolate`, `scale_rows`) scale every input of the batch,
    so that its zero end is the same for every sample (no integer input, no mask)?"""
    x = named(x)
    if isinstance(x, NamedInputs):
        return all(_scaled(name, value) for name, value in x.items())
    return x.is_floating_point()


def _scaled(name: str, value: Array) -> bool:
    """Does a path scale this named input: floating point, and not the attention mask?"""
    return _dtype(value).is_floating_point and name != MASK_NAME


def device_of(x: Any) -> torch.device:
    """Where a batch of tensors lives."""
    x = named(x)
    value = next(iter(x.values())) if isinstance(x, NamedInputs) else x
    return value.device if isinstance(value, torch.Tensor) else torch.device("cpu")


def flat(x: Any) -> torch.Tensor:
    """[N, F] float64: every value of each sample side by side (k-means on the inputs)."""
    x = named(x)
    values = x.values() if isinstance(x, NamedInputs) else [x]
    return torch.cat([_tensor(value).reshape(len(value), -1).double() for value in values], 1)


def describe(x: Any) -> str:
    """The shapes of a batch, for messages."""
    x = named(x)
    if isinstance(x, NamedInputs):
        return ", ".join(f"{name} {list(value.shape)} ({value.dtype})"
                         for name, value in x.items())
    return f"{list(x.shape)} (dtype {x.dtype})" if hasattr(x, "shape") else type(x).__name__


# ------------------------------------------------------------------------------- outputs

_OUTPUT_KEYS: "weakref.WeakKeyDictionary[nn.Module, OutputKey]" = weakref.WeakKeyDictionary()
_OUTPUT_LOCK = threading.Lock()


def select_output(model: nn.Module, key: OutputKey) -> None:
    """Declare where `model`'s logits are in its output: a key of a dict / ModelOutput or a
    field of a namedtuple (str), a position in a tuple (int), or None for the default rule
    (the `logits` entry, else the first [N, C] tensor). Kept beside the model, weakly."""
    if key is not None and (isinstance(key, bool) or not isinstance(key, (str, int))):
        raise AttributionError(f"output= must be a key (str) or a position (int); got "
                               f"{key!r}.")
    with _OUTPUT_LOCK:
        if key is None:
            _OUTPUT_KEYS.pop(model, None)
        else:
            _OUTPUT_KEYS[model] = key


def output_key(model: nn.Module) -> OutputKey:
    """The key declared with `select_output` (None: the default rule)."""
    with _OUTPUT_LOCK:
        return _OUTPUT_KEYS.get(model)


def _entries(output: Any) -> list[tuple[str, Any]]:
    """(name, value) of a structured output, in order."""
    if isinstance(output, Mapping):
        return [(str(name), value) for name, value in output.items()]
    fields = getattr(output, "_fields", None)  # a namedtuple
    if fields is not None:
        return list(zip(fields, output))
    return [(str(position), value) for position, value in enumerate(output)]


def shape_text(value: Any) -> str:
    """A tensor's shape as text ("[2, 64]"), else the value's type name, for messages."""
    if isinstance(value, torch.Tensor):
        return str(list(value.shape))
    return type(value).__name__


def logits_of(output: Any, key: OutputKey = None) -> torch.Tensor:
    """The [B, n_classes] logits in a model's output (see the module docstring).

    Args:
        output: what the model returned.
        key: as in `select_output`; None = the `logits` entry, else the first 2-D tensor.
    """
    if isinstance(output, torch.Tensor) and key is None:
        chosen = output
    elif isinstance(output, (Mapping, tuple, list)):
        entries = _entries(output)
        if key is None:
            by_name = dict(entries)
            chosen = by_name.get("logits")
            if chosen is None:
                chosen = next((value for _, value in entries
                               if isinstance(value, torch.Tensor) and value.dim() == 2),
                              entries[0][1] if len(entries) == 1 else None)
        elif isinstance(key, int) and -len(entries) <= key < len(entries):
            chosen = entries[key][1]
        elif isinstance(key, str) and key in dict(entries):
            chosen = dict(entries)[key]
        else:
            shown = ", ".join(f"{name}: {shape_text(value)}" for name, value in entries)
            raise AttributionError(f"The model's output has no entry {key!r}; it has "
                                   f"{shown or 'none'}. Choose one of them as the output.")
    else:
        raise AttributionError(f"The model returned {shape_text(output)}, from which no "
                               f"entry {key!r} can be chosen; drop the output choice.")
    if chosen is None or not isinstance(chosen, torch.Tensor) or chosen.dim() != 2:
        if isinstance(output, (Mapping, tuple, list)) and chosen is None:
            shown = ", ".join(f"{name}: {shape_text(value)}" for name, value in _entries(output))
            raise AttributionError(
                f"The model's output holds no logits [N, n_classes] ({shown}); name the entry "
                "that holds them (output= / --output), or return one [N, n_classes] tensor.")
        raise AttributionError(
            f"The model must return logits of shape [N, n_classes]; it returned "
            f"{shape_text(chosen)}. Choose the output entry that holds them (output= / "
            "--output), or wrap the model so forward() returns one [N, n_classes] tensor.")
    return chosen


def model_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter (or buffer) lives; cpu for a model without any."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if first is None else first.device


MULTI_HOT_ADVICE = (
    "multi-hot labels [N, L] (a multi-label head, one sigmoid per label), which are scored one "
    "label at a time: score label j's logit for every sample (targets=torch.full((N,), j); "
    "command line --targets j), group the samples by whether label j is on (clusters=y[:, j]; "
    "a cluster column), and measure that logit (metric='target_logit'). Accuracy and the loss "
    "assume one class per sample.")
"""What a multi-label head's multi-hot labels mean here, said wherever they are refused."""


def is_multi_hot(values) -> bool:
    """Are `values` a 2-D array of 0s and 1s (multi-hot labels [N, L])?"""
    if not isinstance(values, (torch.Tensor, np.ndarray)) or values.ndim != 2 \
            or values.shape[1] < 2 or values.shape[0] == 0:
        return False  # checked before any copy: targets of every batch come through here
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values
    return array.dtype.kind in "biuf" and bool(np.isin(array, (0, 1)).all())
