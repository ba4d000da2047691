"""Shared benchmark helpers: a digits MLP, timings interleaved so noise hits all alike, and
the record of a run's figures that `benchmarks.speed_doc` turns into docs/speed.md.

Every figure a benchmark prints is also recorded (`record`, `note`; `report` does both).
Run through `run(main)`, a benchmark given `--results FILE` writes what it recorded there as
JSON, with the commit and the machine it ran on; `make bench` collects one file per
benchmark and writes docs/speed.md from them.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn


def trained_on_digits(model: nn.Module, epochs: int):
    """(model in eval mode, inputs [1797, 64], labels): `model` trained briefly on digits
    (the batches follow torch's global seed: seed before building the model)."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(x)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval(), x, y


def digits_mlp(repeat: int = 6, seed: int = 0):
    """(model, inputs [~10k, 64], labels): an MLP 64-128-64-10 trained briefly on digits."""
    torch.manual_seed(seed)
    model, x, y = trained_on_digits(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                      nn.Linear(64, 10)), epochs=15)
    return model, x.repeat(repeat, 1), y.repeat(repeat)


def interleaved_medians(candidates: dict[str, Callable[[], object]], repeats: int = 5
                        ) -> dict[str, float]:
    """Median seconds of each candidate, run round-robin so machine noise is shared."""
    for run in candidates.values():  # warm-up (tracing, allocator, caches)
        run()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, medians: dict[str, float], reference: str) -> None:
    """Print each median and its ratio to `reference` (ratio > 1: slower than reference), and
    record them."""
    print(f"\n{title}")
    base = medians[reference]
    for name, seconds in medians.items():
        print(f"  {name:<48} {seconds * 1000:10.1f} ms   {seconds / base:8.2f}x of {reference}")
    record(title, ("", "median", f"time / {reference}"),
           [(name, f"{seconds * 1000:.1f} ms", f"{seconds / base:.2f}x")
            for name, seconds in medians.items()])


RECORDED: list[dict] = []
"""What this process measured, in order: tables and notes (`record`, `note`)."""


def record(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Keep one table of figures for docs/speed.md: `rows` of cells, as they are printed."""
    RECORDED.append({"title": title, "header": [str(cell) for cell in header],
                     "rows": [[str(cell) for cell in row] for row in rows]})


def note(text: str) -> None:
    """Keep one sentence of figures for docs/speed.md (a count, a yes/no, a single time)."""
    RECORDED.append({"note": text})


ROOT = Path(__file__).resolve().parents[1]


def commit(root: Path = ROOT) -> str:
    """`git rev-parse --short HEAD`, plus "-dirty" when tracked files differ from it (as `git
    describe --dirty`); "unknown" outside a git checkout. $BENCH_COMMIT, where set, instead:
    a tree copied to another machine (a GPU's) may carry a stale .git."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                              capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=root, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed.strip() else "")


def machine() -> dict[str, object]:
    """The machine a run measured: CPU model, cores, GPU (None without CUDA), memory, torch
    and Python versions."""
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2 ** 20, 1)
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "gpu": gpu,
            "memory_gib": memory_gib, "torch": torch.__version__,
            "python": platform.python_version(), "system": platform.platform()}


def run(main: Callable[[], object], name: str) -> int:
    """Run a benchmark's `main` (its exit status: None or 0 = fine). With `--results FILE`
    among the arguments (taken out before `main` reads sys.argv), write what it recorded to
    FILE as JSON: the benchmark's `name`, the commit and the machine, when it started, and
    the recorded tables and notes, and the intra-op threads `main` left set."""
    arguments = sys.argv[1:]
    results = None
    if "--results" in arguments:
        at = arguments.index("--results")
        results = Path(arguments[at + 1])
        del arguments[at:at + 2]
        sys.argv[1:] = arguments
    started = datetime.datetime.now(datetime.timezone.utc)
    run_facts = {"benchmark": name, "commit": commit(), "machine": machine(),
                 "started": started.isoformat(timespec="seconds"),
                 "arguments": arguments}
    status = main()
    run_facts["threads"] = torch.get_num_threads()  # as main left them (some set 1)
    if results is not None:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({**run_facts, "recorded": RECORDED}, indent=1) + "\n")
    return int(status or 0)


@contextlib.contextmanager
def zeroed(layer: nn.Module, neurons) -> Iterator[None]:
    """The obvious ablation: a forward hook that zeroes `neurons` of `layer`'s output [B, n]."""
    def zero(module, args, out):
        out = out.clone()
        out[:, neurons] = 0
        return out

    handle = layer.register_forward_hook(zero)
    try:
        yield
    finally:
        handle.remove()


def batches(x: torch.Tensor, size: int):
    return [x[i:i + size] for i in range(0, len(x), size)]


__all__ = ["digits_mlp", "interleaved_medians", "report", "record", "note", "run",
           "batches", "zeroed", "np"]
