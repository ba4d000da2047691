"""Load a user's trained classifier from a path or from uploaded bytes, safely.

The format is recognised from the content, not the file name:
- torch.export archives (`.pt2`, the recommended format): loaded with `torch.export.load` and
  restored with `torch.export.unflatten`, so every layer keeps its dotted name;
- state dicts (`torch.save(model.state_dict())` as `.pt`/`.pth`, or `.safetensors`) plus an
  architecture: a JSON/YAML description (`attribution.inputs.architectures`) or, only with
  `trust_code=True`, a Python file that defines the model;
- whole pickled modules (`torch.save(model)`): only with `trust_code=True`;
- TorchScript archives are refused with the re-export recipe (ScriptModules cannot be hooked).

Safety: with `trust_code=False` (the default, and the only mode a remote visitor gets) no
input file can run code. Pickles are read with `torch.load(weights_only=True)`, PyTorch's
restricted unpickler that rebuilds tensors and plain containers only; safetensors and JSON/YAML
(`yaml.safe_load`) are data formats; uploaded Python is never executed.

A `.pt2` is checked by `attribution.inputs.untrusted.export_guard` (the security boundary,
with its threat model) before `torch.export.load` reads it.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import re
import sys
import struct
import uuid
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Optional, Sequence, Union

import torch
from torch import nn

from .architectures import Architecture, is_description, parse_architecture
from ..errors import AttributionError, out_of_memory, reading
from .untrusted.export_guard import EXPORT_RECIPE, check_export_archive
from ..engine.guards import eval_mode
from .untrusted.limits import DEFAULT_LIMITS, MB, Limits, over_budget
from ..engine.layers import LayerInfo, list_layers, run_logits
from ..engine.model_io import MASK_NAME, NamedInputs, OutputKey, describe, select_output, to_model
from . import huggingface
from ..methods.scores import model_device

MAX_UPLOAD_BYTES = 200 * 1024 * 1024
"""Default size limit for a model or data file (`max_bytes=` overrides it per call)."""

Source = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]

@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A classifier ready for scoring.

    Attributes:
        module: the model in eval mode; returns logits [B, n_classes] for inputs [B, *input_shape].
        input_shape: shape of one sample, without the batch dim, e.g. (64,) or (1, 8, 8).
        n_classes: number of logits.
        class_names: one name per class, or None.
        source_format: "torch.export", "state dict", "safetensors", "pickled module" or
            "Hugging Face".
        input_dtype: dtype of the example input (int64 for a model of token ids).
        input_names: for a model called with keywords (transformers), the names it takes,
            each [B, *input_shape] (`model_io.NamedInputs`); () for a model of one tensor.
        output: where the logits are in the model's output (`model_io.select_output`);
            None = the default rule. Declared for the module on construction.
        tokenizer: for a Hugging Face folder with a tokenizer.json, its
            `huggingface.TextEncoder` (texts -> input_ids, attention_mask and tokens).
    """

    module: nn.Module
    input_shape: tuple[int, ...]
    n_classes: int
    class_names: Optional[tuple[str, ...]] = None
    source_format: str = ""
    input_dtype: torch.dtype = torch.float32
    input_names: tuple[str, ...] = ()
    output: OutputKey = None
    tokenizer: Any = None

    def __post_init__(self):
        if self.output is not None:
            select_output(self.module, self.output)

    def example_input(self, batch: int = 1):
        """Zeros [batch, *input_shape] in the model's input dtype; for named inputs one such
        tensor per name (an attention mask of ones)."""
        zeros = torch.zeros((batch,) + self.input_shape, dtype=self.input_dtype)
        if not self.input_names:
            return zeros
        return NamedInputs({name: torch.ones_like(zeros) if name == MASK_NAME else zeros
                            for name in self.input_names})

    def layers(self) -> list[LayerInfo]:
        """`list_layers` of the module, found with the example input."""
        return list_layers(self.module, to_model(self.example_input(), self.module,
                                                 model_device(self.module)))


# ---------------------------------------------------------------- reading and sniffing

def read_source(source: Source, *, max_bytes: Optional[int] = None, what: str = "file"
                ) -> tuple[bytes, str]:
    """(content, display name) of a path, bytes or binary file object, within the size limit."""
    limit = MAX_UPLOAD_BYTES if max_bytes is None else max_bytes
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), f"the uploaded {what}"
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise AttributionError(f"No such {what} file: {path}.")
        if path.stat().st_size > limit:
            raise _too_large(path.name, path.stat().st_size, limit)
        data, name = path.read_bytes(), path.name
    elif hasattr(source, "getvalue") or hasattr(source, "read"):
        data = source.getvalue() if hasattr(source, "getvalue") else source.read(limit + 1)
        if not isinstance(data, (bytes, bytearray)):
            raise AttributionError(f"The {what} must be opened in binary mode ('rb').")
        data, name = bytes(data), str(getattr(source, "name", f"the uploaded {what}"))
    else:
        raise AttributionError(f"A {what} must be a path, bytes or a binary file object; got "
                               f"{type(source).__name__}.")
    if len(data) > limit:
        raise _too_large(name, len(data), limit)
    if not data:
        raise AttributionError(f"{name} is empty (0 bytes); upload the file again.")
    return data, name


def _too_large(name: str, size: int, limit: int) -> AttributionError:
    return AttributionError(
        f"{name} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB limit. Raise the "
        "limit (max_bytes=..., or the app's start-up setting) on your own machine, or use the "
        "command line with a memory-mapped .npy for large data.")


_MAGIC = (  # (prefix, format) for formats recognised only to explain what they are
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"), (b"\x1f\x8b", "a gzip archive"), (b"BZh", "a bzip2 archive"),
    (b"\x89HDF", "an HDF5 file (Keras .h5?)"), (b"7z\xbc\xaf", "a 7-zip archive"),
)


def sniff(data: bytes) -> str:
    """The container format of `data` from its first bytes.

    Returns one of "zip", "pickle", "safetensors", "npy", "parquet", "text", or a phrase such
    as "a PNG image" for a recognised format that is neither a model nor data.
    """
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if data[:4] == b"PAR1":
        return "parquet"
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return "pickle"
    if len(data) > 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8:
        return "safetensors"
    for prefix, description in _MAGIC:
        if data.startswith(prefix):
            return description
    sample = data[:4096]
    try:
        sample.decode("utf-8")
        return "text"
    except UnicodeDecodeError as error:
        if error.start >= len(sample) - 3 and len(data) > len(sample):
            return "text"  # a multi-byte character cut by the 4 KiB sample
    return "binary"


def open_zip(data: bytes, limits: Optional[Limits] = None) -> zipfile.ZipFile:
    """A checked zip archive: its entry count and the unpacked sizes its directory declares
    within `limits` (before any entry is read), then every entry inflated once, in 1 MB
    steps, and refused as soon as it yields more than it declares, or when its size or CRC
    differ at the end."""
    limits = limits or DEFAULT_LIMITS
    with reading("The file looks like a zip archive but is damaged or truncated"):
        end_record = zipfile._EndRecData(io.BytesIO(data))  # the directory's own entry count
        if end_record is None:
            raise AttributionError("The zip archive is damaged or truncated (it has no "
                                   "directory); upload the file again.")
        if end_record[zipfile._ECD_ENTRIES_TOTAL] > limits.max_archive_entries:
            raise AttributionError(over_budget(
                "The zip archive lists", f"{end_record[zipfile._ECD_ENTRIES_TOTAL]:,} entries",
                f"{limits.max_archive_entries:,}", "max_archive_entries"))
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
        names = [entry.filename for entry in entries]
        if len(set(names)) != len(names):
            raise AttributionError("The zip archive lists an entry twice; it is damaged or "
                                   "crafted. Save the file again.")
        unpacked = sum(entry.file_size for entry in entries)
        if unpacked > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                "The zip archive unpacks to", f"{unpacked / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        for entry in entries:
            _verify_entry(data, entry)
    return archive


_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... name length, extra length


def _verify_entry(data: bytes, entry: zipfile.ZipInfo) -> None:
    """Inflate one entry from the archive's bytes, stopping as soon as it exceeds the size
    it declares; its size and CRC must then match the directory."""
    if entry.flag_bits & 0x1 or entry.compress_type not in (zipfile.ZIP_STORED,
                                                            zipfile.ZIP_DEFLATED):
        raise AttributionError(f"The zip entry {entry.filename[:80]!r} is encrypted or uses "
                               "a compression other than deflate; save the file again with "
                               "numpy or torch.")
    fields = _LOCAL_HEADER.unpack_from(data, entry.header_offset)
    if fields[0] != b"PK\x03\x04":
        raise AttributionError(f"The zip entry {entry.filename[:80]!r} has no local header; "
                               "the archive is damaged. Upload the file again.")
    start = entry.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
    packed = memoryview(data)[start:start + entry.compress_size]
    produced, crc, finished = len(packed), zlib.crc32(packed), len(packed) == entry.file_size
    if entry.compress_type == zipfile.ZIP_DEFLATED:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        produced, crc, pending = 0, 0, packed
        while True:
            chunk = inflater.decompress(pending, 1 << 20)
            produced, crc = produced + len(chunk), zlib.crc32(chunk, crc)
            if produced > entry.file_size:
                raise AttributionError(
                    f"The zip entry {entry.filename[:80]!r} unpacks to more than the "
                    f"{entry.file_size:,} bytes its header declares; the archive is damaged "
                    "or crafted, and was not unpacked further.")
            pending = inflater.unconsumed_tail
            if inflater.eof or not (pending or chunk):
                break
        finished = inflater.eof
    if len(packed) != entry.compress_size or not finished or produced != entry.file_size \
            or crc != entry.CRC:
        raise AttributionError(f"The zip archive is damaged (entry {entry.filename[:80]!r} is "
                               "truncated or fails its checksum); upload the file again.")


def zip_kind(archive: zipfile.ZipFile) -> str:
    """"torch.export", "torchscript", "torch.save", "npz" or "zip" (something else)."""
    names = archive.namelist()
    roots = {name.split("/", 1)[0] for name in names}
    inner = {name.split("/", 1)[1] for name in names if "/" in name} if len(roots) == 1 else set()
    if "archive_format" in inner:
        return "torch.export"
    if "constants.pkl" in inner or any(name.startswith("code/") for name in inner):
        return "torchscript"
    if "data.pkl" in inner:
        return "torch.save"
    if names and all(name.endswith(".npy") for name in names):
        return "npz"
    return "zip"


_TENSOR_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                            torch.bool})


def check_tensor(tensor: torch.Tensor, what: str) -> None:
    """Refuse, by name, tensors that are not dense CPU numbers (sparse, quantized, meta,
    nested; complex or exotic dtypes)."""
    if tensor.is_quantized:
        kind = f"quantized ({tensor.dtype})"
    elif tensor.layout != torch.strided:
        kind = f"sparse ({tensor.layout})"
    elif getattr(tensor, "is_nested", False):
        kind = "nested"
    elif tensor.is_meta or tensor.device.type != "cpu":
        kind = f"a {tensor.device.type} tensor without data" if tensor.is_meta \
            else f"on {tensor.device.type}"
    elif tensor.dtype not in _TENSOR_DTYPES:
        kind = f"of dtype {tensor.dtype}"
    else:
        return
    raise AttributionError(
        f"{what} is {kind}; only dense CPU tensors of real numbers are read. Save a plain "
        "tensor instead, e.g. tensor.to_dense() / tensor.dequantize() / tensor.float().")


_CONTAINERS = (dict, list, tuple, set, frozenset)


def pickled_size(value: Any, limits: Limits, what: str = "This .pt file") -> tuple[int, int]:
    """(values, decoded bytes) of an unpickled value, within `limits`.

    A shared reference counts as often as it is reached (as `np.asarray` would copy it),
    with each container's cost computed once, so the walk is linear in the pickle's size.
    Tensors are checked with `check_tensor` and count numel x itemsize bytes.
    """
    costs: dict[int, tuple[int, int]] = {}  # id of a container -> (values, bytes)
    open_ids: set[int] = set()

    def children_of(item: Any) -> Optional[list]:
        if isinstance(item, dict):
            return [*item.keys(), *item.values()]
        return list(item) if isinstance(item, _CONTAINERS) else None

    def leaf_cost(item: Any) -> tuple[int, int]:
        if isinstance(item, torch.Tensor):
            check_tensor(item, f"A tensor in {what[0].lower() + what[1:]}")
            return 1, item.numel() * item.element_size()
        return 1, 4 * len(item) if isinstance(item, (str, bytes)) else 8

    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        children = children_of(item)
        if children is None:
            costs[key] = leaf_cost(item)  # only the root can be a leaf here
        elif children_done:
            open_ids.discard(key)
            values, size = 1, 0
            for child in children:
                child_values, child_size = (costs[id(child)] if isinstance(child, _CONTAINERS)
                                            else leaf_cost(child))
                values, size = values + child_values, size + child_size
            costs[key] = values, size
            if values > limits.max_pickle_nodes:
                raise AttributionError(over_budget(
                    f"{what} expands (counting shared references) to", f"{values:,} values",
                    f"{limits.max_pickle_nodes:,}", "max_pickle_nodes")
                    + " Save the data as tensors rather than nested lists.")
            if size > limits.max_decoded_bytes:
                raise AttributionError(over_budget(
                    f"{what} decodes to", f"{size / MB:,.0f} MB",
                    f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        elif key in open_ids:
            raise AttributionError(f"{what} holds a list or dict that contains itself; save "
                                   "plain tensors, lists or dicts.")
        elif key not in costs:
            open_ids.add(key)
            stack.append((item, True))
            pending = {id(child): child for child in children
                       if isinstance(child, _CONTAINERS) and id(child) not in costs}
            for child in pending.values():
                if id(child) in open_ids:
                    raise AttributionError(f"{what} holds a list or dict that contains "
                                           "itself; save plain tensors, lists or dicts.")
                stack.append((child, False))
    return costs[id(value)]


# ---------------------------------------------------------------- torch.export archives

def _load_export(data: bytes, limits: Limits) -> tuple[nn.Module, Any, dict[str, bytes]]:
    """(unflattened module, example input or None, extra files) of a .pt2; the example is
    `NamedInputs` for a program of several inputs."""
    extra_files = check_export_archive(data, limits)
    try:
        with reading("torch.export could not load this .pt2 archive"):
            program = torch.export.load(io.BytesIO(data))
            module = torch.export.unflatten(program)
    except AttributionError as error:
        raise AttributionError(f"{error} Re-export the model with torch {torch.__version__} on "
                               f"your own machine:\n{EXPORT_RECIPE}") from error
    example = None
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
            example = args[0]
        else:
            names = [spec.arg.name for spec in program.graph_signature.input_specs
                     if spec.kind.name == "USER_INPUT"]
            values = {**dict(zip(names, args)), **kwargs}
            if len(values) != len(args) + len(kwargs) or not all(
                    isinstance(value, torch.Tensor) for value in values.values()):
                raise AttributionError(
                    "This model's inputs are not all tensors [batch, ...]; the tool needs a "
                    "forward() that takes one tensor or several named tensors (e.g. "
                    "input_ids, attention_mask) and returns logits.")
            example = NamedInputs(values)
    return module, example, extra_files


# ---------------------------------------------------------------- pickles and state dicts

def check_pickle_size(data: bytes, limits: Limits) -> None:
    """Refuse a torch.save file whose pickle (data.pkl, or the whole file in the legacy
    format) is over `limits.max_pickle_bytes`, before the slow unpickler reads it."""
    size = len(data)
    if sniff(data) == "zip":
        with reading("The .pt file is damaged"):
            size = max((entry.file_size for entry in zipfile.ZipFile(io.BytesIO(data)).infolist()
                        if entry.filename.endswith("/data.pkl")), default=0)
    if size > limits.max_pickle_bytes:
        raise AttributionError(over_budget(
            "The .pt file's pickle is", f"{size / MB:,.1f} MB",
            f"{limits.max_pickle_bytes / MB:,.1f} MB", "max_pickle_bytes")
            + " Such a pickle holds many small tensors or long Python lists: save a few "
            "large tensors instead, e.g. torch.save({'inputs': torch.tensor(x)}, path).")


def _torch_load(data: bytes, trust_code: bool, limits: Limits) -> Any:
    """Unpickle a torch.save file: weights only, or anything when `trust_code`."""
    if not trust_code:
        check_pickle_size(data, limits)
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(error))))
        if "Unsupported global" not in str(error) and "GLOBAL" not in str(error):
            raise AttributionError(f"The checkpoint is damaged or not a PyTorch file "
                                   f"({str(error).splitlines()[0][:200]}).") from None
        if not trust_code:
            raise AttributionError(
                "This checkpoint contains pickled Python objects"
                + (f" ({', '.join(found)})" if found else "")
                + ", e.g. a whole model saved with torch.save(model). Unpickling it can run "
                "arbitrary code, so it is refused here. Either save only the weights "
                "(torch.save(model.state_dict(), 'weights.pt')) and describe the architecture, "
                f"or export the model, which needs no code to load:\n{EXPORT_RECIPE}\n"
                "On your own machine, for a file you made yourself, trust_code=True loads it."
            ) from None
    except Exception as error:
        raise AttributionError(f"The checkpoint could not be read; it is damaged or not a "
                               f"PyTorch file ({type(error).__name__}: "
                               f"{str(error).strip()[:200]}).") from None
    with reading("The checkpoint could not be unpickled even with trust_code=True "
                  "(a class it needs may not be importable here)"):
        return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


def _state_dict_of(obj: Any, limits: Limits) -> dict[str, torch.Tensor]:
    """The state dict in a checkpoint: the object itself, or its one dict of tensors."""
    def is_state(value: Any) -> bool:
        return (isinstance(value, dict) and bool(value)
                and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                        for k, v in value.items()))

    if is_state(obj):
        state = obj
    elif isinstance(obj, dict):
        candidates = {str(k): v for k, v in obj.items() if is_state(v)}
        preferred = [k for k in ("state_dict", "model_state_dict", "model") if k in candidates]
        if len(candidates) == 1 or preferred:
            state = candidates[preferred[0] if preferred else next(iter(candidates))]
        else:
            raise AttributionError(
                "This checkpoint is a dict without one clear state dict (found "
                f"{len(candidates)} dicts of tensors among keys {', '.join(map(str, obj))[:200]})."
                " Save model.state_dict() alone.")
    else:
        raise AttributionError(f"This checkpoint holds a {type(obj).__name__}, not a model or "
                               f"a state dict. Save model.state_dict() or export the model:\n"
                               f"{EXPORT_RECIPE}")
    for prefix in ("module.", "_orig_mod."):  # DataParallel / torch.compile wrappers
        if all(key.startswith(prefix) for key in state):
            state = {key[len(prefix):]: value for key, value in state.items()}
    for key, value in state.items():
        check_tensor(value, f"Tensor {key[:80]!r} of the state dict")
    as_float = sum(value.numel() * 4 for value in state.values())
    if as_float > limits.max_decoded_bytes:
        raise AttributionError(over_budget(
            "The state dict's weights take", f"{as_float / MB:,.0f} MB as float32",
            f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
    return {key: value.float() if value.is_floating_point() else value
            for key, value in state.items()}


def load_safetensors(data: bytes, limits: Limits) -> dict[str, torch.Tensor]:
    from safetensors.torch import load as load_safetensors

    with reading("The .safetensors file is damaged or truncated"):
        state = load_safetensors(data)
    if not state:
        raise AttributionError("The .safetensors file holds no tensors.")
    return _state_dict_of(state, limits)


def _shape_text(tensor: torch.Tensor) -> str:
    return str(list(tensor.shape))


def _fill(module: nn.Module, state: dict[str, torch.Tensor], hint: str = "") -> None:
    """Load `state` into `module`, or say exactly which keys and shapes differ."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    different = [k for k in expected if k in state and expected[k].shape != state[k].shape]
    if missing or unexpected or different:
        def listing(keys: Sequence[str], source: dict) -> str:
            shown = ", ".join(f"{k} {_shape_text(source[k])}" for k in keys[:6])
            return shown + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")

        parts = []
        if missing:
            parts.append(f"missing from the file: {listing(missing, expected)}")
        if unexpected:
            parts.append(f"in the file but not in the architecture: {listing(unexpected, state)}")
        if different:
            parts.append("different shapes: " + ", ".join(
                f"{k} file {_shape_text(state[k])} vs architecture {_shape_text(expected[k])}"
                for k in different[:6]))
        raise AttributionError("The state dict does not match the architecture; "
                               + "; ".join(parts) + "." + hint)
    with reading("The weights could not be copied into the model"):
        module.load_state_dict(state, strict=True, assign=True)


def _names_hint(architecture: Architecture, state: dict[str, torch.Tensor]) -> str:
    """A "names" list that would make the description match the file, when one exists."""
    prefixes = list(dict.fromkeys(key.rsplit(".", 1)[0] for key in state))
    if architecture.names is not None or any("." in p or not p for p in prefixes):
        return ""
    kinds = architecture.module_kinds()
    with_weights = [i for i, kind in enumerate(kinds) if kind in ("Linear", "Conv2d")]
    if len(with_weights) != len(prefixes):
        return ""
    names = [f"{kind.lower()}{i}" for i, kind in enumerate(kinds)]
    for index, prefix in zip(with_weights, prefixes):
        names[index] = prefix
    if len(set(names)) != len(names):
        return ""
    renamed = replace(architecture, names=tuple(names)).build(device="meta").state_dict()
    if renamed.keys() != state.keys() or any(renamed[k].shape != state[k].shape for k in state):
        return ""
    return f' If only the names differ, add "names": {json.dumps(names)} to the description.'


def _module_for_state(state: dict[str, torch.Tensor], architecture: Any, trust_code: bool,
                      limits: Limits) -> tuple[nn.Module, Optional[Architecture]]:
    """Build the architecture and load the state dict into it."""
    if architecture is None:
        listing = ", ".join(f"{k} {_shape_text(v)}" for k, v in list(state.items())[:4])
        raise AttributionError(
            f"This file is a state dict (weights only: {len(state)} tensors, e.g. {listing}). "
            "Also give its architecture: a JSON/YAML description (see "
            "demo/digits_mlp_architecture.json), or on your own machine the Python file that "
            "defines the model with trust_code=True. Or export the model, which needs neither:"
            f"\n{EXPORT_RECIPE}")
    if isinstance(architecture, nn.Module):
        _fill(architecture, state)
        return architecture, None
    if _is_python_file(architecture, trust_code):
        module = _module_from_python(architecture, trust_code)
        _fill(module, state)
        return module, None
    description = _description(architecture, trust_code, limits)
    module = description.build(device="meta")
    _fill(module, state, _names_hint(description, state))
    return module, description


def _description(architecture: Any, trust_code: bool, limits: Limits) -> Architecture:
    """The architecture description, parsed and within `limits`."""
    try:
        return parse_architecture(architecture, limits)
    except AttributionError as error:
        if isinstance(architecture, (bytes, bytearray)) and not trust_code:
            raise AttributionError(
                f"{error} If the architecture is a Python file, it can only be run with "
                "trust_code=True (a start-up setting for your own files on your own "
                "machine).") from None
        raise


def _is_python_file(architecture: Any, trust_code: bool) -> bool:
    if isinstance(architecture, (str, os.PathLike)) and str(architecture).endswith(".py"):
        return True
    return (trust_code and isinstance(architecture, (bytes, bytearray))
            and not is_description(bytes(architecture)))


def _module_from_python(source: Any, trust_code: bool) -> nn.Module:
    """Run a user's Python file (trust_code only) and build its model."""
    if not trust_code:
        raise AttributionError(
            "The architecture is Python code; running it is only allowed with trust_code=True "
            "(a start-up setting for your own files on your own machine). Without code, "
            "describe the model in JSON/YAML or export it:\n" + EXPORT_RECIPE)
    code, name = read_source(source, what="architecture")
    module_name = f"attribution_user_model_{uuid.uuid4().hex}"
    namespace = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(module_name, loader=None))
    namespace.__file__ = (str(Path(source).resolve()) if isinstance(source, (str, os.PathLike))
                          else name)
    sys.modules[module_name] = namespace
    try:
        with reading(f"Running {name} failed"):
            exec(compile(code, name, "exec"), namespace.__dict__)
        if callable(getattr(namespace, "build_model", None)):
            with reading(f"build_model() in {name} failed"):
                model = namespace.build_model()
        else:
            classes = [value for value in vars(namespace).values()
                       if isinstance(value, type) and issubclass(value, nn.Module)
                       and value.__module__ == module_name]
            if len(classes) != 1:
                raise AttributionError(
                    f"{name} defines {len(classes)} nn.Module classes; define a function "
                    "build_model() that returns the model.")
            with reading(f"{classes[0].__name__}() in {name} could not be built without "
                          "arguments; define build_model() that returns the model"):
                model = classes[0]()
    finally:
        sys.modules.pop(module_name, None)
    if not isinstance(model, nn.Module):
        raise AttributionError(f"build_model() in {name} returned a {type(model).__name__}, "
                               "not an nn.Module.")
    return model


# ---------------------------------------------------------------- the public entry point

def load_model(source: Source, *, architecture: Any = None,
               example_input: Union[torch.Tensor, Sequence[int], None] = None,
               class_names: Optional[Sequence[str]] = None, trust_code: bool = False,
               max_bytes: Optional[int] = None, limits: Optional[Limits] = None,
               sandbox: Optional[bool] = None, output: OutputKey = None) -> LoadedModel:
    """Load a classifier from a path or bytes; the format is detected from the content.

    Args:
        source: a .pt2 (torch.export), a state dict (.pt/.pth/.safetensors) or, with
            trust_code, a whole pickled module; a path, bytes or a binary file object.
        architecture: for state dicts: a description (dict, JSON/YAML text, bytes or path;
            see `attribution.inputs.architectures`), or with trust_code a Python file (path or
            bytes)
            that defines build_model() or one nn.Module class.
        example_input: one batch [B, ...] or the shape of one sample; needed only when the
            file does not tell (pickled modules and Python architectures of conv nets).
        class_names: one name per class (overrides names stored in the file).
        trust_code: allow unpickling Python objects and running Python files. Only for your
            own files on your own machine; never for uploads from others.
        max_bytes: size limit (default MAX_UPLOAD_BYTES).
        limits: decoding budgets and the first run's time and memory (default
            `limits.DEFAULT_LIMITS`).
        sandbox: load and run the model first in a child process with the first-run budget
            (`attribution.inputs.untrusted.watchdog`; about 0.1-0.5 s once its server runs, a
            few seconds to
            start it). Default: on for bytes and file objects (uploads), off for paths (your
            own files). Never used with trust_code or an nn.Module architecture, whose code
            is trusted anyway.
        output: where the logits are in the model's output (`model_io.select_output`).
    Returns:
        LoadedModel with the module in eval mode.
    """
    if huggingface.is_folder(source):  # a save_pretrained folder, its files or their zip
        if isinstance(source, (bytes, bytearray)) and sandbox is not False:  # an upload
            from .untrusted.watchdog import check_first_run

            check_first_run(bytes(source), class_names=class_names,
                            limits=limits or DEFAULT_LIMITS, output=output)
        return huggingface.load_folder(source, class_names=class_names, limits=limits,
                                       output=output)
    data, name = read_source(source, max_bytes=max_bytes, what="model")
    limits = limits or DEFAULT_LIMITS
    if sandbox is None:
        sandbox = not isinstance(source, (str, os.PathLike))
    try:
        kind = _model_kind(data, name, architecture, limits)
        if sandbox and not trust_code and not isinstance(architecture, nn.Module):
            from .untrusted.watchdog import check_first_run

            if architecture is not None and not _is_python_file(architecture, trust_code):
                architecture = _description(architecture, trust_code, limits)
            check_first_run(data, architecture=architecture, example_input=example_input,
                            class_names=class_names, limits=limits, output=output)
        return _load(data, kind, architecture, example_input, class_names, trust_code,
                     limits, output)
    except MemoryError as error:
        raise out_of_memory(name, error) from None


def _model_kind(data: bytes, name: str, architecture: Any, limits: Limits) -> str:
    """The model format of `data` ("torch.export", "torch.save", "pickle" or "safetensors"),
    from checks that read headers and directories only; refuses every other format."""
    kind = sniff(data)
    if kind == "zip":
        kind = zip_kind(open_zip(data, limits))
    if kind == "torchscript":
        raise _torchscript_error()
    if kind not in ("torch.export", "torch.save", "pickle", "safetensors"):
        raise AttributionError(f"{name} is {describe_kind(kind)}, not a model file. Upload a "
                               ".pt2 from torch.export (recommended), or a state dict with its "
                               f"architecture. To export:\n{EXPORT_RECIPE}")
    if architecture is not None and kind == "torch.export":
        raise AttributionError("architecture= is only used with state dicts; this file is "
                               f"{describe_kind(kind)}.")
    return kind


def _load(data: bytes, kind: str, architecture: Any, example_input: Any,
          class_names: Optional[Sequence[str]], trust_code: bool, limits: Limits,
          output: OutputKey = None) -> LoadedModel:
    """The model in `data` (of format `kind`), run on batches of 1 and 3 samples."""
    stored_names = None
    example = None
    state = None  # a state dict, for the architecture to take
    if kind == "torch.export":
        module, example, extra_files = _load_export(data, limits)
        if "class_names.json" in extra_files:
            with reading("extra/class_names.json in the .pt2 is not a JSON list of names"):
                stored_names = [str(n) for n in json.loads(extra_files["class_names.json"])]
        source_format = "torch.export"
    elif kind == "safetensors":
        state, source_format = load_safetensors(data, limits), "safetensors"
    else:
        loaded = _torch_load(data, trust_code, limits)
        if isinstance(loaded, nn.Module):
            module, source_format = loaded, "pickled module"
        else:
            state, source_format = _state_dict_of(loaded, limits), "state dict"
    if state is not None:
        module, description = _module_for_state(state, architecture, trust_code, limits)
        if description is not None:
            example = torch.zeros((2,) + description.input_shape)
            stored_names = description.class_names
    if example_input is not None:
        example = _example_from(example_input)
    if example is None:
        example = _guess_example(module)
    module.eval()
    return checked_model(module, example, source_format, class_names, stored_names, output)


def checked_model(module: nn.Module, example: Any, source_format: str,
                  class_names: Optional[Sequence[str]] = None,
                  stored_names: Optional[Sequence[str]] = None,
                  output: OutputKey = None) -> LoadedModel:
    """The LoadedModel of an eval-mode `module`, after runs on batches of 1 and 3 samples
    shaped like `example` ([B, ...] tensor, or `NamedInputs` of equally shaped entries)."""
    if isinstance(example, NamedInputs):
        signatures = {(tuple(value.shape[1:]), value.dtype) for value in example.values()}
        if len(signatures) != 1:
            raise AttributionError(f"The model's named inputs must share one sample shape and "
                                   f"dtype (e.g. input_ids and attention_mask [T]); got "
                                   f"{describe(example)}.")
        first = next(iter(example.values()))
        input_names = tuple(example.keys())
    else:
        first, input_names = example, ()
    select_output(module, output)
    loaded = LoadedModel(module=module, input_shape=tuple(int(s) for s in first.shape[1:]),
                         n_classes=0, source_format=source_format, input_dtype=first.dtype,
                         input_names=input_names, output=output)
    n_classes = _check_runs(loaded, source_format == "torch.export")
    names = class_names if class_names is not None else stored_names
    if names is not None and len(names) != n_classes:
        raise AttributionError(f"There are {len(names)} class names but the model has "
                               f"{n_classes} outputs.")
    return replace(loaded, n_classes=n_classes,
                   class_names=tuple(str(n) for n in names) if names is not None else None)


def describe_kind(kind: str) -> str:
    return {
        "npz": "a NumPy .npz data file", "npy": "a NumPy .npy array", "zip": "a zip archive "
        "that is not a PyTorch checkpoint", "parquet": "a Parquet table", "text": "a text file",
        "binary": "an unrecognised binary file", "torch.export": "a torch.export program",
        "torchscript": "a TorchScript archive",
    }.get(kind, kind)


def _torchscript_error() -> AttributionError:
    return AttributionError(
        "This is a TorchScript file (torch.jit.save). PyTorch does not allow forward hooks on "
        "ScriptModules, so its neurons cannot be scored. From the original Python model, "
        f"export it instead:\n{EXPORT_RECIPE}")


def _example_from(example_input: Union[torch.Tensor, Sequence[int]]) -> torch.Tensor:
    if isinstance(example_input, torch.Tensor):
        if example_input.dim() < 2:
            raise AttributionError("example_input is a batch [B, ...]; for one sample of shape "
                                   "S pass the shape S as a tuple instead.")
        return torch.zeros((2,) + tuple(example_input.shape[1:]), dtype=example_input.dtype)
    try:
        shape = tuple(int(s) for s in example_input)
    except (TypeError, ValueError):
        raise AttributionError("example_input must be a tensor [B, ...] or the shape of one "
                               "sample, e.g. (1, 8, 8).") from None
    if not shape or min(shape) < 1:
        raise AttributionError(f"example_input shape {shape} must have positive sizes.")
    return torch.zeros((2,) + shape)


def _guess_example(module: nn.Module) -> torch.Tensor:
    first = next((m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d))), None)
    if isinstance(first, nn.Linear):
        return torch.zeros(2, first.in_features)
    raise AttributionError("The input shape of this model is unknown; pass example_input= "
                           "with the shape of one sample, e.g. (1, 28, 28).")


def _check_runs(loaded: LoadedModel, exported: bool) -> int:
    """Run batches of 1 and 3 samples; the number of classes. Explains a fixed batch size."""
    module = loaded.module
    with eval_mode(module), torch.no_grad():
        logits = None
        for batch in (1, 3):
            probe = loaded.example_input(batch)
            try:
                logits = run_logits(module, probe)
            except AttributionError as error:
                if exported and "shape[0]" in str(error):
                    raise AttributionError(
                        f"This .pt2 cannot run a batch of {batch} sample(s): it was exported "
                        "with a fixed or limited batch size. Re-export it with a dynamic batch "
                        f"dimension:\n{EXPORT_RECIPE}") from None
                raise
            if logits.shape[0] != batch:
                raise AttributionError(f"The model returned {logits.shape[0]} rows of logits "
                                       f"for {batch} samples; it must return one per sample.")
    return int(logits.shape[1])
