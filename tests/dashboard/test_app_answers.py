"""The dashboard answers through Streamlit's AppTest: the Diagnosis page's verdict
and remedies, the neuron view, and pruning curves that survive leaving the page."""
import io
import time
from dataclasses import replace

import numpy as np

from attribution.presentation import plots
from attribution.analyses.neuron import neuron_view
from attribution.analyses.verdict import CHECK_NAMES, verdict
from pages.shared.routing import NEURON_CHOICE
import attribution as at
from attribution.analyses import view as view_module
from tests.support.app import (OCTET, assert_clean, demo_bytes, figure, run_app,
                               sidebar_widget, stop_at_first_points, upload, values)
from tests.support.models import token_files

MIXED = {"cluster_by": "correctness", "method": "gradient"}  # "correct": every digit at once


def _record_resumes(monkeypatch) -> list:
    """The resume= of every curve the Pruning page computes from now on."""
    calls, real = [], view_module.cluster_pruning_curves

    def recording(*args, resume=None, **kwargs):
        calls.append(resume)
        return real(*args, resume=resume, **kwargs)

    monkeypatch.setattr(view_module, "cluster_pruning_curves", recording)
    return calls


def diagnosis(query: dict | None = None):
    app = run_app(query)
    app.switch_page("pages/diagnosis.py").run()
    assert_clean(app)
    return app


def alerts(app) -> list[tuple[str, str]]:
    """(kind, text) of every alert in the main area, in page order."""
    return [(node.type, node.value) for node in app.main
            if getattr(node, "type", None) in ("success", "warning", "error", "info")]


def verdict_text(app) -> tuple[str, str]:
    """The first alert of the page: the verdict."""
    return alerts(app)[0]


def ranked_curve(app) -> np.ndarray:
    traces = figure(app, "neurons are removed")["data"]
    ranked = [t for t in traces if t.get("name") == plots.CURVE_LABELS["ranked"]]
    return values(ranked[0]["y"])


def expected_verdict(app):
    ctx = app.session_state["context"]
    s = ctx.settings
    return verdict(ctx.findings(), method=s.method, reduce=s.reduce,
                   cluster_source=s.cluster_source)


def test_the_demo_opens_its_diagnosis_with_a_usable_verdict_and_no_remedy():
    app = diagnosis()
    kind, text = verdict_text(app)
    assert kind == "success" and text.startswith("**These scores are usable.**")
    assert expected_verdict(app).headline == "These scores are usable"
    assert not [b for b in app.button if b.key.startswith("remedy_")]
    names = [passed for passed, _ in CHECK_NAMES.values()]
    shown = [text for kind, text in alerts(app)[1:]]
    assert sum(any(text.startswith(f"**{name}**") for text in shown) for name in names) >= 6
    assert not any("✓" in text or "disagrees with ablation" in text for _, text in alerts(app))


def test_a_mixed_cluster_offers_only_the_remedies_measured_to_help_and_each_keeps_its_word():
    """Relu2, gradient, the 696 correctly classified digits: the signed mean cancels, yet the
    ranking still carries signal. Every remedy is tried first: mean |·| makes the verdict
    no better here and is not offered; gradient x activation and one-class clusters are,
    best first, each with the verdict it leads to and its measurements before -> after (the
    one-class view says which samples it compares). A click lands on that very view."""
    app = diagnosis(MIXED)
    kind, text = verdict_text(app)
    assert kind == "warning"
    assert "The signed mean cancels, yet the ranking still carries signal" in text
    ctx = app.session_state["context"]
    answer = expected_verdict(app)
    tried = ctx.tried_remedies(answer, ctx.findings())
    assert {t.remedy.value for t in tried} == {"label", "mean_abs", "gradient_x_activation"}
    helpful = [t for t in tried if t.improves]
    assert [t.remedy.value for t in helpful] == ["gradient_x_activation", "label"]
    buttons = [b for b in app.button if b.key.startswith("remedy_")]
    assert [b.label for b in buttons] == [t.remedy.label for t in helpful]
    previews = [m.value for m in app.markdown if m.value.startswith("→")]
    assert len(previews) == 2 and all("random orders beaten" in p for p in previews)
    assert "Compares the 72 samples of 7 \\(seven\\)" in previews[1]
    not_offered = next(t for t in tried if not t.improves)
    assert not_offered.remedy.value == "mean_abs"
    mix = figure(app, "What cluster correct mixes")["data"][0]
    assert len(values(mix["x"])) == 10  # every digit is among the correctly classified
    before = ranked_curve(app)

    app.button(key="remedy_cluster_source_label").click().run()
    assert_clean(app)
    assert sidebar_widget(app, "w_cluster_by").value == "label"
    assert sidebar_widget(app, "w_cluster").value == 7  # the class measured, not class 0
    assert app.query_params["cluster_by"] == "label"
    kind, text = verdict_text(app)
    assert text.startswith(f"**{helpful[1].after.headline}.**")  # as the preview said
    after = ranked_curve(app)
    assert after.shape != before.shape or not np.allclose(after, before)  # the curve moved
    comparison = [t for k, t in alerts(app) if t.startswith("Before the change")]
    assert comparison and "The signed mean cancels" in comparison[0]
    assert not [b for b in app.button if b.key.startswith("remedy_") and b.key != "remedy_undo"]

    app.button(key="remedy_undo").click().run()
    assert_clean(app)
    assert sidebar_widget(app, "w_cluster_by").value == "correctness"
    assert sidebar_widget(app, "w_cluster").value == "correct"
    assert "The signed mean cancels" in verdict_text(app)[1]

    app.button(key="remedy_method_gradient_x_activation").click().run()
    assert_clean(app)
    assert sidebar_widget(app, "w_method").value == "gradient_x_activation"
    assert verdict_text(app)[1].startswith(f"**{helpful[0].after.headline}.**")


def test_when_no_remedy_helps_the_page_says_so_and_lists_what_was_tried(monkeypatch):
    """Measurements in which every remedy leaves the verdict no better: no button is offered,
    the page says so, names each change tried with the verdict it led to, and gives the
    cause's own advice."""
    from pages.shared import context as context_module

    real = context_module.try_remedies
    monkeypatch.setattr(context_module, "try_remedies", lambda *args, **kwargs: tuple(
        replace(trial, improves=False) for trial in real(*args, **kwargs)))
    app = diagnosis(MIXED)
    assert not [b for b in app.button if b.key.startswith("remedy_")]
    assert any(m.value.startswith("**No remedy helps here.** Use mean") for m in app.markdown)
    tried = [c.value for c in app.caption if c.value.startswith("Tried and not offered")]
    assert tried and all(label in tried[0] for label in (  # markdown-escaped text
        "clusters \\(by true label\\)", "Average magnitudes", "gradient × activation"))


def test_a_wrong_shaped_scores_upload_is_explained_and_the_findings_stay():
    app = diagnosis()
    ctx = app.session_state["context"]
    wrong = np.zeros((int(ctx.focus.sum()) + 1, ctx.n_neurons), dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, wrong)
    app.file_uploader(key="user_scores").set_value(("mine.npy", buffer.getvalue(), OCTET)).run()
    assert_clean(app)
    errors = [e.value for e in app.error]
    assert any(e.startswith("Your scores were not checked") and "rows" in e for e in errors)
    assert verdict_text(app)[1].startswith("**These scores are usable.**")
    assert len([t for k, t in alerts(app) if k == "success"]) >= 6  # the checks are still shown


def test_the_own_code_check_offers_its_package_and_the_loop_for_this_layer_and_method():
    app = diagnosis({"target": "predicted", "layer": "relu1"})
    labels = [b.proto.label for b in app.get("download_button")]
    assert any("inputs, targets, labels, sample ids" in label for label in labels), labels
    snippet = [c.value for c in app.code if "register_forward_hook" in c.value]
    assert snippet and "get_submodule('relu1')" in snippet[0] and "(z * grad)" in snippet[0]


# ------------------------------------------------------------------ interrupted work

def _stalled_mid_curve(monkeypatch, random_orders: int):
    """The Pruning page on relu1, stopped after its first points: (app, the curve's key)."""
    app = run_app({"layer": "relu1", "random": str(random_orders)})
    app.switch_page("pages/pruning.py")
    with monkeypatch.context() as patch:
        stop_at_first_points(patch)
        app.run(timeout=120)
    return app, app.session_state["context"].curve_key()

def test_leaving_the_pruning_page_mid_curve_resumes_from_the_points_computed(monkeypatch):
    app, key = _stalled_mid_curve(monkeypatch, random_orders=100)
    kept = app.session_state["partial_curves"][key]
    assert 0 < kept["k"].nunique() < 33

    calls = _record_resumes(monkeypatch)
    app.switch_page("pages/scores.py").run()  # away ...
    assert_clean(app)
    app.switch_page("pages/pruning.py").run(timeout=120)  # ... and back
    assert_clean(app)
    assert len(calls) == 1 and calls[0] is kept  # resumed from the kept points
    assert key in app.session_state["curves"] and key not in app.session_state["partial_curves"]
    assert len(ranked_curve(app)) == 33


def test_a_stopped_curve_summarises_its_points_and_continues_from_them(monkeypatch):
    app, key = _stalled_mid_curve(monkeypatch, random_orders=50)
    partial = app.session_state["partial_curves"][key]
    app.session_state["stopped_curves"][key] = partial  # what the Stop button's callback does
    app.run()
    assert_clean(app)
    assert "In words, from the points computed so far" in [h.value for h in app.subheader]
    assert len(app.dataframe) == 1 and len(app.dataframe[0].value) == 2  # cluster, rest
    assert [b.label for b in app.button] == ["Continue the curve"]
    assert len(ranked_curve(app)) == partial["k"].nunique() < 33

    calls = _record_resumes(monkeypatch)
    app.button[0].click().run(timeout=120)
    assert_clean(app)
    assert len(calls) == 1 and calls[0] is partial
    assert key in app.session_state["curves"] and len(ranked_curve(app)) == 33


def test_a_curve_that_fails_says_why_once_and_can_be_tried_again(monkeypatch):
    app = run_app({"layer": "relu1"})
    app.switch_page("pages/pruning.py")

    def failing(*args, **kwargs):
        raise at.AttributionError("No memory left for the curve\nfree some and retry")

    with monkeypatch.context() as patch:
        patch.setattr(view_module, "cluster_pruning_curves", failing)
        app.run()  # one failure, shown by the rerun that ends the computing run
    assert_clean(app)
    assert [e.value for e in app.error] == ["No memory left for the curve"]
    assert [c.value for c in app.code] == ["free some and retry"]
    assert [b.label for b in app.button] == ["Try again"]
    assert not app.session_state["running_curves"]  # nothing for the stop watch to redraw

    calls = _record_resumes(monkeypatch)
    app.button[0].click().run(timeout=120)
    assert_clean(app)
    assert len(calls) == 1 and not app.error and len(ranked_curve(app)) == 33


def test_a_curve_that_crashes_shows_the_crash_not_a_stop(monkeypatch):
    app = run_app({"layer": "relu1"})
    app.switch_page("pages/pruning.py")

    def crashing(*args, **kwargs):
        raise RuntimeError("a bug in the curve")

    monkeypatch.setattr(view_module, "cluster_pruning_curves", crashing)
    app.run()
    assert len(app.exception) == 1  # (its details are for the server log: see config.toml)
    assert not app.session_state["running_curves"]  # the stop watch leaves the crash on screen
    assert not app.session_state["stopped_curves"]


# ------------------------------------------------------------------ the neuron view

def open_neuron_by_click(app, neuron: int):
    """What a click on a bar does (the chart's on_select callback): the neuron chosen and the
    Neuron page asked for; AppTest cannot click inside a plotly chart (the browser test does)."""
    app.session_state[NEURON_CHOICE] = neuron
    app.session_state["open_neuron"] = True
    started = time.monotonic()
    app.run()
    return time.monotonic() - started


def test_a_clicked_neuron_opens_with_its_removal_distributions_and_examples():
    app = run_app({"source": "digits_cnn", "layer": "conv2", "cluster": "3"})
    seconds = open_neuron_by_click(app, 5)
    assert_clean(app)
    assert [t.value for t in app.title] == ["Neuron 5 of conv2"]
    assert sidebar_widget(app, "w_source").value == "digits_cnn"  # the choices survive
    assert sidebar_widget(app, "w_cluster").value == 3
    assert app.query_params["neuron"] == "5" and app.query_params["layer"] == "conv2"
    ctx = app.session_state["context"]
    expected = neuron_view(ctx.ws.model, "conv2", ctx.ws.data.inputs, ctx.targets,
                           ctx.scores(ctx.settings.method), ctx.scores("activation"),
                           ctx.focus, 5).removal.set_index(["metric", "subset"])
    shown = {m.label: m.value for m in app.metric}
    assert shown["Cluster accuracy without it"] == \
        f"{expected.loc[('accuracy', 'cluster'), 'removed']:.1%}"
    images = figure(app, "the samples that activate it most")
    assert [t["type"] for t in images["data"]] == ["heatmap", "heatmap"]  # images, maps
    assert len(images["layout"]["annotations"]) == 2 * 8  # 8 most and 8 least, captioned
    figure(app, "each sample's score and activation")
    assert seconds < 30  # generous: AppTest on a shared machine; the browser test times it


def test_a_link_with_a_neuron_opens_it_and_the_heatmap_click_picks_the_cluster_too():
    app = run_app({"layer": "relu1", "neuron": "7"})
    app.switch_page("pages/neuron.py").run()
    assert_clean(app)
    assert [t.value for t in app.title] == ["Neuron 7 of relu1"]
    images = figure(app, "the samples that activate it most")["data"][0]
    assert np.asarray(images["z"], dtype=float).shape[1] == 8 * 9  # 8 tiles of 8 pixels, gaps
    app.selectbox(key="w_neuron").set_value(2).run()
    assert_clean(app)
    assert [t.value for t in app.title] == ["Neuron 2 of relu1"]
    assert app.query_params["neuron"] == "2"


def test_small_layers_show_every_neuron_and_a_bad_neuron_in_a_link_falls_back():
    app = run_app({"neuron": "99"})
    assert figure(app, "neurons by")["layout"]["title"]["text"].startswith("Highest 16 ")
    app.switch_page("pages/neuron.py").run()
    assert_clean(app)
    ctx = app.session_state["context"]
    top = int(np.argmax(ctx.scores(ctx.settings.method)[ctx.focus].mean(0)))
    assert [t.value for t in app.title] == [f"Neuron {top} of relu2"]


def test_a_token_models_neuron_shows_its_samples_as_tokens_with_per_token_outputs(tmp_path):
    _, ids, _ = token_files(tmp_path, n=60)
    app = upload(run_app(), ("t.pt2", (tmp_path / "tokens.pt2").read_bytes(), OCTET),
                 ("t.npz", (tmp_path / "tokens.npz").read_bytes(), OCTET))
    sidebar_widget(app, "w_layer").set_value("embed")
    app.switch_page("pages/scores.py").run()
    open_neuron_by_click(app, 3)
    assert_clean(app)
    assert [t.value for t in app.title] == ["Neuron 3 of embed"]
    tokens = figure(app, "tokens, coloured by their gradient × activation score")["data"][0]
    shown = np.asarray(tokens["text"])
    first = int(tokens["y"][0].split("#")[1].split()[0])  # "most · #12 · act 0.3"
    assert shown[0].tolist() == [str(i) for i in ids[first].tolist()]
    ctx = app.session_state["context"]
    per_token = at.token_scores(ctx.ws.model, "embed", ids[first:first + 1], 3,
                                ctx.targets[first:first + 1])
    np.testing.assert_allclose(values(tokens["z"])[0], per_token["score"], rtol=1e-5)
    np.testing.assert_allclose(per_token["score"].sum(), ctx.scores(ctx.settings.method)[first, 3],
                               rtol=1e-4)  # the token scores add up to the sample's score


def test_scores_from_a_loop_that_feeds_the_whole_batch_decide_the_verdict():
    app = diagnosis()
    ctx = app.session_state["context"]
    engine = ctx.scores(ctx.settings.method)[ctx.focus]
    buffer = io.BytesIO()
    np.save(buffer, engine / len(engine))  # seed 002's loop: every row averaged over [1, B, n]
    app.file_uploader(key="user_scores").set_value(("mine.npy", buffer.getvalue(), OCTET)).run()
    assert_clean(app)
    kind, text = verdict_text(app)
    assert kind == "error" and text.startswith("**Your hook code feeds the whole batch.**")
    assert f"divided by {len(engine)}" in text


def test_a_csv_reshaped_to_fit_the_model_says_so():
    app = upload(run_app(), ("w.safetensors", demo_bytes("digits_cnn_state_dict.safetensors"),
                             OCTET),
                 ("d.csv", demo_bytes("digits_sample.csv"), "text/csv"),
                 architecture=("a.yaml", demo_bytes("digits_cnn_architecture.yaml"),
                               "text/yaml"))
    assert_clean(app)
    ctx = app.session_state["context"]
    assert ctx.ws.data.reshaped_from == (64,) and tuple(ctx.ws.data.inputs.shape[1:]) == (1, 8, 8)
    notes = [i.value for i in app.info if "were reshaped" in i.value]
    assert notes and "[64]" in notes[0] and "[1, 8, 8]" in notes[0]
    app = upload(run_app(), ("w.safetensors", demo_bytes("digits_cnn_state_dict.safetensors"),
                             OCTET), ("d.npz", demo_bytes("digits_images.npz"), OCTET),
                 architecture=("a.yaml", demo_bytes("digits_cnn_architecture.yaml"),
                               "text/yaml"))
    assert not [i.value for i in app.info if "were reshaped" in i.value]  # already [1, 8, 8]
