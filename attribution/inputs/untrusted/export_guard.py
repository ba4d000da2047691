"""The `.pt2` boundary: an uploaded torch.export archive is checked here before torch reads it.

Threat model. Whoever uploads a `.pt2` controls every byte of it: the zip layout, the program
(`models/model.json`), the payload configs, the tensor records, the pickled sample inputs and the
extra files. `torch.export.load` is not safe on such bytes (its docstring says so). Reading torch
2.13's loader (`torch/export/pt2_archive/_package.py`, `torch/_export/serde/serialize.py`), it
- resolves names by `getattr` from `torch`, `math` and `operator`: node targets, `as_operator`
  argument values and `source_fn_stack` metadata; whatever callable it finds becomes a call in
  the graph (a sympy Function class reached through `torch.utils._sympy` as the callable of
  `wrap_with_set_grad_enabled` evals an `as_string` argument when the model runs);
- parses every symbolic shape (`expr_str`) with `sympy.sympify`, which calls `eval`;
- unpickles: payloads marked `use_pickle` (`torch.load(weights_only=False)`), custom objects
  (`torch._C._pickle_load_obj`), opaque objects (`pickle.loads`), sample inputs whenever the
  `weights_only=True` load fails, and the legacy layout it falls back to on any RuntimeError;
- imports modules named in treespec contexts (`"__enum__"`, defaultdict factories), keeps
  `guards_code` (Python that `ExportedProgram.module()` execs), regenerates Python source from
  node names and metadata, and runs `cond`/`map_impl`/`scan`/`while_loop` on callables;
- allocates what the archive declares: an empty weight record becomes `torch.zeros` of its
  declared shape, a deflated record its declared size, and a range-constraint key `u<n>` makes
  it count to n.

What passes (deny by default; anything else is an `AttributionError` with the re-export
recipe, before torch reads a byte):
- the entries `torch.export.save` writes, listed alike by torch's zip reader and Python's (so
  the legacy fallback finds nothing), unpacking within `limits.max_decoded_bytes`;
- tensor records exactly as long as their tensors' declared dtype x shape x strides span, all
  tensors within `limits.max_decoded_bytes`; strided layout, known dtypes and devices; no
  tensor the graph declares (at the example's sizes) over that budget either;
- sample inputs: a torch.save zip whose pickle (under 4 MB) names only tensor rebuilders and
  which holds plain CPU tensors ((args...), {name: tensor}); extra files under 4 MB;
- every JSON record (under 64 MB and 500,000 values) validated field by field against the
  schema of an ordinary export, unknown fields and kinds refused;
- node targets: ATen/prims operators (looked up in the registry first), integer arithmetic on
  sizes (no powers or shifts), and the higher-order ops `wrap_with_set_grad_enabled`,
  `wrap_with_autocast`, `cond`, `map_impl`, `scan` (bounded by their inputs) whose callables
  are subgraphs of the same archive; `while_loop` is refused (nothing bounds it);
- only work whose sizes follow the input shapes, so that the first run, at the batch size
  used, measures what every later batch costs: operators whose output's size or value is
  read from the data (tagged `dynamic_output_shape` or `data_dependent_output`: nonzero,
  masked_select, unique, .item(), indexing by a boolean mask), sizes torch reads from the
  data (symbols u<n>, zuf<n>) and a `cond` on a tensor's value are refused;
- operator arguments of the kinds their schema declares (tensors, numbers, symbolic numbers,
  dtypes, layouts, devices, memory formats, their lists); strings only for the schema's
  string arguments with known values (`reduce`, `approximate`, `rounding_mode`, `padding`,
  an einsum equation, ...); `as_operator` and custom (script) objects nowhere;
- shape expressions of sympy constructors, symbol names and arithmetic, a million characters
  at most (sympy parses each one every time torch meets it); range-constraint
  symbols with at most 6 digits; guards that compare input sizes (`L['x'].size()[0] == 2`);
- treespecs of builtin containers or transformers outputs with plain-JSON contexts; metadata
  as text: no carriage returns (stack traces may hold line feeds), module paths as dotted
  names, `source_fn_stack` resolving through already-loaded modules only, `from_node` and
  `custom` as plain JSON; verifiers ATEN or TRAINING.
"""
from __future__ import annotations

import io
import json
import keyword
import math
import operator
import pickletools
import re
import types
from typing import Any

import torch

from ...errors import AttributionError, reading
from .files import zip_directory
from .limits import DEFAULT_LIMITS, Limits, over_budget
from .pickles import unpickle

EXPORT_RECIPE = (
    "    ep = torch.export.export(model.eval(), (example_batch,),\n"
    "                             dynamic_shapes=({0: torch.export.Dim('batch')},))\n"
    "    torch.export.save(ep, 'model.pt2')\n"
    "(example_batch: a few real samples, at least 2, shaped like the model's input.)"
)
MAX_PROGRAM_BYTES = 64 * 2 ** 20
"""Largest JSON record (the program, a payload config)."""
MAX_EXTRA_BYTES = 4 * 2 ** 20
"""Largest total of extra files (class names, metadata) and of the sample inputs' pickle."""
MAX_EXPRESSION_CHARS = 1_000_000
"""Most characters of shape expressions in a program: sympy parses each (2-6 us a character)
every time torch meets it; an exported transformer has tens of thousands."""
MAX_PROGRAM_VALUES = 500_000
"""Most JSON values in one record. torch turns each into a dataclass at about 80 us (a BERT
layer is about 6,000 values), so this bounds its parsing near 40 s and json's memory."""
MAX_SUBGRAPH_DEPTH = 16

# ---------------------------------------------------------------- the archive

_ENTRIES = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/model\.json|data/weights/model_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/model_constants_config\.json|data/constants/tensor_\d+"
    r"|data/sample_inputs/model\.pt|extra/[A-Za-z0-9_.\-]+)\Z")
_SMALL_ENTRIES = ("archive_format", "archive_version", "byteorder", ".data/version",
                  ".data/serialization_id")
_PAYLOADS = (("data/weights", "model_weights_config.json", "weight_"),
             ("data/constants", "model_constants_config.json", "tensor_"))
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_SAMPLE_ENTRIES = re.compile(r"(data\.pkl|\.format_version|\.storage_alignment|byteorder"
                             r"|data/\d+|version|\.data/serialization_id|\.data/version)\Z")
_SAMPLE_GLOBALS = re.compile(r"(torch\._utils\._rebuild_tensor_v2|collections\.OrderedDict"
                             r"|torch\.[A-Za-z0-9]*Storage)\Z")


def check_export_archive(data: bytes, limits: Limits = DEFAULT_LIMITS) -> dict[str, bytes]:
    """Refuse a `.pt2` that could run code or exceed the budgets (see the module docstring).

    Args:
        data: the whole archive.
        limits: `max_decoded_bytes` bounds its tensors and its unpacked size.
    Returns:
        The extra files, name (without "extra/") -> bytes, read as torch reads them.
    """
    with reading("The .pt2 archive is damaged or truncated",
                 f"save it again with torch.export.save:\n{EXPORT_RECIPE}"):
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        records = list(reader.get_all_records())
        _check_layout(data, records, limits)
        sizes = {name: reader.get_record_size(name) for name in records}
        _within_budget("This .pt2 unpacks to", sum(sizes.values()), limits)
        for name in _SMALL_ENTRIES:
            if sizes.get(name, 0) > 64:
                raise _refuse(f"its entry {name} is {sizes[name]} bytes long")
        _check_versions(reader, records)
        weight_bytes = sum(_check_payloads(reader, sizes, *payload) for payload in _PAYLOADS)
        if sizes.get(_SAMPLE_INPUTS):
            _check_sample_inputs(reader.get_record(_SAMPLE_INPUTS), weight_bytes, limits)
        extras = {name: size for name, size in sizes.items() if name.startswith("extra/")}
        if sum(extras.values()) > MAX_EXTRA_BYTES:
            raise _refuse(f"its extra files take {_size(sum(extras.values()))}")
        program = _json_record(reader, sizes, "models/model.json")
        _check_program(program)
        _check_costs(program, limits)
        return {name[len("extra/"):]: reader.get_record(name) for name in extras}


def _within_budget(what: str, n_bytes: int, limits: Limits) -> None:
    if n_bytes > limits.max_decoded_bytes:
        raise AttributionError(over_budget(what, _size(n_bytes), _size(
            limits.max_decoded_bytes), "max_decoded_bytes"))


def _refuse(reason: str) -> AttributionError:
    return AttributionError(
        f"This .pt2 file was refused because {reason}; torch.export.save does not write this "
        "for an ordinary model, and loading it could run code or exhaust the machine. "
        f"Re-export the model with a plain torch.export on your own machine:\n{EXPORT_RECIPE}")


def _data_dependent(reason: str) -> AttributionError:
    return AttributionError(
        f"This .pt2 file was refused because {reason}: the sizes of its work depend on the "
        "data's values, not only on their shapes, so its cost cannot be measured before it "
        "runs on your data (a first run on one input can be cheap and the next one exhaust "
        "the machine). Export a model whose shapes follow its inputs' shapes (nonzero, "
        "masked_select, unique, boolean-mask indexing, .item() and branches on tensor values "
        "are what make them depend on values), or load your own file on your own machine "
        "without the jail (sandbox=False; --trust-code on the command line).")


_UNBACKED = re.compile(r"(u|zuf)\d+\Z")
"""torch's names of sizes and numbers read from the data (`SymT.UNBACKED_INT`, `_FLOAT`)."""
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


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.1f} MB"


def _check_layout(data: bytes, records: list[str], limits: Limits) -> None:
    """Only the entries torch.export.save writes, listed alike by torch's and Python's readers.

    torch.export.load falls back to a legacy reader (Python's zipfile, pickles included) when
    its own reader fails, so both must see the same entries under one folder.
    """
    names = zip_directory(data, limits).namelist()
    root = names[0].split("/", 1)[0] if names else ""
    if len(set(names)) != len(names) or sorted(names) != sorted(f"{root}/{r}" for r in records):
        raise _refuse("its zip directory lists entries twice or differently to different "
                      "readers")
    unexpected = sorted(name for name in records if not _ENTRIES.match(name))
    if unexpected:
        raise _refuse(f"it holds entries that torch.export.save does not write "
                      f"({', '.join(unexpected[:5])})")
    for name in ("models/model.json", "data/weights/model_weights_config.json",
                 "data/constants/model_constants_config.json"):
        if name not in records:
            raise AttributionError(
                f"This .pt2 archive is incomplete ({name} is missing; an AOTInductor package "
                f"holds no program). Save the ExportedProgram itself:\n{EXPORT_RECIPE}")


def _check_versions(reader: Any, records: list[str]) -> None:
    if (reader.get_record("archive_format") != b"pt2"
            or reader.get_record("archive_version") != b"0"):
        raise AttributionError("This .pt2 archive was written by an unsupported PyTorch "
                               f"version; re-export it with torch {torch.__version__}:\n"
                               f"{EXPORT_RECIPE}")
    if "byteorder" in records and reader.get_record("byteorder") != b"little":
        raise _refuse("its tensors are stored big-endian")


def _json_record(reader: Any, sizes: dict[str, int], name: str) -> Any:
    if sizes[name] > MAX_PROGRAM_BYTES:
        raise _refuse(f"its {name} is {_size(sizes[name])}, over {_size(MAX_PROGRAM_BYTES)}")
    text = reader.get_record(name)
    values = text.count(b",") + text.count(b"[") + text.count(b"{")  # at least the values
    if values > MAX_PROGRAM_VALUES:
        raise _refuse(f"its {name} holds about {values:,} values, over {MAX_PROGRAM_VALUES:,}")
    return json.loads(text)


# ---------------------------------------------------------------- tensors and sample inputs

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


def _check_payloads(reader: Any, sizes: dict[str, int], folder: str, config_name: str,
                    prefix: str) -> int:
    """Validate one payload config; every record's size must be what its tensors declare.

    Returns:
        the bytes its tensor records take.
    """
    config = _fields(_json_record(reader, sizes, f"{folder}/{config_name}"), config_name,
                     ("config",))["config"]
    views: dict[str, list[tuple[str, Any]]] = {}  # record -> the tensors stored in it
    for fqn, entry in _mapping(config, config_name).items():
        where = f"the payload {fqn[:60]!r}"
        _dotted(fqn, where)
        _fields(entry, where, ("path_name", "is_param", "use_pickle", "tensor_meta"))
        _bool(entry["is_param"], where)
        if entry["use_pickle"] is not False:
            raise _refuse(f"{where} is stored as pickled Python objects (a custom object or "
                          "tensor subclass)")
        path = entry["path_name"]
        if not isinstance(path, str) or not re.fullmatch(prefix + r"\d+", path):
            raise _refuse(f"{where} is stored under {str(path)[:40]!r}")
        _tensor_meta(entry["tensor_meta"], where)
        views.setdefault(path, []).append((where, entry["tensor_meta"]))
    stored = {name.rsplit("/", 1)[1]: size for name, size in sizes.items()
              if name.startswith(folder + "/" + prefix)}
    orphans = sorted(stored.keys() - views.keys())
    if orphans:
        raise _refuse(f"its record {folder}/{orphans[0]} belongs to no tensor")
    for path, tensors in views.items():
        if path not in stored or not stored[path] and any(
                math.prod(_concrete(s, where) for s in meta["sizes"]) for where, meta in tensors):
            raise AttributionError(f"The .pt2 archive is missing tensor data it declares "
                                   f"({folder}/{path}); save it again with torch.export.save.")
        extent = max(_stored_extent(meta, where) for where, meta in tensors)
        if stored[path] != extent:
            raise _refuse(f"its record {folder}/{path} holds {stored[path]} bytes where its "
                          f"tensors' dtype and shape need {extent}")
    return sum(stored.values())


def _stored_extent(meta: dict, where: str) -> int:
    """Bytes a stored tensor spans: (offset + sum((size - 1) * stride) + 1) * element size."""
    sizes, strides = ([_concrete(s, where) for s in meta[key]] for key in ("sizes", "strides"))
    offset = _concrete(meta["storage_offset"], where)
    if len(sizes) != len(strides):
        raise _refuse(f"{where} has {len(sizes)} sizes but {len(strides)} strides")
    if 0 in sizes:
        return 0
    span = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1
    return span * _DTYPES[meta["dtype"]].itemsize


def _concrete(value: Any, where: str) -> int:
    _, number = _one_of(value, where, ("as_int",))
    if _int(number, where) < 0:
        raise _refuse(f"{where} has a negative size or stride")
    return number


def _check_sample_inputs(data: bytes, weight_bytes: int, limits: Limits) -> None:
    """Sample inputs are a torch.save zip of plain tensors: ((tensors...), {name: tensor});
    their storages and the `weight_bytes` of the weights within `limits` before reading."""
    archive = zip_directory(data, limits)
    entries = archive.infolist()
    root = entries[0].filename.split("/", 1)[0] if entries else ""
    names = [entry.filename[len(root) + 1:] for entry in entries]
    if (not all(entry.filename.startswith(root + "/") for entry in entries)
            or len(set(names)) != len(names) or not all(map(_SAMPLE_ENTRIES.match, names))):
        raise _refuse("its sample inputs hold entries that torch.save does not write")
    storage_bytes = sum(e.file_size for e, n in zip(entries, names) if n.startswith("data/"))
    if sum(entry.file_size for entry in entries) - storage_bytes > MAX_EXTRA_BYTES:
        raise _refuse("its sample inputs hold an oversized pickle")
    _within_budget("The tensors of this .pt2 take", weight_bytes + storage_bytes, limits)
    _check_pickle_globals(archive.read(f"{root}/data.pkl"))
    try:
        loaded = unpickle(data, limits, what="The sample inputs")
    except AttributionError:
        raise _refuse("its sample inputs are not plain tensors") from None
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], tuple)
            and isinstance(loaded[1], dict)):
        raise _refuse("its sample inputs are not (args, kwargs)")
    for value in (*loaded[0], *loaded[1].values()):
        if type(value) is not torch.Tensor or value.layout != torch.strided or (
                value.is_quantized or value.device.type != "cpu"):
            raise _refuse("its sample inputs are not plain CPU tensors")


def _check_pickle_globals(pickled: bytes) -> None:
    """Only tensor rebuilders may be named, so even an unrestricted unpickler runs nothing else."""
    strings: list[str] = []
    for opcode, argument, _ in pickletools.genops(pickled):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(argument)
            continue
        if opcode.name in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
            continue
        if opcode.name == "GLOBAL":
            name = argument.replace(" ", ".")
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            name = f"{strings[-2]}.{strings[-1]}"
        elif opcode.name in ("STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4"):
            raise _refuse(f"its sample inputs use the pickle opcode {opcode.name}")
        else:
            strings.clear()
            continue
        if not _SAMPLE_GLOBALS.match(name):
            raise _refuse(f"its sample inputs name the Python object {name[:60]!r}")
        strings.clear()


# ---------------------------------------------------------------- JSON schema helpers

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
