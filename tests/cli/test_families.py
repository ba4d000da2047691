"""Each model family through the command line, from the files a researcher would bring (a .pt2,
or a Hugging Face folder; an .npz of named inputs and labels): layers, score, curve, diagnose,
scorecard and prune, every command exiting as it should, and the pruned model it writes loaded
back with its metric on the data the one prune reported."""
import contextlib
import io
import json

import numpy as np
import pytest
import torch

import attribution as at
from attribution import cli
from attribution.engine import model_io
from tests.support import families

def _family(name):
    """(model, inputs, labels): labels real for the regression model, else class ids."""
    model, x = families.family(name)
    if name == "regression":
        return model, x, families.regression_targets(x)
    return model, x, torch.arange(families.N_SAMPLES) % families.N_CLASSES


def _files(name, folder):
    """The model as its owner would save it and its data as an .npz: (model path, data path,
    model, inputs, labels)."""
    model, x, labels = _family(name)
    if hasattr(model, "save_pretrained"):
        model_path = folder / "model"
        model.save_pretrained(model_path)
    else:
        model_path = folder / "model.pt2"
        at.save_pt2(model, model_io.take(x, slice(0, 2)), model_path)
    arrays = dict(x.items()) if isinstance(x, dict) else {"x": x}
    arrays = {key: (value.float() if value.dtype == torch.bfloat16 else value).numpy()
              for key, value in arrays.items()}
    np.savez(folder / "data.npz", **arrays, y=labels.numpy())
    return model_path, folder / "data.npz", model, x, labels


def _run(*argv):
    """(exit code, stdout) of one command run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([str(arg) for arg in argv])
    return code, out.getvalue()


@pytest.mark.parametrize("name", families.FAMILIES)
def test_every_command_runs_on_the_family_and_its_pruned_model_loads(name, tmp_path):
    model_path, data_path, model, x, labels = _files(name, tmp_path)
    before = model_path.read_bytes() if model_path.is_file() else None
    code, out = _run("layers", "--model", model_path, "--format", "json")
    assert code == 0
    listed = [layer["name"] for layer in json.loads(out)]
    layer = listed[len(listed) // 2]
    common = ("--model", model_path, "--data", data_path, "--layer", layer, "--quiet")
    assert _run("score", *common, "--method", "gradient_x_activation",
                "--out", tmp_path / "s.csv")[0] == 0
    assert _run("curve", *common, "--n-random", "2", "--ks", "0,1,2",
                "--out", tmp_path / "c.csv")[0] == 0
    assert _run("diagnose", *common, "--n-random", "2", "--out", tmp_path / "f.json")[0] in (0, 1)
    assert json.loads((tmp_path / "f.json").read_text())
    assert _run("scorecard", "--model", model_path, "--data", data_path, "--layers", layer,
                "--methods", "gradient", "ablation", "random", "--n-boot", "20",
                "--n-random", "2", "--curve-points", "2", "--quiet",
                "--out", tmp_path / "sc.csv")[0] == 0
    pruned_path = tmp_path / ("pruned" if model_path.is_dir() else "pruned.pt2")
    assert _run("prune", *common, "--k", "2", "--out", pruned_path,
                "--summary", tmp_path / "p.json")[0] == 0
    if before is not None:
        assert model_path.read_bytes() == before

    summary = json.loads((tmp_path / "p.json").read_text())
    pruned = at.load_model(pruned_path).module
    with torch.no_grad():
        outputs = model_io.logits_of(model_io.call(pruned, model_io.named(x))).float()
    if name == "regression":
        assert summary["metric"] == "squared_error"
        after = ((outputs[:, 0] - labels) ** 2).mean().item()
        assert after == pytest.approx(summary["after"], rel=1e-4)
    else:
        assert summary["metric"] == "accuracy"
        assert (outputs.argmax(1) == labels).float().mean().item() == pytest.approx(
            summary["after"], abs=1e-6)


def test_a_model_whose_export_cannot_be_read_back_is_refused_and_saved_as_a_folder(tmp_path):
    """BART's head picks each row's <eos> by a boolean mask: torch.export writes that program
    but cannot read it back. save_pt2 says so before writing; the folder route keeps it."""
    model, x = families.family("bart")
    with pytest.raises(at.AttributionError, match="cannot read it back.*save_folder"):
        at.save_pt2(model, model_io.take(x, slice(0, 2)), tmp_path / "m.pt2")
    assert not (tmp_path / "m.pt2").exists()
    at.save_folder(model, tmp_path / "folder")
    loaded = at.load_model(tmp_path / "folder").module
    with torch.no_grad():
        assert torch.allclose(model(**x).logits, loaded(**x).logits, atol=1e-6)


def test_a_folder_is_refused_where_the_pruned_layer_is_wrapped(tmp_path):
    model, x = families.family("swin")
    pruned = at.prune(model, "swin.pooler", torch.arange(32.0), 2, inputs=x)
    with pytest.raises(at.AttributionError, match="Hugging Face config cannot describe"):
        at.save_folder(pruned, tmp_path / "folder")
    with pytest.raises(at.AttributionError, match="Only a Hugging Face model"):
        at.save_folder(families.cnn1d(), tmp_path / "other")


def test_an_existing_output_is_refused_before_any_work_unless_forced(tmp_path):
    model_path, data_path, *_ = _files("cnn1d", tmp_path)
    out = tmp_path / "curve.csv"
    out.write_text("keep me")
    argv = ("curve", "--model", model_path, "--data", data_path, "--layer", "3", "--quiet",
            "--n-random", "2", "--ks", "0,1", "--out", out)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert _run(*argv)[0] == 2
    assert "--out" in err.getvalue() and "--force" in err.getvalue()
    assert "nothing was computed" in err.getvalue() and out.read_text() == "keep me"
    assert _run(*argv, "--force")[0] == 0 and out.read_text().startswith("k,ranked,")
    folder = tmp_path / "pruned"
    folder.mkdir()
    (folder / "mine.txt").write_text("a file of mine")
    with contextlib.redirect_stderr(io.StringIO()):
        assert _run("prune", "--model", model_path, "--data", data_path, "--layer", "3",
                    "--k", "1", "--out", tmp_path / "pruned", "--quiet")[0] == 2
    assert (folder / "mine.txt").read_text() == "a file of mine"
