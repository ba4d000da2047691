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
from typing import Callable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..engine import model_io
from ..errors import AttributionError
from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_N_STEPS, DEFAULT_REDUCE, DEFAULT_SEED
from ..methods.registry import REGISTRY, method_names, methods_for
from ..methods.passes import check_targets
from ..methods.scores import (Inputs, ScoreFacts, check_method, cluster_codes,
                              find_cluster, n_samples, neuron_scores)
from ..engine.layers import module_kind, resolve_layer
from ..engine.runners import LAYER_KEYS
from .path_steps import StepsChoice
from .oracle_sample import (OraclePlan, OracleSample, Resamples, agreement_draws,
                            sample_counts_of, sample_oracle)
from .settings import BOOTSTRAP_DRAWS
from .view import View

ORACLE_COLUMNS = ("cluster", "method", "n", "samples", "spearman_signed", "spearman_abs",
                  "kendall_signed", "kendall_abs", "top_k_overlap_signed",
                  "top_k_overlap_abs", "top_k",
                  "spearman_signed_low", "spearman_signed_high", "spearman_abs_low",
                  "spearman_abs_high", "neurons", "n_neurons")

TableProgress = Optional[Callable[[float, pd.DataFrame], object]]


def oracle_agreement(model: nn.Module, layer, inputs: Inputs, targets,
                     methods: Optional[Sequence[str]] = None, clusters=None, *, cluster=None,
                     reduce: str = DEFAULT_REDUCE, top_k: Optional[int] = None,
                     oracle_neurons: Union[int, OraclePlan, None] = None,
                     batch_size: int = DEFAULT_BATCH_SIZE,
                     n_steps: StepsChoice = DEFAULT_N_STEPS,
                     seed: int = DEFAULT_SEED, progress: TableProgress = None,
                     device=None) -> pd.DataFrame:
    """Rank correlation of each method's cluster scores with the exact ablation oracle:
    `oracle_agreement_on` the view of these arguments.

    Args:
        model: classifier returning logits [N, n_classes]; left exactly as it was found.
        layer: dotted module name or the module itself.
        inputs: [N, ...] tensor or array, or a re-iterable of batches (a DataLoader, a
            list: it is read once per method; a one-shot iterator is refused).
        targets: LongTensor [N] of class ids, or None (the predicted class).
        clusters: 1-D array of cluster ids [N]; None = all samples form one cluster "all".
        cluster: compare on this cluster alone (one row per method); None: every cluster.
        reduce: how each method's per-sample scores become a cluster score.
        batch_size, seed, device: as in `cluster_scores`; seed also draws the neurons and
            the bootstrap.
        n_steps: a path method's steps, or {method: steps or its `path_steps.StepsPlan`}
            (DEFAULT_N_STEPS for a method it leaves out).
        methods, top_k, oracle_neurons, progress: as in `oracle_agreement_on`.
    """
    view = View.of(model, layer, inputs, targets, clusters, cluster=cluster, reduce=reduce,
                   batch_size=batch_size, seed=seed, n_steps=n_steps, device=device)
    return oracle_agreement_on(view, methods, top_k=top_k, oracle_neurons=oracle_neurons,
                               progress=progress)


def oracle_agreement_on(view: View, methods: Optional[Sequence[str]] = None, *,
                        top_k: Optional[int] = None,
                        oracle_neurons: Union[int, OraclePlan, None] = None,
                        progress: TableProgress = None) -> pd.DataFrame:
    """Rank correlation of each method's cluster scores on the view's layer with the exact
    ablation oracle, on every neuron or on a random sample of them (`oracle_sample`), with
    95% intervals: on the view's cluster (`settings.cluster`; one row per method; inputs
    held in memory), scoring its samples only (a method fitted to the clusters, `probe`, is
    fitted on every sample's), or on every cluster; each method's per-sample scores become
    a cluster score by the view's `reduce` (the oracle is always the signed mean effect).
    The view's inputs
    may be a re-iterable of batches (a DataLoader, a list: it is read once per method; a
    one-shot iterator is refused), its clusters None: all samples form one cluster "all".
    The view's seed also draws the neurons and the bootstrap.

    Args:
        view: the model, inputs, targets (LongTensor [N] of class ids, or None: the
            predicted class), clusters and settings.
        methods: method names of `method_names()` (the oracle itself, "ablation", scores
            1.0); None, or all of them (as registered now), leaves out those that cannot
            score integer inputs (`Method.needs_float_inputs`: conductance) or this kind of
            layer (`Method.layer_kinds`: bn_scale, weight_norm), and those that refuse this
            model (deeplift where a ReLU module runs twice): `attrs["refused"]` says why. A
            method named in a list of your own that refuses raises its AttributionError.
        top_k: k of the top-k overlap on the layer's n neurons; None = 10% of them, at least
            1 (on m sampled neurons, `oracle_sample.overlap_k`).
        oracle_neurons: how many neurons to ablate exactly, drawn at random, on every sample
            (the layer's n or more: all); an `oracle_sample.OraclePlan` (its neurons, on its
            share of each cluster's samples; every method is then compared on those
            samples); None = `oracle_sample.plan_oracle`'s, as fit
            `oracle_sample.ORACLE_SECONDS` (inputs in memory; an iterable: all).
        progress: called as progress(fraction, partial_table) as work advances; may raise.
    Returns:
        DataFrame with columns `ORACLE_COLUMNS`, one row per (cluster, method) in the order
        given: n = cluster size; samples = the samples compared (n, unless the oracle
        measured a share of them); correlations are NaN where a ranking is constant (e.g.
        every neuron of the cluster dead); spearman_*_low/high their CONFIDENCE bootstrap
        interval over the samples compared and the neurons drawn; neurons = the m compared
        of n_neurons; top_k = the k used (of n). Memory: per-sample scores of the m neurons.
        `attrs`: the layer's neuron axis (`runners.layer_attrs`) and "refused": {method: the
        reason} for the methods left out.
    """
    s = view.settings
    model, layer, inputs, targets, clusters = (view.model, view.layer, view.inputs,
                                               view.targets, view.clusters)
    cluster = s.cluster
    methods = list(dict.fromkeys(method_names() if methods is None else methods))
    every = tuple(methods) == method_names()
    if every:
        name, module = resolve_layer(model, layer)
        methods = list(methods_for(_input_dtype(inputs), module_kind(name, module)))
    if not methods:
        raise AttributionError("Pass at least one method to compare with the oracle.")
    for method in methods:
        check_method(method)
    if not model_io.is_batch(model_io.named(inputs)) and iter(inputs) is inputs:
        # a generator: the second method would find it empty
        raise AttributionError("oracle_agreement reads the inputs once per method: pass a "
                               "tensor, an array or a re-iterable of batches (a DataLoader, "
                               "a list), not a one-shot iterator.")
    check_targets(targets, n_samples(inputs), inputs=inputs, accepts=(),
                  need="The oracle is the drop of one target logit per sample")
    if clusters is None:
        total = n_samples(inputs)
        if total is None:
            raise AttributionError("With iterable inputs pass clusters (one id per sample), "
                                   "e.g. np.zeros(N) for a single cluster.")
        clusters = np.full(total, "all", dtype=object)
    codes, ids = cluster_codes(clusters, n_samples(inputs))  # fail early on bad clusters
    every_sample = (inputs, targets, clusters)
    kept = None  # the rows of the cluster compared, among every sample
    if cluster is not None:
        cluster = find_cluster(cluster, ids)
        kept = np.flatnonzero(codes == ids.get_loc(cluster))
        rows = torch.from_numpy(kept)
        inputs, clusters = model_io.take(inputs, rows), np.asarray(clusters)[kept]
        targets = targets[rows] if isinstance(targets, torch.Tensor) else targets
        codes, ids = cluster_codes(clusters, len(kept))
    options = dict(batch_size=s.batch_size, seed=s.seed, device=view.device)
    steps = 1 + len(methods)

    def report(index: int):
        def at(fraction: float) -> None:
            if progress is not None:
                progress((index + fraction) / steps, _ordered(table, methods))
        return at

    table: list[dict] = []
    oracle = _oracle_of(model, layer, inputs, targets, codes, oracle_neurons, report(0),
                        options)
    sizes = np.bincount(codes, minlength=len(ids))  # each cluster's samples
    if oracle.samples is not None:  # every method compared on the samples measured
        measured = torch.from_numpy(oracle.samples)
        inputs, clusters = model_io.take(inputs, measured), np.asarray(clusters)[oracle.samples]
        targets = targets[measured] if isinstance(targets, torch.Tensor) else targets
        kept = oracle.samples if kept is None else kept[oracle.samples]
        codes = codes[oracle.samples]
    neurons = None if oracle.exact else oracle.neurons
    k = top_k if top_k is not None else max(1, math.ceil(0.1 * oracle.n_neurons))
    if not 1 <= k <= oracle.n_neurons:
        raise AttributionError(f"top_k must lie in 1..{oracle.n_neurons} (the layer's "
                               "neurons).")
    groups = [np.flatnonzero(codes == code) for code in range(len(ids))]
    generator = np.random.default_rng(s.seed)  # the same draws for every method
    pivot = oracle.samples is not None
    resamples = [Resamples(oracle.effects[rows], oracle.n_neurons,
                           sample_counts_of(len(rows), int(size), BOOTSTRAP_DRAWS, generator),
                           generator, pivot) for rows, size in zip(groups, sizes)]
    refused: dict[str, str] = {}
    for index, method in enumerate(methods, start=1):
        fitted_here = kept is not None and REGISTRY[method].fit is not None
        try:
            if method == "ablation" and s.reduce == "mean":
                scores = oracle.effects  # the oracle itself
            else:
                scores = neuron_scores(model, layer, *(every_sample[:2] if fitted_here else
                                                       (inputs, targets)), method,
                                       clusters=every_sample[2] if fitted_here else clusters,
                                       n_steps=view.steps(method),
                                       progress=report(index),
                                       neurons=neurons, **options).numpy()
                scores = scores[kept] if fitted_here else scores
        except AttributionError as error:
            if not every:
                raise
            refused[method] = str(error)
            continue
        for group, size, rows, resampled in zip(ids, sizes, groups, resamples):
            measured = agreement_draws(scores[rows], resampled, s.reduce, top_k=k,
                                       drawn=("spearman",))
            row = {"cluster": group, "method": method, "n": int(size), "samples": len(rows),
                   "neurons": len(oracle.neurons), "n_neurons": oracle.n_neurons, "top_k": k}
            for (measure, convention), found in measured.items():
                column = "top_k_overlap" if measure == "top_overlap" else measure
                row[f"{column}_{convention}"] = found.value
                if measure == "spearman":
                    row[f"spearman_{convention}_low"], row[f"spearman_{convention}_high"] = \
                        found.interval()
            table.append(row)
    frame = _ordered(table, methods)
    frame.attrs.update({key: oracle.layer[key] for key in LAYER_KEYS}, refused=refused)
    if progress is not None:
        progress(1.0, frame)
    return frame


def _oracle_of(model, layer, inputs: Inputs, targets, codes: np.ndarray,
               oracle_neurons: Union[int, OraclePlan, None], progress, options: dict):
    """The oracle sample of `oracle_agreement`: `sample_oracle` on inputs in memory (of
    cluster `codes` [N]); on an iterable, every neuron's exact ablation on every sample (its
    size needs a timing on held samples)."""
    if model_io.is_batch(model_io.named(inputs)) or isinstance(inputs, np.ndarray):
        return sample_oracle(model, layer, inputs, targets, oracle_neurons, codes,
                             progress=progress, **options)
    if oracle_neurons is not None:
        raise AttributionError("oracle_neurons needs the inputs held in memory (a tensor or "
                               "an array); an iterable of batches is ablated on every neuron.")
    options = dict(options)
    options.pop("seed")
    facts = ScoreFacts()
    effects = neuron_scores(model, layer, inputs, targets, "ablation", progress=progress,
                            facts=facts, **options).numpy()
    return OracleSample(np.arange(effects.shape[1]), effects.shape[1], effects, facts.layer)


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


def _ordered(rows: list[dict], methods: list[str]) -> pd.DataFrame:
    """The rows so far as a table: clusters in order, methods in the order given."""
    frame = pd.DataFrame(rows, columns=list(ORACLE_COLUMNS))
    rank = {method: position for position, method in enumerate(dict.fromkeys(methods))}
    clusters = {cluster: position
                for position, cluster in enumerate(dict.fromkeys(frame["cluster"]))}
    order = sorted(range(len(frame)), key=lambda i: (clusters[frame["cluster"].iat[i]],
                                                     rank[frame["method"].iat[i]]))
    return frame.iloc[order].reset_index(drop=True)
