"""The offline HTML report and its CSVs: content, self-containment, escaping."""
import csv
import html
import io
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from plotly.offline import get_plotlyjs

import attribution as at
from attribution.analyses import settings as analysis
from attribution.presentation import cells, plots
from attribution.presentation import report
from attribution.inputs.demo import load_demo
from attribution.analyses.findings import Finding

SETTINGS = report.AnalysisSettings(layer="relu2", method="gradient_x_activation",
                                   compare=("gradient",), cluster=3, n_random=5)
EVIL = "<script>alert('x')</script>"


@pytest.fixture(scope="module")
def demo():
    return load_demo("digits_mlp")


@pytest.fixture(scope="module")
def content(demo):
    loaded, dataset = demo
    steps = []
    result = report.collect_report(loaded, dataset, SETTINGS,
                                   progress=lambda fraction, what: steps.append(fraction))
    assert steps[0] == 0.0 and steps[-1] == 1.0 and steps == sorted(steps)
    return result


def steps_of(card: pd.DataFrame) -> dict[str, int]:
    """{"layer/method": steps} of a scorecard's path rows (planned to fit a budget)."""
    return {f"{row.layer}/{row.method}": int(row.n_steps) for row in card.itertuples()
            if not pd.isna(row.n_steps)}


@pytest.fixture(scope="module")
def page(content):
    return report.render_report(content)


def test_report_is_one_offline_document(page):
    assert page.startswith("<!DOCTYPE html>")
    assert get_plotlyjs() in page  # the chart library, inline
    rest = page.replace(get_plotlyjs(), "")
    assert "<script src" not in rest and "<link" not in rest
    assert not re.search(r"https?://", rest)


def test_report_shows_settings_facts_findings_and_charts(content, page):
    for label, value in {**content.settings, **content.facts}.items():
        assert f"<th>{html.escape(label)}</th><td>{html.escape(value)}</td>" in page
    assert content.facts["accuracy on this data"].endswith("%")
    assert len(content.findings) == 8
    for finding in content.findings:  # in the dashboard's words, as the settings table
        message, hint = finding.words(screen=True)
        assert html.escape(message) in page and html.escape(hint) in page
    assert "target logit, area under the curve" in page and "metric=" not in page
    # heatmap, ranked bars, method bars, rank correlation, pruning curves, the scorecard of
    # every layer, histogram, and the top neuron's samples as images (the demo's pixels
    # declare 8 x 8)
    assert page.count("Plotly.newPlot") == 8
    for sentence in content.curve_sentences:
        assert html.escape(sentence) in page
    assert "Verdict" in content.curve_sentences[-1]


def test_report_holds_the_scorecard_of_every_layer(demo, content, page):
    """The scorecard of the report's clusters and targets, as `at.scorecard` computes it, drawn
    and tabled, and written as scorecard.csv."""
    loaded, dataset = demo
    expected = at.scorecard(loaded.module, dataset.inputs, dataset.labels,
                            dataset.labels.numpy(), n_steps=steps_of(content.scorecard))
    pd.testing.assert_frame_equal(content.scorecard, expected)
    assert "Which method to trust, layer by layer" in page
    assert "<th>Spearman ρ</th>" in page
    written = pd.read_csv(io.StringIO(report.report_csvs(content)["scorecard.csv"]))
    pd.testing.assert_frame_equal(written, expected.reset_index(drop=True), check_dtype=False)


def test_report_content_matches_the_engine(demo, content):
    loaded, dataset = demo
    table = at.cluster_scores(loaded.module, "relu2", dataset.inputs, dataset.labels,
                              dataset.labels.numpy(), method="gradient")
    shown = content.cluster_scores[content.cluster_scores["method"] == "gradient"]
    row = shown[(shown["cluster"] == 3)].sort_values("neuron")["score"].to_numpy()
    np.testing.assert_allclose(row, table.loc[3].drop("n").to_numpy(dtype=float), rtol=1e-5)
    assert set(content.curves["subset"]) == {"cluster", "rest"}
    assert len(content.curves) == 2 * 17
    assert list(content.oracle["method"]) == ["gradient_x_activation", "gradient"]


def test_user_strings_are_escaped(content):
    evil_finding = Finding("sign_cancellation", "warning", EVIL, 0.1, EVIL)
    evil = replace(content, title=EVIL, cluster=EVIL,
                   settings={EVIL: EVIL}, facts={"model": EVIL}, findings=[evil_finding],
                   layers=pd.DataFrame({"layer": [EVIL], "type": ["Linear"], "neurons": [3],
                                        "output shape": ["3"]}),
                   cluster_scores=content.cluster_scores.replace(
                       {"cluster": {content.cluster_scores["cluster"].iloc[0]: EVIL}}))
    page = report.render_report(evil)
    assert "<script>alert" not in page
    # title twice, setting name and value, fact, finding message and hint, layer table,
    # plus chart labels (escaped for plotly inside the figures' JSON)
    assert page.count("&lt;script&gt;alert(") >= 8


def test_csvs_hold_every_table(content):
    tables = report.report_csvs(content)
    assert set(tables) == {"cluster_scores.csv", "neuron_summary.csv", "layers.csv",
                           "pruning_curves.csv", "curve_summary.csv", "oracle_agreement.csv",
                           "findings.csv", "scorecard.csv"}
    scores = pd.read_csv(io.StringIO(tables["cluster_scores.csv"]))
    pd.testing.assert_frame_equal(scores, content.cluster_scores.reset_index(drop=True),
                                  check_dtype=False)
    curves = pd.read_csv(io.StringIO(tables["pruning_curves.csv"]))
    np.testing.assert_allclose(curves["ranked"], content.curves["ranked"])
    findings = pd.read_csv(io.StringIO(tables["findings.csv"]))
    assert list(findings["code"]) == [f.code for f in content.findings]


def test_assemble_from_app_results_equals_collect(demo, content):
    loaded, dataset = demo
    per_sample = {m: at.neuron_scores(loaded.module, "relu2", dataset.inputs, dataset.labels,
                                      m).numpy() for m in SETTINGS.methods}
    assembled = report.assemble(
        replace(SETTINGS), title="t", facts={}, layers=loaded.layers(), per_sample=per_sample,
        clusters=dataset.labels.numpy(), curves=content.curves, class_names=dataset.class_names)
    pd.testing.assert_frame_equal(assembled.cluster_scores, content.cluster_scores)
    pd.testing.assert_frame_equal(assembled.neuron_summary, content.neuron_summary)
    assert assembled.curve_sentences == list(content.curve_sentences)


def test_collect_report_refuses_bad_settings(demo):
    loaded, dataset = demo
    for bad, words in ((replace(SETTINGS, layer="nope"), "Unknown layer"),
                       (replace(SETTINGS, method="nope"), "Unknown method"),
                       (replace(SETTINGS, cluster=42), "not among the cluster ids"),
                       (replace(SETTINGS, target="fixed", fixed_class=10), "0..9")):
        with pytest.raises(at.AttributionError, match=words):
            report.collect_report(loaded, dataset, bad)


def test_cluster_given_as_text_is_matched_and_none_means_the_first(demo):
    loaded, dataset = demo
    settings = replace(SETTINGS, compare=(), n_random=2)
    assert report.collect_report(loaded, dataset, replace(settings, cluster="7")).cluster == 7
    assert report.collect_report(loaded, dataset, replace(settings, cluster=None)).cluster == 0


def test_scoring_and_curve_targets(demo):
    _, dataset = demo
    assert replace(SETTINGS, target="predicted").targets(dataset) is None
    assert torch.equal(replace(SETTINGS, target="true").targets(dataset), dataset.labels)
    fixed_settings = replace(SETTINGS, target="fixed", fixed_class=4)
    fixed = fixed_settings.targets(dataset, n_classes=10)
    assert fixed.dtype == torch.long and set(fixed.tolist()) == {4}
    assert fixed_settings.curve_targets(dataset.labels, fixed) is dataset.labels
    assert replace(fixed_settings, metric="loss").curve_targets(dataset.labels, fixed) is fixed
    unlabelled = replace(dataset, labels=None)
    with pytest.raises(at.AttributionError, match="no labels"):
        SETTINGS.targets(unlabelled)
    with pytest.raises(at.AttributionError, match="0..9"):
        replace(SETTINGS, target="fixed", fixed_class=10).targets(dataset, n_classes=10)
    for bad, words in ((dict(reduce="median"), "Unknown reduce"),
                       (dict(target="all"), "Unknown target")):
        with pytest.raises(at.AttributionError, match=words):
            replace(SETTINGS, **bad)


def test_settings_decide_the_cluster_its_rows_and_the_curve_ks():
    clusters = np.array(["b", "a", "b", "c"])
    assert replace(SETTINGS, cluster=None).with_cluster_of(clusters).cluster == "a"
    settings = replace(SETTINGS, cluster="b").with_cluster_of(clusters)
    assert settings.cluster_rows(clusters).tolist() == [True, False, True, False]
    numbered = replace(SETTINGS, cluster="7").with_cluster_of(np.array([3, 7, 7]))
    assert numbered.cluster == 7 and type(numbered.cluster) is int
    with pytest.raises(at.AttributionError, match="'z' is not among the cluster ids"):
        replace(SETTINGS, cluster="z").with_cluster_of(clusters)
    for n_neurons in (16, analysis.CURVE_K_STEPS, 1000):
        ks = SETTINGS.curve_ks(n_neurons)
        assert ks[0] == 0 and ks[-1] == n_neurons
        assert len(ks) == min(n_neurons, analysis.CURVE_K_STEPS) + 1
    per_sample = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(settings.ranking(per_sample, clusters),
                               per_sample[[0, 2]].mean(axis=0))


def _summary(cluster_gap: float, rest_gap: float, beaten: float) -> pd.DataFrame:
    """A curve summary against 20 random orders, `beaten` of them beaten (no ties)."""
    p_value = (1 + 20 * (1 - beaten)) / 21
    return pd.DataFrame({"gap_vs_random": [cluster_gap, rest_gap],
                         "fraction_random_beaten": [beaten, 0.5], "p_value": [p_value, 0.5]},
                        index=pd.Index(["cluster", "rest"], name="subset"))


@pytest.mark.parametrize("cluster_gap,rest_gap,beaten,expected", [
    (0.25, 0.02, 1.0, ["lowers accuracy by 25.0 percentage points more", "100% of the 20",
                       "p = 0.048, the smallest 20 random orders can give",
                       "specifically for this cluster", "carry real information"]),
    (0.25, 0.20, 1.0, ["not specific to this cluster"]),
    (0.03, 0.0, 0.7, ["not clearly better than random", "(permutation p = 0.33)"]),
    (0.03, 0.0, 0.95, ["(permutation p = 0.095)", "carry real information"]),
    (0.03, 0.0, 0.9, ["(permutation p = 0.14)", "not clearly better than random"]),
    (-0.05, -0.01, 0.1, ["by 5.0 percentage points less", "no better than random"]),
])
def test_curve_sentences_in_words(cluster_gap, rest_gap, beaten, expected):
    text = " ".join(report.curve_sentences(_summary(cluster_gap, rest_gap, beaten),
                                           metric="accuracy", method="gradient", cluster="3",
                                           sizes={"cluster": 71}, n_random=20))
    assert "On the 71 samples of cluster 3, removing" in text
    for words in expected:
        assert words in text


def test_curve_sentences_say_when_too_few_random_orders_can_tell():
    """Five random orders: even a ranking beating them all has p = 1/6 > 0.1."""
    summary = _summary(0.25, 0.02, 1.0).assign(p_value=[1 / 6, 0.5])
    text = " ".join(report.curve_sentences(summary, metric="accuracy", method="gradient",
                                           cluster="3", n_random=5))
    assert "Verdict: with 5 random orders no ranking can show that it beats random" in text
    assert "use at least 9" in text and "carry real information" not in text


def test_curve_sentences_for_loss_speak_of_raising_it():
    text = " ".join(report.curve_sentences(_summary(0.4, 0.0, 1.0), metric="loss",
                                           method="ablation", cluster=0))
    assert "raises the loss by 0.4 nats more" in text


def test_settings_describe_themselves_in_words():
    words = replace(SETTINGS, target="fixed", fixed_class=2, cluster_source="kmeans_inputs",
                    k=5).describe(class_names=["a", "b", "c"])
    assert words["target logit"] == "class 2 (c)"
    assert words["clusters from"] == "k-means on the inputs (k = 5)"
    assert words["compared with"] == plots.method_label("gradient")


FORMULAS = ("=HYPERLINK(\"http://attacker.example\",\"x\")", "+1+1", "-2+3", "@SUM(A1)",
            "\tcmd", "\rcmd")


def test_csv_text_cells_cannot_start_a_formula():
    frame = pd.DataFrame({"cluster": list(FORMULAS) + ["plain"], "score": [-1.5] * 7,
                          "n": range(7), FORMULAS[0]: ["-"] * 7})
    parsed = pd.read_csv(io.StringIO(report.csv_text(frame)), keep_default_na=False)
    assert parsed["cluster"].tolist() == ["'" + text for text in FORMULAS] + ["plain"]
    assert parsed["score"].tolist() == [-1.5] * 7 and parsed["n"].tolist() == list(range(7))
    assert list(parsed.columns)[-1] == "'" + FORMULAS[0]
    assert parsed.iloc[:, -1].tolist() == ["'-"] * 7


def test_report_csvs_neutralise_cluster_names(demo):
    loaded, dataset = demo
    clusters = np.array([FORMULAS[i % len(FORMULAS)] for i in range(len(dataset))])
    per_sample = {m: np.random.default_rng(0).normal(size=(len(dataset), 16)).astype(np.float32)
                  for m in SETTINGS.methods}
    settings = replace(SETTINGS, cluster_source="provided", cluster=FORMULAS[0])
    content = report.assemble(settings, title="t", facts={}, layers=loaded.layers(),
                              per_sample=per_sample, clusters=clusters)
    for name, text in report.report_csvs(content).items():
        for row in csv.reader(io.StringIO(text)):
            for cell in row:
                assert not cell.startswith(cells.FORMULA_STARTS) or \
                    _is_number(cell), (name, cell)
    shown = pd.read_csv(io.StringIO(report.report_csvs(content)["cluster_scores.csv"]))
    assert set(shown["cluster"]) == {"'" + text for text in FORMULAS}


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


# ------------------------------------------------------- the settings module: one home

def test_every_default_has_one_home_that_the_library_reads():
    """The library's function defaults are the settings module's (via attribution.defaults)."""
    import inspect

    from attribution import defaults
    from attribution.analyses import distributed, pruning_curves

    for name in ("DEFAULT_METHOD", "DEFAULT_REDUCE", "DEFAULT_BATCH_SIZE", "DEFAULT_N_STEPS",
                 "DEFAULT_SEED", "DEFAULT_N_RANDOM", "DEFAULT_METRIC", "DEFAULT_ABLATION"):
        assert getattr(analysis, name) == getattr(defaults, name)
    expected = {"method": analysis.DEFAULT_METHOD, "reduce": analysis.DEFAULT_REDUCE,
                "batch_size": analysis.DEFAULT_BATCH_SIZE, "n_steps": analysis.DEFAULT_N_STEPS,
                "seed": analysis.DEFAULT_SEED, "n_random": analysis.DEFAULT_N_RANDOM,
                "ablation": analysis.DEFAULT_ABLATION}
    for function in (at.neuron_scores, at.cluster_scores, at.diagnose, at.pruning_curve,
                     at.cluster_pruning_curves, at.oracle_agreement, at.token_scores,
                     distributed.cluster_scores, distributed.cluster_statistics,
                     distributed.pruning_curve, distributed.cluster_pruning_curves,
                     at.make_clusters, at.predict_classes):
        parameters = inspect.signature(function).parameters
        for name, value in expected.items():
            if name in parameters:
                assert parameters[name].default == value, (function.__name__, name)
    for function in (pruning_curves.pruning_curve, pruning_curves.cluster_pruning_curves,
                     pruning_curves.model_metric, distributed.pruning_curve,
                     distributed.cluster_pruning_curves, at.scorecard_on):
        assert inspect.signature(function).parameters["metric"].default is None  # the head's
    assert pruning_curves.chosen_metric(None, 10, None) == analysis.DEFAULT_METRIC  # a classifier's
    assert inspect.signature(at.diagnose).parameters["metric"].default == \
        inspect.signature(at.diagnose_on).parameters["metric"].default == \
        analysis.EVIDENCE_METRIC
    assert inspect.signature(at.View.of).parameters["n_steps"].default == \
        analysis.DEFAULT_N_STEPS
    settings = analysis.AnalysisSettings(layer="x")
    assert (settings.method, settings.reduce, settings.metric, settings.n_random,
            settings.batch_size, settings.seed, settings.k, settings.compare) == (
        analysis.DEFAULT_METHOD, analysis.DEFAULT_REDUCE, analysis.DEFAULT_METRIC,
        analysis.DEFAULT_N_RANDOM, analysis.DEFAULT_BATCH_SIZE, analysis.DEFAULT_SEED,
        analysis.DEFAULT_K, analysis.DEFAULT_COMPARE)
    assert analysis.DEFAULT_BATCH_SIZE in analysis.BATCH_SIZES
    assert analysis.DEFAULT_N_RANDOM in analysis.RANDOM_ORDERS
    assert analysis.DEFAULT_REDUCE in analysis.REDUCE_CHOICES
    assert tuple(analysis.CLUSTER_SOURCE_LABELS) == analysis.CLUSTER_SOURCES
    assert tuple(analysis.METRIC_LABELS) == analysis.METRICS
    assert tuple(analysis.TARGET_LABELS) == analysis.TARGETS


@pytest.mark.parametrize("has_labels,has_provided,source,sources,target,targets", [
    (True, True, "label", ("label", "predicted", "correctness", "provided", "kmeans_inputs",
                           "kmeans_activations"), "true", ("true", "predicted", "fixed")),
    (True, False, "label", ("label", "predicted", "correctness", "kmeans_inputs",
                            "kmeans_activations"), "true", ("true", "predicted", "fixed")),
    (False, True, "provided", ("predicted", "provided", "kmeans_inputs", "kmeans_activations"),
     "predicted", ("predicted", "fixed")),
    (False, False, "predicted", ("predicted", "kmeans_inputs", "kmeans_activations"),
     "predicted", ("predicted", "fixed")),
])
def test_the_defaults_and_choices_follow_what_the_data_has(has_labels, has_provided, source,
                                                           sources, target, targets):
    assert analysis.default_cluster_source(has_labels, has_provided) == source
    assert analysis.cluster_source_choices(has_labels, has_provided) == sources
    assert source in sources
    assert analysis.default_target(has_labels) == target
    assert analysis.target_choices(has_labels) == targets


def test_the_default_layer_k_and_partition_words(demo):
    loaded, dataset = demo
    layers = loaded.layers()
    assert analysis.default_layer(layers) == "relu2"  # the last hidden activation
    assert analysis.default_layer(layers[:3]) == "relu1"  # fc1, relu1 | fc2 (the output)
    assert analysis.default_layer([info for info in layers if info.kind == "Linear"]) == "fc2"
    assert analysis.k_choices(len(dataset)) == tuple(range(2, 21))
    assert analysis.k_choices(5) == (2, 3, 4, 5) and analysis.k_choices(1) == (2,)
    assert analysis.default_k(len(dataset)) == 8 and analysis.default_k(5) == 5
    assert analysis.evidence_ks(16) == list(range(17)) and len(analysis.evidence_ks(100)) == 33
    assert analysis.partition_words("label") == "true label"
    assert analysis.partition_words("kmeans_inputs", 5, "relu2") == "k-means on the inputs (k = 5)"
    assert analysis.partition_words("kmeans_activations", 8, "relu2") == \
        "k-means on layer relu2 (k = 8)"
    assert analysis.partition_words("kmeans_activations", 8) == "k-means on the layer (k = 8)"
    settings = analysis.AnalysisSettings.for_data(layers, has_labels=True,
                                                  has_provided_clusters=True,
                                                  n_samples=len(dataset))
    assert (settings.layer, settings.cluster_source, settings.target, settings.k) == (
        "relu2", "label", "true", 8)
    unlabelled = analysis.AnalysisSettings.for_data(layers, has_labels=False,
                                                    has_provided_clusters=False, layer="fc2",
                                                    method="gradient")
    assert (unlabelled.layer, unlabelled.cluster_source, unlabelled.target,
            unlabelled.method) == ("fc2", "predicted", "predicted", "gradient")
    words = replace(settings, cluster_source="kmeans_activations", k=4).describe()
    assert words["clusters from"] == "k-means on layer relu2 (k = 4)"


def test_a_curve_that_never_leaves_the_random_band_is_not_said_to_beat_random():
    summary = _summary(0.03, 0.0, 1.0).assign(outside_band=[0.0, 0.0])
    text = " ".join(report.curve_sentences(summary, metric="accuracy", method="gradient",
                                           cluster="3", n_random=20))
    assert "not clearly better than random" in text and "real information" not in text
    text = " ".join(report.curve_sentences(summary.assign(outside_band=[0.2, 0.0]),
                                           metric="accuracy", method="gradient", cluster="3",
                                           n_random=20))
    assert "carry real information" in text


def test_the_steps_given_reach_every_path_method_of_the_report(demo, monkeypatch):
    """collect_report(n_steps=4): the scores, the checks, the oracle table and every layer
    of the scorecard take 4 steps; without it, each takes the steps that fit the budget
    (`plan_steps`: the fewest where no step count fits)."""
    from attribution.analyses import path_steps

    loaded, dataset = demo
    small = replace(dataset, inputs=dataset.inputs[:150], labels=dataset.labels[:150],
                    clusters=None if dataset.clusters is None else dataset.clusters[:150])
    settings = replace(SETTINGS, method="integrated_gradients", compare=(), n_random=2)
    taken = []

    def recording(name):
        real = getattr(report, name)

        def record(*args, **options):
            steps = args[0].n_steps if args and isinstance(args[0], at.View) else \
                options.get("n_steps", 0)
            taken.append((name, path_steps.steps_in(steps, "integrated_gradients")))
            return real(*args, **options)
        monkeypatch.setattr(report, name, record)

    for name in ("neuron_scores", "diagnose_on", "oracle_agreement_on"):
        recording(name)
    given = report.collect_report(loaded, small, settings, n_steps=4)
    assert set(taken) - {("neuron_scores", 0)} == {  # 0: activations, without steps
        ("neuron_scores", 4), ("diagnose_on", 4), ("oracle_agreement_on", 4)}
    assert set(steps_of(given.scorecard).values()) == {4}
    taken.clear()
    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    planned = report.collect_report(loaded, small, settings)
    fewest = path_steps.FEWEST_STEPS
    assert set(taken) - {("neuron_scores", 0)} == {
        ("neuron_scores", fewest), ("diagnose_on", fewest), ("oracle_agreement_on", fewest)}
    assert set(steps_of(planned.scorecard).values()) == {fewest}
