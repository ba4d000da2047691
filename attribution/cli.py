"""The command line: the dashboard's results without a browser, in one process or many.

    python -m attribution layers   --model m.pt2
    python -m attribution score    --model m.pt2 --data d.npz --layer fc2 --out scores.csv
    python -m attribution curve    --model m.pt2 --data d.npz --layer fc2 --cluster 3 \\
                                   --out curve.csv --summary summary.json
    python -m attribution diagnose --model m.pt2 --data d.npz --layer fc2 --out findings.json
    python -m attribution report   --model m.pt2 --data d.npz --layer fc2 --out report.html
    torchrun --nproc_per_node=4 -m attribution score ...   # the data sharded over 4 processes

Data in a `.npy` file is read batch by batch (`NpyRows`), so it may be larger than memory;
labels and cluster ids then come from `--labels` / `--cluster-ids` files. Other formats
(.npz, .pt, .csv, .parquet) are loaded into memory by `attribution.load_data`.

Every default (method, clusters, targets, reduction, pruning-curve choices) is the dashboard's,
read from `attribution.analyses.settings`.

Exit codes: 0 done (diagnose: no problem found), 1 diagnose found a problem, 2 bad input
(arguments, files, data), 3 internal error (a bug: rerun with --traceback and report it),
130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .inputs import data as data_module
from .inputs import data_files
from .analyses import clusters as clusters_module
from .analyses import distributed
from .presentation import plots
from .analyses.costs import curve_cost
from . import cli_options
from .cli_options import NO_CLUSTERS
from .model_command import (EXIT_OK, EXIT_PROBLEM, file_size, is_writer, limits_from,
                            load_model_from, run_parsed, say)
from .analyses.diagnose import diagnose_cost_on, diagnose_on, diagnose_plan_on
from .analyses.path_steps import layer_steps_words, plan_layer_steps, plan_steps, takes_steps
from .analyses.scorecard import scorecard_cost_on, scorecard_on, scorecard_oracle_plans_on
from .analyses.view import View
from .errors import AttributionError
from .engine import model_io
from .engine.model_io import NamedInputs
from .engine.layers import resolve_layer
from .inputs.loaded import LoadedModel
from .inputs.untrusted.files import open_regular, sniff
from .methods.paths import SUM_TOLERANCE
from .methods.registry import REGISTRY
from .analyses.prune import prune, prune_check, save_folder, save_pt2
from .analyses.pruning_curves import curve_summary
from .analyses import settings as analysis
from .analyses.settings import SETTINGS, AnalysisSettings, DataFacts, scoring_targets
from .presentation.report import collect_report, csv_text, render_report, report_csvs
from .methods.scores import cluster_codes, find_cluster, neuron_scores, scored_layer
from .engine.processes import rank_and_size
from .engine.runners import LAYER_KEYS
from .inputs.streaming import NpyRows, read_per_sample

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


def build_parser() -> argparse.ArgumentParser:
    """The `python -m attribution` parser with its seven commands (`cli_options`), each
    running its function below."""
    return cli_options.build_parser(RUNS)


# ---------------------------------------------------------------------------- inputs

@dataclass
class Problem:
    """What the commands work on.

    Attributes:
        model: the loaded model, its module on the chosen device.
        inputs: float tensor [N, ...] in memory, or `NpyRows` streamed from disk.
        labels: LongTensor [N] or None.
        provided_clusters: cluster ids [N] from the data, or None.
        class_names: one per class, or None.
        image_shape: how a sample is drawn as an image (`Dataset.image_shape`), or None.
    """

    model: LoadedModel
    inputs: object
    labels: Optional[torch.Tensor]
    provided_clusters: Optional[np.ndarray]
    class_names: Optional[tuple[str, ...]]
    image_shape: Optional[tuple[int, ...]] = None

    @property
    def n_samples(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def facts(self) -> DataFacts:
        """What this model and data decide about the settings' defaults (`SETTINGS`)."""
        return DataFacts(has_labels=self.labels is not None,
                         has_provided_clusters=self.provided_clusters is not None,
                         n_samples=self.n_samples,
                         regression=analysis.is_regression(self.model.n_classes))

    @property
    def streamed(self) -> bool:
        return isinstance(self.inputs, NpyRows)


def _examples_from_data(args) -> list[torch.Tensor]:
    """The first two samples of --data [2, ...] as they are stored and, when they are whole
    numbers in floats (token ids a table or .npz holds as floats), as int64 ids: the
    examples to try for a model whose file does not say what it takes."""
    rows = _first_rows(args)
    if rows is None:
        return []
    if rows.is_floating_point() and bool((rows == rows.round()).all()):
        return [rows, rows.long()]
    return [rows]


def _is_npy(path: Path) -> bool:
    """Does the file at `path` start as a .npy (its magic bytes; read batch by batch)?"""
    with open(path, "rb") as file:
        return sniff(file.read(16)) == "npy"


def _features(args):
    """--features: one inputs key or column, or a list of columns ("a,b,c"), or None."""
    return args.features.split(",") if args.features and "," in args.features \
        else args.features


def _first_rows(args) -> Optional[torch.Tensor]:
    """The first two samples of --data, as one tensor [2, ...], for a model whose file does
    not say what it takes; None without --data, or for named inputs."""
    path = getattr(args, "data", None)
    if path is None or not path.is_file():
        return None
    if _is_npy(path):
        rows = NpyRows(path, batch_size=2, sandbox=not args.trust_code, limits=limits_from(args))
        return torch.from_numpy(next(iter(rows)))
    dataset = data_files.load_data(path, features=_features(args), label=args.label_key,
                                    cluster=args.cluster_key, max_bytes=file_size(path),
                                    limits=limits_from(args), sandbox=not args.trust_code)
    inputs = dataset.inputs
    return None if isinstance(inputs, NamedInputs) else torch.as_tensor(np.asarray(inputs[:2]))


def load_problem(args) -> Problem:
    """The model and the data of the command line, checked against each other."""
    model = load_model_from(args, lambda: _examples_from_data(args))
    open_regular(args.data, "data").close()  # not there, or a pipe or a device: said here
    if _is_npy(args.data):
        return _streamed_problem(args, model)
    for flag in ("labels", "cluster_ids"):
        if getattr(args, flag) is not None:
            raise AttributionError(f"--{flag.replace('_', '-')} is for .npy data; {args.data} "
                                   "holds its own columns: use --label-key / --cluster-key.")
    features = _features(args)
    if args.input_names is not None:
        if args.features is not None:
            raise AttributionError("Give either --features (one inputs array or columns) or "
                                   "--input-names (several named inputs), not both.")
        features = [name.strip() for name in args.input_names.split(",") if name.strip()]
    dataset = data_files.load_data(args.data, features=features, label=args.label_key,
                                    cluster=args.cluster_key, max_bytes=file_size(args.data),
                                    max_rows=args.max_rows, tokenizer=model.tokenizer,
                                    limits=limits_from(args), image_shape=args.image_shape,
                                    sandbox=not args.trust_code,
                                    input_names=model.input_names)
    dataset = data_module.check_data(dataset, model)
    return _sampled(Problem(model, dataset.inputs, dataset.labels, dataset.clusters,
                            dataset.class_names, dataset.image_shape), args.sample, args.seed)


def _sampled(problem: Problem, n: Optional[int], seed: int) -> Problem:
    """`problem` on a seeded random `n` of its samples, kept in their order (--sample)."""
    if n is None or n >= problem.n_samples:
        return problem
    chosen = torch.randperm(problem.n_samples, generator=torch.Generator().manual_seed(seed)
                            )[:n].sort().values
    return replace(problem, inputs=model_io.take(problem.inputs, chosen),
                   labels=None if problem.labels is None else problem.labels[chosen],
                   provided_clusters=None if problem.provided_clusters is None
                   else problem.provided_clusters[chosen.numpy()])


def _streamed_problem(args, model: LoadedModel) -> Problem:
    if args.sample is not None:
        raise AttributionError("--sample takes data held in memory (.npz, .pt, .csv, "
                               ".parquet); a streamed .npy is read in order: save a sample "
                               "of it, e.g. numpy.save(path, x[::10]).")
    rows = NpyRows(args.data, batch_size=args.batch_size, sandbox=not args.trust_code,
                   limits=limits_from(args))
    if tuple(rows.shape[1:]) != tuple(model.input_shape) and not (  # or token ids [N, T]
            model.input_names and len(rows.shape) == 1 + len(model.input_shape)):
        expected = ", ".join(map(str, model.input_shape))
        raise AttributionError(
            f"{args.data} holds samples of shape {list(rows.shape[1:])} but the model expects "
            f"[{expected}]; save the inputs as [N, {expected}].")
    if not model.input_dtype.is_floating_point and rows.dtype.kind not in "iu":
        raise AttributionError(
            f"The model takes integer inputs (e.g. token ids) but {args.data} holds "
            f"{rows.dtype} values; save them as integers: numpy.save(path, x.astype('int64')).")
    n = rows.shape[0]
    labels = clusters = None
    if args.labels is not None:
        labels = data_module.as_labels(_per_sample(args, args.labels, "labels"), n)
        try:  # a regression head's are its true values
            labels = labels.float() if model.n_classes == 1 else \
                data_module.class_ids(labels, model.n_classes)
        except AttributionError as error:
            raise AttributionError(f"{args.labels}: {error}") from None
    if args.cluster_ids is not None:
        clusters = _per_sample(args, args.cluster_ids, "cluster ids")
        if clusters.shape != (n,) or clusters.dtype.kind not in "biuUS":
            raise AttributionError(f"{args.cluster_ids} must hold one integer or text cluster "
                                   f"id per sample, shape [{n}]; it has shape "
                                   f"{list(clusters.shape)} and dtype {clusters.dtype}.")
        clusters = data_module.as_clusters(clusters, n)
        data_module.check_clusters(clusters)
    return Problem(model, rows, labels, clusters, model.class_names, args.image_shape)


def _per_sample(args, path: Path, what: str) -> np.ndarray:
    """The .npy of per-sample values at `path` (`streaming.read_per_sample`: read in the jail
    unless --trust-code)."""
    return read_per_sample(path, what, limits_from(args), sandbox=not args.trust_code)


def cluster_source_of(args, problem: Problem) -> str:
    """`--clusters`, or the default for this data (`settings.default_cluster_source`: the
    label, else the data's cluster ids, else the predicted class); may be "none"."""
    return args.clusters or SETTINGS["cluster_source"].default_of(problem.facts)


_STREAMED_HINTS = {  # cluster source -> where .npy data gets what it needs
    "label": "pass --labels", "correctness": "pass --labels",
    "provided": "pass --cluster-ids",
    "kmeans_inputs": "save it as .npz (under --max-rows samples) or pass precomputed "
                     "--cluster-ids",
}
_STREAMED_HINTS["kmeans_activations"] = _STREAMED_HINTS["kmeans_inputs"]


def clusters_of(args, problem: Problem, layer: Optional[str] = None) -> np.ndarray:
    """Cluster ids [N] from `--clusters` (`cluster_source_of`; `clusters.make_clusters`, also for
    .npy data read batch by batch); "none" puts every sample in one cluster "all"."""
    source = cluster_source_of(args, problem)
    if source == NO_CLUSTERS:
        return np.full(problem.n_samples, "all")
    if problem.streamed:
        data = data_module.StreamedData(problem.inputs, problem.labels,
                                        problem.provided_clusters)
    else:
        data = data_module.Dataset(problem.inputs, problem.labels, problem.provided_clusters)
    try:
        return clusters_module.make_clusters(source, data, problem.model, layer=layer,
                                             k=args.kmeans_k, seed=args.seed,
                                             batch_size=args.batch_size)
    except AttributionError as error:
        if not problem.streamed or source not in _STREAMED_HINTS:
            raise
        raise AttributionError(f"{error} For .npy data ({args.data}), "
                               f"{_STREAMED_HINTS[source]}.") from None


def metric_of(args, problem: Problem) -> str:
    """`--metric`, or the default for this model and data (`settings.default_metric`)."""
    return args.metric or SETTINGS["metric"].default_of(problem.facts)


def target_choice(args, problem: Problem) -> tuple[str, int]:
    """`--targets` as `AnalysisSettings` words: ("true" | "predicted" | "fixed" | "all",
    fixed class). The default is `settings.default_target`: the label when the data has
    labels, else the prediction."""
    if args.targets is None:
        return SETTINGS["target"].default_of(problem.facts), 0
    choice = args.targets
    if choice in ("label", "predicted", "all"):
        return {"label": "true"}.get(choice, choice), 0
    try:
        return "fixed", int(choice)
    except ValueError:
        raise AttributionError(f"--targets {choice!r} is not understood: use label, predicted, "
                               "all or a class id.") from None


def targets_of(args, problem: Problem):
    """`--targets` as the engine's targets: LongTensor [N], None (predicted) or "all"."""
    target, fixed_class = target_choice(args, problem)
    if target == "all":
        return "all"
    return scoring_targets(problem.labels, problem.n_samples, target, fixed_class,
                           problem.model.n_classes)


def cluster_id(text: str, clusters: np.ndarray) -> object:
    """The cluster id among `clusters` [N] whose text is `text` (ids may be ints or strings)."""
    return find_cluster(text, cluster_codes(clusters, len(clusters))[1])


# ---------------------------------------------------------------------------- outputs

class ProgressBar:
    """A tqdm bar on stderr, fed fractions; silent when stderr is not a terminal, with
    --quiet, or on every rank but 0."""

    def __init__(self, label: str, quiet: bool = False):
        hidden = quiet or not sys.stderr.isatty() or rank_and_size()[0] != 0
        self.bar = tqdm(total=100, desc=label, file=sys.stderr, disable=hidden, leave=False,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")

    def __call__(self, fraction: float, *_partial) -> None:
        if math.isfinite(fraction):
            self.bar.n = round(100 * fraction, 1)
            self.bar.refresh()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.close()


def _check_table_path(out: str) -> None:
    if out != "-" and Path(out).suffix.lower() not in TABLE_SUFFIXES:
        raise AttributionError(f"--out {out}: write a .csv or .parquet file (or '-' for CSV "
                               "on stdout).")


def _prepare(path: Path) -> Path:
    """`path`, with its folder created; a clear error when that is impossible."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AttributionError(f"Cannot create the folder {path.parent}: "
                               f"{error.strerror}.") from None
    if path.is_dir():
        raise AttributionError(f"{path} is a folder; give a file name.")
    return path


OUTPUT_FLAGS = ("out", "summary", "per_sample", "csv_dir")
"""The flags that name files or folders a command writes."""


def check_outputs(args) -> None:
    """Refuse, before any work, an output that exists (a file, or a folder with files in
    it), unless --force: the command line never writes over a file without being told."""
    if getattr(args, "force", True):
        return
    methods = dict.fromkeys(getattr(args, "method", None) or ())
    for flag in OUTPUT_FLAGS:
        value = getattr(args, flag, None)
        if value is None or str(value) == "-":
            continue
        paths = [Path(value)]
        if flag == "per_sample" and len(methods) > 1:  # one file per method, named by it
            paths = [paths[0].with_name(f"{paths[0].stem}.{method}.npy") for method in methods]
        for path in paths:
            if path.is_file() or path.is_symlink() or (path.is_dir() and any(path.iterdir())):
                raise AttributionError(
                    f"--{flag.replace('_', '-')} {path} exists; pass --force to write over "
                    "it (nothing was computed).")


def _prepare_folder(path: Path) -> Path:
    """`path` as a new or empty folder, or with --force one whose files it may replace."""
    if path.exists() and not path.is_dir():
        raise AttributionError(f"{path} exists and is not a folder; give a new name.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AttributionError(f"Cannot create the folder {path}: {error.strerror}.") from None
    return path


def write_table(frame: pd.DataFrame, out: str) -> None:
    """CSV or Parquet by the file's suffix; '-' is CSV on stdout. CSV text cells cannot
    start a spreadsheet formula (`report.csv_text`)."""
    if out == "-":
        sys.stdout.write(csv_text(frame))
        return
    path = _prepare(Path(out))
    try:
        if path.suffix.lower() == ".csv":
            path.write_bytes(csv_text(frame).encode("utf-8"))  # its CRLF as written
        else:
            frame.to_parquet(path, index=False)
    except OSError as error:
        raise AttributionError(f"Cannot write {path}: {error.strerror or error}.") from None


def write_json(value, path: Path) -> None:
    try:
        _prepare(path).write_text(json.dumps(value, indent=2, default=_json_value) + "\n")
    except OSError as error:
        raise AttributionError(f"Cannot write {path}: {error.strerror or error}.") from None


def _json_value(value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def _finite_or_none(value: float) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def tidy_scores(table: pd.DataFrame, method: str) -> pd.DataFrame:
    """A `cluster_scores` table -> rows (cluster, [class,] neuron, method, score, n), one
    cluster after another."""
    if table.index.nlevels == 1:
        tidy = plots.tidy_cluster_scores(table, method)
    else:
        parts = []
        for class_id in table.index.get_level_values("class").unique():
            part = plots.tidy_cluster_scores(table.xs(class_id, level="class"), method)
            part.insert(1, "class", class_id)
            parts.append(part)
        tidy = pd.concat(parts, ignore_index=True)
    position = {cluster: i for i, cluster in enumerate(table.index.unique(level=0))}
    order = np.argsort(tidy["cluster"].map(position).to_numpy(), kind="stable")
    return tidy.iloc[order].reset_index(drop=True)


def _check_layer(problem: Problem, layer: str) -> None:
    resolve_layer(problem.model.module, layer)


# ---------------------------------------------------------------------------- commands

def run_score(args) -> int:
    _check_table_path(args.out)
    if args.per_sample is not None and args.per_sample.suffix != ".npy":
        raise AttributionError(f"--per-sample {args.per_sample}: the file name must end in .npy.")
    problem = load_problem(args)
    _check_layer(problem, args.layer)
    clusters, targets = clusters_of(args, problem, args.layer), targets_of(args, problem)
    parts = []
    for method in dict.fromkeys(args.method):
        per_sample = args.per_sample
        if per_sample is not None and len(args.method) > 1:
            per_sample = per_sample.with_name(f"{per_sample.stem}.{method}.npy")
        if per_sample is not None:
            _prepare(per_sample)  # on every rank: each writes its part there
        n_steps = steps_of(args, problem, method, targets)
        with ProgressBar(method, args.quiet) as bar:
            statistics = distributed.cluster_statistics(
                problem.model.module, args.layer, problem.inputs, targets, clusters, method,
                batch_size=args.batch_size, n_steps=n_steps, progress=bar,
                seed=args.seed, per_sample=per_sample)
        _say_fit(args, method, statistics.layer)
        tidy = tidy_scores(statistics.frame(args.reduce), method)
        if statistics.sum_counts is not None:
            missing = dict(zip(statistics.ids, statistics.sum_counts[:, 2].long().tolist()))
            tidy["sum_missing"] = tidy["cluster"].map(missing)
            _say_sums(args, method, n_steps, statistics.sum_counts.sum(0))
        parts.append(tidy)
    if is_writer():
        write_table(pd.concat(parts, ignore_index=True), args.out)
    return EXIT_OK


def steps_of(args, problem: Problem, method: str, targets) -> int:
    """--n-steps, or where it is not given the steps of path `method` that fit
    `path_steps.PATH_SECONDS` on these samples (`plan_steps`, said on stderr);
    DEFAULT_N_STEPS for a method without steps, or for data streamed from disk or shared
    among processes (every process must take the same steps)."""
    if args.n_steps is not None:
        return args.n_steps
    if not takes_steps(method) or not isinstance(problem.inputs, torch.Tensor | NamedInputs) \
            or rank_and_size()[1] > 1:
        return analysis.DEFAULT_N_STEPS
    plan = plan_steps(problem.model.module, args.layer, problem.inputs, targets, method,
                      batch_size=args.batch_size)
    if not args.quiet:
        say(plan.words() + (" (--n-steps)" if plan.reduced else ""))
    return plan.n_steps


def _layer_steps(args, problem: Problem, dataset, targets) -> dict:
    """The scorecard's steps where --n-steps is not given: on each of --layers, those of
    each path method of --methods that fit `path_steps.PATH_SECONDS` (`plan_layer_steps`),
    said on stderr where they are fewer than the default."""
    plans = plan_layer_steps(problem.model.module, dataset.inputs, targets,
                             layers=args.layers, methods=args.methods,
                             batch_size=args.batch_size)
    if not args.quiet and (fewer := layer_steps_words(plans)):
        say(fewer + " (--n-steps)")
    return plans


def _say_sums(args, method: str, n_steps: int, totals: torch.Tensor) -> None:
    """Print a path method's sum check (`SUM_COLUMNS` totals: checked, refined, missing) on
    stderr: its table's sum_missing column counts the samples that miss, per cluster."""
    if args.quiet or not is_writer():
        return
    checked, refined, missing = (int(value) for value in totals.tolist())
    target = REGISTRY[method].sums_to
    more = (f"; {refined} took more than the {n_steps} steps asked for" if refined
            else "")
    if missing:
        said = (f"{missing} of {checked} samples' scores miss {target} by more than "
                f"{SUM_TOLERANCE:.0%} after up to {REGISTRY[method].refine_factor}x "
                "--n-steps (column sum_missing); raise --n-steps")
    else:
        said = f"every sample's scores sum to {target} within {SUM_TOLERANCE:.0%}{more}"
    print(f"{method}: {said}.", file=sys.stderr)


def _ks(text: str) -> Optional[list[int]]:
    if text == "all":
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AttributionError(f"--ks {text!r}: give 'all' or comma-separated integers such "
                               "as 0,1,2,4,8.") from None


def _ranking(args, problem: Problem, targets) -> tuple[np.ndarray, object, pd.DataFrame]:
    """(cluster ids [N], the cluster in focus, its row of `--method` scores reduced by
    `--reduce`): `--cluster`'s, or all the data's (one cluster "all")."""
    if args.cluster is None:
        clusters, focus = np.full(problem.n_samples, "all"), "all"
    else:
        clusters = clusters_of(args, problem, args.layer)
        focus = cluster_id(args.cluster, clusters)
    n_steps = steps_of(args, problem, args.method, targets)
    with ProgressBar(f"{args.method} scores", args.quiet) as bar:
        table = distributed.cluster_scores(problem.model.module, args.layer, problem.inputs,
                                           targets, clusters, args.method, reduce=args.reduce,
                                           batch_size=args.batch_size, n_steps=n_steps,
                                           progress=bar, seed=args.seed)
    _say_fit(args, args.method, table.attrs)
    return clusters, focus, table.loc[[focus]]


def _say_fit(args, method: str, attrs: dict) -> None:
    """Print what a method fitted to the clusters says of its fit (a probe's held-out
    accuracy) on stderr, beside the scores it ranks by."""
    if "method_note" in attrs and not args.quiet and is_writer():
        print(f"{method}: {attrs['method_note']}", file=sys.stderr)


def _curve_targets(args, problem: Problem):
    """`targets_of`, refusing "all": pruning measures one target per sample."""
    targets = targets_of(args, problem)
    if isinstance(targets, str):
        raise AttributionError("Pruning needs one target per sample: use --targets label, "
                               "predicted or a class id, not all.")
    return targets


def run_curve(args) -> int:
    _check_table_path(args.out)
    problem = load_problem(args)
    _check_layer(problem, args.layer)
    targets = _curve_targets(args, problem)
    ks = _ks(args.ks)
    args.metric = metric_of(args, problem)
    options = dict(ks=ks, n_random=args.n_random, seed=args.seed, ablation=args.ablation,
                   metric=args.metric, batch_size=args.batch_size)
    module, layer = problem.model.module, args.layer
    clusters, focus, ranking = _ranking(args, problem, targets)
    measured = analysis.curve_targets(args.metric, problem.labels, targets)
    if not args.quiet and is_writer() and isinstance(problem.inputs,
                                                      torch.Tensor | NamedInputs):
        say("pruning curves: " + curve_cost(module, layer, problem.inputs, measured, ks=ks,
                                             n_random=args.n_random, seed=args.seed,
                                             batch_size=args.batch_size
                                             ).words(command_line=True))
    with ProgressBar("pruning curves", args.quiet) as bar:
        if args.cluster is None:
            curves = distributed.pruning_curve(module, layer, problem.inputs, measured,
                                               ranking, progress=bar, **options)
        else:
            curves = distributed.cluster_pruning_curves(module, layer, problem.inputs,
                                                        measured, clusters, focus, ranking,
                                                        progress=bar, **options)
    if not is_writer():
        return EXIT_OK
    write_table(curves, args.out)
    if args.summary is not None:
        summary = curve_summary(curves)
        write_json({
            "settings": {"model": str(args.model), "data": str(args.data), "layer": layer,
                         "method": args.method, "reduce": args.reduce,
                         "cluster": None if args.cluster is None else focus,
                         "metric": args.metric, "ablation": args.ablation,
                         "n_random": args.n_random, "seed": args.seed},
            "n_samples": curves.attrs["n_samples"],
            "n_neurons": curves.attrs["n_neurons"],
            **{key: curves.attrs[key] for key in LAYER_KEYS},
            "subsets": {str(subset): {column: _finite_or_none(value)
                                      for column, value in row.items()}
                        for subset, row in summary.iterrows()},
        }, args.summary)
    return EXIT_OK


def _prune_oracle(args, problem: Problem, targets) -> Optional[np.ndarray]:
    """Each neuron's mean |exact ablation effect| over the data [n], for `prune`'s check:
    with --oracle on, or auto where it is estimated under PRUNE_ORACLE_SECONDS (said on
    stderr either way); None otherwise."""
    if args.oracle == "off" or (args.oracle == "auto" and problem.streamed):
        return None
    module, inputs = problem.model.module, problem.inputs
    if args.oracle == "auto":
        cost = curve_cost(module, args.layer, inputs, targets, ks=[0], n_random=1,
                          seed=args.seed, batch_size=args.batch_size, exact_ablation=True)
        seconds = cost.seconds_of_masks(cost.n_neurons)
        if seconds > analysis.PRUNE_ORACLE_SECONDS:
            if not args.quiet:
                say(f"exact ablation of the {cost.n_neurons} neurons would take about "
                     f"{seconds:.0f} s: the check compares with random neurons only "
                     "(--oracle on to compute it)")
            return None
    with ProgressBar("exact ablation", args.quiet) as bar:
        effects = neuron_scores(module, args.layer, inputs, targets, "ablation",
                                batch_size=args.batch_size, progress=bar)
    return np.abs(effects.numpy()).mean(0)


def _one_process(command: str) -> None:
    if rank_and_size()[1] > 1:
        raise AttributionError(f"`{command}` runs in one process; start it with "
                               "`python -m attribution`, not torchrun.")


def run_prune(args) -> int:
    _one_process("prune")
    as_folder = args.out.suffix.lower() != ".pt2"
    problem = load_problem(args)
    if as_folder and not hasattr(problem.model.module, "save_pretrained"):
        raise AttributionError(f"--out {args.out}: the pruned model is written as a .pt2 file "
                               "(a folder only for a Hugging Face model).")
    _check_layer(problem, args.layer)
    targets = _curve_targets(args, problem)
    _, focus, ranking = _ranking(args, problem, targets)
    args.metric = metric_of(args, problem)
    module, inputs = problem.model.module, problem.inputs
    targets = analysis.curve_targets(args.metric, problem.labels, targets)
    if targets is None:  # the unpruned model's predictions, as the curves measure them
        targets = clusters_module.predict_classes(module, inputs, batch_size=args.batch_size)
    options = dict(batch_size=args.batch_size)
    pruned = prune(module, args.layer, ranking, args.k, mode=args.ablation, remove=args.remove,
                   inputs=inputs, **options)
    check = prune_check(module, args.layer, inputs, targets, ranking, args.k,
                        oracle=_prune_oracle(args, problem, targets), remove=args.remove,
                        metric=args.metric, ablation=args.ablation, n_random=args.n_random,
                        seed=args.seed, **options)
    first = torch.as_tensor(next(iter(inputs))) if problem.streamed else inputs
    example = model_io.take(first, slice(0, 2))
    if as_folder:
        save_folder(pruned, _prepare_folder(args.out), source=args.model)
    else:
        save_pt2(pruned, example, _prepare(args.out), class_names=problem.model.class_names)
    removed = {"k": args.k, "remove": args.remove, "method": args.method,
               "reduce": args.reduce, "cluster": None if args.cluster is None else focus,
               "ablation": args.ablation}
    print(f"Removed {args.k} neurons of {args.layer}, the "
          f"{'lowest' if args.remove == 'bottom' else 'highest'}-ranked by {args.method} "
          f"({analysis.REDUCTION_LABELS[args.reduce]}); wrote {args.out}")
    print("\n".join(check.words()))
    if check.warning:
        say(f"Warning: {check.warning} Rank by mean magnitude (--reduce mean_abs) or by "
             "exact ablation (--method ablation).")
    if args.summary is not None:
        write_json({"model": str(args.model), "data": str(args.data), "layer": args.layer,
                    **removed, "metric": args.metric, "before": check.before,
                    "after": check.after, "random_mean": check.random_mean,
                    "random_low": check.random_low, "random_high": check.random_high,
                    "n_random": check.n_random, "oracle": check.oracle,
                    "damaged": check.damaged, "n_samples": problem.n_samples,
                    "out": str(args.out)}, args.summary)
    return EXIT_OK


def run_diagnose(args) -> int:
    _one_process("diagnose")
    problem = load_problem(args)
    _check_layer(problem, args.layer)
    targets = targets_of(args, problem)
    clusters = None if args.clusters == NO_CLUSTERS else clusters_of(args, problem, args.layer)
    focus = None
    if args.cluster is not None:
        if clusters is None:
            raise AttributionError("--cluster needs clusters: choose a --clusters source.")
        focus = cluster_id(args.cluster, clusters)
    user_scores = None if args.user_scores is None else _per_sample(
        args, args.user_scores, "user scores")
    view = View.of(problem.model.module, args.layer, problem.inputs, targets, clusters,
                   method=args.method, cluster=focus, reduce=args.reduce,
                   n_random=args.n_random, seed=args.seed, batch_size=args.batch_size,
                   n_steps=steps_of(args, problem, args.method, targets))
    checks = dict(metric=args.metric, ablation=args.ablation)
    in_memory = isinstance(problem.inputs, torch.Tensor | NamedInputs)
    if in_memory:  # the same plan for the estimate and the work
        checks["plan"] = diagnose_plan_on(view, oracle_neurons=args.oracle_neurons)
        if not args.quiet:
            say("diagnose: " + diagnose_cost_on(view, **checks).words())
    else:
        checks["oracle_neurons"] = args.oracle_neurons
    with ProgressBar("diagnose", args.quiet) as bar:
        findings = diagnose_on(view, user_scores=user_scores, progress=bar, **checks)
    records = [{"code": f.code, "severity": f.severity, "value": _finite_or_none(f.value),
                "low": _finite_or_none(f.low), "high": _finite_or_none(f.high),
                "message": f.message, "hint": f.hint} for f in findings]
    if args.out is not None:
        write_json({**scored_layer(problem.model.module, args.layer, problem.inputs),
                    "method": args.method, "reduce": args.reduce,
                    **_plan_record(checks.get("plan"), args), "findings": records},
                   args.out)
    print(findings_table(records))
    failing = {"problem"} if args.fail_on == "problem" else {"problem", "warning"}
    return EXIT_PROBLEM if any(r["severity"] in failing for r in records) else EXIT_OK


def _plan_record(plan, args) -> dict:
    """What `diagnose --out` says of the sizes it measured: the oracle's neurons and samples
    and the evidence curve's k steps and samples (None where not planned: iterable inputs,
    planned inside `diagnose`; or method=ablation's oracle, its own scores)."""
    if plan is None:
        return {"oracle_neurons": args.oracle_neurons}
    oracle = None if args.method == "ablation" else plan.oracle
    return {"oracle_neurons": None if oracle is None else oracle.neurons,
            "oracle_samples": None if oracle is None else oracle.samples,
            "curve_points": plan.curve.points, "curve_samples": plan.curve.samples}


def findings_table(records: list[dict], width: int = 100) -> str:
    """The findings as a plain-text table for the terminal: verdict, check, value, message."""
    lines = [f"{'severity':<9} {'check':<28} {'value':>10}  message", "-" * width]
    for record in records:
        value = record["value"]
        shown = "" if value is None else f"{value:.3g}"
        head = f"{record['severity'].upper():<9} {record['code']:<28} {shown:>10}  "
        body = textwrap.wrap(record["message"], width - len(head)) or [""]
        lines.append(head + body[0])
        lines += [" " * len(head) + line for line in body[1:]]
        if record["hint"]:
            lines += [" " * len(head) + line
                      for line in textwrap.wrap("-> " + record["hint"], width - len(head))]
    problems = sum(r["severity"] == "problem" for r in records)
    warnings = sum(r["severity"] == "warning" for r in records)
    lines.append("-" * width)
    lines.append(f"{problems} problem(s), {warnings} warning(s), "
                 f"{len(records) - problems - warnings} ok")
    return "\n".join(lines)


def run_report(args) -> int:
    _one_process("report")
    if args.out.suffix.lower() not in (".html", ".htm"):
        raise AttributionError(f"--out {args.out}: the report is an .html file.")
    problem = load_problem(args)
    _check_layer(problem, args.layer)
    dataset = in_memory(problem, args)
    settings = report_settings(args, problem)
    with ProgressBar("report", args.quiet) as bar:
        content = collect_report(problem.model, dataset, settings, title=args.title,
                                 n_steps=args.n_steps, progress=bar)
    try:
        _prepare(args.out).write_text(render_report(content), encoding="utf-8")
        if args.csv_dir is not None:
            args.csv_dir.mkdir(parents=True, exist_ok=True)
            for name, text in report_csvs(content).items():
                (args.csv_dir / name).write_bytes(text.encode("utf-8"))  # CRLF as written
    except OSError as error:
        raise AttributionError(f"Cannot write {error.filename}: {error.strerror}.") from None
    return EXIT_OK


def run_scorecard(args) -> int:
    _one_process("scorecard")
    _check_table_path(args.out)
    problem = load_problem(args)
    dataset = in_memory(problem, args)
    for layer in args.layers or ():
        _check_layer(problem, layer)
    targets = _curve_targets(args, problem)
    metric = metric_of(args, problem)
    clusters = (None if args.clusters == NO_CLUSTERS
                else clusters_of(args, problem, (args.layers or [None])[0]))
    view = View.of(problem.model.module, None, dataset.inputs, targets, clusters,
                   batch_size=args.batch_size, seed=args.seed,
                   n_steps=args.n_steps or _layer_steps(args, problem, dataset, targets))
    options = dict(layers=args.layers, methods=args.methods, n_boot=args.n_boot,
                   n_random=args.n_random, curve_points=args.curve_points, metric=metric,
                   curve_targets=analysis.curve_targets(metric, problem.labels, targets),
                   ablation=args.ablation, oracle_neurons=args.oracle_neurons
                   or scorecard_oracle_plans_on(view, args.layers))  # the estimate's and the work's
    if not args.quiet:
        say("scorecard: " + scorecard_cost_on(view, **options).words())
    with ProgressBar("scorecard", args.quiet) as bar:
        card = scorecard_on(view, progress=bar, **options)
    for key, reason in card.attrs["refused"].items():
        say(f"left out {key}: {reason}")
    for layer, row in card.groupby("layer", sort=False).first().iterrows():
        if row["neurons"] < row["n_neurons"]:
            samples = (f" and {int(row['samples']):,} of its {int(row['n_samples']):,} samples"
                       if row["samples"] < row["n_samples"] else "")
            say(f"{layer}: measured on {int(row['neurons']):,} of its "
                 f"{int(row['n_neurons']):,} neurons{samples}, drawn at random "
                 "(--oracle-neurons); the intervals span both draws")
    write_table(card, args.out)
    return EXIT_OK


def report_settings(args, problem: Problem) -> AnalysisSettings:
    """The `AnalysisSettings` of `report`'s flags (their defaults are the settings module's)."""
    source = cluster_source_of(args, problem)
    if source == NO_CLUSTERS:
        raise AttributionError("The report compares clusters: choose a --clusters source "
                               f"({', '.join(analysis.CLUSTER_SOURCES)}).")
    target, fixed_class = target_choice(args, problem)
    if target == "all":
        raise AttributionError("The report scores one class per sample: use --targets "
                               "label, predicted or a class id, not all.")
    methods = list(dict.fromkeys(args.method))
    return AnalysisSettings(
        layer=args.layer, method=methods[0], compare=tuple(methods[1:]), cluster_source=source,
        k=args.kmeans_k, cluster=args.cluster, reduce=args.reduce, target=target,
        fixed_class=fixed_class, metric=metric_of(args, problem), n_random=args.n_random,
        batch_size=args.batch_size, seed=args.seed)


def in_memory(problem: Problem, args) -> data_module.Dataset:
    """The problem's data as an in-memory `Dataset` (read whole from a .npy when it fits)."""
    inputs = problem.inputs
    if problem.streamed:
        if problem.n_samples > args.max_rows:
            raise AttributionError(f"This command holds the data in memory, and {args.data} "
                                   f"has {problem.n_samples} samples (over --max-rows "
                                   f"{args.max_rows}); score a sample of it, or raise --max-rows.")
        inputs = torch.from_numpy(np.concatenate(list(inputs)))
    return data_module.Dataset(inputs, problem.labels, problem.provided_clusters,
                               class_names=problem.class_names, image_shape=problem.image_shape)


# ---------------------------------------------------------------------------- entry point

RUNS = {"score": run_score, "curve": run_curve, "prune": run_prune, "diagnose": run_diagnose,
        "report": run_report, "scorecard": run_scorecard}
"""Each command's function (`build_parser` sets it as the parsed arguments' `run`)."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; returns the exit code (never raises for a user's mistake)."""
    args = build_parser().parse_args(argv)
    if getattr(args, "neuron_axis", None) is not None:  # one mechanism: the "name:axis" spec
        args.layer = f"{args.layer}:{args.neuron_axis}"
    return run_parsed(args, check_outputs)
