"""One self-contained, offline HTML report of an analysis, and the same results as CSVs.

    settings = AnalysisSettings(layer="relu2", method="gradient_x_activation", cluster=3)
    html_text = build_report(loaded_model, dataset, settings)   # collect + render
    content = collect_report(loaded_model, dataset, settings)   # or the two steps,
    html_text, tables = render_report(content), report_csvs(content)  # tables: name -> CSV

The dashboard assembles a `ReportContent` from what it already computed (`assemble`); the
command line calls `build_report`. Both take their targets, cluster rows and pruning-curve
choices from `AnalysisSettings` (attribution/analyses/settings.py), as the dashboard's
pages do. plotly.js is embedded inline (the file opens without a network), and every
user-supplied string is HTML-escaped.
"""
from __future__ import annotations

import datetime as _dt
import html
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from . import plots
from .cells import inert_text
from ..analyses.settings import (SCORECARD_METHODS, AnalysisSettings, cluster_label,
                                 is_regression)
from ..analyses.clusters import make_clusters, predictions
from ..inputs.data import Dataset
from ..analyses.diagnose import diagnose_on, diagnose_plan_on, for_checks
from ..analyses.findings import (FEWEST_RANDOM_ORDERS, SIGNAL_P, permutation_words,
                                 random_severity)
from ..errors import AttributionError
from ..engine.layers import LayerInfo
from ..engine.model_io import NamedInputs
from ..inputs.model_formats import LoadedModel
from ..methods.registry import method_names
from ..analyses.oracle import oracle_agreement_on
from ..analyses.scorecard import scorecard_on
from ..analyses.view import View, pruning_curves_on
from ..analyses.path_steps import plan_layer_steps, plan_steps, takes_steps
from ..analyses.pruning_curves import curve_summary
from ..methods.scores import ScoreFacts, neuron_scores
from ..analyses.neuron import neuron_examples


@dataclass
class ReportContent:
    """Everything a report shows; tables are tidy frames as the plots expect.

    Attributes:
        title: heading of the report.
        settings: label -> value of every choice that produced the results.
        facts: label -> value about the model and data (samples, classes, accuracy, ...).
        layers: rows (name, type, neurons, shape) of the model's scorable layers.
        cluster_scores: rows (cluster, neuron, method, score, n), every cluster and method.
        neuron_summary: rows (method, neuron, score, spread, n) for the focus cluster.
        curves: rows (subset, k, ranked, bottom, random_mean, random_lo, random_hi).
        curve_summary: one row per subset with the summary numbers of its curves.
        curve_sentences: the curve summary in words.
        findings: objects with code, severity, message, value and hint.
        oracle: agreement of each method with exact ablation, or None.
        scorecard: `attribution.scorecard` of every layer, or None.
        histogram: one row per focus-cluster sample, column "score": the signed per-sample
            scores of one neuron, or None.
        histogram_neuron: the neuron the histogram shows.
        examples: the samples that activate that neuron most and least, drawn as images
            (`neuron_examples` rows), for data that is images; else None.
        method_notes: method -> what a method fitted to the clusters says of its fit
            (a probe's held-out accuracy), shown beside its scores.
        cluster_labels: cluster id -> how charts name it (e.g. 3 -> "3 (three)").
        one_output: the model is a regression head (its "target logit" is its output).
    """

    title: str
    method: str
    reduce: str
    cluster: object
    n_neurons: int
    settings: dict[str, str]
    facts: dict[str, str]
    layers: pd.DataFrame
    cluster_scores: pd.DataFrame
    neuron_summary: pd.DataFrame
    curves: Optional[pd.DataFrame] = None
    curve_summary: Optional[pd.DataFrame] = None
    curve_sentences: Sequence[str] = ()
    findings: Sequence = ()
    oracle: Optional[pd.DataFrame] = None
    scorecard: Optional[pd.DataFrame] = None
    histogram: Optional[pd.DataFrame] = None
    histogram_neuron: Optional[int] = None
    metric: str = "accuracy"
    examples: Optional[pd.DataFrame] = None
    method_notes: dict = field(default_factory=dict)
    cluster_labels: dict = field(default_factory=dict)
    one_output: bool = False
    created: str = field(default_factory=lambda: _dt.datetime.now().strftime("%Y-%m-%d %H:%M"))


def curve_sentences(summary: pd.DataFrame, *, metric: str, method: str, cluster: object,
                    sizes: Optional[dict] = None, n_random: Optional[int] = None) -> list[str]:
    """The pruning-curve summary in words a collaborator understands.

    Args:
        summary: `curve_summary` of cluster-vs-rest curves (index "cluster", maybe "rest").
        sizes: samples per subset (the curves' attrs["n_samples"]).
    """
    if "cluster" not in summary.index:
        return []
    scale, unit = (100.0, "percentage points") if metric == "accuracy" else (
        1.0, {"target_logit": "logits", "loss": "nats"}.get(metric, "squared units"))
    damage = {"accuracy": "lowers accuracy", "target_logit": "lowers the target logit",
              "loss": "raises the loss",
              "squared_error": "raises the squared error"}.get(metric, f"changes {metric}")

    def versus_random(gap: float) -> str:
        how = "more" if gap >= 0 else "less"
        return f"{damage} by {abs(gap):.1f} {unit} {how} than removing them in random order"

    row = summary.loc["cluster"]
    gap = float(row["gap_vs_random"]) * scale
    where = (f"On the {sizes['cluster']} samples of cluster {cluster}"
             if sizes and "cluster" in sizes else f"On cluster {cluster}")
    text = (f"{where}, removing neurons in {plots.method_label(method)} order "
            f"(highest score first) {versus_random(gap)}, averaged over every number of "
            "neurons removed.")
    beaten, p_value = row["fraction_random_beaten"], row.get("p_value", np.nan)
    if pd.notna(beaten):
        orders = f"{n_random} " if n_random else ""
        text += f" It does more damage than {beaten:.0%} of the {orders}random orders"
        text += (f" ({permutation_words(p_value, n_random or 0)})." if pd.notna(p_value)
                 else ".")
    sentences = [text]
    if "rest" in summary.index:
        rest_gap = float(summary.loc["rest", "gap_vs_random"]) * scale
        specific = gap > 0 and gap > 2 * max(rest_gap, 0.0)
        sentences.append(
            f"On the rest of the data, removing the same neurons first {versus_random(rest_gap)}"
            ": " + ("these neurons matter specifically for this cluster." if specific
                    else "these neurons are not specific to this cluster."))
    if pd.notna(p_value):
        severity = random_severity(p_value, row.get("outside_band", np.nan))  # the
        # rule of the Diagnosis page's check
        if severity != "ok" and gap > 0 and n_random and n_random < FEWEST_RANDOM_ORDERS:
            verdict = (f"with {n_random} random orders no ranking can show that it beats "
                       f"random (p <= {SIGNAL_P}); use at least {FEWEST_RANDOM_ORDERS}.")
        elif severity == "ok" and gap > 0:
            verdict = "the scores carry real information about which neurons matter."
        elif severity != "problem":
            verdict = ("not clearly better than random; compare methods or try mean |·| "
                       "(see the Diagnosis page).")
        else:
            verdict = ("no better than random removal; see the Diagnosis page for why "
                       "(often signed averaging cancels).")
        sentences.append("Verdict: " + verdict)
    return sentences


def layers_frame(layers: Sequence[LayerInfo]) -> pd.DataFrame:
    """rows (layer, type, neurons, output shape, what a neuron is, its axis and how it was
    found) for the architecture table."""
    return pd.DataFrame({
        "layer": [info.name for info in layers], "type": [info.kind for info in layers],
        "neurons": [info.n_neurons for info in layers],
        "output shape": [" x ".join(map(str, info.shape)) for info in layers],
        "units": [info.describe() for info in layers],
        "neuron axis": [f"{info.neuron_axis} ({info.axis_rule})" for info in layers],
    })


def sample_shape(inputs) -> str:
    """One sample's shape in the data: "1 x 8 x 8", or for named inputs each name's
    ("input_ids 21, attention_mask 21")."""
    if isinstance(inputs, NamedInputs):
        return ", ".join(f"{name} {' x '.join(map(str, value.shape[1:])) or 'scalar'}"
                         for name, value in inputs.items())
    return " x ".join(map(str, inputs.shape[1:]))


def model_facts(loaded: LoadedModel, dataset: Dataset,
                predicted: Optional[np.ndarray] = None) -> dict[str, str]:
    """Label -> value about the model and data: format, shapes, classes (or "1 output (a
    regression head)"), and with labels the accuracy (a regression head's RMSE).

    Args:
        predicted: `predictions` of every sample (class ids, or a regression head's values).
    """
    regression = is_regression(loaded.n_classes)
    facts = {
        "model format": loaded.source_format or "-",
        "input shape": sample_shape(dataset.inputs),
        "classes": "1 output (a regression head)" if regression else str(loaded.n_classes),
        "samples": str(len(dataset)),
    }
    if predicted is not None and dataset.labels is not None:
        truth, predicted = dataset.labels.numpy(), np.asarray(predicted)
        if regression:
            error = np.sqrt(np.mean((predicted.astype(np.float64) - truth) ** 2))
            facts["RMSE on this data"] = f"{error:.4g}"
        else:
            facts["accuracy on this data"] = f"{float((predicted == truth).mean()):.1%}"
    return facts


def assemble(settings: AnalysisSettings, *, title: str, facts: dict[str, str],
             layers: Sequence[LayerInfo], per_sample: dict[str, np.ndarray],
             clusters: np.ndarray, curves: Optional[pd.DataFrame] = None,
             findings: Sequence = (), oracle: Optional[pd.DataFrame] = None,
             scorecard: Optional[pd.DataFrame] = None,
             class_names: Optional[Sequence[str]] = None,
             examples_of: Optional[Callable[[int], pd.DataFrame]] = None,
             method_notes: Optional[dict[str, str]] = None,
             one_output: bool = False) -> ReportContent:
    """A `ReportContent` from results already computed.

    Args:
        per_sample: method -> per-sample scores [N, n] for every method in settings.methods.
        clusters: cluster id per sample [N]; settings.cluster must be one of them.
        curves: `cluster_pruning_curves` output, or None.
        examples_of: neuron -> its `image_examples`, for data that is images; else None.
        method_notes: method -> the note of a method fitted to the clusters.
        one_output: the model is a regression head.
    """
    focus = settings.cluster_rows(clusters)
    tidy = pd.concat([plots.tidy_cluster_scores(
        plots.cluster_table(per_sample[m], clusters, settings.reduce), m)
        for m in settings.methods], ignore_index=True)
    summary = pd.concat([plots.neuron_summary(per_sample[m][focus], settings.reduce, m)
                         for m in settings.methods], ignore_index=True)
    main = summary[summary["method"] == settings.method]
    top_neuron = int(main.loc[main["score"].abs().idxmax(), "neuron"])
    labels = {c: cluster_label(c, settings.cluster_source, class_names)
              for c in pd.unique(np.asarray(clusters))}
    curve_table, sentences = None, []
    if curves is not None:
        curve_table = curve_summary(curves)
        sentences = curve_sentences(curve_table, metric=settings.metric,
                                    method=settings.method, cluster=labels[settings.cluster],
                                    sizes=curves.attrs.get("n_samples"),
                                    n_random=settings.n_random)
        curve_table = curve_table.reset_index()
    n_neurons = per_sample[settings.method].shape[1]
    return ReportContent(
        title=title, method=settings.method, reduce=settings.reduce, cluster=settings.cluster,
        n_neurons=n_neurons, facts=facts,
        settings={**settings.describe(class_names),
                  "neurons": settings.layer_info(layers).axis_words()},
        layers=layers_frame(layers), cluster_scores=tidy, neuron_summary=summary,
        curves=curves, curve_summary=curve_table, curve_sentences=sentences,
        findings=list(findings), oracle=oracle, scorecard=scorecard, metric=settings.metric,
        cluster_labels=labels,
        histogram=pd.DataFrame({"score": per_sample[settings.method][focus, top_neuron]}),
        histogram_neuron=top_neuron,
        examples=None if examples_of is None else examples_of(top_neuron),
        method_notes=dict(method_notes or {}), one_output=one_output)


def image_examples(model, layer: str, dataset: Dataset, scores: np.ndarray,
                   activations: np.ndarray, focus: np.ndarray, neuron: int,
                   n_examples: int = 8) -> Optional[pd.DataFrame]:
    """The samples that activate `neuron` most and least, as images (`neuron_examples`),
    when the data is images (`Dataset.image_chw`); None otherwise.

    Args:
        scores, activations: per-sample [N, n] of the method in use and of `activation`.
        focus: bool [N], the cluster in focus.
    """
    if dataset.image_chw is None:
        return None
    samples = pd.DataFrame({"activation": activations[:, neuron], "score": scores[:, neuron],
                            "in_cluster": focus})
    return neuron_examples(model, layer, dataset.inputs, samples, neuron, labels=dataset.labels,
                           n_examples=n_examples, image_shape=dataset.image_chw)


def collect_report(loaded: LoadedModel, dataset: Dataset, settings: AnalysisSettings, *,
                   title: Optional[str] = None, user_scores=None,
                   n_steps: Optional[int] = None,
                   progress: Optional[Callable[[float, str], object]] = None) -> ReportContent:
    """Compute everything the report shows, with the same `attribution` calls as the app.

    Args:
        loaded: the model (`load_model` / `load_demo`).
        dataset: its data, checked with `check_data`.
        user_scores: optional per-sample scores from one's own code for the focus cluster
            ([m, n]) for the gradient-capture check.
        n_steps: a path method's steps everywhere; None = on each layer as many as fit
            `path_steps.PATH_SECONDS` (`plan_steps`, as the app does).
        progress: called as progress(fraction, what) between steps.
    Returns:
        ReportContent; `settings.cluster` None becomes the first cluster id.
    """
    def step(fraction: float, what: str) -> None:
        if progress is not None:
            progress(fraction, what)

    for method in settings.methods:
        if method not in method_names():
            raise AttributionError(f"Unknown method {method!r}. Methods: "
                                   f"{', '.join(method_names())}.")
    model = loaded.module
    layers = loaded.layers(dataset.inputs[:2])  # positions as the data has them
    settings.layer_info(layers)  # an unknown layer or axis fails here, before any work
    step(0.0, "clusters")
    clusters = make_clusters(settings.cluster_source, dataset, loaded, settings.layer,
                             settings.k, settings.seed, batch_size=settings.batch_size)
    settings = settings.with_cluster_of(clusters)
    targets = settings.targets(dataset, loaded.n_classes)
    view_steps = {} if n_steps else {  # the view layer's, kept for the scorecard
        f"{settings.layer}/{method}": plan_steps(model, settings.layer, dataset.inputs, targets,
                                                 method, batch_size=settings.batch_size)
        for method in filter(takes_steps, settings.methods)}
    steps = {method: n_steps or view_steps[f"{settings.layer}/{method}"].n_steps
             for method in filter(takes_steps, settings.methods)}
    view = View(model, dataset.inputs, targets, clusters, settings, n_steps=steps,
                labels=dataset.labels)
    per_sample, notes = {}, {}
    for index, method in enumerate(settings.methods):
        step(0.1 + 0.3 * index / len(settings.methods), f"{method} scores")
        facts = ScoreFacts()
        per_sample[method] = neuron_scores(model, settings.layer, dataset.inputs, targets,
                                           method, batch_size=settings.batch_size,
                                           seed=settings.seed, clusters=clusters,
                                           n_steps=view.steps(method), facts=facts).numpy()
        if facts.fit is not None:
            notes[method] = facts.fit.note
    focus = settings.cluster_rows(clusters)
    step(0.4, "pruning curves")
    curves = pruning_curves_on(view, settings.ranking(per_sample[settings.method], clusters))
    step(0.6, "diagnosis")
    checked = for_checks(view)
    plan = diagnose_plan_on(checked)  # one oracle for both
    findings = diagnose_on(checked, user_scores=user_scores, plan=plan)
    step(0.7, "agreement with ablation")
    oracle = oracle_agreement_on(view, settings.methods, oracle_neurons=plan.oracle)
    step(0.75, "which method to trust, every layer")
    every_layer = replace(view, n_steps=n_steps or plan_layer_steps(
        model, dataset.inputs, targets, methods=SCORECARD_METHODS,
        batch_size=settings.batch_size, known=view_steps))
    card = scorecard_on(every_layer, metric=settings.metric,
                        curve_targets=settings.curve_targets(dataset.labels, targets),
                        progress=lambda fraction, _: step(0.75 + 0.2 * fraction,
                                                          "which method to trust, every layer"))
    predicted = predictions(loaded, dataset.inputs, batch_size=settings.batch_size).numpy()
    activations = per_sample.get("activation")
    if dataset.image_chw is not None and activations is None:
        activations = neuron_scores(model, settings.layer, dataset.inputs, None, "activation",
                                    batch_size=settings.batch_size).numpy()
    step(1.0, "done")
    return assemble(settings, title=title or f"Neuron importance: layer {settings.layer}",
                    facts=model_facts(loaded, dataset, predicted), layers=layers,
                    per_sample=per_sample, clusters=clusters, curves=curves,
                    findings=findings, oracle=oracle.drop(columns="cluster"),
                    scorecard=card, class_names=dataset.class_names, method_notes=notes,
                    one_output=is_regression(loaded.n_classes),
                    examples_of=lambda neuron: image_examples(
                        model, settings.layer, dataset, per_sample[settings.method],
                        activations, focus, neuron))


def build_report(loaded: LoadedModel, dataset: Dataset, settings: AnalysisSettings, *,
                 title: Optional[str] = None, user_scores=None,
                 n_steps: Optional[int] = None,
                 progress: Optional[Callable[[float, str], object]] = None) -> str:
    """`collect_report` then `render_report`: the HTML text of the report."""
    return render_report(collect_report(loaded, dataset, settings, title=title,
                                        user_scores=user_scores, n_steps=n_steps,
                                        progress=progress))


_STYLE = """
body { font-family: Inter, system-ui, -apple-system, 'Segoe UI', sans-serif; color: #1F2328;
       margin: 0 auto; max-width: 1100px; padding: 24px 32px 64px; line-height: 1.45; }
h1 { font-size: 26px; margin-bottom: 4px; } h2 { font-size: 20px; margin-top: 36px;
     border-bottom: 1px solid #E1E4E8; padding-bottom: 4px; }
.muted { color: #57606A; font-size: 14px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #E1E4E8; padding: 4px 10px; text-align: left; }
th { background: #F4F5F7; }
.finding { border-left: 6px solid; padding: 6px 12px; margin: 8px 0; background: #FAFBFC; }
.finding b { text-transform: uppercase; font-size: 12px; letter-spacing: .04em; }
.hint { color: #57606A; font-size: 14px; }
.chart { margin: 12px 0; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pairs_table(pairs: dict[str, str]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs.items())
    return f"<table>{rows}</table>"


def _frame_table(frame: pd.DataFrame, digits: int = 4) -> str:
    shown = frame.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: f"{v:.{digits}g}")
    return shown.to_html(index=False, escape=True, border=0)


def _chart(figure: go.Figure) -> str:
    body = figure.to_html(full_html=False, include_plotlyjs=False,
                          config={"displaylogo": False, "responsive": True})
    return f'<div class="chart">{body}</div>'


def _findings_html(findings: Sequence) -> str:
    if not findings:
        return "<p class='muted'>No checks were run.</p>"
    items = []
    for finding in findings:
        colour = plots.SEVERITY_COLOURS.get(finding.severity, "#57606A")
        message, hint = finding.words(screen=True)  # the settings table's words
        items.append(
            f'<div class="finding" style="border-color:{colour}">'
            f"<b style='color:{colour}'>{_e(finding.severity)}</b> "
            f"<code>{_e(finding.code)}</code> {_e(message)}"
            f'<div class="hint">{_e(hint)}</div></div>')
    return "".join(items)


def render_report(content: ReportContent) -> str:
    """The report as one HTML document that opens offline (plotly.js inline, no links)."""
    scores = content.cluster_scores
    method_rows = scores[scores["method"] == content.method]
    method_rows = method_rows.assign(cluster=[content.cluster_labels.get(c, c)
                                              for c in method_rows["cluster"]])
    focus_label = content.cluster_labels.get(content.cluster, content.cluster)
    summary = content.neuron_summary
    parts = [
        f"<h1>{_e(content.title)}</h1>",
        f"<p class='muted'>Created {_e(content.created)} with the attribution dashboard.</p>",
        "<h2>Settings</h2>", _pairs_table(content.settings),
        "<h2>Model and data</h2>", _pairs_table(content.facts),
        _frame_table(content.layers),
        "<h2>Findings</h2>", _findings_html(content.findings),
        "<h2>Neuron scores</h2>",
        _chart(plots.cluster_heatmap(method_rows, method=content.method, reduce=content.reduce,
                                     highlight=focus_label, one_output=content.one_output)),
        _chart(plots.neuron_bars(summary[summary["method"] == content.method],
                                 method=content.method, reduce=content.reduce,
                                 one_output=content.one_output)),
    ]
    parts += [f"<p class='muted'>{_e(plots.method_label(method))}: {_e(note)}</p>"
              for method, note in content.method_notes.items()]
    if summary["method"].nunique() > 1:
        parts.append(_chart(plots.method_bars(summary, reduce=content.reduce,
                                              one_output=content.one_output)))
        parts.append(_chart(plots.rank_correlation_heatmap(plots.rank_correlations(summary))))
    if content.curves is not None and len(content.curves):
        parts += ["<h2>Pruning curves</h2>",
                  _chart(plots.pruning_figure(content.curves, n_neurons=content.n_neurons,
                                              metric=content.metric,
                                              titles=_curve_titles(focus_label),
                                              one_output=content.one_output))]
        parts += [f"<p>{_e(sentence)}</p>" for sentence in content.curve_sentences]
        if content.curve_summary is not None:
            parts.append(_frame_table(plots.curve_summary_table(content.curve_summary,
                                                                metric=content.metric)))
    if content.oracle is not None and len(content.oracle):
        parts += ["<h2>Agreement with exact ablation</h2>",
                  "<p class='muted'>Rank correlation between each method's scores and the "
                  "measured effect of removing each neuron alone.</p>",
                  _frame_table(plots.oracle_table(content.oracle))]
        if sampled := plots.oracle_sample_words(content.oracle):
            parts.append(f"<p class='muted'>{_e(sampled)}</p>")
    if content.scorecard is not None and len(content.scorecard):
        parts += ["<h2>Which method to trust, layer by layer</h2>",
                  "<p class='muted'>Each method's cluster scores (signed mean) against exact "
                  "ablation on every layer: Spearman ρ per cluster, averaged (hover for its "
                  "95% bootstrap interval); beside it, the same ranking after the layers above "
                  "are re-initialised (near 1: the ranking does not read the model).</p>",
                  _chart(plots.scorecard_figure(content.scorecard))]
        if sampled := plots.oracle_sample_words(content.scorecard):
            parts.append(f"<p class='muted'>{_e(sampled)}</p>")
        parts.append(_frame_table(plots.scorecard_table(content.scorecard)))
    if content.histogram is not None and content.histogram_neuron is not None:
        parts.append(_chart(plots.score_histogram(content.histogram, method=content.method,
                                                  neuron=content.histogram_neuron,
                                                  one_output=content.one_output)))
    if content.examples is not None:
        parts.append(_chart(plots.example_images(content.examples,
                                                 neuron=content.histogram_neuron)))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{_e(content.title)}</title>\n<style>{_STYLE}</style>\n"
        f"<script type='text/javascript'>{get_plotlyjs()}</script>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def _curve_titles(cluster: object) -> dict[str, str]:
    return {"cluster": f"cluster {plots.plain(cluster)}", "rest": "rest of the data"}


def csv_text(frame: pd.DataFrame) -> str:
    """CSV of `frame` (no index) whose text cells and column names cannot start a formula in
    a spreadsheet: they get a leading ' (numbers stay numbers). Lines end in CRLF (RFC 4180),
    so a cell holding a CR or LF is quoted and stays one cell."""
    inert = frame.rename(columns=inert_text)
    for column in inert.columns:
        values = inert[column]
        if not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)
                or pd.api.types.is_datetime64_any_dtype(values)):
            inert[column] = values.astype(object).map(inert_text)
    return inert.to_csv(index=False, lineterminator="\r\n")


def report_csvs(content: ReportContent) -> dict[str, str]:
    """File name -> CSV text of every table in the report."""
    tables = {
        "cluster_scores.csv": content.cluster_scores,
        "neuron_summary.csv": content.neuron_summary,
        "layers.csv": content.layers,
    }
    if content.curves is not None:
        tables["pruning_curves.csv"] = content.curves
    if content.curve_summary is not None:
        tables["curve_summary.csv"] = content.curve_summary
    if content.oracle is not None:
        tables["oracle_agreement.csv"] = content.oracle
    if content.scorecard is not None:
        tables["scorecard.csv"] = content.scorecard
    if content.findings:
        tables["findings.csv"] = pd.DataFrame(
            [{"code": f.code, "severity": f.severity, "value": f.value, "message": f.message,
              "hint": f.hint} for f in content.findings])
    return {name: csv_text(frame) for name, frame in tables.items()}
