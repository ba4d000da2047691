"""Costs said before they run, against what the work then takes, on models of several families.

For each family (the test suite's builders: a trained 1D-CNN, a TransformerEncoder, a
depthwise-separable CNN with squeeze-excite, two named inputs, a graph net, a regression MLP)
the estimate the command line prints before a pruning curve (`costs.curve_cost`: the front
and the masked tail timed at two batch sizes, every k) and before `diagnose` and
`scorecard` (`costs.sampled_cost`: the work timed on two stratified samples, extrapolated),
then the work itself: each estimate made before each run, medians of three. The goal:
every estimate within 1.5x of the actual, both ways, and every upper bound (said for a
quick work) held.

    python -m benchmarks.bench_estimates [--results FILE]
"""
import statistics
import sys
import time

import numpy as np
import torch

import attribution as at
from attribution.analyses import settings
from attribution.analyses.costs import curve_cost
from attribution.analyses.diagnose import diagnose_cost
from attribution.analyses.scorecard import scorecard_cost
from benchmarks.common import note, record, run
from tests.support.families import family, trained_cnn1d

N_RANDOM = 20


def _problems():
    """(name, model, inputs, targets, layer) of each family, at sizes whose diagnosis takes
    about 5 s or more here (a quicker work is said as an upper bound)."""
    model, x, y = trained_cnn1d()
    x, y = x.repeat(32, 1, 1), y.repeat(32)
    yield "1D-CNN (trained)", model, x, y, "2"
    for name, size in (("transformer_encoder", 36864), ("separable_cnn", 18432),
                       ("tabular", 61440), ("graph", 61440)):
        model, x = family(name)
        x = {key: value.repeat(size // len(value), *([1] * (value.dim() - 1)))
             for key, value in x.items()} if isinstance(x, dict) else \
            x.repeat(size // len(x), *([1] * (x.dim() - 1)))
        first = {key: value[:2] for key, value in x.items()} if isinstance(x, dict) else x[:2]
        layer = settings.default_layer(at.list_layers(model, first))
        yield name, model, x, None, layer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).eval()
    x = torch.randn(60000, 5)
    yield "regression MLP", model, x, x[:, 0] * 2.0, "1"


REPEATS = 3


def _said_and_took(estimate, work) -> tuple[float, bool, float, float]:
    """(seconds said, whether said as an upper bound, seconds the estimate itself took,
    median seconds of the work): the estimate before each run of the work, REPEATS times,
    so machine noise falls on both alike; medians."""
    said, bound, spent, took = [], False, [], []
    for _ in range(REPEATS):
        started = time.perf_counter()
        cost = estimate()
        spent.append(time.perf_counter() - started)
        said.append(cost.seconds)
        bound = getattr(cost, "bound", False)
        started = time.perf_counter()
        work()
        took.append(time.perf_counter() - started)
    return (statistics.median(said), bound, statistics.median(spent),
            statistics.median(took))


def main() -> None:
    rows, ratios, bounds = [], [], []
    for name, model, x, y, layer in _problems():
        n_neurons = at.neuron_scores(model, layer, {k: v[:1] for k, v in x.items()}
                                     if isinstance(x, dict) else x[:1], None).shape[1]
        ranking = np.arange(n_neurons, dtype=np.float64)
        works = {
            "curve": (lambda: curve_cost(model, layer, x, y, n_random=N_RANDOM),
                      lambda: at.pruning_curve(model, layer, x, y, ranking,
                                               n_random=N_RANDOM)),
            "diagnose": (lambda: diagnose_cost(model, layer, x, y, n_random=N_RANDOM),
                         lambda: at.diagnose(model, layer, x, y, n_random=N_RANDOM)),
            "scorecard": (lambda: scorecard_cost(model, x, y, None, layers=[layer],
                                                 n_random=5),
                          lambda: at.scorecard(model, x, y, layers=[layer], n_random=5)),
        }
        for work, (estimate, run_work) in works.items():
            said, bound, spent, took = _said_and_took(estimate, run_work)
            (bounds if bound else ratios).append(said / took)
            rows.append((name, layer, work, ("at most " if bound else "") + f"{said:.2f} s",
                         f"{spent:.2f} s", f"{took:.2f} s", f"{said / took:.2f}"))
            print("  ".join(rows[-1]), flush=True)
    record(f"estimates said before the work, against the work (medians of {REPEATS}, "
           "interleaved)", ("model", "layer", "work", "said", "saying took", "took",
                            "said / took"), rows)
    within = sum(1 / 1.5 <= ratio <= 1.5 for ratio in ratios)
    note(f"Estimates within 1.5x of the actual: {within} of {len(ratios)} (said / took from "
         f"{min(ratios):.2f} to {max(ratios):.2f}). Upper bounds (a quick work, timed on "
         f"one batch): {sum(ratio >= 1 for ratio in bounds)} of {len(bounds)} held.")


if __name__ == "__main__":
    sys.exit(run(main, "bench_estimates"))
