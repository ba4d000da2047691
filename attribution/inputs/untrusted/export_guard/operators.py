"""Operators: the ATen/prims operators and integer size arithmetic a node may call, their
arguments against their schema, the higher-order ops allowed and their argument kinds, and
the rule that refuses work whose sizes depend on the data's values."""
from __future__ import annotations

import math
import operator
import re
from typing import Any

import torch

from .common import _data_dependent, _refuse
from .schema import _LIST_KINDS, _argument, _fields


_VALUE_SHAPED = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output})
"""Operator tags of outputs whose size or value is read from the data's values."""
_INDEXING = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_put",
                       "aten::index_put_", "aten::_index_put_impl_"})
"""Indexing ops, value-shaped only with boolean masks (integer indices give fixed sizes)."""
_MASK_DTYPES = frozenset({1, 12})  # schema.ScalarType BYTE and BOOL (`_DTYPES`)


def _shaped_by_inputs(op: torch._ops.OpOverload, inputs: list, where: str,
                      dtypes: dict) -> None:
    """Refuse an operator whose output's size or value depends on the data's values, and
    indexing by a boolean mask (`dtypes`: tensor name -> serialized dtype)."""
    if not _VALUE_SHAPED & set(op.tags):
        return
    if op._schema.name in _INDEXING:
        indices = [item["arg"] for item in inputs if item["name"] == "indices"]
        names = [entry.get("name") or (entry.get("as_tensor") or {}).get("name")
                 for arg in indices for entries in arg.values() if isinstance(entries, list)
                 for entry in entries if isinstance(entry, dict)]  # as_(optional_)tensors
        if not any(dtypes.get(name) in _MASK_DTYPES for name in names):
            return
        raise _data_dependent(f"{where} indexes by a boolean mask")
    raise _data_dependent(f"{where} calls {op}, whose output's size or value is read from "
                          "the data")


# ---------------------------------------------------------------- operators

_STRING_VALUES = {
    "approximate": {"none", "tanh"}, "rounding_mode": {"trunc", "floor"},
    "reduce": {"sum", "prod", "mean", "amax", "amin", "add", "multiply"},
    "padding": {"same", "valid"}, "side": {"left", "right"}, "indexing": {"ij", "xy"},
    "mode": {"constant", "reflect", "replicate", "circular", "reduced", "complete", "r"},
    "pad_mode": {"constant", "reflect", "replicate", "circular"},
    "norm": {"forward", "backward", "ortho"}, "ord": {"fro", "nuc"}, "p": {"fro", "nuc"},
    "interpolation": {"linear", "lower", "higher", "midpoint", "nearest"},
    "UPLO": {"L", "U"}, "driver": {"gels", "gelsy", "gelsd", "gelss", "gesvd", "gesvdj",
                                   "gesvda"},
}
"""String arguments of ATen operators, by name, and the values that select behaviour."""
_STRING_PATTERNS = {
    "equation": re.compile(r"[A-Za-z.,\- >]{1,200}\Z"),  # einsum
    "assert_msg": re.compile(r"[^\x00-\x1f\x7f\u2028\u2029\x85]{0,2000}\Z"),  # runtime asserts
}
_TYPE_KINDS = {
    "TensorType": {"as_tensor", "as_int", "as_float", "as_bool", "as_sym_int", "as_sym_float",
                   "as_sym_bool"},  # a number where a tensor goes is a wrapped scalar
    "IntType": {"as_int", "as_sym_int"},
    "SymIntType": {"as_int", "as_sym_int"}, "FloatType": {"as_float", "as_sym_float"},
    "SymFloatType": {"as_float", "as_sym_float"}, "BoolType": {"as_bool", "as_sym_bool"},
    "SymBoolType": {"as_bool", "as_sym_bool"}, "ComplexType": {"as_complex"},
    "NumberType": {"as_int", "as_float", "as_bool", "as_sym_int", "as_sym_float",
                   "as_sym_bool", "as_complex"},
    "StringType": {"as_string"}, "ScalarTypeType": {"as_scalar_type"},
    "LayoutType": {"as_layout"}, "MemoryFormatType": {"as_memory_format"},
    "DeviceObjType": {"as_device"},
}
"""Kinds a value of each schema type may be serialized as; other types (Generator, Storage,
Stream, Dict, Any, type variables) take no value from a file."""
_LIST_OF = {"as_tensor": "as_tensors", "as_int": "as_ints", "as_sym_int": "as_sym_ints",
            "as_float": "as_floats", "as_sym_float": "as_sym_floats", "as_bool": "as_bools",
            "as_sym_bool": "as_sym_bools"}
_OPERATOR = re.compile(r"torch\.ops\.(aten|prims)\.([a-z_][a-z0-9_]*)\.([A-Za-z0-9_]+)\Z")
_SYMBOLIC_OPS = {f"_operator.{name}": getattr(operator, name) for name in (
    "eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv", "mod",
    "truediv", "and_", "or_")} | {"math.trunc": math.trunc} | {
    f"torch.{name}": getattr(torch, name) for name in (
        "sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_sqrt")}
"""Integer arithmetic on sizes (no powers or shifts: 2 ** n is a compute bomb)."""
_HOP_PREFIX = "torch.ops.higher_order."
_OPERANDS = frozenset({"as_tensor", "as_sym_int", "as_sym_float", "as_sym_bool"})
_GRAPH = frozenset({"as_graph"})
_HIGHER_ORDER = {
    "wrap_with_set_grad_enabled": (frozenset({"as_bool"}), _GRAPH),
    "wrap_with_autocast": (frozenset({"as_string"}), frozenset({"as_scalar_type", "as_none"}),
                           frozenset({"as_bool"}), frozenset({"as_bool", "as_none"}), _GRAPH),
    "cond": (frozenset({"as_tensor", "as_sym_bool", "as_bool"}), _GRAPH, _GRAPH,
             frozenset({"as_tensors"})),
    "map_impl": (_GRAPH, frozenset({"as_tensors"}), frozenset({"as_tensors"})),
    "scan": (_GRAPH, frozenset({"as_tensors"}), frozenset({"as_tensors"}),
             frozenset({"as_tensors"})),
}
"""Higher-order ops: the kinds of their positional arguments, then tensor operands. Their
callables are subgraphs of the archive; each runs once, or once per slice of its inputs.
`while_loop` is not here: nothing bounds how often it runs."""


def _kinds_of(schema_type: Any) -> frozenset[str]:
    """Argument kinds a value of this operator-schema type may have in the file."""
    kind = schema_type.kind()
    if kind == "OptionalType":
        inner = _kinds_of(schema_type.getElementType())
        return inner | {"as_none"} | ({"as_optional_tensor"} if "as_tensor" in inner else set())
    if kind == "ListType":
        element = schema_type.getElementType()
        if element.kind() == "TensorType":
            return frozenset({"as_tensors"})
        if element.kind() == "OptionalType" and element.getElementType().kind() == "TensorType":
            return frozenset({"as_optional_tensors", "as_tensors"})
        return frozenset(_LIST_OF[k] for k in _kinds_of(element) if k in _LIST_OF)
    return frozenset(_TYPE_KINDS.get(kind, ()))


def _string_allowed(name: str, value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if name in _STRING_PATTERNS:
        return bool(_STRING_PATTERNS[name].match(value))
    return value in _STRING_VALUES.get(name, ())


def _operator_inputs(op: Any, inputs: list, where: str) -> None:
    """Each input names an argument of the op's schema and has a kind of its declared type."""
    arguments = {argument.name: argument for argument in op._schema.arguments}
    seen = set()
    for item in inputs:
        _fields(item, where, ("name", "arg"), ("kind",))
        name = item["name"]
        if not isinstance(name, str) or name not in arguments or name in seen:
            raise _refuse(f"{where} passes an argument {str(name)[:40]!r} that its schema does "
                          "not have")
        seen.add(name)
        if item.get("kind") not in (None, 1, 2):
            raise _refuse(f"{where} passes {name!r} in an unknown way")
        declared = arguments[name].real_type
        kinds = _kinds_of(declared)
        arg = item["arg"]
        kind = next(iter(arg)) if isinstance(arg, dict) and len(arg) == 1 else None
        if kind == "as_string" and "as_string" in kinds:
            if not _string_allowed(name, arg[kind]):
                raise _refuse(f"{where} passes the string {str(arg[kind])[:40]!r} as {name!r}")
        elif kind in _LIST_KINDS and arg[kind] == [] and declared.kind() in (
                "ListType", "OptionalType"):
            pass  # torch writes an empty list under a kind of its choosing
        else:
            _argument(arg, f"the argument {name!r} of {where} (declared {declared})",
                      kinds - {"as_string"})


