"""The budgets that keep a small hostile file from taking the machine: one place for all of them.

Every budget is checked before the memory or time is spent (from zip directories, .npy and
Parquet headers, pickled containers, CSV header lines and architecture descriptions), and a
file over one is refused with an `AttributionError` naming the limit and how to raise it.
The defaults are far above what a real model or data set for this tool needs. The file-size
limit (`MAX_UPLOAD_BYTES`, applied by `files.read_source`) and the in-memory row limit
(`data_files.MAX_ROWS`) keep their own `max_bytes=` / `max_rows=` arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

MB = 10 ** 6
MAX_UPLOAD_BYTES = 200 * 1024 * 1024
"""Default size limit for a model or data file (`max_bytes=` overrides it per call)."""


@dataclass(frozen=True)
class Limits:
    """Budgets for reading one model or data file.

    Attributes:
        max_decoded_bytes: bytes a file may unpack or decode to (zip entries together, a
            Parquet table, the arrays of a .pt, a model's parameters as float32).
        max_features: columns of a table (CSV/Parquet), values per sample otherwise.
        max_layers: hidden layers plus convolutions in an architecture description.
        max_parameters: parameters of an architecture description.
        max_pickle_nodes: containers and values in a .pt of nested lists/dicts, counting a
            shared reference as often as it is reached.
        max_pickle_bytes: size of the pickle in a .pt (its data.pkl): PyTorch's safe unpickler
            takes about 1-3 s per MB, so a file of many small tensors or long lists is slow
            to read however little memory it needs.
        max_archive_entries: entries of a zip archive.
        max_row_groups: row groups of a Parquet file (pandas writes one).
        first_run_seconds: wall-clock time an untrusted model may take to load and run its
            first batches in the jail (`attribution.inputs.untrusted.jail`), after the
            child's own start-up.
        first_run_memory_bytes: memory that child may add to its start-up footprint.
    """

    max_decoded_bytes: int = 2000 * MB
    max_features: int = 100_000
    max_layers: int = 1_000
    max_parameters: int = 500_000_000
    max_pickle_nodes: int = 10_000_000
    max_pickle_bytes: int = 4 * MB
    max_archive_entries: int = 100_000
    max_row_groups: int = 10_000
    first_run_seconds: float = 5.0
    first_run_memory_bytes: int = 1000 * MB


DEFAULT_LIMITS = Limits()


def over_budget(what: str, amount: str, limit: str, setting: str) -> str:
    """The message for a file over one budget: what, how much, the limit and how to raise it."""
    return (f"{what} {amount}, over the limit of {limit}. If the file is genuine, raise the "
            f"limit on your own machine: limits=Limits({setting}=...) in Python, or the "
            f"matching --{setting.replace('_', '-').replace('bytes', 'mb')} option of the "
            "command line.")


def held_bytes(values: int, itemsize: int) -> int:
    """Bytes `values` numbers of `itemsize` bytes take once the engine holds them: float32 at
    the least (a bool or uint8 array grows 4x on the way in), wider types as stored. What
    every decoded-bytes budget counts, whatever the container."""
    return values * max(itemsize, 4)
