"""Where this process computes: a device that exists here, and among the processes torchrun
starts, this one's rank and their number, the device of a rank, and joining and leaving
their process group. torch and torch.distributed only, so a command that needs no analysis
(`layers`) can use it without importing one (`analyses.distributed` builds the sharded
computations on it)."""
from __future__ import annotations

import os
from typing import Union

import torch
import torch.distributed as dist

from ..errors import AttributionError


def default_device() -> str:
    """Where the dashboard and the command line compute when not told: "cuda" (the first
    GPU) when one is present, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def rank_and_size(group=None) -> tuple[int, int]:
    """(this process's rank, number of processes); (0, 1) without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def device_for_rank(device) -> torch.device:
    """`device` for this process: a bare "cuda" becomes cuda:LOCAL_RANK under torchrun."""
    resolved = resolve_device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = resolve_device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    return resolved


def join_from_environment(device: torch.device) -> bool:
    """Join the process group that torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR, ...).

    Returns True when this call created the group (the caller then calls `leave`); False when
    there is no torchrun environment or a group already exists.
    """
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return True


def leave(joined: bool, finished: bool = True) -> None:
    """Destroy the process group if `join_from_environment` created it. After a command that
    `finished` (every rank ran the same collectives to the end) the ranks first meet at a
    barrier: a gloo group torn down in one process while a peer still uses its connection
    (rank 0 writing the results) can abort that peer ("terminate called without an active
    exception"). After a failure no barrier: a peer may never arrive."""
    if joined and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def resolve_device(device: Union[str, torch.device]) -> torch.device:
    """`device` as a torch.device that exists here; AttributionError when it does not."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise AttributionError(f"Unknown device {device!r}; use 'cpu', 'cuda' or "
                               "'cuda:N'.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise AttributionError(
                f"Device {device!r} asks for a GPU, but CUDA is not available here (torch "
                f"{torch.__version__}); use device 'cpu', or install a CUDA build of torch.")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise AttributionError(f"Device {device!r} does not exist: this machine has "
                                   f"{torch.cuda.device_count()} GPU(s), cuda:0.. .")
    elif resolved.type != "cpu":
        raise AttributionError(f"Device {device!r} is not supported; use 'cpu' or 'cuda'.")
    return resolved
