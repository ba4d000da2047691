"""A user's data file read into a `Dataset`, in the jail (`load_data`): the formats below,
detected from content, each parsed within `untrusted.limits`.

- `.npz` / `.pt` (a tensor, a dict of arrays/tensors, or an (inputs, labels[, clusters])
  tuple; read with `allow_pickle=False` / the weights-only `untrusted.pickles.unpickle`):
  inputs of any shape [N, ...] under "inputs" (or x, X, data, images, features), optional
  "labels" (y, targets, target), "clusters" (cluster), "cluster_names" (names indexed by
  integer cluster ids), "feature_names" and "class_names";
- `.npy`: inputs only;
- `.csv` / `.parquet`: one row per sample; a label column (label, labels, target, y, class),
  an optional cluster column (cluster, clusters, group) and numeric feature columns (all the
  others unless `features=` names them).
"""
from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import replace
from typing import Any, BinaryIO, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from ..errors import AttributionError, out_of_memory, reading, reads_input
from ..engine.model_io import NamedInputs
from .untrusted.limits import DEFAULT_LIMITS, MB, Limits, held_bytes, over_budget
from .huggingface import TextEncoder
from .untrusted import jail
from .untrusted.files import (Source, describe_kind, open_path, open_zip, read_source, sniff,
                              zip_kind)
from .untrusted.pickles import pickled_size, unpickle
from .tasks import READ_DATA

from .data import Dataset, as_array

MAX_ROWS = 200_000
"""Default limit on samples held in memory (`max_rows=` overrides it per call)."""
READ_STEP = 1 << 24
"""Bytes of an array read from a file at a time (16 MB)."""

_INPUT_KEYS = ("inputs", "x", "X", "data", "images", "features")
_LABEL_KEYS = ("labels", "label", "y", "targets", "target", "class")
_CLUSTER_KEYS = ("clusters", "cluster", "group")


@reads_input("data file")
def load_data(source: Source, *, features: Union[str, Sequence[str], None] = None,
              label: Optional[str] = None, cluster: Optional[str] = None,
              max_bytes: Optional[int] = None, max_rows: Optional[int] = None,
              limits: Optional[Limits] = None, tokenizer: Any = None,
              image_shape: Union[str, Sequence[int], None] = None,
              sandbox: Optional[bool] = None, input_names: Sequence[str] = ()) -> Dataset:
    """Load samples from a path or bytes; the format is detected from the content.

    Args:
        source: .npz, .npy, .pt, .csv or .parquet; a path, bytes or a binary file object.
        features: the inputs key (.npz/.pt) or the feature columns (.csv/.parquet);
            detected when None (every other column, but for the row index that pandas'
            `to_csv` writes by default: a first column without a header, of distinct
            integers).
        label: the labels key or column; detected when None ("" for none).
        cluster: the cluster key or column; detected when None ("" for none).
        max_bytes: file size limit (default `limits.MAX_UPLOAD_BYTES`).
        max_rows: sample limit (default MAX_ROWS); larger data goes through the streaming
            path (an iterable of batches or a memory-mapped .npy passed to the scores).
        limits: decoding budgets (default `limits.DEFAULT_LIMITS`: 2 GB decoded, 100k
            columns), checked before memory is allocated.
        tokenizer: a text model's `LoadedModel.tokenizer`: a .csv/.parquet text column
            (`features`, else the one text column) becomes input_ids and attention_mask,
            with the tokens kept (`Dataset.tokens`).
        image_shape: draw each sample as an image of this shape, (H, W) or (C, H, W) or
            "8x8" (a table of pixels); replaces an `image_shape` array of a .npz/.pt.
        sandbox: read (and tokenize) the file in the jail (`untrusted.jail`), which hands
            back plain arrays; this process never parses the file. Default: on, for paths
            too (a file someone sent you is as untrusted as an upload); sandbox=False for
            your own files.
        input_names: the model's own input names (`LoadedModel.input_names`, e.g.
            pixel_values): looked for first among a .npz's or .pt's arrays, before the
            usual names (inputs, x, ...), when `features` does not choose.
    Returns:
        Dataset.
    """
    limit = MAX_ROWS if max_rows is None else max_rows
    limits = limits or DEFAULT_LIMITS
    if sandbox is False:
        data, name = read_source(source, max_bytes=max_bytes, what="data")
        dataset = _load_data(data, name, features, label, cluster, limit, limits, tokenizer,
                             tuple(input_names))
    else:  # a path is read by the jail's child: its bytes never enter this process
        if not isinstance(source, (str, os.PathLike)):
            source = read_source(source, max_bytes=max_bytes, what="data")
        dataset = _jailed(source, features, label, cluster, max_bytes, limit, limits,
                          tokenizer, tuple(input_names))
    return dataset if image_shape is None else replace(dataset, image_shape=image_shape)


READ_BYTES_PER_SECOND = 25 * MB
"""How fast the jail must read a data file: its time budget is `first_run_seconds` plus the
file's size at this rate."""
_FIELDS = ("labels", "clusters", "tokens")  # the Dataset fields that cross back as arrays


def _jailed(source: Union[str, os.PathLike, tuple[bytes, str]], features, label, cluster,
            max_bytes: Optional[int], limit: int, limits: Limits,
            tokenizer: Optional[TextEncoder], input_names: tuple[str, ...] = ()) -> Dataset:
    """`_load_data` in the jail on a path or on (bytes, name) already read; the Dataset
    rebuilt here from its plain arrays and facts."""
    size = len(source[0]) if isinstance(source, tuple) else _size_of(source)
    budget = jail.Budget(
        seconds=limits.first_run_seconds + size / READ_BYTES_PER_SECOND,
        memory_bytes=limits.first_run_memory_bytes + 2 * limits.max_decoded_bytes,
        file_bytes=limits.max_decoded_bytes + MB,
        work="Reading" + (" and tokenizing" if tokenizer is not None else "") + " the data",
        name="reading an untrusted file")
    answer = jail.check(READ_DATA, {
        "source": source if isinstance(source, tuple) else os.path.abspath(source),
        "max_bytes": max_bytes, "features": features, "label": label, "cluster": cluster,
        "limit": limit, "limits": limits, "input_names": input_names,
        "tokenizer": None if tokenizer is None else tokenizer.plain()}, budget)
    facts, arrays = answer.facts, answer.arrays
    names = facts.get("input_names")
    inputs = (NamedInputs({key: torch.from_numpy(arrays[f"inputs/{key}"]) for key in names})
              if names is not None else torch.from_numpy(arrays["inputs"]))
    return Dataset(inputs=inputs, **{key: _tensor_or_text(arrays.get(key))
                                     for key in _FIELDS},
                   **{key: facts.get(key) for key in ("feature_names", "class_names",
                                                      "image_shape")})


def _size_of(path: Union[str, os.PathLike]) -> int:
    """The size of the file at `path` in bytes (0 where it cannot be read: the jail says
    why)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tensor_or_text(array: Optional[np.ndarray]) -> Any:
    """An array handed back by the jail as the Dataset field it was: numbers as a tensor."""
    return array if array is None or array.dtype.kind == "U" else torch.from_numpy(array)


@reads_input("data file")
def _read_in_jail(source: Union[str, tuple[bytes, str]], max_bytes: Optional[int], features,
                  label, cluster, limit: int, limits: Limits, tokenizer: Optional[dict],
                  input_names: tuple[str, ...] = ()) -> dict:
    """In the jail's child: the data file (a path, or bytes and their name) read as
    `load_data` reads it, as plain facts and arrays (`jail.Task`)."""
    encoder = None if tokenizer is None else TextEncoder.from_plain(tokenizer)
    if isinstance(source, tuple):
        dataset = _load_data(*source, features, label, cluster, limit, limits, encoder,
                             input_names)
    else:
        with open_path(source, max_bytes=max_bytes, what="data") as stream:
            dataset = _load_data(stream, os.path.basename(source), features, label, cluster,
                                 limit, limits, encoder, input_names)
    arrays = {key: _plain_array(getattr(dataset, key)) for key in _FIELDS
              if getattr(dataset, key) is not None}
    facts: dict[str, Any] = {key: None if getattr(dataset, key) is None
                             else list(getattr(dataset, key))
                             for key in ("feature_names", "class_names", "image_shape")}
    if isinstance(dataset.inputs, NamedInputs):
        facts["input_names"] = list(dataset.inputs.keys())
        arrays.update({f"inputs/{key}": value.numpy() for key, value in dataset.inputs.items()})
    else:
        arrays["inputs"] = dataset.inputs.numpy()
    return dict(facts, arrays=arrays)


def _plain_array(value: Any) -> np.ndarray:
    """A Dataset field as a NumPy array of numbers or text."""
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _load_data(data: Union[bytes, BinaryIO], name: str, features, label, cluster,
               limit: int, limits: Limits, tokenizer: Any = None,
               input_names: tuple[str, ...] = ()) -> Dataset:
    """The Dataset in `data` (`_parse_data`), running out of memory as a message with the
    size that was asked for."""
    try:
        return _parse_data(data, name, features, label, cluster, limit, limits, tokenizer,
                           input_names)
    except MemoryError as error:
        raise out_of_memory(name, error) from None


def _parse_data(data: Union[bytes, BinaryIO], name: str, features, label, cluster,
                limit: int, limits: Limits, tokenizer: Any = None,
                input_names: tuple[str, ...] = ()) -> Dataset:
    """The Dataset in `data`: a file's bytes, or a binary file open on it, from which a
    .npz or .npy is read entry by entry straight into its arrays (no copy of the file)."""
    size = len(data) if isinstance(data, bytes) else os.fstat(data.fileno()).st_size
    kind = sniff(data if isinstance(data, bytes) else _head(data), size)
    if kind not in ("zip", "npy") and not isinstance(data, bytes):
        data = data.read()  # parsed whole by its reader anyway
    if kind == "zip":
        archive = open_zip(data, limits)
        kind = zip_kind(archive)
        if kind == "npz":
            arrays, budget = {}, limits.max_decoded_bytes  # shared by all the arrays
            for entry in archive.infolist():
                with reading(f"{entry.filename} in the .npz could not be read"), \
                        archive.open(entry) as stream:
                    array = _read_npy(stream, entry.file_size, entry.filename, limit, budget)
                arrays[entry.filename[:-4]] = array
                budget -= held_bytes(array.size, array.dtype.itemsize)
            return _from_arrays(arrays, features, label, cluster, input_names)
    if kind == "npy":
        stream = io.BytesIO(data) if isinstance(data, bytes) else data
        stream.seek(0)
        return Dataset(inputs=_shared(_read_npy(stream, size, name, limit,
                                                limits.max_decoded_bytes)))
    if not isinstance(data, bytes):  # a zip of another kind: its reader takes bytes
        data.seek(0)
        data = data.read()
    if kind in ("torch.save", "pickle"):
        return _from_torch(data, features, label, cluster, limit, limits, input_names)
    if kind == "parquet":
        return _from_frame(_read_parquet(data, limit, limits), features, label, cluster,
                           tokenizer, limits)
    if kind == "text":
        return _from_frame(_read_csv(data, limit, limits), features, label, cluster,
                           tokenizer, limits)
    raise AttributionError(f"{name} is {describe_kind(kind)}, not a data file. Upload .npz, .npy, "
                           ".pt, .csv or .parquet (see demo/README.md for the layouts).")


def _head(stream: BinaryIO) -> bytes:
    """The first 4 KiB of `stream`, for `sniff`; the stream is left at its start."""
    stream.seek(0)
    head = stream.read(4096)
    stream.seek(0)
    return head


def _too_many_rows(n: int, limit: int) -> AttributionError:
    return AttributionError(
        f"The data has {n} samples, over the in-memory limit of {limit}. Use a sample of it "
        "here, raise max_rows on your own machine, or score it in batches from the command "
        "line (a memory-mapped .npy or a DataLoader streams through the scores).")


_NPY_KINDS = {"c": "complex numbers", "M": "dates (datetime64)", "m": "durations (timedelta64)",
              "V": "structured records", "O": "Python objects (dtype=object)"}


def _read_npy(stream: BinaryIO, size: int, name: str, limit: int, budget: int
              ) -> np.ndarray:
    """One .npy array of `size` bytes from `stream`: its header's dtype, shape and byte count
    checked against the file's size, `limit` rows and `budget` bytes as the engine will hold
    it (`held_bytes`) before anything is allocated; big-endian data is converted to the
    machine's order."""
    with reading(f"{name} is not a valid .npy array"):
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(
            np.lib.format.read_magic(stream))
        if read_header is None:
            raise AttributionError(f"{name} uses an unsupported .npy format version; save it "
                                   "again with numpy.save.")
        shape, fortran, dtype = read_header(stream)
        header_size = stream.tell()
    if dtype.kind in _NPY_KINDS or dtype.hasobject:
        raise AttributionError(f"{name} holds {_NPY_KINDS.get(dtype.kind, _NPY_KINDS['O'])}, "
                               "which this tool does not read; save numbers (e.g. "
                               "array.astype(np.float32)), or names as np.array(names, "
                               "dtype=str).")
    count = math.prod(shape)
    if count * dtype.itemsize != size - header_size:
        raise AttributionError(f"{name} is truncated or damaged: its header declares "
                               f"{list(shape)} {dtype} but the data has {size - header_size} "
                               "bytes.")
    if held_bytes(count, dtype.itemsize) > budget:
        raise AttributionError(over_budget(
            f"{name} holds", f"{held_bytes(count, dtype.itemsize) / MB:,.0f} MB as float32"
            if dtype.itemsize < 4 else f"{count * dtype.itemsize / MB:,.0f} MB",
            f"{budget / MB:,.0f} MB", "max_decoded_bytes"))
    if shape and shape[0] > limit:
        raise _too_many_rows(shape[0], limit)
    body = bytearray(count * dtype.itemsize)  # filled READ_STEP at a time: a zip entry's
    view, filled = memoryview(body), 0         # readinto reads the whole entry, then copies
    with reading(f"{name} is truncated or damaged"):
        while filled < len(body):
            chunk = stream.read(min(len(body) - filled, READ_STEP))
            if not chunk:
                raise AttributionError(f"{name} is truncated: it ends after {filled} of "
                                       f"{len(body)} bytes of data.")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    array = np.frombuffer(body, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    if not dtype.isnative:
        array = array.byteswap(inplace=True).view(dtype.newbyteorder("="))
    return array


def _from_torch(data: bytes, features, label, cluster, limit: int, limits: Limits,
                input_names: tuple[str, ...] = ()) -> Dataset:
    loaded = unpickle(data, limits, what="This .pt file", remedy=(
        "Save tensors, or lists, tuples or a dict of them, e.g. torch.save({'inputs': "
        "torch.tensor(x), 'labels': torch.tensor(y)}, path)."))
    pickled_size(loaded, limits)
    if isinstance(loaded, torch.Tensor):
        loaded = {"inputs": loaded}
    elif isinstance(loaded, (tuple, list)) and 1 <= len(loaded) <= 3:
        loaded = dict(zip(("inputs", "labels", "clusters"), loaded))
    if not isinstance(loaded, dict):
        raise AttributionError(f"This .pt file holds a {type(loaded).__name__}; save a tensor "
                               "of inputs, an (inputs, labels) tuple or a dict of tensors.")
    arrays = {}
    for key, value in loaded.items():
        array = as_array(value, f"array {key!r}")
        if array.ndim and array.shape[0] > limit:
            raise _too_many_rows(array.shape[0], limit)
        arrays[str(key)] = array
    return _from_arrays(arrays, features, label, cluster, input_names)


def _pick(arrays: dict, wanted: Optional[str], candidates: Sequence[str], what: str,
          required: bool) -> Optional[str]:
    if wanted == "":
        return None
    if wanted is not None:
        if wanted not in arrays:
            raise AttributionError(f"There is no {what} {wanted!r}; available: "
                                   f"{', '.join(map(str, arrays))}.")
        return wanted
    found = next((key for key in candidates if key in arrays), None)
    if found is None and required:
        raise AttributionError(f"Could not find the {what}: name it one of "
                               f"{', '.join(candidates)}, or choose it (features=\"name\" in "
                               "Python, --features name on the command line; for a model of "
                               "several named inputs, input_names=loaded.input_names); "
                               f"available: {', '.join(map(str, arrays))}.")
    return found


def _from_arrays(arrays: dict[str, np.ndarray], features, label, cluster,
                 input_names: tuple[str, ...] = ()) -> Dataset:
    """The Dataset of a .npz's or .pt's arrays; the inputs are `features`, else the model's
    own `input_names` (several: named inputs), else the first of the usual names."""
    arrays = dict(arrays)
    image_shape = arrays.pop("image_shape", None)
    named = _named_input_keys(arrays, features, input_names)
    candidates = tuple(input_names) + tuple(k for k in _INPUT_KEYS if k not in input_names)
    inputs_key = None if named else _pick(arrays, features, candidates, "inputs array",
                                          required=len(arrays) != 1)
    if inputs_key is None and not named:
        inputs_key = next(iter(arrays))
    label_key = _pick(arrays, label, _LABEL_KEYS, "labels array", required=False)
    cluster_key = _pick(arrays, cluster, _CLUSTER_KEYS, "clusters array", required=False)
    clusters = arrays[cluster_key] if cluster_key else None
    if clusters is not None and "cluster_names" in arrays:
        names = np.asarray(arrays["cluster_names"]).astype(str)
        ids = np.asarray(clusters)
        if ids.dtype.kind not in "iu" or ids.min(initial=0) < 0 or ids.max(initial=0) >= len(names):
            raise AttributionError(f"cluster_names has {len(names)} names, so clusters must be "
                                   f"integer ids 0..{len(names) - 1}.")
        clusters = names[ids]

    def names_of(key: str):
        return None if key not in arrays else [str(v) for v in np.asarray(arrays[key]).ravel()]

    return Dataset(inputs={key: _shared(arrays[key], integers=True) for key in named} if named
                   else _shared(arrays[inputs_key]),
                   labels=arrays[label_key] if label_key else None, clusters=clusters,
                   feature_names=names_of("feature_names"), class_names=names_of("class_names"),
                   tokens=arrays.get("tokens"), image_shape=image_shape)


def _shared(array: np.ndarray, integers: bool = False) -> Any:
    """An array just read from a file as the tensor the Dataset holds, sharing its memory
    where it already has the dtype the Dataset keeps (float32; int64 for named inputs, when
    `integers`): a big file then costs its size once, not twice."""
    kept = (np.float32, np.int64) if integers else (np.float32,)
    if array.dtype in kept and array.dtype.isnative and array.flags.writeable:
        return torch.from_numpy(array)
    return array


def _named_input_keys(arrays: dict, features, input_names: tuple[str, ...] = ()) -> list[str]:
    """The arrays that are named model inputs: those listed in `features` (a list), else the
    model's own several `input_names` that the data holds (the first of them at least), else
    transformers' text inputs (input_ids, attention_mask, token_type_ids) when the data
    has input_ids and no plain inputs array; [] for one plain inputs array."""
    if features is not None and not isinstance(features, str):
        missing = [key for key in features if key not in arrays]
        if missing or not features:
            raise AttributionError(f"There is no array {', '.join(map(repr, missing))}; "
                                   f"available: {', '.join(map(str, arrays))}.")
        return list(features)
    held = [name for name in input_names if name in arrays]
    if features is None and len(input_names) > 1 and input_names[0] in arrays:
        return held
    if features is None and model_io.TEXT_INPUT in arrays \
            and not any(key in arrays for key in _INPUT_KEYS):
        return [key for key in model_io.TEXT_INPUTS if key in arrays]
    return []


def _read_csv(data: bytes, limit: int, limits: Limits) -> pd.DataFrame:
    _check_table_size(_csv_columns(data), min(data.count(b"\n") + 1, limit + 1), limits)
    with reading("The text file could not be read as a comma-separated table"):
        frame = pd.read_csv(io.BytesIO(data), nrows=limit + 1)
    if len(frame) > limit:
        raise _too_many_rows(len(frame), limit)
    if all(_is_number(column) for column in frame.columns):
        raise AttributionError("The CSV needs a header row naming its columns (e.g. "
                               "pixel_0,...,pixel_63,label); the first row holds numbers.")
    return frame


def _csv_columns(data: bytes) -> int:
    """Columns of a CSV's header record, parsed as CSV the way pandas will read it (a quoted
    field may hold commas and newlines, so the first line alone can hide columns); a field
    over the csv module's field size limit is refused, which bounds the work."""
    with reading("The CSV header could not be read"):
        text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace",
                                newline="")
        return len(next(csv.reader(text), []))


def _check_table_size(columns: int, rows: int, limits: Limits) -> None:
    """Refuse a table over the column budget, or whose values would decode (as float64)
    to more than the byte budget."""
    if columns > limits.max_features:
        raise AttributionError(over_budget("The table has", f"{columns:,} columns",
                                           f"{limits.max_features:,}", "max_features"))
    if rows * columns * 8 > limits.max_decoded_bytes:
        raise AttributionError(over_budget(
            "The table decodes to", f"{rows:,} rows x {columns:,} columns = "
            f"{rows * columns * 8 / MB:,.0f} MB", f"{limits.max_decoded_bytes / MB:,.0f} MB",
            "max_decoded_bytes"))


def _is_saved_index(frame: pd.DataFrame, column: str) -> bool:
    """The row index pandas writes by default (`to_csv` without index=False): a first
    column without a header, of distinct integers."""
    return (column == frame.columns[0] and column.startswith("Unnamed: ")
            and pd.api.types.is_integer_dtype(frame[column]) and frame[column].is_unique)


def _is_number(text: Any) -> bool:
    try:
        float(str(text))
        return True
    except ValueError:
        return False


def _check_text_cells(frame: pd.DataFrame, limits: Limits) -> None:
    """Refuse a text column whose longest cell, as long as every row (the room NumPy text
    arrays and Arrow's row selections reserve), exceeds the decoded budget."""
    for column in frame.columns:
        series = frame[column]
        if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
            continue
        values = (series.cat.categories if isinstance(series.dtype, pd.CategoricalDtype)
                  else series).astype(str)
        longest = int(values.str.len().max()) if len(values) else 0
        if longest * len(frame) > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                f"Column {column[:40]!r} has a cell of {longest:,} characters; at that width "
                f"its {len(frame):,} rows take", f"{longest * len(frame) / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))


def _is_text(arrow_type: Any) -> bool:
    import pyarrow as pa

    return any(check(arrow_type) for check in (pa.types.is_string, pa.types.is_binary,
                                               pa.types.is_large_string,
                                               pa.types.is_large_binary))


def _read_parquet(data: bytes, limit: int, limits: Limits) -> pd.DataFrame:
    """The table, its decoded size checked from the file's metadata before any column is
    read, and text columns' decoded size computed from their dictionaries (read as pandas
    categoricals, never decoded row by row)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with reading("The Parquet file is damaged or truncated"):
        metadata = pq.ParquetFile(io.BytesIO(data)).metadata
        if metadata.num_rows > limit:
            raise _too_many_rows(metadata.num_rows, limit)
        _check_table_size(metadata.num_columns, metadata.num_rows, limits)
        if metadata.num_row_groups > limits.max_row_groups:
            raise AttributionError(over_budget(
                "The Parquet file is written in", f"{metadata.num_row_groups:,} row groups",
                f"{limits.max_row_groups:,}", "max_row_groups")
                + " Or write it again with pandas' to_parquet, which writes one.")
        schema = pq.ParquetFile(io.BytesIO(data)).schema_arrow
        nested = [field for field in schema if pa.types.is_nested(field.type)]
        if nested:  # one value per cell, so the row count bounds every column
            raise AttributionError(f"Column {nested[0].name[:40]!r} holds {nested[0].type}; a "
                                   "table holds one number or name per cell.")
        decoded = sum(metadata.row_group(group).total_byte_size
                      for group in range(metadata.num_row_groups))
        if decoded > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                "The Parquet table decodes to", f"{decoded / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        text = [field.name for field in schema if _is_text(
            field.type.value_type if pa.types.is_dictionary(field.type) else field.type)]
        table = pq.ParquetFile(io.BytesIO(data), read_dictionary=text).read()
        for name in text:  # dictionary-encoded: a short value may stand for a long one
            for part in table.column(name).chunks:
                if pa.types.is_dictionary(part.type) and len(part):
                    lengths = pc.binary_length(part.dictionary)
                    decoded += 64 * len(part) + (pc.sum(pc.take(lengths, part.indices))
                                                 .as_py() or 0)
        if decoded > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                "The Parquet table's text decodes to", f"{decoded / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        return table.to_pandas()  # text columns stay categorical: no copy per row


def _from_frame(frame: pd.DataFrame, features, label, cluster, tokenizer: Any = None,
                limits: Limits = DEFAULT_LIMITS) -> Dataset:
    if frame.empty:
        raise AttributionError("The table has no rows.")
    frame.columns = [str(c) for c in frame.columns]
    _check_text_cells(frame, limits)
    columns = {c: c for c in frame.columns}
    lower = {c.lower(): c for c in frame.columns}
    label_column = _pick(columns, label, [lower[k] for k in _LABEL_KEYS if k in lower],
                         "label column", required=False)
    cluster_column = _pick(columns, cluster, [lower[k] for k in _CLUSTER_KEYS if k in lower],
                           "cluster column", required=False)
    if tokenizer is not None:
        return _tokenized(frame, features, label_column, cluster_column, tokenizer)
    if features is None:
        feature_columns = [c for c in frame.columns if c not in (label_column, cluster_column)
                           and not _is_saved_index(frame, c)]
        text = [c for c in feature_columns if not pd.api.types.is_numeric_dtype(frame[c])]
        if text:
            raise AttributionError(
                f"Columns {', '.join(text[:5])} are not numeric. If they are texts for a "
                "Hugging Face model, its folder needs the tokenizer that turns them into "
                "token ids: tokenizer.save_pretrained(folder) writes its tokenizer.json (or "
                "give input_ids and attention_mask in a .npz). Otherwise name the label and "
                "cluster columns 'label' and 'cluster' (found by those names) and drop other "
                "text columns, or choose the columns: features=, label=, cluster= in Python, "
                "--features, --label-key, --cluster-key on the command line.")
    else:
        feature_columns = [features] if isinstance(features, str) else list(features)
        missing = [c for c in feature_columns if c not in columns]
        if missing:
            raise AttributionError(f"Feature columns not found: {', '.join(map(str, missing))}.")
    if not feature_columns:
        raise AttributionError("The table has no feature columns.")
    values = frame[feature_columns]
    if not all(pd.api.types.is_numeric_dtype(values[c]) for c in feature_columns):
        raise AttributionError("Feature columns must hold numbers.")
    return Dataset(inputs=values.to_numpy(dtype=np.float32, na_value=np.nan),
                   labels=frame[label_column].to_numpy() if label_column else None,
                   clusters=frame[cluster_column].to_numpy() if cluster_column else None,
                   feature_names=feature_columns)


def _tokenized(frame: pd.DataFrame, features, label_column, cluster_column,
               tokenizer: Any) -> Dataset:
    """A table's text column through a model's tokenizer: named inputs and their tokens."""
    if features is not None:
        columns = [features] if isinstance(features, str) else list(features)
    else:
        columns = [c for c in frame.columns if c not in (label_column, cluster_column)
                   and not pd.api.types.is_numeric_dtype(frame[c])]
    if len(columns) != 1 or columns[0] not in frame.columns:
        raise AttributionError(
            f"Tokenizing needs exactly one text column; found {columns or 'none'}. Choose it "
            "with features= in Python or --features on the command line.")
    texts = frame[columns[0]]
    if texts.isna().any():
        raise AttributionError(f"Text column {columns[0]!r} has empty cells (row "
                               f"{int(np.flatnonzero(texts.isna())[0])}); fill or drop them.")
    inputs, tokens = tokenizer.encode(texts.astype(str).tolist())
    return Dataset(inputs=inputs,
                   labels=frame[label_column].to_numpy() if label_column else None,
                   clusters=frame[cluster_column].to_numpy() if cluster_column else None,
                   tokens=tokens)
