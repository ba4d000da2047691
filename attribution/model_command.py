"""The command line's model options, the model they load, how a parsed command runs (its exit
codes, errors in one line), and `layers`, the one command that needs nothing more: torch and
the model loaders only, no pandas and no analysis, so that `python -m attribution layers`
starts at its floor (`benchmarks/bench_layers_command.py`). `cli` builds every other command
on these.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .commands import BAD_INPUT, Parser, add_command, overview_parser
from .engine import processes
from .engine.processes import device_for_rank, join_from_environment, leave, rank_and_size
from .errors import AttributionError
from .inputs.loaded import LoadedModel
from .inputs.model_formats import GuessedExampleFailed, load_model
from .inputs.untrusted.limits import DEFAULT_LIMITS, MB, Limits
from .presentation.cells import rows_csv, rows_text

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, BAD_INPUT, 3, 130

LIMIT_FLAGS = {  # Limits field -> help; each is the option --max-... (bytes in MB)
    "max_decoded_bytes": "MB a file may unpack or decode to",
    "max_features": "columns of a table",
    "max_layers": "layers of an architecture description",
    "max_parameters": "parameters of an architecture description",
    "max_pickle_nodes": "values in a .pt of nested lists, shared references counted as reached",
    "max_pickle_bytes": "MB of the pickle in a .pt (its data.pkl)",
    "max_archive_entries": "entries of a zip archive",
    "max_row_groups": "row groups of a Parquet file",
    "first_run_seconds": "seconds the jail gives a model's first load and run (a data file "
                         "gets 1 s more per 25 MB)",
    "first_run_memory_bytes": "MB the jail gives a model's first load and run",
}


def positive(text: str) -> int:
    """An option's positive integer (argparse's type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _flag(field: str) -> str:
    """The option of a Limits field: max_decoded_bytes -> --max-decoded-mb."""
    return "--" + field.replace("_bytes", "_mb").replace("_", "-")


def limits_from(args) -> Limits:
    """The Limits the command line asks for."""
    return Limits(**{field: getattr(args, field.replace("_bytes", "_mb"))
                     * (MB if field.endswith("_bytes") else 1) for field in LIMIT_FLAGS})


def _output_key(text: str):
    """--output: a position when it is an integer, else a key."""
    return int(text) if text.lstrip("-").isdigit() else text


def model_parser() -> Parser:
    """The options of every command that reads a model (a parent parser): the model's file,
    where its logits are, its architecture, trust, the device, and the limits."""
    model = Parser(add_help=False)
    group = model.add_argument_group("model")
    group.add_argument("--model", required=True, type=Path,
                       help=".pt2 (torch.export), a state dict with --architecture, or a "
                            "Hugging Face save_pretrained folder (config.json + "
                            "model.safetensors)")
    group.add_argument("--output", type=_output_key,
                       help="where the logits are in the model's output: a key or field name "
                            "(e.g. logits) or a position (0); default: the 'logits' entry, "
                            "else the first [N, C] tensor")
    group.add_argument("--architecture", type=Path,
                       help="architecture of a state dict: a JSON/YAML description, or a "
                            "Python file with --trust-code")
    group.add_argument("--trust-code", action="store_true",
                       help="allow pickled modules and Python files, and read the model and "
                            "data in this process rather than in the jail (only your own "
                            "files)")
    group.add_argument("--device", default=processes.default_device(),
                       help="cpu, cuda or cuda:N (default: cuda when a GPU is present, else "
                            "cpu, as the dashboard; under torchrun a bare 'cuda' means "
                            "cuda:LOCAL_RANK)")
    group = model.add_argument_group("limits", "budgets checked before a file is decoded; "
                                               "the defaults are far above real files")
    for field, help_text in LIMIT_FLAGS.items():
        default = getattr(DEFAULT_LIMITS, field)
        group.add_argument(_flag(field), type=positive,
                           default=default // MB if field.endswith("_bytes") else default,
                           help=f"{help_text} (default %(default)s)")
    return model


def add_layers_command(commands: argparse._SubParsersAction, model: Parser) -> None:
    """`layers` on the parser of `commands`, with the `model` options."""
    command = add_command(commands, "layers", [model])
    command.add_argument("--format", choices=("table", "csv", "json"), default="table")
    command.set_defaults(run=run_layers)


def file_size(path: Optional[Path]) -> Optional[int]:
    """No size limit for the user's own files: the limit is the file's own size."""
    return path.stat().st_size if path is not None and path.is_file() else None


def load_model_from(args, examples: Callable[[], list[torch.Tensor]] = list) -> LoadedModel:
    """The model of `--model`, on `--device` (this process's GPU under torchrun). Where the
    file does not say what the model takes, each of `examples()` is tried (the data's)."""
    device = device_for_rank(args.device)
    architecture = args.architecture
    if architecture is not None and not architecture.is_file():
        raise AttributionError(f"No such architecture file: {architecture}.")
    options = dict(architecture=architecture, trust_code=args.trust_code,
                   max_bytes=file_size(args.model), output=args.output, limits=limits_from(args))
    try:
        loaded = load_model(args.model, **options)
    except GuessedExampleFailed as guessed:  # the file does not say what the model takes:
        failure: AttributionError = guessed    # the data does
        for example in examples():
            try:
                loaded = load_model(args.model, example_input=example, **options)
                break
            except AttributionError as error:
                failure = error
        else:
            raise failure from None
    loaded.module.to(device)
    return loaded


def is_writer() -> bool:
    """Does this process write the results (rank 0, or the only process)?"""
    return rank_and_size()[0] == 0


def run_layers(args) -> int:
    model = load_model_from(args)
    rows = [{"name": info.name, "type": info.kind, "neurons": info.n_neurons,
             "shape": "x".join(map(str, info.shape)), "units": info.describe(),
             "neuron_axis": info.neuron_axis, "axis_rule": info.axis_rule}
            for info in model.layers()]
    if not is_writer():
        return EXIT_OK
    if args.format == "csv":
        sys.stdout.write(rows_csv(rows))
    elif args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(rows_text(rows))
    return EXIT_OK


def run_parsed(args, before: Callable[[argparse.Namespace], None] = lambda args: None) -> int:
    """Run the parsed command `args.run(args)` (after `before(args)`, e.g. checking its
    outputs, in the process group torchrun describes); returns the exit code, never raising
    for a user's mistake."""
    joined = finished = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # libraries' notes to developers
            joined = join_from_environment(device_for_rank(args.device))
            before(args)  # before any work: minutes of it would be lost
            with torch.inference_mode(False):  # a model it loads must be able to take gradients
                code = args.run(args)
            finished = True
            return code
    except AttributionError as error:
        say(f"error: {error}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug, not a user's mistake
        if args.traceback:
            raise
        say(f"internal error ({type(error).__name__}: {error}). This is a bug in attribution; "
            "rerun with --traceback and report it.")
        return EXIT_INTERNAL
    finally:
        leave(joined, finished)


def main_layers(argv: Sequence[str]) -> int:
    """`layers` alone (the entry point's way to it: `cli.main` parses every command, and
    imports every analysis to do so)."""
    parser, commands = overview_parser()
    add_layers_command(commands, model_parser())
    return run_parsed(parser.parse_args(argv))


def say(message: str) -> None:
    """`message` on stderr, prefixed by the rank when there are several processes."""
    rank, size = rank_and_size()
    print(f"[rank {rank}] {message}" if size > 1 else message, file=sys.stderr)
