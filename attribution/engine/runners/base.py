"""The base of every runner: a model in two parts around one layer.

Every method and the pruning code go through a `LayerRunner`:
- `capture(x)` runs the model once without grad and returns (z, state, logits);
- `tail(z_variants, state, repeats)` maps `repeats` stacked variants of z to logits, so many
  masks, integration steps or ablated neurons share one pass;
- `forward_with_leaf(x)` runs once with z an autograd leaf, for gradients w.r.t. z, whatever
  the caller's grad mode; a model autograd cannot differentiate faithfully (weights made under
  inference_mode, backward hooks) is refused there and in a tail of z that requires grad.

z always has the layer's neurons at dim 1 (a Linear on a sequence [B, T, F] has them last:
its z is [B, F, T]); the runner moves them back for the tail.
"""
from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch
from torch import nn

from ...errors import AttributionError
from ..model_io import NamedInputs, repeat


def repeat_batch(value: Any, batch: int, repeats: int) -> Any:
    """Stack `repeats` copies of per-sample tensors or named inputs along dim 0 (always a
    copy); other values (not tensors, or without a batch dim) are returned as they are."""
    if ((isinstance(value, NamedInputs) or isinstance(value, torch.Tensor) and value.dim() > 0)
            and value.shape[0] == batch):
        return repeat(value, repeats)
    if isinstance(value, (tuple, list)):
        return type(value)(repeat_batch(v, batch, repeats) for v in value)
    return value


def _global_hooks(*names: str) -> bool:
    """Are hooks registered for every module (`torch.nn.modules.module.register_module_*`)?"""
    return any(getattr(torch.nn.modules.module, name, None) for name in names)


def runs_own_hooks(model: nn.Module) -> bool:
    """Does calling `model` itself run forward (pre-)hooks, its own or global ones? The fx
    split calls its graphs directly and would skip them, so such a model runs on hooks."""
    return (bool(model._forward_hooks or model._forward_pre_hooks)
            or _global_hooks("_global_forward_hooks", "_global_forward_pre_hooks"))


def check_differentiable(model: nn.Module) -> None:
    """Raise AttributionError where autograd cannot give the model's own dF/dz: parameters
    or buffers made under torch.inference_mode(), or backward hooks, which may change
    gradients (forward hooks are part of the model's function and are kept).

    Runs once per computation (`LayerRunner.check_differentiable_once`): one walk over the
    modules, and names are gathered only for a message."""
    if not _may_be_refused(model):
        return
    made_in_inference = [name for name, tensor in [*model.named_parameters(),
                                                   *model.named_buffers()]
                         if tensor.is_inference()]
    if made_in_inference:
        raise AttributionError(
            f"The model's tensors {_listed(made_in_inference)} were made under "
            "torch.inference_mode(); such tensors cannot enter autograd, so gradient-based "
            "scores are impossible. Build or load the model outside inference_mode "
            "(torch.no_grad() is fine), or use a method without gradients (activation, "
            "ablation).")
    hooked = [name or "the model itself" for name, module in model.named_modules()
              if module._backward_hooks or module._backward_pre_hooks]
    if _global_hooks("_global_backward_hooks", "_global_backward_pre_hooks"):
        hooked.append("every module (register_module_full_backward_hook)")
    if hooked:
        raise AttributionError(
            f"Backward hooks are registered on {_listed(hooked)}; they can change gradients, "
            "so gradient-based scores would not be the model's derivatives (nor agree with "
            "ablation); hooks left by one's own gradient code also append to its lists on "
            "every backward. Remove them first (handle.remove() on the handle the register "
            "call returned; without it, module._backward_hooks.clear()), or use activation "
            "or ablation.")


def _may_be_refused(model: nn.Module) -> bool:
    """Is there any backward hook, or parameter or buffer made under inference mode? Plain
    loops, stopping at the first: this runs on every gradient pass."""
    if _global_hooks("_global_backward_hooks", "_global_backward_pre_hooks"):
        return True
    for module in model.modules():
        if module._backward_hooks or module._backward_pre_hooks:
            return True
        for tensors in (module._parameters, module._buffers):
            for tensor in tensors.values():
                if tensor is not None and tensor.is_inference():
                    return True
    return False


def _listed(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(repr(name) for name in names[:shown]) + more


class LayerRunner(ABC):
    """Base of the runners; holds the model weakly so the runner cache never keeps it alive.

    `n_classes` and `layer_size` (elements of one sample's layer output) are set by
    `runner_for` from the rows it checks the runner on.
    """

    n_classes: int
    layer_size: int

    def __init__(self, model: nn.Module, name: str, module: nn.Module):
        self._model, self.name, self.module = weakref.ref(model), name, module
        self.axis = 1  # the layer's neuron axis; z is always handed out with neurons at dim 1
        self.axis_rule = "only axis"  # how the axis was found (`layers.AXIS_RULES`)
        self._differentiable_checked = False
        self._facts: dict = {}

    def to_neurons(self, output: torch.Tensor) -> torch.Tensor:
        return output if self.axis == 1 else output.movedim(self.axis, 1)

    def from_neurons(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.axis == 1 else z.movedim(1, self.axis)

    @property
    def model(self) -> nn.Module:
        return self._model()

    def is_current(self, module: nn.Module) -> bool:
        """Does the runner still run the model as it is now (the layer is `module`)?"""
        return self.module is module

    def renew(self) -> None:
        """Forget what was computed or checked from the model: `runner_for` calls it whenever
        it hands the runner out, so each computation sees the weights as they are (edits in
        place and through `.data`, which no version counter sees, included) and checks the
        model's hooks again (`check_differentiable_once`)."""
        self._differentiable_checked = False
        self._facts = {}

    def once(self, key: Any, read: Callable[[], Any]) -> Any:
        """`read()`, a fact of the model a computation reads on every batch (which of its
        modules have a rule, say), read at its first batch only (until `renew`)."""
        if key not in self._facts:
            self._facts[key] = read()
        return self._facts[key]

    def check_differentiable_once(self) -> None:
        """`check_differentiable(self.model)` at the first gradient pass of a computation
        (until `renew`): a walk over every module and parameter, a visible share of a small
        model's forward+backward when it ran on every batch."""
        if not self._differentiable_checked:
            check_differentiable(self.model)
            self._differentiable_checked = True

    def accepts(self, x: Any) -> bool:
        """Can the runner run inputs like `x` (a batch of any size)?"""
        return True

    @abstractmethod
    def capture(self, x: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """One no-grad pass. Returns z [B, n, ...], state for `tail`, logits [B, C]."""

    @abstractmethod
    def tail(self, z: torch.Tensor, state: Any, repeats: int) -> torch.Tensor:
        """Logits [repeats*B, C] for z [repeats*B, n, ...], variant-major (row k*B + i).

        An in-place op after the layer may change `z`: pass a tensor that is not needed after.
        """

    @abstractmethod
    def forward_with_leaf(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass with z an autograd leaf. Returns (z leaf [B, n, ...], logits [B, C])."""

    def ablate(self, z: torch.Tensor, state: Any, neurons: torch.Tensor) -> torch.Tensor:
        """Logits [K*B, C] with neuron `neurons[k]` of z [B, n, ...] zeroed in variant k
        (variant-major, as `tail`); no grad."""
        return self.tail(zeroed_variants(z, neurons, torch.zeros((), dtype=z.dtype)),
                         state, len(neurons))


def zeroed_variants(z: torch.Tensor, neurons: torch.Tensor, zero: torch.Tensor
                     ) -> torch.Tensor:
    """[K*B, n, ...]: z [B, n, ...] with neuron neurons[k] set to `zero` (a scalar, or the
    [1, n, ...] values of every neuron) in copy k."""
    variants = z.unsqueeze(0).expand(len(neurons), *z.shape).clone()  # a plain copy: fastest
    value = zero.to(z.device) if zero.dim() == 0 else zero[0, neurons].unsqueeze(1)
    variants[torch.arange(len(neurons), device=z.device), :, neurons] = value
    return variants.flatten(0, 1)


LAYER_KEYS = ("layer", "neuron_axis", "axis_rule")
"""The keys of `layer_attrs`."""


def layer_attrs(runner: LayerRunner) -> dict[str, object]:
    """What a result records about the layer it was computed on (a DataFrame's `attrs`, a
    JSON output): {"layer": dotted name, "neuron_axis": the output dim holding the neurons
    (batch = dim 0), "axis_rule": how that dim was found (`layers.AXIS_RULES`)}."""
    return dict(zip(LAYER_KEYS, (runner.name, int(runner.axis), runner.axis_rule)))
