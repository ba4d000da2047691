"""A classifier ready for scoring (`LoadedModel`), and the runs that check one before it is
handed out (`checked_model`): whatever loads a model, from a file, a Hugging Face folder or
the demo, ends here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ..errors import AttributionError
from ..engine.guards import eval_mode
from ..engine.layers import LayerInfo, list_layers, run_logits
from ..engine.model_io import MASK_NAME, NamedInputs, OutputKey, select_output, to_model
from ..engine.model_io import model_device
from .untrusted.export_guard import EXPORT_RECIPE


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
        input_names: for a model called with keywords (transformers, an image beside a
            table), the names it takes (`model_io.NamedInputs`); () for a model of one tensor.
            `input_shape` and `input_dtype` are then the first one's.
        input_specs: (name, shape of one sample, dtype) of each named input (`named_specs`);
            () for one tensor, or where every one is [B, *input_shape] of input_dtype.
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
    input_specs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = ()

    def __post_init__(self):
        if self.output is not None:
            select_output(self.module, self.output)

    def named_specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """name -> (shape of one sample, dtype) of each named input, in `input_names` order."""
        specs = {name: (shape, dtype) for name, shape, dtype in self.input_specs}
        return {name: specs.get(name, (self.input_shape, self.input_dtype))
                for name in self.input_names}

    def example_input(self, batch: int = 1):
        """Zeros [batch, *input_shape] in the model's input dtype; for named inputs one
        tensor per name, each of its own shape and dtype (an attention mask of ones, ids
        ending in the end-of-text id of a transformers config that has one)."""
        if not self.input_names:
            return torch.zeros((batch,) + self.input_shape, dtype=self.input_dtype)
        example = {name: (torch.ones if name == MASK_NAME else torch.zeros)(
            (batch,) + shape, dtype=dtype) for name, (shape, dtype) in self.named_specs().items()}
        end = end_of_text(getattr(self.module, "config", None))
        ids = example.get("input_ids")
        if end is not None and ids is not None and ids.dim() == 2 and ids.shape[1]:
            ids[:, -1] = end  # the text ends as a tokenizer ends it
        return NamedInputs(example)

    def layers(self, example: Any = None) -> list[LayerInfo]:
        """`list_layers` of the module, found with `example` (a few rows of the data: their
        lengths are the positions shown) or, without one, the loader's example input."""
        example = self.example_input() if example is None else example
        return list_layers(self.module, to_model(example, self.module,
                                                 model_device(self.module)))


def end_of_text(config: Any) -> Optional[int]:
    """The end-of-text id that ends an example text (BART's classifier pools each text at
    it and refuses a text without one): a transformers config's eos_token_id where it lies
    in the vocabulary, else None."""
    eos = getattr(config, "eos_token_id", None)
    vocabulary = int(getattr(config, "vocab_size", 0) or 0)
    return eos if isinstance(eos, int) and 0 <= eos < vocabulary else None


def checked_model(module: nn.Module, example: Any, source_format: str,
                  class_names: Optional[Sequence[str]] = None,
                  stored_names: Optional[Sequence[str]] = None,
                  output: OutputKey = None) -> LoadedModel:
    """The LoadedModel of an eval-mode `module`, after runs on batches of 1 and 3 samples
    shaped like `example` ([B, ...] tensor, or `NamedInputs`, each entry of its own sample
    shape and dtype)."""
    if isinstance(example, NamedInputs):
        specs = tuple((name, tuple(int(s) for s in value.shape[1:]), value.dtype)
                      for name, value in example.items())
        first = next(iter(example.values()))
        input_names = tuple(example.keys())
    else:
        first, input_names, specs = example, (), ()
    select_output(module, output)
    loaded = LoadedModel(module=module, input_shape=tuple(int(s) for s in first.shape[1:]),
                         n_classes=0, source_format=source_format, input_dtype=first.dtype,
                         input_names=input_names, output=output,
                         input_specs=specs)
    n_classes = _check_runs(loaded, source_format == "torch.export")
    names = class_names if class_names is not None else stored_names
    if names is not None and len(names) != n_classes:
        raise AttributionError(f"There are {len(names)} class names but the model has "
                               f"{n_classes} outputs.")
    return replace(loaded, n_classes=n_classes,
                   class_names=tuple(str(n) for n in names) if names is not None else None)


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
