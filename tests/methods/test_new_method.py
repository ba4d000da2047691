"""A method added with `register` alone (one function plus its decorator line) appears in
every list of methods: the engine, the oracle, the command line, the HTML report and the
dashboard's menus and pages."""
import numpy as np
import pandas as pd
import pytest
import torch

import attribution as at
from attribution import cli
from attribution.analyses.settings import default_cluster_source
from attribution.inputs.data import check_data
from attribution.inputs.data_files import load_data
from attribution.inputs.model_formats import load_model
from attribution.methods.registry import REGISTRY, register

from tests.support import ROOT
from tests.support.app import assert_clean, figure, run_app, sidebar_widget

MODEL = ROOT / "demo" / "digits_mlp.pt2"
DATA = ROOT / "demo" / "digits.npz"
LAYER = "fc2"

NEW, LABEL = "squared_activation", "squared activation (test)"


@pytest.fixture
def new_method():
    """NEW in the registry for one test, through the decorator alone; removed afterwards."""
    assert NEW not in REGISTRY
    try:
        @register(NEW, "z ** 2: a throwaway method of the tests", label=LABEL,
                  units="squared activation units", colour="#000000")
        def squared_activation(batch):
            z, _, logits = batch.runner.capture(batch.x)
            scores = (z ** 2).flatten(2).mean(-1) if z.dim() > 2 else z ** 2
            if isinstance(batch.targets, str):
                scores = scores.unsqueeze(1).expand(-1, logits.shape[1], -1)
            return scores

        yield NEW
    finally:
        REGISTRY.pop(NEW, None)


def test_a_method_registered_by_its_decorator_alone_appears_everywhere(new_method, tmp_path,
                                                                        capsys):
    loaded = load_model(MODEL)
    module, dataset = loaded.module, check_data(load_data(DATA), loaded)
    x, y = dataset.inputs, dataset.labels

    # the engine and the analyses on top of it
    assert at.method_names()[-1] == NEW  # read from the registry at the call
    assert NEW in at.methods_for(torch.int64)  # it needs no floating-point inputs
    torch.testing.assert_close(at.neuron_scores(module, LAYER, x, y, NEW),
                               at.neuron_scores(module, LAYER, x, y, "activation") ** 2)
    oracle = at.oracle_agreement(module, LAYER, x[:64], y[:64])  # all methods: NEW too
    assert list(oracle["method"]) == [m for m in at.methods_for(x.dtype, "Linear")
                                      if m not in oracle.attrs["refused"]]
    assert list(oracle.attrs["refused"]) == ["probe"]  # one cluster: nothing to tell apart
    assert NEW in list(oracle["method"])
    assert {f.code for f in at.diagnose(module, LAYER, x[:64], y[:64], NEW, n_random=3)} >= {
        "tiny_scores", "disagrees_with_ablation"}

    # the command line: its choices and help, a score table, the HTML report
    with pytest.raises(SystemExit):
        cli.main(["score", "--help"])
    assert NEW in capsys.readouterr().out
    common = ["--model", str(MODEL), "--data", str(DATA), "--layer", LAYER, "--quiet"]
    assert cli.main(["score", *common, "--method", NEW, "gradient",
                     "--out", str(tmp_path / "scores.csv")]) == 0
    table = pd.read_csv(tmp_path / "scores.csv")
    default_clusters = at.make_clusters(  # the command line's default partition
        default_cluster_source(dataset.labels is not None, dataset.clusters is not None), dataset)
    expected = at.cluster_scores(module, LAYER, x, y, default_clusters, NEW)
    rows = table[table["method"] == NEW].pivot(index="cluster", columns="neuron",
                                               values="score")
    np.testing.assert_allclose(rows.to_numpy(), expected.drop(columns="n").to_numpy(),
                               rtol=1e-6)
    assert cli.main(["report", *common, "--method", NEW, "gradient", "--n-random", "3",
                     "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert LABEL in page and "squared activation units" in page

    # the dashboard: in the sidebar's menus, and the Scores page drawn with it
    app = run_app()
    assert LABEL in sidebar_widget(app, "w_method").options
    assert LABEL in sidebar_widget(app, "w_compare").options
    sidebar_widget(app, "w_method").set_value(NEW).run()
    assert_clean(app)
    assert not app.error, [e.value for e in app.error]
    assert figure(app, "score per cluster")["layout"]["title"]["text"].startswith(LABEL)
