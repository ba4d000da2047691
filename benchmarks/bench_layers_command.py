"""`python -m attribution layers` against its floor: a fresh Python that imports torch and
loads the same .pt2 (`torch.export.load`), the least any command listing a .pt2's layers
does. All run as new processes, interleaved, 5 times each; the medians and their ratios to
the floor are reported (goal: at most 1.3x; a miss is a figure to read, not a failed run).
The command loads an uploaded file in the jail (a child that imports torch too);
`--trust-code` loads it in the process, as the floor does.

    python -m benchmarks.bench_layers_command [--results FILE]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

from attribution.inputs.demo import DEMO_FILES
from benchmarks.common import record, run

REPEATS = 5
GOAL = 1.3


def seconds_of(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    (program,) = [f.path for f in DEMO_FILES if f.path.name == "digits_cnn.pt2"]
    commands = {
        "floor: import torch + torch.export.load": [
            sys.executable, "-c", f"import torch; torch.export.load({str(program)!r})"],
        "attribution layers (jail)": [
            sys.executable, "-m", "attribution", "layers", "--model", str(program)],
        "attribution layers --trust-code": [
            sys.executable, "-m", "attribution", "layers", "--model", str(program),
            "--trust-code"],
    }
    for command in commands.values():  # warm the file cache and the bytecode
        seconds_of(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(REPEATS):
        for name, command in commands.items():
            times[name].append(seconds_of(command))
    floor = statistics.median(times["floor: import torch + torch.export.load"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append([name, f"{median:.2f} s", f"{median / floor:.2f}x"])
        print(f"{name:45s} {median:6.2f} s  {median / floor:5.2f}x")
    record(f"`attribution layers` on the demo CNN's .pt2 (median of {REPEATS}, new processes; "
           f"goal {GOAL}x the floor)", ["command", "median", "vs floor"], rows)


if __name__ == "__main__":
    sys.exit(run(main, "bench_layers_command"))
