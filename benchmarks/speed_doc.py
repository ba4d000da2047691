"""Write docs/speed.md from one run of the benchmarks: `make bench` calls this last.

    python -m benchmarks.speed_doc RESULTS_DIR [OUT]      # OUT: docs/speed.md

RESULTS_DIR holds one JSON file per benchmark, written by `benchmarks.common.run` when the
benchmark ran with `--results FILE`. Runs on machines `make bench` does not run on (a GPU's)
are kept in `benchmarks/kept/` (committed; copy a device's results file there) and shown
beside them, until RESULTS_DIR has a run of the same benchmark with the same arguments. The
page says which commit and machine measured it and when, explains each benchmark from its
script's docstring (what it measures, against what, its floor and target), and lays out
every table and note the benchmark recorded. A benchmark without a results file is listed as
not measured. Nothing here measures or edits figures: change a benchmark, then rerun `make
bench`.
"""
from __future__ import annotations

import ast
import datetime
import json
import sys
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
OUT = ROOT / "docs" / "speed.md"
KEPT = BENCHMARKS / "kept"

PREAMBLE = """\
How fast the engine and the dashboard are, against the obvious way to compute the same
numbers and against the cost no method can go below. The benchmarks in `benchmarks/` ran
once, one after the other, on the commit and machine above; a benchmark that did not run
in that run says so, and its section has no figures.

How to read the tables:

- A time is the median of repeats run round-robin after one warm-up run of each candidate,
  so the noise of a shared machine hits every candidate alike.
- "time / X" divides each row's median by the median of row X, usually the engine's own
  call: 10x means that row took ten times as long as X; 0.5x, half as long.
- The candidates compute the same numbers (the benchmarks that say so check it before
  timing).
- The floor is one plain forward and backward pass of the model: a gradient at a layer
  needs a forward pass and a backward pass down to that layer. The floor's backward runs
  all the way to the inputs, so the scores of a layer far from the inputs can take less.
- Threads matter: each benchmark says how many intra-op threads it used.

The dashboard's timings in a real browser (first page with charts after launching the server
as `make run` does, a redraw after changing the method or the cluster, the first
pruning-curve points, opening a neuron) are measured by the browser tests and printed at the
end of every `make test`; the first heatmap after a launch, `make run` against plain
`streamlit run app.py`, is also benchmarked below.
"""


def docstring(script: Path) -> str:
    """The module docstring of `script`, read without importing it."""
    return ast.get_docstring(ast.parse(script.read_text())) or ""


def explanation(text: str) -> tuple[str, str]:
    """(title, body) of a benchmark's docstring: its first line, and its paragraphs without
    the indented usage lines (`python -m benchmarks...`)."""
    lines = text.splitlines()
    title = lines[0].strip() if lines else ""
    paragraphs, current = [], []
    for line in lines[1:] + [""]:
        if line.strip():
            current.append(line)
            continue
        if current and not all(part.startswith("    ") for part in current):
            paragraphs.append("\n".join(current))
        current = []
    return title, "\n\n".join(paragraphs)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; `|` in a cell is escaped."""
    def line(cells: Iterable[str]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line("---" for _ in header)] + [line(row) for row in rows])


def describe_machine(machine: dict) -> str:
    usable = machine.get("usable_cores")
    cores = f"{machine.get('cores')} cores" + (
        f" ({usable} usable)" if usable not in (None, machine.get("cores")) else "")
    memory = machine.get("memory_gib")
    return ", ".join(part for part in (
        str(machine.get("cpu", "unknown CPU")), cores, machine.get("gpu") or "",
        f"{memory} GiB memory" if memory is not None else "") if part)


def describe_software(machine: dict) -> str:
    return (f"torch {machine.get('torch')}, Python {machine.get('python')}, "
            f"{machine.get('system')}")


def started(stamp: str) -> str:
    """'2030-01-02T03:04:05+00:00' -> '2030-01-02 03:04:05 UTC'."""
    when = datetime.datetime.fromisoformat(stamp).astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def load_results(folder: Path) -> dict[str, list[dict]]:
    """{benchmark name: its runs' results} from the JSON files in `folder`, in file name
    order (a benchmark run twice, e.g. on the CPU and with `--device cuda`, has two)."""
    results: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        results.setdefault(data.get("benchmark", path.stem), []).append(data)
    return results


def with_kept(results: dict[str, list[dict]], kept: dict[str, list[dict]]
              ) -> dict[str, list[dict]]:
    """`results` plus each kept run (`KEPT`) of which it has no run with the same
    arguments, after them."""
    merged = {name: list(runs) for name, runs in results.items()}
    for name, runs in kept.items():
        for data in runs:
            if all(fresh.get("arguments") != data.get("arguments")
                   for fresh in merged.get(name, [])):
                merged.setdefault(name, []).append(data)
    return merged


def render(results: dict[str, list[dict]], scripts: Optional[list[Path]] = None) -> str:
    """docs/speed.md for `results` ({benchmark: its runs}); `scripts`: the benchmarks that
    exist (default: benchmarks/bench_*.py), each a section, measured or not."""
    scripts = sorted(BENCHMARKS.glob("bench_*.py")) if scripts is None else scripts
    measured = [data for script in scripts for data in results.get(script.stem, [])]
    if not measured:
        raise SystemExit("no benchmark results to write: run the benchmarks with --results")
    commits = sorted({data["commit"] for data in measured})
    machines = {json.dumps(data["machine"], sort_keys=True) for data in measured}
    first = measured[0]
    facts = [
        ("commit", ", ".join(f"`{commit}`" for commit in commits)),
        ("started", started(min(data["started"] for data in measured if data.get("started")))),
        ("benchmarks run", f"{sum(script.stem in results for script in scripts)} of "
         f"{len(scripts)}: "
         + ", ".join(data["benchmark"] + (f" ({' '.join(data['arguments'])})"
                                          if data.get("arguments") else "")
                     for data in measured)),
        ("machine", describe_machine(first["machine"])),
        ("software", describe_software(first["machine"])),
    ]
    parts = ["# Speed", "",
             "<!-- Written by `make bench` (benchmarks/speed_doc.py). Do not edit by hand: "
             "change the benchmarks and rerun `make bench`. -->", "",
             table(["run", ""], [list(fact) for fact in facts]), "", PREAMBLE]
    if len(commits) > 1 or len(machines) > 1:
        parts += ["**Not one run:** the benchmarks below ran on different commits or "
                  "machines; each section says which.", ""]
    for script in scripts:
        title, body = explanation(docstring(script))
        parts += [f"## {title.rstrip('.')}", "", f"`benchmarks/{script.name}`. {body}", ""]
        runs = results.get(script.stem)
        if not runs:
            parts += ["*Not measured in this run.*", ""]
            continue
        for data in runs:
            run_line = f"Ran with {data.get('threads')} thread(s)"
            if data.get("arguments"):
                run_line += f", arguments `{' '.join(data['arguments'])}`"
            if len(commits) > 1 or len(machines) > 1:
                run_line += (f", on commit `{data['commit']}`, "
                             f"{describe_machine(data['machine'])}, "
                             f"{describe_software(data['machine'])}")
            if data.get("source"):
                run_line += f" (kept: {data['source']})"
            parts += [run_line + ".", ""]
            for entry in data.get("recorded", []):
                if "note" in entry:
                    parts += [entry["note"], ""]
                else:
                    parts += [f"**{entry['title']}**", "",
                              table(entry["header"], entry["rows"]), ""]
    return "\n".join(parts).rstrip() + "\n"


def write(results_dir: Path, out: Path = OUT, scripts: Optional[list[Path]] = None,
          kept_dir: Path = KEPT) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = load_results(kept_dir) if kept_dir.is_dir() else {}
    out.write_text(render(with_kept(load_results(results_dir), kept), scripts))
    return out


def main(arguments: list[str]) -> int:
    if not 1 <= len(arguments) <= 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = write(Path(arguments[0]), Path(arguments[1]) if len(arguments) == 2 else OUT)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
