"""Figures shared by the dashboard, the HTML report and the command line.

Each figure is a pure function from a tidy DataFrame (plus display options) to a plotly
Figure; the `tidy_*` helpers turn engine results into those frames. One colour per curve
kind and per method everywhere; signed scores use a diverging scale centred at zero.
User-supplied strings (cluster, class, layer names) are escaped before plotly sees them,
because plotly renders a subset of HTML (including links) in text.
"""
from __future__ import annotations

import functools
import html
import math
import re
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from ..analyses.settings import REDUCTION_LABELS
from ..engine.model_io import TEXT_INPUT
from ..methods.registry import REGISTRY, colour_from_name, method_label
from ..methods.scores import averaged, cluster_table, reduce_scores

CURVE_COLOURS = {"ranked": "#D55E00", "bottom": "#0072B2", "random": "#7A7A7A"}
CURVE_LABELS = {
    "ranked": "top-k removed (highest scores first)",
    "bottom": "bottom-k removed (lowest scores first)",
    "random": "random order: mean and 5–95% band",
}
RANDOM_BAND_FILL = "rgba(122, 122, 122, 0.22)"
METRIC_AXES = {
    "accuracy": "accuracy (% of samples)",
    "target_logit": "mean target logit (logits)",
    "loss": "cross-entropy loss (nats)",
    "squared_error": "squared error (mean)",
}
ONE_OUTPUT_AXES = {"target_logit": "mean output (output units)"}


def metric_axis(metric: str, one_output: bool = False) -> str:
    """A curve's y-axis title (METRIC_AXES; a regression head's output in its own units)."""
    if one_output and metric in ONE_OUTPUT_AXES:
        return ONE_OUTPUT_AXES[metric]
    return METRIC_AXES.get(metric, metric)


SEVERITY_COLOURS = {"ok": "#1A9850", "warning": "#E08E0B", "problem": "#D73027"}
SIGNED_SCALE = "RdBu_r"          # blue < 0 < red, centred at zero
MAGNITUDE_SCALE = "Viridis"      # for scores that cannot be negative
NEGATIVE_COLOUR, POSITIVE_COLOUR = "#2166AC", "#B2182B"  # the ends of SIGNED_SCALE
FONT = dict(family="Inter, system-ui, -apple-system, Segoe UI, sans-serif", size=13)
MOST_HEATMAP_NEURONS = 128  # columns a heatmap shows: a few pixels each in the page; above
# that cells are narrower than a pixel, and the cluster heatmap's clickable cells (one marker
# each) make every redraw cost the browser seconds on a layer of thousands


def plain(text: object) -> str:
    """A user-supplied string made inert for plotly's HTML-like text renderer."""
    return html.escape(str(text), quote=False)


def method_colour(method: str) -> str:
    """The registry's colour of `method` (one picked from the name where not registered)."""
    entry = REGISTRY.get(method)
    return entry.colour if entry is not None else colour_from_name(method)


def method_units(method: str, unknown: str = "score", one_output: bool = False) -> str:
    """The registry's units of `method`'s scores (`unknown` for a name not registered); for
    a regression head (`one_output`) its logit is its output ("logit drop": "output drop")."""
    entry = REGISTRY.get(method)
    units = entry.units if entry is not None else unknown
    return _OUTPUT_UNITS.sub("output", units.replace("logits", "output units")) \
        if one_output else units


_OUTPUT_UNITS = re.compile(r"\blogit\b")


def score_axis_title(method: str, reduce: Optional[str] = None,
                     one_output: bool = False) -> str:
    """e.g. 'gradient score, signed mean<br>(logit per unit activation)' (two lines)."""
    head = f"{method_label(method)} score"
    if reduce:
        head += f", {REDUCTION_LABELS.get(reduce, reduce)}"
    units = method_units(method, "score units", one_output)
    return f"{head}<br>({units})"  # fits a half-page chart


@functools.lru_cache(maxsize=None)
def _white(kinds: tuple[str, ...]) -> dict:
    """plotly_white with the trace defaults of `kinds` only: the same look for a figure of
    those trace types at half the JSON (a figure copies it, so the cached dict stays as is)."""
    white = pio.templates["plotly_white"]
    defaults = {kind: [trace.to_plotly_json() for trace in white.data[kind]]
                for kind in kinds if white.data[kind]}  # "image" has none
    return dict(layout=white.layout.to_plotly_json(), **({"data": defaults} if defaults else {}))


def _figure(traces: list[dict], layout: dict, *, title: str, height: int, subtitle: str = "",
            top: int = 56) -> go.Figure:
    """The figure of `traces` (plotly trace dicts, each with its "type") and `layout`, with the
    look every figure shares: title, font, margins, white theme, x axes with room for a
    two-line title.

    Built from plain dicts without plotly's per-property validation: setting properties one by
    one (update_layout, add_trace, make_subplots) was most of the server's time in a
    Scores-page redraw (docs/speed.md). tests/presentation/test_plots.py validates every
    figure against plotly's schema instead."""
    heading = dict(text=title, x=0, xanchor="left", font=dict(size=15))
    if subtitle:
        heading["subtitle"] = dict(text=subtitle, font=dict(size=12, color="#57606A"))
        top += 18
    layout = dict(layout, template=_white(tuple(sorted({trace["type"] for trace in traces}))),
                  font=FONT, height=height, title=heading,
                  margin=dict(l=70, r=24, t=top, b=56), hoverlabel=dict(font=FONT))
    for axis in [name for name in layout if name.startswith("xaxis")] or ["xaxis"]:
        layout[axis] = dict(layout.get(axis, {}), automargin=True)
    return go.Figure(dict(data=traces, layout=layout), _validate=False)


def _title(text: str) -> dict:
    return dict(text=text)


def _colour_bar(units: str) -> dict:
    return dict(title=dict(text=units, side="right"))


def _panels(titles: Sequence[str], spacing: float, *,
            shared_y: bool = False) -> tuple[dict, list[tuple[dict, dict, dict]]]:
    """One row of panels, as plotly's make_subplots lays them out, in plain dicts: the layout
    (each panel's axes, its title above it) and per panel (trace anchors {"xaxis": "x2",
    "yaxis": "y2"}, its x axis, its y axis), the axes being the layout's own dicts to fill in.
    With `shared_y` every panel follows the first panel's y axis."""
    count = max(1, len(titles))
    width = (1 - spacing * (count - 1)) / count
    layout, panels = {}, []
    for index in range(count):
        suffix = str(index + 1) if index else ""
        left = index * (width + spacing)
        x_axis = layout[f"xaxis{suffix}"] = dict(anchor=f"y{suffix}", domain=[left, left + width])
        y_axis = layout[f"yaxis{suffix}"] = dict(anchor=f"x{suffix}", domain=[0.0, 1.0])
        if shared_y and index:
            y_axis.update(matches="y", showticklabels=False)
        panels.append((dict(xaxis=f"x{suffix}", yaxis=f"y{suffix}"), x_axis, y_axis))
    layout["annotations"] = [
        dict(text=text, x=index * (width + spacing) + width / 2, xref="paper", xanchor="center",
             y=1.0, yref="paper", yanchor="bottom", showarrow=False, font=dict(size=16))
        for index, text in enumerate(titles)]
    return layout, panels


def _is_signed(values: Iterable[float]) -> bool:
    array = np.asarray(list(values), dtype=float)
    return bool(np.nanmin(array, initial=0.0) < 0)


def colour_legend(scores: Iterable[float], reduce: str) -> str:
    """What a heatmap's colours of these scores mean, in words (the figure colours signed
    values red/blue around white, and values >= 0 on MAGNITUDE_SCALE, Viridis: dark purple
    at zero to yellow at the largest)."""
    if _is_signed(scores):
        return "Signed scores: red raises the target logit, blue lowers it, white is zero."
    if reduce == "mean_abs":
        return ("Magnitudes (mean |·| over the samples): brighter is larger, from dark purple "
                "at zero to yellow. The sign is dropped, so a cell does not say whether a "
                "neuron raises or lowers the target logit.")
    return (f"Every score here is 0 or more ({REDUCTION_LABELS.get(reduce, reduce)}): brighter "
            "is larger, from dark purple at zero to yellow.")


def _colour_range(values: np.ndarray, signed: bool) -> dict:
    finite = values[np.isfinite(values)]
    top = float(np.abs(finite).max()) if finite.size else 1.0
    top = top if top > 0 else 1.0
    if signed:
        return dict(colorscale=_scale(SIGNED_SCALE), zmid=0.0, zmin=-top, zmax=top)
    return dict(colorscale=_scale(MAGNITUDE_SCALE), zmin=0.0, zmax=top)


@functools.lru_cache(maxsize=None)
def _named_scale(name: str) -> tuple[tuple[float, str], ...]:
    return go.Heatmap(colorscale=name).colorscale  # plotly's own reading of the name


def _scale(name: str) -> list[list]:
    """A plotly.py colour scale by name ("RdBu_r") as the [[position, colour], ...] list that
    plotly.js draws (it knows no "_r" names, and its own "RdBu" differs)."""
    return [list(stop) for stop in _named_scale(name)]


# --- tidy frames -------------------------------------------------------------------------

def tidy_cluster_scores(table: pd.DataFrame, method: str) -> pd.DataFrame:
    """The engine's wide cluster table -> rows (cluster, neuron, method, score, n).

    Args:
        table: `cluster_scores` output: index "cluster", int neuron columns, column "n".
    """
    neurons = [c for c in table.columns if c != "n"]
    # rows neuron by neuron, as DataFrame.melt lays them, without melt's cost (a large share
    # of a wide layer's redraw)
    n_clusters = len(table.index)
    return pd.DataFrame({
        "cluster": table.index.take(np.tile(np.arange(n_clusters), len(neurons))),
        "neuron": np.repeat(np.asarray(neurons, dtype=np.int64), n_clusters),
        "method": method,
        "score": table[neurons].to_numpy(dtype=np.float64).T.ravel(),
        "n": np.tile(table["n"].to_numpy(dtype=np.int64), len(neurons))})


def tidy_every_cluster(per_sample: dict[str, np.ndarray], clusters: Sequence,
                       reduce: str) -> pd.DataFrame:
    """Every cluster under every method: `tidy_cluster_scores` rows of each method's
    `cluster_table`, one after the other.

    Args:
        per_sample: method -> per-sample scores [N, n].
        clusters: cluster id per sample [N].
    """
    return pd.concat([tidy_cluster_scores(cluster_table(scores, clusters, reduce), method)
                      for method, scores in per_sample.items()], ignore_index=True)


def neuron_summary(per_sample: np.ndarray, reduce: str, method: str) -> pd.DataFrame:
    """Per-neuron score and spread over one cluster's samples.

    Args:
        per_sample: [n_samples, n_neurons] scores of the cluster's samples.
        reduce: "mean" (signed) or "mean_abs".
    Returns:
        rows (method, neuron, score, spread, n): spread is the std across samples of the
        quantity averaged (the signed score, or its absolute value).
    """
    values = np.asarray(per_sample, dtype=np.float64)
    n = values.shape[0]
    spread = (reduce_scores(averaged(values, reduce), "std") if n > 1
              else np.zeros(values.shape[1]))
    return pd.DataFrame({
        "method": method, "neuron": np.arange(values.shape[1]),
        "score": reduce_scores(values, reduce), "spread": spread, "n": n,
    })


def _evenly_spaced(order: np.ndarray, most: int) -> np.ndarray:
    if len(order) <= most:
        return order
    return order[np.linspace(0, len(order) - 1, most).round().astype(int)]


def tidy_sample_scores(per_sample: np.ndarray, sample_ids: Sequence, *, reduce: str = "mean",
                       max_samples: int = 200,
                       max_neurons: int = MOST_HEATMAP_NEURONS) -> pd.DataFrame:
    """One cluster's samples x neurons as rows (sample, neuron, score), sorted for reading.

    Neurons are ordered by their cluster score under `reduce` ("mean" or "mean_abs", highest
    first), as the cluster heatmap and the bars rank them; samples by their score on the
    top neuron. Above `max_samples` samples (`max_neurons` neurons), evenly spaced rows
    (columns) of that order are kept, so the picture keeps its shape; `attrs["n_neurons"]`
    is the layer's count.
    """
    values = np.asarray(per_sample, dtype=np.float64)
    ids = np.asarray(sample_ids)
    cluster_score = reduce_scores(values, reduce)
    neuron_order = _evenly_spaced(np.argsort(-cluster_score, kind="stable"), max_neurons)
    sample_order = (np.argsort(-values[:, neuron_order[0]], kind="stable") if values.size
                    else np.zeros(0, dtype=int))
    sample_order = _evenly_spaced(sample_order, max_samples)
    block = values[np.ix_(sample_order, neuron_order)]
    frame = pd.DataFrame({
        "sample": np.repeat(ids[sample_order], len(neuron_order)),
        "neuron": np.tile(neuron_order, len(sample_order)),
        "score": block.ravel(),
    })
    frame.attrs["n_neurons"] = values.shape[1]
    frame.attrs["reduce"] = reduce
    return frame


def rank_correlations(scores: pd.DataFrame) -> pd.DataFrame:
    """Spearman correlation between methods' rankings of the same neurons.

    Args:
        scores: rows (method, neuron, score) for one cluster.
    Returns:
        rows (method_a, method_b, rho), every ordered pair including the diagonal.
    """
    wide = scores.pivot_table(index="neuron", columns="method", values="score", sort=False)
    rho = wide.rank().corr()
    rho.index.name, rho.columns.name = "method_a", "method_b"
    return rho.stack().rename("rho").reset_index()


# --- figures -----------------------------------------------------------------------------

_MOST_GAPPED = 64  # cells per row above which a 1 px gap would hide narrow cells


def _grid(tidy: pd.DataFrame, rows: str, columns: str,
          values: str) -> tuple[list, list, np.ndarray]:
    """A tidy frame as a grid: the row labels and column labels in order of first appearance
    and the values [rows, columns] (NaN where a pair has no row). Several times faster than
    DataFrame.pivot_table, which a redraw called per heatmap; a pair given twice is refused
    rather than averaged."""
    row_codes, row_labels = pd.factorize(tidy[rows], sort=False, use_na_sentinel=False)
    column_codes, column_labels = pd.factorize(tidy[columns], sort=False,
                                               use_na_sentinel=False)
    if len(np.unique(row_codes * len(column_labels) + column_codes)) != len(tidy):
        raise ValueError(f"more than one {values} for a ({rows}, {columns}) pair")
    grid = np.full((len(row_labels), len(column_labels)), np.nan)
    grid[row_codes, column_codes] = tidy[values].to_numpy(dtype=float)
    return row_labels.tolist(), column_labels.tolist(), grid


def _clickable_cells(traces: list[dict], layout: dict) -> None:
    """Make the cells of the heatmap `traces[0]` clickable: an invisible marker at each cell
    centre carries the cell's x, y and hover text. Plotly selects scatter points but not
    heatmap cells, so a click on a cell (Streamlit's on_select) arrives as that point."""
    heat = traces[0]
    z = np.asarray(heat["z"], dtype=float)
    xs, ys = np.meshgrid(np.arange(z.shape[1]), np.arange(z.shape[0]))
    extra = heat.get("customdata")
    custom = np.stack([z.ravel()] + ([] if extra is None else [np.asarray(extra).ravel()]),
                      axis=1)
    template = heat["hovertemplate"].replace("%{customdata}", "%{customdata[1]}") \
        .replace("%{z", "%{customdata[0]")
    invisible = dict(marker=dict(opacity=0))
    traces.append(dict(
        type="scatter", x=np.asarray(heat["x"], dtype=object)[xs.ravel()],
        y=np.asarray(heat["y"], dtype=object)[ys.ravel()], mode="markers",
        marker=dict(size=12, opacity=0, symbol="square"), customdata=custom,
        hovertemplate=template, showlegend=False, selected=invisible, unselected=invisible))
    heat["hoverinfo"] = "skip"  # the markers show the same text
    layout["hoverdistance"] = -1


HALF_WIDTH_PX = 560
"""The plotting width of a chart in half the page (a column of two), in pixels."""


def _column_ticks(labels: Sequence[str], width_px: int) -> tuple[dict, int]:
    """(x-axis tick settings, k): a label under every column of a category axis where the
    labels fit across `width_px` (turned upright and smaller when many; plotly's own ticks
    skip every other label of a sorted axis), else under every k-th column, evenly."""
    size = 11 if len(labels) <= 24 else 9
    step = max(1, math.ceil(len(labels) * (size + 4) / width_px))
    shown = list(labels)[::step]
    return dict(tickmode="array", tickvals=shown, ticktext=shown, tickfont=dict(size=size),
                tickangle=0 if len(labels) <= 12 else -90), step


def _ordinal(number: int) -> str:
    """2 -> "2nd", 3 -> "3rd", 11 -> "11th"."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(
        number % 10, "th")
    return f"{number}{suffix}"


def _clickable_columns(traces: list[dict], layout: dict) -> None:
    """Make the columns of the heatmap `traces[0]` clickable with one invisible marker per
    column, for heatmaps whose click needs only the column (x). The heatmap keeps its own
    per-cell hover text; hovering by x ("x" hover mode) puts the column's marker under every
    point of the column, so a click there selects it. One marker per cell would cost the
    browser a drawn point per cell at every redraw."""
    heat = traces[0]
    invisible = dict(marker=dict(opacity=0))
    traces.append(dict(
        type="scatter", x=list(heat["x"]),
        y=[heat["y"][0]] * len(heat["x"]) if len(heat["y"]) else [], mode="markers",
        marker=dict(size=12, opacity=0, symbol="square"), hoverinfo="none", showlegend=False,
        selected=invisible, unselected=invisible))
    layout["hovermode"] = "x"


def _strongest_of_each_row(z: np.ndarray, most: int) -> np.ndarray:
    """Up to `most` column positions of z [rows, columns]: each row's largest |value| first,
    then each row's second largest, and so on (NaN last), so every row's strongest columns
    are among them."""
    magnitude = np.nan_to_num(np.abs(z), nan=-1.0)
    by_rank = np.argsort(-magnitude, axis=1, kind="stable").T.ravel()  # rank 1 of each row, ...
    return pd.unique(by_rank)[:most]


def cluster_heatmap(scores: pd.DataFrame, *, method: str, reduce: str,
                    highlight: object = None, one_output: bool = False) -> go.Figure:
    """Clusters x neurons heatmap; above `MOST_HEATMAP_NEURONS` neurons, that many columns:
    each cluster's largest |score| in turn (the axis title says so), in layer order.

    Args:
        scores: rows (cluster, neuron, score, n) for one method.
        highlight: a cluster id to mark with a frame, or None.
    """
    clusters, neurons, z = _grid(scores, "cluster", "neuron", "score")
    n_neurons = len(neurons)
    axis = dict(title=_title("neuron (index in the layer)"))
    columns = [int(n) for n in neurons]
    if n_neurons > MOST_HEATMAP_NEURONS:  # each cluster's strongest neurons, in layer order
        kept = _strongest_of_each_row(z, MOST_HEATMAP_NEURONS)
        kept = kept[np.argsort(np.asarray(columns)[kept], kind="stable")]
        z, columns = z[:, kept], [str(columns[i]) for i in kept]  # labels side by side
        axis = dict(type="category", title=_title(
            f"neuron (index in the layer; {len(kept)} of {n_neurons}: "
            "each cluster's largest |score|)"))
    sizes = scores.drop_duplicates("cluster").set_index("cluster")["n"].reindex(clusters)
    traces = [dict(
        type="heatmap", z=z, x=columns, y=[plain(c) for c in clusters],
        customdata=np.repeat(sizes.to_numpy()[:, None], z.shape[1], axis=1),
        colorbar=_colour_bar(method_units(method, "score", one_output)),
        hovertemplate="cluster %{y}<br>neuron %{x}<br>score %{z:.4g}"
                      "<br>n = %{customdata} samples<extra></extra>",
        xgap=1 if z.shape[1] <= _MOST_GAPPED else 0, ygap=1 if z.shape[0] <= _MOST_GAPPED else 0,
        **_colour_range(z, _is_signed(z.ravel())))]
    layout = dict(xaxis=axis,
                  yaxis=dict(title=_title("cluster"), type="category", autorange="reversed"))
    if highlight is not None and highlight in clusters:
        row = clusters.index(highlight)
        layout["shapes"] = [dict(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=row - 0.5,
                                 y1=row + 0.5, line=dict(color="#111111", width=2))]
    _clickable_cells(traces, layout)
    title = f"{method_label(method)} score per cluster ({REDUCTION_LABELS.get(reduce, reduce)})"
    return _figure(traces, layout, title=title, height=max(280, 90 + 26 * len(clusters)))


def sample_heatmap(samples: pd.DataFrame, *, method: str, cluster: object,
                   n_total: Optional[int] = None, one_output: bool = False) -> go.Figure:
    """Samples x neurons heatmap for one cluster.

    Args:
        samples: rows (sample, neuron, score) in display order (see `tidy_sample_scores`).
        n_total: the cluster's size before downsampling, for the title.
    """
    sample_order, neuron_order, z = _grid(samples, "sample", "neuron", "score")
    traces = [dict(
        type="heatmap", z=z, x=[str(n) for n in neuron_order], y=[str(s) for s in sample_order],
        colorbar=_colour_bar(method_units(method, "score", one_output)),
        hovertemplate="sample %{y} (row in the data)<br>neuron %{x}<br>score %{z:.4g}"
                      "<extra></extra>",
        **_colour_range(z, _is_signed(z.ravel())))]
    n_neurons = samples.attrs.get("n_neurons", len(neuron_order))
    spacing = "" if n_neurons == len(neuron_order) else \
        f"; {len(neuron_order)} of {n_neurons}, evenly spaced"
    order = REDUCTION_LABELS.get(samples.attrs.get("reduce", "mean"), "signed mean")
    shown = len(sample_order)
    count = f"{shown} samples" if not n_total or n_total == shown else \
        f"{shown} of {n_total} samples, evenly spaced"
    ticks, step = _column_ticks(traces[0]["x"], HALF_WIDTH_PX)
    labelled = "" if step == 1 else f"; every {_ordinal(step)} labelled, hover for the rest"
    layout = dict(
        xaxis=dict(title=_title(f"neuron<br>sorted by cluster {order}, highest first{spacing}"
                                f"{labelled}"), type="category", **ticks),
        # two short lines: one long vertical title ran past the plot into the chart title
        yaxis=dict(title=_title(f"sample<br>({count})"), type="category", showticklabels=False,
                   autorange="reversed"))
    _clickable_columns(traces, layout)
    return _figure(traces, layout, title=f"Each sample of cluster {plain(cluster)}", height=420)


def _bar_frame(summary: pd.DataFrame, top_n: int, bottom: bool) -> pd.DataFrame:
    ordered = summary.sort_values("score", ascending=bottom, kind="stable")
    return ordered.head(top_n)


def _spread_whiskers(spread: pd.Series) -> dict:
    return dict(type="data", array=spread.to_numpy(), color="#444444", thickness=1)


def neuron_bars(summary: pd.DataFrame, *, method: str, reduce: str, top_n: int = 15,
                bottom: bool = False, one_output: bool = False) -> go.Figure:
    """Ranked neuron bars with error bars (±1 std across the cluster's samples).

    Args:
        summary: rows (neuron, score, spread, n) for one cluster and method.
        bottom: show the lowest-scored neurons instead of the highest.
    """
    shown = _bar_frame(summary, top_n, bottom)
    traces = [dict(
        type="bar", x=shown["score"].to_numpy(), y=[f"neuron {n}" for n in shown["neuron"]],
        orientation="h", marker=dict(color=method_colour(method)),
        error_x=_spread_whiskers(shown["spread"]),
        customdata=np.stack([shown["spread"], shown["n"]], axis=1),
        hovertemplate="%{y}<br>score %{x:.4g} ± %{customdata[0]:.3g}"
                      "<br>n = %{customdata[1]} samples<extra></extra>")]
    layout = dict(yaxis=dict(autorange="reversed"),
                  xaxis=dict(title=_title(score_axis_title(method, reduce, one_output)),
                             zeroline=True, zerolinecolor="#333333"))
    which = "Lowest" if bottom else "Highest"
    return _figure(traces, layout,
                   title=f"{which} {len(shown)} neurons by {method_label(method)} score",
                   height=max(300, 80 + 24 * len(shown)))


def method_bars(summaries: pd.DataFrame, *, reduce: str, top_n: int = 10,
                one_output: bool = False) -> go.Figure:
    """Side-by-side ranked bars, one panel per method (each with its own score axis).

    Args:
        summaries: rows (method, neuron, score, spread, n) for one cluster.
    """
    methods = list(pd.unique(summaries["method"]))
    layout, panels = _panels([method_label(m) for m in methods], spacing=0.08)
    traces = []
    for method, (anchor, x_axis, y_axis) in zip(methods, panels):
        shown = _bar_frame(summaries[summaries["method"] == method], top_n, bottom=False)
        traces.append(dict(
            type="bar", x=shown["score"].to_numpy(), y=[f"neuron {n}" for n in shown["neuron"]],
            orientation="h", marker=dict(color=method_colour(method)), name=method_label(method),
            showlegend=False, error_x=_spread_whiskers(shown["spread"]),
            hovertemplate="%{y}<br>score %{x:.4g}<extra>" + method_label(method) + "</extra>",
            **anchor))
        y_axis["autorange"] = "reversed"
        x_axis["title"] = _title(method_units(method, "score", one_output))
    return _figure(traces, layout, title=f"Top {top_n} neurons under each method "
                                         f"({REDUCTION_LABELS.get(reduce, reduce)})",
                   height=max(340, 120 + 24 * top_n), top=84)


def pruning_figure(curves: pd.DataFrame, *, n_neurons: int, metric: str = "accuracy",
                   titles: Optional[dict[str, str]] = None,
                   one_output: bool = False) -> go.Figure:
    """Pruning curves: one panel per subset (the cluster, the rest of the data).

    Args:
        curves: rows (subset, k, ranked, bottom, random_mean, random_lo, random_hi); a
            partial frame (fewer k) draws the part computed so far.
        n_neurons: the layer's size; fixes the x range so a growing curve does not jump.
        titles: panel title per subset name.
        one_output: a regression head's, whose "target logit" is its output.
    """
    subsets = list(pd.unique(curves["subset"])) or ["cluster"]
    titles = titles or {}
    layout, panels = _panels([titles.get(s, s) for s in subsets], spacing=0.05, shared_y=True)
    traces = []
    for subset, (anchor, x_axis, _) in zip(subsets, panels):
        part = curves[curves["subset"] == subset].sort_values("k")
        first = anchor["xaxis"] == "x"
        band = part.dropna(subset=["random_lo", "random_hi"])
        traces.append(dict(type="scatter", x=band["k"].to_numpy(),
                           y=band["random_hi"].to_numpy(), mode="lines", line=dict(width=0),
                           hoverinfo="skip", showlegend=False, legendgroup="random", **anchor))
        traces.append(dict(type="scatter", x=band["k"].to_numpy(),
                           y=band["random_lo"].to_numpy(), mode="lines", line=dict(width=0),
                           fill="tonexty", fillcolor=RANDOM_BAND_FILL, hoverinfo="skip",
                           showlegend=False, legendgroup="random", **anchor))
        for kind, column_name in (("random", "random_mean"), ("bottom", "bottom"),
                                  ("ranked", "ranked")):
            line = part.dropna(subset=[column_name])
            traces.append(dict(
                type="scatter", x=line["k"].to_numpy(), y=line[column_name].to_numpy(),
                mode="lines+markers" if len(line) < 3 else "lines",
                name=CURVE_LABELS[kind], legendgroup=kind, showlegend=first,
                line=dict(color=CURVE_COLOURS[kind], width=2.5 if kind == "ranked" else 2,
                          dash="dash" if kind == "random" else "solid"),
                hovertemplate="k = %{x}<br>%{y:.3g}<extra>" + CURVE_LABELS[kind] + "</extra>",
                **anchor))
        x_axis.update(title=_title("neurons removed (k)"), range=[0, n_neurons])
    layout["yaxis"]["title"] = _title(metric_axis(metric, one_output))
    if metric == "accuracy":
        layout["yaxis"].update(range=[0, 1.02], tickformat=".0%")
    layout["legend"] = dict(orientation="h", yanchor="top", y=-0.2, x=0, traceorder="reversed")
    return _figure(traces, layout, title="What happens when neurons are removed", height=460,
                   top=84)


def score_histogram(values: pd.DataFrame, *, method: str, neuron: int,
                    bins: int = 40, one_output: bool = False) -> go.Figure:
    """Histogram of one neuron's per-sample signed scores; bars left of zero are blue and
    right of zero red, with lines at zero and at the mean, so cancellation shows at a glance.

    Args:
        values: rows with a column "score" (one per sample).
    """
    scores = values["score"].to_numpy(dtype=float)
    scores = scores[np.isfinite(scores)]
    low, high = (float(scores.min()), float(scores.max())) if scores.size else (-1.0, 1.0)
    if low == high:
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(scores, bins=bins, range=(low, high))
    centres = (edges[:-1] + edges[1:]) / 2
    traces = [dict(
        type="bar", x=centres, y=counts, width=edges[1] - edges[0],
        marker=dict(color=[NEGATIVE_COLOUR if c < 0 else POSITIVE_COLOUR for c in centres],
                    line=dict(width=0)),
        customdata=np.stack([edges[:-1], edges[1:]], axis=1),
        hovertemplate="score %{customdata[0]:.3g} … %{customdata[1]:.3g}"
                      "<br>%{y} samples<extra></extra>")]
    mean = float(scores.mean()) if scores.size else 0.0
    mean_abs = float(np.abs(scores).mean()) if scores.size else 0.0
    layout = dict(
        shapes=[_vertical_line(0, dict(color="#222222", width=1)),
                _vertical_line(mean, dict(color=CURVE_COLOURS["ranked"], width=2, dash="dash"))],
        annotations=[dict(x=mean, y=1, yref="paper", yanchor="top", xanchor="left", xshift=4,
                          text=f"mean {mean:.3g}", showarrow=False,
                          font=dict(color=CURVE_COLOURS["ranked"]))],
        xaxis=dict(title=_title(score_axis_title(method, one_output=one_output))),
        # headroom above the tallest bar for the mean's label
        yaxis=dict(title=_title("samples (count)"), range=[0, 1.2 * max(1, counts.max())]))
    ratio = abs(mean) / mean_abs if mean_abs > 0 else float("nan")
    return _figure(traces, layout, title=f"Neuron {neuron}: each sample's score",
                   subtitle=f"|mean| / mean |·| = {ratio:.2f} (near 0: signs cancel)",
                   height=380)


def _vertical_line(x: float, line: dict) -> dict:
    """A line at `x` across the plot's height (plotly's add_vline)."""
    return dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain", line=line)


LABELLED_METHODS = 8
"""Up to this many methods the agreement heatmap writes each ρ in its cell (its hover always
does): with more, the cells of a page's column are too narrow for two decimals."""


def rank_correlation_heatmap(correlations: pd.DataFrame) -> go.Figure:
    """Method x method Spearman rank correlation of neuron scores.

    Args:
        correlations: rows (method_a, method_b, rho) as from `rank_correlations`.
    """
    methods, others, rho = _grid(correlations, "method_a", "method_b", "rho")
    if methods != others:  # every ordered pair: the same methods both ways
        raise ValueError(f"correlations pair {methods} with {others}")
    labels = [method_label(m) for m in methods]
    written = len(methods) <= LABELLED_METHODS  # more: cells too small for the numbers
    traces = [dict(
        type="heatmap", z=rho, x=labels, y=labels,
        colorscale=_scale(SIGNED_SCALE), zmid=0, zmin=-1, zmax=1,
        texttemplate="%{z:.2f}" if written else "", textfont=dict(size=11), xgap=2, ygap=2,
        colorbar=_colour_bar("Spearman ρ"),
        hovertemplate="%{y} vs %{x}<br>ρ = %{z:.3f}<extra></extra>")]
    layout = dict(yaxis=dict(autorange="reversed"), xaxis=dict(tickangle=-30 if written else -60))
    return _figure(traces, layout, title="Do the methods rank neurons alike? (Spearman ρ)",
                   height=max(340, 150 + 44 * len(methods)))


def scorecard_figure(card: pd.DataFrame) -> go.Figure:
    """Which method to trust, on every layer: layers x methods of Spearman ρ with exact
    ablation (its 95% interval, Kendall τ, top-10% overlap and curve area on hover; a cell
    is clickable), and beside it the same grid after the modules above the layer are
    re-initialised (a ranking that survives does not read the model).

    Args:
        card: rows (layer, method, spearman, kendall, spearman_low, spearman_high,
            top_overlap, curve_area, after_randomization) as from `attribution.scorecard`.
    """
    def number(value: float, form: str = "{:.2f}") -> str:
        return _shown(value, form) or "n/a"

    shown = card.assign(method=[method_label(m) for m in card["method"]],
                        layer=[plain(layer) for layer in card["layer"]])
    def between(row, column: str, form: str = "{:.2f}") -> str:
        low, high = getattr(row, f"{column}_low", np.nan), getattr(row, f"{column}_high", np.nan)
        if not (np.isfinite(low) and np.isfinite(high)):
            return ""
        return f" (95%: {number(low, form)} to {number(high, form)})"

    shown["details"] = [
        f"{row.layer} · {row.method}{sampled_words(row)}<br>Spearman ρ "
        f"{number(row.spearman)}{between(row, 'spearman')}"
        f"<br>Kendall τ {number(row.kendall, '{:.2f}')}{between(row, 'kendall')}"
        f"<br>top-10% overlap {number(row.top_overlap, '{:.0%}')}"
        f"{between(row, 'top_overlap', '{:.0%}')}<br>pruning damage "
        f"{number(row.curve_area, '{:.2f}')} of the oracle's (random ≈ 0)<br>after "
        f"randomising the layers above: ρ {number(row.after_randomization, '{:.2f}')}"
        for row in shown.itertuples()]
    layers, methods, rho = _grid(shown, "layer", "method", "spearman")
    after = _grid(shown, "layer", "method", "after_randomization")[2]
    details = _grid(shown.assign(order=np.arange(len(shown))), "layer", "method", "order")[2]
    details = np.where(np.isnan(details), "",
                       shown["details"].to_numpy()[np.nan_to_num(details).astype(int)])
    layout, panels = _panels(["agreement with exact ablation (Spearman ρ)",
                              "after randomising the layers above"], 0.08, shared_y=True)
    written = len(methods) <= LABELLED_METHODS
    traces = []
    for (anchors, x_axis, _), values, units in ((panels[0], rho, "Spearman ρ"),
                                                (panels[1], after, "")):
        traces.append(dict(
            type="heatmap", z=values, x=methods, y=layers, **anchors,
            colorscale=_scale(SIGNED_SCALE), zmid=0, zmin=-1, zmax=1, xgap=2, ygap=2,
            texttemplate="%{z:.2f}" if written else "", textfont=dict(size=11),
            showscale=bool(units), colorbar=_colour_bar(units)))
        x_axis.update(tickangle=-30 if written else -60)
    traces[0].update(customdata=details, hovertemplate="%{customdata}<extra></extra>")
    traces[1]["hovertemplate"] = ("%{y} · %{x}<br>ρ with the original ranking: %{z:.2f}<br>"
                                  "near 1: the ranking does not read the layers above"
                                  "<extra></extra>")
    _clickable_cells(traces, layout)
    layout["yaxis"]["autorange"] = "reversed"
    return _figure(traces, layout, title="Which method to trust, layer by layer",
                   subtitle="Click a cell to open that layer and method",
                   height=max(380, 200 + 34 * len(layers)), top=84)


def sampled_words(row) -> str:
    """" · on 256 of 3,072 neurons" for a `scorecard` row whose oracle was a sample of the
    layer's neurons (" · on 32 of 3,072 neurons and 40 of 256 samples" where of its samples
    too); "" when it was every neuron."""
    sampled, total = getattr(row, "neurons", np.nan), getattr(row, "n_neurons", np.nan)
    if not (np.isfinite(sampled) and np.isfinite(total)) or sampled >= total:
        return ""
    return f" · on {_sample_words(row)}"


def class_mix_bars(mix: pd.DataFrame, *, cluster: object) -> go.Figure:
    """What one cluster mixes: the share of each class among its samples.

    Args:
        mix: rows (name, count, share) of one cluster, largest share first
            (`attribution.analyses.verdict.cluster_composition`).
    """
    traces = [dict(
        type="bar", x=mix["share"].to_numpy(), y=[plain(name) for name in mix["name"]],
        orientation="h", marker=dict(color=CURVE_COLOURS["bottom"]),
        customdata=mix["count"].to_numpy(),
        hovertemplate="%{y}: %{x:.0%} (%{customdata} samples)<extra></extra>")]
    layout = dict(yaxis=dict(autorange="reversed", type="category", title=_title("class")),
                  xaxis=dict(title=_title("share of the cluster's samples"), tickformat=".0%",
                             range=[0, 1]))
    return _figure(traces, layout, title=f"What cluster {plain(cluster)} mixes",
                   height=max(220, 90 + 22 * len(mix)))


SUBSET_COLOURS = {"cluster": CURVE_COLOURS["ranked"], "rest": CURVE_COLOURS["random"]}


def neuron_distributions(samples: pd.DataFrame, *, method: str, neuron: int,
                         cluster: object, positions: bool = True,
                         one_output: bool = False) -> go.Figure:
    """One neuron's per-sample score and activation, the cluster against the rest.

    Args:
        samples: rows (score, activation, in_cluster), one per sample
            (`attribution.analyses.neuron.NeuronView.samples`).
        positions: does the layer have positions (the activation is their mean) or one
            value per neuron (a Linear on [N, F])?
    """
    layout, panels = _panels([f"{method_label(method)} score", "activation"], spacing=0.1)
    in_cluster = samples["in_cluster"].to_numpy(dtype=bool)
    groups = [("cluster", in_cluster, f"cluster {plain(cluster)}"),
              ("rest", ~in_cluster, "rest of the data")]
    traces = []
    for value, (anchor, x_axis, _) in zip(("score", "activation"), panels):
        for subset, rows, name in groups:
            if not rows.any():
                continue
            traces.append(dict(
                type="histogram", x=samples.loc[rows, value].to_numpy(),
                name=f"{name} ({int(rows.sum())})", histnorm="probability", opacity=0.6,
                nbinsx=40, legendgroup=subset, showlegend=value == "score",
                marker=dict(color=SUBSET_COLOURS[subset]),
                hovertemplate=f"{value} %{{x}}<br>%{{y:.1%}} of the samples<extra>"
                              f"{name}</extra>", **anchor))
        x_axis["title"] = _title(score_axis_title(method, one_output=one_output)
                                 if value == "score" else
                                 "layer output (mean over positions)" if positions else
                                 "layer output")
    layout["yaxis"].update(title=_title("share of the samples"), tickformat=".0%")
    layout["yaxis2"]["tickformat"] = ".0%"  # the same share in both panels
    layout.update(barmode="overlay",  # above the panels: below, the two-line x titles
                  legend=dict(orientation="h", yanchor="bottom", y=1.1, xanchor="right", x=1))
    return _figure(traces, layout, title=f"Neuron {neuron}: each sample's score and activation",
                   height=380, top=84)


def _upsampled(grid: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A [h, w] map stretched to [H, W] by nearest neighbour (a channel's map over its input)."""
    rows = np.arange(shape[0]) * grid.shape[0] // shape[0]
    columns = np.arange(shape[1]) * grid.shape[1] // shape[1]
    return grid[np.ix_(rows, columns)]


def _caption(example: pd.Series) -> str:
    """"#401 · 4<br>2.00": the sample's row, its label id (a regression head's true value,
    "· 0.731") and the neuron's activation."""
    label = example.get("label")
    label = "" if label is None or pd.isna(label) else \
        f" · {int(label)}" if float(label) == int(label) else f" · {label:.3g}"
    return f"#{int(example['sample'])}{label}<br>{example['activation']:.3g}"


def example_images(examples: pd.DataFrame, *, neuron: int) -> go.Figure:
    """The samples that drive a neuron most (top row) and least (bottom row) as images, with
    the neuron's map over each one when the layer has positions (a conv channel).

    The images are tiled into one mosaic (one trace, and one for the maps): a figure of one
    axis draws far faster than one subplot per image.

    Args:
        examples: rows (sample, side, activation, label, input [C, H, W], positions [h, w] or
            None) as `attribution.analyses.neuron.NeuronView.examples`.
    """
    sides = [side for side in ("most", "least") if (examples["side"] == side).any()]
    ordered = [examples[examples["side"] == side] for side in sides]
    width = max(len(part) for part in ordered)
    channels, height, breadth = np.asarray(examples["input"].iloc[0]).shape
    gap, band = max(1, breadth // 8), -(-height // 2)  # between tiles; above a tile: caption
    tile_h, tile_w = band + height, breadth + gap
    rgb = channels >= 3
    mosaic = np.full((len(sides) * tile_h, width * tile_w) + ((3,) if rgb else ()),
                     255.0 if rgb else np.nan)
    overlay = np.full((len(sides) * tile_h, width * tile_w), np.nan)
    maps = [m for m in examples["positions"] if m is not None]
    top = max((float(np.abs(m).max()) for m in maps), default=0.0) or 1.0
    captions = []
    for row, part in enumerate(ordered):
        for column, (_, example) in enumerate(part.iterrows()):
            image = np.asarray(example["input"], dtype=np.float64)
            low, high = float(image.min()), float(image.max())
            scaled = (image - low) / (high - low) if high > low else np.zeros_like(image)
            y, x = row * tile_h + band, column * tile_w
            if rgb:
                mosaic[y:y + height, x:x + breadth] = scaled[:3].transpose(1, 2, 0) * 255
            else:
                mosaic[y:y + height, x:x + breadth] = scaled[0]
            if example["positions"] is not None:
                overlay[y:y + height, x:x + breadth] = _upsampled(
                    np.asarray(example["positions"], dtype=np.float64), (height, breadth))
            captions.append(dict(x=x + (breadth - 1) / 2, y=y - 0.5, text=_caption(example),
                                 showarrow=False, yanchor="bottom", font=dict(size=10)))
    traces = [dict(type="image", z=mosaic.astype(np.uint8), hoverinfo="skip") if rgb else
              dict(type="heatmap", z=mosaic, colorscale=_scale("Greys"), showscale=False,
                   hoverinfo="skip")]
    if maps:
        traces.append(dict(
            type="heatmap", z=overlay, zmin=-top, zmax=top, opacity=0.6, showscale=False,
            colorscale=[[0, NEGATIVE_COLOUR], [0.5, "rgba(255,255,255,0)"],
                        [1, POSITIVE_COLOUR]],
            hovertemplate="neuron output %{z:.3g}<extra></extra>"))
    layout = dict(annotations=captions, xaxis=dict(visible=False, constrain="domain"),
                  yaxis=dict(visible=False, autorange="reversed", scaleanchor="x",
                             constrain="domain"))
    overlay_words = "; colour: the channel's output at each position (red > 0 > blue)" \
        if maps else ""
    return _figure(traces, layout,
                   title=f"Neuron {neuron}: the samples that activate it most (top) and least "
                         "(bottom)",
                   subtitle=f"sample number · label · activation{overlay_words}",
                   height=150 + 170 * len(sides), top=90)


def example_values(examples: pd.DataFrame, *, neuron: int,
                   feature_names: Optional[Sequence[str]] = None,
                   method: Optional[str] = None, one_output: bool = False) -> go.Figure:
    """The samples that drive a neuron most and least, as their values: feature values of a
    table [F] (colour: the value), or the tokens of a sequence (colour: the method's score at
    each token when the examples carry `token_scores`, else the neuron's output there).

    Args:
        examples: rows (sample, side, activation, input, positions[, tokens, token_scores])
            as `attribution.analyses.neuron.NeuronView.examples` (an input of named inputs
            is {name: array}: its input_ids, else its first, are drawn).
        feature_names: one name per feature, or None.
        method: the method of the token scores, for the colour bar.
    """
    rows = [f"{side} · #{int(sample)} · act {act:.3g}" for side, sample, act in
            zip(examples["side"], examples["sample"], examples["activation"])]
    scored = "token_scores" in examples and examples["token_scores"].notna().all()
    inputs = [np.asarray(value.get(TEXT_INPUT, next(iter(value.values())))
                         if isinstance(value, dict) else value).reshape(-1)
              for value in examples["input"]]  # named inputs: the token ids
    per_token = scored or all(m is not None and np.size(m) == np.size(x)
                              for m, x in zip(examples["positions"], inputs))
    if scored:  # ragged: each sample's real tokens, padded with blanks
        width = max(len(t) for t in examples["tokens"])
        colour = np.full((len(rows), width), np.nan)
        text = np.full((len(rows), width), "", dtype=object)
        for row, (tokens, values) in enumerate(zip(examples["tokens"],
                                                   examples["token_scores"])):
            colour[row, :len(values)] = values
            text[row, :len(tokens)] = [plain(token) for token in tokens]
        bar = method_units(method, "score", one_output) if method else "score"
        what = f"tokens, coloured by their {method_label(method or 'score')} score"
    elif per_token:
        colour = np.stack([np.asarray(m, dtype=np.float64).reshape(-1)
                           for m in examples["positions"]])
        text = np.stack(inputs).astype(np.int64).astype(str)
        bar, what = "neuron output", "token ids, coloured by the neuron's output at each"
    else:
        colour, text = np.stack(inputs).astype(np.float64), None
        bar, what = "value", "feature values"
    columns = list(feature_names) if feature_names is not None and not per_token \
        else [str(i) for i in range(colour.shape[1])]
    heat = dict(
        type="heatmap", z=colour, x=[plain(c) for c in columns], y=rows,
        colorbar=_colour_bar(bar),
        hovertemplate=("%{text} at position %{x}<br>" + bar + " %{z:.3g}" if per_token else
                       "%{x} = %{z:.4g}") + "<br>%{y}<extra></extra>",
        **_colour_range(colour, _is_signed(colour[np.isfinite(colour)].ravel())))
    if per_token:
        heat.update(text=text, texttemplate="%{text}")
    layout = dict(yaxis=dict(type="category", autorange="reversed"),
                  xaxis=dict(type="category",
                             title=_title("position (token)" if per_token else "feature")))
    return _figure([heat], layout,
                   title=f"Neuron {neuron}: the samples that activate it most and least ({what})",
                   height=max(300, 110 + 22 * len(rows)))


# --- tables as the app and the report show them --------------------------------------------

CURVE_SUMMARY_WORDS = {
    "subset": "samples", "area_ranked": "mean over k: top-k",
    "area_bottom": "mean over k: bottom-k", "area_random": "mean over k: random",
    "gap_vs_random": "gap vs random (area between curves)",
    "fraction_random_beaten": "random orders beaten", "p_value": "permutation p"}
ORACLE_WORDS = {
    "method": "method", "spearman_signed": "Spearman ρ (signed)",
    "spearman_abs": "Spearman ρ (|·|)", "kendall_signed": "Kendall τ (signed)",
    "kendall_abs": "Kendall τ (|·|)", "top_k_overlap_signed": "top-k overlap (signed)",
    "top_k_overlap_abs": "top-k overlap (|·|)", "top_k": "k", "neurons": "neurons compared",
    "samples": "samples compared"}


SCORECARD_WORDS = {
    "layer": "layer", "method": "method", "spearman": "Spearman ρ",
    "spearman_low": "ρ 95% low", "spearman_high": "ρ 95% high", "kendall": "Kendall τ",
    "kendall_low": "τ 95% low", "kendall_high": "τ 95% high",
    "top_overlap": "top-10% overlap", "top_overlap_low": "overlap 95% low",
    "top_overlap_high": "overlap 95% high", "curve_area": "pruning damage (oracle = 1)",
    "after_randomization": "ρ after randomising above", "n_clusters": "clusters",
    "neurons": "neurons measured", "samples": "samples measured", "n_steps": "path steps"}


def scorecard_table(card: pd.DataFrame) -> pd.DataFrame:
    """`attribution.scorecard`'s table in words: method labels, numbers to 2 decimals, the
    overlap as a percentage, "n/a" where a value does not exist, a path method's steps
    (blank for the others)."""
    shown = pd.DataFrame({"layer": card["layer"].astype(str),
                          "method": [method_label(m) for m in card["method"]]})
    for column in SCORECARD_WORDS:
        if column in ("layer", "method") or column not in card:
            continue
        if column == "neurons":
            shown[column] = [_of_neurons(row) for row in card.itertuples()]
            continue
        if column == "n_steps":  # shown where a path method is in the card
            if card[column].notna().any():
                shown[column] = ["" if pd.isna(v) else f"{int(v)}" for v in card[column]]
            continue
        if column == "samples":
            if (card["samples"] < card["n_samples"]).any():
                shown[column] = [_of(row.samples, row.n_samples) for row in card.itertuples()]
            continue
        form = ("{:.0%}" if column.startswith("top_overlap") else
                "{:.0f}" if column == "n_clusters" else "{:.2f}")
        shown[column] = [_shown(float(v), form) or "n/a" for v in card[column]]
    return shown.rename(columns=SCORECARD_WORDS)


def change_interval_words(row, metric: str) -> str:
    """", 95% interval -3.1 to -0.4 pp over the samples" for a removal row of the neuron
    view (`NeuronView.removal`: change_low, change_high); "" where it has none."""
    low, high = row.get("change_low", np.nan), row.get("change_high", np.nan)
    if not (np.isfinite(low) and np.isfinite(high)):
        return ""
    said = ((f"{low * 100:+.1f} to {high * 100:+.1f} pp") if metric == "accuracy"
            else f"{low:+.3g} to {high:+.3g}")
    return f", 95% interval {said} over the samples"


def oracle_sample_words(table: pd.DataFrame) -> str:
    """One sentence on the layers whose oracle was a sample of their neurons, from a
    `scorecard` or `oracle_agreement` table (its neurons and n_neurons columns; a layer
    column when there is one); "" when every oracle was exact."""
    if "neurons" not in table or not len(table):
        return ""
    if "layer" in table:
        columns = [c for c in ("neurons", "n_neurons", "samples", "n_samples") if c in table]
        layers = table.groupby("layer", sort=False)[columns].first()
    else:  # one layer (an oracle table): its samples compared, over its clusters
        clusters = table.drop_duplicates("cluster") if "cluster" in table else table.iloc[:1]
        layers = table[["neurons", "n_neurons"]].iloc[:1]
        if {"samples", "n"} <= set(table):
            layers = layers.assign(samples=clusters["samples"].sum(),
                                   n_samples=clusters["n"].sum())
    sampled = layers[layers["neurons"] < layers["n_neurons"]]
    if sampled.empty:
        return ""
    where = [(f"{plain(layer)}: " if "layer" in table else "")
             + _sample_words(row)
             for layer, row in zip(sampled.index, sampled.itertuples())]
    return ("Exact ablation measured a random sample of the neurons (and, where even the "
            "fewest pass its time budget, of the samples), as many as fit its time "
            f"budget ({'; '.join(where)}); every number above is on that sample, and "
            "its 95% interval spans both draws, samples and neurons.")


def _sample_words(row) -> str:
    """"32 of 3,072 neurons" of a row, "32 of 3,072 neurons and 40 of 256 samples" where it
    measured a share of its samples (`samples` < `n_samples`)."""
    said = f"{int(row.neurons):,} of {int(row.n_neurons):,} neurons"
    samples, total = getattr(row, "samples", np.nan), getattr(row, "n_samples", np.nan)
    if np.isfinite(samples) and np.isfinite(total) and samples < total:
        said += f" and {int(samples):,} of {int(total):,} samples"
    return said


def _of(part: int, whole: int) -> str:
    """"256 of 3,072", or "all 64" where the part is the whole."""
    return f"all {int(whole):,}" if part >= whole else f"{int(part):,} of {int(whole):,}"


def _of_neurons(row) -> str:
    """"256 of 3,072" (an oracle on a sample of the neurons) or "all 64"."""
    return _of(row.neurons, row.n_neurons)


def _shown(value: float, form: str) -> str:
    return "" if value is None or not np.isfinite(value) else form.format(value)


def curve_summary_table(summary: pd.DataFrame, *, metric: str) -> pd.DataFrame:
    """`attribution.curve_summary`'s table in words, rounded as read: accuracy in % (1
    decimal; the gap in percentage points), other metrics to 3 decimals, the share of random
    orders beaten in whole %, its permutation p-value to 2 decimals. One row per subset,
    every cell a string."""
    accuracy = metric == "accuracy"
    area = "{:.1%}" if accuracy else "{:.3f}"
    gap = (lambda v: f"{v * 100:+.1f} pp") if accuracy else (lambda v: f"{v:+.3f}")
    table = pd.DataFrame({"subset": summary.index.astype(str)})
    for column in ("area_ranked", "area_bottom", "area_random"):
        table[column] = [_shown(v, area) for v in summary[column]]
    table["gap_vs_random"] = ["" if not np.isfinite(v) else gap(v)
                              for v in summary["gap_vs_random"]]
    table["fraction_random_beaten"] = [_shown(v, "{:.0%}")
                                       for v in summary["fraction_random_beaten"]]
    table["p_value"] = [_shown(v, "{:.2f}") for v in summary.get(
        "p_value", pd.Series(np.nan, index=summary.index))]
    return table.rename(columns=CURVE_SUMMARY_WORDS)


def oracle_table(table: pd.DataFrame) -> pd.DataFrame:
    """`attribution.oracle_agreement`'s table in words: method labels, correlations and
    overlaps to 2 decimals (Spearman with its 95% interval), k as an integer, the neurons
    compared where the oracle was a sample ("256 of 3,072"); columns other than
    `ORACLE_WORDS` dropped."""
    shown = pd.DataFrame({"method": [method_label(m) for m in table["method"]]})
    sampled = "neurons" in table and bool((table["neurons"] < table["n_neurons"]).any())
    some_samples = "samples" in table and bool((table["samples"] < table["n"]).any())
    for column in ORACLE_WORDS:
        if column in ("method",) or column not in table or (
                (column == "neurons" and not sampled)
                or (column == "samples" and not some_samples)):
            continue
        if column == "neurons":
            shown[column] = [_of_neurons(row) for row in table.itertuples()]
            continue
        if column == "samples":
            shown[column] = [_of(row.samples, row.n) for row in table.itertuples()]
            continue
        form = "{:.0f}" if column == "top_k" else "{:.2f}"
        shown[column] = [_shown(float(v), form) for v in table[column]]
        if f"{column}_low" in table:  # its interval: "0.92 [0.88, 0.95]"
            shown[column] = [
                f"{said} [{_shown(float(low), form)}, {_shown(float(high), form)}]"
                if said and np.isfinite(low) and np.isfinite(high) else said
                for said, low, high in zip(shown[column], table[f"{column}_low"],
                                           table[f"{column}_high"])]
    return shown.rename(columns=ORACLE_WORDS)
