"""A multi-label head (one sigmoid per label, multi-hot labels [N, L]): refused wherever its
labels are given as targets or as a data file's labels, with the recipe that works (one label
at a time: a fixed target, clusters by whether the label is on, its logit measured), and that
recipe run through the API and the command line."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution import cli

RECIPE = r"scored one label at a time: score label j's logit for every sample"


@pytest.fixture(scope="module")
def multi_label():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(60, 5)
    with torch.no_grad():
        y = (model(x) > 0).long()  # the labels its sigmoids predict
    return model, x, y


def test_multi_hot_targets_are_refused_with_the_recipe(multi_label, tmp_path):
    model, x, y = multi_label
    for call in (lambda: at.neuron_scores(model, "1", x, y),
                 lambda: at.pruning_curve(model, "1", x, y, torch.arange(16.0)),
                 lambda: at.diagnose(model, "1", x, y.float())):
        with pytest.raises(at.AttributionError, match=RECIPE):
            call()
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), labels=y.numpy())
    with pytest.raises(at.AttributionError, match="Store label j's column as the cluster ids"):
        at.load_data(tmp_path / "d.npz")


def test_the_recipe_scores_curves_and_diagnoses_one_label(multi_label, tmp_path, capsys):
    model, x, y = multi_label
    label = 2
    fixed = torch.full((len(x),), label)
    on = y[:, label].numpy()
    table = at.cluster_scores(model, "1", x, fixed, on, "gradient_x_activation")
    assert list(table.index) == [0, 1] and table["n"].sum() == len(x)
    with torch.no_grad():
        expected = model(x)[:, label].mean().item()
    curve = at.pruning_curve(model, "1", x, fixed, table.loc[1].drop("n"), ks=[0, 4],
                             n_random=3, metric="target_logit")
    assert curve.loc[0, "ranked"] == pytest.approx(expected, rel=1e-5)
    codes = {f.code for f in at.diagnose(model, "1", x, fixed, clusters=on, n_random=3)}
    assert "not_better_than_random" in codes
    at.save_pt2(model, x[:2], tmp_path / "m.pt2")
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), clusters=on)
    code = cli.main(["score", "--model", str(tmp_path / "m.pt2"), "--data",
                     str(tmp_path / "d.npz"), "--layer", "1", "--targets", str(label),
                     "--clusters", "provided", "--out", "-", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[0].startswith("cluster,neuron,method,score")
