"""The dashboard with the probe (fitted to the clusters shown) and with a table of pixels
drawn as images (the demo's declared 8 x 8, or the Model & data page's Image shape box)."""
import numpy as np

import attribution as at
from attribution.inputs.demo import DEMO_DIR
from tests.support.app import (OCTET, assert_clean, demo_bytes, figure, figures, run_app,
                               sidebar_widget, upload)


def test_the_probe_shows_its_held_out_accuracy_beside_its_scores_and_follows_the_clusters():
    app = run_app({"method": "probe", "layer": "relu2"})
    assert_clean(app)
    context = app.session_state["context"]
    data, model = context.ws.data, context.ws.model
    expected = at.probe(model, "relu2", data.inputs, data.labels.numpy())
    notes = [box.value for box in app.info if "linear probe" in box.value]
    assert notes == [f"probe |W|: {expected.note}"]
    shown = figure(app, "score per cluster")["data"][0]
    np.testing.assert_allclose(np.asarray(shown["z"], dtype=float), expected.scores.numpy(),
                               rtol=1e-5, atol=1e-6)
    sidebar_widget(app, "w_cluster_by").set_value("provided").run()  # even / odd
    assert_clean(app)
    parity = at.probe(model, "relu2", data.inputs, data.clusters)
    assert [box.value for box in app.info if "linear probe" in box.value] == [
        f"probe |W|: {parity.note}"]
    assert "the 2 clusters" in parity.note


def test_the_probe_joins_the_diagnosis_and_its_method_comparison():
    app = run_app({"method": "probe", "layer": "relu2"})
    app.switch_page("pages/diagnosis.py").run()
    assert_clean(app)
    failures = [e.value for e in app.error if not e.value.startswith("**")]  # not a finding
    assert not failures, failures
    table = app.dataframe[0].value
    assert "probe |W|" in table["method"].tolist()  # fitted on every cluster, compared on one
    assert not any("probe |W| is left out" in c.value for c in app.caption)


def test_the_demos_pixels_are_drawn_as_images_on_the_neuron_page():
    app = run_app()
    app.switch_page("pages/neuron.py").run()
    assert_clean(app)
    examples = figure(app, "the samples that activate it most")
    assert examples["data"][0]["type"] == "heatmap"  # the grey mosaic of 8 x 8 tiles
    assert not any("feature values" in title for title in figures(app))


def digits_csv() -> bytes:
    with np.load(DEMO_DIR / "digits.npz") as archive:
        rows = ["label," + ",".join(f"p{i}" for i in range(64))]
        rows += [f"{label}," + ",".join(f"{v:g}" for v in row)
                 for row, label in zip(archive["inputs"][:120], archive["labels"][:120])]
    return ("\n".join(rows) + "\n").encode()


def test_the_image_shape_box_draws_an_uploaded_table_of_pixels_as_images():
    model = ("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET)
    app = upload(run_app(), model, ("d.csv", digits_csv(), OCTET))
    assert_clean(app)
    app.switch_page("pages/neuron.py").run()
    assert "feature values" in " ".join(figures(app))  # a table, as it came
    app.switch_page("pages/data.py").run()
    app.text_input(key="image_shape").set_value("9x9").run()  # 81 values: not these
    assert any("holds 81 values, but each sample has 64" in e.value.replace("\\", "")
               for e in app.error)
    app.text_input(key="image_shape").set_value("8x8").run()
    assert_clean(app)
    assert any("drawn as an image of 8 × 8" in box.value for box in app.info)
    app.switch_page("pages/neuron.py").run()
    assert_clean(app)
    assert figure(app, "the samples that activate it most")["data"][0]["type"] == "heatmap"
