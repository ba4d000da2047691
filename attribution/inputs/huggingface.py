"""Hugging Face `save_pretrained` folders, loaded without running any code they carry.

A folder holds `config.json`, `model.safetensors` and maybe tokenizer files; it arrives as a
directory path, as its files uploaded together ({file name: bytes}), or as a zip of them.

Threat model: the files come from anyone. transformers can run code from a checkpoint in
three ways, all closed here: (1) `auto_map` / custom classes in config.json make
`trust_remote_code` import Python shipped with the model, and an `attn_implementation` other
than eager / sdpa fetches a kernel's code: a config naming code at any depth is refused,
and the class is looked up by name only in transformers' own tables of sequence- and
image-classification models (`architectures` must be the class those tables name for the
config's `model_type`; an unknown `model_type` is refused); (2) pickled weights
(`pytorch_model.bin`, `*.pt`, `*.ckpt`) run code when unpickled: only `model.safetensors`
(a data format) is read, and a folder with only pickled weights is refused; (3)
`quantization_config` pulls in optional backends: refused. Size budgets come before any
memory is spent: config.json and tokenizer.json sizes, every integer in the config, and the
parameter count of the model built on the meta device (no storage) against
`Limits.max_parameters`. Tokenizers are read with `tokenizers.Tokenizer.from_str` (the Rust
tokenizer's JSON; no Python); slow tokenizers (sentencepiece / vocab files with code) are not.
"""
from __future__ import annotations

import inspect
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from ..errors import AttributionError
from .untrusted import jail
from .untrusted.files import open_regular, open_zip, sniff, zip_entry_names
from .untrusted.limits import DEFAULT_LIMITS, Limits, over_budget
from .untrusted.tensors import load_safetensors
from ..engine.model_io import MASK_NAME, TEXT_INPUTS, NamedInputs, OutputKey
from .loaded import LoadedModel, checked_model, end_of_text

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack")
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
MAX_CONFIG_INTEGER = 1 << 24
"""Largest integer a config may hold (vocabulary, widths, positions): far above real models,
far below what a crafted config would need to exhaust memory in one dimension."""
MAX_LAYERS = 256
MAX_CONFIG_DEPTH = 32
"""Most levels of nested objects and lists in config.json (transformers' own nest 3-4)."""
EXAMPLE_LENGTH = 8
MAX_TOKEN_CHARS = 64
"""Longest token text kept for display (`TextEncoder.encode`); longer ones end in "…"."""
ENCODE_ROWS = 16
"""Rows tokenized at a time: their full token texts are held only until they are cut."""
TOKENIZE_BYTES = 256 * 10 ** 6
"""Memory a tokenizer may use in the jail beyond the arrays it fills (ids, mask and token
texts per row): a sound one needs kilobytes a row; a normalizer that rewrites a character as
millions needs gigabytes."""
"""Tokens per sample of the example batch (the layer list shows T = 8 positions)."""
_CODE_KEYS = ("auto_map", "custom_pipelines", "trust_remote_code", "quantization_config")
"""Config keys that make transformers import code or optional backends, at any depth (a
composite model's text_config / vision_config is a config too)."""
_ATTENTION_KEYS = ("attn_implementation", "_attn_implementation",
                   "_attn_implementation_internal")
_BUILT_IN_ATTENTION = (None, "eager", "sdpa")
"""The attention implementations transformers runs from its own code; any other value (a
hub kernel such as "kernels-community/flash-attn") makes it fetch and import code."""

Files = Mapping[str, bytes]
FolderSource = Union[str, os.PathLike, bytes, Files]


@dataclass(frozen=True)
class TextEncoder:
    """A fast tokenizer read from tokenizer.json: texts -> named inputs and their tokens.

    Attributes:
        tokenizer: a `tokenizers.Tokenizer`.
        pad_id: id written at padded positions (the config's pad_token_id, else 0).
        max_length: most tokens per text (the model's positions).
    """

    tokenizer: Any
    pad_id: int
    max_length: int

    def encode(self, texts: Sequence[str]) -> tuple[NamedInputs, np.ndarray]:
        """(input_ids and attention_mask [N, T] int64, tokens [N, T] str, "" at padding);
        T is the longest text, at most `max_length` (longer texts are cut there). The token
        texts are for display, cut to MAX_TOKEN_CHARS: numpy stores text at the width of
        the longest, so one long token (a tokenizer's 20,000-character unknown token, say)
        would cost that width at every position. Rows are tokenized ENCODE_ROWS at a time
        (their full token texts are held only that long), within TOKENIZE_BYTES in a jail."""
        jail.tighten(TOKENIZE_BYTES + len(texts) * self.max_length * (16 + 4 * MAX_TOKEN_CHARS))
        rows = []  # (ids, tokens) per row, cut to max_length tokens of MAX_TOKEN_CHARS
        for start in range(0, len(texts), ENCODE_ROWS):
            for encoding in self.tokenizer.encode_batch(
                    [str(text) for text in texts[start:start + ENCODE_ROWS]]):
                rows.append((encoding.ids[:self.max_length],
                             [token if len(token) <= MAX_TOKEN_CHARS
                              else token[:MAX_TOKEN_CHARS - 1] + "…"
                              for token in encoding.tokens[:self.max_length]]))
        length = max(1, max((len(row_ids) for row_ids, _ in rows), default=1))
        ids = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        tokens = np.full((len(rows), length), "", dtype=object)
        for row, (row_ids, row_tokens) in enumerate(rows):
            ids[row, :len(row_ids)] = row_ids
            mask[row, :len(row_ids)] = 1
            tokens[row, :len(row_ids)] = row_tokens
        return (NamedInputs({"input_ids": torch.from_numpy(ids),
                             MASK_NAME: torch.from_numpy(mask)}), tokens.astype(str))

    def plain(self) -> dict:
        """This encoder as plain data (the tokenizer as its JSON text), for the jail."""
        return {"json": self.tokenizer.to_str(), "pad_id": self.pad_id,
                "max_length": self.max_length}

    @classmethod
    def from_plain(cls, plain: dict) -> "TextEncoder":
        """The encoder `plain()` describes."""
        return cls(_tokenizer(plain["json"].encode("utf-8")), int(plain["pad_id"]),
                   int(plain["max_length"]))


def is_folder(source: Any) -> bool:
    """Is `source` a save_pretrained folder: a directory, uploaded files or a zip with a
    config.json?"""
    if isinstance(source, (str, os.PathLike)):
        return Path(source).is_dir()
    if isinstance(source, Mapping):
        return CONFIG in {Path(name).name for name in source}
    if isinstance(source, (bytes, bytearray)) and sniff(bytes(source[:4])) == "zip":
        return any(Path(name).name == CONFIG for name in zip_entry_names(bytes(source)))
    return False


def _one_each(names: Sequence[str]) -> None:
    """Refuse a folder where two files would be read as one of the files this module reads
    (a nested config.json beside the top-level one): which one wins must not be a guess."""
    for wanted in (CONFIG, WEIGHTS, TOKENIZER):
        found = [name for name in names if Path(name).name == wanted]
        if len(found) > 1:
            raise AttributionError(
                f"The folder holds {len(found)} files named {wanted} ({', '.join(found[:3])}); "
                "upload one save_pretrained folder, with one of each.")


def read_folder(source: FolderSource, limits: Limits) -> dict[str, bytes]:
    """File name -> bytes of the folder's top-level files (only those this module reads; the
    others by name, empty): what `load_folder` takes, read once."""
    wanted = (CONFIG, WEIGHTS, TOKENIZER)
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        names = [path.name for path in folder.iterdir() if path.is_file()]
        files = {}
        for name in wanted:
            path = folder / name
            if path.is_file():
                with open_regular(path, name) as stream:
                    _check_size(name, os.fstat(stream.fileno()).st_size, limits)
                    files[name] = stream.read()
        return {**{name: b"" for name in names if name not in files}, **files}
    if isinstance(source, Mapping):
        _one_each(list(source))
        files = {Path(name).name: bytes(data) for name, data in source.items()}
    else:
        archive = open_zip(bytes(source), limits)
        _one_each(archive.namelist())
        files = {}
        for entry in archive.infolist():
            name = Path(entry.filename).name
            if name in wanted:
                _check_size(name, entry.file_size, limits)
                files[name] = archive.read(entry)
            elif name:
                files[name] = b""
    for name in wanted:
        if name in files:
            _check_size(name, len(files[name]), limits)
    return files


def _check_size(name: str, size: int, limits: Limits) -> None:
    limit = {CONFIG: MAX_CONFIG_BYTES, TOKENIZER: MAX_TOKENIZER_BYTES}.get(
        name, limits.max_decoded_bytes)
    if size > limit:
        raise AttributionError(f"{name} is {size:,} bytes, over the limit of {limit:,} for "
                               "that file of a Hugging Face folder.")


def read_config(text: bytes) -> dict:
    """config.json as a dict, refused when it names code or holds oversized numbers."""
    try:
        config = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise AttributionError(f"config.json is not valid JSON ({error}).") from None
    except RecursionError:
        raise AttributionError(f"config.json nests objects or lists deeper than the parser "
                               f"allows; a model config nests at most {MAX_CONFIG_DEPTH} "
                               "levels.") from None
    if not isinstance(config, dict):
        raise AttributionError("config.json must hold a JSON object.")
    named_code = list(_keys_naming_code(config))
    if named_code:
        raise AttributionError(
            f"config.json sets {', '.join(named_code)}: it asks to run code shipped with the "
            "model or fetched for it (custom classes, attention kernels, quantization "
            "backends). Only transformers' own architectures and attention (eager, sdpa) are "
            "loaded here; save the model with a built-in class (e.g. "
            "BertForSequenceClassification) and without custom code.")
    _check_numbers(config)
    return config


def _keys_naming_code(value: Any, path: str = "", depth: int = 0):
    """The dotted paths of config entries that name code (`_CODE_KEYS`, or an attention
    implementation other than `_BUILT_IN_ATTENTION`), searched through nested objects and
    lists, at most MAX_CONFIG_DEPTH deep."""
    if depth > MAX_CONFIG_DEPTH:
        raise AttributionError(f"config.json nests deeper than {MAX_CONFIG_DEPTH} levels (at "
                               f"{path[:80]}); a model config is not that deep.")
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in _CODE_KEYS:
                yield where
            elif key in _ATTENTION_KEYS and item not in _BUILT_IN_ATTENTION:
                yield f"{where} = {item!r}"[:120]
            else:
                yield from _keys_naming_code(item, where, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _keys_naming_code(item, f"{path}[{index}]", depth + 1)


def _check_numbers(value: Any, key: str = "") -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        limit = MAX_LAYERS if "layer" in key.lower() else MAX_CONFIG_INTEGER
        if not -MAX_CONFIG_INTEGER <= value <= limit:
            raise AttributionError(f"config.json sets {key} = {value}, over the limit of "
                                   f"{limit:,}; such a model cannot be loaded here.")
    elif isinstance(value, dict):
        for name, item in value.items():
            _check_numbers(item, str(name))
    elif isinstance(value, list):
        if len(value) > MAX_CONFIG_INTEGER:
            raise AttributionError(f"config.json holds a list of {len(value):,} values.")
        for item in value:
            _check_numbers(item, key)


def allowed_classes() -> dict[str, tuple[str, str]]:
    """model_type -> (class name, task) of every sequence- and image-classification model
    that transformers itself defines."""
    from transformers.models.auto import modeling_auto

    allowed = {}
    for task, table in (("image", modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES),
                        ("text", modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)):
        for model_type, names in table.items():
            for name in (names,) if isinstance(names, str) else tuple(names):
                allowed.setdefault(model_type, (name, task))
    return allowed


PT2_ROUTE = ("export the model to a .pt2 file on your own machine, which loads here "
             "whatever its type: attribution.save_pt2(model, example_batch, 'model.pt2') "
             "(or torch.export.export + torch.export.save).")
"""The route for a Hugging Face model this loader does not build from its folder."""


def model_class(config: dict) -> tuple[type, Any, str]:
    """(transformers class, its config object, "text" or "image") for a checked config."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    allowed = allowed_classes()
    if not isinstance(model_type, str) or model_type not in allowed \
            or model_type not in CONFIG_MAPPING:
        raise AttributionError(
            f"config.json has model_type {model_type!r}, which is not one of transformers' "
            "built-in sequence or image classification models (e.g. bert, gpt2, distilbert, "
            "roberta, vit). Other model types are not loaded from a folder; " + PT2_ROUTE)
    expected, task = allowed[model_type]
    architectures = config.get("architectures") or [expected]
    if not isinstance(architectures, list) or architectures[0] != expected:
        raise AttributionError(
            f"config.json names the architecture {architectures!r}; for model_type "
            f"{model_type!r} only {expected} (transformers' own classifier) is loaded from a "
            "folder; " + PT2_ROUTE)
    try:
        config_object = CONFIG_MAPPING[model_type].from_dict(config)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise AttributionError(f"config.json does not describe a valid {model_type} model "
                               f"({type(error).__name__}: {error}).") from None
    return getattr(transformers, expected), config_object, task


def _parameter_count(cls: type, config: Any) -> int:
    """Parameters of the model, counted on the meta device (no memory is allocated)."""
    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception as error:  # a config transformers itself cannot build
        raise AttributionError(f"transformers cannot build {cls.__name__} from this "
                               f"config.json ({type(error).__name__}: {error}).") from None
    return sum(parameter.numel() for parameter in model.parameters())


def load_folder(source: FolderSource, *, class_names: Optional[Sequence[str]] = None,
                limits: Optional[Limits] = None, output: OutputKey = None) -> LoadedModel:
    """Load a save_pretrained folder of a sequence or image classifier.

    Args:
        source: a directory, {file name: bytes} of its files, or the bytes of a zip of them.
        class_names: one name per class; default: the config's id2label when it is not
            transformers' placeholder LABEL_i.
        limits: budgets (default `limits.DEFAULT_LIMITS`).
        output: where the logits are in the output (default: `.logits`).
    Returns:
        LoadedModel in eval mode, called with named inputs (input_ids, attention_mask,
        token_type_ids as the class takes them; or pixel_values), with `tokenizer` set
        when the folder has a tokenizer.json.
    """
    limits = limits or DEFAULT_LIMITS
    files = read_folder(source, limits)
    if CONFIG not in files:
        raise AttributionError("This folder has no config.json; it is not a Hugging Face "
                               "save_pretrained folder.")
    config = read_config(files[CONFIG])
    if WEIGHTS not in files:
        pickled = [name for name in files if name.endswith(PICKLED_WEIGHTS)]
        raise AttributionError(
            ("The folder's weights are pickled (" + ", ".join(pickled) + "); unpickling can "
             "run code, so only model.safetensors is read. " if pickled else
             "The folder has no model.safetensors. ")
            + "Save the model with model.save_pretrained(folder) (safetensors is the default) "
            "or convert the weights with safetensors.torch.save_file.")
    cls, config_object, task = model_class(config)
    count = _parameter_count(cls, config_object)
    if count > limits.max_parameters:
        raise AttributionError(over_budget("This config.json describes a model of",
                                           f"{count:,} parameters",
                                           f"{limits.max_parameters:,}", "max_parameters"))
    if hasattr(config_object, "use_cache"):
        config_object.use_cache = False  # no key/value cache: one pass per batch
    load_safetensors(files[WEIGHTS], limits)  # the tensors checked before transformers reads
    module = _from_weights(cls, config_object, files[WEIGHTS])
    tokenizer = _tokenizer(files.get(TOKENIZER)) if task == "text" else None
    if task == "text":
        _set_pad_id(module, tokenizer)
    example = _example(module, config_object, task)
    names = class_names if class_names is not None else _label_names(config_object)
    loaded = checked_model(module, example, "Hugging Face", names, output=output)
    if tokenizer is None:
        return loaded
    pad_id = getattr(module.config, "pad_token_id", None)
    return replace(loaded, tokenizer=TextEncoder(tokenizer, 0 if pad_id is None else int(pad_id),
                                                 max_tokens(module)))


def _from_weights(cls: type, config: Any, weights: bytes) -> nn.Module:
    """`cls.from_pretrained` on a private folder holding only these safetensors weights:
    transformers renames its older checkpoints' keys (ViT's encoder.layer -> layers) and
    ties weights as for any checkpoint; local files only, safetensors only, float32."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / WEIGHTS).write_bytes(weights)
        try:
            module, info = cls.from_pretrained(folder, config=config, local_files_only=True,
                                               use_safetensors=True, dtype=torch.float32,
                                               output_loading_info=True)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise AttributionError(f"model.safetensors does not fit this config.json "
                                   f"({reason}).") from None
    missing = sorted(info.get("missing_keys") or []) + sorted(info.get("mismatched_keys") or [])
    if missing:  # transformers would fill them with random numbers
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise AttributionError(f"model.safetensors lacks {len(missing)} weight(s) of "
                               f"{cls.__name__} ({shown}); save the model again with "
                               "save_pretrained.")
    return module.eval()


def _example(module: nn.Module, config: Any, task: str) -> NamedInputs:
    """Two samples of the inputs the class takes (ids of 1 ending in the end-of-text id
    where the config has one in its vocabulary, a mask of ones)."""
    if task == "image":
        size = getattr(config, "image_size", None)
        size = (size, size) if isinstance(size, int) else tuple(size or ())
        channels = getattr(config, "num_channels", 3)
        if len(size) != 2:
            raise AttributionError("config.json gives no image_size for this image model.")
        return NamedInputs({"pixel_values": torch.zeros((2, channels) + size)})
    accepted = inspect.signature(module.forward).parameters
    length = min(EXAMPLE_LENGTH, max_tokens(module))
    ids = torch.ones((2, length), dtype=torch.long)
    end = end_of_text(config)
    if end is not None:
        ids[:, -1] = end  # a text ends in its end-of-text token
    # token_type_ids only for a model with segment embeddings (BERT's): GPT-2's forward
    # takes them too, but no user of a GPT-2 passes them
    wanted = [name for name in TEXT_INPUTS if name in accepted and (
        name != "token_type_ids" or getattr(config, "type_vocab_size", None))]
    return NamedInputs({name: ids if name != "token_type_ids" else torch.zeros_like(ids)
                        for name in wanted})


def _label_names(config: Any) -> Optional[list[str]]:
    labels = getattr(config, "id2label", None) or {}
    names = [str(labels.get(i, labels.get(str(i), ""))) for i in range(len(labels))]
    if not names or all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None
    return names


def max_tokens(module: nn.Module) -> int:
    """The most tokens one text may have: the model's positions, less the ids a position
    embedding with a padding index skips (RoBERTa counts positions from pad_token_id + 1, so
    80 positions and pad id 1 take 78 tokens); 512 when the config names none."""
    config = module.config
    positions = int(getattr(config, "max_position_embeddings", None)
                    or getattr(config, "n_positions", None) or 512)
    for name, child in module.named_modules():
        if (name.endswith("position_embeddings") and isinstance(child, nn.Embedding)
                and child.padding_idx is not None):
            return max(1, min(positions, child.num_embeddings) - child.padding_idx - 1)
    return positions


def _tokenizer(text: Optional[bytes]):
    """The `tokenizers.Tokenizer` of a tokenizer.json (no padding, no truncation: the
    encoder does both), or None without one."""
    if not text:
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(text.decode("utf-8"))
    except Exception as error:  # the Rust parser's own errors
        raise AttributionError(f"tokenizer.json could not be read ({error}).") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>", "<|endoftext|>")
"""Token texts taken as padding where a tokenizer.json names no padding of its own."""


def _set_pad_id(module: nn.Module, tokenizer) -> None:
    """Give a classifier that finds each text's last token by its pad_token_id (GPT-2,
    Llama, Qwen2 ...: transformers refuses batches of several texts without one) a pad id
    where config.json leaves it unset: the tokenizer's padding token, else the config's
    end-of-text id (transformers' usual choice), ids no text encodes to. Without either, the
    error says what to set."""
    config = module.config
    if getattr(config, "pad_token_id", None) is not None or not finds_last_token(module):
        return
    vocabulary = int(getattr(config, "vocab_size", 0) or 0)
    candidates = [] if tokenizer is None else [tokenizer.token_to_id(text)
                                               for text in PAD_TOKENS]
    candidates.append(getattr(config, "eos_token_id", None))
    chosen = next((int(c) for c in candidates
                   if isinstance(c, int) and 0 <= c < vocabulary), None)
    if chosen is None:
        raise AttributionError(
            f"{type(module).__name__} finds each text's last token by config.pad_token_id, "
            "which config.json leaves unset, and neither a padding token nor an end-of-text "
            "id (eos_token_id) in the vocabulary can stand in. Set \"pad_token_id\" in "
            "config.json to the id your texts are padded with (an id no text contains), e.g. "
            "model.config.pad_token_id = tokenizer.eos_token_id before save_pretrained.")
    config.pad_token_id = chosen


def finds_last_token(module: nn.Module) -> bool:
    """Does this transformers classifier find each text's last token by config.pad_token_id
    (decoder models: GPT-2, Llama, Qwen2 ...), so that padding must hold that id?"""
    return (getattr(module, "config", None) is not None
            and "pad_token_id" in _source(type(module).forward))


def check_padding(module: nn.Module, inputs: NamedInputs) -> None:
    """Token ids given with an attention mask, for a classifier that `finds_last_token`:
    its padded positions (mask 0) must hold config.pad_token_id, or the classifier reads
    padding as the last token."""
    entries = dict(inputs.items())
    ids, mask = entries.get("input_ids"), entries.get(MASK_NAME)
    pad_id = getattr(getattr(module, "config", None), "pad_token_id", None)
    if ids is None or mask is None or pad_id is None or not finds_last_token(module):
        return
    found = ids[(mask == 0) & (ids != pad_id)]
    if len(found):
        shown = ", ".join(map(str, sorted(set(found.tolist()))[:5]))
        raise AttributionError(
            f"At padded positions (attention_mask 0) input_ids hold {shown}, but "
            f"{type(module).__name__} finds each text's last token by pad_token_id "
            f"{pad_id}: pad input_ids with {pad_id} (or set pad_token_id in config.json to "
            "the id you pad with).")


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""
