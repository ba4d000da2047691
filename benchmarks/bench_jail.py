"""The jail's cost: every untrusted file is read (and a model first run) in its child.

    python -m benchmarks.bench_jail [--big-gb 1.5] [--results FILE]

Side by side in one run, medians of 5 interleaved: the demo's model and data, and a 100 MB
.npz, read in the jail against in this process (`sandbox=False`), each from its bytes as an
upload; the model with its digest forgotten each time (a first upload), and accepted before
(a second). Then the peak memory of reading a big float32 .npz by path, in a fresh process:
this process's and the jail child's, against the array's size (goal: at most ~1.5x), each
with its baseline (torch and the package imported, about 0.3 GiB) included.
"""
import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import attribution as at
from attribution.inputs import model_formats
from attribution.inputs.shipped import DEMO_DIR
from attribution.inputs.untrusted import jail
from benchmarks.common import ROOT, interleaved_medians, note, record, report, run

PEAK = r"""
import json, sys
import attribution as at
from attribution.inputs.untrusted import jail
answers = []
request = jail._SERVER.request
jail._SERVER.request = lambda *args: answers.append(request(*args)) or answers[-1]
data = at.load_data(sys.argv[1], max_bytes=2 * 10 ** 9)
with open("/proc/self/status") as status:  # ru_maxrss would keep the launcher's peak
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))
print(json.dumps({"parent": peak, "child": answers[0].peak_bytes,
                  "array": data.inputs.numel() * 4}))
"""


def npz_bytes(megabytes: float, features: int = 256) -> bytes:
    """A .npz of `megabytes` MB of float32 inputs [N, features] and labels."""
    rows = int(megabytes * 1e6 / (features * 4))
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.random.default_rng(0).random((rows, features), np.float32),
             labels=np.arange(rows) % 10)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big-gb", type=float, default=1.5)
    big_gb = parser.parse_args().big_gb
    print(f"isolation: {jail.isolation()}")
    model = (DEMO_DIR / "digits_mlp.pt2").read_bytes()
    data = (DEMO_DIR / "digits.npz").read_bytes()
    hundred = npz_bytes(100)

    def first_upload():
        model_formats._ACCEPTED.clear()
        at.load_model(model)

    medians = interleaved_medians({
        "demo model + data, in this process": lambda: (at.load_model(model, sandbox=False),
                                                       at.load_data(data, sandbox=False)),
        "demo model + data, jailed (first upload)": lambda: (first_upload(),
                                                             at.load_data(data)),
        "demo model + data, jailed (accepted before)": lambda: (at.load_model(model),
                                                                at.load_data(data)),
        "100 MB .npz, in this process": lambda: at.load_data(hundred, sandbox=False),
        "100 MB .npz, jailed": lambda: at.load_data(hundred),
    })
    report("reading uploads in the jail against in this process", medians,
           "demo model + data, in this process")
    for what in ("demo model + data", "100 MB .npz"):
        plain = medians[f"{what}, in this process"]
        jailed = medians[f"{what}, jailed" + (" (first upload)" if "demo" in what else "")]
        note(f"Jail overhead, {what}: {(jailed - plain) * 1000:.0f} ms per upload "
             f"({jailed / plain:.1f}x of {plain * 1000:.0f} ms in this process).")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.npz"
        path.write_bytes(npz_bytes(big_gb * 1000, features=4096))
        done = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True,
                              text=True, cwd=ROOT, check=True)
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    array = peaks["array"]
    rows = [(who, f"{peaks[who] / 2**30:.2f} GiB", f"{peaks[who] / array:.2f}x")
            for who in ("parent", "child")]
    print(f"\npeak memory reading a {array / 2**30:.2f} GiB float32 .npz by path")
    for row in rows:
        print(f"  {row[0]:<8} {row[1]:>10} {row[2]:>8} of the array")
    record(f"peak memory reading a {array / 2**30:.2f} GiB float32 .npz by path (the "
           "server's process and the jail's child)", ("process", "peak RSS", "of the array"),
           rows)


if __name__ == "__main__":
    sys.exit(run(main, "bench_jail"))
