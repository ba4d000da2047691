"""A small type system for the program's JSON: fields, numbers, names, symbolic shapes,
tensor metadata and operator arguments, each checked where it is read."""
from __future__ import annotations

import keyword
import re
from typing import Any

import torch

from .common import _data_dependent, _refuse


# ---------------------------------------------------------------- JSON schema helpers

_DTYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64,
           6: torch.float16, 7: torch.float32, 8: torch.float64, 9: torch.complex32,
           10: torch.complex64, 11: torch.complex128, 12: torch.bool, 13: torch.bfloat16,
           28: torch.uint16, 29: torch.float8_e4m3fn, 30: torch.float8_e5m2,
           31: torch.float8_e4m3fnuz, 32: torch.float8_e5m2fnuz, 33: torch.float8_e8m0fnu,
           34: torch.uint32, 35: torch.uint64}
"""schema.ScalarType -> dtype; UNKNOWN (0) is not a dtype."""
_STRIDED = 7
_LAYOUTS = {_STRIDED}
_MEMORY_FORMATS = {1, 2, 3, 4}
_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu"})


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEGMENT = r"""[^."'\\,;\x00-\x1f\x7f\x85\u2028\u2029]+"""
_DOTTED = re.compile(_SEGMENT + r"(\." + _SEGMENT + r")*\Z")
"""Module paths: "0.1", ModuleDict keys such as "conv 1"; fx writes a name that is not an
identifier into generated source as getattr(module, "name"), so no quotes or backslashes."""
_MODULE_ATTRIBUTES = frozenset(dir(torch.nn.Module)) | {"training"}
_RESERVED = frozenset({"torch", "self", "fx_pytree", "pytree", "math", "operator", "builtins"})
_INT64 = 2 ** 63


def _fields(value: Any, where: str, required: tuple[str, ...],
            optional: tuple[str, ...] = ()) -> dict:
    """`value` is an object with exactly these fields (optional ones may be missing)."""
    if not isinstance(value, dict):
        raise _refuse(f"{where} is not a JSON object")
    unknown = sorted(str(key) for key in value if key not in required + optional)
    if unknown:
        raise _refuse(f"{where} has fields the schema does not know "
                      f"({', '.join(k[:40] for k in unknown[:5])})")
    missing = [key for key in required if key not in value]
    if missing:
        raise _refuse(f"{where} lacks {', '.join(missing)}")
    return value


def _one_of(value: Any, where: str, kinds: tuple[str, ...] | frozenset[str]) -> tuple[str, Any]:
    """The (kind, value) of a schema union: an object with exactly one allowed key."""
    if not isinstance(value, dict) or len(value) != 1:
        raise _refuse(f"{where} is not a single-kind value")
    (kind, inner), = value.items()
    if kind not in kinds:
        raise _refuse(f"{where} is of kind {str(kind)[:40]!r}, which is not allowed there "
                      f"(allowed: {', '.join(sorted(kinds))})")
    return kind, inner


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _refuse(f"{where} is not a list")
    return value


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _refuse(f"{where} is not a JSON object")
    return value


def _int(value: Any, where: str) -> int:
    if type(value) is not int or not -_INT64 <= value < _INT64:
        raise _refuse(f"{where} is not a 64-bit integer")
    return value


def _number(value: Any, where: str) -> float:
    """A float or int; torch writes non-finite floats as these strings."""
    if (type(value) is float or type(value) is int and -_INT64 <= value < _INT64
            or value in ("Infinity", "-Infinity", "NaN")):
        return value
    raise _refuse(f"{where} is not a number")


def _bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise _refuse(f"{where} is not true or false")
    return value


def _name(value: Any, where: str) -> str:
    """A value name that fx may write into generated Python source."""
    if (not isinstance(value, str) or not _IDENTIFIER.match(value) or keyword.iskeyword(value)
            or value.startswith("__") and value.endswith("__") or value in _RESERVED):
        raise _refuse(f"the value name {str(value)[:40]!r} in {where} is not an identifier")
    return value


def _dotted(value: Any, where: str, empty: bool = False) -> str:
    """A module path or parameter name. Unflattening calls or reads what a path names, so no
    part may name something every module has (`forward`, `__class__`, `apply`, ...): no
    module can own a child or parameter of such a name."""
    if not isinstance(value, str) or not (_DOTTED.match(value) or empty and value == ""):
        raise _refuse(f"the module path {str(value)[:40]!r} in {where} is not a dotted name")
    taken = next((part for part in value.split(".") if part in _MODULE_ATTRIBUTES), None)
    if taken is not None:
        raise _refuse(f"the module path {value[:40]!r} in {where} names {taken!r}, which "
                      "every module has")
    return value


def _text(value: Any, where: str, line_breaks: bool = False) -> str:
    """Free text that fx may copy into a comment of generated source: no line breaks there."""
    allowed = "\n\t" if line_breaks else "\t"
    if not isinstance(value, str) or any(
            (ord(c) < 32 and c not in allowed) or c in "\x7f\u2028\u2029\x85" for c in value):
        raise _refuse(f"{where} contains line breaks or control characters")
    return value


# ---------------------------------------------------------------- symbolic shapes

_UNBACKED = re.compile(r"(u|zuf)\d+\Z")
"""torch's names of sizes and numbers read from the data (`SymT.UNBACKED_INT`, `_FLOAT`)."""

_SHAPE_FUNCTIONS = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Mod", "Max", "Min", "Abs", "Eq",
    "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "true", "false", "True", "False", "oo",
    "Equality", "Unequality", "GreaterThan", "LessThan", "StrictGreaterThan",
    "StrictLessThan",  # the relations' class names, as srepr writes them (a BART's guards)
    "FloorDiv", "CleanDiv", "CeilDiv", "ModularIndexing", "PythonMod", "Where", "FloorToInt",
    "CeilToInt", "TruncToInt", "TruncToFloat", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity", "IntTrueDiv", "FloatTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "integer", "positive", "negative", "nonnegative", "nonpositive", "real", "finite",
})
_SHAPE_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|'(?P<quoted>[A-Za-z_][A-Za-z0-9_]*)'"
    r"|\d+(?:\.\d+)?|==|!=|<=|>=|//|[-+*/%(),=<>])")
_SYMBOL = re.compile(r"[a-z]+\d{1,6}\Z")
_MAX_EXPRESSION = 2000


def _shape_expression(text: Any, where: str) -> None:
    """Only sympy constructors, symbol names and arithmetic: what torch.export itself writes."""
    if not isinstance(text, str) or len(text) > _MAX_EXPRESSION or "**" in text:
        raise _refuse(f"a shape expression in {where} is too long or uses powers")
    position = 0
    while position < len(text.rstrip()):
        match = _SHAPE_TOKEN.match(text, position)
        if match is None:
            raise _refuse(f"a shape expression contains {text[position:position + 20]!r}")
        name = match.group("name") or match.group("quoted")
        if name and name not in _SHAPE_FUNCTIONS and not _SYMBOL.match(name):
            raise _refuse(f"a shape expression uses the name {name!r}")
        if name and _UNBACKED.match(name):
            raise _data_dependent(f"its graph has the size {name}, read from the data")
        position = match.end()


def _symbolic(value: Any, where: str, concrete: str) -> None:
    """A SymInt / SymFloat / SymBool: a constant (`concrete` kind) or an expression."""
    kind, inner = _one_of(value, where, ("as_expr", concrete))
    if kind == concrete:
        _CONSTANTS[concrete](inner, where)
        return
    _fields(inner, where, ("expr_str",), ("hint",))
    _shape_expression(inner["expr_str"], where)
    if inner.get("hint") is not None:
        hint_kind, hint = _one_of(inner["hint"], where, ("as_int", "as_bool", "as_float"))
        _CONSTANTS[hint_kind](hint, where)


_CONSTANTS = {"as_int": _int, "as_float": _number, "as_bool": _bool}


def _tensor_meta(meta: Any, where: str) -> None:
    _fields(meta, where, ("dtype", "sizes", "requires_grad", "device", "strides",
                          "storage_offset", "layout"))
    if type(meta["dtype"]) is not int or meta["dtype"] not in _DTYPES:
        raise _refuse(f"{where} has no known dtype")
    if type(meta["layout"]) is not int or meta["layout"] not in _LAYOUTS:
        raise _refuse(f"{where} is a sparse or MKL-DNN tensor (convert it with .to_dense())")
    for key in ("sizes", "strides"):
        for item in _list(meta[key], where):
            _symbolic(item, where, "as_int")
    _symbolic(meta["storage_offset"], where, "as_int")
    _bool(meta["requires_grad"], where)
    _device(meta["device"], where)


def _device(value: Any, where: str) -> None:
    _fields(value, where, ("type",), ("index",))
    if not isinstance(value["type"], str) or value["type"] not in _DEVICES:
        raise _refuse(f"{where} names the device {str(value['type'])[:20]!r}")
    if value.get("index") is not None:
        _int(value["index"], where)


# ---------------------------------------------------------------- arguments

def _tensor_ref(value: Any, where: str) -> None:
    _name(_fields(value, where, ("name",))["name"], where)


def _sym_ref(concrete: str):
    def check(value: Any, where: str) -> None:
        kind, inner = _one_of(value, where, ("as_name", concrete))
        (_name if kind == "as_name" else _CONSTANTS[concrete])(inner, where)
    return check


def _optional_tensor(value: Any, where: str) -> None:
    kind, inner = _one_of(value, where, ("as_tensor", "as_none"))
    (_tensor_ref if kind == "as_tensor" else _bool)(inner, where)


def _enum(codes: Any):
    def check(value: Any, where: str) -> None:
        if type(value) is not int or value not in codes:
            raise _refuse(f"{where} is not a known dtype, layout or memory format")
    return check


def _complex(value: Any, where: str) -> None:
    _fields(value, where, ("real", "imag"))
    _number(value["real"], where), _number(value["imag"], where)


def _each(check):
    def check_list(value: Any, where: str) -> None:
        for item in _list(value, where):
            check(item, where)
    return check_list


_ARGUMENTS = {
    "as_none": _bool, "as_tensor": _tensor_ref, "as_tensors": _each(_tensor_ref),
    "as_int": _int, "as_ints": _each(_int), "as_float": _number, "as_floats": _each(_number),
    "as_bool": _bool, "as_bools": _each(_bool),
    "as_sym_int": _sym_ref("as_int"), "as_sym_ints": _each(_sym_ref("as_int")),
    "as_sym_float": _sym_ref("as_float"), "as_sym_floats": _each(_sym_ref("as_float")),
    "as_sym_bool": _sym_ref("as_bool"), "as_sym_bools": _each(_sym_ref("as_bool")),
    "as_scalar_type": _enum(_DTYPES), "as_layout": _enum(_LAYOUTS),
    "as_memory_format": _enum(_MEMORY_FORMATS), "as_device": _device,
    "as_optional_tensor": _optional_tensor, "as_optional_tensors": _each(_optional_tensor),
    "as_complex": _complex,
}
"""Argument kinds that hold only data, with the check of their value. `as_string` and
`as_graph` are allowed only where the operator says so; every other kind of the schema
(`as_operator`, `as_custom_obj`, `as_strings`, nested lists, dicts) is refused."""
_REFUSED_KINDS = {
    "as_operator": "an operator argument (a name torch resolves and calls)",
    "as_custom_obj": "a custom (script) object",
}
_LIST_KINDS = frozenset(kind for kind in _ARGUMENTS if kind.endswith("s"))
_VALUE_KINDS = frozenset({"as_tensor", "as_sym_int", "as_sym_float", "as_sym_bool", "as_int",
                          "as_float", "as_bool", "as_none"})
_NODE_OUTPUT_KINDS = _VALUE_KINDS | {"as_tensors", "as_sym_ints", "as_sym_floats",
                                     "as_sym_bools", "as_ints", "as_floats", "as_bools",
                                     "as_optional_tensors"}


def _argument(value: Any, where: str, kinds: frozenset[str]) -> tuple[str, Any]:
    """Check one schema Argument whose kind must be in `kinds` (data kinds only)."""
    if isinstance(value, dict) and len(value) == 1:
        kind = next(iter(value))
        if kind in _REFUSED_KINDS:
            raise _refuse(f"{where} is {_REFUSED_KINDS[kind]}")
    kind, inner = _one_of(value, where, kinds)
    _ARGUMENTS[kind](inner, where)
    return kind, inner
