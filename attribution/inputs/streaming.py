"""Inputs larger than memory: the rows of a .npy file, read from disk one batch at a time,
and the small per-sample arrays (labels, cluster ids, scores) that go with them.

Both parse a file's .npy header in the jail's child (`untrusted.jail`) unless sandbox=False:
this process reads the rows as raw numbers at the offset, dtype and shape the jail checked.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np

from ..errors import AttributionError, reading
from ..defaults import DEFAULT_BATCH_SIZE
from .untrusted import jail
from .untrusted.limits import DEFAULT_LIMITS, MB, Limits, over_budget
from .untrusted.files import open_regular
from .tasks import READ_LAYOUT, READ_SMALL

_PLAIN_DTYPE = re.compile(r"[<>|=][biuf][1-9][0-9]?")  # e.g. "<f4", "|b1": numbers, no fields
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}


class NpyRows:
    """The rows of a .npy file, read with plain file reads one batch at a time.

    Unlike `np.load(path, mmap_mode="r")`, which also streams but keeps every page it has read
    resident, memory stays one batch however large the file. Iterating yields arrays
    [B, ...] of `batch_size` rows; `rows[begin:end]` is a lazy view of a row range (a shard);
    `shape` gives the row count up front, so targets and cluster ids can be checked.

    Args:
        path: a .npy file (C order, numeric dtype).
        batch_size: rows per batch.
        sandbox: read the file's header in the jail (default: on; a file someone sent you
            is untrusted); sandbox=False for your own files.
        limits: the jail's budget (`first_run_seconds`, `first_run_memory_bytes`).
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = DEFAULT_BATCH_SIZE,
                 sandbox: Optional[bool] = None, limits: Limits = DEFAULT_LIMITS):
        self.path = Path(path)
        if batch_size < 1:
            raise AttributionError("batch_size must be a positive integer.")
        self.batch_size = batch_size
        if sandbox is False:
            layout = read_layout(str(self.path))
        else:
            layout = jail.check(READ_LAYOUT, {"path": os.path.abspath(self.path)},
                                _budget(limits, 0, "Reading the .npy file's header")).facts
        shape, self.dtype, self._offset = _checked_layout(layout)
        self.row_shape = tuple(shape[1:])
        self._row_items = int(np.prod(self.row_shape, dtype=np.int64))
        self._begin, self._end = 0, int(shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._end - self._begin,) + self.row_shape

    def __len__(self) -> int:
        return self._end - self._begin

    def __getitem__(self, rows: slice) -> "NpyRows":
        """A lazy view of a contiguous range of rows."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("NpyRows supports contiguous slices only, e.g. rows[100:200].")
        begin, end, _ = rows.indices(len(self))
        view = object.__new__(NpyRows)
        view.__dict__.update(self.__dict__)
        view._begin, view._end = self._begin + begin, self._begin + max(begin, end)
        return view

    def __iter__(self) -> Iterator[np.ndarray]:
        row_bytes = self._row_items * self.dtype.itemsize
        with open_regular(self.path, "data") as file:
            for begin in range(self._begin, self._end, self.batch_size):
                count = min(self.batch_size, self._end - begin)
                file.seek(self._offset + begin * row_bytes)
                batch = np.fromfile(file, dtype=self.dtype, count=count * self._row_items)
                if batch.size != count * self._row_items:
                    raise AttributionError(f"{self.path} ended early: it was truncated after "
                                           "its header was read.")
                yield batch.astype(self.dtype.newbyteorder("="), copy=False).reshape(
                    (count,) + self.row_shape)

    def __repr__(self) -> str:
        return f"NpyRows({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"


def read_layout(path: str) -> dict:
    """The header of the .npy file at `path` as plain facts: {"shape", "dtype" (its text,
    e.g. "<f4"), "offset" (of the first row)}, checked to be a numeric C-order array [N, ...]
    whose rows the file holds. Runs in the jail's child unless sandbox=False."""
    try:
        with open_regular(path, "data") as file:
            version = np.lib.format.read_magic(file)
            if version not in _HEADER_READERS:
                raise ValueError(f"unsupported .npy version {version}")
            shape, fortran_order, dtype = _HEADER_READERS[version](file)
            offset, size = file.tell(), os.fstat(file.fileno()).st_size
    except OSError as error:
        raise AttributionError(f"Cannot read {path}: {error.strerror or error}.") from None
    except (ValueError, SyntaxError) as error:
        raise AttributionError(f"{path} is not a valid .npy file ({error}); save the inputs "
                               "with numpy.save.") from None
    if fortran_order or not _PLAIN_DTYPE.fullmatch(dtype.str) or not shape:
        raise AttributionError(
            f"{path} must hold a numeric array [N, ...] in C order (it has dtype {dtype}, "
            f"shape {shape}); save it with numpy.save(path, "
            "numpy.ascontiguousarray(x, dtype=numpy.float32)).")
    needed = offset + int(np.prod(shape, dtype=object)) * dtype.itemsize
    if size < needed:
        raise AttributionError(f"{path} is truncated: the header promises {needed} bytes, "
                               f"the file has {size}.")
    return {"shape": [int(length) for length in shape], "dtype": dtype.str, "offset": offset}


def _checked_layout(layout: dict) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, offset) from `read_layout`'s facts, which crossed back from the jail:
    plain numbers and a dtype text that names a plain number type."""
    shape, dtype, offset = layout.get("shape"), layout.get("dtype"), layout.get("offset")
    if not (isinstance(shape, list) and shape and isinstance(dtype, str)
            and _PLAIN_DTYPE.fullmatch(dtype) and isinstance(offset, int) and offset >= 0
            and all(isinstance(length, int) and length >= 0 for length in shape)):
        raise AttributionError("The jail handed back a malformed .npy layout.")
    return tuple(shape), np.dtype(dtype), offset


def read_per_sample(path: Union[str, os.PathLike], what: str,
                    limits: Limits = DEFAULT_LIMITS, sandbox: Optional[bool] = None
                    ) -> np.ndarray:
    """A small .npy of per-sample values (labels, cluster ids, one's own scores), read whole
    in the jail (unless sandbox=False) once its header's size is within
    `limits.max_decoded_bytes`: numbers, booleans or text (bytes become text)."""
    if sandbox is False:
        return _read_small(str(path), what, limits.max_decoded_bytes)["arrays"]["values"]
    answer = jail.check(READ_SMALL, {"path": os.path.abspath(path), "what": what,
                                     "max_bytes": limits.max_decoded_bytes},
                        _budget(limits, limits.max_decoded_bytes, f"Reading the {what} file"))
    return answer.arrays["values"]


def _read_small(path: str, what: str, max_bytes: int) -> dict:
    """`read_per_sample`'s work, in the jail's child unless sandbox=False."""
    open_regular(path, what).close()  # not a pipe or a device, whose read would block
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise AttributionError(f"No such {what} file: {path}.") from None
    except (ValueError, OSError, EOFError, SyntaxError) as error:
        raise AttributionError(f"{path} is not a readable .npy file of {what} ({error}); save "
                               "it with numpy.save.") from None
    if not isinstance(mapped, np.ndarray):
        raise AttributionError(f"{path} is not a .npy file of {what}; save one array with "
                               "numpy.save.")
    if mapped.dtype.kind not in "biufUS" or mapped.dtype.fields is not None:
        raise AttributionError(f"{path} holds {mapped.dtype} values; the {what} must be "
                               "numbers or text.")
    text_bytes = mapped.size * 4 * mapped.dtype.itemsize if mapped.dtype.kind == "S" else 0
    if max(mapped.nbytes, text_bytes) > max_bytes:
        raise AttributionError(over_budget(
            f"The {what} file holds", f"{max(mapped.nbytes, text_bytes) / MB:,.0f} MB",
            f"{max_bytes / MB:,.0f} MB", "max_decoded_bytes"))
    with reading(f"The {what} in {path} could not be read as text",
                 "save them as str or integer ids"):
        values = mapped.astype(str) if mapped.dtype.kind == "S" else np.array(mapped)
    return {"arrays": {"values": values}}


def _budget(limits: Limits, held_bytes: int, work: str) -> jail.Budget:
    """The jail's budget for reading a .npy's header or a small .npy holding `held_bytes`."""
    return jail.Budget(seconds=limits.first_run_seconds,
                       memory_bytes=limits.first_run_memory_bytes + 2 * held_bytes,
                       file_bytes=held_bytes + MB, work=work,
                       name="reading an untrusted file")
