"""Regression heads (a model with one output) as a first-class case: the score is the output
itself, with no class; the data's labels are true values (grouped by quartile), and pruning
curves measure the squared error against them, in the API, the command line and the app."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attribution as at
from attribution import cli
from attribution.analyses import settings as analysis
from attribution.analyses.clusters import QUARTILES, predictions, quartiles
from attribution.presentation import plots
from tests.support import references
from tests.support.app import (OCTET, assert_clean, figure, figures, run_app, sidebar_widget,
                               upload)


def regression_problem(n: int = 80, seed: int = 0):
    """(a 5-8-8-1 MLP in eval mode, inputs [n, 5], true values [n] near its outputs)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 1)).eval()
    x = torch.randn(n, 5)
    with torch.no_grad():
        values = model(x)[:, 0] + 0.1 * torch.randn(n)
    return model, x, values


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    model, x, values = regression_problem()
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "regression.pt2")
    np.savez(tmp_path / "regression.npz", inputs=x.numpy(), labels=values.numpy())
    return tmp_path / "regression.pt2", tmp_path / "regression.npz"


def test_the_score_is_the_output_itself_whatever_true_values_come_with_it():
    """One targets rule for scores and metrics: a regression head's true values [N] are
    taken wherever targets are (its score is its one output, as with None); a classifier
    refuses real values with what they would mean."""
    model, x, values = regression_problem()
    expected = references.per_sample_gradient(model, model[2], x, torch.zeros(len(x),
                                                                             dtype=torch.long))
    for targets in (None, values, values.numpy().astype(np.float64)):
        torch.testing.assert_close(at.neuron_scores(model, "2", x, targets, "gradient"),
                                   expected, rtol=1e-4, atol=1e-6)
    classifier = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    for call in (lambda: at.neuron_scores(classifier, "1", x, values, "gradient"),
                 lambda: at.pruning_curve(classifier, "1", x, values, torch.arange(6.0),
                                          n_random=2)):
        with pytest.raises(at.AttributionError, match="true values of a regression head "
                                                      r"\(one output\), which this model is not"):
            call()


def test_every_metric_defaults_to_the_heads_own_in_the_api():
    """Without metric=, curves, the check of a prune, the model's metric and the scorecard
    measure a regression head's squared error against its true values (its output without
    them), in the output's own units; a classifier's default stays accuracy."""
    model, x, values = regression_problem()
    ranking = torch.arange(8.0)
    with_values = at.pruning_curve(model, "3", x, values, ranking, ks=[0, 2], n_random=3)
    assert with_values.attrs["metric"] == "squared_error"
    pd.testing.assert_frame_equal(with_values, at.pruning_curve(
        model, "3", x, values, ranking, ks=[0, 2], n_random=3, metric="squared_error"))
    output = at.pruning_curve(model, "3", x, None, ranking, ks=[0, 2], n_random=3)
    assert output.attrs["metric"] == "target_logit"
    with torch.no_grad():
        assert output.loc[0, "ranked"] == pytest.approx(float(model(x).mean()), rel=1e-5)
    assert at.model_metric(model, x, values) == pytest.approx(with_values.loc[0, "ranked"])
    check = at.prune_check(model, "3", x, values, ranking, 2, n_random=3)
    assert check.metric == "squared_error" and check.after == pytest.approx(
        with_values.loc[1, "bottom"])
    card = at.scorecard(model, x, values, layers=["3"], methods=["gradient", "ablation",
                                                                 "random"], n_random=3)
    assert card.attrs["metric"] == "squared_error"
    assert card.set_index("method").loc["ablation", "curve_area"] == pytest.approx(1.0)
    tiny = next(f for f in at.diagnose(model, "3", x, values) if f.code == "tiny_scores")
    assert "output units" in tiny.message and "logits" not in tiny.message
    classifier = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    assert at.pruning_curve(classifier, "1", x, None, torch.arange(6.0),
                            n_random=2).attrs["metric"] == "accuracy"


def test_real_labels_are_true_values_for_a_regression_head_and_refused_for_a_classifier(files):
    model_path, data_path = files
    data = at.load_data(data_path)
    assert data.labels.dtype == torch.float32
    checked = at.check_data(data, at.load_model(model_path))
    torch.testing.assert_close(checked.labels, data.labels)
    whole = at.check_data(at.Dataset(data.inputs, labels=np.arange(80) % 4),
                          at.load_model(model_path))
    assert whole.labels.dtype == torch.float32  # whole numbers are values here too
    classifier = nn.Sequential(nn.Linear(5, 3)).eval()
    loaded = at.LoadedModel(classifier, (5,), 3)
    with pytest.raises(at.AttributionError, match="integer class ids; found .*regression head "
                                                  r"\(a model with one output\)"):
        at.check_data(data, loaded)


def test_clusters_are_quartiles_of_the_true_value_and_of_the_output():
    model, x, values = regression_problem()
    data = at.Dataset(x, labels=values)
    by_value = at.make_clusters("label", data, model)
    assert set(by_value) == set(QUARTILES) and (pd.Series(by_value).value_counts() == 20).all()
    order = np.argsort(values.numpy())
    assert (by_value[order[:20]] == "Q1 (lowest)").all()
    assert (by_value[order[-20:]] == "Q4 (highest)").all()
    outputs = model(x).detach()[:, 0].numpy()
    np.testing.assert_array_equal(at.make_clusters("predicted", data, model),
                                  quartiles(outputs))
    torch.testing.assert_close(predictions(model, x), torch.from_numpy(outputs))
    with pytest.raises(at.AttributionError, match="no class to be right or wrong about"):
        at.make_clusters("correctness", data, model)


def test_pruning_curves_measure_the_squared_error_against_the_true_values():
    model, x, values = regression_problem()
    scores = torch.arange(8.0)  # neuron 7 ranked first
    curve = at.pruning_curve(model, "3", x, values, scores, ks=[0, 1, 2], n_random=3,
                             metric="squared_error")
    with torch.no_grad():
        intact = float(((model(x)[:, 0] - values) ** 2).mean())
        hidden = model[:4](x)
        hidden[:, 7] = 0
        without_7 = float(((model[4:](hidden)[:, 0] - values) ** 2).mean())
    assert curve.loc[0, "ranked"] == pytest.approx(intact, rel=1e-5)
    assert curve.loc[1, "ranked"] == pytest.approx(without_7, rel=1e-5)
    assert at.model_metric(model, x, values, "squared_error") == pytest.approx(intact, rel=1e-5)
    summary = at.curve_summary(curve)  # the squared error rises as neurons go: damage > 0
    assert np.sign(summary["gap_vs_random"].iloc[0]) == np.sign(
        curve.loc[2, "ranked"] - curve.loc[2, "random_mean"])
    for metric in ("accuracy", "loss"):
        with pytest.raises(at.AttributionError, match="one output \\(a regression head\\)"):
            at.pruning_curve(model, "3", x, None, scores, n_random=2, metric=metric)
    with pytest.raises(at.AttributionError, match="pass the true values"):
        at.pruning_curve(model, "3", x, None, scores, n_random=2, metric="squared_error")
    classifier = nn.Sequential(nn.Linear(5, 3)).eval()
    with pytest.raises(at.AttributionError, match="squared_error measures a regression head"):
        at.pruning_curve(classifier, "0", x, values, torch.arange(3.0), n_random=2,
                         metric="squared_error")


def test_the_settings_of_a_regression_head():
    assert analysis.is_regression(1) and not analysis.is_regression(2)
    assert analysis.target_choices(True, regression=True) == ("predicted",)
    assert analysis.target_label("predicted", regression=True) == "the output"
    assert "correctness" not in analysis.cluster_source_choices(True, False, regression=True)
    assert analysis.cluster_source_label("label", regression=True) == "true value (quartiles)"
    assert analysis.metric_choices(regression=True) == ("target_logit", "squared_error")
    assert analysis.metric_choices(regression=True, has_labels=False) == ("target_logit",)
    assert "squared_error" not in analysis.metric_choices()
    layers = [at.LayerInfo("fc", "Linear", (8,), 1, 8)]
    settings = analysis.AnalysisSettings.for_data(layers, has_labels=True,
                                                  has_provided_clusters=False, regression=True)
    assert (settings.target, settings.metric, settings.cluster_source) == (
        "predicted", "squared_error", "label")
    values = torch.rand(4)
    assert settings.curve_targets(values, None) is values


def test_the_command_line_defaults_to_the_output_quartiles_and_squared_error(files, tmp_path):
    model_path, data_path = files
    common = ["--model", str(model_path), "--data", str(data_path), "--layer", "3", "--quiet"]
    assert cli.main(["score", *common, "--out", str(tmp_path / "s.csv")]) == 0
    table = pd.read_csv(tmp_path / "s.csv")
    assert sorted(table["cluster"].unique()) == list(QUARTILES)
    assert cli.main(["curve", *common, "--cluster", "Q4 (highest)", "--n-random", "3",
                     "--out", str(tmp_path / "c.csv"), "--summary", str(tmp_path / "c.json")]) == 0
    summary = json.loads((tmp_path / "c.json").read_text())
    assert summary["settings"]["metric"] == "squared_error"
    model, x, values = regression_problem()
    curve = pd.read_csv(tmp_path / "c.csv")
    rest = curve[(curve["subset"] == "rest") & (curve["k"] == 0)]["ranked"].iloc[0]
    rows = at.make_clusters("label", at.Dataset(x, labels=values)) != "Q4 (highest)"
    with torch.no_grad():
        expected = float(((model(x[rows])[:, 0] - values[rows]) ** 2).mean())
    assert rest == pytest.approx(expected, rel=1e-5)
    assert cli.main(["prune", *common, "--k", "3", "--out", str(tmp_path / "p.pt2"),
                     "--summary", str(tmp_path / "p.json")]) == 0
    pruned = json.loads((tmp_path / "p.json").read_text())
    assert pruned["metric"] == "squared_error" and pruned["before"] == pytest.approx(
        at.model_metric(model, x, values, "squared_error"), rel=1e-5)
    assert cli.main(["report", *common, "--n-random", "2",
                     "--out", str(tmp_path / "r.html")]) == 0
    report = (tmp_path / "r.html").read_text()
    assert "RMSE on this data" in report and "squared error" in report


def test_a_hugging_face_regression_head_scores_its_output(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                        intermediate_size=32, vocab_size=40, max_position_embeddings=32,
                        num_labels=1, problem_type="regression")
    BertForSequenceClassification(config).save_pretrained(tmp_path / "folder")
    loaded = at.load_model(tmp_path / "folder")
    assert loaded.n_classes == 1
    ids = torch.randint(1, 40, (12, 6))
    data = at.check_data(at.Dataset({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                    labels=np.linspace(-1, 1, 12)), loaded)
    assert data.labels.dtype == torch.float32
    scores = at.cluster_scores(loaded.module, "bert.pooler.dense", data.inputs, None,
                               at.make_clusters("label", data, loaded), "gradient_x_activation")
    assert list(scores.index) == list(QUARTILES) and np.isfinite(scores.to_numpy()).all()


def test_the_dashboard_takes_a_regression_head_on_every_page(files):
    model_path, data_path = files
    app = upload(run_app(), ("r.pt2", model_path.read_bytes(), OCTET),
                 ("r.npz", data_path.read_bytes(), OCTET))
    assert_clean(app)
    assert not app.error, [e.value for e in app.error]
    metrics = {metric.label: metric.value for metric in app.metric}
    assert metrics["Classes"] == "1 output" and "RMSE on this data" in metrics
    assert sidebar_widget(app, "w_target").options == ["the output"]
    assert sidebar_widget(app, "w_cluster_by").options == [
        "true value (quartiles)", "output (quartiles)", "k-means on the inputs",
        "k-means on the layer"]
    for page in ("pages/scores.py", "pages/pruning.py", "pages/diagnosis.py", "pages/neuron.py",
                 "pages/export.py"):
        app.switch_page(page).run()
        assert_clean(app)
        assert not app.error, (page, [e.value for e in app.error])
        drawn = json.dumps([spec["layout"] for spec in figures(app).values()])
        assert "logit" not in drawn, page  # its output, in output units
    app.switch_page("pages/pruning.py").run()
    measure = app.selectbox(key="w_metric")
    assert measure.options == ["output", "squared error"] and measure.value == "squared_error"
    app.switch_page("pages/neuron.py").run()
    assert [m.label for m in app.metric][1:] == [
        "Cluster squared error without it", "Rest squared error without it",
        "Cluster output without it"]
    figure(app, "the samples that activate it most")
    app.switch_page("pages/diagnosis.py").run()
    captions = " ".join(caption.value for caption in app.caption)
    assert "drop of the output" in captions and "target logit" not in captions
    app.switch_page("pages/trust.py").run()
    assert not app.error, [e.value for e in app.error]
    text = " ".join(block.value for block in app.markdown)
    assert "drop of the output" in text and "target logit" not in text


def test_a_regression_head_s_curves_are_drawn_in_output_units():
    curves = pd.DataFrame({"subset": "cluster", "k": [0, 1], "ranked": [1.0, 0.5],
                           "bottom": [1.0, 0.9], "random_mean": [1.0, 0.7],
                           "random_lo": [1.0, 0.6], "random_hi": [1.0, 0.8]})
    for one_output, title in ((True, "mean output (output units)"),
                              (False, "mean target logit (logits)")):
        figure = plots.pruning_figure(curves, n_neurons=4, metric="target_logit",
                                      one_output=one_output)
        assert figure.layout.yaxis.title.text == title


def test_a_regression_head_s_findings_name_its_output_not_a_logit():
    from tests.support.families import family

    model, x = family("regression")
    findings = at.diagnose(model, "1", x, None, clusters=np.arange(len(x)) % 2, n_random=4)
    screen = " ".join(finding.words(screen=True)[0] for finding in findings)
    assert "target logit" not in screen and "moves the output by" in screen
    assert "output units" in screen and "effect on the output" in screen
    api = " ".join(finding.message for finding in findings)
    assert "metric='target_logit'" in api  # the API's words name the metric as it is passed


def test_a_regression_head_s_scores_are_drawn_in_output_units():
    assert plots.method_units("gradient_x_activation") == "logits"
    assert plots.method_units("gradient_x_activation", one_output=True) == "output units"
    assert plots.method_units("ablation", one_output=True) == "output drop"
    summary = pd.DataFrame({"neuron": [0, 1], "score": [0.5, -0.2], "spread": [0.1, 0.1],
                            "n": [4, 4]})
    figure = plots.neuron_bars(summary, method="ablation", reduce="mean", one_output=True)
    assert "output drop" in figure.layout.xaxis.title.text
    assert "logit" not in figure.layout.xaxis.title.text
