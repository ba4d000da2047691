"""`python -m attribution`: every command through a subprocess, its outputs parsed and checked
against the library, its exit codes, and one clear message for each kind of bad input."""
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import attribution as at
import attribution.__main__ as entry
from attribution import cli, commands, model_command
from attribution.analyses import costs, distributed
from attribution.analyses import pruning_curves
from attribution.analyses import settings
from attribution.inputs.data import check_data
from attribution.inputs.data_files import load_data
from attribution.inputs.model_formats import GuessedExampleFailed, load_model

from tests.support.models import token_files
from tests.support import ROOT, fresh_python

MODEL = ROOT / "demo" / "digits_mlp.pt2"
DATA = ROOT / "demo" / "digits.npz"
LAYER = "fc2"


def command(*args):
    return [sys.executable, "-m", "attribution", *map(str, args)]


@pytest.fixture(scope="module")
def demo():
    """(module, dataset) of the digits demo, loaded as the command line loads it."""
    model = load_model(MODEL)
    return model.module, check_data(load_data(DATA), model)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One subprocess per command, all started at once: name -> (exit code, stdout, stderr,
    the folder it wrote to)."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "broken.pt2").write_bytes(b"PK\x03\x04 this is not really a zip")
    common = ("--model", MODEL, "--data", DATA, "--layer", LAYER)
    # The demo's own cluster column (even/odd digits) was the command line's default; the
    # default is now the label, as in the dashboard, so these runs ask for it by name.
    provided = ("--clusters", "provided")
    commands = {
        "layers": command("layers", "--model", MODEL, "--format", "json"),
        "score": command("score", *common, *provided, "--method", "gradient", "ablation",
                         "--reduce", "mean_abs", "--out", folder / "scores.csv",
                         "--per-sample", folder / "s.npy"),
        "curve": command("curve", *common, *provided, "--cluster", "even", "--reduce", "mean_abs",
                         "--n-random", "8", "--ks", "0,2,4,8,16",
                         "--out", folder / "curve.csv", "--summary", folder / "summary.json"),
        # the verdicts below were measured for the gradient, the former default method
        "diagnose": command("diagnose", *common, *provided, "--method", "gradient",
                            "--n-random", "8", "--out", folder / "findings.json"),
        "report": command("report", *common, *provided, "--method", "gradient",
                          "gradient_x_activation",
                          "--cluster", "odd", "--n-random", "5",
                          "--out", folder / "report.html", "--csv-dir", folder / "tables"),
        "prune": command("prune", *common, *provided, "--cluster", "odd", "--reduce",
                         "mean_abs", "--k", "6", "--ablation", "mean", "--out",
                         folder / "pruned" / "fc2-6.pt2", "--summary", folder / "pruned.json"),
        "bad-file": command("score", "--model", folder / "broken.pt2", "--data", DATA,
                            "--layer", LAYER, "--out", folder / "x.csv"),
    }
    started = {name: subprocess.Popen(arguments, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
               for name, arguments in commands.items()}
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=600)
        results[name] = (process.returncode, out, err, folder)
    return results


def in_process(*args, capsys):
    """(exit code, stdout, stderr) of `cli.main` in this process (fast, same code path)."""
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_layers_lists_every_scorable_layer(runs, capsys):
    code, out, err, _ = runs["layers"]
    assert code == 0 and err == ""
    layers = json.loads(out)
    assert [row["name"] for row in layers] == ["fc1", "relu1", "fc2", "relu2", "out"]
    assert layers[2] == {"name": "fc2", "type": "Linear", "neurons": 16, "shape": "16",
                         "units": "16 neurons", "neuron_axis": 1, "axis_rule": "only axis"}
    code, out, _ = in_process("layers", "--model", MODEL, capsys=capsys)
    assert code == 0 and out.split()[:4] == ["name", "type", "neurons", "shape"]


def test_score_writes_the_tidy_table_and_per_sample_scores(runs, demo):
    code, out, err, folder = runs["score"]
    assert code == 0 and out == "" and err == ""  # no progress bar when stderr is a pipe
    module, dataset = demo
    table = pd.read_csv(folder / "scores.csv")
    assert list(table.columns) == ["cluster", "neuron", "method", "score", "n"]
    assert len(table) == 2 * 2 * 16  # methods x clusters ("even", "odd") x neurons
    for method in ("gradient", "ablation"):
        expected = at.cluster_scores(module, LAYER, dataset.inputs, dataset.labels,
                                     dataset.clusters, method, reduce="mean_abs")
        rows = table[table["method"] == method].pivot(index="cluster", columns="neuron",
                                                      values="score")
        np.testing.assert_allclose(rows.to_numpy(), expected.drop(columns="n").to_numpy(),
                                   rtol=1e-6)
        assert table[table["method"] == method].groupby("cluster")["n"].first().to_dict() \
            == expected["n"].to_dict()
        per_sample = np.load(folder / f"s.{method}.npy")
        np.testing.assert_allclose(per_sample, at.neuron_scores(
            module, LAYER, dataset.inputs, dataset.labels, method).numpy(), rtol=1e-6)


def test_score_streams_npy_files_to_the_same_table(tmp_path, demo, capsys):
    _, dataset = demo
    np.save(tmp_path / "inputs.npy", dataset.inputs.numpy())
    np.save(tmp_path / "labels.npy", dataset.labels.numpy())
    np.save(tmp_path / "clusters.npy", dataset.clusters)
    common = ("--model", MODEL, "--layer", LAYER, "--method", "random", "--reduce", "std")
    code, _, err = in_process("score", *common, "--data", DATA,
                              "--out", tmp_path / "memory.parquet", capsys=capsys)
    assert code == 0, err
    code, _, err = in_process("score", *common, "--data", tmp_path / "inputs.npy",
                              "--labels", tmp_path / "labels.npy",
                              "--cluster-ids", tmp_path / "clusters.npy", "--batch-size", "50",
                              "--out", tmp_path / "streamed.parquet", capsys=capsys)
    assert code == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "streamed.parquet"),
                                  pd.read_parquet(tmp_path / "memory.parquet"),
                                  rtol=1e-6, atol=1e-9)


def test_streamed_npy_files_are_parsed_only_in_the_jail(tmp_path, demo, capsys, monkeypatch):
    """--data, --labels, --cluster-ids and --user-scores as .npy: with every .npy header
    reader patched to fail on them in this process, the command line still gives what
    --trust-code gives (it parses them here, and so now fails): the jail read them."""
    _, dataset = demo
    files = {"inputs": dataset.inputs.numpy(), "labels": dataset.labels.numpy(),
             "clusters": dataset.clusters.astype("S"),
             "scores": np.random.default_rng(0).random(16)}
    for name, values in files.items():
        np.save(tmp_path / f"{name}.npy", values)
    streamed = ("--model", MODEL, "--layer", LAYER, "--data", tmp_path / "inputs.npy",
                "--labels", tmp_path / "labels.npy", "--cluster-ids", tmp_path / "clusters.npy")
    score = ("score", *streamed, "--method", "gradient", "--clusters", "provided")
    diagnose = ("diagnose", *streamed, "--method", "gradient", "--n-random", "2",
                "--user-scores", tmp_path / "scores.npy")
    runs, codes = {"trusted.csv": score, "trusted.json": diagnose}, {}
    for out, run in runs.items():  # diagnose exits 1 when it finds the scores degenerate
        codes[out], _, err = in_process(*run, "--trust-code", "--out", tmp_path / out,
                                        capsys=capsys)
        assert codes[out] in (0, 1) and (tmp_path / out).exists(), err

    def refuse_ours(reader):
        def read(stream, *args, **kwargs):
            if str(tmp_path) in str(getattr(stream, "name", stream)):
                raise AssertionError(f"{reader.__name__} parsed a user's file here")
            return reader(stream, *args, **kwargs)
        return read

    for name in ("read_magic", "read_array_header_1_0", "read_array_header_2_0"):
        monkeypatch.setattr(np.lib.format, name, refuse_ours(getattr(np.lib.format, name)))
    monkeypatch.setattr(np, "load", refuse_ours(np.load))
    for out, run in runs.items():
        jailed = tmp_path / out.replace("trusted", "jailed")
        code, _, err = in_process(*run, "--out", jailed, capsys=capsys)
        assert code == codes[out], err
        assert jailed.read_text() == (tmp_path / out).read_text()
        code, _, err = in_process(*run, "--trust-code", "--out", jailed, "--force",
                                  capsys=capsys)
        assert code == 3 and "parsed a user's file here" in err


def test_a_pickled_model_of_token_ids_takes_its_example_from_the_data(tmp_path, capsys):
    """A pickled module does not say what it takes, and the loader's guess from its first
    Linear (float zeros [2, 8]) cannot feed an Embedding: the error names example_input=;
    the command line takes the first rows of --data (.npz or streamed .npy) and scores as
    the same model exported does; `layers`, without data, says what to pass."""
    model, ids, labels = token_files(tmp_path)
    torch.save(model, tmp_path / "tokens.pt")
    with pytest.raises(GuessedExampleFailed, match=r"loader's guess .*example_input=x\[:2\]"):
        load_model(tmp_path / "tokens.pt", trust_code=True)
    loaded = load_model(tmp_path / "tokens.pt", trust_code=True, example_input=ids[:2])
    assert loaded.input_dtype == torch.int64 and loaded.input_shape == (5,)
    np.save(tmp_path / "ids.npy", ids.numpy())
    np.save(tmp_path / "labels.npy", labels.numpy())
    common = ("score", "--layer", "fc1", "--method", "gradient", "--clusters", "label",
              "--trust-code")
    tables = {}
    for model_file, data in (("tokens.pt2", ("tokens.npz",)), ("tokens.pt", ("tokens.npz",)),
                             ("tokens.pt", ("ids.npy", "--labels", "labels.npy"))):
        out = tmp_path / f"{model_file}.{data[0]}.csv"
        code, _, err = in_process(*common, "--model", tmp_path / model_file, "--data",
                                  tmp_path / data[0], *[tmp_path / d if d.endswith(".npy")
                                                        else d for d in data[1:]],
                                  "--out", out, capsys=capsys)
        assert code == 0, err
        tables[model_file, data[0]] = pd.read_csv(out)
    expected = tables["tokens.pt2", "tokens.npz"]
    for table in tables.values():
        pd.testing.assert_frame_equal(table, expected, rtol=1e-5)
    code, _, err = in_process("layers", "--model", tmp_path / "tokens.pt", "--trust-code",
                              capsys=capsys)
    assert code == 2 and "example_input=" in err and "first rows of --data" in err


def test_a_model_of_token_ids_from_file_and_streamed(tmp_path, capsys):
    _, ids, labels = token_files(tmp_path)
    np.save(tmp_path / "ids.npy", ids.numpy())
    np.save(tmp_path / "labels.npy", labels.numpy())
    model = ("--model", tmp_path / "tokens.pt2")
    code, out, err = in_process("layers", *model, capsys=capsys)
    assert code == 0 and "fc1" in out, err
    common = (*model, "--layer", "fc1", "--method", "gradient", "ablation", "--clusters", "label")
    code, _, err = in_process("score", *common, "--data", tmp_path / "tokens.npz",
                              "--out", tmp_path / "memory.csv", capsys=capsys)
    assert code == 0, err
    code, _, err = in_process("score", *common, "--data", tmp_path / "ids.npy", "--labels",
                              tmp_path / "labels.npy", "--batch-size", "7",
                              "--out", tmp_path / "streamed.csv", capsys=capsys)
    assert code == 0, err
    memory = pd.read_csv(tmp_path / "memory.csv")
    assert len(memory) == 3 * 6 * 2
    np.savez(tmp_path / "unknown.npz", inputs=(ids + 20).numpy(), labels=labels.numpy())
    np.save(tmp_path / "float_ids.npy", ids.numpy().astype(np.float32))
    for data, message in (("unknown.npz", "index out of range in self. Integer inputs are ids"),
                          ("float_ids.npy", "holds float32 values; save them as integers")):
        extra = ("--labels", tmp_path / "labels.npy") if data.endswith(".npy") else ()
        code, _, err = in_process("score", *common, "--data", tmp_path / data, *extra,
                                  "--out", tmp_path / "x.csv", capsys=capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "streamed.csv"), memory,
                                  rtol=1e-5, atol=1e-7)


def test_score_all_classes_adds_a_class_column(capsys):
    code, out, err = in_process("score", "--model", MODEL, "--data", DATA, "--layer", LAYER,
                                "--targets", "all", "--clusters", "none", "--out", "-",
                                capsys=capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert list(table.columns) == ["cluster", "class", "neuron", "method", "score", "n"]
    assert len(table) == 10 * 16 and set(table["cluster"]) == {"all"}
    assert (table["n"] == 719).all()


def test_curve_writes_curves_and_summary(runs, demo):
    code, _, err, folder = runs["curve"]
    assert code == 0, err
    module, dataset = demo
    curves = pd.read_csv(folder / "curve.csv")
    ranking = at.cluster_scores(module, LAYER, dataset.inputs, dataset.labels,
                                dataset.clusters, reduce="mean_abs").loc[["even"]]
    expected = pruning_curves.cluster_pruning_curves(module, LAYER, dataset.inputs, dataset.labels,
                                              dataset.clusters, "even", ranking, n_random=8,
                                              ks=[0, 2, 4, 8, 16])
    pd.testing.assert_frame_equal(curves, expected, check_dtype=False, rtol=1e-9)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["settings"]["cluster"] == "even" and summary["n_neurons"] == 16
    assert summary["n_samples"] == {"cluster": 356, "rest": 363}
    expected_summary = pruning_curves.curve_summary(expected)
    for subset in ("cluster", "rest"):
        assert summary["subsets"][subset] == pytest.approx(
            expected_summary.loc[subset].to_dict())


def test_prune_writes_a_pt2_that_measures_the_curves_point(runs, demo):
    code, out, err, folder = runs["prune"]
    assert code == 0, err
    module, dataset = demo
    ranking = at.cluster_scores(module, LAYER, dataset.inputs, dataset.labels,
                                dataset.clusters, reduce="mean_abs").loc[["odd"]]
    curve = at.pruning_curve(module, LAYER, dataset.inputs, dataset.labels, ranking, ks=[0, 6],
                             ablation="mean", n_random=1)
    pruned = load_model(folder / "pruned" / "fc2-6.pt2")
    assert pruned.class_names == load_model(MODEL).class_names
    after = at.model_metric(pruned.module, dataset.inputs, dataset.labels)
    assert after == pytest.approx(curve["bottom"].iloc[1], abs=1e-9)
    summary = json.loads((folder / "pruned.json").read_text())
    assert summary["before"] == pytest.approx(curve["bottom"].iloc[0], abs=1e-9)
    assert summary["after"] == pytest.approx(after, abs=1e-9)
    assert (summary["k"], summary["remove"], summary["cluster"]) == (6, "bottom", "odd")
    assert out.startswith("Removed 6 neurons of fc2, the lowest-ranked by "
                          "gradient_x_activation (mean |·|); wrote ")
    assert f"accuracy {summary['before']:.4f} -> {after:.4f} with these 6 of 16 neurons " \
        "removed." in out


def test_prune_without_labels_measures_agreement_with_the_unpruned_model(tmp_path, demo, capsys):
    module, dataset = demo
    np.savez(tmp_path / "x.npz", inputs=dataset.inputs.numpy())
    code, out, err = in_process("prune", "--model", MODEL, "--data", tmp_path / "x.npz",
                                "--layer", "relu2", "--k", "8", "--remove", "top", "--quiet",
                                "--out", tmp_path / "p.pt2", capsys=capsys)
    assert code == 0, err
    predicted = at.predict_classes(module, dataset.inputs)
    ranking = at.neuron_scores(module, "relu2", dataset.inputs, None,
                               settings.DEFAULT_METHOD).abs().mean(0)  # DEFAULT_PRUNE_REDUCE
    curve = at.pruning_curve(module, "relu2", dataset.inputs, None, ranking, ks=[8],
                             n_random=1)
    pruned = load_model(tmp_path / "p.pt2").module
    assert at.model_metric(pruned, dataset.inputs, predicted) == pytest.approx(
        curve["ranked"].iloc[0], abs=1e-9)
    assert "\naccuracy 1.0000 -> " in out and "the highest-ranked by" in out


def test_curve_and_diagnose_say_their_cost_before_they_run(runs):
    """16 neurons, 10 orders at 5 k; diagnose is timed on one batch of its samples."""
    curve = runs["curve"][2]
    masks = costs.distinct_masks(16, 8, [0, 2, 4, 8, 16], settings.DEFAULT_SEED)
    assert "pruning curves: " in curve and (
        f"10 removal orders x 5 values of k on 719 samples, {masks} masked passes" in curve)
    diagnosis = runs["diagnose"][2]
    # under three batches: no room for a second timing within a quarter of the work
    assert re.search(r"diagnose: at most \d+ s \(diagnose timed on 25\d of the 719 samples, "
                     r"every cluster kept, and scaled up: an upper bound\)", diagnosis)


def test_sample_scores_a_seeded_sample_in_order_and_streamed_data_refuses_it(tmp_path, demo,
                                                                             capsys):
    module, dataset = demo
    common = ("--model", MODEL, "--data", DATA, "--layer", LAYER, "--method", "gradient",
              "--quiet", "--clusters", "label", "--seed", "3")
    code, _, err = in_process("score", *common, "--sample", "100", "--out",
                              tmp_path / "a.csv", "--per-sample", tmp_path / "a.npy",
                              capsys=capsys)
    assert code == 0, err
    chosen = torch.randperm(719, generator=torch.Generator().manual_seed(3))[:100].sort().values
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), at.neuron_scores(
        module, LAYER, dataset.inputs[chosen], dataset.labels[chosen], "gradient").numpy(),
        rtol=1e-5,
        atol=1e-7)
    table = pd.read_csv(tmp_path / "a.csv")
    assert table[table["neuron"] == 0]["n"].sum() == 100  # the clusters' sizes
    np.save(tmp_path / "inputs.npy", dataset.inputs.numpy())
    code, _, err = in_process("score", "--model", MODEL, "--data", tmp_path / "inputs.npy",
                              "--layer", LAYER, "--sample", "100", "--out", tmp_path / "b.csv",
                              capsys=capsys)
    assert code == 2 and "--sample takes data held in memory" in err


def test_diagnose_exit_code_gates_on_the_severity(runs, capsys):
    code, out, err, folder = runs["diagnose"]
    findings = json.loads((folder / "findings.json").read_text())["findings"]
    severities = {f["code"]: f["severity"] for f in findings}
    assert "problem" not in severities.values() and code == 0, err
    assert severities["sign_cancellation"] == "warning"
    for finding in findings:  # the table shows every check with its verdict
        assert f"{finding['severity'].upper():<9} {finding['code']}" in out
    common = ("diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--n-random", "8",
              "--quiet", "--clusters", "provided", "--method", "gradient")  # as runs["diagnose"]
    assert in_process(*common, "--fail-on", "warning", capsys=capsys)[0] == 1
    code, out, _ = in_process(*common, "--method", "random", "--clusters", "none",
                              "--metric", "accuracy", capsys=capsys)
    assert code == 1 and "PROBLEM   not_better_than_random" in out


@pytest.mark.parametrize("metric", [None, "accuracy"])
def test_diagnose_gives_the_apis_findings_with_the_same_defaults(demo, tmp_path, metric, capsys):
    model, dataset = demo
    flags = ("--metric", metric) if metric else ()
    code, _, err = in_process("diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER,
                              "--clusters", "none", "--quiet", *flags,
                              "--out", tmp_path / "findings.json", capsys=capsys)
    assert code in (0, 1), err
    ours = {f["code"]: (f["severity"], f["value"])
            for f in json.loads((tmp_path / "findings.json").read_text())["findings"]}
    options = {"metric": metric} if metric else {}
    expected = {f.code: (f.severity, pytest.approx(f.value, rel=1e-6, abs=1e-9)) for f in
                at.diagnose(model, LAYER, dataset.inputs, dataset.labels, **options)}
    assert ours == expected


def test_diagnose_ablates_the_neurons_it_is_told_and_says_so(demo, tmp_path, capsys):
    """--oracle-neurons M: the agreement check on M of fc2's 16 neurons, the same finding
    as the API's, its interval in the JSON; without it, every neuron (they fit the budget)."""
    model, dataset = demo
    out = tmp_path / "sampled.json"
    base = ("diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--clusters",
            "none", "--quiet")
    code, _, err = in_process(*base, "--oracle-neurons", "12", "--out", out, capsys=capsys)
    assert code in (0, 1), err
    written = json.loads(out.read_text())
    check = {f["code"]: f for f in written["findings"]}["disagrees_with_ablation"]
    assert written["oracle_neurons"] == 12
    assert "on 12 of the 16 neurons drawn at random" in check["message"]
    assert check["low"] <= check["value"] <= check["high"]
    expected = {f.code: f for f in at.diagnose(model, LAYER, dataset.inputs, dataset.labels,
                                               oracle_neurons=12)}["disagrees_with_ablation"]
    assert check["value"] == pytest.approx(expected.value, rel=1e-6)
    out = tmp_path / "exact.json"
    assert in_process(*base, "--out", out, capsys=capsys)[0] in (0, 1)
    written = json.loads(out.read_text())
    assert written["oracle_neurons"] == 16
    n_samples = len(dataset.inputs)  # every sample, the full evidence curve: they fit
    assert written["oracle_samples"] == n_samples == written["curve_samples"]
    assert written["curve_points"] == settings.EVIDENCE_CURVE_POINTS
    assert "drawn at random" not in {f["code"]: f for f in written["findings"]}[
        "disagrees_with_ablation"]["message"]
    with pytest.raises(SystemExit) as refused:
        in_process(*base, "--oracle-neurons", "0", capsys=capsys)
    assert refused.value.code == 2


def test_report_is_one_offline_html_file(runs):
    code, _, err, folder = runs["report"]
    assert code == 0, err
    page = (folder / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "fc2" in page
    assert "Plotly" in page and "<script src=" not in page  # plotly.js is inline
    assert "<link" not in page and 'src="http' not in page  # nothing to fetch when opened
    scores = pd.read_csv(folder / "tables" / "cluster_scores.csv")
    assert set(scores["method"]) == {"gradient", "gradient_x_activation"}
    assert (folder / "tables" / "pruning_curves.csv").is_file()


def test_a_bad_file_through_the_real_entry_point_gives_one_line(runs):
    code, out, err, folder = runs["bad-file"]
    assert code == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not (folder / "x.csv").exists()


# ------------------------------------------------------- bad input: one message, exit 2

def bad_inputs(tmp: Path):
    """(arguments, a phrase the message must contain) for every kind of mistake."""
    (tmp / "empty.npz").write_bytes(b"")
    (tmp / "notes.txt").write_text("hello")
    (tmp / "image.npz").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    np.save(tmp / "wide.npy", np.zeros((5, 7), dtype=np.float32))
    np.save(tmp / "inputs.npy", np.zeros((5, 64), dtype=np.float32))
    np.save(tmp / "short_labels.npy", np.zeros(3, dtype=np.int64))
    np.save(tmp / "big_labels.npy", np.full(5, 40))
    np.save(tmp / "lonely.npy", np.array(["a", "a", "a", "a", "b"]))
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 200000), }"
    header = header.ljust(117) + "\n"  # a header claiming 745 GiB, over 64 bytes of data
    (tmp / "claims.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                                     + header.encode() + bytes(64))
    np.save(tmp / "big_scores.npy", np.zeros((600, 1000), dtype=np.float32))  # 2.4 MB
    score = ["score", "--model", MODEL, "--layer", LAYER, "--out", tmp / "out.csv"]
    return [
        (["score", "--model", tmp / "absent.pt2", "--data", DATA, "--layer", LAYER,
          "--out", tmp / "o.csv"], "No such model file"),
        (score + ["--data", tmp / "absent.npz"], "No such data file"),
        (score + ["--data", tmp / "empty.npz"], "empty"),
        (score + ["--data", tmp / "image.npz"], "a PNG image, not a data file"),
        (["score", "--model", MODEL, "--data", DATA, "--layer", "fc9", "--out",
          tmp / "o.csv"], "Valid layer names: fc1"),
        (score + ["--data", DATA, "--method", "saliency"], "invalid choice: 'saliency'"),
        (score + ["--data", DATA, "--batch-size", "0"], "positive integer"),
        (["score", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--out",
          tmp / "o.txt"], ".csv or .parquet"),
        (score + ["--data", DATA, "--targets", "11"], "not a class of this model"),
        (score + ["--data", DATA, "--targets", "best"], "not understood"),
        (score + ["--data", tmp / "inputs.npy", "--targets", "label"],
         "This data has no labels"),
        (score + ["--data", DATA, "--device", "cuda:0"] if not torch.cuda.is_available()
         else score + ["--data", DATA, "--device", "cuda:99"], "cuda"),
        (score + ["--data", DATA, "--device", "tpu"], "Unknown device"),
        (score + ["--data", tmp / "wide.npy"], "the model expects [64]"),
        (score + ["--data", tmp / "inputs.npy", "--labels", tmp / "short_labels.npy"],
         "one class id per sample (5)"),
        (score + ["--data", tmp / "inputs.npy", "--labels", tmp / "big_labels.npy"],
         "0..9"),
        (score + ["--data", tmp / "inputs.npy", "--cluster-ids", tmp / "lonely.npy"],
         "at least 2 samples each"),
        (score + ["--data", tmp / "inputs.npy", "--cluster-ids", tmp / "short_labels.npy"],
         "one integer or text cluster id per sample, shape [5]"),
        (score + ["--data", tmp / "inputs.npy", "--clusters", "kmeans_inputs"],
         "needs the data in memory"),
        (score + ["--data", DATA, "--labels", tmp / "short_labels.npy"], "for .npy data"),
        (score + ["--data", DATA, "--per-sample", tmp / "p.txt"], "must end in .npy"),
        (["curve", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--cluster", "seven",
          "--clusters", "provided", "--out", tmp / "c.csv"],
         "'seven' is not among the cluster ids (even, odd)"),
        (["report", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--cluster", "seven",
          "--out", tmp / "r.html"], "'seven' is not among the cluster ids (0, 1, 2"),
        (["curve", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--ks", "1,x",
          "--out", tmp / "c.csv"], "comma-separated integers"),
        (["curve", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--ks", "0,99",
          "--out", tmp / "c.csv"], "ks must lie in 0..16"),
        (["curve", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--targets", "all",
          "--out", tmp / "c.csv"], "one target per sample"),
        (["diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--user-scores",
          tmp / "notes.txt"], "not a readable .npy"),
        (["diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--user-scores",
          tmp / "claims.npy"], "not a readable .npy"),
        (["diagnose", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--user-scores",
          tmp / "big_scores.npy", "--max-decoded-mb", "1"], "The user scores file holds 2 MB"),
        (["prune", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--k", "17",
          "--out", tmp / "p.pt2"], "k must be an integer in 0..16"),
        (["prune", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--k", "3",
          "--out", tmp / "p.pt"], "written as a .pt2 file"),
        (["prune", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--out",
          tmp / "p.pt2"], "the following arguments are required: --k"),
        (["layers"], "the following arguments are required: --model"),
    ]


def test_every_bad_input_gives_one_clear_message_and_exit_2(tmp_path, capsys):
    for arguments, phrase in bad_inputs(tmp_path):
        try:
            code = cli.main([str(a) for a in arguments])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        captured = capsys.readouterr()
        assert code == 2, (arguments, captured.err)
        assert phrase in captured.err, (arguments, captured.err)
        assert captured.err.startswith("error: ") and "Traceback" not in captured.err
        assert captured.out == ""


def test_a_bug_is_reported_as_an_internal_error(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(distributed, "cluster_statistics", broken)
    code = cli.main(["score", "--model", str(MODEL), "--data", str(DATA), "--layer", LAYER,
                     "--out", "-"])
    assert code == 3
    assert "internal error (RuntimeError: something inside broke)" in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with cli.ProgressBar("gradient") as bar:
        bar(0.5)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with cli.ProgressBar("gradient") as bar:
        bar(0.5)
        bar(float("nan"))  # an iterable of unknown length: the bar stays where it is
    assert "gradient:  50%" in capsys.readouterr().err
    with cli.ProgressBar("gradient", quiet=True) as bar:
        bar(0.5)
    assert capsys.readouterr().err == ""


def test_score_tables_cannot_start_a_spreadsheet_formula(tmp_path, capsys):
    """Cluster ids from the data reach the CSV as text a spreadsheet shows, never runs."""
    with np.load(DATA) as archive:
        inputs, labels = archive["inputs"][:60], archive["labels"][:60]
    hostile = np.array(["=HYPERLINK(\"http://attacker.example\")", "@SUM(A1)", "+1", "-1"])
    np.savez(tmp_path / "d.npz", inputs=inputs, labels=labels,
             clusters=hostile[np.arange(60) % 4])
    arguments = ["score", "--model", MODEL, "--data", tmp_path / "d.npz", "--layer", LAYER,
                 "--clusters", "provided", "--quiet", "--out"]  # the data's cluster column
    for out in (tmp_path / "s.csv", "-"):
        assert cli.main([str(a) for a in arguments + [out]]) == model_command.EXIT_OK
        text = capsys.readouterr().out if out == "-" else out.read_text()
        table = pd.read_csv(io.StringIO(text))
        assert set(table["cluster"]) == {"'" + name for name in hostile}
        assert (table["score"] < 0).any() and table["score"].dtype == float


# ------------------------------------------------------- defaults: one home, every front end

def test_the_cli_its_report_and_the_settings_agree_by_default(tmp_path, capsys):
    """On the shipped demo (labels and a cluster column), every command's defaults, the
    report's settings and `AnalysisSettings.for_data` (what the dashboard starts from) name
    the same method, cluster source and targets: those of `attribution.analyses.settings`."""
    parser = cli.build_parser()
    common = ["--model", str(MODEL), "--data", str(DATA), "--layer", LAYER]
    parsed = {name: parser.parse_args([name, *common, "--out", str(tmp_path / out), *more])
              for name, out, *more in (("score", "s.csv"), ("curve", "c.csv"),
                                       ("diagnose", "d.json"), ("report", "r.html"),
                                       ("prune", "p.pt2", "--k", "1"))}
    problem = cli.load_problem(parsed["score"])
    data = dict(has_labels=problem.labels is not None,
                has_provided_clusters=problem.provided_clusters is not None)
    assert data == dict(has_labels=True, has_provided_clusters=True)
    expected = settings.AnalysisSettings.for_data(problem.model.layers(), layer=LAYER, **data)
    assert (expected.method, expected.cluster_source, expected.target) == (
        settings.DEFAULT_METHOD, "label", "true")
    for name, args in parsed.items():
        method = args.method[0] if isinstance(args.method, list) else args.method
        assert method == expected.method, name
        assert cli.cluster_source_of(args, problem) == expected.cluster_source, name
        assert cli.target_choice(args, problem) == (expected.target, expected.fixed_class), name
        reduce = settings.DEFAULT_PRUNE_REDUCE if name == "prune" else expected.reduce
        assert (args.reduce, args.kmeans_k, args.batch_size, args.seed) == (
            reduce, expected.k, expected.batch_size, expected.seed), name
        assert args.n_steps is None, name  # DEFAULT_N_STEPS, fitted to a budget for a path
        # method (`cli.steps_of`)
    for name in ("curve", "diagnose", "report", "prune"):
        assert parsed[name].n_random == expected.n_random
    for name in ("curve", "report", "prune"):  # the metric follows the model and data
        assert cli.metric_of(parsed[name], problem) == expected.metric, name
    assert parsed["curve"].ablation == parsed["prune"].ablation == settings.DEFAULT_ABLATION
    assert parsed["diagnose"].metric == settings.EVIDENCE_METRIC
    assert cli.report_settings(parsed["report"], problem) == expected  # compare included
    # and what `score` computes by default: one row per label and neuron, by that method
    code, out, err = in_process("score", *common, "--out", "-", capsys=capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert set(table["method"]) == {settings.DEFAULT_METHOD}
    assert sorted(table["cluster"].unique()) == list(range(10))


def test_unlabelled_data_is_grouped_by_the_predicted_class_everywhere(tmp_path, demo, capsys):
    """Without labels or cluster ids the default cluster source is the predicted class, for
    .npy data streamed from disk too (before: one cluster "all" here, predicted in the app)."""
    module, dataset = demo
    np.save(tmp_path / "inputs.npy", dataset.inputs.numpy())
    args = cli.build_parser().parse_args(["score", "--model", str(MODEL), "--layer", LAYER,
                                          "--data", str(tmp_path / "inputs.npy"), "--batch-size",
                                          "100", "--out", str(tmp_path / "s.csv")])
    problem = cli.load_problem(args)
    assert problem.streamed and problem.labels is None and problem.provided_clusters is None
    assert cli.cluster_source_of(args, problem) == settings.default_cluster_source(
        False, False) == "predicted"
    np.testing.assert_array_equal(cli.clusters_of(args, problem, LAYER),
                                  at.predict_classes(module, dataset.inputs).numpy())
    assert cli.target_choice(args, problem) == (settings.default_target(False), 0)
    args.clusters = "kmeans_inputs"
    with pytest.raises(at.AttributionError, match="needs the data in memory.*--max-rows"):
        cli.clusters_of(args, problem, LAYER)


def test_without_device_the_command_line_computes_where_the_dashboard_does(monkeypatch,
                                                                          capsys):
    """One home for the choice: `processes.default_device()` (the settings' too), "cuda"
    when a GPU is present."""
    from attribution.engine import processes

    assert settings.default_device is processes.default_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert settings.default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert settings.default_device() == "cpu"
    monkeypatch.setattr(processes, "default_device", lambda: "banana")
    code, _, err = in_process("layers", "--model", MODEL, capsys=capsys)
    assert code != 0 and "Unknown device 'banana'" in err
    code, _, _ = in_process("layers", "--model", MODEL, "--device", "cpu", capsys=capsys)
    assert code == 0


def test_the_dashboard_moves_the_model_it_caches_to_the_default_device(monkeypatch):
    from pages.shared import workspace

    monkeypatch.setattr(settings, "default_device", lambda: "meta")  # any device but the CPU
    loaded = workspace._on_compute_device(load_model(MODEL))
    assert {p.device.type for p in loaded.module.parameters()} == {"meta"}


def test_scorecard_writes_the_apis_table_with_the_same_defaults(demo, tmp_path, capsys):
    """`scorecard --clusters label` is `at.scorecard` with true labels as targets and the
    label clusters; a method that refuses a layer is named on stderr, its row left out."""
    model, dataset = demo
    out = tmp_path / "card.csv"
    code, _, err = in_process("scorecard", "--model", MODEL, "--data", DATA, "--clusters",
                              "label", "--layers", "relu1", "fc2", "--methods", "gradient",
                              "weight_norm", "ablation", "--n-boot", "200", "--quiet",
                              "--out", out, capsys=capsys)
    assert code == 0, err
    assert "left out relu1/weight_norm: weight_norm scores layers by the weights" in err
    written = pd.read_csv(out)
    expected = at.scorecard(model, dataset.inputs, dataset.labels, dataset.labels.numpy(),
                            layers=["relu1", "fc2"],
                            methods=["gradient", "weight_norm", "ablation"], n_boot=200)
    pd.testing.assert_frame_equal(written, expected.reset_index(drop=True),
                                  check_dtype=False)
    assert list(written["method"]) == ["gradient", "ablation", "gradient", "weight_norm",
                                       "ablation"]


def test_scorecard_measures_the_neurons_it_is_told_and_says_so(demo, tmp_path, capsys):
    """--oracle-neurons 8: relu1 (32 neurons) and fc2 (16) measured on 8 of theirs each,
    said on stderr, the table the API's with the same sizes."""
    model, dataset = demo
    out = tmp_path / "card.csv"
    code, _, err = in_process("scorecard", "--model", MODEL, "--data", DATA, "--clusters",
                              "label", "--layers", "relu1", "fc2", "--methods", "gradient",
                              "ablation", "--n-boot", "100", "--oracle-neurons", "8",
                              "--quiet", "--out", out, capsys=capsys)
    assert code == 0, err
    assert "relu1: measured on 8 of its 32 neurons, drawn at random" in err
    assert "fc2: measured on 8 of its 16 neurons" in err
    written = pd.read_csv(out)
    assert (written["neurons"] == 8).all() and list(written["n_neurons"]) == [32, 32, 16, 16]
    expected = at.scorecard(model, dataset.inputs, dataset.labels, dataset.labels.numpy(),
                            layers=["relu1", "fc2"], methods=["gradient", "ablation"],
                            n_boot=100, oracle_neurons=8)
    pd.testing.assert_frame_equal(written, expected.reset_index(drop=True),
                                  check_dtype=False)


def test_scorecard_refuses_a_layer_it_does_not_know(tmp_path, capsys):
    code, _, err = in_process("scorecard", "--model", MODEL, "--data", DATA, "--layers",
                              "nope", "--out", tmp_path / "card.csv", capsys=capsys)
    assert code == 2 and "Unknown layer 'nope'" in err


@pytest.mark.serial  # the jail's refusal is held to a time budget
def test_files_given_by_path_go_through_the_jail_and_trust_code_opts_out(tmp_path, capsys):
    """A collaborator's file arrives by path: a .pt2 whose cost grows with the batch and a
    tokenizer that aborts are refused by the jail with exit 2 and its message; a data bomb
    by path too. --trust-code reads your own files in this process."""
    import time

    from tests.support.hostile import BatchSquareBomb, exported, npz_bomb

    bomb = tmp_path / "bomb.pt2"
    bomb.write_bytes(exported(BatchSquareBomb()))
    start = time.perf_counter()
    assert cli.main(["layers", "--model", str(bomb)]) == 2
    assert "TFLOP for a batch of 256 samples" in capsys.readouterr().err
    assert time.perf_counter() - start < 10
    data = tmp_path / "bomb.npz"
    data.write_bytes(npz_bomb())
    assert cli.main(["score", "--model", str(MODEL), "--data", str(data), "--layer", LAYER,
                     "--out", str(tmp_path / "s.csv"), "--quiet"]) == 2
    assert "unpacks to" in capsys.readouterr().err
    jailed = []
    real = at.inputs.untrusted.jail.run
    at.inputs.untrusted.jail.run = lambda *args: jailed.append(args[0]) or real(*args)
    try:
        assert cli.main(["score", "--model", str(MODEL), "--data", str(DATA), "--layer",
                         LAYER, "--out", str(tmp_path / "t.csv"), "--quiet",
                         "--trust-code"]) == 0
        assert jailed == []
        assert cli.main(["score", "--model", str(MODEL), "--data", str(DATA), "--layer",
                         LAYER, "--out", str(tmp_path / "u.csv"), "--quiet"]) == 0
        assert len(jailed) >= 1  # the data at least (the model may be accepted already)
    finally:
        at.inputs.untrusted.jail.run = real
    assert pd.read_csv(tmp_path / "t.csv").equals(pd.read_csv(tmp_path / "u.csv"))


OVERVIEW_WITHOUT_TORCH = """
import runpy, sys
sys.argv = ["attribution", *sys.argv[1:]]
try:
    runpy.run_module("attribution", run_name="__main__")
except SystemExit as done:
    assert done.code == 0, done.code
heavy = sorted(name for name in ("torch", "numpy", "pandas") if name in sys.modules)
assert not heavy, f"the overview imported {heavy}"
"""


@pytest.mark.parametrize("asked", [["--help"], ["-h"], ["--traceback", "--help"]])
def test_the_overview_prints_without_torch_as_the_full_parser_prints_it(asked, monkeypatch):
    """`python -m attribution --help` answers from `attribution.commands` alone (no torch,
    no NumPy: it prints at once) and says what the full parser's help says."""
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    result = fresh_python(OVERVIEW_WITHOUT_TORCH, *asked, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == cli.build_parser().format_help()
    for name, line in commands.COMMANDS.items():
        assert name in result.stdout and line.split()[0] in result.stdout


def test_the_entry_point_hands_every_command_to_the_command_line(capsys):
    """`run` (the `attribution` script and `python -m attribution`) prints the
    overview itself and gives anything else to `cli.main`: its usage errors included."""
    assert entry.run(["--help"]) == 0
    assert "every method on every layer" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        entry.run(["score", "--model", MODEL])
    assert exited.value.code == model_command.EXIT_BAD_INPUT
    assert "--data" in capsys.readouterr().err
    assert entry.run(["layers", "--model", MODEL, "--format", "json"]) == model_command.EXIT_OK
    assert json.loads(capsys.readouterr().out)[0]["name"] == "fc1"


LAYERS_WITHOUT_ANALYSES = """
import json, sys
import attribution.__main__ as entry
assert entry.run(["layers", "--model", sys.argv[1], "--format", sys.argv[2]]) == 0
heavy = sorted(name for name in sys.modules if name == "pandas"
               or name.startswith(("attribution.analyses", "attribution.methods.scores",
                                   "attribution.cli")))
assert not heavy, f"layers imported {heavy}"
"""


@pytest.mark.parametrize("form", ["table", "csv", "json"])
def test_layers_imports_no_analysis_and_says_what_the_full_parser_says(form, capsys):
    """`layers` through the entry point loads the model and lists its layers with the model
    loaders alone (no pandas, no analysis: it starts at its floor), and prints what
    `cli.main` prints for the same command line."""
    result = fresh_python(LAYERS_WITHOUT_ANALYSES, str(MODEL), form, timeout=300)
    assert result.returncode == 0, result.stderr
    code, out, _ = in_process("layers", "--model", MODEL, "--format", form, capsys=capsys)
    assert code == 0 and result.stdout == out.replace("\r\n", "\n")  # text mode's newlines


def test_plain_rows_are_written_as_a_frame_is(tmp_path):
    """`cells.rows_csv` (pandas-free, for `layers`) writes the CSV `report.csv_text` writes
    of the same rows: formulas made inert, None empty, CRLF line ends, quoted newlines."""
    from attribution.presentation import cells
    from attribution.presentation.report import csv_text

    rows = [{"name": "=cmd|' /C calc'!A0", "n": 3, "axis": None, "x": 0.5, "words": "a\nb"},
            {"name": "-2+3", "n": -1, "axis": "+1", "x": 1.25, "words": "@here"}]
    assert cells.rows_csv(rows) == csv_text(pd.DataFrame(rows))
    assert cells.rows_csv(rows).splitlines()[1].startswith("'=cmd|' /C calc'!A0,3,,0.5,")
    assert cells.rows_csv([]) == cells.rows_text([]) == ""


def test_importing_the_package_imports_torch_only_when_a_name_is_used():
    """`import attribution` is lazy (PEP 562): every exported name resolves on first use to
    its module's object, and `dir()` lists them; `import_all` (the dashboard's warm-up)
    imports every one of them at once."""
    script = ("import sys, attribution as at\n"
              "assert 'torch' not in sys.modules\n"
              "names = at.__all__\n"
              "assert set(names) <= set(dir(at))\n"
              "from attribution.methods.scores import neuron_scores\n"
              "assert at.neuron_scores is neuron_scores and 'torch' in sys.modules\n"
              "assert all(getattr(at, name) is not None for name in names)\n"
              "from attribution import scorecard, distributed\n"
              "assert distributed.__name__ == 'attribution.analyses.distributed'\n"
              "try:\n    at.no_such_name\nexcept AttributeError:\n    pass\n"
              "else:\n    raise AssertionError('no AttributeError')\n")
    warmed = ("import sys, attribution as at\n"  # a server's warm-up: nothing left after it
              "at.import_all()\n"
              "before = set(sys.modules)\n"
              "assert all(getattr(at, name) is not None for name in at.__all__)\n"
              "assert set(sys.modules) == before, sorted(set(sys.modules) - before)\n")
    for code in (script, warmed):
        result = fresh_python(code)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("arguments, starts", [
    (["layers", "--model", "m.pt2"], True),
    (["--traceback", "score", "--model", "m.pt2", "--data", "d.npz"], True),
    (["score", "--model", "m.pt2", "--trust-code"], False),
    (["curve", "--help"], False),
    (["--help"], False),
    (["nonsense", "--model", "m.pt2"], False),
    ([], False),
])
def test_the_jail_starts_before_torch_is_imported_only_for_a_model_it_will_read(arguments,
                                                                                starts):
    """A command that loads a model in the jail starts the jail's server first, so its
    import of torch runs beside the command line's own; help, --trust-code and mistakes
    start nothing."""
    assert entry.reads_a_model_in_the_jail(arguments) is starts


def test_the_jail_warms_up_for_the_kind_of_model_the_command_line_names(tmp_path):
    """A folder given as --model (either spelling) warms the jail up with the loaders of
    Hugging Face folders; a file, a missing path or no --model with a model file's."""
    folder = str(tmp_path)
    assert entry.names_a_folder(["score", "--model", folder, "--data", "d.npz"])
    assert entry.names_a_folder(["score", f"--model={folder}"])
    assert not entry.names_a_folder(["score", "--model", str(tmp_path / "m.pt2")])
    assert not entry.names_a_folder(["score", "--data", folder])
    assert not entry.names_a_folder(["score", "--model"])
