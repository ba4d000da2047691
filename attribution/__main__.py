"""`python -m attribution ...` and the `attribution` script: `run`.

The overview (`--help` before any command) prints without importing torch; a command that
loads a model in the jail starts the jail's server first, so that its import of torch runs
beside this process's (`benchmarks/bench_layers_command.py` times it against a Python that
imports torch and loads the file); then `cli.main` runs the command, or for `layers`
`model_command.main_layers`, which imports the model loaders alone.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from .commands import COMMANDS, add_command, overview_parser


def asks_for_overview(arguments: Sequence[str]) -> bool:
    """Is this command line only a request for the overview (`-h` / `--help` before any
    command)?"""
    for argument in arguments:
        if argument in ("-h", "--help"):
            return True
        if argument != "--traceback":
            return False
    return False


def print_overview() -> None:
    """The overview, with every command listed (as `cli.build_parser`'s own help)."""
    parser, commands = overview_parser()
    for name in COMMANDS:
        add_command(commands, name)
    parser.print_help()


def run(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (arguments from sys.argv by default): the overview, or `cli.main`,
    which imports torch and the engine. Returns the exit code."""
    arguments = sys.argv[1:] if argv is None else [str(argument) for argument in argv]
    if asks_for_overview(arguments):
        print_overview()
        return 0
    if reads_a_model_in_the_jail(arguments):  # its server imports torch beside this process
        from .inputs.untrusted import jail
        from .inputs.tasks import first_run_task
        jail.warm_up(first_run_task(names_a_folder(arguments)))
    if command_of(arguments) == "layers":  # the model loaders alone: no analysis imported
        from .model_command import main_layers
        return main_layers(arguments)
    from .cli import main  # torch and the engine: only for a command
    return main(arguments)


def command_of(arguments: Sequence[str]) -> Optional[str]:
    """The command a command line names (its first argument but --traceback), if any."""
    return next((argument for argument in arguments if argument != "--traceback"), None)


def names_a_folder(arguments: Sequence[str]) -> bool:
    """Does the command line's --model name a folder (a Hugging Face save_pretrained one)?"""
    for index, argument in enumerate(arguments):
        if argument.startswith("--model="):
            return os.path.isdir(argument.partition("=")[2])
        if argument == "--model" and index + 1 < len(arguments):
            return os.path.isdir(arguments[index + 1])
    return False


def reads_a_model_in_the_jail(arguments: Sequence[str]) -> bool:
    """Will this command line load a model in the jail (a command, without --trust-code and
    without a request for help)? A wrong guess costs a server started for nothing, or one
    started later."""
    command = command_of(arguments)
    return command in COMMANDS and not {"--trust-code", "-h", "--help"} & set(arguments)


if __name__ == "__main__":
    sys.exit(run())
