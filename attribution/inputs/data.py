"""A user's data: loading it from a path or upload, checking it against a model, and the
cluster ids that group its samples.

Accepted files (detected from content):
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
import reprlib
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from ..errors import AttributionError, out_of_memory, reading, reads_input
from ..engine.model_io import NamedInputs
from .untrusted.limits import DEFAULT_LIMITS, MB, Limits, held_bytes, over_budget
from ..engine.model_io import MULTI_HOT_ADVICE, is_multi_hot
from .huggingface import TextEncoder, check_padding
from .loaded import LoadedModel
from .untrusted import jail
from .untrusted.files import (Source, describe_kind, open_path, open_zip, read_source, sniff,
                              zip_kind)
from .untrusted.pickles import pickled_size, unpickle
from .tasks import READ_DATA

MAX_ROWS = 200_000
"""Default limit on samples held in memory (`max_rows=` overrides it per call)."""
READ_STEP = 1 << 24
"""Bytes of an array read from a file at a time (16 MB)."""
FINITE_CHECK_VALUES = 1 << 22
"""Values checked for NaN and infinity at a time (16 MB of float32)."""
MAX_ID_CHARACTERS = 1000
"""Longest cluster id accepted (as text every id takes the room of the longest)."""
MAX_ID_BYTES = 64 * MB
"""Bytes all the cluster ids may take as text (NumPy gives each the room of the longest)."""
MAX_CLUSTERS = 2_000
"""Distinct cluster ids a dataset may hold (ImageNet's classes fit twice over)."""

_INPUT_KEYS = ("inputs", "x", "X", "data", "images", "features")
_LABEL_KEYS = ("labels", "label", "y", "targets", "target", "class")
_CLUSTER_KEYS = ("clusters", "cluster", "group")


@dataclass(frozen=True, eq=False)
class Dataset:
    """Samples for scoring, checked on construction.

    Attributes:
        inputs: float32 tensor [N, ...] (N >= 1), finite; int64 when given as an int64
            tensor, and made int64 by `check_data` for a model of integer inputs (token ids).
            Named inputs (a dict such as input_ids and attention_mask [N, T]) become
            `model_io.NamedInputs` of int64 / float32 tensors.
        labels: int64 tensor [N] of class ids >= 0; float32 [N] of real values, the true
            outputs of a regression head (a model with one output: `check_data` makes any
            labels of such a model float32, and refuses real values for a classifier); or None.
        clusters: 1-D array [N] of cluster ids (ints or strings), or None.
        feature_names: one name per feature of [N, F] inputs, or None.
        class_names: one name per class, or None.
        tokens: str array [N, T], the token at each position of sequence inputs ("" at
            padding), for display; or None.
        reshaped_from: the per-sample shape the data had before `check_data` reshaped it to
            the model's input (e.g. (64,) for a CSV of 64 pixels), or None.
        image_shape: how each sample's values are drawn as an image, (H, W) or (C, H, W)
            with C in 1, 3, 4 (e.g. (8, 8) for a table of 64 pixels), or None: a table is
            drawn as a table. Its values must be the sample's. `image_chw` gives it as
            (C, H, W).
    """

    inputs: Union[torch.Tensor, NamedInputs]
    labels: Optional[torch.Tensor] = None
    clusters: Optional[np.ndarray] = None
    feature_names: Optional[tuple[str, ...]] = None
    class_names: Optional[tuple[str, ...]] = None
    tokens: Optional[np.ndarray] = None
    reshaped_from: Optional[tuple[int, ...]] = None
    image_shape: Optional[tuple[int, ...]] = None

    def __post_init__(self):
        if isinstance(self.inputs, (Mapping, NamedInputs)):
            inputs = NamedInputs({name: _as_inputs(value, keep_integers=True)
                                  for name, value in self.inputs.items()})
            for value in inputs.values():
                _check_finite(value, None)
        else:
            inputs = _as_inputs(self.inputs)
            _check_finite(inputs, self.feature_names)
        n = inputs.shape[0]
        tokens = None if self.tokens is None else _as_tokens(self.tokens, inputs)
        labels = None if self.labels is None else as_labels(self.labels, n)
        clusters = None if self.clusters is None else as_clusters(self.clusters, n)
        feature_names = None if self.feature_names is None else tuple(
            str(name) for name in self.feature_names)
        if feature_names is not None and (inputs.dim() != 2
                                          or len(feature_names) != inputs.shape[1]):
            raise AttributionError(f"There are {len(feature_names)} feature names for inputs "
                                   f"of shape {list(inputs.shape)}; give one per column.")
        class_names = None if self.class_names is None else tuple(
            str(name) for name in self.class_names)
        image_shape = None if self.image_shape is None else _as_image_shape(
            self.image_shape, inputs)
        for field, value in (("inputs", inputs), ("labels", labels), ("clusters", clusters),
                             ("feature_names", feature_names), ("class_names", class_names),
                             ("tokens", tokens), ("image_shape", image_shape)):
            object.__setattr__(self, field, value)

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def image_chw(self) -> Optional[tuple[int, int, int]]:
        """The shape each sample is drawn in as an image, (C, H, W): `image_shape`, else the
        inputs' own [N, C, H, W] with 1, 3 or 4 channels; None for data that is no image."""
        if self.image_shape is not None:
            return self.image_shape if len(self.image_shape) == 3 else (1, *self.image_shape)
        shape = tuple(self.inputs.shape[1:])
        if isinstance(self.inputs, torch.Tensor) and self.inputs.is_floating_point() \
                and len(shape) == 3 and shape[0] in IMAGE_CHANNELS:
            return shape
        return None


@dataclass(frozen=True, eq=False)
class StreamedData:
    """Samples read batch by batch (data larger than memory), with their labels and cluster
    ids: what `make_clusters` takes in place of a `Dataset` for them. Nothing is checked
    here: give what `Dataset` would hold (the command line checks its .npy files).

    Attributes:
        inputs: `NpyRows` or any re-iterable of batches [B, ...] (arrays or tensors), in
            sample order.
        labels: int64 tensor [N] of class ids, or None.
        clusters: 1-D array [N] of cluster ids, or None.
    """

    inputs: Iterable
    labels: Optional[torch.Tensor] = None
    clusters: Optional[np.ndarray] = None


def _numpy(value: Any, what: str) -> np.ndarray:
    """`value` (array, tensor, nested lists) as a NumPy array."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return (tensor.double() if tensor.dtype in (torch.float16, torch.bfloat16)
                else tensor).numpy()
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as error:
        raise AttributionError(f"The {what} must form a rectangular array ({error}).") from None


def _as_tokens(value: Any, inputs: Any) -> np.ndarray:
    """Tokens [N, T] (str) for sequence inputs whose ids are [N, T]."""
    tokens = np.asarray(value).astype(str)
    ids = inputs[model_io.TEXT_INPUT] if isinstance(inputs, NamedInputs) \
        and model_io.TEXT_INPUT in inputs else inputs
    if ids is None or not isinstance(ids, torch.Tensor) or tokens.shape != tuple(ids.shape):
        raise AttributionError(f"tokens must be text [N, T], one per position of the token "
                               f"ids; got shape {list(tokens.shape)} for ids of shape "
                               f"{list(getattr(ids, 'shape', []))}.")
    return tokens


def _as_inputs(value: Any, keep_integers: bool = False) -> torch.Tensor:
    """Inputs as a tensor: float32, or int64 where given as int64 (any integers with
    `keep_integers`, e.g. token ids and attention masks)."""
    array = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    if not isinstance(array, torch.Tensor):
        array = _numpy(array, "inputs")
        if array.dtype.kind not in "biuf":
            raise AttributionError(f"Inputs must be numbers; got values of type {array.dtype} "
                                   "(text or mixed columns?).")
        integers = keep_integers and array.dtype.kind in "biu"
        array = torch.tensor(array, dtype=torch.int64 if integers else torch.float32)
    elif keep_integers and not array.is_floating_point() and not array.is_complex():
        array = array.to(torch.int64)
    if array.is_complex():
        raise AttributionError("Inputs must be real numbers, not complex.")
    if array.dim() < 2 or array.shape[0] == 0 or array[0].numel() == 0:
        raise AttributionError(f"Inputs must have shape [N, ...] with N >= 1 samples and at "
                               f"least one value each; got {list(array.shape)}. For a single "
                               "feature use shape [N, 1].")
    return array if array.dtype == torch.int64 else array.to(torch.float32)


IMAGE_CHANNELS = (1, 3, 4)
"""Channels of an image: grey, RGB, RGBA."""


def parse_image_shape(text: str) -> tuple[int, ...]:
    """"8x8" or "3x32x32" (also "8,8") -> (8, 8) / (3, 32, 32), as the command line and the
    dashboard take an image shape."""
    parts = [part.strip() for part in str(text).lower().replace(",", "x").split("x")]
    if not all(part.isdigit() for part in parts):
        raise AttributionError(f"Image shape {text!r}: write it as HxW or CxHxW, e.g. 8x8 "
                               "or 3x32x32.")
    return tuple(int(part) for part in parts)


def _as_image_shape(value: Any, inputs) -> tuple[int, ...]:
    """`value` as a checked (H, W) or (C, H, W) whose values are each sample's."""
    if isinstance(value, str):
        value = parse_image_shape(value)
    array = np.asarray(value)
    if array.size not in (2, 3) or array.dtype.kind not in "iuf":  # before reading it
        raise AttributionError(f"image_shape holds {array.size} values of dtype {array.dtype}: "
                               "give (height, width) or (channels, height, width).")
    shape = tuple(int(v) for v in array.ravel())
    if min(shape) < 1 or \
            (len(shape) == 3 and shape[0] not in IMAGE_CHANNELS):
        raise AttributionError(f"image_shape {list(shape)}: give (height, width) or (channels, "
                               "height, width) with 1, 3 or 4 channels.")
    if isinstance(inputs, NamedInputs) or not inputs.is_floating_point():
        raise AttributionError("image_shape describes a table or array of pixel values; "
                               "these inputs are named inputs or integer ids.")
    values = math.prod(inputs.shape[1:])
    if math.prod(shape) != values:
        raise AttributionError(
            f"image_shape {'x'.join(map(str, shape))} holds {math.prod(shape)} values, but "
            f"each sample has {values} (shape {list(inputs.shape[1:])}).")
    return shape


def _check_finite(inputs: torch.Tensor, feature_names: Optional[Sequence[str]]) -> None:
    """Refuse NaN or infinite values, checked FINITE_CHECK_VALUES at a time: torch.isfinite
    on a whole tensor makes temporaries of 1.75x its size."""
    flat = inputs.flatten(1)
    step = max(1, FINITE_CHECK_VALUES // flat.shape[1])
    bad_rows, first = 0, None
    for start in range(0, flat.shape[0], step):
        finite = torch.isfinite(flat[start:start + step])
        if bool(finite.all()):
            continue
        bad = (~finite).any(dim=1)
        if first is None:
            row = int(bad.nonzero()[0])
            first = (start + row, int((~finite[row]).nonzero()[0]))
        bad_rows += int(bad.sum())
    if first is None:
        return
    row, column = first
    where = (f"column {feature_names[column]!r}" if feature_names is not None
             and column < len(feature_names) else f"value {column}")
    raise AttributionError(f"{bad_rows} sample(s) contain NaN or infinite values (first: "
                           f"row {row}, {where}). Drop or impute them before loading.")


def as_labels(value: Any, n: int) -> torch.Tensor:
    """The label column as a tensor [n]: int64 class ids when every value is a whole number
    >= 0, else float32 real values (the targets of a regression head; `check_data` refuses
    them for a classifier)."""
    array = _numpy(value, "labels")
    if is_multi_hot(array) and len(array) == n:
        raise AttributionError(f"Labels must be one class id or value per sample ({n}); got "
                               f"{MULTI_HOT_ADVICE} Store label j's column as the cluster "
                               "ids (--cluster-ids, or a cluster column) instead of labels.")
    if array.ndim != 1 or len(array) != n:
        raise AttributionError(f"Labels must be a 1-D array with one class id per sample ({n}); "
                               f"got shape {list(array.shape)}.")
    if array.dtype.kind == "b":
        array = array.astype(np.int64)
    if array.dtype.kind in "OUS":
        numeric = pd.to_numeric(pd.Series(array), errors="coerce").to_numpy()
        if np.isnan(numeric.astype(np.float64)).any():
            example = _scalar(next(v for v, x in zip(array, numeric) if x != x))
            raise AttributionError(f"Labels must be integer class ids; found "
                                   f"{reprlib.repr(example)}. Map class names to ids 0..C-1 "
                                   "first.")
        array = numeric
    if array.dtype.kind not in "iuf":
        raise AttributionError(f"Labels must be integer class ids; got dtype {array.dtype}.")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        example = _scalar(next(v for v in array if not math.isfinite(v)))
        raise AttributionError(f"Labels must be integer class ids (or real values for a model "
                               f"with one output); found {reprlib.repr(example)}.")
    whole = array.dtype.kind in "iu" or bool(np.equal(np.round(array), array).all())
    if not whole or (len(array) and array.min() < 0) or (
            isinstance(value, torch.Tensor) and value.dtype == torch.float32):
        return torch.from_numpy(array.astype(np.float32))  # real values, or not class ids
    if len(array) and float(np.abs(array).max()) >= 2 ** 62:  # beyond int64: no class id
        raise AttributionError(f"Labels must be class ids 0..C-1; found {_scalar(array.max())}.")
    return torch.from_numpy(array.astype(np.int64))


def class_ids(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """`labels` as int64 class ids 0..n_classes-1, or AttributionError (real values are the
    targets of a regression head, a model with one output)."""
    if labels.is_floating_point():
        bad = labels[(labels != labels.round()) | (labels < 0)]
        if len(bad) and float(bad[0]) < 0 and float(bad[0]) == round(float(bad[0])):
            raise AttributionError(f"Labels must be class ids >= 0; found {int(bad[0])}.")
        if len(bad):
            raise AttributionError(
                f"Labels must be integer class ids; found {float(bad[0]):g}. Real values are "
                "the targets of a regression head (a model with one output); this model has "
                f"{n_classes} outputs.")
        labels = labels.long()
    if len(labels) and int(labels.max()) >= n_classes:
        bad = labels[labels >= n_classes]
        raise AttributionError(f"{len(bad)} label(s) are outside the model's classes "
                               f"0..{n_classes - 1} (e.g. {int(bad[0])}). Check the label "
                               "column and that the data belongs to this model.")
    return labels


def _scalar(value: Any) -> Any:
    """A NumPy scalar as the Python value, so messages show 1.5 rather than np.float64(1.5)."""
    return value.item() if isinstance(value, np.generic) else value


def as_clusters(value: Any, n: int) -> np.ndarray:
    """Cluster ids [N] (ints or text) checked: one per sample, none missing, names of at most
    MAX_ID_CHARACTERS, at most MAX_CLUSTERS distinct ones."""
    array = _numpy(value, "cluster ids")
    if array.ndim != 1 or len(array) != n:
        raise AttributionError(f"Clusters must be a 1-D array with one id per sample ({n}); "
                               f"got shape {list(array.shape)}.")
    if pd.isna(pd.Series(array, dtype=object)).any():
        raise AttributionError("Some samples have no cluster id (empty/NaN); give every sample "
                               "a cluster.")
    if array.dtype.kind == "f" and np.equal(np.round(array), array).all():
        array = array.astype(np.int64)
    if array.dtype.kind in "OUS":  # as text, each id takes the length of the longest
        longest = (array.dtype.itemsize // array.dtype.alignment if array.dtype.kind != "O"
                   else max(len(str(value)) for value in array))
        if longest > MAX_ID_CHARACTERS:
            raise AttributionError(f"Cluster ids are names of at most {MAX_ID_CHARACTERS} "
                                   f"characters; one has {longest}. Use short cluster names.")
        text_bytes = len(array) * longest * (1 if array.dtype.kind == "S" else 4)
        if text_bytes > MAX_ID_BYTES:  # before NumPy's text array of them is made
            raise AttributionError(
                f"The cluster ids take {text_bytes / MB:,.0f} MB as text ({len(array):,} ids "
                f"of up to {longest:,} characters), over the limit of "
                f"{MAX_ID_BYTES // MB} MB; use short names or integer ids.")
    if array.dtype.kind == "O":
        array = array.astype(str)
    distinct = len(pd.unique(array))
    if distinct > MAX_CLUSTERS:
        raise AttributionError(
            f"The data has {distinct:,} distinct cluster ids, over the limit of "
            f"{MAX_CLUSTERS:,}: every analysis runs once per cluster (its scores, curves and "
            "checks), and a chart shows one row each. Group the samples into fewer clusters "
            "(a coarser column), or choose k-means or the labels as the cluster source.")
    return array


# ---------------------------------------------------------------- loading

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
        array = _numpy(value, f"array {key!r}")
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


# ---------------------------------------------------------------- checks against a model

def check_data(dataset: Dataset, model: LoadedModel) -> Dataset:
    """Check `dataset` against `model` before any scoring; returns it shaped for the model.

    Inputs of the right size but flattened (e.g. a CSV of 64 pixels for a [1, 8, 8] model) are
    reshaped; for a model of integer inputs (token ids) they become integers. Raises
    AttributionError for a wrong feature count/shape, labels outside 0..n_classes-1, or
    provided clusters with fewer than 2 samples.
    """
    inputs = dataset.inputs
    reshaped_from = dataset.reshaped_from
    expected = tuple(model.input_shape)
    if model.input_names or isinstance(inputs, NamedInputs):
        inputs = _named_for(inputs, model)
    elif tuple(inputs.shape[1:]) != expected:
        if inputs[0].numel() != math.prod(expected):
            columns = (f" ({inputs.shape[1]} feature columns)" if inputs.dim() == 2 else "")
            raise AttributionError(
                f"The model expects each sample to have shape {list(expected)} "
                f"({math.prod(expected)} values); the data has {list(inputs.shape[1:])}"
                f"{columns}. Check the feature columns / input array.")
        reshaped_from = tuple(inputs.shape[1:])
        inputs = inputs.reshape((inputs.shape[0],) + expected)
    if isinstance(inputs, NamedInputs):  # checked name by name in _named_for
        check_padding(model.module, inputs)
    elif not model.input_dtype.is_floating_point:
        inputs = _as_ids(inputs, model.input_dtype)
    elif not inputs.is_floating_point():
        inputs = inputs.to(torch.float32)
    labels = dataset.labels
    if labels is not None:  # a regression head's are its true values, a classifier's classes
        labels = labels.to(torch.float32) if model.n_classes == 1 else \
            class_ids(labels, model.n_classes)
    if dataset.clusters is not None:
        check_clusters(dataset.clusters, remedy="Merge them with others in the data's cluster "
                                                "ids, or leave the cluster ids out.")
    class_names = dataset.class_names
    if class_names is None or len(class_names) != model.n_classes:
        class_names = model.class_names
    feature_names = dataset.feature_names if isinstance(inputs, torch.Tensor) \
        and inputs.dim() == 2 else None
    return replace(dataset, inputs=inputs, labels=labels, feature_names=feature_names,
                   class_names=class_names, reshaped_from=reshaped_from)


def _named_for(inputs, model: LoadedModel) -> NamedInputs:
    """Named inputs checked against a model called with keywords (one plain array becomes
    its first input, e.g. input_ids)."""
    if not model.input_names:
        raise AttributionError(
            f"The data holds named inputs ({', '.join(inputs.keys())}) but the model takes one "
            "tensor; choose the inputs array (features= / --features).")
    if not isinstance(inputs, NamedInputs):
        inputs = NamedInputs({model.input_names[0]: inputs})
    missing = [name for name in model.input_names if name not in inputs]
    if missing and model.source_format == "torch.export":  # a program has no optional input
        raise AttributionError(
            f"The model takes the inputs {', '.join(model.input_names)}, every one of them; "
            f"the data has {', '.join(inputs.keys())}, without {', '.join(missing)}. Store "
            "an array per input, named after it (.npz/.pt), and load it with "
            "load_data(path, input_names=loaded.input_names) (the command line and the "
            "dashboard do so).")
    unknown = [name for name in inputs.keys() if name not in model.input_names]
    if unknown or model.input_names[0] not in inputs:
        raise AttributionError(
            f"The model takes the inputs {', '.join(model.input_names)} (at least "
            f"{model.input_names[0]}); the data has {', '.join(inputs.keys())}. Name the "
            "arrays after the model's inputs, or choose them (features= / --input-names).")
    checked, specs = {}, model.named_specs()
    for name, value in inputs.items():
        shape, dtype = specs[name]
        if value.dim() != 1 + len(shape):
            raise AttributionError(
                f"Input {name!r} has shape {list(value.shape)}; the model expects "
                f"[N, {', '.join(['...'] * len(shape))}] like its example "
                f"[N, {', '.join(map(str, shape))}].")
        checked[name] = value.to(torch.float32) if dtype.is_floating_point else \
            _as_ids(value, dtype)
    return NamedInputs(checked)


def _as_ids(inputs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inputs as the integer ids (e.g. token ids) that a model of `dtype` inputs takes."""
    bad = (inputs != inputs.round()) | (inputs.abs() >= 2 ** 24)  # float32 holds ints < 2**24
    if bool(bad.any()):
        row = int(bad.reshape(len(inputs), -1).any(1).nonzero()[0])
        raise AttributionError(f"The model takes integer inputs ({dtype}, e.g. token ids); "
                               f"sample {row} holds values that are not whole numbers below "
                               "2**24.")
    return inputs.to(dtype)


def check_clusters(clusters: Any, *, min_size: int = 2,
                   remedy: str = "Merge them, choose fewer k-means clusters or another "
                                 "cluster source.") -> None:
    """Raise when there are no samples or some cluster has fewer than `min_size` samples;
    the message ends with `remedy`."""
    ids, counts = np.unique(np.asarray(clusters).astype(str), return_counts=True)
    if len(ids) == 0:
        raise AttributionError("There are no samples to put in clusters.")
    small = [f"{reprlib.repr(_scalar(cluster))} ({count})"
             for cluster, count in zip(ids, counts) if count < min_size]
    if small:
        raise AttributionError(
            f"Clusters need at least {min_size} samples each; too small: "
            f"{', '.join(small[:8])}{' ...' if len(small) > 8 else ''}. {remedy}")
