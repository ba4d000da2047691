"""A hostile corpus (built by tests/support/hostile.py): every file must be refused with
AttributionError in under 10 s and under 1 GiB of extra memory (also in the jail's child),
leaving no files.

The corpus is loaded in one fresh Python process (`RUNNER`), which resets its peak RSS
(/proc/self/clear_refs) before each file, so each file's time and extra memory are its own;
models go through `load_model(bytes)`, i.e. through the jail, whose server is started
by a legitimate upload first, as the app starts it when the upload page opens.
"""
import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
import zlib

import numpy as np
import pandas as pd
import pytest

import attribution as at
from attribution.inputs import model_formats
from attribution.inputs.untrusted import jail
from attribution.inputs.demo import DEMO_DIR
from attribution.inputs.untrusted.limits import DEFAULT_LIMITS, Limits
from tests.support import ROOT
from tests.support.hostile import (TINY, TINY_ARCHITECTURE, BatchSquareBomb, CondBomb,
                                   NonzeroSquare, long_class_name, long_cluster_names_csv,
                                   many_clusters, quoted_overlap_zip,
                                   MatmulBomb,
                                   MemoryBomb, conv_bomb,
                                   csv_hiding_columns,
                                   conv_memory_bomb, deep_architecture, exotic_tensor,
                                   expanded_state_dict, exported, huge_parameter_count,
                                   long_cluster_ids, lying_zip_header, many_tensors,
                                   many_zip_entries, npz, npz_bomb, npz_bomb_in_parts,
                                   parquet_nested, parquet_number_bomb, parquet_row_groups,
                                   parquet_text_bomb, pickle_cycle, pickle_laughs, saved,
                                   catastrophic_regex_tokenizer, expanding_normalizer, texts,
                                   state_dict_with, storage_declared_larger, stride_zero_tensor,
                                   wide_csv, yaml_laughs, zip_with_names)

pytestmark = pytest.mark.serial  # each refusal is held to a time and memory budget

GiB = 2 ** 30
SECONDS = 10.0


# ------------------------------------------------------------------ the corpus

TENSOR_WORDS = {"shadowed": "carries attributes"}  # what a refusal of each kind says

DATA_CASES = {  # name: (builder, regex of the message)
    "npz bomb (2.4 GB in 2.4 MB)": (npz_bomb, "unpacks to"),
    "npz bomb in three 0.8 GB entries": (npz_bomb_in_parts, "unpacks to"),
    "zip entry lying about its size": (lying_zip_header, "more than the"),
    "zip of 150,000 entries": (many_zip_entries, "entries"),
    "zip claiming 1 entry, holding 150,000": (lambda: many_zip_entries(claimed=1),
                                              "more than 100,000 entries"),
    "zip entry name marked UTF-8 that is not": (
        lambda: zip_with_names(b"inputs\xff.npy", flags=0x800), "marked UTF-8"),
    "zip naming one entry twice (a/../b, b)": (
        lambda: zip_with_names("x/../inputs.npy", "inputs.npy"), "denote the same path"),
    "zip naming one entry twice (\\ and /)": (
        lambda: zip_with_names("d\\inputs.npy", "d/inputs.npy"), "denote the same path"),
    "parquet of 2.1 GB of numbers": (parquet_number_bomb, "decodes to"),
    "parquet of 4 GB of text": (parquet_text_bomb, "text decodes to"),
    "parquet of 12,000 row groups": (parquet_row_groups, "12,000 row groups"),
    "parquet with a list column": (parquet_nested, "holds list"),
    "one 100 kB cluster id among 200,000": (long_cluster_ids, "cell of 100,000 characters"),
    "pickle laughs (1e9 shared values)": (pickle_laughs, "expands"),
    "pickled list containing itself": (pickle_cycle, "contains itself"),
    "stride-0 tensor of 1e12 values": (stride_zero_tensor, "decodes to"),
    "bare stride-0 tensor of 1e12 values": (lambda: stride_zero_tensor(bare=True),
                                            "decodes to"),
    "60,000 tensors in a .pt": (many_tensors, "pickle is"),
    "a .pt of 1e6 floats in lists": (lambda: saved({"inputs": [[0.5] * 10
                                                            for _ in range(100_000)]}),
                                     "pickle is"),
    "CSV of 1e6 columns": (wide_csv, "1,000,000 columns"),
    "CSV hiding 200,001 columns behind a quoted newline": (csv_hiding_columns,
                                                           "200,001 columns"),
    ".pt declaring an 8 GB storage over 49 kB": (storage_declared_larger, "record size"),
    **{f"{kind} tensor in a .pt": ((lambda kind=kind: saved({"inputs": exotic_tensor(kind)})),
                                   "sparse" if kind == "sparse" else kind)
       for kind in ("sparse", "quantized", "meta", "complex")},
    "tensor whose methods pickled attributes shadow, in a .pt": (
        lambda: saved({"inputs": exotic_tensor("shadowed")}), "carries attributes"),
    "bare tensor whose methods pickled attributes shadow": (
        lambda: saved(exotic_tensor("shadowed")), "carries attributes"),
    **{f"{dtype} array in a .npz": ((lambda dtype=dtype: npz(inputs=np.zeros((2, 2), dtype))),
                                    words)
       for dtype, words in (("complex64", "complex"), ("datetime64[s]", "dates"),
                            ("timedelta64[s]", "durations"), ("V8", "structured"))},
    "object array in a .npz": (lambda: npz(inputs=np.array([[{}], [None]], dtype=object)),
                               "Python objects"),
    "one class name of 40 MB in a 78 kB .npz": (long_class_name,
                                                "class names take 40,000,015 bytes"),
    "200,000 rows in 10,000 clusters": (many_clusters, "10,000 distinct cluster ids"),
    "200,000 cluster ids of 1,000 characters in a CSV": (long_cluster_names_csv,
                                                         "cluster ids take [\\d,]+ MB as text"),
}
MODEL_CASES = {  # name: (builder of (model, architecture), regex of the message)
    "architecture JSON of 21,000 layers": (lambda: (saved(TINY.state_dict()),
                                                     deep_architecture("json")), "layers"),
    "architecture YAML of 21,000 layers": (lambda: (saved(TINY.state_dict()),
                                                     deep_architecture("yaml")), "layers"),
    "YAML billion laughs": (lambda: (saved(TINY.state_dict()), yaml_laughs()), "aliases"),
    "architecture of 1.3e12 parameters": (lambda: (saved(TINY.state_dict()),
                                                    huge_parameter_count()), "parameters"),
    **{f"{kind} tensor in a state dict": ((lambda kind=kind: (state_dict_with(kind),
                                                              json.dumps(TINY_ARCHITECTURE)
                                                              .encode())),
                                          TENSOR_WORDS.get(kind, kind))
       for kind in ("sparse", "quantized", "meta", "complex", "shadowed")},
    "state dict of 60,000 tensors": (lambda: (many_tensors(),
                                              json.dumps(TINY_ARCHITECTURE).encode()),
                                     "pickle is"),
    "stride-0 weight of 1e10 values": (lambda: (expanded_state_dict(),
                                                json.dumps(TINY_ARCHITECTURE).encode()),
                                       "weights take"),
    "conv-net compute bomb (state dict + architecture)": (conv_bomb, "budget of a first run"),
    "conv-net memory bomb (1 GB activations per sample)": (conv_memory_bomb,
                                                           "memory budget of a first run"),
    ".pt2 compute bomb (20 matmuls of 6000 x 6000)": (lambda: (exported(MatmulBomb()), None),
                                                      "budget of a first run"),
    ".pt2 whose cost grows as the square of the batch": (
        lambda: (exported(BatchSquareBomb()), None),
        "TFLOP for a batch of 256|batch of 256 samples needed more than"),
    "an HF folder's zip whose config.json lies inside another entry": (
        lambda: (quoted_overlap_zip({"config.json": b'{"model_type": "bert"}'}), None),
        "share bytes"),
    ".pt2 sizing a [k, k] matrix by nonzero(x > 0.5)": (
        lambda: (exported(NonzeroSquare()), None), "size u0, read from the data"),
    ".pt2 whose cost hides behind a torch.cond on the data": (
        lambda: (exported(CondBomb()), None), "chooses a branch by a tensor's value"),
    ".pt2 memory bomb (40 GB inside forward)": (lambda: (exported(MemoryBomb()), None),
                                                "memory budget of a first run|"
                                                "computes a tensor of 40.00 GB"),
}

TEXT_CASES = {  # name: (builder of (model folder's zip, data), regex of the message)
    "tokenizer regex backtracking exponentially on a 14 kB text": (
        lambda: (catastrophic_regex_tokenizer(), texts("a" * 60 + "b", 230)),
        "time budget of reading an untrusted file|PanicException: Onig"),
    "tokenizer normalizer expanding each 'e' ten million times": (
        lambda: (expanding_normalizer(), texts("the movie here", 1000)),
        "past its memory budget|characters of tokens, over the limit"),
}

RUNNER = r"""
import json, sys, time
import attribution as at
from attribution.inputs.untrusted import jail
from attribution.inputs.demo import DEMO_DIR

def rss(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))

reports = []
check = jail._SERVER.request
jail._SERVER.request = lambda *args: reports.append(check(*args)) or reports[-1]
at.load_model((DEMO_DIR / "digits_mlp.pt2").read_bytes())  # starts the checking server
results = {}
for case in json.load(sys.stdin):
    data = open(case["file"], "rb").read()
    architecture = open(case["architecture"], "rb").read() if case["architecture"] else None
    reports.clear()
    open("/proc/self/clear_refs", "w").write("5")
    before, start = rss("VmRSS"), time.perf_counter()
    try:
        if case["call"] == "data":
            at.load_data(data)
        elif case["call"] == "text":  # the model is accepted; its tokenizer runs on the data
            tokenizer = at.load_model(architecture).tokenizer
            reports.clear()
            open("/proc/self/clear_refs", "w").write("5")
            before, start = rss("VmRSS"), time.perf_counter()
            at.load_data(data, tokenizer=tokenizer)
        else:
            at.load_model(data, architecture=architecture)
        outcome = {"error": None, "message": ""}
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome.update(seconds=time.perf_counter() - start, extra_bytes=rss("VmHWM") - before,
                   child_extra_bytes=max([r.peak_bytes - r.start_bytes for r in reports],
                                         default=0),
                   child_seconds=max([r.seconds for r in reports], default=0.0))
    results[case["name"]] = outcome
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, dict]:
    """Each case's outcome, time and extra memory, from one fresh process."""
    folder = tmp_path_factory.mktemp("hostile")
    manifest = []
    for index, (name, (build, _)) in enumerate(DATA_CASES.items()):
        path = folder / f"data_{index}"
        path.write_bytes(build())
        manifest.append({"name": name, "call": "data", "file": str(path), "architecture": None})
    for index, (name, (build, _)) in enumerate(MODEL_CASES.items()):
        model, architecture = build()
        path = folder / f"model_{index}"
        path.write_bytes(model)
        architecture_path = None
        if architecture is not None:
            architecture_path = folder / f"architecture_{index}"
            architecture_path.write_bytes(architecture)
        manifest.append({"name": name, "call": "model", "file": str(path),
                         "architecture": architecture_path and str(architecture_path)})
    for index, (name, (build, _)) in enumerate(TEXT_CASES.items()):
        model, data = build()
        (folder / f"text_{index}").write_bytes(data)
        (folder / f"folder_{index}").write_bytes(model)
        manifest.append({"name": name, "call": "text", "file": str(folder / f"text_{index}"),
                         "architecture": str(folder / f"folder_{index}")})
    files = set(folder.iterdir())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(manifest), env=env,
                          capture_output=True, text=True, timeout=900, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(folder.iterdir()) == files  # nothing was written (no marker, no spill)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, outcome in results.items():  # the evidence, shown with pytest -s
        print(f"{name}: {outcome['seconds']:.2f} s, +{outcome['extra_bytes'] / 2**20:.0f} MiB"
              f" (child +{outcome['child_extra_bytes'] / 2**20:.0f} MiB,"
              f" {outcome['child_seconds']:.2f} s): {outcome['message'][:100]}")
    return results


@pytest.mark.parametrize("name", list(DATA_CASES) + list(MODEL_CASES) + list(TEXT_CASES))
def test_each_hostile_file_is_refused_quickly_within_memory(refusals, name):
    words = {**DATA_CASES, **MODEL_CASES, **TEXT_CASES}[name][1]
    outcome = refusals[name]
    assert outcome["error"] == "AttributionError", outcome
    assert re.search(words, outcome["message"]), outcome["message"]
    assert outcome["seconds"] < SECONDS
    assert outcome["extra_bytes"] < GiB
    assert outcome["child_extra_bytes"] < GiB


# ------------------------------------------------------------------ in-process checks

def test_a_zip_directory_is_counted_before_zipfile_reads_it(monkeypatch):
    """The bounded directory parse refuses 150,000 entries, also where the end record claims
    one, before Python's zipfile (which reads every entry the directory holds) is called."""
    def not_reached(*args, **kwargs):
        raise AssertionError("zipfile read an archive over the entry budget")

    monkeypatch.setattr(zipfile, "ZipFile", not_reached)
    for data in (many_zip_entries(), many_zip_entries(claimed=1)):  # in this process
        with pytest.raises(at.AttributionError, match="max_archive_entries"):
            at.load_data(data, sandbox=False)
        with pytest.raises(at.AttributionError, match="max_archive_entries"):
            at.load_model(data, sandbox=False)


def test_budget_messages_say_the_limit_and_how_to_raise_it():
    with pytest.raises(at.AttributionError) as error:
        at.load_data(wide_csv())
    assert "100,000" in str(error.value) and "Limits(max_features=...)" in str(error.value)
    assert "--max-features" in str(error.value)


def test_limits_are_configurable_per_call():
    data = npz(inputs=np.zeros((100, 64), np.float32))
    with pytest.raises(at.AttributionError, match="unpacks to"):
        at.load_data(data, limits=Limits(max_decoded_bytes=10_000))
    assert len(at.load_data(data, limits=Limits(max_decoded_bytes=100_000))) == 100
    table = pd.DataFrame(np.zeros((3, 5)), columns=list("abcde")).to_csv(index=False).encode()
    with pytest.raises(at.AttributionError, match="5 columns"):
        at.load_data(table, limits=Limits(max_features=4))
    description = dict(TINY_ARCHITECTURE, hidden=[3] * 5)
    with pytest.raises(at.AttributionError, match="6 layers"):
        at.parse_architecture(dict(description, hidden=[3] * 6), Limits(max_layers=5))
    assert at.parse_architecture(description, Limits(max_layers=5)).hidden == (3,) * 5


def test_a_lying_entry_is_stopped_after_its_declared_size(monkeypatch):
    """The zip check inflates in 1 MB steps and stops at the first step past the declared
    size: the 1 GB stream costs a few MB of output, not 1 GB."""
    produced = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self, *args):
            self.inner = real(*args)

        def decompress(self, data, limit):
            out = self.inner.decompress(data, limit)
            produced.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(at.inputs.untrusted.files.zlib, "decompressobj", Counting)
    with pytest.raises(at.AttributionError, match="more than the"):
        at.load_data(lying_zip_header(), sandbox=False)  # in this process, to count
    assert 0 < sum(produced) <= 2 * 2 ** 20


def test_big_endian_arrays_are_converted():
    inputs = np.arange(12, dtype=">f4").reshape(3, 4)
    labels = np.array([0, 1, 0], dtype=">i8")
    dataset = at.load_data(npz(inputs=inputs, labels=labels))
    assert dataset.inputs.tolist() == inputs.astype("<f4").tolist()
    assert dataset.labels.tolist() == [0, 1, 0]
    buffer = io.BytesIO()
    np.save(buffer, inputs)
    assert at.load_data(buffer.getvalue()).inputs.tolist() == inputs.tolist()


def test_memory_exhaustion_becomes_a_message_with_the_size(monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000000,)")

    monkeypatch.setattr(at.inputs.data_files.np, "frombuffer", exhausted)
    with pytest.raises(at.AttributionError, match="ran out of memory.*7.45 GiB"):
        at.load_data(npz(inputs=np.zeros((3, 4), np.float32)), sandbox=False)


def test_shared_references_are_counted_as_reached_but_walked_once():
    shared = [1.0] * 1000
    nodes, size = at.inputs.untrusted.pickles.pickled_size([shared] * 1000, DEFAULT_LIMITS)
    assert nodes == 1 + 1000 * 1001 and size == 1000 * 1000 * 8
    data = saved({"inputs": [[float(i)] * 3 for i in range(4)], "labels": [0, 1, 0, 1]})
    assert at.load_data(data).inputs.shape == (4, 3)


def test_legitimate_files_near_real_sizes_still_load():
    """The demo files and a 100 MB .npz load with the default budgets."""
    assert len(at.load_data(npz(inputs=np.zeros((200_000, 125), np.float32)))) == 200_000
    for name in ("digits.npz", "digits_sample.csv"):
        assert len(at.load_data(DEMO_DIR / name)) > 0


# ------------------------------------------------------------------ the jail

def test_the_jail_stops_a_slow_model_at_its_time_budget():
    model, architecture = conv_bomb()
    limits = Limits(first_run_seconds=1.0)
    report = model_formats.first_run(model, limits,
                                     architecture=at.parse_architecture(architecture))
    assert "more than 1 s of computing" in report.message
    assert 1.0 <= report.seconds < 3.0


def test_the_jail_stops_a_model_at_its_memory_budget():
    model, architecture = conv_memory_bomb()
    report = model_formats.first_run(model, DEFAULT_LIMITS,
                               architecture=at.parse_architecture(architecture))
    assert report.message is not None and "memory budget" in report.message, report


def test_the_jail_passes_a_good_model_and_reports_its_classes():
    report = model_formats.first_run((DEMO_DIR / "digits_mlp.pt2").read_bytes(), DEFAULT_LIMITS)
    assert report.message is None and report.facts == {"n_classes": 10}


def test_the_jail_is_on_for_bytes_and_paths_and_accepted_files_go_straight_through(
        monkeypatch):
    calls = []
    monkeypatch.setattr(model_formats, "first_run",
                        lambda *a, **k: calls.append(k) or jail.Answer(None))
    monkeypatch.setattr(model_formats, "_ACCEPTED", {})
    path = DEMO_DIR / "digits_mlp.pt2"
    at.load_model(path, sandbox=False)
    at.load_model(path.read_bytes(), sandbox=False)
    assert calls == []
    at.load_model(path)  # a path someone sent is as untrusted as an upload
    assert len(calls) == 1
    at.load_model(path.read_bytes())  # the same bytes, accepted before: by digest
    assert len(calls) == 1
    at.load_model(path.read_bytes(), class_names=list("abcdefghij"))  # other options
    assert len(calls) == 2
    folder = DEMO_DIR / "text_classifier"
    at.load_model(folder)  # a folder by path, and its files as a dict
    at.load_model({file.name: file.read_bytes() for file in folder.iterdir()})
    assert len(calls) == 4


def test_the_command_line_raises_a_limit(tmp_path, capsys):
    from attribution import cli

    columns = 70
    table = pd.DataFrame(np.zeros((20, columns - 1)), columns=[f"p{i}" for i in range(64)]
                         + [f"extra{i}" for i in range(columns - 65)])
    data = tmp_path / "d.csv"
    table.assign(label=1).iloc[:, list(range(64)) + [columns - 1]].to_csv(data, index=False)
    command = ["layers", "--model", str(DEMO_DIR / "digits_mlp.pt2")]
    assert cli.main(command + ["--max-layers", "5"]) == 0
    score = ["score", "--model", str(DEMO_DIR / "digits_mlp.pt2"), "--data", str(data),
             "--layer", "fc1", "--out", str(tmp_path / "s.csv"), "--quiet"]
    assert cli.main(score + ["--max-features", "10"]) != 0
    assert "--max-features" in capsys.readouterr().err
    assert cli.main(score + ["--max-features", "100"]) == 0
    assert cli.limits_from(cli.build_parser().parse_args(command + ["--max-decoded-mb", "3"])) \
        == Limits(max_decoded_bytes=3_000_000)


def test_long_cluster_ids_are_refused_before_they_become_a_text_array():
    clusters = np.array(["a", "b", "x" * 5000], dtype=object).astype(str)  # '<U5000'
    with pytest.raises(at.AttributionError, match="at most 1000 characters; one has 5000"):
        at.load_data(npz(inputs=np.zeros((3, 2), np.float32), clusters=clusters))


def test_other_work_goes_on_while_a_bomb_is_checked():
    """The parent only waits on a pipe while the child burns its budget: other threads (the
    app's other sessions) load and score meanwhile."""
    import threading
    import time

    model_formats.first_run((DEMO_DIR / "digits_mlp.pt2").read_bytes(), DEFAULT_LIMITS)
    model, architecture = conv_bomb()
    reports = []
    check = threading.Thread(target=lambda: reports.append(model_formats.first_run(
        model, DEFAULT_LIMITS, architecture=at.parse_architecture(architecture))))
    check.start()
    time.sleep(0.5)
    start = time.perf_counter()
    loaded = at.load_model(DEMO_DIR / "digits_mlp_state_dict.pt",  # as the app's demo:
                           architecture=DEMO_DIR / "digits_mlp_architecture.json",
                           sandbox=False)  # shipped files; the jail checks one file at a time
    data = at.load_data(DEMO_DIR / "digits.npz", sandbox=False)
    at.neuron_scores(loaded.module, "fc1", data.inputs[:64], data.labels[:64], "gradient")
    meanwhile = time.perf_counter() - start
    assert check.is_alive()  # the bomb was still being checked
    check.join()
    assert "time budget" in reports[0].message
    assert meanwhile < 2.5


def test_a_pipe_or_a_device_given_as_a_file_is_refused_without_blocking(tmp_path):
    """A FIFO given as --labels hung the command (reading it waits for a writer forever);
    /dev/zero as data never ends. Every path is opened without blocking and refused unless
    it is a regular file, the command exiting 2 at once with what the path is."""
    fifo = tmp_path / "labels.npy"
    os.mkfifo(fifo)
    np.save(tmp_path / "x.npy", np.zeros((4, 64), np.float32))
    common = [sys.executable, "-m", "attribution", "score", "--model",
              str(DEMO_DIR / "digits_mlp.pt2"), "--layer", "fc2", "--quiet"]
    runs = {
        "labels": [*common, "--data", str(tmp_path / "x.npy"), "--labels", str(fifo),
                   "--out", str(tmp_path / "a.csv")],
        "data": [*common, "--data", str(fifo), "--out", str(tmp_path / "b.csv")],
        "device": [*common, "--data", "/dev/zero", "--out", str(tmp_path / "c.csv")],
    }
    started = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for name, argv in runs.items()}
    for name, process in started.items():
        _, err = process.communicate(timeout=120)
        assert process.returncode == 2, (name, err)
        assert ("pipe (FIFO)" if name != "device" else "a device") in err, (name, err)
    with pytest.raises(at.AttributionError, match=r"pipe \(FIFO\), not a regular file"):
        at.load_model(fifo)


def test_data_with_more_distinct_clusters_than_the_budget_is_refused_quickly(tmp_path):
    """200,000 rows in 10,000 clusters of 20 hung diagnose past 90 s at 1.1 GiB: the number of
    distinct cluster ids has a budget, refused at load with what to do."""
    from attribution.inputs.data import MAX_CLUSTERS

    n = 200_000
    clusters = np.arange(n) % 10_000
    path = tmp_path / "many.npz"
    np.savez(path, inputs=np.zeros((n, 4), np.float32), clusters=clusters)
    with pytest.raises(at.AttributionError, match=rf"10,000 distinct cluster ids, over the "
                                                  rf"limit of {MAX_CLUSTERS:,}"):
        at.load_data(path)
    within = np.arange(n) % MAX_CLUSTERS
    np.savez(path, inputs=np.zeros((n, 4), np.float32), clusters=within)
    assert len(np.unique(at.load_data(path).clusters)) == MAX_CLUSTERS


def test_the_jail_s_answers_are_read_in_linear_time_within_a_byte_budget():
    """One answer line of 20 MB (beyond MAX_ANSWER_BYTES) stops at the budget; a line
    after 2 MB of others is found without searching them again."""
    import threading

    read_end, write_end = os.pipe()

    class Process:
        stdout = os.fdopen(read_end, "rb")

        def wait(self):
            return 0

    def write():
        try:
            with os.fdopen(write_end, "wb") as out:
                out.write(b'{"a": 1}\n' + b'{"b": "' + b"x" * 2_000_000 + b'"}\n')
                out.write(b"y" * 20_000_000)
        except BrokenPipeError:  # the reader stopped at its budget and closed its end
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    server = jail._Server()
    assert server._line(Process(), 30) == {"a": 1}
    assert len(server._line(Process(), 30)["b"]) == 2_000_000
    started = time.monotonic()
    with pytest.raises(ValueError, match="an answer of more than"):
        server._line(Process(), 30)
    assert time.monotonic() - started < 10
    Process.stdout.close()
    writer.join(timeout=30)


def test_zip_entries_that_share_bytes_are_refused_however_the_overlap_is_built():
    """An HF folder's zip whose config.json lies inside another entry's data (Fifield's
    quoted local headers) was accepted: every entry's bytes must be its own."""
    import zipfile as zip_module

    from tests.support.hostile import quoted_overlap_zip

    config = json.dumps({"model_type": "bert", "architectures": ["BertForSequenceClassification"]})
    data = quoted_overlap_zip({"config.json": config.encode()})
    assert {"config.json", "model.safetensors"} <= set(
        zip_module.ZipFile(io.BytesIO(data)).namelist())  # zipfile itself reads both
    with pytest.raises(at.AttributionError, match="share bytes"):
        at.load_model(data)
