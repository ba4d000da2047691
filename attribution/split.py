"""Run a model in two parts around one layer: the front (inputs -> layer output z) and the tail.

Every method and the pruning code go through a `LayerRunner`:
- `capture(x)` runs the model once without grad and returns (z, state, logits);
- `tail(z_variants, state, repeats)` maps `repeats` stacked variants of z to logits, so many
  masks, integration steps or ablated neurons share one pass;
- `forward_with_leaf(x)` runs once with z an autograd leaf, for gradients w.r.t. z, whatever
  the caller's grad mode; a model autograd cannot differentiate faithfully (weights made under
  inference_mode, backward hooks) is refused there and in a tail of z that requires grad.

z always has the layer's neurons at dim 1 (a Linear on a sequence [B, T, F] has them last:
its z is [B, F, T]); the runner moves them back for the tail.

`FxRunner` splits a traceable model with torch.fx, so the tail is all that re-runs; values
that the tail reads from the front (residual inputs, branches) are carried in `state`.
`HookRunner` works on any model by replacing the layer's output in a full forward. Forward
hooks are part of the model's function on both: a model whose own call runs hooks (which the
split would skip) runs on hooks.
"""
from __future__ import annotations

import operator
import threading
import weakref
from abc import ABC, abstractmethod
import warnings
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from .errors import AttributionError
from .guards import engine_modes, forward_hooks, leaf_like
from .layers import (neuron_axis, output_tensor, run_logits, run_model, split_axis,
                     with_output_tensor)
from .model_io import NamedInputs, call, logits_of, n_rows, output_key, repeat, take


def _repeat_batch(value: Any, batch: int, repeats: int) -> Any:
    """Stack `repeats` copies of per-sample tensors or named inputs along dim 0 (always a
    copy); other values (not tensors, or without a batch dim) are returned as they are."""
    if ((isinstance(value, NamedInputs) or isinstance(value, torch.Tensor) and value.dim() > 0)
            and value.shape[0] == batch):
        return repeat(value, repeats)
    if isinstance(value, (tuple, list)):
        return type(value)(_repeat_batch(v, batch, repeats) for v in value)
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

    Runs on every gradient pass (hooks may be added between batches): one walk over the
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

    def _to_neurons(self, output: torch.Tensor) -> torch.Tensor:
        return output if self.axis == 1 else output.movedim(self.axis, 1)

    def _from_neurons(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.axis == 1 else z.movedim(1, self.axis)

    @property
    def model(self) -> nn.Module:
        return self._model()

    def is_current(self, module: nn.Module) -> bool:
        """Does the runner still run the model as it is now (the layer is `module`)?"""
        return self.module is module

    def renew(self) -> None:
        """Forget values computed from the weights: `runner_for` calls it whenever it hands
        the runner out, so each computation sees the weights as they are (edits in place
        and through `.data`, which no version counter sees, included)."""

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
        return self.tail(_zeroed_variants(z, neurons, torch.zeros((), dtype=z.dtype)),
                         state, len(neurons))


def _zeroed_variants(z: torch.Tensor, neurons: torch.Tensor, zero: torch.Tensor
                     ) -> torch.Tensor:
    """[K*B, n, ...]: z [B, n, ...] with neuron neurons[k] set to `zero` (a scalar, or the
    [1, n, ...] values of every neuron) in copy k."""
    variants = z.unsqueeze(0).expand(len(neurons), *z.shape).clone()  # a plain copy: fastest
    value = zero.to(z.device) if zero.dim() == 0 else zero[0, neurons].unsqueeze(1)
    variants[torch.arange(len(neurons), device=z.device), :, neurons] = value
    return variants.flatten(0, 1)


class HookRunner(LayerRunner):
    """Works on any model: replaces the layer's output inside a full forward pass."""

    def _run(self, x: torch.Tensor, replace) -> torch.Tensor:
        calls = []

        def hook(module, args, output):
            calls.append(output)
            if len(calls) > 1:
                raise AttributionError(
                    f"Layer {self.name!r} runs more than once per forward pass (a shared "
                    "module); score a module that runs once, e.g. the layer feeding it."
                )
            tensor = output_tensor(output)  # a tuple's / ModelOutput's first tensor
            if tensor is None or tensor.dim() < 2:
                shown = (f"a {type(output).__name__} holding no tensor" if tensor is None
                         else f"{type(tensor).__name__}{list(tensor.shape)}")
                raise AttributionError(
                    f"Layer {self.name!r} has no neuron axis: its output is {shown}. "
                    "Pick a layer from list_layers()."
                )
            replaced = replace(tensor)
            return None if replaced is None else with_output_tensor(output, replaced)

        with forward_hooks({self.module: hook}):
            logits = run_logits(self.model, x)
        if not calls:
            raise AttributionError(f"Layer {self.name!r} did not run in the forward pass; "
                                   "pick a layer from list_layers().")
        return logits

    def capture(self, x):
        captured = {}

        def keep(output):
            captured["z"] = self._to_neurons(output.detach().clone())
            return None

        with torch.no_grad():
            logits = self._run(x, keep)
        return captured["z"], x, logits

    def tail(self, z, state, repeats):
        x = _repeat_batch(state, n_rows(state), repeats)

        def swap(output):
            moved = self._from_neurons(z)
            if output.shape != moved.shape:
                raise AttributionError(f"Internal shape mismatch at layer {self.name!r}.")
            # the model's own layout: its next op may view() it
            return moved.clone(memory_format=torch.contiguous_format) if z.requires_grad \
                else moved.contiguous()

        if z.requires_grad:
            check_differentiable(self.model)
        return self._run(x, swap)

    def forward_with_leaf(self, x):
        check_differentiable(self.model)
        captured = {}

        def to_leaf(output):
            torch.set_grad_enabled(True)  # the part before the layer ran without a graph
            captured["z"] = leaf_like(self._to_neurons(output))
            return self._from_neurons(captured["z"].clone())

        with engine_modes(), torch.no_grad():
            logits = self._run(x, to_leaf)
        return captured["z"], logits


class _LayerLeafTracer(fx.Tracer):
    """Traces through custom modules but keeps the chosen layer as one call_module node."""

    def __init__(self, layer_name: str):
        super().__init__()
        self.layer_name = layer_name

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        if qualified_name == self.layer_name:
            return True
        if self.layer_name.startswith(qualified_name + "."):
            return False
        return super().is_leaf_module(module, qualified_name)


def _graph_of(model: nn.Module, name: str, example: Any
              ) -> tuple[fx.Graph, nn.Module, fx.Node]:
    """(one fx graph of the model, the module that owns its submodules and attributes, the
    node whose value is layer `name`'s output, its `output_tensor` for a tuple output).

    An eager model is traced with fx, the layer kept as one call_module node; where its
    forward defeats fx (transformers' models), or the graph does not tell which entry of the
    layer's output is first, it is exported with torch.export first (see `_exported`). A
    GraphModule is used as it is; torch.export's unflattened modules are inlined into one
    graph (`_inlined`).
    """
    if isinstance(getattr(model, "graph", None), fx.Graph):
        if _has_nested_graphs(model):
            graph, layer_node = _inlined(model, name)
            return graph, model, layer_node
        layer_node = _first_entry(_layer_node(model.graph, name))
        if layer_node is None:
            raise ValueError("the graph does not tell which entry of the layer's output is first")
        return model.graph, model, layer_node
    try:
        graph: Optional[fx.Graph] = _LayerLeafTracer(name).trace(model)
    except Exception:  # noqa: BLE001 - fx refuses; torch.export may not
        graph = None
    layer_node = None if graph is None else _first_entry(_layer_node(graph, name))
    if graph is not None and layer_node is not None:
        return graph, model, layer_node
    owner = _exported(model, example)  # an export tells a tuple output's first entry too
    graph, layer_node = _inlined(owner, name)
    return graph, owner, layer_node


def _layer_node(graph: fx.Graph, name: str) -> fx.Node:
    layer_nodes = [n for n in graph.nodes if n.op == "call_module" and n.target == name]
    if len(layer_nodes) != 1:
        raise ValueError(f"layer appears {len(layer_nodes)} times in the graph")
    return layer_nodes[0]


def _first_entry(layer: fx.Node) -> Optional[fx.Node]:
    """The node of the layer's `output_tensor` (`_agrees` checks it on data): the layer's own
    node, or where every use of it takes an entry (a tuple or ModelOutput: `out[0]`,
    `out.last_hidden_state`), that one use, or the lowest of several positions taken
    (`a, b = layer(x)`); None where the graph does not tell (several names taken)."""
    takes = [user for user in layer.users if user.op == "call_function"
             and user.target in (operator.getitem, getattr) and len(user.args) == 2
             and isinstance(user.args[1], (int, str))]
    if not takes or len(takes) != len(layer.users):
        return layer
    keys = [user.args[1] for user in takes]
    if len(takes) == 1:
        return takes[0]
    if len(set(keys)) == len(keys) and all(isinstance(key, int) for key in keys):
        return takes[keys.index(min(keys))]
    return None


def _has_nested_graphs(model: nn.Module) -> bool:
    return any(isinstance(getattr(module, "graph", None), fx.Graph)
               for name, module in model.named_modules() if name)


def _inlined(owner: nn.Module, name: str) -> tuple[fx.Graph, fx.Node]:
    """(`owner`'s graph with the graph of every submodule it calls, torch.export's unflattened
    modules, copied in place of the call; the node of layer `name`'s output).

    Everything is inlined, the layer too: unflatten hands sizes computed in one module (the
    batch size times the heads) to the next, and the tail must see how they were computed
    to recompute them for stacked variants. The layer's output is the one tensor among the
    values its graph returns (the others are such sizes).
    """
    graph, outputs = fx.Graph(), []

    def copy(module: nn.Module, prefix: str, inputs: Optional[list]) -> Any:
        env: dict[fx.Node, Any] = {}
        arguments = iter(inputs or [])
        for node in module.graph.nodes:
            if node.op == "placeholder":
                env[node] = graph.node_copy(node) if inputs is None else next(arguments)
            elif node.op == "output":
                return fx.map_arg(node.args[0], env.__getitem__)
            else:
                path = prefix + node.target if node.op in ("call_module", "get_attr") else ""
                child = owner.get_submodule(path) if node.op == "call_module" else None
                if child is not None and isinstance(getattr(child, "graph", None), fx.Graph):
                    if node.kwargs or len(node.args) != sum(
                            n.op == "placeholder" for n in child.graph.nodes):
                        raise ValueError(f"cannot inline the call of {path}")
                    env[node] = copy(child, path + ".",
                                     list(fx.map_arg(node.args, env.__getitem__)))
                    if path == name:
                        outputs.append(env[node])
                elif (node.op == "call_function" and node.target is operator.getitem
                      and isinstance(env.get(node.args[0]), (tuple, list))):
                    env[node] = env[node.args[0]][node.args[1]]  # an inlined call's result
                else:
                    env[node] = graph.node_copy(node, env.__getitem__)
                    if path:
                        env[node].target = path
                    if node.op == "call_module" and path == name:
                        outputs.append(env[node])
        raise ValueError("graph without output")

    graph.output(copy(owner, "", None))
    if len(outputs) != 1:
        raise ValueError(f"layer appears {len(outputs)} times in the graph")
    value = outputs[0]
    if isinstance(value, (tuple, list)):  # the first tensor (`output_tensor`), among sizes
        tensors = [v for v in value if isinstance(v, fx.Node)
                   and isinstance(v.meta.get("val"), torch.Tensor)]
        if any(_reads(other, tensors[0]) for other in tensors[1:]):
            raise ValueError("the layer's other outputs are computed from its first")
        value = tensors[0] if tensors else None
    if not isinstance(value, fx.Node):
        raise ValueError("the layer returns no tensor")
    return graph, value


def _reads(node: fx.Node, source: fx.Node) -> bool:
    """Is `node` computed from `source`? (A tail recomputing `node` would see `source`
    replaced; hooks replace `source` alone.)"""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current is source:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return False


_EXPORTS: "weakref.WeakKeyDictionary[nn.Module, tuple[Any, nn.Module]]" = (
    weakref.WeakKeyDictionary())


def _signature(x: Any) -> Any:
    """What an export specializes on: each input's name, per-sample shape and dtype."""
    entries = x.items() if isinstance(x, NamedInputs) else [("", x)]
    return tuple((key, tuple(value.shape[1:]), value.dtype) for key, value in entries)


def _exported(model: nn.Module, example: Any) -> nn.Module:
    """torch.export's unflattened module of an eager model (with the model's own parameters
    and buffers, `_sharing_tensors`), with a dynamic batch dim; cached per model and input
    signature. Raises what torch.export raises (data-dependent control flow, ...)."""
    if example is None:
        raise ValueError("no example input to export with")
    key = _signature(example)
    with _CACHE_LOCK:
        cached = _EXPORTS.get(model)
    if cached is not None and cached[0] == key:
        return _sharing_tensors(cached[1], model)
    rows = example if n_rows(example) >= 2 else repeat(example, 2)  # batch 1 would specialize
    if isinstance(rows, NamedInputs):
        args, kwargs = (), dict(rows.items())
        dynamic: Any = {key: {0: torch.export.Dim.AUTO} for key in kwargs}
    else:
        args, kwargs, dynamic = (rows,), {}, ({0: torch.export.Dim.AUTO},)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic, strict=False)
        owner = torch.export.unflatten(program)
    with _CACHE_LOCK:
        _EXPORTS[model] = (key, owner)
    return _sharing_tensors(owner, model)


def _sharing_tensors(owner: nn.Module, model: nn.Module) -> nn.Module:
    """`owner` (an unflattened export of `model`, which holds copies) with the model's own
    parameters and buffers in their place, so in-place changes to the model are seen and no
    second copy of the weights is kept."""
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, tensor in [*owner.named_parameters(), *owner.named_buffers()]:
        mine = own.get(name)
        if mine is not None and mine is not tensor and mine.shape == tensor.shape:
            path, _, attribute = name.rpartition(".")
            module = owner.get_submodule(path)
            if isinstance(mine, nn.Parameter):
                setattr(module, attribute, mine)
            else:
                module._buffers[attribute] = mine
    return owner


def _batch_sizes(front: list[fx.Node], from_input: set[fx.Node]) -> list[fx.Node]:
    """Front nodes that compute the batch size (torch.export's `sym_size(x, 0)` of a
    per-sample value) or an integer from it: the tail recomputes them from its own batch,
    which holds every stacked variant."""
    sizes: list[fx.Node] = []
    for node in front:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.sym_size.int:
            if node.args[1] == 0 and node.args[0] in from_input:
                sizes.append(node)
        elif (getattr(node.target, "__module__", None) in ("_operator", "operator")
              and node.all_input_nodes and all(n in sizes for n in node.all_input_nodes)):
            sizes.append(node)
    return sizes


def _parts_of(model: nn.Module, attributes: list[str]) -> list[tuple[str, Any]]:
    """(name, object) of the model's submodules (not the model: runners hold it weakly),
    parameters, buffers and the named attributes (what a split graph reads), to tell when
    one of them has been replaced."""
    read = []
    for target in attributes:
        value: Any = model
        for part in target.split("."):
            value = getattr(value, part, None)
        read.append((target, value))
    submodules = [(name, module) for name, module in model.named_modules() if name]
    return [*submodules, *model.named_parameters(), *model.named_buffers(), *read]


class FxRunner(LayerRunner):
    """Splits the model's fx graph at the layer; the tail re-runs alone on stacked variants."""

    def __init__(self, model: nn.Module, name: str, module: nn.Module, example: Any = None):
        super().__init__(model, name, module)
        if runs_own_hooks(model):
            raise ValueError("the model's own forward hooks would be skipped")
        graph, owner, layer_node = _graph_of(model, name, example)
        # an export specializes on the per-sample shapes it saw; fx and .pt2 graphs do not
        self._signature = _signature(example) if owner is not model else None
        nodes = list(graph.nodes)
        layer_nodes = [layer_node]
        cut = nodes.index(layer_node) + 1
        front, tail = nodes[:cut], nodes[cut:]
        tail_set = set(tail)
        from_input: set[fx.Node] = set()  # parameters and buffers are not per-sample values
        for node in front:
            if node.op == "placeholder" or any(arg in from_input
                                               for arg in node.all_input_nodes):
                from_input.add(node)
        sizes = _batch_sizes(front[:-1], from_input)
        live = [layer_nodes[0]] + [
            n for n in front[:-1] if n not in sizes and any(user in tail_set for user in n.users)
        ]
        self._per_sample = tuple(node in from_input for node in live[1:])

        front_graph, env = fx.Graph(), {}
        for node in front:
            env[node] = front_graph.node_copy(node, lambda arg: env[arg])
        front_graph.output(tuple(env[n] for n in live))

        tail_graph = fx.Graph()
        env = {node: tail_graph.placeholder(f"live_{i}") for i, node in enumerate(live)}
        for node in sizes:
            env[node] = (tail_graph.call_function(node.target, (env[live[0]], 0))
                         if node.target is torch.ops.aten.sym_size.int
                         else tail_graph.node_copy(node, lambda arg: env[arg]))
        for node in tail:
            if node.op == "output":
                tail_graph.output(fx.map_arg(node.args[0], lambda arg: env[arg]))
            else:
                env[node] = tail_graph.node_copy(node, lambda arg: env[arg])
        self.front = fx.GraphModule(owner, front_graph)
        self.back = fx.GraphModule(owner, tail_graph)
        # the owner of the graphs' targets: held weakly when it is the model itself
        self._export = owner if owner is not model else None
        self._tail_graph, self._prefix = tail_graph, None
        self._constants: Optional[tuple] = None  # see `_shortcut_constants`
        calls = getattr(owner, "module_call_graph", None)  # torch.export: flat outputs
        self._out_spec = calls[0].signature.out_spec if calls else None
        self._read = [node.target for node in graph.nodes if node.op == "get_attr"]
        self._parts = _parts_of(model, self._read)  # the split graphs hold these objects

    def is_current(self, module: nn.Module) -> bool:
        """Also False once a submodule, parameter, buffer or tensor attribute has been
        replaced by another object (e.g. `model.head = nn.Linear(...)`), or once calling the
        model runs hooks the split would skip (`runs_own_hooks`)."""
        parts = _parts_of(self.model, self._read)
        return (super().is_current(module) and not runs_own_hooks(self.model)
                and len(parts) == len(self._parts)
                and all(name == old_name and value is old_value for (name, value), (
                    old_name, old_value) in zip(parts, self._parts)))

    def accepts(self, x):
        """False for inputs of other per-sample shapes than an export of the model saw."""
        return self._signature is None or self._signature == _signature(x)

    def _front(self, x):
        try:
            return call(self.front.forward, x)  # not __call__: fx prints failures to stderr
        except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:
            run_model(self.model, x)  # re-raise the model's own message as AttributionError
            raise error

    def capture(self, x):
        with torch.no_grad():
            output, *saved = self._front(x)
            z = self._to_neurons(output)
            state = (saved, x.shape[0])
            logits = self.tail(z.clone(), state, 1)  # an in-place op after the layer keeps z
        return z, state, logits

    def tail(self, z, state, repeats):
        saved, batch = state
        saved = [_repeat_batch(value, batch, repeats) if per_sample else value
                 for value, per_sample in zip(saved, self._per_sample)]
        if z.requires_grad:
            check_differentiable(self.model)
            if z.is_leaf:
                z = z.clone()  # in-place ops after the layer must not touch the leaf
        z = self._from_neurons(z)  # exported graphs view it: keep the model's own layout
        return self._logits(self.back.forward(z if z.is_contiguous() else z.contiguous(),
                                              *saved))

    def renew(self) -> None:
        self._constants = None

    @property
    def owner(self) -> nn.Module:
        """The module whose submodules and attributes the graphs' nodes name."""
        return self._export if self._export is not None else self.model

    def ablate(self, z, state, neurons):
        """As `LayerRunner.ablate`; where the tail starts with ops that act on each neuron
        alone (BatchNorm, activations), they run once on z and once on a zeroed z, and only
        the rest of the tail runs on the K variants; where an affine op follows them (z
        [B, n]), its output moves by one column per ablated neuron, so the variants start
        after it."""
        if self._prefix is None:
            self._prefix = _per_neuron_prefix(self, z[:2])
        if not self._prefix:
            return super().ablate(z, state, neurons)
        chain, affine, rest = self._prefix
        owner = self.owner
        moved = self._from_neurons(z).clone()  # an in-place op in the chain must keep z
        after = _run_nodes(owner, chain, moved)
        zeroed, columns = self._shortcut_constants(moved)
        if affine is None:
            variants = self._from_neurons(_zeroed_variants(
                self._to_neurons(after), neurons, self._to_neurons(zeroed)))
        else:  # z [B, n]: the affine op's output moves by (new - old value) x its column
            change = (zeroed[0].index_select(0, neurons)[None]
                      - after.index_select(1, neurons))  # [B, K]
            variants = _shifted(_run_nodes(owner, (affine,), after), change,
                                columns.index_select(0, neurons))
        saved, batch = state
        saved = [_repeat_batch(value, batch, len(neurons)) if per_sample else value
                 for value, per_sample in zip(saved, self._per_sample)]
        return self._logits(rest(variants.contiguous(), *saved))

    def _shortcut_constants(self, moved: torch.Tensor
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(the chain's value at zero [1, ...], the affine op's `_columns` [n, m] or None)
        for z like `moved`, computed once per computation (until `renew`)."""
        key = (moved.shape[1:], moved.dtype, moved.device)
        constants = self._constants
        if constants is None or constants[0] != key:
            chain, affine, _ = self._prefix
            zeroed = _run_nodes(self.owner, chain, torch.zeros_like(moved[:1]))
            columns = None if affine is None else _columns(self.owner, affine, zeroed)
            self._constants = constants = (key, zeroed, columns)
        return constants[1], constants[2]

    def _logits(self, output):
        if self._out_spec is not None:  # the model's own structure (a ModelOutput, a dict)
            output = pytree.tree_unflatten(
                list(output) if isinstance(output, (tuple, list)) else [output], self._out_spec)
        return logits_of(output, output_key(self.model))

    def forward_with_leaf(self, x):
        with engine_modes():
            with torch.no_grad():
                output, *saved = self._front(x)
            leaf = leaf_like(self._to_neurons(output))
            logits = self.tail(leaf, (saved, x.shape[0]), 1)
        return leaf, logits


def _per_neuron_prefix(runner: FxRunner, z: torch.Tensor) -> tuple:
    """(chain, affine, rest): the runner's tail cut after its longest chain of ops from z
    that act on each neuron alone (chain: their nodes, maybe none), then, for z [B, n], the
    op after it when it is affine (its node, else None); rest runs what follows
    (`_tail_after`). () when there is neither. The chain is read from the graph (one op after
    another on z, reading only parameters), and each op is checked on `z` [<=2, n, ...]:
    zeroing any neuron before the chain must equal replacing that neuron after it by the
    chain's value at zero; the affine op likewise (`_is_affine`)."""
    graph = runner._tail_graph
    owner = runner.owner
    current = next(n for n in graph.nodes if n.op == "placeholder")
    neurons = torch.arange(z.shape[1], device=z.device)
    chain: list[fx.Node] = []
    candidate = None  # the first op that does not act on each neuron alone
    with torch.no_grad():
        after = runner._from_neurons(z).contiguous()  # the chain's values so far, three ways
        zeroed = torch.zeros_like(after[:1])
        direct = runner._from_neurons(
            _zeroed_variants(z, neurons, torch.zeros((), dtype=z.dtype))).contiguous()
        for node in graph.nodes:
            if node.op in ("get_attr", "placeholder"):
                continue
            if (node.op == "output" or len(current.users) != 1 or node not in current.users
                    or not node.args or node.args[0] is not current
                    or any(n is not current and n.op != "get_attr"
                           for n in node.all_input_nodes)):
                break
            try:
                values = [_run_nodes(owner, (node,), value.clone())
                          for value in (after, zeroed, direct)]
            except Exception:  # noqa: BLE001 - an op that cannot run alone ends the chain
                break
            candidate, candidate_values = node, values
            if any(not isinstance(new, torch.Tensor) or new.shape != old.shape
                   for new, old in zip(values, (after, zeroed, direct))):
                break
            expected = _zeroed_variants(runner._to_neurons(values[0]), neurons,
                                        runner._to_neurons(values[1]))
            if not torch.allclose(runner._to_neurons(values[2]), expected, rtol=1e-5,
                                  atol=1e-6, equal_nan=True):
                break
            after, zeroed, direct = values
            current = node
            chain.append(node)
            candidate = None  # it joined the chain
        affine = candidate if candidate is not None and _is_affine(
            owner, candidate, after, zeroed, candidate_values) else None
    if affine is None and not chain:
        return ()
    return tuple(chain), affine, _tail_after(runner, affine or chain[-1])


def _run_nodes(owner: nn.Module, nodes: tuple[fx.Node, ...], value: Any) -> Any:
    """`value` through `nodes`, one op after another (each reading the one before and
    parameters of `owner` only), with the current parameters; `value` if there are none."""
    for node in nodes:
        env = {n: _attribute(owner, n.target) for n in node.all_input_nodes
               if n.op == "get_attr"}
        env[node.args[0]] = value
        value = _run_node(owner, node, env)
    return value


def _columns(owner: nn.Module, affine: fx.Node, zeroed: torch.Tensor) -> torch.Tensor:
    """[n, m]: how the affine op's output [B, m] moves per unit of each of its n inputs
    (f(e_j) - f(0)); `zeroed` [1, n] gives the dtype and device."""
    eye = torch.eye(zeroed.shape[1], dtype=zeroed.dtype, device=zeroed.device)
    return (_run_nodes(owner, (affine,), eye)
            - _run_nodes(owner, (affine,), torch.zeros_like(zeroed)))


def _shifted(base: torch.Tensor, change: torch.Tensor, columns: torch.Tensor
             ) -> torch.Tensor:
    """[K*B, m]: base [B, m] moved by change[:, k] x columns[k] in copy k (change [B, K],
    columns [K, m]); variant-major, as `LayerRunner.tail`."""
    return (torch.bmm(change.T.unsqueeze(-1), columns.unsqueeze(1)) + base).flatten(0, 1)


def _is_affine(owner: nn.Module, node: fx.Node, after: torch.Tensor, zeroed: torch.Tensor,
               values: list) -> bool:
    """Is `node`, on values [B, n] (`after`), affine per neuron: f(copy k) = f(after) +
    change x column k, where copy k has neuron k replaced by its `zeroed` value? `values`:
    f(after), f(zeroed) and f of the n copies ([n*B, ...]), or what the node returned."""
    base, _, expected = values
    if after.dim() != 2 or not all(isinstance(value, torch.Tensor) for value in values):
        return False
    try:
        change = zeroed[0][None] - after  # [B, n]
        predicted = _shifted(base, change, _columns(owner, node, zeroed))
        scale = 1 + float(expected.abs().max())
        return bool(base.dim() == 2 and torch.allclose(predicted, expected, rtol=1e-5,
                                                       atol=1e-5 * scale))
    except Exception:  # noqa: BLE001 - an op that cannot run on these values is not affine
        return False


def _attribute(owner: nn.Module, target: str) -> Any:
    value: Any = owner
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _run_node(owner: nn.Module, node: fx.Node, env: dict) -> Any:
    """The value of one call node of a graph of `owner`, its inputs taken from `env`."""
    args = fx.map_arg(node.args, env.__getitem__)
    kwargs = fx.map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_module":
        return owner.get_submodule(node.target)(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _tail_after(runner: FxRunner, last: fx.Node) -> Callable[..., Any]:
    """(value of `last`, live state...) -> output: the runner's tail after node `last` of a
    chain of ops from z (each the only user of the one before)."""
    nodes = list(runner._tail_graph.nodes)
    cut = nodes.index(last) + 1
    placeholders = [n for n in nodes if n.op == "placeholder"]
    needed = {n for node in nodes[cut:] for n in node.all_input_nodes}
    if any(node in needed for node in nodes[:cut - 1]
           if node.op not in ("placeholder", "get_attr")):
        raise ValueError("the rest of the tail reads the chain's inner values")
    back = fx.Graph()
    env = {last: back.placeholder("after")}
    env.update({node: back.placeholder(f"live_{i}") for i, node in enumerate(placeholders)
                if i > 0})
    shared = [n for n in nodes[:cut] if n.op == "get_attr" and n in needed]  # fx reads a
    for node in shared + nodes[cut:]:  # parameter once, where the chain first uses it
        if node.op == "output":
            back.output(fx.map_arg(node.args[0], lambda arg: env[arg]))
        elif node not in env:
            env[node] = back.node_copy(node, lambda arg: env[arg])
    if len(back.nodes) == len(placeholders) + 1:  # placeholders and the output: no op
        output = next(iter(reversed(back.nodes))).args[0]
        inputs = [n for n in back.nodes if n.op == "placeholder"]
        return lambda *values: fx.map_arg(output, dict(zip(inputs, values)).__getitem__)
    return fx.GraphModule(runner.owner, back).forward


CHECK_ROWS = 4
"""How many rows of the first batch `runner_for` checks a split on (`check_rows`)."""


def check_rows(x: Any) -> Any:
    """`CHECK_ROWS` rows of the batch x [N, ...] (of every named input alike), spread from
    its first row to its last, as padding and lengths vary over a batch; x itself when it
    has no more. A split right on them is right on the batch: a graph runs the same ops on
    any batch (fx and torch.export refuse data-dependent control flow; a graph specialized
    to the batch's size fails on fewer rows), and the engine runs the model in eval mode
    (BatchNorm on its running statistics, no Dropout). Two rows or more tell a per-sample
    output from one shared by the batch."""
    rows = n_rows(x)
    if rows <= CHECK_ROWS:
        return x
    return take(x, torch.linspace(0, rows - 1, CHECK_ROWS).round().long())


def _agrees(runner: LayerRunner, model: nn.Module, x: torch.Tensor) -> bool:
    """Does `runner` reproduce the model's logits on x (`check_rows` of a batch), alone and
    with two stacked variants, and split at the layer's `output_tensor` (of a tuple output,
    the entry hooks would replace)?"""
    seen = []

    def keep(module, args, output):
        tensor = output_tensor(output)
        if not seen:  # a copy: in-place ops after the layer
            seen.append(None if tensor is None else tensor.clone())

    with torch.no_grad(), forward_hooks({runner.module: keep}):
        reference = run_logits(model, x)
    with torch.no_grad():
        z, state, logits = runner.capture(x)
        doubled = runner.tail(torch.cat([z, z]), state, 2)
    tolerance = 1e-4 * (1 + reference.abs().max().item())
    hooked = seen[0] if seen else None
    return (hooked is not None and z.shape == hooked.shape
            and torch.allclose(z, hooked, rtol=1e-4, equal_nan=True,
                               atol=1e-4 * (1 + hooked.abs().max().item()))
            and logits.shape == reference.shape and doubled.shape[0] == 2 * x.shape[0]
            and torch.allclose(logits, reference, rtol=1e-4, atol=tolerance)
            and torch.allclose(doubled, reference.repeat(2, 1), rtol=1e-4, atol=tolerance))


def _fastest_runner(model: nn.Module, path: str, module: nn.Module, x: Any, rows: Any
                    ) -> LayerRunner:
    """An `FxRunner` split at the input shapes of the batch x, where it agrees with the
    model on `rows` (`check_rows(x)`), else a `HookRunner`."""
    try:
        runner = FxRunner(model, path, module, x)  # an export sees the batch's own size
        if _agrees(runner, model, rows):
            return runner
    except AttributionError:
        raise
    except Exception:  # noqa: BLE001 - untraceable (data-dependent control flow, ...): hooks
        pass
    return HookRunner(model, path, module)


_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict[str, LayerRunner]]" = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def runner_for(model: nn.Module, name: str, module: nn.Module, x: torch.Tensor) -> LayerRunner:
    """The fastest runner that reproduces the model on `x` (cached per model and layer),
    checked on `check_rows(x)`: the check costs a few rows, not a batch.

    `name` is a layer spec of `layers.resolve_layer`: "name" (the neuron axis found from the
    data, `layers.neuron_axis`) or "name:axis" (chosen). Call inside `eval_mode(model)`.
    """
    with _CACHE_LOCK:
        cached = _CACHE.get(model, {}).get(name)
    if cached is not None and cached.is_current(module) and cached.accepts(x):
        cached.renew()
        return cached
    path, chosen = split_axis(name)
    rows = check_rows(x)
    try:
        runner = _fastest_runner(model, path, module, x, rows)
        with torch.no_grad():
            z, _, logits = runner.capture(rows)  # a HookRunner raises "runs twice" here
    except AttributionError:
        if rows is not x:  # where the model fails on the rows, its message names the batch
            with torch.no_grad():
                run_model(model, x)
        raise
    if z.dim() < 2:
        raise AttributionError(
            f"Layer {path!r} has no neuron axis: its output has shape {list(z.shape)}. "
            "Pick a layer from list_layers()."
        )
    if z.shape[0] != n_rows(rows):
        raise AttributionError(
            f"Layer {path!r} has no output per sample: its output has shape "
            f"{list(z.shape)} for {n_rows(rows)} samples (e.g. position embeddings shared by "
            "the batch). Pick a layer from list_layers().")
    if chosen is not None:
        if not -z.dim() < chosen < z.dim() or chosen % z.dim() == 0:
            raise AttributionError(
                f"Neuron axis {chosen} does not fit layer {path!r}, whose output has shape "
                f"{list(z.shape)} (batch = dim 0); choose 1..{z.dim() - 1}.")
        runner.axis, runner.axis_rule = chosen % z.dim(), "chosen"
    elif z.dim() > 2:  # positions too: which axis holds the neurons is read from the data
        runner.axis, runner.axis_rule = neuron_axis(model, path, rows)
    runner.n_classes, runner.layer_size = logits.shape[1], z[0].numel()
    with _CACHE_LOCK:
        _CACHE.setdefault(model, {})[name] = runner
    return runner


LAYER_KEYS = ("layer", "neuron_axis", "axis_rule")
"""The keys of `layer_attrs`."""


def layer_attrs(runner: LayerRunner) -> dict[str, object]:
    """What a result records about the layer it was computed on (a DataFrame's `attrs`, a
    JSON output): {"layer": dotted name, "neuron_axis": the output dim holding the neurons
    (batch = dim 0), "axis_rule": how that dim was found (`layers.AXIS_RULES`)}."""
    return dict(zip(LAYER_KEYS, (runner.name, int(runner.axis), runner.axis_rule)))
