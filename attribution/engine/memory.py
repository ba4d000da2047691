"""Fresh result tables: CPU memory that the OS maps in huge pages where it can."""
from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE_MIN_BYTES = 4 << 20
"""Tables from this size up are mapped with MADV_HUGEPAGE (below it the faults cost little)."""


def empty_table(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """torch.empty(shape, dtype) on the CPU. From `HUGE_PAGE_MIN_BYTES` up, in anonymous
    memory advised MADV_HUGEPAGE where the OS has it (Linux's transparent huge pages): the
    first write then faults once per 2 MiB instead of once per 4 KiB page: page faults had
    been a large share of a wide layer's whole gradient pass."""
    n_bytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if n_bytes < HUGE_PAGE_MIN_BYTES or advice is None:
        return torch.empty(shape, dtype=dtype)
    memory = mmap.mmap(-1, n_bytes)
    with contextlib.suppress(OSError):  # advice the kernel does not take: plain pages
        memory.madvise(advice)
    return torch.frombuffer(memory, dtype=dtype).view(shape)  # the tensor keeps `memory`
