"""Costs said before they run, against what the work then takes, on models of several families.

For each family (the test suite's builders: a trained 1D-CNN, a TransformerEncoder, a
depthwise-separable CNN with squeeze-excite, two named inputs, a graph net, a regression MLP)
the estimate the command line prints before a pruning curve (`costs.curve_cost`: the front
and the masked tail timed at two batch sizes, every k) and before `diagnose` and
`scorecard` (`costs.sampled_cost`: the work timed on two stratified samples, extrapolated),
then the work itself, timed once. The goal: every
estimate within 1.5x of the actual, both ways.

    python -m benchmarks.bench_estimates [--results FILE]
"""
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
    """(name, model, inputs, targets, layer) of each family, at sizes whose work takes a
    second or more here."""
    model, x, y = trained_cnn1d()
    x, y = x.repeat(8, 1, 1), y.repeat(8)
    yield "1D-CNN (trained)", model, x, y, "2"
    for name, size in (("transformer_encoder", 9216), ("separable_cnn", 4608),
                       ("tabular", 24576), ("graph", 24576)):
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


def _timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    rows = []
    ratios = []
    for name, model, x, y, layer in _problems():
        n_neurons = at.neuron_scores(model, layer, {k: v[:1] for k, v in x.items()}
                                     if isinstance(x, dict) else x[:1], None).shape[1]
        ranking = np.arange(n_neurons, dtype=np.float64)
        said = curve_cost(model, layer, x, y, n_random=N_RANDOM).seconds
        took = _timed(lambda: at.pruning_curve(model, layer, x, y, ranking, n_random=N_RANDOM))
        rows.append((name, layer, "curve", f"{said:.2f} s", f"{took:.2f} s", f"{said / took:.2f}"))
        ratios.append(said / took)
        said = diagnose_cost(model, layer, x, y, n_random=N_RANDOM).seconds
        took = _timed(lambda: at.diagnose(model, layer, x, y, n_random=N_RANDOM))
        rows.append((name, layer, "diagnose", f"{said:.2f} s", f"{took:.2f} s",
                     f"{said / took:.2f}"))
        ratios.append(said / took)
        said = scorecard_cost(model, x, y, None, layers=[layer], n_random=5).seconds
        took = _timed(lambda: at.scorecard(model, x, y, layers=[layer], n_random=5))
        rows.append((name, layer, "scorecard", f"{said:.2f} s", f"{took:.2f} s",
                     f"{said / took:.2f}"))
        ratios.append(said / took)
        print(*("  ".join(row) for row in rows[-3:]), sep="\n", flush=True)
    record("estimates said before the work, against the work (one timing each)",
           ("model", "layer", "work", "said", "took", "said / took"), rows)
    within = sum(1 / 1.5 <= ratio <= 1.5 for ratio in ratios)
    note(f"Estimates within 1.5x of the actual: {within} of {len(ratios)} (said / took from "
         f"{min(ratios):.2f} to {max(ratios):.2f}).")


if __name__ == "__main__":
    sys.exit(run(main, "bench_estimates"))
