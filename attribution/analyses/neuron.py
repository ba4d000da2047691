"""One neuron up close: how much it matters for a cluster and what it responds to.

    view = neuron_view(model, "relu2", inputs, targets, scores, activations, in_cluster, 7)
    view.samples   # per-sample score and activation, cluster vs rest
    view.removal   # accuracy and target logit with the neuron removed alone, cluster and rest
    view.examples  # the samples that drive it most and least, with the neuron's map over them

The samples that "drive" a neuron are those with its highest and lowest activation (its
output, averaged over positions for conv channels and sequences), over all samples. For a
layer with positions (a conv channel [H', W'], a sequence [T]) each example also carries the
neuron's output at every position: the map drawn over an image, the per-token values of a
token sequence; for token ids and a method with a value per token (`token_methods()`), each
example carries its tokens and their scores (`attribution.methods.tokens.token_scores`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..errors import AttributionError
from ..defaults import DEFAULT_BATCH_SIZE
from ..engine.layers import resolve_layer
from ..engine.model_io import NamedInputs, sample_values
from ..methods.passes import LayerBatch, LayerPass, Progress
from ..methods.tokens import token_methods, token_scores
from .pruning_curves import metric_values
from .ranks import CONFIDENCE

INPUT_KINDS = ("image", "tokens", "table", "other")
REMOVAL_SHARE = 0.9  # of the view's work: the removal pass over every sample (the rest: examples)
_POINT_NEURON = re.compile(r"^neuron (\d+)$")


@dataclass(frozen=True)
class NeuronView:
    """What the neuron view shows for one neuron.

    Attributes:
        layer, neuron: which neuron.
        input_kind: how the inputs are drawn (one of `INPUT_KINDS`).
        samples: rows (sample, score, activation, in_cluster), one per sample [N].
        removal: rows (subset, metric, intact, removed, change, change_low, change_high)
            (for a regression head "squared_error" with true values, and "target_logit", its
            output): "accuracy" and "target_logit" of the cluster (and the rest) with the
            neuron removed alone; change_low/high: the change's 95% interval over the
            samples (`change_interval`).
        examples: rows (sample, rank, side, activation, score, in_cluster, label,
            input, positions, tokens, token_scores): side "most" or "least"; `input` the
            sample's input array (image [C, H, W], token ids [T], features [F]; named
            inputs: {name: array}, `model_io.sample_values`); `positions`
            the neuron's output at each position ([H', W'] or [T]) or None for a layer
            without positions; `tokens` (str [T']) and `token_scores` [T'] the sample's real
            tokens and the method's score at each, or None.
    """

    layer: str
    neuron: int
    input_kind: str
    samples: pd.DataFrame
    removal: pd.DataFrame
    examples: pd.DataFrame


def input_kind(inputs: torch.Tensor, image_shape: Optional[tuple[int, ...]] = None) -> str:
    """"image" for [N, C, H, W] with 1, 3 or 4 channels or data that declares an
    `image_shape` (a table of pixels), "tokens" for integer ids (named inputs: all of them
    integers), "table" for [N, F] features, else "other" (an image beside a table)."""
    if isinstance(inputs, NamedInputs):
        return "other" if inputs.dtype.is_floating_point else "tokens"
    if not inputs.is_floating_point():
        return "tokens"
    if image_shape is not None or (inputs.dim() == 4 and inputs.shape[1] in (1, 3, 4)):
        return "image"
    if inputs.dim() == 2:
        return "table"
    return "other"


def neuron_from_point(point: dict) -> Optional[int]:
    """The neuron of a clicked chart point: a bar labelled "neuron 7" (y) or a heatmap cell
    whose x is the neuron index; None when the point names none."""
    label = point.get("y")
    if isinstance(label, str) and _POINT_NEURON.match(label):
        return int(_POINT_NEURON.match(label).group(1))
    x = point.get("x")
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, str) and x.isdigit():
        return int(x)
    return None


def neuron_view(model: nn.Module, layer, inputs: torch.Tensor, targets: Optional[torch.Tensor],
                scores: np.ndarray, activations: np.ndarray, in_cluster: np.ndarray,
                neuron: int, *, labels: Optional[torch.Tensor] = None, n_examples: int = 8,
                method: Optional[str] = None, tokens: Optional[np.ndarray] = None,
                image_shape: Optional[tuple[int, ...]] = None,
                batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress = None) -> NeuronView:
    """Everything the neuron view draws for `neuron` of `layer`.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name or the module itself.
        inputs: every sample [N, ...] (a tensor held in memory).
        targets: class per sample whose logit is measured [N], or None (the predicted class).
        scores: per-sample scores of the method in use [N, n_neurons].
        activations: per-sample activations [N, n_neurons] (the engine's `activation` score).
        in_cluster: bool [N], the cluster in focus.
        neuron: index in 0..n_neurons-1.
        labels: true class per sample [N] for the examples' captions (a regression head's
            true values, float: its squared error is measured too), or None.
        n_examples: samples shown on each side (most, least).
        method: the method of `scores`, for per-token scores of token ids (None: none).
        tokens: str [N, T], the token text at each position, or None (ids are shown).
        image_shape: each sample drawn as an image of this shape, (H, W) or (C, H, W)
            (`Dataset.image_shape`: a table of pixels), or None.
        progress: called with the fraction done after each batch of the removal pass, and
            with 1.0 when the view is complete.
    Returns:
        A `NeuronView`.
    """
    scores, activations = np.asarray(scores), np.asarray(activations)
    in_cluster = np.asarray(in_cluster, dtype=bool)
    n_samples, n_neurons = scores.shape
    if activations.shape != scores.shape or in_cluster.shape != (n_samples,) \
            or inputs.shape[0] != n_samples:
        raise AttributionError(f"scores {list(scores.shape)}, activations "
                               f"{list(activations.shape)}, in_cluster {list(in_cluster.shape)} "
                               f"and inputs {list(inputs.shape[:1])} must describe the same "
                               "samples and neurons.")
    if isinstance(neuron, bool) or not isinstance(neuron, (int, np.integer)) \
            or not 0 <= neuron < n_neurons:
        raise AttributionError(f"Neuron {neuron!r} is not in this layer (0..{n_neurons - 1}).")
    neuron = int(neuron)
    name, _ = resolve_layer(model, layer)
    samples = pd.DataFrame({"sample": np.arange(n_samples), "score": scores[:, neuron],
                            "activation": activations[:, neuron], "in_cluster": in_cluster})
    values = labels if labels is not None and labels.is_floating_point() else None
    removal = _removal(model, name, inputs, targets, in_cluster, neuron, batch_size,
                       None if progress is None else lambda f: progress(REMOVAL_SHARE * f),
                       values)
    examples = neuron_examples(model, name, inputs, samples, neuron, labels=labels,
                               n_examples=n_examples, image_shape=image_shape)
    kind = input_kind(inputs, image_shape)
    if kind == "tokens" and method in token_methods() and examples["positions"].notna().all():
        _add_token_scores(examples, model, name, inputs, targets, neuron, method, tokens)
    if progress is not None:
        progress(1.0)
    return NeuronView(name, neuron, kind, samples, removal, examples)


def _add_token_scores(examples: pd.DataFrame, model, name: str, inputs: torch.Tensor,
                      targets: Optional[torch.Tensor], neuron: int, method: str,
                      tokens: Optional[np.ndarray]) -> None:
    """Fill the examples' tokens and token_scores columns (in place)."""
    chosen = examples["sample"].to_numpy()
    index = torch.tensor(chosen, dtype=torch.long)  # pandas hands out a read-only view
    table = token_scores(model, name, inputs[index], neuron,
                         None if targets is None else targets[index], method=method,
                         tokens=None if tokens is None else np.asarray(tokens)[chosen])
    parts = dict(tuple(table.groupby("sample")))
    examples["tokens"] = [parts[i]["token"].tolist() if i in parts else [] for i in
                          range(len(chosen))]
    examples["token_scores"] = [parts[i]["score"].to_numpy() if i in parts else np.zeros(0)
                                for i in range(len(chosen))]


def _removal(model, name: str, inputs: torch.Tensor, targets: Optional[torch.Tensor],
             in_cluster: np.ndarray, neuron: int, batch_size: int,
             progress: Progress = None, values: Optional[torch.Tensor] = None) -> pd.DataFrame:
    """Accuracy and mean target logit per subset (a regression head: its squared error
    against the true `values`, when given, and its mean output), intact and with `neuron`'s
    output set to 0 (the pruning curves' zero ablation at k=1, in the same pass and modes):
    one capture and one tail pass per batch."""
    def remove(batch: LayerBatch) -> tuple[torch.Tensor, torch.Tensor]:
        z, state, logits = batch.runner.capture(batch.x)
        z = z.clone()
        z[:, neuron] = 0
        return logits.float().cpu(), batch.runner.tail(z, state, 1).float().cpu()

    layer_pass = LayerPass(model, name, inputs, targets, batch_size=batch_size, grad=False,
                           accepts=(), what="evaluate",
                           need="The neuron view measures one target per sample")
    results = [result for _, result in layer_pass.run(remove, progress)]
    intact, removed = (torch.cat(parts) for parts in zip(*results))
    wanted = intact.argmax(1) if layer_pass.targets is None else layer_pass.targets.cpu()
    subsets = [("cluster", in_cluster)] + ([("rest", ~in_cluster)] if not in_cluster.all()
                                           else [])
    metrics = ("accuracy", "target_logit") if intact.shape[1] > 1 else \
        ("squared_error",) * (values is not None) + ("target_logit",)
    rows = []
    for metric in metrics:
        against = values if metric == "squared_error" else wanted
        for subset, rows_of in subsets:
            mask = torch.from_numpy(rows_of)
            before, after = (metric_values(logits[mask], against[mask], metric).double()
                             .numpy() for logits in (intact, removed))
            low, high = change_interval(after - before)
            rows.append({"subset": subset, "metric": metric, "intact": float(before.mean()),
                         "removed": float(after.mean()),
                         "change": float(after.mean() - before.mean()),
                         "change_low": low, "change_high": high})
    return pd.DataFrame(rows)


def change_interval(changes: np.ndarray) -> tuple[float, float]:
    """The CONFIDENCE interval of the mean of per-sample `changes` [m] (the removal's
    effect, each sample against itself intact): Student's t; the mean itself twice for a
    change that is the same on every sample (none, most often); NaN for one sample."""
    from scipy import stats  # as ranks.rank_correlation: on first use

    if len(changes) < 2:
        return float("nan"), float("nan")
    mean = float(changes.mean())
    spread = float(changes.std(ddof=1)) / np.sqrt(len(changes))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(changes) - 1)) * spread
    return mean - half, mean + half


def neuron_examples(model: nn.Module, layer, inputs: torch.Tensor, samples: pd.DataFrame,
                    neuron: int, *, labels: Optional[torch.Tensor] = None, n_examples: int = 8,
                    image_shape: Optional[tuple[int, ...]] = None) -> pd.DataFrame:
    """The samples that activate `neuron` most and least: `NeuronView.examples`.

    Args:
        samples: one row per sample with its "activation", "score" and "in_cluster".
        image_shape: draw each input as an image of this shape, (H, W) or (C, H, W); None:
            the input as it is.
    """
    name, _ = resolve_layer(model, layer)
    examples = _examples(model, name, inputs, samples, labels, neuron, n_examples)
    if image_shape is not None:
        chw = tuple(image_shape) if len(image_shape) == 3 else (1, *image_shape)
        examples["input"] = [np.asarray(value).reshape(chw) for value in examples["input"]]
    examples["tokens"], examples["token_scores"] = None, None
    return examples


def _examples(model, name: str, inputs: torch.Tensor, samples: pd.DataFrame,
              labels: Optional[torch.Tensor], neuron: int, n_examples: int) -> pd.DataFrame:
    order = np.argsort(-samples["activation"].to_numpy(), kind="stable")
    shown = min(n_examples, len(order) // 2) or min(n_examples, len(order))
    most, least = order[:shown], order[::-1][:shown]
    chosen = np.concatenate([most, least])
    positions = _positions(model, name, inputs[torch.from_numpy(chosen)], neuron)
    rows = []
    for position, (sample, side) in enumerate(zip(chosen, ["most"] * len(most)
                                                  + ["least"] * len(least))):
        rows.append({
            "sample": int(sample), "rank": position % max(1, len(most)) + 1, "side": side,
            "activation": float(samples["activation"].iloc[sample]),
            "score": float(samples["score"].iloc[sample]),
            "in_cluster": bool(samples["in_cluster"].iloc[sample]),
            "label": None if labels is None else labels[sample].item(),
            "input": sample_values(inputs, sample),
            "positions": None if positions is None else positions[position],
        })
    return pd.DataFrame(rows)


def _positions(model: nn.Module, name: str, x: torch.Tensor, neuron: int) -> Optional[Any]:
    """The neuron's output at each position for samples x: [B, H', W'] or [B, T] as numpy,
    or None when the layer has no positions ([B, n])."""
    if x.shape[0] == 0:
        return None
    layer_pass = LayerPass(model, name, x, batch_size=x.shape[0], grad=False)
    (_, z), = layer_pass.run(lambda batch: batch.runner.capture(batch.x)[0])  # [B, n, ...]
    if z.dim() <= 2:
        return None
    return z[:, neuron].detach().float().cpu().numpy()
