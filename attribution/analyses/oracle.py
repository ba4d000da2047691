"""Agreement of each scoring method with the exact single-neuron ablation effect (the oracle).

The oracle of neuron j on a cluster is the mean drop of the target logit when j alone is
zeroed, F(x) - F(x with z_j := 0), averaged over the cluster's samples: the `ablation`
method with reduce="mean". Each method's cluster score is compared with it by rank
correlation, as in Molchanov et al. (ICLR 2017, Table 1: Spearman with the oracle).

Conventions: "signed" compares the scores with the oracle as they are (a large positive score
should mean a large drop); "abs" compares |score| with |oracle| (how much the neuron matters,
in either direction). Top-k overlap is the share of the oracle's k highest neurons (by signed
value, or by magnitude for "abs") that the method also puts in its top k.
"""
from __future__ import annotations

import math
import warnings
from statistics import NormalDist
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..engine import model_io
from ..errors import AttributionError
from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_N_STEPS, DEFAULT_REDUCE, DEFAULT_SEED
from ..methods.registry import METHODS, REGISTRY, methods_for
from ..methods.passes import check_targets
from ..methods.scores import (Inputs, check_method, check_reduce, cluster_codes, cluster_scores,
                              find_cluster, n_samples)
from ..engine.layers import module_kind, resolve_layer
from ..engine.runners import LAYER_KEYS

CONFIDENCE = 0.95
"""The level of every bootstrap interval (the scorecard's, the degeneracy checks')."""
ORACLE_COLUMNS = ("cluster", "method", "n", "spearman_signed", "spearman_abs", "kendall_signed",
                  "kendall_abs", "top_k_overlap_signed", "top_k_overlap_abs", "top_k")

TableProgress = Optional[Callable[[float, pd.DataFrame], object]]


def oracle_agreement(model: nn.Module, layer, inputs: Inputs, targets,
                     methods: Sequence[str] = METHODS, clusters=None, *, cluster=None,
                     reduce: str = DEFAULT_REDUCE, top_k: Optional[int] = None,
                     batch_size: int = DEFAULT_BATCH_SIZE, n_steps: int = DEFAULT_N_STEPS,
                     seed: int = DEFAULT_SEED, progress: TableProgress = None,
                     device=None) -> pd.DataFrame:
    """Rank correlation of each method's cluster scores with the exact ablation oracle.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name or the module itself.
        inputs: [N, ...] tensor or array, or an iterable of batches.
        targets: LongTensor [N] of class ids, or None (the predicted class).
        methods: method names from `METHODS` (the oracle itself, "ablation", scores 1.0);
            all of `METHODS` (as registered now) leaves out those that cannot score integer
            inputs (`Method.needs_float_inputs`: conductance) or this kind of layer
            (`Method.layer_kinds`: bn_scale, weight_norm), and those that refuse this model
            (deeplift where a ReLU module runs twice): `attrs["refused"]` says why. A method
            named in a list of your own that refuses raises its AttributionError.
        clusters: 1-D array of cluster ids [N]; None = all samples form one cluster "all".
        cluster: compare on this cluster alone (one row per method), scoring its samples
            only; a method fitted to the clusters (`probe`) is fitted on every sample's.
            None: every cluster. Needs inputs held in memory.
        reduce: how each method's per-sample scores become a cluster score ("mean",
            "mean_abs" or "std"); the oracle is always the signed mean effect.
        top_k: k of the top-k overlap; None = 10% of the neurons, at least 1.
        batch_size, n_steps, seed, device: as in `cluster_scores`.
        progress: called as progress(fraction, partial_table) as work advances; may raise.
    Returns:
        DataFrame with columns `ORACLE_COLUMNS`, one row per (cluster, method) in the order
        given: n = cluster size; correlations are NaN where a ranking is constant (e.g. every
        neuron of the cluster dead); top_k = the k used. `attrs`: the layer's neuron axis
        (`runners.layer_attrs`) and "refused": {method: the reason} for the methods left out.
    """
    methods = list(dict.fromkeys(methods))
    every = tuple(methods) == tuple(METHODS)
    if every:
        name, module = resolve_layer(model, layer)
        methods = list(methods_for(_input_dtype(inputs), module_kind(name, module)))
    if not methods:
        raise AttributionError("Pass at least one method to compare with the oracle.")
    for method in methods:
        check_method(method)
    check_reduce(reduce)
    check_targets(targets, n_samples(inputs), inputs=inputs, accepts=(),
                  need="The oracle is the drop of one target logit per sample")
    if clusters is None:
        total = n_samples(inputs)
        if total is None:
            raise AttributionError("With iterable inputs pass clusters (one id per sample), "
                                   "e.g. np.zeros(N) for a single cluster.")
        clusters = np.full(total, "all", dtype=object)
    ids = cluster_codes(clusters, n_samples(inputs))[1]  # fail early on bad clusters
    every_sample = (inputs, targets, clusters)
    if cluster is not None:
        cluster = find_cluster(cluster, ids)
        rows = torch.from_numpy(np.flatnonzero(np.asarray(clusters) == cluster))
        inputs, clusters = model_io.take(inputs, rows), np.asarray(clusters)[rows.numpy()]
        targets = targets[rows] if isinstance(targets, torch.Tensor) else targets

    steps = [("ablation", "mean")] + [(method, reduce) for method in methods
                                      if (method, reduce) != ("ablation", "mean")]
    rows: list[dict] = []
    refused: dict[str, str] = {}
    oracle = None
    for index, (method, how) in enumerate(steps):
        def report(fraction: float, index: int = index) -> None:
            if progress is not None:
                progress((index + fraction) / len(steps), _ordered(rows, methods))

        fitted_here = cluster is not None and REGISTRY[method].fit is not None
        try:
            table = cluster_scores(model, layer, *(every_sample if fitted_here else
                                                   (inputs, targets, clusters)), method,
                                   reduce=how, batch_size=batch_size, n_steps=n_steps,
                                   seed=seed, progress=report, device=device)
            if fitted_here:
                table = table.loc[[cluster]]
        except AttributionError as error:
            if not every or oracle is None:
                raise
            refused[method] = str(error)
            continue
        if oracle is None:
            oracle = table
            neurons = [column for column in oracle.columns if column != "n"]
            k = top_k if top_k is not None else max(1, math.ceil(0.1 * len(neurons)))
            if not 1 <= k <= len(neurons):
                raise AttributionError(f"top_k must lie in 1..{len(neurons)} (the layer's "
                                       "neurons).")
        if how != reduce or method not in methods:
            continue
        for group in oracle.index:
            rows.append({"cluster": group, "method": method,
                         "n": int(oracle.loc[group, "n"]),
                         **agreement(table.loc[group, neurons].to_numpy(np.float64),
                                     oracle.loc[group, neurons].to_numpy(np.float64), k)})
    table = _ordered(rows, methods)
    table.attrs.update({key: oracle.attrs[key] for key in LAYER_KEYS}, refused=refused)
    if progress is not None:
        progress(1.0, table)
    return table


def _input_dtype(inputs: Inputs) -> torch.dtype:
    """The dtype of tensor or array inputs (int64 for named inputs without floating-point
    ones); float32 when unknown (an iterable of batches)."""
    inputs = model_io.named(inputs)
    if isinstance(inputs, model_io.NamedInputs):
        return torch.float32 if model_io.is_floating(inputs) else torch.int64
    dtype = getattr(inputs, "dtype", torch.float32)
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.float32 if np.dtype(dtype).kind == "f" else torch.int64


def agreement(scores: np.ndarray, oracle: np.ndarray, top_k: int) -> dict[str, float]:
    """Spearman, Kendall (tau-b) and top-k overlap of `scores` [n] with `oracle` [n].

    Returns:
        dict with the `ORACLE_COLUMNS` measures (signed and abs) and top_k.
    """
    result: dict[str, float] = {}
    for convention, (a, b) in {"signed": (scores, oracle),
                               "abs": (np.abs(scores), np.abs(oracle))}.items():
        result[f"spearman_{convention}"] = rank_correlation("spearman", a, b)
        result[f"kendall_{convention}"] = rank_correlation("kendall", a, b)
        result[f"top_k_overlap_{convention}"] = top_k_overlap(a, b, top_k)
    result["top_k"] = top_k
    return result


def rank_correlation(kind: str, a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho or Kendall's tau-b (`kind` "spearman" / "kendall") of a [n] and b [n];
    NaN when either ranking is constant or not finite."""
    from scipy import stats  # imported on first use: it adds ~1 s to `import attribution`

    finite = np.isfinite(a).all() and np.isfinite(b).all()
    if not finite or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    function = {"spearman": stats.spearmanr, "kendall": stats.kendalltau}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(function(a, b).statistic)


def row_ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis, centred and scaled to unit norm per row (NaN rows
    where the values are constant): Spearman's rho of two rows is then their dot product
    (`row_spearman`)."""
    from scipy import stats  # imported on first use, as in rank_correlation

    ranks = stats.rankdata(values, axis=-1)
    ranks = ranks - ranks.mean(-1, keepdims=True)
    norms = np.linalg.norm(ranks, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, ranks / norms, np.nan)


def row_spearman(ranks_a: np.ndarray, ranks_b: np.ndarray) -> np.ndarray:
    """Spearman's rho of rows of `row_ranks`, rounded to 12 decimals so that equal rankings
    give exactly 1 (float sums leave 1 - 2e-16)."""
    return np.round((ranks_a * ranks_b).sum(-1), 12)


def bootstrap_counts(n_samples: int, n_draws: int, generator: np.random.Generator
                     ) -> np.ndarray:
    """How often each of n samples is drawn in each of n_draws resamples [n_draws, n]
    (float64; a multinomial of n draws): `counts @ values / n` are the resampled means."""
    return generator.multinomial(n_samples, np.full(n_samples, 1 / n_samples),
                                 size=n_draws).astype(np.float64)


def interval(draws: np.ndarray, estimate: float,
             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The bias-corrected percentile interval (Efron 1981) of bootstrap `draws` of a statistic
    whose value on the data is `estimate` (NaN draws ignored; NaN, NaN when none is finite).

    A rank correlation of resampled means is biased toward 0 (resampling adds noise) and
    takes few distinct values on a few neurons, so the plain percentiles can sit on the
    estimate or beside it. The bias correction z0 = Phi^-1(share of draws below the
    estimate, ties counted half) moves both percentiles to where the estimate lies among the
    draws: the interval contains the estimate, strictly unless nearly every draw equals it
    (a correlation of exactly 1, say). Where 97.5% of the draws lie on one side of it, the
    interval is widened to reach it.
    """
    finite = draws[np.isfinite(draws)]
    if not finite.size or not np.isfinite(estimate):
        return float("nan"), float("nan")
    normal = NormalDist()
    below = (np.sum(finite < estimate) + 0.5 * np.sum(finite == estimate)) / finite.size
    half = 0.5 / finite.size
    z0 = normal.inv_cdf(min(max(below, half), 1 - half))
    z = normal.inv_cdf(1 - (1 - confidence) / 2)
    levels = [100 * normal.cdf(2 * z0 - z), 100 * normal.cdf(2 * z0 + z)]
    low, high = np.percentile(finite, levels)
    return float(min(low, estimate)), float(max(high, estimate))


def top_k_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """|top-k of a ∩ top-k of b| / k (ties in their order of appearance)."""
    top_a = set(np.argsort(-a, kind="stable")[:k].tolist())
    top_b = set(np.argsort(-b, kind="stable")[:k].tolist())
    return len(top_a & top_b) / k


def _ordered(rows: list[dict], methods: list[str]) -> pd.DataFrame:
    """The rows so far as a table: clusters in order, methods in the order given."""
    frame = pd.DataFrame(rows, columns=list(ORACLE_COLUMNS))
    rank = {method: position for position, method in enumerate(dict.fromkeys(methods))}
    clusters = {cluster: position
                for position, cluster in enumerate(dict.fromkeys(frame["cluster"]))}
    order = sorted(range(len(frame)), key=lambda i: (clusters[frame["cluster"].iat[i]],
                                                     rank[frame["method"].iat[i]]))
    return frame.iloc[order].reset_index(drop=True)
