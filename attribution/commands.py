"""The command line's commands and its top-level parser.

Torch-free, so the overview prints at once: the entry point (`attribution.__main__.run`)
answers a top-level `--help` from `overview_parser()` alone, and `cli.build_parser` builds
each command's own options on the same parser.
"""
from __future__ import annotations

import argparse
from typing import Sequence

PROG = "python -m attribution"
DESCRIPTION = "Neuron importance for PyTorch classifiers, from the shell."
COMMANDS = {
    "layers": "list the model's layers",
    "score": "neuron scores per cluster as a tidy CSV/Parquet table",
    "curve": "pruning curves (ranked, bottom, random band) as CSV, summary as JSON",
    "prune": "a copy of the model with a layer's K lowest-ranked neurons removed, as .pt2",
    "diagnose": "are the scores degenerate? findings as JSON and a table; exit 1 on a problem",
    "report": "the dashboard's self-contained offline HTML report",
    "scorecard": "every method on every layer against exact ablation, as a CSV/Parquet table",
}
"""Each command and its one line of help, in the order the overview lists them."""
BAD_INPUT = 2
"""The exit code of a usage mistake (cli's EXIT_BAD_INPUT)."""


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (plus where to find help), exit code 2."""

    def error(self, message: str):
        self.exit(BAD_INPUT, f"error: {message}\n(see `{self.prog} --help`)\n")


def overview_parser() -> tuple[Parser, argparse._SubParsersAction]:
    """(the top-level parser, its commands): `--traceback` and one subparser per command,
    which `cli.build_parser` fills with that command's options (`add_command`)."""
    parser = Parser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--traceback", action="store_true",
                        help="show the full traceback of an internal error")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser,
                                     metavar="{" + ",".join(COMMANDS) + "}")
    return parser, commands


def add_command(commands: argparse._SubParsersAction, name: str,
                parents: Sequence[argparse.ArgumentParser] = ()) -> Parser:
    """The subparser of command `name`, with its help from `COMMANDS`."""
    return commands.add_parser(name, parents=list(parents), help=COMMANDS[name])

