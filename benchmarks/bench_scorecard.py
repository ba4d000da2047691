"""The scorecard of the digits CNN demo against exact ablation.

Every listed layer of the digits CNN demo (demo/digits_cnn.pt2, its 719
held-out samples, clusters by true label) x the 7 default methods, against one exact-ablation
pass per layer, side by side in one run (medians of 5, interleaved). Targets: under 10 s on
the 2-core machine; at most 2x the ablation passes (not met: see the breakdown printed after,
each part timed alone on the same work).

    python -m benchmarks.bench_scorecard [--results FILE]
"""
import sys
import time

import numpy as np

import attribution as at
from attribution.analyses import settings
from attribution.inputs.demo import load_demo
from benchmarks.common import interleaved_medians, note, record, report, run


def main() -> None:
    loaded, data = load_demo("digits_cnn")
    model, x, y = loaded.module, data.inputs, data.labels
    clusters = y.numpy()
    layers = [info.name for info in at.list_layers(model, x[:2])]

    def ablation_passes():
        for layer in layers:
            at.neuron_scores(model, layer, x, y, "ablation")

    medians = interleaved_medians({
        "one exact-ablation pass per layer": ablation_passes,
        f"at.scorecard ({len(layers)} layers x {len(settings.SCORECARD_METHODS)} methods)":
            lambda: at.scorecard(model, x, y, clusters),
    })
    report("scorecard of the digits CNN demo against exact ablation", medians,
           "one exact-ablation pass per layer")
    total = list(medians.values())[1]
    note(f"Scorecard of the digits CNN demo ({len(layers)} layers x "
         f"{len(settings.SCORECARD_METHODS)} methods): {total:.2f} s (median of 5; goal "
         "under 10 s).")

    parts = []
    for method in settings.SCORECARD_METHODS:
        start = time.perf_counter()
        for layer in layers:
            at.neuron_scores(model, layer, x, y, method)
        parts.append((f"scores: {method}, every layer", time.perf_counter() - start))
    rows = [(name, f"{seconds * 1000:.0f} ms", f"{seconds / total:.0%}")
            for name, seconds in parts]
    print("\nwhere the time goes (each part once, every layer; the scorecard computes each "
          "method twice: on the model and on the randomised copy)")
    for row in rows:
        print(f"  {row[0]:<48} {row[1]:>8}   {row[2]:>5} of the scorecard")
    record("scorecard parts: each method's scores over every layer, once", (
        "", "time", "share of the scorecard"), rows)
    print(f"  sum of the methods x 2: {2 * sum(s for _, s in parts):.2f} s of {total:.2f} s")
    assert np.isfinite(total)


if __name__ == "__main__":
    sys.exit(run(main, "bench_scorecard"))
