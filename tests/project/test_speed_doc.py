"""docs/speed.md is written by `make bench`: each benchmark records its figures with the commit
and the machine (`benchmarks.common.run`), and `benchmarks.speed_doc` lays them out."""
import json
import re
import subprocess
import sys

from benchmarks import common, speed_doc
from tests.support import ROOT


def test_a_benchmark_run_with_results_writes_its_figures_commit_and_machine(tmp_path,
                                                                           monkeypatch):
    results = tmp_path / "results" / "bench_fake.json"
    monkeypatch.setattr(sys, "argv", ["bench_fake.py", "part", "--results", str(results)])
    monkeypatch.setattr(common, "RECORDED", [])
    seen = {}

    def main():
        seen["argv"] = list(sys.argv[1:])
        common.report("two candidates", {"ours": 0.010, "theirs": 0.040}, "ours")
        common.note("The front ran 1 time(s).")
        return 0

    assert common.run(main, "bench_fake") == 0
    assert seen["argv"] == ["part"]  # --results FILE is taken out before main reads argv
    data = json.loads(results.read_text())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()
    assert re.fullmatch(re.escape(head) + r"(-dirty)?", data["commit"])
    assert data["benchmark"] == "bench_fake" and data["arguments"] == ["part"]
    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and machine["torch"] and machine["python"]
    assert data["recorded"] == [
        {"title": "two candidates", "header": ["", "median", "time / ours"],
         "rows": [["ours", "10.0 ms", "1.00x"], ["theirs", "40.0 ms", "4.00x"]]},
        {"note": "The front ran 1 time(s)."}]


def results_of(name: str, commit: str = "abc1234") -> dict:
    return {"benchmark": name, "commit": commit, "started": "2030-01-02T03:04:05+00:00",
            "arguments": [], "threads": 2,
            "machine": {"cpu": "Example CPU 9000", "cores": 2, "usable_cores": 2,
                        "memory_gib": 7.5, "torch": "2.13.0+cpu", "python": "3.11.7",
                        "system": "Linux-x86_64"},
            "recorded": [{"note": "2 threads."},
                         {"title": "full curve", "header": ["", "median", "time / ours"],
                          "rows": [["ours", "13.0 ms", "1.00x"],
                                   ["a | b", "520.0 ms", "40.00x"]]}]}


def fake_scripts(folder):
    one = folder / "bench_one.py"
    one.write_text('"""Pruning curves against hooks.\n\nWhat it measures, and its floor.\n\n'
                   '    python -m benchmarks.bench_one [--results FILE]\n"""\n')
    two = folder / "bench_two.py"
    two.write_text('"""Peak memory of streaming.\n\n    python -m benchmarks.bench_two\n\n'
                   'Flat means: less than half.\n"""\n')
    return [one, two]


def test_the_page_carries_commit_machine_explanations_and_tables(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_one.json").write_text(json.dumps(results_of("bench_one")))
    out = speed_doc.write(results, tmp_path / "docs" / "speed.md", fake_scripts(tmp_path))
    page = out.read_text()
    assert "| commit | `abc1234` |" in page
    assert "Example CPU 9000, 2 cores, 7.5 GiB memory" in page
    assert "torch 2.13.0+cpu, Python 3.11.7" in page and "2030-01-02 03:04:05 UTC" in page
    assert "make bench" in page and "Do not edit by hand" in page
    assert "## Pruning curves against hooks\n" in page
    assert "| benchmarks run | 1 of 2: bench_one |" in page
    assert "What it measures, and its floor." in page and "python -m" not in page
    assert "| a \\| b | 520.0 ms | 40.00x |" in page and "2 threads." in page
    two = page[page.index("## Peak memory of streaming\n"):]
    assert "Flat means: less than half." in two and "*Not measured in this run.*" in two
    assert "Not one run" not in page


def test_results_from_two_commits_say_so(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_one.json").write_text(json.dumps(results_of("bench_one")))
    (results / "bench_two.json").write_text(json.dumps(results_of("bench_two", "def5678")))
    page = speed_doc.render(speed_doc.load_results(results), fake_scripts(tmp_path))
    assert "| commit | `abc1234`, `def5678` |" in page and "**Not one run:**" in page
    assert "on commit `def5678`" in page


def test_every_benchmark_explains_itself_and_records_through_run():
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        source = script.read_text()
        title, body = speed_doc.explanation(speed_doc.docstring(script))
        assert title and body, script.name
        assert f'run(main, "{script.stem}")' in source, script.name
        assert not re.search(r"\bissue\b", title + body, re.IGNORECASE), script.name


def test_a_benchmark_run_twice_shows_both_runs_with_their_arguments_and_machines(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_one.json").write_text(json.dumps(results_of("bench_one")))
    on_gpu = results_of("bench_one")
    on_gpu["arguments"] = ["--device", "cuda"]
    on_gpu["machine"] = {**on_gpu["machine"], "cpu": "Example GPU host", "torch": "2.11.0+cu130"}
    (results / "bench_one_gpu.json").write_text(json.dumps(on_gpu))
    page = speed_doc.render(speed_doc.load_results(results), fake_scripts(tmp_path))
    assert "| benchmarks run | 1 of 2: bench_one, bench_one (--device cuda) |" in page
    section = page[page.index("## Pruning curves against hooks\n"):
                   page.index("## Peak memory of streaming\n")]
    assert section.count("| a \\| b | 520.0 ms | 40.00x |") == 2
    assert "arguments `--device cuda`, on commit `abc1234`, Example GPU host" in section
    assert "torch 2.11.0+cu130" in section and "**Not one run:**" in page


def test_a_kept_run_from_another_machine_shows_until_a_fresh_run_replaces_it(tmp_path):
    """benchmarks/kept/ holds runs `make bench` cannot make here (a GPU's): they show beside
    the fresh results, with where they came from, until the results have a run of the same
    benchmark with the same arguments."""
    results, kept = tmp_path / "results", tmp_path / "kept"
    results.mkdir()
    kept.mkdir()
    (results / "bench_one.json").write_text(json.dumps(results_of("bench_one")))
    on_gpu = results_of("bench_one", "0ld0ld0")
    on_gpu.update(arguments=["--device", "cuda"], started=None, source="an H200 lent once")
    on_gpu["recorded"] = [{"note": "On the GPU."}]
    (kept / "bench_one-cuda.json").write_text(json.dumps(on_gpu))
    page = speed_doc.write(results, tmp_path / "speed.md", fake_scripts(tmp_path),
                           kept).read_text()
    assert "on commit `0ld0ld0`" in page and "(kept: an H200 lent once)" in page
    assert "On the GPU." in page and "2030-01-02 03:04:05 UTC" in page
    fresh = results_of("bench_one", "new1234")
    fresh.update(arguments=["--device", "cuda"], recorded=[{"note": "Measured again."}])
    (results / "bench_one-cuda.json").write_text(json.dumps(fresh))
    page = speed_doc.write(results, tmp_path / "speed.md", fake_scripts(tmp_path),
                           kept).read_text()
    assert "Measured again." in page and "On the GPU." not in page and "kept:" not in page
