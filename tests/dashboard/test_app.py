"""The dashboard through Streamlit's AppTest: every page with real (small) computation."""
import io
import re

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest
from torch import nn

import attribution as at
from attribution.analyses import settings as analysis
from attribution.presentation import plots
from attribution.inputs.demo import DEMO_DIR, load_demo
from attribution.analyses.pruning_curves import METRICS, spaced_ks
from attribution.presentation.report import collect_report
from pages.shared import url, workspace
from tests.support.app import (APP, GOOD_DATA, GOOD_MODEL, OCTET, app_pages, assert_clean,
                               demo_bytes,
                               figure, figures, run_app, sidebar_widget,
                               stop_at_first_points, upload, values)
from tests.support.models import token_files

PAGES = ("pages/pruning.py", "pages/diagnosis.py", "pages/data.py", "pages/export.py")


@pytest.mark.parametrize("name", list(workspace.FAST_DEMOS))
def test_the_fast_demo_path_loads_what_load_demo_loads(name):
    expected_model, expected_data = load_demo(name)
    model, data = workspace._demo(name)
    x = expected_data.inputs[:64]
    torch.testing.assert_close(model.module(x), expected_model.module(x))
    assert [(i.name, i.kind, i.n_neurons) for i in model.layers()] == \
        [(i.name, i.kind, i.n_neurons) for i in expected_model.layers()]
    assert model.class_names == expected_model.class_names
    assert torch.equal(data.inputs, expected_data.inputs)
    assert torch.equal(data.labels, expected_data.labels)


@pytest.fixture(scope="module")
def demo_app() -> AppTest:
    app = run_app()
    assert_clean(app)
    return app


def test_default_demo_opens_with_choices_made_and_charts_drawn(demo_app):
    assert [t.value for t in demo_app.title] == ["Neuron scores"]
    assert sidebar_widget(demo_app, "w_source").value == "digits_mlp"
    assert sidebar_widget(demo_app, "w_layer").value == "relu2"
    assert sidebar_widget(demo_app, "w_method").value == "gradient_x_activation"
    titles = list(figures(demo_app))
    for part in ("score per cluster", "Highest 16 neurons", "Each sample of cluster 0",
                 "under each method"):
        assert any(part in title for title in titles), (part, titles)
    assert demo_app.query_params["layer"] == "relu2"
    assert not demo_app.error


def test_heatmap_shows_the_engine_cluster_scores(demo_app):
    ctx = demo_app.session_state["context"]
    loaded, data = workspace._demo("digits_mlp")
    table = at.cluster_scores(loaded.module, "relu2", data.inputs, data.labels, data.labels.numpy(),
                              method="gradient_x_activation")
    heatmap = figure(demo_app, "score per cluster")["data"][0]
    np.testing.assert_allclose(values(heatmap["z"]),
                               table.drop(columns="n").to_numpy(), rtol=1e-4, atol=1e-6)
    assert heatmap["y"][3] == "3 (three)" and ctx.settings.cluster == 0


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_real_results(page):
    app = run_app()
    app.switch_page(page).run()
    assert_clean(app)
    assert not app.error
    if page.endswith("pruning.py"):
        curve = figure(app, "neurons are removed")
        ranked = [t for t in curve["data"] if t.get("name") == plots.CURVE_LABELS["ranked"]]
        # every k of 16 neurons, both subsets
        assert [len(values(t["x"])) for t in ranked] == [17, 17]
        assert any("Verdict" in m.value for m in app.markdown)
    elif page.endswith("diagnosis.py"):
        alerts = list(app.success) + list(app.warning) + list(app.error)
        assert len(alerts) == 1 + 8  # the verdict, then one per check (no user scores)
        offered = sidebar_widget(app, "w_method").options  # those that score the layer
        assert len(app.dataframe[0].value) == len(offered)
        assert {"Do the methods rank", "Neuron"} <= {t.split(" ")[0] if t.startswith("Neuron")
                                                      else t[:19] for t in figures(app)}
    elif page.endswith("data.py"):
        layers = app.dataframe[0].value
        assert list(layers["layer"]) == ["fc1", "relu1", "fc2", "relu2", "out"]
        assert [m.label for m in app.metric][:3] == ["Samples", "Classes",
                                                   "Accuracy on this data"]
        assert app.metric[2].value.endswith("%")
        assert len(app.get("download_button")) == len(at.demo_files())  # one per sample file
    else:
        app.button[0].click().run()
        assert_clean(app)
        labels = [b.proto.label for b in app.get("download_button")]
        assert labels == ["Download report (HTML)", "Download tables (CSV, zip)"]


CONTROLS = [  # (widget key, new value, what must change in the first heatmap)
    ("w_layer", "fc1", lambda spec: len(values(spec["data"][0]["x"])) == 32),
    ("w_cluster_by", "correctness", lambda spec: spec["data"][0]["y"] == ["correct",
                                                                          "misclassified"]),
    ("w_method", "ablation", lambda spec: spec["layout"]["title"]["text"].startswith("ablation")),
    ("w_reduce", "mean_abs", lambda spec: "mean |·|" in spec["layout"]["title"]["text"]),
    ("w_target", "predicted", None),
    ("w_batch", 32, None),
]


@pytest.mark.parametrize("key,value,check", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_each_sidebar_control_updates_the_charts(key, value, check):
    app = run_app()
    before = figure(app, "score per cluster")
    sidebar_widget(app, key).set_value(value).run()
    assert_clean(app)
    after = figure(app, "score per cluster")
    if check is not None:
        assert check(after)
    if key == "w_batch":  # results do not depend on the batch size
        np.testing.assert_allclose(values(after["data"][0]["z"]), values(before["data"][0]["z"]),
                                   rtol=1e-4)
    else:
        assert after["data"][0] != before["data"][0]
    assert app.query_params[url.URL_KEYS[key]] == str(value)


def test_compare_with_never_offers_the_main_method():
    app = run_app()
    assert sidebar_widget(app, "w_compare").value == ["gradient", "ablation"]
    sidebar_widget(app, "w_method").set_value("gradient").run()
    compare = sidebar_widget(app, "w_compare")
    assert "gradient" not in compare.options and compare.value == ["ablation"]
    panels = figure(app, "under each method")["layout"]["annotations"]
    assert [a["text"] for a in panels] == ["gradient", "ablation"]
    app = run_app({"method": "ablation", "compare": "ablation,activation"})  # a link too
    assert sidebar_widget(app, "w_compare").value == ["activation"]


def test_cluster_compare_fixed_class_and_kmeans_controls():
    app = run_app()
    bars = figure(app, "Highest 16")
    sidebar_widget(app, "w_cluster").set_value(7).run()
    assert figure(app, "Highest 16")["data"][0] != bars["data"][0]
    assert figure(app, "Each sample of cluster 7 (seven)")
    sidebar_widget(app, "w_compare").set_value(["activation"]).run()
    panels = figure(app, "under each method")["layout"]["annotations"]
    assert [a["text"] for a in panels] == ["gradient × activation", "activation"]
    sidebar_widget(app, "w_target").set_value("fixed").run()
    before = figure(app, "score per cluster")["data"][0]["z"]
    sidebar_widget(app, "w_class").set_value(4).run()
    assert figure(app, "score per cluster")["data"][0]["z"] != before
    sidebar_widget(app, "w_cluster_by").set_value("kmeans_inputs").run()
    assert len(figure(app, "score per cluster")["data"][0]["y"]) == 8
    sidebar_widget(app, "w_k").set_value(3).run()
    assert_clean(app)
    assert len(figure(app, "score per cluster")["data"][0]["y"]) == 3
    assert app.query_params["k"] == "3"


def test_metric_choices_are_the_engine_metrics():
    assert set(analysis.METRIC_LABELS) == set(METRICS)


def test_page_controls_update_the_charts():
    app = run_app()
    app.slider(key="top_n").set_value(5).run()
    assert len(values(figure(app, "Highest 5")["data"][0]["y"])) == 5
    top = figure(app, "Highest 5")["data"][0]["x"]
    app.toggle(key="show_bottom").set_value(True).run()
    assert values(figure(app, "Lowest 5")["data"][0]["x"]).max() <= values(top).min()
    app.switch_page("pages/pruning.py").run()
    app.selectbox(key="w_metric").set_value("loss").run()
    assert_clean(app)
    assert figure(app, "neurons are removed")["layout"]["yaxis"]["title"]["text"] == \
        plots.METRIC_AXES["loss"]
    app.select_slider(key="w_random").set_value(5).run()
    assert app.query_params["random"] == "5" and app.query_params["metric"] == "loss"
    app.switch_page("pages/diagnosis.py").run()
    app.selectbox(key="histogram_neuron").set_value(3).run()
    assert figure(app, "Neuron 3")


def test_a_link_reproduces_the_view():
    query = {"layer": "fc2", "method": "ablation", "reduce": "mean_abs", "cluster": "5",
             "compare": "activation", "target": "predicted", "batch": "64"}
    app = run_app(query)
    assert_clean(app)
    assert figure(app, "score per cluster")["layout"]["title"]["text"] == \
        "ablation score per cluster (mean |·|)"
    assert sidebar_widget(app, "w_cluster").value == 5
    assert sidebar_widget(app, "w_batch").value == 64
    for param, value in query.items():
        assert app.query_params[param] == value


def test_a_bad_link_falls_back_to_defaults():
    app = run_app({"layer": "<script>", "method": "nonsense", "cluster": "99", "k": "x"})
    assert_clean(app)
    assert sidebar_widget(app, "w_layer").value == "relu2"
    assert sidebar_widget(app, "w_method").value == "gradient_x_activation"


@pytest.mark.parametrize("page,title", [("pages/pruning.py", "Pruning curves")])
def test_a_link_to_a_page_opened_before_app_py_ever_ran_shows_that_page(page, title):
    """Before st.navigation ever ran (a fresh server; AppTest on every run) Streamlit runs a
    pages/ script alone for its address: the page must run app.py, with the link's settings."""
    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params.update({"layer": "relu1", "method": "ablation", "random": "5"})
    app.switch_page(page).run()
    assert_clean(app)
    assert [t.value for t in app.title] == [title]
    assert sidebar_widget(app, "w_layer").value == "relu1"
    assert sidebar_widget(app, "w_method").value == "ablation"
    assert app.query_params["layer"] == "relu1" and app.query_params["random"] == "5"


# ------------------------------------------------------------------ uploads

def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _digits() -> tuple[np.ndarray, np.ndarray]:
    with np.load(DEMO_DIR / "digits.npz") as archive:
        return archive["inputs"], archive["labels"]


def _torch_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _parquet() -> bytes:
    buffer = io.BytesIO()
    pd.read_csv(DEMO_DIR / "digits_sample.csv").to_parquet(buffer)
    return buffer.getvalue()


GOOD_UPLOADS = {  # name: (model, architecture, data, samples)
    "pt2+npz": (GOOD_MODEL, None, GOOD_DATA, 719),
    "state_dict+json+csv": (("w.pt", demo_bytes("digits_mlp_state_dict.pt"), OCTET),
                            ("a.json", demo_bytes("digits_mlp_architecture.json"), "text/json"),
                            ("d.csv", demo_bytes("digits_sample.csv"), "text/csv"), 200),
    "safetensors+yaml+image_npz": (
        ("w.safetensors", demo_bytes("digits_cnn_state_dict.safetensors"), OCTET),
        ("a.yaml", demo_bytes("digits_cnn_architecture.yaml"), "text/yaml"),
        ("d.npz", demo_bytes("digits_images.npz"), OCTET), 719),
    "pt2+pt_data": (("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET), None,
                    ("d.pt", _torch_bytes({"inputs": torch.from_numpy(_digits()[0]),
                                           "labels": torch.from_numpy(_digits()[1])}), OCTET),
                    719),
    "pt2+parquet": (("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET), None,
                    ("d.parquet", _parquet(), OCTET), 200),
    "pt2+npy_without_labels": (("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET), None,
                               ("d.npy", (lambda b: (np.save(b, _digits()[0][:300]),
                                                     b.getvalue())[1])(io.BytesIO()), OCTET),
                               300),
}


@pytest.mark.parametrize("name", list(GOOD_UPLOADS))
def test_upload_of_each_supported_format(name):
    model, architecture, data, samples = GOOD_UPLOADS[name]
    app = upload(run_app(), model, data, architecture)
    assert_clean(app)
    assert not app.error, [e.value for e in app.error]
    assert sidebar_widget(app, "w_source").value == workspace.UPLOAD
    assert app.metric[0].value == str(samples)
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    heatmap = figure(app, "score per cluster")["data"][0]
    assert np.isfinite(values(heatmap["z"])).all()
    if name == "pt2+npy_without_labels":  # no labels: the predicted class and its clusters
        assert sidebar_widget(app, "w_target").value == "predicted"
        assert sidebar_widget(app, "w_cluster_by").value == "predicted"


def test_a_model_of_token_ids_works_on_every_page(tmp_path):
    token_files(tmp_path, n=60)
    app = upload(run_app(), ("t.pt2", (tmp_path / "tokens.pt2").read_bytes(), OCTET),
                 ("t.npz", (tmp_path / "tokens.npz").read_bytes(), OCTET))
    assert_clean(app)
    assert not app.error, [e.value for e in app.error]
    for page in app_pages(leave_out=("pages/data.py",)):  # uploaded there
        app.switch_page(page).run()
        assert_clean(app)
        assert not app.error, (page, [e.value for e in app.error])
    app.switch_page("pages/diagnosis.py").run()  # its oracle table
    model = app.session_state["context"].ws.model
    labels = [plots.method_label(m)  # no conductance, nor bn_scale: fc1 is a Linear; no lrp:
              for m in at.methods_for(torch.int64, "Linear", model)]  # no rule for Embedding
    assert "LRP (ε)" not in labels and len(labels) == len(at.methods_for(torch.int64,
                                                                          "Linear")) - 1
    assert sidebar_widget(app, "w_method").options == labels
    assert app.dataframe[0].value["method"].tolist() == labels  # the oracle table
    assert any(c.value.replace("\\", "").startswith(
        "LRP (ε) is left out: lrp: Captum's LRP has no default rule for module 'embed' "
        "(Embedding)") for c in app.caption)
    sidebar_widget(app, "w_layer").set_value("fc2")  # 3 neurons: the logits of 3 classes
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    bars = figure(app, "Highest 3 neurons")["data"][0]
    assert len(values(bars["x"] if bars.get("orientation") != "h" else bars["y"])) == 3


def test_a_link_to_an_uploaded_models_view_waits_for_the_upload(tmp_path):
    token_files(tmp_path, n=60)
    link = {"source": "upload", "layer": "embed", "cluster_by": "label", "cluster": "2",
            "method": "ablation"}
    app = run_app(link)
    assert_clean(app)
    assert [i.value for i in app.sidebar.info if "upload the same model and data" in i.value]
    app = upload(app, ("t.pt2", (tmp_path / "tokens.pt2").read_bytes(), OCTET),
                 ("t.npz", (tmp_path / "tokens.npz").read_bytes(), OCTET))
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    assert {key: sidebar_widget(app, key).value for key in ("w_layer", "w_cluster", "w_method")
            } == {"w_layer": "embed", "w_cluster": 2, "w_method": "ablation"}
    assert dict(app.query_params)["layer"] == "embed" and not app.sidebar.info


def _wide_layer_on_the_pruning_page(tmp_path, query: dict):
    """An uploaded 4-300-3 MLP (.pt2) and 60 samples, its 300-unit layer '0' on the Pruning
    page, with the URL parameters `query`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 300), nn.ReLU(), nn.Linear(300, 3)).eval()
    x = torch.randn(60, 4)
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "m.pt2")
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), labels=(torch.arange(60) % 3).numpy())
    app = upload(run_app(query), ("m.pt2", (tmp_path / "m.pt2").read_bytes(), OCTET),
                 ("d.npz", (tmp_path / "d.npz").read_bytes(), OCTET))
    sidebar_widget(app, "w_layer").set_value("0")
    return app.switch_page("pages/pruning.py").run()


def test_a_wide_layer_gets_a_curve_over_evenly_spaced_k(tmp_path):
    app = _wide_layer_on_the_pruning_page(tmp_path, {})
    assert_clean(app)
    curves = app.session_state["curves"][app.session_state["context"].curve_key()]
    assert curves[curves["subset"] == "cluster"]["k"].tolist() == spaced_ks(300, 128)


class NaNForZeroFirstFeature(nn.Module):
    """Logits times x0 / x0: NaN for a sample whose first feature is exactly 0."""

    def __init__(self):
        super().__init__()
        self.fc, self.relu, self.head = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.relu(self.fc(x))) * (x[:, :1] / x[:, :1])


def test_a_sample_with_nan_logits_is_reported_on_the_scores_page(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(60, 4)
    x[0, 0] = 0.0
    labels = torch.arange(60) // 20
    program = torch.export.export(NaNForZeroFirstFeature().eval(), (x[1:5],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "m.pt2")
    np.savez(tmp_path / "d.npz", inputs=x.numpy(), labels=labels.numpy())
    app = upload(run_app(), ("m.pt2", (tmp_path / "m.pt2").read_bytes(), OCTET),
                 ("d.npz", (tmp_path / "d.npz").read_bytes(), OCTET))
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    assert [w.value for w in app.warning if w.value.startswith("1 sample(s) have scores")]
    assert len(app.dataframe[0].value) == 8  # the table keeps every neuron, NaN and all


def _torchscript() -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(nn.Linear(64, 10)), buffer)
    return buffer.getvalue()


def _csv(columns: int) -> bytes:
    frame = pd.DataFrame(np.zeros((5, columns)), columns=[f"f{i}" for i in range(columns)])
    return frame.assign(label=1).to_csv(index=False).encode()


STATE_DICT = ("w.pt", demo_bytes("digits_mlp_state_dict.pt"), OCTET)
BAD_UPLOADS = {  # name: (model, architecture, data, words the message must contain)
    "empty model": (("m.pt2", b"", OCTET), None, GOOD_DATA, "empty"),
    "truncated pt2": (("m.pt2", demo_bytes("digits_mlp.pt2")[:4000], OCTET), None, GOOD_DATA,
                      ""),
    "image renamed .pt": (("m.pt", b"\x89PNG\r\n\x1a\n" + bytes(200), OCTET), None, GOOD_DATA,
                          "PNG"),
    "pickled module": (("m.pt", _torch_bytes(nn.Linear(64, 10)), OCTET), None, GOOD_DATA,
                       "torch.export"),
    "torchscript": (("m.pt", _torchscript(), OCTET), None, GOOD_DATA, "TorchScript"),
    "state dict without architecture": (STATE_DICT, None, GOOD_DATA, "architecture"),
    "architecture does not match": (STATE_DICT, ("a.yaml",
                                                 demo_bytes("digits_cnn_architecture.yaml"),
                                                 "text/yaml"), GOOD_DATA, ""),
    "empty data": (GOOD_MODEL, None, ("d.csv", b"", "text/csv"), "empty"),
    "wrong feature count": (GOOD_MODEL, None, ("d.csv", _csv(10), "text/csv"), "64"),
    "labels out of range": (GOOD_MODEL, None, ("d.npz", _npz(inputs=_digits()[0],
                                                             labels=_digits()[1] + 5), OCTET),
                            "outside"),
    "NaN in inputs": (GOOD_MODEL, None, ("d.npz", _npz(inputs=np.full((4, 64), np.nan,
                                                                      np.float32)), OCTET),
                      "NaN"),
    "csv without header": (GOOD_MODEL, None, ("d.csv", b"1,2,3\n4,5,6\n", "text/csv"),
                           "header"),
}


@pytest.mark.parametrize("name", list(BAD_UPLOADS))
def test_each_bad_upload_shows_a_message_and_the_app_keeps_working(name):
    model, architecture, data, words = BAD_UPLOADS[name]
    app = upload(run_app(), model, data, architecture)
    assert_clean(app)
    assert len(app.error) == 1
    message = app.error[0].value.replace("\\", "")  # markdown escapes of the plain text
    recipe = " ".join(code.value for code in app.code)  # lines after the first, as code
    assert message.startswith("These files could not be used:")
    assert words in message + recipe
    assert "Traceback" not in message
    assert sidebar_widget(app, "w_source").value == "digits_mlp"
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    assert figure(app, "score per cluster")


def test_file_names_are_shown_as_plain_text():
    evil = "[link](http://example.invalid)<img src=x onerror=alert(1)>"
    model, _, data, _ = GOOD_UPLOADS["pt2+npz"]
    app = upload(run_app(), (evil + ".pt2", model[1], OCTET), (evil + ".npz", data[1], OCTET))
    assert_clean(app)
    assert [t.value for t in app.text] == [f"{evil}.pt2 + {evil}.npz"]  # st.text: no markup
    app.switch_page("pages/scores.py").run()
    captions = [c.value for c in app.caption if "example" in c.value]
    assert captions and all("\\[link\\]\\(http" in c and "\\<img" in c for c in captions)


def test_bad_own_gradient_file_is_reported_and_a_good_one_checked():
    app = run_app()
    app.switch_page("pages/diagnosis.py").run()
    app.file_uploader(key="user_scores").set_value(("g.npy", b"not an array", OCTET)).run()
    assert_clean(app)
    assert [e.value for e in app.error if e.value.startswith("Your scores file could not be "
                                                             "read")]
    ctx = app.session_state["context"]
    engine = ctx.scores("gradient_x_activation")[ctx.focus]
    buffer = io.BytesIO()
    np.save(buffer, engine)
    app.file_uploader(key="user_scores").set_value(("g.npy", buffer.getvalue(), OCTET)).run()
    assert_clean(app)
    capture = [a.value for a in app.success if "Your own scores match the engine" in a.value]
    assert len(capture) == 1


# ------------------------------------------------------------------ interrupted work

def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def test_stop_mid_computation_leaves_the_cached_model_untouched(monkeypatch):
    loaded, _ = workspace._demo("digits_cnn")  # the app's cached object itself
    model = loaded.module
    model.train()  # a mode the engine must restore, not just "eval"
    modes = [m.training for m in model.modules()]
    params = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        app = run_app({"source": "digits_cnn", "layer": "relu3", "random": "100"})
        app.switch_page("pages/pruning.py")
        with monkeypatch.context() as patch:
            stop_at_first_points(patch)
            app.run(timeout=120)  # the stop is raised inside the engine's progress call
        key = app.session_state["context"].curve_key()
        assert key in app.session_state["partial_curves"]  # some points were computed
        assert key not in app.session_state["curves"]  # but not the whole curve
        assert _hooks(model) == 0
        assert [m.training for m in model.modules()] == modes
        assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
        app.run(timeout=120)  # a rerun finishes the same computation
        assert_clean(app)
        assert key in app.session_state["curves"]
        assert _hooks(model) == 0 and [m.training for m in model.modules()] == modes
    finally:
        model.eval()


def test_stop_button_keeps_the_points_computed_so_far():
    app = run_app()
    app.switch_page("pages/pruning.py").run()
    key = app.session_state["context"].curve_key()
    partial = app.session_state["curves"][key].iloc[:5]
    del app.session_state["curves"][key]
    app.session_state["stopped_curves"][key] = partial
    app.run()
    assert_clean(app)
    assert [b.label for b in app.button] == ["Continue the curve"]
    ranked = [t for t in figure(app, "neurons are removed")["data"]
              if t.get("name") == plots.CURVE_LABELS["ranked"]]
    assert len(values(ranked[0]["x"])) == 5
    app.button[0].click().run()
    assert key in app.session_state["curves"]
    assert [b.label for b in app.button] == [  # no curve button left: the take-away's only
        "Prepare the model with the 8 lowest-ranked neurons removed"]


def unescaped(text: str) -> str:
    """Markdown text as it reads on screen (backslash escapes removed)."""
    return re.sub(r"\\(.)", r"\1", text)


def assert_cluster_options_of(app: AppTest, clusters: np.ndarray) -> None:
    """Every option label of the Cluster box names a cluster of `clusters` with its size."""
    ids, counts = np.unique(clusters, return_counts=True)
    options = sidebar_widget(app, "w_cluster").options
    assert len(options) == len(ids)
    for option, cluster, count in zip(options, ids.tolist(), counts.tolist()):
        assert option.startswith(f"{cluster}") and f" · {count} samples" in option, option


def test_a_cluster_that_does_not_exist_in_the_new_partition_is_replaced_visibly():
    app = run_app()
    sidebar_widget(app, "w_cluster").set_value(7).run()
    sidebar_widget(app, "w_cluster_by").set_value("kmeans_inputs").run()
    assert_clean(app)
    clusters = app.session_state["context"].clusters
    notice = ("Cluster 7 (seven) of true label does not exist in k-means on the inputs "
              f"(k = 8) ({len(np.unique(clusters))} clusters); showing cluster 0.")
    assert [unescaped(t.value) for t in app.toast] == [notice]
    assert [unescaped(w.value) for w in app.sidebar.warning] == [notice]
    assert sidebar_widget(app, "w_cluster").value == 0
    assert app.session_state["context"].settings.cluster == 0
    assert app.query_params["cluster"] == "0"
    assert_cluster_options_of(app, clusters)
    app.run()  # the box stays on this page (a rerun, a chart's click) ...
    assert [unescaped(w.value) for w in app.sidebar.warning] == [notice]
    app.switch_page("pages/pruning.py").run()  # the choice survives a page switch
    assert_clean(app)
    assert sidebar_widget(app, "w_cluster").value == 0 and app.query_params["cluster"] == "0"
    assert not app.toast
    assert not app.sidebar.warning  # ... but it does not follow the user to every page
    sidebar_widget(app, "w_cluster").set_value(5).run()  # a choice in this partition: no notice
    assert_clean(app)
    assert not app.sidebar.warning and app.session_state["context"].settings.cluster == 5
    sidebar_widget(app, "w_k").set_value(9).run()  # k-means with another k: another partition
    assert "Cluster 5 of k-means on the inputs (k = 8) does not exist in k-means on the " \
        "inputs (k = 9) (9 clusters); showing cluster 0." in [unescaped(t.value)
                                                               for t in app.toast]
    assert_cluster_options_of(app, app.session_state["context"].clusters)


def test_a_cluster_kept_when_it_exists_and_replaced_visibly_after_new_data():
    app = run_app()
    sidebar_widget(app, "w_cluster").set_value(3).run()
    sidebar_widget(app, "w_cluster_by").set_value("predicted").run()  # class 3 is predicted too
    assert_clean(app)
    assert not app.toast and sidebar_widget(app, "w_cluster").value == 3
    assert_cluster_options_of(app, app.session_state["context"].clusters)
    app.switch_page("pages/pruning.py").run()  # the new labels are the widget's value now
    assert sidebar_widget(app, "w_cluster").value == 3 and app.query_params["cluster"] == "3"
    sidebar_widget(app, "w_cluster_by").set_value("label").run()
    inputs, labels = _digits()
    without_three = labels != 3
    app = upload(app, ("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET),
                 ("d.npz", _npz(inputs=inputs[without_three], labels=labels[without_three]),
                  OCTET))
    assert_clean(app)
    toasts = [unescaped(t.value) for t in app.toast]
    assert toasts == ["Cluster 3 (three) of true label of Demo: digits MLP does not exist in "
                      "true label of m.pt2 + d.npz (9 clusters); showing cluster "
                      "0 (zero)."], toasts
    assert sidebar_widget(app, "w_cluster").value == 0
    assert_cluster_options_of(app, app.session_state["context"].clusters)


def test_export_page_pruning_page_and_report_compute_identical_curves(tmp_path):
    """One set of settings, one answer: on a wide layer the Pruning page evaluates evenly
    spaced k, and the Share & export page and the report compute the same curve under the
    same key (the same k and the same seed)."""
    app = _wide_layer_on_the_pruning_page(tmp_path, {"random": "5"})
    assert_clean(app)
    ctx = app.session_state["context"]
    key = ctx.curve_key()
    on_pruning_page = app.session_state["curves"][key]
    app.session_state["curves"] = {}  # the export page computes its own
    app.switch_page("pages/export.py").run()
    next(b for b in app.button if b.label == "Build report").click().run()
    assert_clean(app)
    on_export_page = app.session_state["curves"][key]
    in_report = collect_report(ctx.ws.loaded, ctx.ws.data, ctx.settings).curves
    assert on_pruning_page["k"].nunique() == len(ctx.settings.curve_ks(300)) < 301
    for other in (on_export_page, in_report):
        pd.testing.assert_frame_equal(other, on_pruning_page)


HOSTILE = ("![x](http://attacker.example/t.png)", "[click](https://attacker.example)",
           "<img src=x onerror=alert(1)>", "=HYPERLINK(\"http://attacker.example\")",
           "**bold** _it_ `code` :red[red] $x^2$")
LIVE_MARKUP = re.compile(r"(?<!\\)\]\(|(?<!\\)<\s*[a-zA-Z/]|(?<![\\/])https?(?<!\\):")


def _hostile_upload(tmp_path) -> AppTest:
    """The digits model with data whose class names and cluster ids are markup."""
    inputs, labels = _digits()
    names = [HOSTILE[i % len(HOSTILE)] + f" {i}" for i in range(10)]
    clusters = np.array([HOSTILE[i % len(HOSTILE)] for i in range(len(labels))])
    return upload(run_app({"cluster_by": "provided"}),
                  ("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET),
                  ("d.npz", _npz(inputs=inputs, labels=labels, clusters=clusters,
                                 class_names=np.array(names)), OCTET))


def _markdown_texts(app: AppTest) -> list[str]:
    """The text of every element Streamlit renders as Markdown (tables' cells included)."""
    texts = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "toast",
                 "title", "header", "subheader", "exception"):
        texts += [str(element.value) for element in getattr(app, kind)]
    for table in app.table:
        texts += [str(v) for v in np.ravel(table.value.to_numpy())] + \
            [str(v) for v in table.value.index] + [str(v) for v in table.value.columns]
    return texts


def _figure_texts(app: AppTest) -> list[str]:
    """Every string of every plotly figure (titles, tick labels, hover templates...)."""
    found = []

    def walk(value) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for spec in figures(app).values():
        walk(spec)
    return found


@pytest.mark.parametrize("page", ("pages/scores.py", "pages/neuron.py") + PAGES)
def test_names_from_the_data_are_never_rendered_as_markup(tmp_path, page):
    """Class names and cluster ids of an upload reach every page as plain text: no live link,
    image, HTML tag or formatting in Markdown-rendered elements, no tag in plotly's HTML-like
    text."""
    app = _hostile_upload(tmp_path)
    sidebar_widget(app, "w_cluster").set_value(HOSTILE[0]).run()
    sidebar_widget(app, "w_target").set_value("fixed").run()
    app.switch_page(page).run()
    if page == "pages/export.py":
        next(b for b in app.button if b.label == "Build report").click().run()
    assert_clean(app)
    assert app.session_state["context"].settings.cluster == HOSTILE[0]
    texts = _markdown_texts(app)
    assert any("attacker" in text or "HYPERLINK" in text for text in texts + [
        str(v) for frame in app.dataframe for v in np.ravel(frame.value.to_numpy())]), \
        "the hostile names should be shown (as text)"
    for text in texts:
        assert not LIVE_MARKUP.search(text), text
        assert "**bold**" not in text and ":red[" not in text, text
    for text in _figure_texts(app):
        assert not re.search(r"<\s*(img|a|script)\b", text, re.IGNORECASE), text


SCREEN_ONLY = re.compile(r"reduce=|metric=|mean_abs|target_logit|gradient_x_activation|"
                         r"sign_cancellation|integrated_gradients")


def test_words_on_the_scores_and_diagnosis_pages_match_the_numbers_and_the_sidebar():
    """In mean |·| mode the heatmap caption does not describe signed colours and
    the samples heatmap ranks neurons by mean |·|; findings speak the sidebar's words."""
    app = run_app({"reduce": "mean_abs", "method": "gradient"})
    assert_clean(app)
    heatmap_caption = next(c.value for c in app.caption if c.value.startswith("Each cell"))
    assert "mean |·| score" in heatmap_caption and "Signed scores" not in heatmap_caption
    ctx = app.session_state["context"]
    focus = ctx.scores("gradient")[ctx.focus]
    expected = np.argsort(-np.abs(focus).mean(axis=0), kind="stable")
    shown = figure(app, "Each sample of cluster")["data"][0]["x"]
    assert [int(n) for n in shown] == expected.tolist()
    app.switch_page("pages/diagnosis.py").run()
    assert_clean(app)
    sidebar_widget(app, "w_reduce").set_value("mean").run()
    assert_clean(app)
    texts = [e.value for kind in ("error", "warning", "success", "info", "markdown", "caption")
             for e in getattr(app, kind)]
    assert any("target logit, area under the curve)" in unescaped(text) for text in texts)
    for text in texts:
        assert not SCREEN_ONLY.search(unescaped(text)), text


def test_the_pruning_page_hands_over_the_model_its_curve_describes():
    """Pick k on the finished curve, prepare the file, and the .pt2 offered for download
    measures on each subset what the curve's blue line (bottom-k) says at that k."""
    app = run_app({"metric": "target_logit"})
    app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    ctx = app.session_state["context"]
    curves = app.session_state["curves"][ctx.curve_key()]
    assert not any(b.label.startswith("Download") for b in app.get("download_button"))
    app.select_slider(key=f"prune_k_{ctx.n_neurons}").set_value(5).run()
    prepare = next(b for b in app.button if b.label.startswith("Prepare the model"))
    assert prepare.label == "Prepare the model with the 5 lowest-ranked neurons removed"
    prepare.click().run()
    assert_clean(app)
    downloads = app.get("download_button")
    assert [d.proto.label for d in downloads] == [
        "Download this model with the 5 lowest-ranked neurons removed"]
    (key, k), data = app.session_state["pruned_file"]
    assert (key, k) == (ctx.curve_key(), 5)
    pruned = at.load_model(data)
    assert pruned.class_names == ctx.ws.class_names
    focus = torch.from_numpy(ctx.focus)
    for subset, rows in (("cluster", focus), ("rest", ~focus)):
        expected = curves[(curves["subset"] == subset) & (curves["k"] == 5)]["bottom"].item()
        measured = at.model_metric(pruned.module, ctx.ws.data.inputs[rows],
                                   ctx.targets[rows], "target_logit")
        assert measured == pytest.approx(expected, abs=1e-5), subset
    app.run()  # the prepared file stays offered until the curve or k changes
    assert len(app.get("download_button")) == 1


def test_the_pruning_page_warns_where_removing_the_bottom_does_more_damage_than_random():
    """On the demo, class 0's signed-mean bottom neurons matter to the other classes: at some
    k removing them lowers the rest's target logit below the random band. The page warns at
    exactly the (k, subset) where `curve_checks` finds that, and nowhere else."""
    app = run_app({"metric": "target_logit"})
    app.switch_page("pages/pruning.py").run()
    ctx = app.session_state["context"]
    curves = app.session_state["curves"][ctx.curve_key()]
    damaged = {int(k): sorted(subset for subset, check in at.curve_checks(curves, int(k)).items()
                              if check.damaged) for k in curves["k"].unique()}
    assert any(damaged.values()) and not all(damaged.values())
    for k in (min(k for k, found in damaged.items() if found),
              min(k for k, found in damaged.items() if not found and k > 0)):
        app.select_slider(key=f"prune_k_{ctx.n_neurons}").set_value(k).run()
        assert_clean(app)
        warned = [w.value for w in app.warning if "more damage than removing" in w.value]
        assert len(warned) == len(damaged[k]), (k, warned)
        for subset, text in zip(damaged[k], warned):
            assert text.startswith({"cluster": "Cluster", "rest": "Rest"}[subset])
            assert f"Removing these {k} neurons" in unescaped(text)
