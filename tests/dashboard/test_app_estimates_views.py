"""Long work says how long it takes, with a line rather than a plain spinner: k-means
clustering (and the model's passes before it) in the sidebar and the Neuron page's view.
AppTest on the demo, with the library call the page makes slowed at its first progress report
(as tests/dashboard/test_app_estimates.py does); fast work shows no line."""
import numpy as np
import pytest
import streamlit as st
import torch
from torch import nn

import attribution as at
from attribution.analyses import neuron as neuron_module
from attribution.analyses import clusters
from attribution.analyses.clusters import KMEANS_RUNS
from tests.support.app import (ESTIMATE, assert_no_line_left, run_app, sidebar_widget,
                               slowed_first_step)


@pytest.fixture
def cold():
    """Every cached result emptied (the Neuron page's view is cached in the page script, out
    of reach one by one): the next run computes."""
    st.cache_data.clear()
    yield
    st.cache_data.clear()


def lines_of(drawn: list[str], what: str) -> list[str]:
    return [text for text in drawn if text.startswith(what)]


@pytest.mark.parametrize("source", ["kmeans_inputs", "kmeans_activations"])
def test_slow_clustering_says_how_long_it_takes(monkeypatch, drawn, cold, source):
    app = run_app()
    reported = slowed_first_step(monkeypatch, clusters, "make_clusters")  # what cluster_ids calls
    drawn.clear()
    sidebar_widget(app, "w_cluster_by").set_value(source).run()
    assert_no_line_left(app)  # removed when the clustering ended
    assert reported and reported[0] <= 0.4 and reported[-1] == 1.0
    lines = lines_of(drawn, "Grouping samples into clusters")
    assert lines and ESTIMATE.search(lines[0]), drawn
    assert len(np.unique(app.session_state["context"].clusters)) == 8  # k-means, k = 8


def test_slow_neuron_view_says_how_long_it_takes(monkeypatch, drawn, cold):
    app = run_app()
    reported = slowed_first_step(monkeypatch, neuron_module, "neuron_view")  # what the page calls
    drawn.clear()
    app.switch_page("pages/neuron.py").run()
    assert_no_line_left(app)
    assert reported and reported[0] <= 0.4 and reported[-1] == 1.0
    lines = lines_of(drawn, "Opening neuron")
    assert lines and ESTIMATE.search(lines[0]), drawn
    assert app.title[0].value.startswith("Neuron ")  # the view was drawn after the line
    drawn.clear()
    app.run()  # a cache hit: no line, no error
    assert_no_line_left(app)
    assert not lines_of(drawn, "Opening neuron")


def test_fast_clustering_and_neuron_view_show_no_line(drawn, cold):
    app = run_app()
    for source in ("kmeans_inputs", "kmeans_activations", "predicted"):
        sidebar_widget(app, "w_cluster_by").set_value(source).run()
        assert_no_line_left(app)
    app.switch_page("pages/neuron.py").run()
    assert_no_line_left(app)
    assert not drawn, drawn  # the demo's work is far under a few seconds: no line at all


def test_make_clusters_reports_each_batch_and_each_kmeans_run():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    dataset = at.Dataset(inputs=torch.randn(50, 4), labels=torch.randint(0, 3, (50,)))
    for source, batches in (("kmeans_inputs", 0), ("kmeans_activations", 5), ("predicted", 5),
                            ("label", 0)):
        fractions = []
        ids = at.make_clusters(source, dataset, model, layer="1", k=3, batch_size=10,
                               progress=fractions.append)
        assert len(ids) == 50
        runs = KMEANS_RUNS if source.startswith("kmeans") else 0
        assert len(fractions) == batches + runs, (source, fractions)  # "label" computes nothing
        assert fractions == sorted(fractions) and (not fractions or fractions[-1] == 1.0)
        if source == "kmeans_activations":  # the activation pass first, then the k-means runs
            assert fractions[0] == pytest.approx(0.5 * 10 / 50) and fractions[4] == 0.5


def test_kmeans_keeps_the_best_of_its_runs_and_is_seeded():
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.normal(centre, 0.3, (30, 2)) for centre in (0, 4, 8)])
    dataset = at.Dataset(inputs=torch.tensor(points, dtype=torch.float32))
    ids = at.make_clusters("kmeans_inputs", dataset, k=3, seed=5)
    assert (at.make_clusters("kmeans_inputs", dataset, k=3, seed=5) == ids).all()
    # three well separated blobs: every run finds them, so the best is the blobs exactly
    assert sorted(np.bincount(ids).tolist()) == [30, 30, 30]
    assert all(len(np.unique(ids[start:start + 30])) == 1 for start in (0, 30, 60))


def test_neuron_view_reports_each_batch_then_done():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    x = torch.randn(40, 4)
    scores = activations = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
    fractions = []
    neuron_module.neuron_view(model, "1", x, None, scores, activations, np.arange(40) < 10, 2,
                              batch_size=10, progress=fractions.append)
    assert fractions[:4] == pytest.approx([neuron_module.REMOVAL_SHARE * f
                                           for f in (0.25, 0.5, 0.75, 1.0)])
    assert fractions[-1] == 1.0 and len(fractions) == 5
