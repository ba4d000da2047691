"""One fx graph of a model with the chosen layer as one node: traced with fx, or exported
with torch.export where fx cannot trace it, with unflattened submodules inlined."""
from __future__ import annotations

import inspect
import operator
import threading
import warnings
import weakref
from typing import Any, Optional

import torch
import torch.fx as fx
from torch import nn

from ..model_io import NamedInputs, n_rows, repeat


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


def graph_of(model: nn.Module, name: str, example: Any
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


_EXPORTS_LOCK = threading.Lock()
_EXPORTS: "weakref.WeakKeyDictionary[nn.Module, tuple[Any, nn.Module]]" = (
    weakref.WeakKeyDictionary())


def input_signature(x: Any) -> Any:
    """What an export specializes on: each input's name, per-sample shape and dtype."""
    entries = x.items() if isinstance(x, NamedInputs) else [("", x)]
    return tuple((key, tuple(value.shape[1:]), value.dtype) for key, value in entries)


def _exported(model: nn.Module, example: Any) -> nn.Module:
    """torch.export's unflattened module of an eager model (with the model's own parameters
    and buffers, `_sharing_tensors`), with a dynamic batch dim; cached per model and input
    signature. Raises what torch.export raises (data-dependent control flow, ...)."""
    if example is None:
        raise ValueError("no example input to export with")
    key = input_signature(example)
    with _EXPORTS_LOCK:
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
    with _EXPORTS_LOCK:
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


def batch_sizes(front: list[fx.Node], from_input: set[fx.Node]) -> list[fx.Node]:
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


def parts_of(model: nn.Module, attributes: list[str]) -> list[tuple[str, Any]]:
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


_IN_PLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.setitem})


def may_write_in_place(graph: fx.Graph, owner: nn.Module) -> bool:
    """Could a node of `graph` write into a tensor it is given (so that a leaf passed in must
    be copied first)? Conservative: yes for any module that is not torch.nn's own, for a
    module or function called with inplace=True, an in-place operator (`x += y`, `x[i] =
    v`), a method or function whose name ends in "_" (`relu_`, `add_`), and an op whose
    schema mutates an argument."""
    for node in graph.nodes:
        if node.op == "call_module":
            try:
                module = owner.get_submodule(node.target)
            except AttributeError:  # a module the owner does not name: assume the worst
                return True
            if (not type(module).__module__.startswith("torch.nn.")
                    or getattr(module, "inplace", False)):
                return True
        elif node.op == "call_method":
            name = node.target
            if name.endswith("_") and not name.endswith("__") or name in (
                    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"):
                return True
        elif node.op == "call_function":
            target = node.target
            schema = getattr(target, "_schema", None)
            name = getattr(target, "__name__", "")
            if (target in _IN_PLACE_OPERATORS or (schema is not None and schema.is_mutable)
                    or name.endswith("_") and not name.endswith("__")
                    or _called_in_place(target, node)):
                return True
    return False


def _called_in_place(function: Any, node: fx.Node) -> bool:
    """Does `node` call `function` with inplace=True (by keyword or by position)?"""
    if node.kwargs.get("inplace") is True:
        return True
    try:
        bound = inspect.signature(function).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # builtins without a signature, or other arguments
        return False
    return bound.arguments.get("inplace") is True
