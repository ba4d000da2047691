"""The "Which method to trust" page: the scorecard of the data and clusters in view, drawn as
layers x methods with the sanity check beside it, its table and CSV; computed once for a
partition, whatever layer or method is chosen after."""
import io
import zipfile

import numpy as np
import pandas as pd
import streamlit as st

import attribution as at
from attribution.presentation import plots
from tests.support.app import assert_clean, figure, run_app, sidebar_widget

PAGE = "pages/trust.py"


def test_the_page_draws_the_scorecard_of_the_clusters_in_view(monkeypatch):
    st.cache_data.clear()
    calls = []
    original = at.scorecard_on
    monkeypatch.setattr(at, "scorecard_on", lambda *args, **kwargs: calls.append(1) or original(
        *args, **kwargs))
    app = run_app()
    app.switch_page(PAGE).run()
    assert_clean(app)
    context = app.session_state["context"]
    data = context.ws.data
    steps = {key: plan.n_steps for key, plan in context.scorecard_steps().items()}
    expected = at.scorecard(context.ws.model, data.inputs, data.labels, data.labels.numpy(),
                        n_steps=steps)
    shown = figure(app, "Which method to trust")["data"]
    layers, methods = shown[0]["y"], shown[0]["x"]
    assert layers == [info.name for info in context.ws.layers]
    assert methods == [plots.method_label(m) for m in dict.fromkeys(expected["method"])]
    grid = expected.pivot(index="layer", columns="method", values="spearman")
    grid = grid.loc[layers, list(dict.fromkeys(expected["method"]))].to_numpy()
    np.testing.assert_allclose(np.asarray(shown[0]["z"], dtype=float), grid, rtol=1e-9)
    after = np.asarray(shown[1]["z"], dtype=float)
    assert np.isnan(after[-1]).all() and (after[:-1, methods.index("activation")] == 1).all()
    table = app.dataframe[0].value
    assert len(table) == len(expected) and "Spearman ρ" in table.columns
    assert any(button.label.startswith("Download the scorecard")
               for button in app.get("download_button"))
    assert calls == [1]
    sidebar_widget(app, "w_layer").set_value("fc1").run()  # another layer: the same card
    sidebar_widget(app, "w_method").set_value("gradient").run()
    assert_clean(app)
    assert calls == [1]
    sidebar_widget(app, "w_cluster_by").set_value("provided").run()  # another partition
    assert_clean(app)
    assert calls == [1, 1]
    assert figure(app, "Which method to trust")["data"][0]["z"] != shown[0]["z"]


def test_the_report_built_on_the_export_page_holds_the_pages_scorecard(monkeypatch):
    """Built after the page drew it, the report reuses the same scorecard (not computed
    again) and its tables hold it as scorecard.csv."""
    st.cache_data.clear()
    calls = []
    original = at.scorecard_on
    monkeypatch.setattr(at, "scorecard_on", lambda *args, **kwargs: calls.append(1) or original(
        *args, **kwargs))
    app = run_app({"cluster_by": "provided"})
    app.switch_page(PAGE).run()
    card = app.session_state["context"].scorecard()
    app.switch_page("pages/export.py").run()
    next(b for b in app.button if b.label == "Build report").click().run()
    assert_clean(app)
    assert calls == [1]
    with zipfile.ZipFile(io.BytesIO(app.session_state["report"][2])) as bundle:
        written = pd.read_csv(io.StringIO(bundle.read("scorecard.csv").decode()))
    pd.testing.assert_frame_equal(written, card.reset_index(drop=True), check_dtype=False)
    assert "Which method to trust, layer by layer" in app.session_state["report"][1].decode()


def test_every_method_joins_the_scorecard_through_the_registry():
    """The toggle puts every registered method on the grid; one that cannot score a layer
    (bn_scale: no BatchNorm in the demo) is named below it, its cells left empty."""
    app = run_app()
    app.switch_page(PAGE).run()
    app.toggle(key="scorecard_every").set_value(True).run()
    assert_clean(app)
    shown = figure(app, "Which method to trust")["data"][0]
    labels = {plots.method_label(m): m for m in at.method_names()}
    assert {labels[label] for label in shown["x"]} == set(at.method_names()) - {"bn_scale"}
    left_out = [c.value for c in app.caption
                if c.value.startswith(f"{plots.method_label('bn_scale')} on ")]
    assert len(left_out) == len(shown["y"]) and all("is left out" in c for c in left_out)
    z = np.asarray(shown["z"], dtype=float)
    weight_norm = list(shown["x"]).index(plots.method_label("weight_norm"))
    relu = list(shown["y"]).index("relu1")
    assert np.isnan(z[relu, weight_norm])  # a ReLU has no weights of its own


def test_each_layer_takes_the_path_steps_that_fit_and_the_page_says_so(monkeypatch):
    """With a budget no step count fits, every layer's path methods take the fewest steps:
    said above the card, in the table's steps column, and the card is the scorecard at
    those steps; the toggle of every step asked gives the card at those."""
    from attribution.analyses import path_steps
    from pages.shared import context as shared

    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    st.cache_data.clear()
    given = []
    original = at.scorecard_on
    monkeypatch.setattr(at, "scorecard_on", lambda view, **kwargs: given.append(
        view.n_steps) or original(view, **kwargs))
    try:
        app = run_app()
        app.switch_page(PAGE).run()
        assert_clean(app)
        layers = [info.spec for info in app.session_state["context"].ws.layers]
        fewest = path_steps.FEWEST_STEPS
        assert given == [{f"{layer}/{method}": fewest for layer in layers
                          for method in ("integrated_gradients", "conductance")}]
        said = [c.value.replace("\\", "") for c in app.caption
                if c.value.startswith("Integrated gradients at ")]
        assert len(said) == 1 and said[0].startswith(
            f"Integrated gradients at {fewest} steps on {layers[0]} and "
            if len(layers) == 2 else f"Integrated gradients at {fewest} steps on {layers[0]}, ")
        assert f"({at.analyses.settings.DEFAULT_N_STEPS} asked)" in said[0]
        table = app.dataframe[0].value
        path = table["method"].isin([plots.method_label("integrated_gradients"),
                                     plots.method_label("conductance")])
        assert set(table.loc[path, "path steps"]) == {str(fewest)}
        assert set(table.loc[~path, "path steps"]) == {""}
        every = app.toggle(key="scorecard_every_step")  # every step asked, priced for the
        assert every.label.startswith("Integrate with every step asked on every layer (about ")
        every.set_value(True).run()  # model and its randomised copy
        assert_clean(app)
        asked = at.analyses.settings.DEFAULT_N_STEPS
        assert given[-1] == {key: asked for key in given[0]}
        assert not [c for c in app.caption if c.value.startswith("Integrated gradients at ")]
        table = app.dataframe[0].value
        assert set(table.loc[path, "path steps"]) == {str(asked)}
    finally:
        shared._steps_plan.clear()
