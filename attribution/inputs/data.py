"""A user's data, checked: the `Dataset` (inputs, labels, cluster ids and their names), each
part's conversion and checks, and `check_data` against a model. Reading a file into a
`Dataset` is `data_files.load_data`'s."""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from ..errors import AttributionError
from ..engine.model_io import NamedInputs
from .untrusted.limits import MB
from ..engine.model_io import MULTI_HOT_ADVICE, is_multi_hot
from .huggingface import check_padding
from .loaded import LoadedModel

FINITE_CHECK_VALUES = 1 << 22
"""Values checked for NaN and infinity at a time (16 MB of float32)."""
MAX_ID_CHARACTERS = 1000
"""Longest cluster id accepted (as text every id takes the room of the longest)."""
MAX_ID_BYTES = 64 * MB
"""Bytes all the cluster ids may take as text (NumPy gives each the room of the longest)."""
MAX_CLUSTERS = 2_000
"""Distinct cluster ids a dataset may hold (ImageNet's classes fit twice over)."""



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


def as_array(value: Any, what: str) -> np.ndarray:
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
        array = as_array(array, "inputs")
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
    array = as_array(value, "labels")
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
    array = as_array(value, "cluster ids")
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
