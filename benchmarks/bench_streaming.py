"""Peak memory of the streaming path: 1x, 10x and 100x the demo's samples, each in a fresh process.

`python -m attribution score` on a .npy of inputs (read batch by batch with `NpyRows`), with
labels and cluster ids as .npy files: peak RSS (resource.getrusage) must stay flat as the data
grows 100-fold, with and without the per-sample matrix (which goes to disk batch by batch).
For comparison, the library on `np.load(mmap_mode="r")` (also streamed, but every page read
stays resident) and on the data loaded into memory.

Flat means: from 1x to 100x the streamed peak grows by less than half (`FLAT`) of what the
100x inputs occupy in memory, i.e. the inputs are never resident (what remains is O(N)
small ids: labels and cluster ids, 8-16 bytes a sample). Exit status 1 otherwise.

    python -m benchmarks.bench_streaming [--results FILE]
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import note, record, run  # noqa: E402

MODEL = ROOT / "demo" / "digits_mlp.pt2"
DATA = ROOT / "demo" / "digits.npz"
FACTORS = (1, 10, 100)
FLAT = 0.5  # allowed growth of the streamed peak, as a share of the 100x inputs' bytes
CHUNK = 20  # copies of the demo written per step, so this process stays small too

MEASURE = """
import json, resource, time
start = time.perf_counter()
{body}
print(json.dumps({{"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - start}}))
"""

COMMAND_LINE = """
from attribution.cli import main
code = main({arguments!r})
assert code == 0, code
"""

LIBRARY = """
import numpy as np, torch
import attribution as at
model = at.load_model({model!r}).module
labels = torch.from_numpy(np.load({folder!r} + "/labels.npy"))
clusters = np.load({folder!r} + "/clusters.npy")
inputs = np.load({folder!r} + "/inputs.npy", mmap_mode="r")
if {in_memory!r}:
    inputs = torch.from_numpy(np.array(inputs))
at.cluster_scores(model, "fc2", inputs, labels, clusters, "gradient")
"""


def write_scaled(folder: Path, factor: int) -> int:
    """inputs.npy, labels.npy, clusters.npy: the demo repeated `factor` times."""
    demo = np.load(DATA)
    inputs, labels, clusters = demo["inputs"], demo["labels"], demo["clusters"]
    n = len(inputs) * factor
    stored = np.lib.format.open_memmap(folder / "inputs.npy", mode="w+", dtype=np.float32,
                                       shape=(n, inputs.shape[1]))
    for begin in range(0, factor, CHUNK):
        copies = min(CHUNK, factor - begin)
        stored[begin * len(inputs):(begin + copies) * len(inputs)] = np.tile(inputs, (copies, 1))
    stored.flush()
    del stored
    np.save(folder / "labels.npy", np.tile(labels, factor))
    np.save(folder / "clusters.npy", np.tile(clusters, factor))
    return n


def measure(body: str) -> dict:
    """Peak RSS (MiB) and seconds of `body`, run in a fresh Python process."""
    done = subprocess.run([sys.executable, "-c", MEASURE.format(body=body)],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"measurement failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    print(__doc__.splitlines()[0])
    print(f"{'samples':>9} {'path':<52} {'peak RSS':>10} {'seconds':>8}")
    peaks, input_mib = {}, {}
    measured = []
    with tempfile.TemporaryDirectory() as scratch:
        for factor in FACTORS:
            folder = Path(scratch) / f"x{factor}"
            folder.mkdir()
            n = write_scaled(folder, factor)
            input_mib[factor] = (folder / "inputs.npy").stat().st_size / 2**20
            score = ["score", "--model", str(MODEL), "--data", str(folder / "inputs.npy"),
                     "--labels", str(folder / "labels.npy"), "--cluster-ids",
                     str(folder / "clusters.npy"), "--layer", "fc2", "--method", "gradient",
                     "--quiet", "--out", str(folder / "scores.csv")]
            runs = {
                "CLI score, .npy streamed": COMMAND_LINE.format(arguments=score),
                "CLI score, .npy streamed, + per-sample .npy": COMMAND_LINE.format(
                    arguments=score + ["--per-sample", str(folder / "samples.npy")]),
                "library, np.load(mmap_mode='r')": LIBRARY.format(
                    model=str(MODEL), folder=str(folder), in_memory=False),
                "library, inputs in memory": LIBRARY.format(
                    model=str(MODEL), folder=str(folder), in_memory=True),
            }
            for name, body in runs.items():
                result = measure(body)
                peaks[(name, factor)] = result["peak_mib"]
                print(f"{n:>9} {name:<52} {result['peak_mib']:>7.1f} MiB "
                      f"{result['seconds']:>8.2f}")
                measured.append((f"{n:,}", name, f"{result['peak_mib']:.1f} MiB",
                                 f"{result['seconds']:.2f} s"))
    record("peak resident memory of one scoring run (demo model, layer fc2, gradient)",
           ("samples", "path", "peak RSS", "seconds"), measured)
    print(f"\ngrowth of the peak from 1x to 100x (the 100x inputs are {input_mib[100]:.1f} MiB):")
    growth = {name: peaks[(name, 100)] - peaks[(name, 1)] for name in runs}
    for name, mib in growth.items():
        print(f"  {name:<52} {mib:+7.1f} MiB  ({peaks[(name, 100)] / peaks[(name, 1)]:.3f}x)")
    record(f"growth of the peak from 1x to 100x (the 100x inputs are {input_mib[100]:.1f} MiB)",
           ("path", "growth", "100x / 1x"),
           [(name, f"{mib:+.1f} MiB", f"{peaks[(name, 100)] / peaks[(name, 1)]:.3f}x")
            for name, mib in growth.items()])
    flat = all(growth[name] < FLAT * input_mib[100] for name in list(runs)[:2])
    print(f"streaming path flat (growth < {FLAT:.0%} of the inputs): {'yes' if flat else 'NO'}")
    note(f"Streaming path flat (growth < {FLAT:.0%} of the inputs): {'yes' if flat else 'NO'}.")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(run(main, "bench_streaming"))
