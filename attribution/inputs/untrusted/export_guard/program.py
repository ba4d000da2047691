"""The program: its graph and nodes (a higher-order op's callables are subgraphs, checked
the same way), signature, treespecs, metadata, guards, and the costs it declares (tensors
over the budget at the example's sizes)."""
from __future__ import annotations

import json
import math
import operator
import re
import types
from typing import Any

import torch

from ....errors import AttributionError
from ..limits import Limits
from .common import (EXPORT_RECIPE, MAX_EXPRESSION_CHARS, MAX_SUBGRAPH_DEPTH, _data_dependent,
                     _refuse, _within_budget)
from .schema import (_DEVICES, _DTYPES, _IDENTIFIER, _MAX_EXPRESSION, _NODE_OUTPUT_KINDS, _SYMBOL,
                     _UNBACKED, _VALUE_KINDS, _argument, _bool, _dotted, _fields, _int, _list,
                     _mapping, _name, _one_of, _symbolic, _tensor_meta, _tensor_ref, _text)
from .operators import (_GRAPH, _HIGHER_ORDER, _HOP_PREFIX, _OPERANDS, _OPERATOR, _SYMBOLIC_OPS,
                        _operator_inputs, _shaped_by_inputs)


# ---------------------------------------------------------------- the program

_VERIFIERS = frozenset({"ATEN", "TRAINING"})
_METADATA = frozenset({"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn",
                       "from_node", "custom"})
_MODULE_TYPE = re.compile(r"[A-Za-z0-9_.<>]+\Z")
_MODEL_OUTPUTS = "transformers.modeling_outputs."
_CONTAINERS = frozenset({"builtins.tuple", "builtins.list", "builtins.dict",
                         "collections.OrderedDict"})


def _check_program(program: Any) -> None:
    _fields(program, "the program", ("graph_module", "opset_version", "range_constraints",
                                     "schema_version"),
            ("verifiers", "torch_version", "guards_code"))
    guards = _list(program.get("guards_code", []), "the guards")
    if len(guards) > _MAX_GUARDS:
        raise _refuse(f"it carries {len(guards)} guards")
    for guard in guards:
        _guard(guard)
    for verifier in _list(program.get("verifiers", []), "the verifiers"):
        if not isinstance(verifier, str) or verifier not in _VERIFIERS:
            raise _refuse(f"it names the verifier {str(verifier)[:40]!r}")
    _text(program.get("torch_version", ""), "the torch version")
    version = _fields(program["schema_version"], "the schema version", ("major", "minor"))
    if version["major"] != 8 or type(version["minor"]) is not int:
        raise AttributionError("This .pt2 archive was written by an unsupported PyTorch "
                               f"version; re-export it with torch {torch.__version__}:\n"
                               f"{EXPORT_RECIPE}")
    for namespace, number in _mapping(program["opset_version"], "the opset").items():
        _name(namespace, "the opset"), _int(number, "the opset")
    for symbol, bounds in _mapping(program["range_constraints"], "the ranges").items():
        if not _SYMBOL.match(symbol):  # torch counts up to the number in "u<n>"
            raise _refuse(f"a range constraint names {symbol[:40]!r}, not a shape symbol")
        if _UNBACKED.match(symbol):
            raise _data_dependent(f"its graph has the size {symbol}, read from the data")
        _fields(bounds, "a range constraint", ("min_val", "max_val"))
        for bound in bounds.values():
            if bound is not None:
                _int(bound, "a range constraint")
    module = _fields(program["graph_module"], "the graph module",
                     ("graph", "signature", "module_call_graph"),
                     ("metadata", "treespec_namedtuple_fields"))
    if module.get("treespec_namedtuple_fields"):
        raise _refuse("its outputs are namedtuples")
    _metadata(module.get("metadata", {}), "the graph module", frozenset({"custom"}))
    _check_signature(module["signature"])
    for entry in _list(module["module_call_graph"], "the module call graph"):
        _module_call(entry)
    _check_graph(module["graph"], "the graph", 0)


_GUARD_TOKEN = re.compile(
    r"\s*(?:L(?:\['[A-Za-z_][A-Za-z0-9_]*'\]|\[\d+\])+|\.(?:size|stride)\(\)\[\d+\]"
    r"|\.storage_offset\(\)|\d+|==|!=|<=|>=|//|(?:and|or|not|max|min|abs)\b|[-+*%()<>,])")
_MAX_GUARDS = 1000


def _guard(text: Any) -> None:
    """A shape guard: comparisons of input sizes and integers (`ExportedProgram.module()` execs
    these; `torch.export.unflatten`, used here, does not)."""
    if not isinstance(text, str) or len(text) > _MAX_EXPRESSION or "**" in text:
        raise _refuse("it carries guard code that is not a shape comparison")
    position = 0
    while position < len(text.rstrip()):
        match = _GUARD_TOKEN.match(text, position)
        if match is None:
            raise _refuse(f"it carries guard code, which PyTorch runs as Python "
                          f"({text[position:position + 30]!r} is not a shape comparison)")
        position = match.end()


def _check_costs(program: dict, limits: Limits) -> None:
    """What the (valid) program asks of sympy and of memory: its shape expressions, and its
    largest declared tensor (at the example's sizes) against `limits.max_decoded_bytes`."""
    objects, stack = [], [program]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            objects.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    characters = sum(len(item["expr_str"]) for item in objects if "expr_str" in item)
    if characters > MAX_EXPRESSION_CHARS:
        raise _refuse(f"its shape expressions take {characters:,} characters")
    largest = max((_declared_bytes(meta) for item in objects if "tensor_values" in item
                   for meta in item["tensor_values"].values()), default=0)
    _within_budget("This .pt2 computes a tensor of", largest, limits)


def _declared_bytes(meta: dict) -> int:
    """Bytes of a tensor value of the graph; symbolic sizes at their hint (the example's)."""
    numel = 1
    for size in meta["sizes"]:
        (kind, value), = size.items()
        numel *= value if kind == "as_int" else (value.get("hint") or {}).get("as_int", 1)
    return numel * _DTYPES[meta["dtype"]].itemsize


def _check_signature(signature: Any) -> None:
    _fields(signature, "the signature", ("input_specs", "output_specs"))
    data = _VALUE_KINDS | {"as_string"}
    for spec in _list(signature["input_specs"], "the inputs"):
        kind, inner = _one_of(spec, "an input", ("user_input", "parameter", "buffer",
                                                 "tensor_constant", "constant_input"))
        if kind == "user_input":
            _argument_or_string(_fields(inner, "an input", ("arg",))["arg"], "an input", data)
        elif kind == "constant_input":
            _fields(inner, "a constant input", ("name", "value"))
            _name(inner["name"], "a constant input")
            _argument_or_string(inner["value"], "a constant input",
                                frozenset({"as_none", "as_int", "as_float", "as_bool",
                                           "as_string"}))
        else:
            target = {"parameter": "parameter_name", "buffer": "buffer_name",
                      "tensor_constant": "tensor_constant_name"}[kind]
            extra = ("persistent",) if kind == "buffer" else ()
            _fields(inner, f"a {kind}", ("arg", target) + extra)
            _tensor_ref(inner["arg"], f"a {kind}")
            _dotted(inner[target], f"a {kind}")
            for key in extra:
                _bool(inner[key], f"a {kind}")
    for spec in _list(signature["output_specs"], "the outputs"):
        kind, inner = _one_of(spec, "an output", ("user_output", "buffer_mutation",
                                                  "parameter_mutation", "user_input_mutation"))
        if kind == "user_output":
            _argument_or_string(_fields(inner, "an output", ("arg",))["arg"], "an output",
                                data)
        else:
            target = {"buffer_mutation": "buffer_name", "parameter_mutation": "parameter_name",
                      "user_input_mutation": "user_input_name"}[kind]
            _fields(inner, "a mutation", ("arg", target))
            _tensor_ref(inner["arg"], "a mutation")
            _dotted(inner[target], "a mutation")


def _argument_or_string(value: Any, where: str, kinds: frozenset[str]) -> None:
    """A signature value: data, or a constant string (kept as data, never resolved)."""
    if isinstance(value, dict) and set(value) == {"as_string"} and "as_string" in kinds:
        _text(value["as_string"], where)
    else:
        _argument(value, where, kinds - {"as_string"})


def _module_call(entry: Any) -> None:
    _fields(entry, "a module call", ("fqn",), ("signature",))
    _dotted(entry["fqn"], "a module call", empty=True)
    if entry.get("signature") is None:
        return
    signature = _fields(entry["signature"], "a module call signature",
                        ("inputs", "outputs", "in_spec", "out_spec"), ("forward_arg_names",))
    for key in ("inputs", "outputs"):
        for value in _list(signature[key], "a module call signature"):
            _argument_or_string(value, "a module call signature", _VALUE_KINDS | {"as_string"})
    for key in ("in_spec", "out_spec"):
        if not isinstance(signature[key], str):
            raise _refuse("a tree spec is not text")
        protocol, spec = json.loads(signature[key])
        if protocol != 1:
            raise _refuse("a tree spec uses an unknown protocol")
        _treespec(spec, 0)
    for name in _list(signature.get("forward_arg_names") or [], "the argument names"):
        _name(name, "the argument names")


def _treespec(spec: Any, depth: int) -> None:
    """A pytree spec: builtin containers (or transformers outputs) with plain-JSON contexts.

    torch decodes contexts with a hook that imports any module an `"__enum__"` object names.
    """
    import torch.utils._pytree as pytree

    _fields(spec, "a tree spec", ("type", "context", "children_spec"))
    children = _list(spec["children_spec"], "a tree spec")
    if spec["type"] is None:
        if spec["context"] is not None or children:
            raise _refuse("a tree spec leaf has children")
        return
    kind = spec["type"]
    if isinstance(kind, str) and kind.startswith(_MODEL_OUTPUTS):
        import transformers.modeling_outputs  # noqa: F401  (a fixed module: registers its outputs)
    registered = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(kind) if isinstance(kind, str) else None
    if registered is None or not (kind in _CONTAINERS or kind.startswith("transformers.")) or (
            pytree.SUPPORTED_SERIALIZED_TYPES[registered].from_dumpable_context is not None):
        raise _refuse(f"a tree spec uses the type {str(kind)[:60]!r}")
    if not isinstance(spec["context"], str):
        raise _refuse("a tree spec context is not text")
    context = json.loads(_text(spec["context"], "a tree spec"))
    if context is not None and not (isinstance(context, list) and all(
            isinstance(key, str) or type(key) is int for key in context)):
        raise _refuse("a tree spec context is not a list of keys")
    if depth > MAX_SUBGRAPH_DEPTH * 4:
        raise _refuse("a tree spec is nested too deeply")
    for child in children:
        _treespec(child, depth + 1)


def _check_graph(graph: Any, where: str, depth: int) -> None:
    """One graph: its values, inputs, outputs and nodes; subgraphs recursively."""
    if depth > MAX_SUBGRAPH_DEPTH:
        raise _refuse("its subgraphs are nested too deeply")
    _fields(graph, where, ("inputs", "outputs", "nodes", "tensor_values", "sym_int_values",
                           "sym_bool_values"),
            ("is_single_tensor_return", "custom_obj_values", "sym_float_values"))
    if graph.get("custom_obj_values"):
        raise _refuse(f"{where} holds custom (script) objects")
    _bool(graph.get("is_single_tensor_return", False), where)
    for name, meta in _mapping(graph["tensor_values"], where).items():
        _name(name, where), _tensor_meta(meta, f"the tensor {name}")
    for key, concrete in (("sym_int_values", "as_int"), ("sym_bool_values", "as_bool"),
                          ("sym_float_values", "as_float")):
        for name, value in _mapping(graph.get(key, {}), where).items():
            _name(name, where), _symbolic(value, f"the value {name}", concrete)
    for value in _list(graph["inputs"], where):
        _argument(value, f"an input of {where}", _VALUE_KINDS)
    for value in _list(graph["outputs"], where):
        _argument(value, f"an output of {where}", _VALUE_KINDS)
    dtypes = {name: meta.get("dtype") for name, meta in graph["tensor_values"].items()}
    for node in _list(graph["nodes"], where):
        _check_node(node, depth, dtypes)


def _check_node(node: Any, depth: int, dtypes: dict) -> None:
    _fields(node, "a node", ("target", "inputs", "outputs", "metadata"),
            ("is_hop_single_tensor_return", "name"))
    target = node["target"]
    if not isinstance(target, str):
        raise _refuse("a node has no operator name")
    where = f"the node {str(node.get('name'))[:40]} ({target[:80]})"
    if node.get("name") is not None:
        _name(node["name"], "a node")
    if node.get("is_hop_single_tensor_return") is not None:
        _bool(node["is_hop_single_tensor_return"], where)
    inputs = _list(node["inputs"], where)
    operator_match = _OPERATOR.match(target)
    if operator_match:
        op = _resolve(*operator_match.groups())
        _operator_inputs(op, inputs, where)
        _shaped_by_inputs(op, inputs, where, dtypes)
    elif target == _HOP_PREFIX + "cond" and inputs and isinstance(inputs[0], dict) \
            and isinstance(inputs[0].get("arg"), dict) and "as_tensor" in inputs[0]["arg"]:
        raise _data_dependent(f"{where} chooses a branch by a tensor's value")
    elif target.startswith(_HOP_PREFIX) and target[len(_HOP_PREFIX):] in _HIGHER_ORDER:
        _higher_order_inputs(target[len(_HOP_PREFIX):], inputs, where, depth)
    elif target in _SYMBOLIC_OPS:
        for item in inputs:
            _fields(item, where, ("name", "arg"), ("kind",))
            _argument(item["arg"], where, _VALUE_KINDS - {"as_tensor", "as_none"})
    else:
        raise _refuse(f"its graph calls {target[:80]!r}, which is not a standard tensor "
                      "operation")
    for value in _list(node["outputs"], where):
        _argument(value, f"an output of {where}", _NODE_OUTPUT_KINDS)
    _metadata(node["metadata"], where, _METADATA)


def _resolve(namespace: str, name: str, overload: str) -> torch._ops.OpOverload:
    """torch.ops.<namespace>.<name>.<overload>, looked up in the operator registry first."""
    target = f"torch.ops.{namespace}.{name}.{overload}"
    if not torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}"):
        raise _refuse(f"its graph calls {target[:80]!r}, which this PyTorch does not have")
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload, None)
    if not isinstance(op, torch._ops.OpOverload):
        raise _refuse(f"its graph calls {target[:80]!r}, which is not a tensor operation")
    return op


def _metadata(metadata: Any, where: str, keys: frozenset[str]) -> None:
    """Node metadata: text torch parses (module stacks) or keeps; nothing resolved unsafely."""
    for key, value in _mapping(metadata, where).items():
        if key not in keys:
            raise _refuse(f"{where} carries the unknown metadata {str(key)[:40]!r}")
        _text(value, f"the {key} of {where}", line_breaks=key == "stack_trace")
        if key == "nn_module_stack":
            for item in value.split(";"):
                parts = item.split(",")
                if len(parts) != 3:
                    raise _refuse(f"the module stack of {where} is malformed")
                _dotted(parts[1], f"the module stack of {where}", empty=True)
                if not _MODULE_TYPE.match(parts[2]):
                    raise _refuse(f"the module stack of {where} names the type "
                                  f"{parts[2][:60]!r}")
        elif key == "source_fn_stack":
            for item in value.split(";"):
                parts = item.split(",")
                if len(parts) != 2 or not _IDENTIFIER.match(parts[0]):
                    raise _refuse(f"the source function stack of {where} is malformed")
                _source_function(parts[1], where)
        elif key in ("from_node", "custom"):
            _plain_json(json.loads(value), f"the {key} of {where}", 0)


def _source_function(target: str, where: str) -> None:
    """torch resolves these names with getattr: only through torch modules already loaded.

    A name missing from a module's dict would reach its `__getattr__`, which may import.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", target):
        raise _refuse(f"the source function {target[:60]!r} of {where} is not a dotted name")
    roots = (("torch.nn", torch.nn, 2), ("torch", torch, 1), ("_operator", operator, 1),
             ("math", math, 1))
    root = next(((module, skip) for prefix, module, skip in roots
                 if target.startswith(prefix)), None)
    if root is None:
        return  # torch keeps the text as it is
    found: Any = root[0]
    for name in target.split(".")[root[1]:]:
        if not (isinstance(found, types.ModuleType) and name in vars(found) and (
                found.__name__ in ("torch", "operator", "math")
                or found.__name__.startswith("torch."))):
            raise _refuse(f"the source function {target[:60]!r} of {where} is not an "
                          "attribute of a loaded torch module")
        found = vars(found)[name]


def _plain_json(value: Any, where: str, depth: int) -> None:
    """JSON that torch keeps as data: no objects it would decode specially, bounded depth."""
    if depth > 32:
        raise _refuse(f"{where} is nested too deeply")
    if isinstance(value, dict):
        if "__enum__" in value:
            raise _refuse(f"{where} names a Python enum")
        for item in value.values():
            _plain_json(item, where, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _plain_json(item, where, depth + 1)
    elif isinstance(value, str):
        _text(value, where)


def _higher_order_inputs(name: str, inputs: list, where: str, depth: int) -> None:
    """Positional arguments of the declared kinds; callables are subgraphs of this archive."""
    slots = _HIGHER_ORDER[name]
    for position, item in enumerate(inputs):
        _fields(item, where, ("name", "arg"), ("kind",))
        if item["name"] != "" or item.get("kind") not in (None, 1):
            raise _refuse(f"{where} passes a keyword argument {str(item['name'])[:40]!r}")
        kinds = slots[position] if position < len(slots) else _OPERANDS
        at = f"argument {position} of {where}"
        if kinds is _GRAPH and isinstance(item["arg"], dict) and "as_graph" not in item["arg"]:
            raise _refuse(f"the callable of {where} is not a subgraph of the archive "
                          f"({next(iter(item['arg']), 'nothing')})")
        kind, inner = (_one_of(item["arg"], at, kinds) if kinds & {"as_graph", "as_string"}
                       else _argument(item["arg"], at, kinds))
        if kind == "as_graph":
            _fields(inner, at, ("name", "graph"))
            _name(inner["name"], at)
            _check_graph(inner["graph"], f"the subgraph {inner['name']}", depth + 1)
        elif kind == "as_string" and (not isinstance(inner, str) or inner not in _DEVICES):
            raise _refuse(f"{where} names the device {str(inner)[:20]!r}")
    if len(inputs) < len(slots):
        raise _refuse(f"{where} has {len(inputs)} arguments where it needs {len(slots)}")
