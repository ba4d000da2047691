"""Inputs larger than memory: the rows of a .npy file, read from disk one batch at a time."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import AttributionError
from ..defaults import DEFAULT_BATCH_SIZE


class NpyRows:
    """The rows of a .npy file, read with plain file reads one batch at a time.

    Unlike `np.load(path, mmap_mode="r")`, which also streams but keeps every page it has read
    resident, memory stays one batch however large the file. Iterating yields arrays
    [B, ...] of `batch_size` rows; `rows[begin:end]` is a lazy view of a row range (a shard);
    `shape` gives the row count up front, so targets and cluster ids can be checked.

    Args:
        path: a .npy file (C order, numeric dtype).
        batch_size: rows per batch.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = DEFAULT_BATCH_SIZE):
        self.path = Path(path)
        if batch_size < 1:
            raise AttributionError("batch_size must be a positive integer.")
        self.batch_size = batch_size
        try:
            with open(self.path, "rb") as file:
                version = np.lib.format.read_magic(file)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran_order, dtype = read_header(file)
                self._offset = file.tell()
        except OSError as error:
            raise AttributionError(f"Cannot read {self.path}: {error.strerror or error}.") from None
        except ValueError as error:
            raise AttributionError(f"{self.path} is not a valid .npy file ({error}); save the "
                                   "inputs with numpy.save.") from None
        if fortran_order or dtype.hasobject or dtype.kind not in "biuf" or not shape:
            raise AttributionError(
                f"{self.path} must hold a numeric array [N, ...] in C order (it has dtype "
                f"{dtype}, shape {shape}); save it with numpy.save(path, "
                "numpy.ascontiguousarray(x, dtype=numpy.float32)).")
        self.dtype = dtype
        self.row_shape = tuple(shape[1:])
        self._row_items = int(np.prod(self.row_shape, dtype=np.int64))
        self._begin, self._end = 0, int(shape[0])
        needed = self._offset + self._end * self._row_items * dtype.itemsize
        if self.path.stat().st_size < needed:
            raise AttributionError(f"{self.path} is truncated: the header promises "
                                   f"{needed} bytes, the file has {self.path.stat().st_size}.")

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
        with open(self.path, "rb") as file:
            for begin in range(self._begin, self._end, self.batch_size):
                count = min(self.batch_size, self._end - begin)
                file.seek(self._offset + begin * row_bytes)
                batch = np.fromfile(file, dtype=self.dtype, count=count * self._row_items)
                yield batch.astype(self.dtype.newbyteorder("="), copy=False).reshape(
                    (count,) + self.row_shape)

    def __repr__(self) -> str:
        return f"NpyRows({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"
