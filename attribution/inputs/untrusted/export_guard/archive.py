"""The archive's layout: the entries torch.export.save writes, their versions, the tensor
records and their declared sizes, the sample inputs' pickle, and the JSON records."""
from __future__ import annotations

import json
import math
import pickletools
import re
from typing import Any

import torch

from ....errors import AttributionError
from ..files import zip_directory
from ..limits import Limits
from ..pickles import unpickle
from .common import (EXPORT_RECIPE, MAX_EXTRA_BYTES, MAX_PROGRAM_BYTES, MAX_PROGRAM_VALUES, _refuse,
                     _size, _within_budget)
from .schema import _DTYPES, _bool, _dotted, _fields, _int, _mapping, _one_of, _tensor_meta


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
