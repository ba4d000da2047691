"""Pruning curves and the checks built on them, against the obvious way to compute them.

A full curve is every k from 0 to n, for the ranked order, the bottom order and 20 seeded
random orders. Against: one full forward pass with a zeroing hook per (order, k), which
computes exactly the same numbers (checked before timing; target: the engine at least 5x
faster). On the built-in demo (demo/digits_mlp.pt2, layer fc2 with 16 units, its 719
held-out samples) and on a wider MLP (64-128-64-10, all 1,797 digits, its 64-unit layer
"2"). Also: a cluster's and the rest's curves in one call (zero and mean ablation) against
one curve over all samples; the time to the first progress update, i.e. to the first
points on the dashboard (target: a fraction of a second); `oracle_agreement` over every
method and `diagnose`, 10 clusters of the demo (target: seconds).

    python -m benchmarks.bench_pruning [--results FILE]
"""
import statistics
import sys
import time

import numpy as np
import torch

import attribution as at
from attribution.inputs.demo import load_demo
from attribution.analyses.pruning_curves import random_orders
from benchmarks.common import (batches, digits_mlp, interleaved_medians, note, report, run,
                               zeroed)

BATCH = 256
N_RANDOM = 20


def hooked_forward_per_order_and_k(model, layer, x, y, scores, n_random=N_RANDOM, seed=0):
    """The obvious curve: for every order and k, one full forward with a zeroing hook.

    Returns accuracy [2 + n_random, n_neurons + 1] (ranked, bottom, random orders).
    """
    n_neurons = len(scores)
    orders = [np.argsort(-scores, kind="stable"), np.argsort(scores, kind="stable")]
    orders += list(random_orders(n_neurons, n_random, seed).numpy())
    curves = np.zeros((len(orders), n_neurons + 1))
    with torch.no_grad():
        for row, order in enumerate(orders):
            for k in range(n_neurons + 1):
                with zeroed(layer, torch.as_tensor(order[:k], dtype=torch.long)):
                    correct = sum(int((model(xb).argmax(1) == yb).sum())
                                  for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)))
                curves[row, k] = correct / len(x)
    return curves


def first_update_seconds(model, layer, x, y, scores):
    """Seconds from the call to the first progress update, and the k range it covers."""
    start = time.perf_counter()
    seen = {}

    def stop_at_first(fraction, partial):
        seen["seconds"] = time.perf_counter() - start
        seen["ks"] = (int(partial["k"].min()), int(partial["k"].max()), len(partial))
        raise KeyboardInterrupt

    try:
        at.pruning_curve(model, layer, x, y, scores, progress=stop_at_first)
    except KeyboardInterrupt:
        pass
    return seen["seconds"], seen["ks"]


def curve_against_hooks(title, model, layer, x, y):
    """Check that both give the same curves, then time them side by side."""
    module = dict(model.named_modules())[layer]
    clusters = y.numpy()
    scores = at.cluster_scores(model, layer, x, y, clusters, "gradient_x_activation").loc[3]
    vector = scores.drop("n").to_numpy(dtype=np.float64)
    ours = at.pruning_curve(model, layer, x, y, scores, n_random=N_RANDOM)
    reference = hooked_forward_per_order_and_k(model, module, x, y, vector)
    assert np.allclose(ours["ranked"], reference[0], atol=1e-9)
    assert np.allclose(ours["bottom"], reference[1], atol=1e-9)
    assert np.allclose(ours.attrs["random_curves"], reference[2:], atol=1e-9)
    print(f"\n{title}: both compute the same curves (ranked, bottom, all {N_RANDOM} random)")
    note(f"{title}: both compute the same curves (ranked, bottom, all {N_RANDOM} random).")
    report(f"full curve: {2 + N_RANDOM} orders x {len(vector) + 1} k, {len(x)} samples",
           interleaved_medians({
               "at.pruning_curve": lambda: at.pruning_curve(model, layer, x, y, scores),
               "one hooked forward per (order, k)":
                   lambda: hooked_forward_per_order_and_k(model, module, x, y, vector),
           }, repeats=3), "at.pruning_curve")
    return scores


def main():
    torch.manual_seed(0)
    loaded, data = load_demo("digits_mlp")
    model, x, y = loaded.module, data.inputs, torch.as_tensor(data.labels).long()
    clusters = y.numpy()
    print(f"{torch.get_num_threads()} threads")
    note(f"{torch.get_num_threads()} threads.")
    scores = curve_against_hooks("demo digits MLP 64-32-16-10, layer fc2 (16 units)",
                                 model, "fc2", x, y)

    report("the cluster and the rest of the data in one call (zero and mean ablation)",
           interleaved_medians({
               "at.pruning_curve (all samples)":
                   lambda: at.pruning_curve(model, "fc2", x, y, scores),
               "at.cluster_pruning_curves zero": lambda: at.cluster_pruning_curves(
                   model, "fc2", x, y, clusters, 3, scores),
               "at.cluster_pruning_curves mean": lambda: at.cluster_pruning_curves(
                   model, "fc2", x, y, clusters, 3, scores, ablation="mean"),
           }, repeats=3), "at.pruning_curve (all samples)")

    firsts = [first_update_seconds(model, "fc2", x, y, scores) for _ in range(5)]
    seconds = statistics.median(first for first, _ in firsts)
    k_low, k_high, count = firsts[0][1]
    print(f"\nfirst progress update after {seconds * 1000:.0f} ms (median of 5), "
          f"{count} points covering k = {k_low}..{k_high}")
    note(f"First progress update of the demo's curve after {seconds * 1000:.0f} ms (median of "
         f"5): {count} points covering k = {k_low}..{k_high}.")

    report(f"oracle agreement, all {len(at.method_names())} methods, 10 clusters; diagnose",
           interleaved_medians({
               "at.oracle_agreement": lambda: at.oracle_agreement(model, "fc2", x, y,
                                                                   clusters=clusters),
               "at.diagnose (gradient, signed mean, 10 clusters)":
                   lambda: at.diagnose(model, "fc2", x, y, "gradient", clusters=clusters),
           }, repeats=3), "at.oracle_agreement")

    wide, x, y = digits_mlp(repeat=1)
    curve_against_hooks("wider MLP 64-128-64-10, layer '2' (64 units)", wide, "2", x, y)


if __name__ == "__main__":
    sys.exit(run(main, "bench_pruning"))
