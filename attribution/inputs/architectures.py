"""A small, code-free description of common classifiers, for loading state dicts without Python.

Two kinds cover most small models (JSON or YAML; sizes exclude the batch dimension):

    {"kind": "mlp", "input_shape": [64], "hidden": [32, 16], "n_classes": 10,
     "activation": "relu"}
    {"kind": "cnn", "input_shape": [1, 8, 8], "channels": [8, 16], "kernel_size": 3,
     "pool": 2, "hidden": [32], "n_classes": 10}

An MLP is [Flatten if the input has several dims], then (Linear, activation) per hidden size,
then Linear(n_classes). A CNN is (Conv2d, activation, MaxPool2d(pool) unless pool is 1) per
channel count, Flatten, then the MLP part. Modules are named like `nn.Sequential` ("0", "1",
...), so `nn.Sequential` state dicts load as they are; `"names"` (one per module, in order)
matches other key names, e.g. ["fc1", "relu1", "fc2", "relu2", "out"]. Optional keys:
"class_names", "padding" (default kernel_size // 2), "pool" (default 2; 1 or null for none),
"kernel_size" (default 3), "activation" (default "relu").
"""
from __future__ import annotations

import json
import reprlib
from collections import OrderedDict
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
import yaml
from torch import nn

from ..errors import AttributionError
from .untrusted.limits import DEFAULT_LIMITS, Limits, over_budget

KINDS = ("mlp", "cnn")
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "gelu": nn.GELU, "silu": nn.SiLU,
    "elu": nn.ELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
}
_KEYS = {  # in the order `to_dict` writes them
    "mlp": ("kind", "input_shape", "hidden", "n_classes", "activation", "names", "class_names"),
    "cnn": ("kind", "input_shape", "channels", "kernel_size", "padding", "pool", "hidden",
            "n_classes", "activation", "names", "class_names"),
}
_MAX_WIDTH = 1 << 16          # units or channels of one layer
_MAX_INPUT_VALUES = 1 << 24   # values in one sample
_MAX_TEXT_BYTES = 1 << 16     # a description file
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHORT = reprlib.Repr()  # bounded reprs of user values, even for YAML alias bombs
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 2, 4, 4, 40

Description = Union[dict, str, bytes, os.PathLike]


@dataclass(frozen=True)
class Architecture:
    """A validated description; `build()` makes the module, `to_dict()` the description."""

    kind: str
    input_shape: tuple[int, ...]
    n_classes: int
    hidden: tuple[int, ...] = ()
    channels: tuple[int, ...] = ()
    kernel_size: int = 3
    padding: Optional[int] = None
    pool: int = 2
    activation: str = "relu"
    names: Optional[tuple[str, ...]] = None
    class_names: Optional[tuple[str, ...]] = None

    def module_kinds(self) -> list[str]:
        """Class names of the modules in order, e.g. ["Linear", "ReLU", "Linear"]."""
        return [kind.__name__ for kind, _ in self._plan()]

    def n_parameters(self) -> int:
        """Number of weights and biases of the built module (computed, nothing is built)."""
        total = 0
        for kind, args in self._plan():
            if kind is nn.Linear:
                total += (args[0] + 1) * args[1]
            elif kind is nn.Conv2d:
                total += (args[0] * args[2] ** 2 + 1) * args[1]
        return total

    def build(self, device: Union[str, torch.device, None] = None) -> nn.Sequential:
        """The module, with freshly initialised weights (on `device`; "meta" allocates none)."""
        with torch.device(torch.device(device or "cpu")):
            modules = [kind(*args) for kind, args in self._plan()]
        names = self.names or tuple(str(i) for i in range(len(modules)))
        return nn.Sequential(OrderedDict(zip(names, modules)))

    def to_dict(self) -> dict[str, Any]:
        """The description as plain JSON-able data (round-trips through `parse_architecture`)."""
        out: dict[str, Any] = {}
        for key in _KEYS[self.kind]:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def _plan(self) -> list[tuple[Callable[..., nn.Module], tuple]]:
        """The modules in order as (class, constructor arguments); nothing is built."""
        activation = ACTIVATIONS[self.activation]
        plan: list[tuple[Callable[..., nn.Module], tuple]] = []
        if self.kind == "cnn":
            in_channels, height, width = self.input_shape
            padding = self.kernel_size // 2 if self.padding is None else self.padding
            for channels in self.channels:
                plan += [(nn.Conv2d, (in_channels, channels, self.kernel_size, 1, padding)),
                         (activation, ())]
                height = (height + 2 * padding - self.kernel_size + 1) // self.pool
                width = (width + 2 * padding - self.kernel_size + 1) // self.pool
                if height < 1 or width < 1:
                    raise AttributionError(
                        f"The convolutions shrink the {list(self.input_shape[1:])} input to "
                        "nothing; use less pooling, more padding or a smaller kernel_size.")
                if self.pool > 1:
                    plan.append((nn.MaxPool2d, (self.pool,)))
                in_channels = channels
            features = in_channels * height * width
        else:
            features = 1
            for size in self.input_shape:
                features *= size
        if self.kind == "cnn" or len(self.input_shape) > 1:
            plan.append((nn.Flatten, ()))
        for units in self.hidden:
            plan += [(nn.Linear, (features, units)), (activation, ())]
            features = units
        plan.append((nn.Linear, (features, self.n_classes)))
        return plan


def parse_architecture(source: Description, limits: Optional[Limits] = None) -> Architecture:
    """Read and validate a description given as a dict, JSON/YAML text or bytes, or a path;
    its layer and parameter counts within `limits` (default `DEFAULT_LIMITS`)."""
    limits = limits or DEFAULT_LIMITS
    if isinstance(source, Architecture):
        return _within(source, limits)
    if isinstance(source, dict):
        return _from_dict(source, limits)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _from_dict(_parse_text(bytes(source)), limits)
    if isinstance(source, str) and (source.lstrip().startswith("{") or "\n" in source):
        return _from_dict(_parse_text(source.encode()), limits)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise AttributionError(f"Architecture file not found: {path}.")
        if path.stat().st_size > _MAX_TEXT_BYTES:
            raise AttributionError(f"{path.name} is too large for an architecture description.")
        return _from_dict(_parse_text(path.read_bytes()), limits)
    raise AttributionError(f"An architecture must be a dict, JSON/YAML text or a path; got "
                           f"{type(source).__name__}.")


def is_description(data: bytes) -> bool:
    """True when `data` parses as JSON/YAML holding a mapping with a "kind" key."""
    try:
        parsed = _parse_text(data)
    except AttributionError:
        return False
    return "kind" in parsed


def _parse_text(data: bytes) -> dict:
    if len(data) > _MAX_TEXT_BYTES:
        raise AttributionError("The architecture description is too large (over 64 KB).")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise AttributionError("The architecture description is not UTF-8 text.") from None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        try:
            parsed = yaml.load(text, Loader=_NoAliasLoader)
        except AttributionError:
            raise
        except (yaml.YAMLError, RecursionError, ValueError) as error:
            raise AttributionError(f"The architecture description is neither valid JSON nor "
                                   f"valid YAML: {error}.") from None
    if not isinstance(parsed, dict):
        raise AttributionError('An architecture description is a mapping such as {"kind": '
                               '"mlp", "input_shape": [64], "hidden": [32], "n_classes": 10}.')
    return parsed


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.safe_load without anchors and aliases, which no description needs and which
    let a few bytes stand for a structure of billions of nodes ("billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise AttributionError("The architecture description uses YAML aliases (*name); "
                                   "write every value out instead.")
        return super().compose_node(parent, index)


def _within(architecture: Architecture, limits: Limits) -> Architecture:
    """`architecture` when its layer and parameter counts are within `limits`."""
    layers = len(architecture.hidden) + len(architecture.channels)
    if layers > limits.max_layers:
        raise AttributionError(over_budget("The architecture has", f"{layers} layers",
                                           f"{limits.max_layers}", "max_layers"))
    parameters = architecture.n_parameters()
    if parameters > limits.max_parameters:
        raise AttributionError(over_budget("The architecture has", f"{parameters:,} parameters",
                                           f"{limits.max_parameters:,}", "max_parameters"))
    return architecture


def _from_dict(raw: dict, limits: Limits) -> Architecture:
    kind = raw.get("kind")
    if kind not in KINDS:
        raise AttributionError(f'"kind" must be one of {", ".join(KINDS)}; got '
                               f"{_SHORT.repr(kind)}.")
    unknown = sorted(str(key) for key in raw if key not in _KEYS[kind])
    if unknown:
        raise AttributionError(f"Unknown keys in the {kind} description: {', '.join(unknown)}. "
                               f"Allowed: {', '.join(_KEYS[kind])}.")
    for key in ("input_shape", "n_classes") + (("channels",) if kind == "cnn" else ()):
        if key not in raw:
            raise AttributionError(f'The {kind} description needs "{key}".')
    input_shape = _sizes(raw["input_shape"], "input_shape", _MAX_INPUT_VALUES)
    values = 1
    for size in input_shape:
        values *= size
    if not input_shape or values > _MAX_INPUT_VALUES:
        raise AttributionError(f"input_shape {list(input_shape)} must be non-empty with at "
                               f"most {_MAX_INPUT_VALUES} values.")
    if kind == "cnn" and len(input_shape) != 3:
        raise AttributionError("A cnn's input_shape is [channels, height, width], e.g. [1, 8, 8].")
    activation = raw.get("activation", "relu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise AttributionError(f"Unknown activation {_SHORT.repr(activation)}; use one of "
                               f"{', '.join(ACTIVATIONS)}.")
    n_classes = _sizes([raw["n_classes"]], "n_classes", _MAX_WIDTH)[0]
    if n_classes < 2:
        raise AttributionError("n_classes must be at least 2.")
    hidden = _sizes(raw.get("hidden", []), "hidden", _MAX_WIDTH)
    channels = _sizes(raw.get("channels", []), "channels", _MAX_WIDTH)
    if len(hidden) + len(channels) > limits.max_layers:  # before any per-layer work
        raise AttributionError(over_budget("The architecture has",
                                           f"{len(hidden) + len(channels)} layers",
                                           f"{limits.max_layers}", "max_layers"))
    architecture = Architecture(
        kind=kind, input_shape=input_shape, n_classes=n_classes,
        hidden=hidden, channels=channels,
        kernel_size=_sizes([raw.get("kernel_size", 3)], "kernel_size", 64)[0],
        padding=None if raw.get("padding") is None
        else _sizes([raw["padding"]], "padding", 64, minimum=0)[0],
        pool=_sizes([raw.get("pool", 2) or 1], "pool", 64)[0],
        activation=activation,
        names=_names(raw.get("names")),
        class_names=_class_names(raw.get("class_names"), n_classes),
    )
    kinds = architecture.module_kinds()  # surfaces shape errors (e.g. too much pooling) now
    if architecture.names is not None and len(architecture.names) != len(kinds):
        raise AttributionError(
            f'"names" has {len(architecture.names)} entries but the {kind} has '
            f"{len(kinds)} modules ({', '.join(kinds[:12])}{', ...' if len(kinds) > 12 else ''}); "
            "give one name per module.")
    return _within(architecture, limits)


def _sizes(value: Any, key: str, maximum: int, minimum: int = 1) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise AttributionError(f'"{key}" must be a list of integers; got '
                               f"{_SHORT.repr(value)}.")
    sizes = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not minimum <= item <= maximum:
            raise AttributionError(f'"{key}" must hold integers from {minimum} to {maximum}; '
                                   f"got {_SHORT.repr(item)}.")
        sizes.append(item)
    return tuple(sizes)


def _names(value: Any) -> Optional[tuple[str, ...]]:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple))
            or not all(isinstance(n, str) and _MODULE_NAME.match(n) for n in value)):
        raise AttributionError('"names" must be a list of identifiers such as "fc1" (letters, '
                               "digits and _, no dots).")
    if len(set(value)) != len(value):
        raise AttributionError('"names" must not repeat a name.')
    return tuple(value)


def _class_names(value: Any, n_classes: int) -> Optional[tuple[str, ...]]:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != n_classes
            or not all(isinstance(name, (str, int)) for name in value)):
        raise AttributionError(f'"class_names" must be a list of {n_classes} names.')
    return tuple(str(name) for name in value)
