"""The command line's options: every command's parser, its settings' options made from
`attribution.analyses.settings.SETTINGS` (`add_setting`, the dashboard's widgets' twins).
`attribution.cli` runs the commands.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from .analyses import settings as analysis
from .analyses.oracle_sample import ORACLE_SECONDS
from .analyses.path_steps import FEWEST_STEPS, PATH_SECONDS
from .analyses.prune import REMOVALS
from .analyses.pruning_curves import ABLATIONS
from .analyses.scorecard import SCORECARD_COLUMNS
from .analyses.settings import SETTINGS
from .commands import Parser, add_command, overview_parser
from .errors import AttributionError
from .inputs import data as data_module
from .inputs import data_files
from .methods.registry import method_names
from .model_command import add_layers_command, model_parser, positive

NO_CLUSTERS = "none"  # --clusters none: every sample in one cluster "all"
CLUSTER_SOURCES = analysis.CLUSTER_SOURCES + (NO_CLUSTERS,)

SETTINGS_DEFAULT = object()  # add_setting's default when a command does not pass its own
_READERS = {"positive": positive, "integer": int}  # how a setting's `kind` is read


def add_setting(group, name: str, *, default: object = SETTINGS_DEFAULT,
                flag: Optional[str] = None, choices: Optional[Sequence] = None,
                help: Optional[str] = None, more: str = "", default_words: str = "",
                **argparse_options) -> None:
    """The option of `SETTINGS[name]`, the dashboard's widget's twin: its flag, meaning
    (`help`, then `more`), values and default come from the table (a default of None: the
    data decides, said in the table's words). A command passes its own `default`, `flag`,
    `choices` (empty: any text), `help` or `default_words` where it differs, and argparse's
    other options (dest, nargs...)."""
    setting = SETTINGS[name]
    if default is SETTINGS_DEFAULT:
        default = setting.default
    values = setting.choices if choices is None and setting.kind == "choice" else choices
    said = (" ".join(default) if isinstance(default, (list, tuple)) else "%(default)s"
            ) if default is not None else default_words or setting.default_words or "none"
    text = ((help or setting.help) + more).rstrip(".")
    text = text[0].lower() + text[1:]  # as argparse's own lines: "show this help message"
    if not argparse_options.get("required"):
        text += f" (default: {said})"
    options = dict(default=default, help=text)
    if values:
        options["choices"] = values
    if setting.kind in _READERS:
        options["type"] = _READERS[setting.kind]
    group.add_argument(flag or setting.flag, **{**options, **argparse_options})


def _oracle_argument(group, which: str) -> None:
    """--oracle-neurons: how many neurons exact ablation measures (`oracle_sample`)."""
    group.add_argument("--oracle-neurons", type=positive, metavar="M",
                       help=f"ablate M of {which} exactly, drawn at random (default: every "
                            f"neuron when they fit {ORACLE_SECONDS:.0f} s, else as many as "
                            "fit, said)")


def _data_arguments(group, kmeans_flag: str) -> None:
    """The data options of every command that reads data; `kmeans_flag` names the number of
    k-means clusters."""
    group.add_argument("--data", required=True, type=Path,
                       help=".npy (streamed from disk), .npz, .pt, .csv or .parquet")
    group.add_argument("--labels", type=Path,
                       help="labels [N] as .npy, for .npy data")
    group.add_argument("--cluster-ids", type=Path,
                       help="cluster ids [N] as .npy, for .npy data (used with --clusters "
                            "provided, or by default when there are no --labels)")
    group.add_argument("--features", help="inputs key (.npz/.pt), comma-separated feature "
                                          "columns (.csv/.parquet), or the text column for a "
                                          "model with a tokenizer; detected by default")
    group.add_argument("--input-names",
                       help="comma-separated arrays of a .npz/.pt that are the model's named "
                            "inputs (e.g. input_ids,attention_mask); default: input_ids, "
                            "attention_mask and token_type_ids when the data has input_ids")
    group.add_argument("--label-key", help="labels key or column ('' for none); detected by "
                                           "default")
    group.add_argument("--cluster-key", help="cluster key or column ('' for none); detected "
                                             "by default")
    group.add_argument("--image-shape", type=_image_shape, metavar="HxW",
                       help="draw each sample as an image of this shape in the report, e.g. "
                            "8x8 for a table of 64 pixels (or CxHxW); default: a .npz/.pt's "
                            "own image_shape array")
    group.add_argument("--max-rows", type=positive, default=data_files.MAX_ROWS,
                       help="most samples loaded into memory (default %(default)s); larger "
                            "data: save the inputs as .npy")
    group.add_argument("--sample", type=positive, metavar="N",
                       help="work on a random N of the samples (seeded by --seed, in their "
                            "order): a curve or a diagnosis that costs less")
    add_setting(group, "cluster_source", choices=CLUSTER_SOURCES, metavar="SOURCE",
                more=f" One of {', '.join(CLUSTER_SOURCES)} (none: one cluster 'all').")
    add_setting(group, "k", flag=kmeans_flag, dest="kmeans_k")
    add_setting(group, "target", choices=(),
                more=" Here: label, predicted, all (every class) or a class id.")


def _run_arguments(group, seeded: str) -> None:
    """--batch-size, --n-steps, --seed (of `seeded`, in words) and --quiet."""
    add_setting(group, "batch_size")
    group.add_argument("--n-steps", type=positive, default=None,
                       help=f"integration steps (integrated_gradients, conductance; default "
                            f"{analysis.DEFAULT_N_STEPS}, or for score, curve and diagnose on "
                            f"data in memory as many of them as fit {PATH_SECONDS:.0f} s, "
                            f"halving, at least {FEWEST_STEPS}, said)")
    add_setting(group, "seed", help=f"The seed of {seeded}.")
    group.add_argument("--quiet", action="store_true", help="no progress bar")


def _method_argument(parser, what: str,
                     default: Union[str, Sequence[str]] = analysis.DEFAULT_METHOD,
                     flag: str = "--method") -> None:
    """`flag`: one of the registered methods, or one or more where `default` is a list;
    `what` they are for, in words."""
    names, many = method_names(), not isinstance(default, str)
    add_setting(parser, "method", flag=flag, choices=names, metavar="METHOD",
                nargs="+" if many else None, default=list(default) if many else default,
                help=f"{what} ({', '.join(names)}).")


def _data_parent(kmeans_flag: str) -> Parser:
    """The data options (`_data_arguments`); prune's --k counts neurons, so its k-means k is
    `kmeans_flag` --kmeans-k."""
    data = Parser(add_help=False)
    _data_arguments(data.add_argument_group("data"), kmeans_flag)
    return data


def _computation_parent(reduce: object = SETTINGS_DEFAULT) -> Parser:
    """The layer, its neuron axis, the reduction (default `reduce`, else the table's) and
    `_run_arguments`: one parent per default, as parents share their actions."""
    parser = Parser(add_help=False)
    group = parser.add_argument_group("computation")
    add_setting(group, "layer", required=True, more=" Its dotted name, as `layers` lists it.")
    add_setting(group, "neuron_axis", more=" E.g. 2 for a sequence [N, T, F]; the same as "
                                           "--layer NAME:AXIS.")
    add_setting(group, "reduce", default=reduce)
    _run_arguments(group, "random orders, k-means and the random method")
    return parser


def _band_parent(metric: Optional[str]) -> Parser:
    """The pruning curves' random orders and metric (default `metric`; None: the data's),
    one parent per default."""
    parser = Parser(add_help=False)
    group = parser.add_argument_group("pruning curves")
    add_setting(group, "n_random")
    add_setting(group, "metric", default=metric)
    return parser


@dataclass(frozen=True)
class _Parents:
    """The option groups several commands share (argparse parents)."""

    model: Parser
    data: Parser
    compute: Parser
    ablation: Parser
    written: Parser

    @classmethod
    def build(cls) -> "_Parents":
        ablation = Parser(add_help=False)
        ablation.add_argument("--ablation", choices=ABLATIONS, default=analysis.DEFAULT_ABLATION,
                              help="a removed neuron's output becomes 0 or its mean (default "
                                   "%(default)s)")
        written = Parser(add_help=False)
        written.add_argument("--force", action="store_true",
                             help="write over output files that exist (without it an existing "
                                  "file is refused before any work)")
        return cls(model_parser(), _data_parent("--k"), _computation_parent(), ablation,
                   written)


def build_parser(runs: Mapping[str, Callable]) -> argparse.ArgumentParser:
    """The `python -m attribution` parser with its seven commands; `runs` gives each command
    but `layers` its function (the parsed arguments' `run`)."""
    parser, commands = overview_parser()
    parents = _Parents.build()
    add_layers_command(commands, parents.model)
    for add in (_add_score, _add_curve, _add_prune, _add_diagnose, _add_report, _add_scorecard):
        add(commands, parents).set_defaults(run=runs[add.__name__.removeprefix("_add_")])
    return parser


def _add_score(commands, p: _Parents) -> Parser:
    command = add_command(commands, "score", [p.model, p.data, p.compute, p.written])
    _method_argument(command, "one or more methods", [analysis.DEFAULT_METHOD])
    command.add_argument("--out", required=True,
                         help="table (.csv or .parquet; '-' = CSV on stdout) with columns "
                              "cluster, neuron, method, score, n (and class for --targets all)")
    command.add_argument("--per-sample", type=Path,
                         help="also write the per-sample scores [N, n] as .npy (with several "
                              "methods: one file each, NAME.METHOD.npy)")
    return command


def _add_curve(commands, p: _Parents) -> Parser:
    command = add_command(commands, "curve", [p.model, p.data, p.compute, _band_parent(None),
                                              p.ablation, p.written])
    command.add_argument("--ks", default="all",
                         help="neuron counts to remove: 'all' or a comma-separated list")
    _method_argument(command, "the scores that rank the neurons")
    add_setting(command, "cluster", help="Rank by this cluster's scores and measure it "
                                         "against the rest.", default_words="all the data")
    command.add_argument("--out", required=True, help="curve table (.csv, .parquet or '-')")
    command.add_argument("--summary", type=Path, help="summary as JSON")
    return command


def _add_prune(commands, p: _Parents) -> Parser:
    command = add_command(commands, "prune", [
        p.model, _data_parent("--kmeans-k"), _computation_parent(analysis.DEFAULT_PRUNE_REDUCE),
        p.ablation, p.written])
    command.add_argument("--k", type=positive, required=True,
                         help="how many neurons of the layer to remove")
    add_setting(command, "n_random",
                help="Random draws of K neurons the removal is compared with.")
    command.add_argument("--oracle", choices=analysis.ORACLE_CHOICES, default="auto",
                         help="also remove the K neurons exact ablation finds least important, "
                              "for comparison: auto (when estimated under "
                              f"{analysis.PRUNE_ORACLE_SECONDS:.0f} s), on or off (default "
                              "%(default)s)")
    command.add_argument("--remove", choices=REMOVALS, default="bottom",
                         help="the K lowest-ranked neurons (bottom, the default) or the K "
                              "highest (top)")
    _method_argument(command, "the scores that rank the neurons")
    add_setting(command, "cluster", help="Rank by this cluster's scores.",
                default_words="all the data")
    add_setting(command, "metric", help="What is reported before and after.")
    command.add_argument("--out", required=True, type=Path,
                         help="the pruned model: a .pt2 file (torch.export), or for a Hugging "
                         "Face model a folder name without .pt2 (save_pretrained); either "
                         "loads like the original")
    command.add_argument("--summary", type=Path, help="what was removed and the metric before "
                                                      "and after, as JSON")
    return command


def _add_diagnose(commands, p: _Parents) -> Parser:
    command = add_command(commands, "diagnose", [
        p.model, p.data, p.compute, _band_parent(analysis.EVIDENCE_METRIC), p.ablation,
        p.written])
    _method_argument(command, "the method under test")
    add_setting(command, "cluster", help="Check only this cluster.",
                default_words="every cluster")
    command.add_argument("--user-scores", type=Path,
                         help="your own per-sample scores (.npy) to check your hook code: "
                              "one row per sample (with --cluster, its rows or every "
                              "sample's)")
    _oracle_argument(command, "the layer's neurons, for the agreement check")
    command.add_argument("--out", type=Path, help="findings as JSON")
    command.add_argument("--fail-on", choices=("problem", "warning"), default="problem",
                         help="lowest severity that makes the exit code 1 (default problem)")
    return command


def _add_report(commands, p: _Parents) -> Parser:
    command = add_command(commands, "report", [p.model, p.data, p.compute, _band_parent(None),
                                               p.written])
    _method_argument(command, "methods to show, as the dashboard's; the first ranks the "
                              "pruning curves",
                     [analysis.DEFAULT_METHOD, *analysis.DEFAULT_COMPARE])
    add_setting(command, "cluster", default_words="the first")
    command.add_argument("--title", help="the report's heading")
    command.add_argument("--out", required=True, type=Path, help="report (.html)")
    command.add_argument("--csv-dir", type=Path, help="also write the report's tables as CSVs")
    return command


def _add_scorecard(commands, p: _Parents) -> Parser:
    command = add_command(commands, "scorecard", [p.model, p.data, p.ablation, p.written])
    group = command.add_argument_group("scorecard")
    group.add_argument("--layers", nargs="+", metavar="LAYER",
                       help="layer names (default: every layer of `layers`)")
    _method_argument(group, "one or more methods", analysis.SCORECARD_METHODS, "--methods")
    group.add_argument("--n-boot", type=positive, default=analysis.BOOTSTRAP_DRAWS,
                       help="bootstrap draws of the spearman interval (default %(default)s)")
    add_setting(group, "n_random", default=analysis.SCORECARD_N_RANDOM,
                help="Random orders of curve_area.")
    group.add_argument("--curve-points", type=positive,
                       default=analysis.SCORECARD_CURVE_POINTS,
                       help="k steps of the curves of curve_area (default %(default)s)")
    add_setting(group, "metric")
    _oracle_argument(group, "each layer's neurons")
    _run_arguments(group, "the neurons drawn, the bootstrap, random orders, re-initialisation, "
                          "k-means and the random method")
    group.add_argument("--out", required=True,
                       help="table (.csv, .parquet or '-') with one row per (layer, method): "
                            + ", ".join(SCORECARD_COLUMNS))
    return command


def _image_shape(text: str) -> tuple[int, ...]:
    try:
        return data_module.parse_image_shape(text)
    except AttributionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
