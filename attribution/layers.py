"""Which modules of a model have neurons, and turning a user's layer choice into a module."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import AttributionError
from .guards import eval_mode, forward_hooks
from .model_io import call, describe, is_batch, is_floating, logits_of, output_key


# Modules that act on the last dim: on a sequence [B, T, F] their units are the F features.
_LAST_AXIS_KINDS = ("Linear", "Bilinear", "LayerNorm", "RMSNorm", "Embedding")


@dataclass(frozen=True)
class LayerInfo:
    """A module whose output has a neuron axis.

    Attributes:
        name: dotted name as in `model.named_modules()`.
        kind: the module's class name (e.g. "Linear", "Conv2d", "ReLU").
        n_neurons: size of the neuron axis (units of a Linear, channels of a Conv).
        shape: output shape of one sample, without the batch dim, e.g. (32,) or (16, 8, 8).
        neuron_axis: the output dim of the neurons (batch = dim 0): 1, except for a Linear,
            LayerNorm or Embedding on a sequence [B, T, F] (the last dim, F) and the
            elementwise modules after it; the other dims are positions.
    """

    name: str
    kind: str
    n_neurons: int
    shape: tuple[int, ...]
    neuron_axis: int = 1


def run_model(model: nn.Module, inputs):
    """Call the model on a batch (`model_io.call`), turning the model's own error into an
    AttributionError."""
    try:
        return call(model, inputs)
    except AttributionError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]  # not fx's dump
        hint = ("Integer inputs are ids: they must lie in the model's vocabulary (0..size-1)."
                if is_batch(inputs) and not is_floating(inputs)
                else "Check the feature count / image shape the model expects.")
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


def list_layers(model: nn.Module, example_input: torch.Tensor) -> list[LayerInfo]:
    """Every module whose output is a tensor with a neuron axis, in call order.

    Found by one forward pass of `example_input` ([B, ...], B >= 1). Skipped: the model
    itself (its output is the logits), modules that return their input unchanged (Identity,
    Dropout in eval), containers whose output is a child's output, and modules called more
    than once per forward (shared modules cannot be scored unambiguously). An in-place
    module (ReLU(inplace=True)) after a listed layer is listed: it changed the values.
    """
    seen: dict[str, LayerInfo] = {}
    calls: dict[str, int] = {}
    # id -> (tensor, its version when seen, its neuron axis); holding the tensor keeps its id
    # from being reused
    produced: dict[int, tuple[torch.Tensor, int, int]] = {}
    axis_by_shape: dict[torch.Size, int] = {}  # the latest listed output of each shape
    names = {module: name for name, module in model.named_modules() if name}

    def record(name):
        def hook(module, args, output):
            calls[name] = calls.get(name, 0) + 1
            if not isinstance(output, torch.Tensor) or output.dim() < 2:
                return None
            earlier = produced.get(id(output))
            if earlier is not None and earlier[1] == output._version:
                return None  # a child's output (or an earlier module's) passed on as it is
            first_input = args[0] if args else None
            if earlier is None and output is first_input:
                return None  # the input passed on: Identity, Dropout in eval
            kind = module_kind(name, module)
            axis = 1
            if output.dim() > 2 and kind.endswith(_LAST_AXIS_KINDS):
                axis = output.dim() - 1
            elif (output.dim() > 2 and isinstance(first_input, torch.Tensor)
                  and first_input.shape == output.shape):  # elementwise: the axis it acts on
                earlier_input = produced.get(id(first_input))
                axis = (earlier_input[2] if earlier_input is not None
                        else axis_by_shape.get(output.shape, 1))  # e.g. after a functional add
            produced[id(output)] = (output, output._version, axis)  # in-place ops bump _version
            axis_by_shape[output.shape] = axis
            seen[name] = LayerInfo(name, kind, int(output.shape[axis]),
                                   tuple(int(s) for s in output.shape[1:]), axis)
            return None
        return hook

    with eval_mode(model), torch.no_grad(), forward_hooks(
        {module: record(name) for module, name in names.items()}
    ):
        run_model(model, example_input)
    # Children finish before their containers, so `produced` already holds a child's output
    # when the container's hook sees the same tensor. Call order is hook order.
    return [info for name, info in seen.items() if calls.get(name) == 1]


def neuron_axis(model: nn.Module, name: str, example_input: torch.Tensor) -> int:
    """The neuron axis of layer `name` (see `LayerInfo.neuron_axis`); 1 if it is not listed."""
    return next((info.neuron_axis for info in list_layers(model, example_input)
                 if info.name == name), 1)


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
