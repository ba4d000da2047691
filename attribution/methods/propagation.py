"""Methods that change how the gradient passes back through the model's modules, as Captum's
layer methods do: DeepLift's rules (`deeplift`) and LRP's (`lrp`).

The model runs once (DeepLift: on the batch and its baseline, stacked: one baseline row
shared by every sample where the rules allow it, `_stacked_forward`); each module after
the layer whose kind has a rule (`layers.module_kind`, so a .pt2's unflattened modules have
theirs too) hands its rule to autograd in place of its own gradient, through hooks removed in
`finally`. A functional call such as `F.relu` is no module and keeps its plain gradient, as
in Captum.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn
from torch.nn import functional

from ..engine import model_io
from ..engine.guards import engine_modes, forward_hooks, leaf_like
from ..engine.layers import module_kind, output_tensor, run_logits, with_output_tensor
from ..errors import AttributionError
from .registry import Batch, register, uncovered_modules
from .shared import (batch_mask, classes_first, neuron_dim, reduce_spatial, resolve_targets,
                     selected_logits, target_gradients, with_class_axis)
from . import shared

EPSILON = 1e-10
"""Below this change of a module's input (input - baseline) its plain gradient is used."""
RESCALE = ("ReLU", "ELU", "LeakyReLU", "Sigmoid", "Tanh", "Softplus")
"""Kinds whose multiplier is (output change) / (input change): DeepLift's rescale rule."""
MAX_POOLS = {"MaxPool1d": (functional.max_pool1d, functional.max_unpool1d),
             "MaxPool2d": (functional.max_pool2d, functional.max_unpool2d),
             "MaxPool3d": (functional.max_pool3d, functional.max_unpool3d)}
SOFTMAX = ("Softmax",)
RULE_KINDS = RESCALE + tuple(MAX_POOLS) + SOFTMAX
BASELINE_GRADIENT_KINDS = tuple(MAX_POOLS) + SOFTMAX
"""Kinds whose rule reads the baseline's own gradients (Captum's max-pool and softmax rules)."""


class _Rule:
    """One call of a module with a DeepLift rule: its input u and output y [B + B', ...]
    (the inputs' B rows, then the baseline's: B' = B, or 1 where every sample shares it),
    y's graph leading back to u (the module ran on a copy of u, which an in-place module
    may change), from which plain gradients are taken."""

    def __init__(self, kind: str, module: nn.Module, u: torch.Tensor, y: torch.Tensor,
                 rows: int):
        self.kind, self.module, self.u, self.y, self.rows = kind, module, u, y, rows

    def plain(self, grad: torch.Tensor) -> torch.Tensor:
        """The module's own vector-Jacobian product at its input (in `grad`'s dtype)."""
        return torch.autograd.grad(self.y, self.u, grad.to(self.y.dtype),
                                   retain_graph=True)[0].to(grad.dtype)

    def input_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """Captum's rule for the gradient at the module's input, given `grad` at its output
        (computed in float32 at least: in half precision EPSILON is 0 and 0 / 0 is NaN)."""
        dtype = grad.dtype
        return self._rule(grad.to(_at_least_float32(dtype))).to(dtype)

    def _rule(self, grad: torch.Tensor) -> torch.Tensor:
        """The rescale rule on the inputs' rows against a shared baseline row (whose own
        gradient nothing reads); Captum's rules on a stacked baseline."""
        u, y = self.u.detach().to(grad.dtype), self.y.detach().to(grad.dtype)
        rows = self.rows
        if u.shape[0] == 2 * rows:
            return self._stacked_rule(grad, u, y)
        delta_in = u[:rows] - u[rows:]
        rescaled = grad[:rows] * (y[:rows] - y[rows:]) / delta_in
        small = delta_in.abs() < EPSILON
        if not shared.syncs_are_free(u.device) or bool(small.any()):
            rescaled = torch.where(small, self.plain(grad)[:rows], rescaled)
        # the baseline's rows: only the inputs' rows of z are read
        return torch.cat([rescaled, grad[rows:]])

    def _stacked_rule(self, grad: torch.Tensor, u: torch.Tensor, y: torch.Tensor
                      ) -> torch.Tensor:
        """Captum's rules on a baseline of B rows of its own, whose gradients the max-pool
        and softmax rules read."""
        u_in, u_base = u.chunk(2)
        y_in, y_base = y.chunk(2)
        delta_in = torch.cat([u_in - u_base] * 2)
        small = delta_in.abs() < EPSILON
        if self.kind in MAX_POOLS:
            top = torch.max(y_in, y_base)
            delta_out = torch.cat([top - y_base, y_in - top])
            spread = self._unpooled(grad * delta_out)
            spread = torch.cat([spread[:len(u_in)] + spread[len(u_in):]] * 2)
            return torch.where(small, self.plain(grad), spread / delta_in)
        delta_out = torch.cat([y_in - y_base] * 2)
        rescaled = torch.where(small, self.plain(grad), grad * delta_out / delta_in)
        if self.kind in SOFTMAX:
            return rescaled - rescaled.sum() / rescaled.numel()
        return rescaled

    def _unpooled(self, values: torch.Tensor) -> torch.Tensor:
        """`values` [2B, ...] at the pool's output moved to the input positions its windows
        took their maxima from (Captum's max_unpool: where windows overlap and share a
        maximum, one of them wins); the module's own gradient (which adds them) where its
        window cannot be read."""
        window = _pool_window(self.module)
        if window is None:
            return self.plain(values)
        pool, unpool = MAX_POOLS[self.kind]
        u = self.u.detach().to(values.dtype)
        _, indices = pool(u, *window, return_indices=True)
        return unpool(values, indices, *window[:3], output_size=list(u.shape))


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _pool_window(module: nn.Module) -> Optional[tuple]:
    """(kernel_size, stride, padding, dilation, ceil_mode) of a max-pool module: its own
    attributes, or the arguments of the max_pool op in a .pt2's unflattened module."""
    names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    if all(hasattr(module, name) for name in names):
        return tuple(getattr(module, name) for name in names)
    graph = getattr(module, "graph", None)
    calls = [node for node in getattr(graph, "nodes", ())
             if node.op == "call_function" and "max_pool" in str(node.target)]
    if len(calls) != 1:
        return None
    kernel, stride, padding, dilation, ceil_mode = (list(calls[0].args[1:]) + [None] * 5)[:5]
    return (kernel, stride or kernel, 0 if padding is None else padding,
            1 if dilation is None else dilation, bool(ceil_mode))


class _WithRule(torch.autograd.Function):
    """The module's output value, whose backward is its `_Rule` (not the module's gradient)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, rule: _Rule) -> torch.Tensor:
        ctx.rule = rule
        return rule.y.detach().clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with torch.enable_grad():
            return ctx.rule.input_gradient(grad), None


Enter = Callable[[nn.Module, str, torch.Tensor], Optional[torch.Tensor]]
Leave = Callable[[nn.Module, str, torch.Tensor, torch.Tensor], torch.Tensor]


def _forward_with_rules(batch: Batch, inputs, kinds: dict[nn.Module, str], enter: Enter,
                        leave: Leave, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of `inputs` with the layer's output an autograd leaf and each module of
    `kinds` (module -> its kind) that runs after the layer handing autograd its rule:
    `enter(module, kind, u)` gives the input the module runs on instead of its input u
    (None: the module is left alone), `leave(module, kind, u, y)` the output that goes on
    instead of y. A module entered twice is refused. Returns (z leaf [R, n, ...], logits)."""
    runner = batch.runner
    model, layer = runner.model, runner.module
    captured: dict[str, torch.Tensor] = {}
    pending: dict[nn.Module, torch.Tensor] = {}
    entered: set[nn.Module] = set()

    def to_leaf(module, args, output):
        if "z" in captured:
            raise AttributionError(f"Layer {runner.name!r} runs more than once per forward "
                                   "pass (a shared module); score a module that runs once.")
        torch.set_grad_enabled(True)  # the part before the layer ran without a graph
        captured["z"] = leaf_like(runner.to_neurons(output_tensor(output)))
        return with_output_tensor(output, runner.from_neurons(captured["z"].clone()))

    def before(module, args):
        u = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if u is None or not u.requires_grad:  # before the layer: no gradient passes here
            return None
        if module in entered:
            raise AttributionError(
                f"{method}: module {_name_of(model, module)!r} ({kinds[module]}) runs more "
                f"than once after layer {runner.name!r}. Its rule (as Captum applies it) holds one "
                "input and output per module: give each use its own module (e.g. one "
                "nn.ReLU per activation).")
        replaced = enter(module, kinds[module], u)
        if replaced is None:
            return None
        entered.add(module)
        pending[module] = u
        return (replaced, *args[1:])

    def after(module, args, output):
        if module not in pending:
            return None
        return leave(module, kinds[module], pending.pop(module), output)

    ruled = [module for module in kinds if module is not layer]
    hooks = {module: after for module in ruled}
    hooks[layer] = to_leaf
    with forward_hooks(hooks, {module: before for module in ruled}), engine_modes(), \
            torch.no_grad():
        logits = run_logits(model, inputs)
    if "z" not in captured:
        raise AttributionError(f"Layer {runner.name!r} did not run in the forward pass; pick "
                               "a layer from list_layers().")
    return captured["z"], logits


def _name_of(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, each in model.named_modules() if each is module)


def _kinds_of(batch: Batch, kinds: Sequence[str]) -> dict[nn.Module, str]:
    """The model's modules whose kind (`layers.module_kind`) is one of `kinds`, found at
    the computation's first batch."""
    def read() -> dict[nn.Module, str]:
        found = ((module, module_kind(name, module))
                 for name, module in batch.runner.model.named_modules())
        return {module: kind for module, kind in found if kind in kinds}

    return batch.runner.once(("module kinds", tuple(kinds)), read)


def _stacked_forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepLift's forward: the inputs and the zero baseline stacked ([B + B']), every module
    after the layer with a rule (`RULE_KINDS`) running it. The baseline runs once (B' = 1)
    where it is the same for every sample (every input is scaled to zero: no integer input,
    no attention mask) and no rule reads the baseline's own gradients (max-pool, softmax);
    else on a copy per sample (B' = B), as Captum runs it. Returns (z leaf [B + B', n, ...],
    logits [B + B', C])."""
    kinds = _kinds_of(batch, RULE_KINDS)
    rows = model_io.n_rows(batch.x)
    shared = (not set(kinds.values()) & set(BASELINE_GRADIENT_KINDS)
              and model_io.all_scaled(batch.x))
    from_rows = model_io.take(batch.x, slice(0, 1)) if shared else batch.x
    baseline = model_io.interpolate(from_rows, torch.zeros(1, device=model_io.device_of(batch.x)))
    inputs = model_io.cat([batch.x, baseline])
    ruled_outputs: list[torch.Tensor] = []  # what ruled modules returned, in order

    def enter(module, kind, u):
        if any(u is output for output in ruled_outputs):
            return None  # Captum's hooks: see `deeplift`
        return u.clone()  # an in-place module changes the copy, not u

    def leave(module, kind, u, y):
        ruled_outputs.append(_WithRule.apply(u, _Rule(kind, module, u, y, rows)))
        return ruled_outputs[-1]

    return _forward_with_rules(batch, inputs, kinds, enter, leave, "deeplift")



@register("deeplift", "DeepLift (rescale rule) with a zero input baseline, as Captum's "
          "LayerDeepLift", label="DeepLift", units="logits", colour="#E69F00",
          needs_float_inputs=True, uses_gradients=True, logit_effect="score")
def deeplift(batch: Batch) -> torch.Tensor:
    """(z - z at the zero input) * the target logit's multipliers, summed over positions.

    Rules as Captum's: the rescale rule for ReLU, ELU, LeakyReLU, Sigmoid, Tanh and
    Softplus modules, its max-pool rule (the maxima of input and baseline windows, moved back
    by max_unpool) and its softmax rule (the rescaled gradient minus its mean). Captum hooks a
    module's rule onto its input tensor, so where a ruled module's input is another ruled
    module's output (conv -> ReLU -> MaxPool) the upstream rule reads the downstream
    module's plain gradient: the same is done here, so the two agree. A ruled module that
    runs twice after the layer (a shared ReLU) is refused, as Captum fails on it.
    """
    batch.runner.check_differentiable_once()
    z, logits = _stacked_forward(batch)
    rows = model_io.n_rows(batch.x)
    targets = resolve_targets(batch.targets, logits[:rows])
    if z.shape[0] == 2 * rows:  # the baseline's own targets: its rules read its gradients
        grad = target_gradients(batch, logits, z, targets, repeats=2)  # [(C,) 2B, n, ...]
    else:  # a shared baseline row, whose gradient nothing reads: any target
        grad = target_gradients(batch, logits, z, targets if isinstance(targets, str)
                          else torch.cat([targets, targets[:1]]))  # [(C,) B + 1, n, ...]
    grad = grad[:, :rows] if isinstance(targets, str) else grad[:rows]
    change = (z[:rows] - z[rows:]).detach()  # the layer's output minus its baseline's
    return reduce_spatial(with_class_axis(change, targets) * classes_first(grad, targets),
                           neuron_dim(targets), "sum", batch_mask(batch))



EPSILON_KINDS = ("Linear", "Conv2d", "BatchNorm2d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
                 "AvgPool2d", "AdaptiveAvgPool2d", "Addition_Module")
"""Kinds Captum's LRP gives its epsilon rule by default: the relevance R at the module's
output becomes x * J^T (R / (y + eps * sign(y))) at its input x."""
PASSED_KINDS = ("ReLU", "Dropout", "Tanh")
"""Kinds Captum's LRP passes the relevance through unchanged."""
LRP_EPSILON = 1e-9


class _TimesInput(torch.autograd.Function):
    """The input as it is; backward multiplies the relevance by it (the epsilon rule's x)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor) -> torch.Tensor:
        ctx.u = u.detach()
        return u.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * ctx.u


class _OverOutput(torch.autograd.Function):
    """The output as it is; backward divides the relevance by y + eps * sign(y) (sign 0 = 1)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        ctx.y = y.detach()
        return y.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        sign = torch.where(ctx.y == 0, torch.ones_like(ctx.y), torch.sign(ctx.y))
        return grad / (ctx.y + sign * LRP_EPSILON)


class _PassedThrough(torch.autograd.Function):
    """The module's output value; backward hands the relevance to its input unchanged."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y.detach().clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _relevance_forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """LRP's forward: every module after the layer with its rule (`EPSILON_KINDS`,
    `PASSED_KINDS`); a model with a leaf module of another kind is refused, as Captum's
    LayerLRP refuses it. Returns (z leaf [B, n, ...], logits [B, C])."""
    model = batch.runner.model
    uncovered = batch.runner.once("lrp's uncovered modules",
                                  lambda: uncovered_modules(model, "lrp"))
    if uncovered:
        shown = ", ".join(f"{name!r} ({kind})" for name, kind in list(uncovered.items())[:4])
        more = f" and {len(uncovered) - 4} more" if len(uncovered) > 4 else ""
        raise AttributionError(
            f"lrp: Captum's LRP has no default rule for module {shown}{more} of this model "
            f"(epsilon rule: {', '.join(EPSILON_KINDS[:-1])}; passed through: "
            f"{', '.join(PASSED_KINDS)}), so it refuses the model. Use deeplift or "
            "gradient_x_activation.")

    def enter(module, kind, u):
        if kind in EPSILON_KINDS:
            return _TimesInput.apply(u)
        return u.clone()  # passed through; an in-place module changes the copy, not u

    def leave(module, kind, u, y):
        if kind in EPSILON_KINDS:
            return _OverOutput.apply(y)
        return _PassedThrough.apply(u, y)

    return _forward_with_rules(batch, batch.x, _kinds_of(batch, EPSILON_KINDS + PASSED_KINDS),
                               enter, leave, "lrp")


@register("lrp", "Layer-wise relevance propagation with Captum's default rules (epsilon "
          "rule, ReLU passed through), as Captum's LayerLRP", label="LRP (ε)",
          units="logits (relevance)", colour="#56B4E9", uses_gradients=True,
          logit_effect="score", module_kinds=EPSILON_KINDS + PASSED_KINDS)
def lrp(batch: Batch) -> torch.Tensor:
    """The relevance of the target logit F at the layer's output, summed over positions:
    F(x) * the gradient of F at z when each module after the layer runs Captum's default
    LRP rule in backward (`EPSILON_KINDS`: epsilon 1e-9; `PASSED_KINDS`: unchanged).

    Captum's LayerLRP reads it at a module with an epsilon rule; at any other layer (a ReLU)
    this is the relevance its output hands on, Captum's LayerLRP of the module it feeds
    with attribute_to_layer_input=True."""
    batch.runner.check_differentiable_once()
    z, logits = _relevance_forward(batch)
    targets = resolve_targets(batch.targets, logits)
    grad = classes_first(target_gradients(batch, logits, z, targets), targets)
    selected = selected_logits(logits, targets).detach()  # [B] or [B, C]
    scale = selected.view(selected.shape + (1,) * (grad.dim() - selected.dim()))
    return reduce_spatial(grad * scale, neuron_dim(targets), "sum", batch_mask(batch))
