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
input file can run code. Every byte is read through `attribution.inputs.untrusted` (the
security boundary; its docstring indexes the threat model): pickles with PyTorch's
weights-only unpickler (`untrusted.pickles`), which rebuilds tensors and plain containers
only; safetensors and JSON/YAML (`yaml.safe_load`) are data formats; uploaded Python is
never executed. A `.pt2` is checked by `untrusted.export_guard` before `torch.export.load`
reads it, and an untrusted model's first load and run happen in the jail
(`untrusted.jail`, running `first_run_task`) before this process reads a byte of it.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import pickle
import sys
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from .architectures import Architecture, is_description, parse_architecture
from ..defaults import DEFAULT_BATCH_SIZE
from ..engine.guards import eval_mode
from ..engine.layers import run_logits
from ..errors import AttributionError, out_of_memory, reading, reads_input
from ..engine.model_io import NamedInputs, OutputKey, shape_text
from . import huggingface
from .loaded import LoadedModel, checked_model
from .untrusted import jail
from .untrusted.export_guard import EXPORT_RECIPE, check_export_archive
from .untrusted.files import Source, describe_kind, open_zip, read_source, sniff, zip_kind
from .untrusted.limits import DEFAULT_LIMITS, MB, Limits
from .untrusted.pickles import unpickle
from .tasks import FIRST_RUN, FIRST_RUN_OF_A_FOLDER, first_run_task
from .untrusted.tensors import checked_state, load_safetensors

FLOPS_PER_SECOND = 200e9
"""The compute a first run's time budget stands for, per second: above what one CPU core
does, so the count refuses only what the timed run could not have seen (a branch the zeros
of the first run did not take)."""


def _load_in_child(source: Any, limits: Limits = DEFAULT_LIMITS, **options: Any) -> dict:
    """`load_model` in the jail's child; then the model's cost at the batch size the engine
    scores with (`DEFAULT_BATCH_SIZE`), counted over every branch of its `torch.cond`s on
    fake tensors, and measured by running that batch: batches of 1 and 3 do not show a cost
    that grows with the batch, nor one behind a branch their zeros do not take. The facts
    it hands back."""
    loaded = load_model(source, sandbox=False, limits=limits, **options)
    flops = batch_flops(loaded, DEFAULT_BATCH_SIZE)
    if flops is not None and flops > limits.first_run_seconds * FLOPS_PER_SECOND:
        raise AttributionError(
            f"The model needs {flops / 1e12:,.2f} TFLOP for a batch of {DEFAULT_BATCH_SIZE} "
            f"samples, counting every branch it may take, over the "
            f"{limits.first_run_seconds * FLOPS_PER_SECOND / 1e12:,.2f} TFLOP its first run "
            f"may stand for ({limits.first_run_seconds:g} s at "
            f"{FLOPS_PER_SECOND / 1e9:,.0f} GFLOP/s), the time budget of a first run. If it "
            "is genuine and yours, load it with sandbox=False (--trust-code) or raise "
            "Limits(first_run_seconds=...) (--first-run-seconds).")
    with eval_mode(loaded.module), torch.no_grad():
        try:
            run_logits(loaded.module, loaded.example_input(DEFAULT_BATCH_SIZE))
        except AttributionError as error:  # a program exported for smaller batches is let
            if "shape[0]" not in str(error):  # through: the engine's batches say why
                raise
    n_classes = loaded.n_classes
    return {"n_classes": n_classes if isinstance(n_classes, int) else None}


def batch_flops(loaded: LoadedModel, batch: int) -> Optional[float]:
    """FLOPs of one forward of `loaded` on a batch of `batch` samples, counted on fake
    tensors (nothing is computed or allocated), every branch of a `torch.cond` included; None
    where the model cannot run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with eval_mode(loaded.module), torch.no_grad(), \
                FakeTensorMode(allow_non_fake_inputs=True), \
                FlopCounterMode(display=False) as counter:
            run_logits(loaded.module, loaded.example_input(batch))
    except Exception:  # noqa: BLE001 (data-dependent shapes and the like: the run decides)
        return None
    return float(counter.get_total_flops())


def first_run(source: Any, limits: Limits, **options: Any) -> jail.Answer:
    """Load and run the model in `source` (bytes, a folder's path or files) in the jail within
    the first-run budget of `limits`; `options` are `load_model`'s (picklable). Its answer:
    a message when refused, else `facts["n_classes"]`."""
    budget = jail.Budget(seconds=limits.first_run_seconds,
                         memory_bytes=limits.first_run_memory_bytes, file_bytes=MB,
                         work=f"Loading the model and running a batch of "
                              f"{DEFAULT_BATCH_SIZE} samples",
                         name="a first run")
    of_a_folder = not isinstance(source, (bytes, bytearray)) and huggingface.is_folder(source)
    return jail.run(first_run_task(of_a_folder),  # by its path or names: no byte parsed here
                    {"source": source, "limits": limits, **options}, budget)


def warm_up() -> None:
    """Start the jail's server for uploads now (it imports torch and the loaders of model
    files and folders in the background), e.g. while a visitor chooses files."""
    jail.warm_up(FIRST_RUN, *FIRST_RUN_OF_A_FOLDER.warm_files)


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


# ---------------------------------------------------------------- state dicts and architectures

def _state_dict_of(obj: Any, limits: Limits) -> dict[str, torch.Tensor]:
    """The state dict in a checkpoint (the object itself, or its one dict of tensors), its
    tensors checked (`checked_state`)."""
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
    return checked_state(state, limits)


def _fill(module: nn.Module, state: dict[str, torch.Tensor], hint: str = "") -> None:
    """Load `state` into `module`, or say exactly which keys and shapes differ."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    different = [k for k in expected if k in state and expected[k].shape != state[k].shape]
    if missing or unexpected or different:
        def listing(keys: Sequence[str], source: dict) -> str:
            shown = ", ".join(f"{k} {shape_text(source[k])}" for k in keys[:6])
            return shown + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")

        parts = []
        if missing:
            parts.append(f"missing from the file: {listing(missing, expected)}")
        if unexpected:
            parts.append(f"in the file but not in the architecture: {listing(unexpected, state)}")
        if different:
            parts.append("different shapes: " + ", ".join(
                f"{k} file {shape_text(state[k])} vs architecture {shape_text(expected[k])}"
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
        listing = ", ".join(f"{k} {shape_text(v)}" for k, v in list(state.items())[:4])
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

@reads_input("model file")
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
        max_bytes: size limit (default `limits.MAX_UPLOAD_BYTES`).
        limits: decoding budgets and the first run's time and memory (default
            `limits.DEFAULT_LIMITS`).
        sandbox: read, load and run the model first in the jail with the first-run budget
            (`attribution.inputs.untrusted.jail`; about 0.1-0.5 s once its server runs, a
            few seconds to start it; the same bytes it accepted before go straight through,
            recognised by their digest, never by their path). Default:
            on, for paths too (a file someone sent you is as untrusted as an upload);
            sandbox=False for your own files. Never used with trust_code or an nn.Module
            architecture, whose code is trusted anyway.
        output: where the logits are in the model's output (`model_io.select_output`).
    Returns:
        LoadedModel with the module in eval mode.
    """
    limits = limits or DEFAULT_LIMITS
    jailed = sandbox is not False and not trust_code and not isinstance(architecture,
                                                                        nn.Module)
    options = dict(class_names=class_names, output=output)
    if not isinstance(source, (bytes, bytearray)) and huggingface.is_folder(source):
        # a save_pretrained folder, or its files uploaded together: read once, and exactly
        # those bytes checked in the jail and then parsed here (nothing is kept by path)
        files = huggingface.read_folder(source, limits) if jailed else source
        if jailed:
            _accept(files, limits, options)
        return huggingface.load_folder(files, limits=limits, **options)
    data, name = read_source(source, max_bytes=max_bytes, what="model")
    if jailed:  # the jail reads the bytes first: architecture, format, weights, a first run
        if isinstance(architecture, (str, os.PathLike)) and os.path.isfile(architecture):
            architecture = read_source(architecture, what="architecture")[0]  # read once
        _accept(data, limits, dict(options, architecture=architecture,
                                   example_input=example_input))
    if huggingface.is_folder(data):  # the folder's zip, by path or uploaded: one route
        return huggingface.load_folder(data, limits=limits, **options)
    try:
        kind = _model_kind(data, name, architecture, limits)
        return _load(data, kind, architecture, example_input, class_names, trust_code,
                     limits, output)
    except MemoryError as error:
        raise out_of_memory(name, error) from None


_ACCEPTED: dict[str, None] = {}
_ACCEPTED_KEPT = 256


def _accept(source: Any, limits: Limits, options: dict) -> None:
    """Have the jail load and run `source` with `options` unless it accepted exactly that
    (bytes, options and limits, by digest) before; raise its refusal."""
    key = hashlib.sha256(pickle.dumps((source, options, limits))).hexdigest()
    if key in _ACCEPTED:
        return
    _import_deserializer_meanwhile()
    answer = first_run(source, limits, **options)
    for thread in _IMPORTING:  # this thread imports nothing while that one does
        thread.join()
    if answer.message is not None:
        raise AttributionError(answer.message)
    _ACCEPTED[key] = None
    while len(_ACCEPTED) > _ACCEPTED_KEPT:
        del _ACCEPTED[next(iter(_ACCEPTED))]


_DESERIALIZER = "torch._export.serde.serialize"


def _import_deserializer_meanwhile() -> None:
    """Import torch.export's deserializer (about 1.2 s, which `torch.export.load` imports
    on first use) in a thread while this one waits for the jail's answer, once per process:
    `layers` on a .pt2 spent 5.3 s, of which that import after the answer. An import reads
    no byte of the file. A failure is left for this thread's own import to raise."""
    if _DESERIALIZER not in sys.modules and not _IMPORTING:
        _IMPORTING.append(threading.Thread(target=_import_quietly, args=(_DESERIALIZER,),
                                           daemon=True))
        _IMPORTING[0].start()


def _import_quietly(name: str) -> None:
    with contextlib.suppress(Exception):
        importlib.import_module(name)


_IMPORTING: list[threading.Thread] = []


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
        state = _state_dict_of(load_safetensors(data, limits), limits)
        source_format = "safetensors"
    else:
        loaded = unpickle(data, limits, what="This checkpoint", remedy=_PICKLE_REMEDY,
                          trust_code=trust_code)
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
    guessed = example is None
    if guessed:
        example = _guess_example(module)
    module.eval()
    try:
        return checked_model(module, example, source_format, class_names, stored_names, output)
    except AttributionError as error:
        if not guessed:
            raise
        raise GuessedExampleFailed(
            f"{error} That input was the loader's guess ({shape_text(example)}, zeros, from "
            "the model's first layer): this file does not say what the model takes. Pass "
            "an example: example_input=x[:2] (a batch of your data) or the shape of one "
            "sample, e.g. example_input=(1, 28, 28); the command line takes the first rows "
            "of --data.") from None


_PICKLE_REMEDY = (
    "A whole model saved with torch.save(model) is such a file: save only the weights "
    "(torch.save(model.state_dict(), 'weights.pt')) and describe the architecture, or export "
    f"the model, which needs no code to load:\n{EXPORT_RECIPE}\nOn your own machine, for a "
    "file you made yourself, trust_code=True loads it.")


def _torchscript_error() -> AttributionError:
    return AttributionError(
        "This is a TorchScript file (torch.jit.save). PyTorch does not allow forward hooks on "
        "ScriptModules, so its neurons cannot be scored. From the original Python model, "
        f"export it instead:\n{EXPORT_RECIPE}")


class GuessedExampleFailed(AttributionError):
    """The model could not run on the example input the loader guessed from its first layer
    (a pickled module or a Python file does not say what it takes): give one
    (`load_model(example_input=...)`)."""


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
