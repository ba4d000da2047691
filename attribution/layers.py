"""Which modules of a model have neurons, and turning a user's layer choice into a module."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import AttributionError
from .guards import eval_mode, forward_hooks


@dataclass(frozen=True)
class LayerInfo:
    """A module whose output has a neuron axis at dim 1.

    Attributes:
        name: dotted name as in `model.named_modules()`.
        kind: the module's class name (e.g. "Linear", "Conv2d", "ReLU").
        n_neurons: size of output dim 1 (units of a Linear, channels of a Conv).
        shape: output shape of one sample, without the batch dim, e.g. (32,) or (16, 8, 8).
    """

    name: str
    kind: str
    n_neurons: int
    shape: tuple[int, ...]


def run_model(model: nn.Module, inputs: torch.Tensor):
    """Call `model(inputs)`, turning the model's own error into an AttributionError."""
    try:
        return model(inputs)
    except AttributionError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:
        shape = list(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise AttributionError(
            f"The model could not run on inputs of shape {shape} "
            f"(dtype {getattr(inputs, 'dtype', '?')}): {error}. "
            "Check the feature count / image shape the model expects."
        ) from error


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


def list_layers(model: nn.Module, example_input: torch.Tensor) -> list[LayerInfo]:
    """Every module whose output is a tensor with a neuron axis at dim 1, in call order.

    Found by one forward pass of `example_input` ([B, ...], B >= 1). Skipped: the model
    itself (its output is the logits), modules that return their input unchanged (Identity,
    Dropout in eval), containers whose output is a child's output, and modules called more
    than once per forward (shared modules cannot be scored unambiguously). An in-place
    module (ReLU(inplace=True)) after a listed layer is listed: it changed the values.
    """
    seen: dict[str, LayerInfo] = {}
    calls: dict[str, int] = {}
    # id -> (tensor, its version when seen); holding the tensor keeps its id from being reused
    produced: dict[int, tuple[torch.Tensor, int]] = {}
    names = {module: name for name, module in model.named_modules() if name}

    def record(name):
        def hook(module, args, output):
            calls[name] = calls.get(name, 0) + 1
            if not isinstance(output, torch.Tensor) or output.dim() < 2:
                return None
            earlier = produced.get(id(output))
            if earlier is not None and earlier[1] == output._version:
                return None  # a child's output (or an earlier module's) passed on as it is
            if earlier is None and args and output is args[0]:
                return None  # the input passed on: Identity, Dropout in eval
            produced[id(output)] = (output, output._version)  # an in-place op bumps _version
            seen[name] = LayerInfo(name, module_kind(name, module), int(output.shape[1]),
                                   tuple(int(s) for s in output.shape[1:]))
            return None
        return hook

    with eval_mode(model), torch.no_grad(), forward_hooks(
        {module: record(name) for module, name in names.items()}
    ):
        run_model(model, example_input)
    # Children finish before their containers, so `produced` already holds a child's output
    # when the container's hook sees the same tensor. Call order is hook order.
    return [info for name, info in seen.items() if calls.get(name) == 1]


def resolve_layer(model: nn.Module, layer: str | nn.Module) -> tuple[str, nn.Module]:
    """(dotted name, module) for a layer given by name or by module object."""
    modules = dict(model.named_modules())
    if isinstance(layer, nn.Module):
        for name, module in modules.items():
            if module is layer and name:
                return name, module
        raise AttributionError("That module is not part of this model; pass one of its "
                               "submodules or its dotted name.")
    if not isinstance(layer, str) or layer not in modules or layer == "":
        valid = ", ".join(name for name in modules if name) or "(none)"
        raise AttributionError(f"Unknown layer {layer!r}. Valid layer names: {valid}.")
    return layer, modules[layer]
