"""Shared benchmark helpers: a digits MLP, and timings interleaved so noise hits all alike."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Iterator

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
    """Print each median and its ratio to `reference` (ratio > 1: slower than reference)."""
    print(f"\n{title}")
    base = medians[reference]
    for name, seconds in medians.items():
        print(f"  {name:<48} {seconds * 1000:10.1f} ms   {seconds / base:8.2f}x of {reference}")


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


__all__ = ["digits_mlp", "interleaved_medians", "report", "batches", "zeroed", "np"]
