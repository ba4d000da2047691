"""The one pass over the data at a layer, and the one check of targets.

Every computation that reads the inputs batch by batch (scores, pruning curves, per-token
scores, the neuron view, predicted classes, diagnose's logits) goes through `LayerPass`:

    layer_pass = LayerPass(model, "fc2", inputs, targets, batch_size=256, grad=False)
    for batch, result in layer_pass.run(lambda batch: batch.runner.capture(batch.x)):
        ...  # batch.start, batch.rows, batch.targets; the caller's modes are back here

It owns where the work runs (the model copied to `device` when asked, each batch moved to
it), the model's eval mode, the engine's modes (`pass_modes`: autograd on or off as the pass
needs, never the caller's no_grad, inference_mode or autocast), the batches with their
targets (sliced from a tensor, read from the y of (x, y) batches, checked once by
`check_targets`), the runner split at the layer (`runners.runner_for`) and progress after
each batch. So every consumer computes under the same modes: the neuron view's numbers are
the pruning curve's whatever context the caller is in.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np
import torch
from torch import nn

from ..engine import model_io
from ..engine.guards import autograd_input, engine_modes, eval_mode
from ..engine.layers import resolve_layer
from ..engine.model_io import MULTI_HOT_ADVICE, is_multi_hot, model_device
from ..engine.processes import resolve_device
from ..engine.runners import LayerRunner, runner_for
from ..errors import AttributionError
from .registry import Targets

Inputs = Union[torch.Tensor, np.ndarray, Mapping, Iterable]
Progress = Optional[Callable[[float], object]]
TARGET_WORDS = ("all", "labels")
"""The targets named by a word: "all" (every class) and "labels" (the y of (x, y) batches)."""
_TARGET_KINDS = {"all": "'all' (every class)", "labels": "'labels' (the y of each (x, y) batch)"}
Result = TypeVar("Result")


# ------------------------------------------------------------------- device and batches

def on_device(model: nn.Module, device: Union[str, torch.device, None]) -> nn.Module:
    """`model` when it already lives on `device` (or device is None), else a copy moved there.

    The caller's model never moves (a model shared by a server stays where it is); move it
    yourself (`model.to(device)`) to avoid the copy. A model on the meta device (shapes
    without weights) raises AttributionError.
    """
    if any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()]):
        raise AttributionError(
            "The model's weights are on the meta device: it has shapes but no values (built "
            "under torch.device('meta') or an empty-weights loader), so no score can be "
            "computed. Load its weights first, e.g. model.to_empty(device='cpu') then "
            "model.load_state_dict(state).")
    if device is None:
        return model
    wanted, current = resolve_device(device), model_device(model)
    if wanted.type == "cuda" and wanted.index is None:
        wanted = torch.device("cuda", torch.cuda.current_device())
    if current == wanted:
        return model
    return copy.deepcopy(model).to(wanted)


def as_batch_tensor(x, device: torch.device, dtype: Optional[torch.dtype]):
    """One batch (tensor, array or named inputs) as tensors on `device`, floating-point ones
    in `dtype` (the model's: `model_io.float_dtype`), detached and ordinary even when made
    under torch.inference_mode() (`guards.autograd_input`)."""
    batch = model_io.to_device(x, device, dtype)
    if isinstance(batch, model_io.NamedInputs):
        return batch.map(autograd_input)
    return autograd_input(batch)


def n_samples(inputs: Inputs) -> Optional[int]:
    """Number of samples when known up front (tensors, arrays, named inputs, `NpyRows`,
    sized loaders), else None."""
    shape = getattr(model_io.named(inputs), "shape", None)
    if shape is not None:
        return int(shape[0])
    dataset = getattr(inputs, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return None


def iter_labelled_batches(inputs: Inputs, batch_size: int) -> Iterator[tuple[object, object]]:
    """(x, y) per batch: slices of an in-memory or memory-mapped array or of named inputs
    (y None), or the items of an iterable of batches such as a DataLoader (x, an (x, y, ...)
    tuple, or a dict of named inputs whose "labels" entry, if any, is y)."""
    inputs = model_io.named(inputs)
    if model_io.is_batch(inputs):
        for begin in range(0, model_io.n_rows(inputs), batch_size):
            yield model_io.take(inputs, slice(begin, begin + batch_size)), None
        return
    try:
        iterator = iter(inputs)
    except TypeError:
        raise AttributionError(f"Inputs must be a tensor, a NumPy array or an iterable of "
                               f"batches; got {type(inputs).__name__}.") from None
    for item in iterator:
        if isinstance(item, (tuple, list)):
            yield model_io.named(item[0]), item[1] if len(item) > 1 else None
        elif isinstance(item, Mapping):  # a transformers-style batch
            entries = dict(item)
            labels = entries.pop("labels", None)
            yield model_io.named(entries), labels
        else:
            yield item, None


# ---------------------------------------------------------------------------- targets

def check_targets(targets, total: Optional[int] = None, *, inputs: Inputs = None,
                  n_classes: Optional[int] = None, accepts: Sequence[str] = TARGET_WORDS,
                  need: Optional[str] = None, of_batch: bool = False,
                  name: str = "target class ids", values: bool = False) -> Targets:
    """The one check of targets: what every computation scores or measures each sample for.

    Args:
        targets: a LongTensor [N] of class ids, None (the predicted class) or one of the
            words in `accepts` ("all", "labels"); with `of_batch`, the y of one (x, y)
            batch (a tensor or array of class ids; None: the batches carry no labels).
        total: the number of samples the ids are for, when known.
        inputs: the inputs, when known: "labels" needs an iterable of (x, y) batches.
        n_classes: the model's number of outputs, when known: every id must lie in
            0..n_classes-1 (one reduction over the ids, not one per batch).
        accepts: the words this computation takes ("all" needs a score per class, so a
            pruning curve or a diagnosis, which measure one target per sample, leave it out).
        need: why a word is refused, e.g. "Pruning curves need one target per sample".
        name: what the range message calls the ids ("the fixed class").
        values: the targets are real values, one per sample (a regression head's true
            outputs, which `squared_error` measures against), not class ids.
            Real values [N] are taken as such wherever the model may be a regression head
            (`n_classes` unknown or 1): one rule for scores and metrics, whose scores read
            the head's one output whatever its true values (`LayerPass`).
    Returns:
        None, the word, or the class ids as a LongTensor (y converted, with `of_batch`);
        with `values`, the values as a float32 tensor.
    Raises:
        AttributionError saying what to pass instead.
    """
    if of_batch:
        if targets is None:
            raise AttributionError("targets='labels' reads y from batches (x, y, ...), but "
                                   "these batches carry no labels; pass targets as a "
                                   "LongTensor [N] or None (the predicted class).")
        targets = torch.as_tensor(targets if isinstance(targets, torch.Tensor)
                                  else np.asarray(targets))
    elif targets is None:
        return None
    elif isinstance(targets, str):
        return _target_word(targets, inputs, accepts, need)
    if is_multi_hot(targets):
        raise AttributionError(_not_class_ids(targets, total, accepts, of_batch))
    if values or (_is_real(targets) and n_classes in (None, 1)):
        return _real_values(targets, total)
    if (not isinstance(targets, torch.Tensor) or targets.dim() != 1
            or targets.is_floating_point() or targets.is_complex()
            or targets.dtype == torch.bool):
        raise AttributionError(_not_class_ids(targets, total, accepts, of_batch))
    if total is not None and targets.shape[0] != total:
        raise AttributionError(
            _not_class_ids(targets, total, accepts, of_batch) if of_batch else
            f"targets has {targets.shape[0]} entries but there are {total} samples.")
    targets = targets.long()
    if n_classes is not None and targets.numel():
        low, high = map(int, torch.aminmax(targets))
        if low < 0 or high >= n_classes:
            got = f"{low}" if low == high else f"{low}..{high}"
            raise AttributionError(f"{low if low < 0 else high} is not a class of this model: "
                                   f"{name} must lie in 0..{n_classes - 1} (the model has "
                                   f"{n_classes} outputs); got {got}.")
    return targets


def _kinds(accepts: Sequence[str]) -> str:
    """What targets may be, in words: "a LongTensor [N] of class ids, None (...) or ..."."""
    kinds = ["a LongTensor [N] of class ids", "None (the predicted class)"]
    kinds += [_TARGET_KINDS[word] for word in TARGET_WORDS if word in accepts]
    return ", ".join(kinds[:-1]) + " or " + kinds[-1]


def _target_word(word: str, inputs: Inputs, accepts: Sequence[str],
                 need: Optional[str]) -> str:
    if word not in accepts:
        if word in TARGET_WORDS:
            raise AttributionError(f"{need or f'targets={word!r} is not taken here'}: pass "
                                   f"{_kinds(accepts)}, not {word!r}.")
        raise AttributionError(f"targets={word!r} is not understood: pass "
                               f"{_kinds(accepts)}.")
    if word == "labels" and inputs is not None and model_io.is_batch(model_io.named(inputs)):
        raise AttributionError("targets='labels' reads y from the (x, y) batches of a "
                               "DataLoader; with array inputs pass the labels as a "
                               "LongTensor [N].")
    return word


def _is_real(targets) -> bool:
    """Are `targets` floating-point values (a regression head's true values)?"""
    dtype = getattr(targets, "dtype", None)
    return dtype is not None and getattr(targets, "ndim", 0) == 1 and (
        dtype.is_floating_point if isinstance(dtype, torch.dtype)
        else np.issubdtype(dtype, np.floating))


def _real_values(targets, total: Optional[int]) -> torch.Tensor:
    """Targets that are real values [N] (float32), checked: one finite value per sample."""
    if not isinstance(targets, torch.Tensor):
        targets = torch.as_tensor(np.asarray(targets))
    if targets.dim() != 1 or (total is not None and targets.shape[0] != total) \
            or targets.is_complex() or targets.dtype == torch.bool:
        raise AttributionError(f"squared_error measures each output against a true value: "
                               f"pass one real value per sample ({total or 'N'}), as a tensor "
                               f"[N]; got {_described(targets)}.")
    targets = targets.to(torch.float32)
    if not torch.isfinite(targets).all():
        raise AttributionError("The true values contain NaN or inf.")
    return targets


def _described(value) -> str:
    return (f"a {value.dtype} tensor of shape {list(value.shape)}"
            if isinstance(value, torch.Tensor) else type(value).__name__)


def _not_class_ids(targets, total: Optional[int], accepts: Sequence[str],
                   of_batch: bool) -> str:
    if is_multi_hot(targets):
        return f"targets must be {_kinds(accepts)}; got {MULTI_HOT_ADVICE}"
    if of_batch:
        return (f"targets='labels' needs integer class ids y [B] in each (x, y) batch; got y "
                f"of shape {list(targets.shape)} and dtype {targets.dtype} for {total} "
                "samples.")
    said = f"targets must be {_kinds(accepts)}; convert with torch.as_tensor(y).long()."
    if isinstance(targets, torch.Tensor) and targets.is_floating_point():
        said += (" Real values are the true values of a regression head (one output), "
                 "which this model is not.")
    return said


# --------------------------------------------------------------------------- the pass

@contextlib.contextmanager
def pass_modes(grad: bool = True) -> Iterator[None]:
    """The modes every computation at a layer runs under, whatever the caller's:
    `guards.engine_modes` (no autocast, no inference mode, autograd on), and no autograd
    for a pass without gradients (`grad=False`: captures, removals, logits)."""
    with engine_modes(), torch.set_grad_enabled(grad):
        yield


@dataclass
class LayerBatch:
    """One batch of a `LayerPass`.

    Attributes:
        x: the inputs [rows, ...] on the model's device (a tensor or `NamedInputs`).
        start: the index of its first row among the inputs (in iteration order).
        rows: its number of samples.
        targets: its class ids, a LongTensor [rows] on the device (checked), None (the
            predicted class) or "all".
        runner: the model split at the layer (None for a pass without a layer).
    """

    x: Any
    start: int
    rows: int
    targets: Targets
    runner: Optional[LayerRunner]


class LayerPass:
    """Passes over the inputs at one layer (or, with layer None, through the whole model).

    Args:
        model: a classifier returning logits [N, n_classes]; left exactly as it was found
            (a copy runs on `device` when it lives elsewhere: `self.model`).
        layer: dotted module name (or "name:axis", or the module itself); None = no layer.
        inputs: [N, ...] tensor or array (a memory-mapped .npy streams), named inputs, or an
            iterable of batches (x, (x, y, ...) or dicts whose "labels" entry is y).
        targets: as `check_targets` takes them, checked here (class ids against the model's
            outputs once the layer is split, before the first batch is computed).
        accepts, need: the words the computation takes, and why it refuses the others
            (`check_targets`).
        batch_size: samples per batch of an in-memory array (an iterable keeps its own).
        device: where to compute; None = where the model is.
        grad: does the computation need autograd (gradient methods) or not (captures).
        what: the work, for the message on empty inputs ("score", "evaluate").
        check: called with each batch's x before anything runs on it (e.g. a method that
            needs floating-point inputs says so before the layer is split).
        cpu_layer_elements: on a CPU, a batch whose layer output holds more values than
            this is computed in equal row chunks, each its own `LayerBatch` (memory the
            caches or the allocator keep); elsewhere, and for None, whole batches.
        values: the targets are real values (True: `check_targets`), class ids (False:
            a regression head's real values then mean its one output), or either (None:
            real values kept as values, for a metric that follows the head).
    """

    def __init__(self, model: nn.Module, layer, inputs: Inputs, targets: Targets = None, *,
                 batch_size: int = 256, device=None, grad: bool = True,
                 accepts: Sequence[str] = TARGET_WORDS, need: Optional[str] = None,
                 what: str = "score", check: Optional[Callable[[Any], object]] = None,
                 cpu_layer_elements: Optional[int] = None, values: Optional[bool] = False):
        self.name: Optional[str] = None
        self.module: Optional[nn.Module] = None
        if layer is not None:
            self.name, _ = resolve_layer(model, layer)
        self.model = on_device(model, device)
        if layer is not None:
            self.name, self.module = resolve_layer(self.model, self.name)
        self.inputs, self.batch_size, self.grad = inputs, batch_size, grad
        self.what, self.check = what, check
        self.device = model_device(self.model)
        self.float_dtype = model_io.float_dtype(self.model)
        self.cpu_layer_elements = cpu_layer_elements if self.device.type == "cpu" else None
        self.total = n_samples(inputs)
        self.values = values
        self.targets = check_targets(targets, self.total, inputs=inputs, accepts=accepts,
                                     need=need, values=values)
        self._ranged = not isinstance(self.targets, torch.Tensor)  # ids checked on a device
        self.runner: Optional[LayerRunner] = None

    def run(self, compute: Callable[[LayerBatch], Result], progress: Progress = None
            ) -> Iterator[tuple[LayerBatch, Result]]:
        """(batch, compute(batch)) per batch, computed in eval mode under `pass_modes`; the
        caller's modes are back at each yield. `progress(fraction)` after each batch (NaN
        when the number of samples is unknown). AttributionError for empty inputs."""
        start = 0
        with eval_mode(self.model):
            for raw, labels in iter_labelled_batches(self.inputs, self.batch_size):
                with engine_modes():  # the runner is built with autograd on (cached for all)
                    batch = self._batch(raw, labels, start)
                    if batch is None:
                        continue
                    part, *parts = self._steps(batch)
                    with torch.set_grad_enabled(self.grad):  # as `pass_modes`, entered once
                        result = compute(part)
                yield part, result
                for part in parts:  # the row chunks after the first
                    with pass_modes(self.grad):
                        result = compute(part)
                    yield part, result
                start += batch.rows
                if progress is not None:
                    progress(min(1.0, start / self.total) if self.total else float("nan"))
        if start == 0:
            raise AttributionError(f"There are no samples to {self.what} (the inputs are "
                                   "empty).")

    def _batch(self, raw, labels, start: int) -> Optional[LayerBatch]:
        """The batch (x, y) of the inputs at rows `start`.. on the device, with its runner
        and checked targets; None for an empty batch. Runs under `engine_modes`."""
        x = as_batch_tensor(raw, self.device, self.float_dtype)
        rows = model_io.n_rows(x)
        if rows == 0:
            return None
        if self.check is not None:
            self.check(x)
        runner = self._runner(x)
        return LayerBatch(x, start, rows, self._targets(labels, start, rows), runner)

    def _steps(self, batch: LayerBatch) -> list[LayerBatch]:
        """[the batch], or its row chunks (views) within `cpu_layer_elements`, of equal
        sizes (a last chunk of a few rows would cost a whole pass's overhead)."""
        limit = self.cpu_layer_elements
        step = batch.rows if limit is None else max(1, limit // max(1, batch.runner.layer_size))
        if step >= batch.rows:
            return [batch]
        step = -(-batch.rows // -(-batch.rows // step))  # ceil(rows / number of chunks)
        chunks = []
        for begin in range(0, batch.rows, step):
            x = model_io.take(batch.x, slice(begin, begin + step))
            targets = batch.targets
            if isinstance(targets, torch.Tensor):
                targets = targets[begin:begin + step]
            chunks.append(LayerBatch(x, batch.start + begin, model_io.n_rows(x), targets,
                                     batch.runner))
        return chunks

    def _runner(self, x) -> Optional[LayerRunner]:
        if self.module is not None and self.runner is None:
            self.runner = runner_for(self.model, self.name, self.module, x)
        return self.runner

    @property
    def n_classes(self) -> Optional[int]:
        return None if self.runner is None else self.runner.n_classes

    def _targets(self, labels, start: int, rows: int) -> Targets:
        """The batch's targets: a slice of the checked ids, the y of its (x, y) batch, or
        the word or None as given."""
        targets = self.targets
        if isinstance(targets, torch.Tensor):
            if not self._ranged:  # every batch's at once, before the first is computed
                if self._one_output(targets):
                    self.targets, self._ranged = None, True  # a regression head's one output
                    return None
                targets = self.targets = check_targets(targets.to(self.device),
                                                       n_classes=self.n_classes,
                                                       values=self.values)
                self._ranged = self.n_classes is not None or not targets.is_floating_point()
            if start + rows > targets.shape[0]:
                raise AttributionError("There are more samples than targets.")
            return targets[start:start + rows]
        if targets == "labels":
            y = check_targets(labels, rows, n_classes=self.n_classes, of_batch=True,
                              values=self.values)
            return None if self._one_output(y) else y.to(self.device)
        return targets

    def _one_output(self, targets: torch.Tensor) -> bool:
        """Are real-valued targets, in a pass that scores, a regression head's true values?
        Its score is then its one output, as with None."""
        return targets.is_floating_point() and self.values is False and self.n_classes == 1
