"""The shared figures: tidy frames in, plotly figures out; colours, scales, escaping."""
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch
from torch import nn

import attribution as at
from attribution.presentation import plots
from attribution.analyses.neuron import neuron_from_point
from attribution.methods.scores import reduce_scores
from tests.support.figures import every_figure, examples


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    inputs = torch.randn(40, 5)
    clusters = np.array(["a", "b", "c", "d"] * 10)
    targets = torch.arange(40) % 3
    return model, inputs, targets, clusters


def _summary(values: list[float], method: str = "gradient") -> pd.DataFrame:
    return pd.DataFrame({"method": method, "neuron": range(len(values)), "score": values,
                         "spread": [0.1 * (i + 1) for i in range(len(values))], "n": 7})


@pytest.mark.parametrize("reduce", ["mean", "mean_abs", "std"])
def test_cluster_table_equals_engine_cluster_scores(small_model, reduce):
    model, inputs, targets, clusters = small_model
    per_sample = at.neuron_scores(model, "0", inputs, targets, "gradient").numpy()
    engine = at.cluster_scores(model, "0", inputs, targets, clusters, "gradient", reduce=reduce)
    ours = plots.cluster_table(per_sample, clusters, reduce)
    assert list(ours.index) == list(engine.index)
    assert list(ours["n"]) == list(engine["n"])
    np.testing.assert_allclose(ours.drop(columns="n").to_numpy(),
                               engine.drop(columns="n").to_numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduce", ["mean", "mean_abs", "std"])
def test_every_view_of_a_cluster_reduces_by_the_one_rule(small_model, reduce):
    """The cluster score of the engine's streamed sums, of the dashboard's tables, of one
    cluster's samples (diagnose, the bars, the sample heatmap's order) is `reduce_scores`."""
    model, inputs, targets, clusters = small_model
    per_sample = at.neuron_scores(model, "0", inputs, targets).numpy()
    engine = at.cluster_scores(model, "0", inputs, targets, clusters, reduce=reduce)
    table = plots.cluster_table(per_sample, clusters, reduce)
    for cluster in engine.index:
        own = reduce_scores(per_sample[clusters == cluster], reduce)
        assert own.dtype == np.float32  # the samples' own dtype, as diagnose compared it
        np.testing.assert_allclose(own, engine.loc[cluster].drop("n"), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(own, table.loc[cluster].drop("n"), rtol=1e-5, atol=1e-6)
    summary = plots.neuron_summary(per_sample[clusters == "a"], reduce, "gradient")
    np.testing.assert_array_equal(summary["score"],
                                  reduce_scores(per_sample[clusters == "a"].astype(float),
                                                reduce))
    single = reduce_scores(per_sample[:1], reduce)
    assert np.isnan(single).all() if reduce == "std" else np.isfinite(single).all()
    with pytest.raises(at.AttributionError, match="Unknown reduce"):
        reduce_scores(per_sample, "median")


def test_tidy_cluster_scores_keeps_every_value(small_model):
    model, inputs, targets, clusters = small_model
    table = at.cluster_scores(model, "0", inputs, targets, clusters, "gradient")
    tidy = plots.tidy_cluster_scores(table, "gradient")
    assert list(tidy.columns) == ["cluster", "neuron", "method", "score", "n"]
    assert len(tidy) == 4 * 6
    row = tidy[(tidy["cluster"] == "c") & (tidy["neuron"] == 4)].iloc[0]
    assert row["score"] == pytest.approx(table.loc["c", 4])
    assert row["n"] == 10


def test_cluster_heatmap_signed_scale_is_centred_and_hover_names_everything():
    tidy = pd.DataFrame({"cluster": ["x", "x", "y", "y"], "neuron": [0, 1, 0, 1],
                         "score": [-3.0, 1.0, 0.5, 2.0], "n": [4, 4, 9, 9]})
    heatmap = plots.cluster_heatmap(tidy, method="gradient", reduce="mean").data[0]
    assert heatmap.zmid == 0 and heatmap.zmin == -3.0 and heatmap.zmax == 3.0
    assert heatmap.colorscale == plots.cluster_heatmap(tidy.assign(score=-tidy["score"]),
                                                       method="gradient",
                                                       reduce="mean").data[0].colorscale
    for word in ("cluster", "neuron", "score", "n ="):
        assert word in heatmap.hovertemplate
    assert np.asarray(heatmap.customdata).tolist() == [[4, 4], [9, 9]]
    assert np.asarray(heatmap.z).tolist() == [[-3.0, 1.0], [0.5, 2.0]]


def test_cluster_heatmap_magnitudes_start_at_zero():
    tidy = pd.DataFrame({"cluster": [0, 1], "neuron": [0, 0], "score": [0.2, 0.8], "n": [1, 1]})
    heatmap = plots.cluster_heatmap(tidy, method="ablation", reduce="mean_abs").data[0]
    assert heatmap.zmin == 0 and heatmap.zmax == pytest.approx(0.8) and heatmap.zmid is None


def test_user_strings_are_escaped_in_figures():
    name = "<a href='javascript:alert(1)'>x</a>"
    tidy = pd.DataFrame({"cluster": [name], "neuron": [0], "score": [1.0], "n": [3]})
    figure = plots.cluster_heatmap(tidy, method="gradient", reduce="mean")
    assert "<a" not in figure.data[0].y[0] and "&lt;a" in figure.data[0].y[0]
    samples = plots.tidy_sample_scores(np.ones((2, 2)), [0, 1])
    title = plots.sample_heatmap(samples, method="gradient", cluster=name).layout.title.text
    assert "<a" not in title


def test_neuron_bars_top_and_bottom_with_error_bars():
    summary = _summary([0.5, -2.0, 3.0, 1.0, -0.1])
    top = plots.neuron_bars(summary, method="gradient", reduce="mean", top_n=2).data[0]
    assert list(top.y) == ["neuron 2", "neuron 3"]
    assert list(top.error_x.array) == pytest.approx([0.3, 0.4])
    bottom = plots.neuron_bars(summary, method="gradient", reduce="mean", top_n=2,
                               bottom=True).data[0]
    assert list(bottom.y) == ["neuron 1", "neuron 4"]
    assert top.marker.color == plots.method_colour("gradient")


def test_axis_titles_carry_units():
    summary = _summary([1.0, 2.0], method="ablation")
    figure = plots.neuron_bars(summary, method="ablation", reduce="mean_abs")
    assert "(logit drop)" in figure.layout.xaxis.title.text
    assert "mean |·|" in figure.layout.xaxis.title.text


def test_method_bars_one_panel_and_one_colour_per_method():
    summaries = pd.concat([_summary([1.0, 2.0, 3.0], "gradient"),
                           _summary([3.0, 2.0, 1.0], "activation")])
    figure = plots.method_bars(summaries, reduce="mean", top_n=2)
    assert [t.marker.color for t in figure.data] == [plots.method_colour("gradient"),
                                                     plots.method_colour("activation")]
    assert list(figure.data[0].y) == ["neuron 2", "neuron 1"]
    assert list(figure.data[1].y) == ["neuron 0", "neuron 1"]
    assert figure.data[0].xaxis != figure.data[1].xaxis


def _curve(subset: str, n: int, rows: int) -> pd.DataFrame:
    """Rows shaped like `cluster_pruning_curves` output for one subset."""
    k = np.arange(rows)
    return pd.DataFrame({"subset": subset, "k": k, "ranked": 1 - k / n,
                         "bottom": np.ones(rows),
                         "random_mean": 1 - k / (2 * n), "random_lo": 1 - k / (1.5 * n),
                         "random_hi": 1 - k / (3 * n)})


def test_pruning_figure_colours_per_kind_in_both_panels_and_fixed_x_range():
    curves = pd.concat([_curve("cluster", 8, 9), _curve("rest", 8, 3)], ignore_index=True)
    figure = plots.pruning_figure(curves, n_neurons=8)
    named = [t for t in figure.data if t.name]
    by_kind = {kind: [t for t in named if t.name == label]
               for kind, label in plots.CURVE_LABELS.items()}
    for kind, traces in by_kind.items():
        assert len(traces) == 2
        assert {t.line.color for t in traces} == {plots.CURVE_COLOURS[kind]}
        assert sum(bool(t.showlegend) for t in traces) == 1
    ranked_rest = by_kind["ranked"][1]
    assert list(ranked_rest.x) == [0, 1, 2]
    assert list(figure.layout.xaxis.range) == [0, 8] == list(figure.layout.xaxis2.range)
    assert figure.layout.yaxis.tickformat == ".0%"


def test_pruning_figure_draws_a_partial_curve():
    partial = _curve("cluster", 8, 1)
    figure = plots.pruning_figure(partial, n_neurons=8)
    ranked = [t for t in figure.data if t.name == plots.CURVE_LABELS["ranked"]]
    assert len(ranked) == 1 and list(ranked[0].x) == [0] and "markers" in ranked[0].mode


def test_histogram_colours_by_sign_and_counts_every_sample():
    scores = pd.DataFrame({"score": [-2.0, -1.5, -1.0, 1.0, 1.5, 2.0, 2.5]})
    figure = plots.score_histogram(scores, method="gradient", neuron=3, bins=10)
    bars = figure.data[0]
    assert sum(bars.y) == 7
    for centre, colour in zip(bars.x, bars.marker.color):
        assert colour == (plots.NEGATIVE_COLOUR if centre < 0 else plots.POSITIVE_COLOUR)
    assert "= 0.22 " in figure.layout.title.subtitle.text  # |mean| / mean|.| = 2.5 / 11.5
    # the mean's label sits at the top, in headroom above the tallest bar, not on it
    assert figure.layout.yaxis.range[1] >= 1.2 * max(bars.y)
    assert figure.layout.annotations[0].yanchor == "top" and figure.layout.annotations[0].y == 1


def test_rank_correlations_and_heatmap():
    scores = pd.concat([_summary([1.0, 2.0, 3.0, 4.0], "gradient"),
                        _summary([4.0, 3.0, 2.0, 1.0], "random"),
                        _summary([10.0, 20.0, 30.0, 40.0], "ablation")])
    rho = plots.rank_correlations(scores).set_index(["method_a", "method_b"])["rho"]
    assert rho[("gradient", "ablation")] == pytest.approx(1.0)
    assert rho[("gradient", "random")] == pytest.approx(-1.0)
    heatmap = plots.rank_correlation_heatmap(plots.rank_correlations(scores)).data[0]
    assert (heatmap.zmin, heatmap.zmid, heatmap.zmax) == (-1, 0, 1)
    assert np.asarray(heatmap.z).shape == (3, 3)
    assert heatmap.texttemplate == "%{z:.2f}"  # three methods: each rho written in its cell
    many = pd.concat([_summary(list(np.random.default_rng(i).random(4)), f"m{i}")
                      for i in range(plots.LABELLED_METHODS + 1)])
    crowded = plots.rank_correlation_heatmap(plots.rank_correlations(many)).data[0]
    assert crowded.texttemplate == "" and "ρ = %{z:.3f}" in crowded.hovertemplate


def test_sample_scores_sorted_and_downsampled():
    rng = np.random.default_rng(0)
    per_sample = rng.normal(size=(500, 4))
    per_sample[:, 2] += 5  # highest mean: shown first
    tidy = plots.tidy_sample_scores(per_sample, np.arange(500) + 1000, max_samples=50)
    assert tidy["sample"].nunique() == 50
    assert list(pd.unique(tidy["neuron"]))[0] == 2
    first_neuron = tidy[tidy["neuron"] == 2]["score"].to_numpy()
    assert np.all(np.diff(first_neuron) <= 0)
    assert tidy["sample"].iloc[0] == 1000 + int(np.argmax(per_sample[:, 2]))
    figure = plots.sample_heatmap(tidy, method="gradient", cluster=1, n_total=500)
    assert np.asarray(figure.data[0].z).shape == (50, 4)
    assert figure.layout.yaxis.title.text == "sample<br>(50 of 500 samples, evenly spaced)"


def test_the_samples_heatmap_labels_every_neuron_it_has_room_for():
    """Sorted by score, plotly's own ticks labelled every other neuron ("2, 12, 18, ..."):
    16 or 32 neurons get every label, upright; 128 get every 3rd, which the axis says."""
    rng = np.random.default_rng(0)
    for n_neurons, step in ((16, 1), (32, 1), (128, 3)):
        tidy = plots.tidy_sample_scores(rng.normal(size=(20, n_neurons)), np.arange(20))
        axis = plots.sample_heatmap(tidy, method="gradient", cluster=1).layout.xaxis
        order = [str(n) for n in pd.unique(tidy["neuron"])]
        assert list(axis.tickvals) == order[::step] == list(axis.ticktext)
        assert axis.tickangle == -90
        assert ("every 3rd labelled" in axis.title.text) == (step == 3)


def test_wide_layers_are_thinned_and_drawn_without_cell_gaps():
    rng = np.random.default_rng(0)
    per_sample = rng.normal(size=(30, 1024))
    tidy = plots.tidy_sample_scores(per_sample, np.arange(30))
    shown = list(pd.unique(tidy["neuron"]))
    assert len(shown) == 128 and shown[0] == int(np.argmax(per_sample.mean(0)))
    assert shown[-1] == int(np.argmin(per_sample.mean(0)))  # both ends of the ranking
    figure = plots.sample_heatmap(tidy, method="gradient", cluster=1)
    assert np.asarray(figure.data[0].z).shape == (30, 128)
    assert "128 of 1024, evenly spaced" in figure.layout.xaxis.title.text
    wide = pd.DataFrame({"cluster": np.repeat(["x", "y"], 1024), "neuron": np.tile(
        np.arange(1024), 2), "score": rng.normal(size=2048), "n": 5})
    heatmap = plots.cluster_heatmap(wide, method="gradient", reduce="mean").data[0]
    assert heatmap.xgap == 0 and heatmap.ygap == 1  # a 1 px gap would hide sub-pixel cells
    narrow = plots.cluster_heatmap(wide[wide["neuron"] < 16], method="gradient",
                                   reduce="mean").data[0]
    assert narrow.xgap == 1


def test_a_wide_layers_cluster_heatmap_shows_each_clusters_strongest_neurons_and_says_so():
    """10 clusters x 3072 neurons (a transformer MLP): 128 neurons shown, each cluster's
    strongest first, and the axis title says so (one clickable marker per cell would be 30,720
    points for the browser, ~3 s a redraw, in cells narrower than a pixel)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(10, 3072))
    strongest = {c: 300 * c + 7 for c in range(10)}  # each cluster's own, one of them negative
    for c, neuron in strongest.items():
        z[c, neuron] = 40.0 if c else -50.0
    z[4, 9] = np.nan  # a cluster whose scores are not finite there: never preferred
    tidy = pd.DataFrame({"cluster": np.repeat([f"c{c}" for c in range(10)], 3072),
                         "neuron": np.tile(np.arange(3072), 10), "score": z.ravel(), "n": 5})
    figure = plots.cluster_heatmap(tidy, method="gradient", reduce="mean", highlight="c3")
    heat, cells = figure.data
    shown = [int(x) for x in heat.x]
    assert len(shown) == plots.MOST_HEATMAP_NEURONS == 128 and shown == sorted(set(shown))
    assert set(strongest.values()) <= set(shown)  # the largest |score| of every cluster
    ranks = np.argsort(-np.abs(np.nan_to_num(z, nan=0)), axis=1)[:, :12]
    assert set(ranks.ravel()) <= set(shown)  # and the next ones, cluster by cluster
    assert 9 not in shown
    np.testing.assert_array_equal(np.asarray(heat.z, dtype=float), z[:, shown])
    assert heat.zmin == -50.0 and heat.zmax == 50.0  # the layer's range, not just the shown
    assert figure.layout.xaxis.type == "category"  # kept neurons side by side, none stretched
    assert "128 of 3072: each cluster's largest |score|" in figure.layout.xaxis.title.text
    assert len(cells.x) == 10 * 128  # a marker per drawn cell, no more
    clicked = {"x": cells.x[5 * 128 + 3], "y": cells.y[5 * 128 + 3]}
    assert clicked["y"] == "c5" and neuron_from_point(clicked) == shown[3]
    narrow = plots.cluster_heatmap(tidy[tidy["neuron"] < 16], method="gradient", reduce="mean")
    assert list(narrow.data[0].x) == list(range(16)) and narrow.layout.xaxis.type is None
    assert narrow.layout.xaxis.title.text == "neuron (index in the layer)"


def test_neuron_summary_spread_is_across_samples():
    per_sample = np.array([[1.0, -1.0], [3.0, 1.0]])
    signed = plots.neuron_summary(per_sample, "mean", "gradient")
    assert list(signed["score"]) == [2.0, 0.0]
    assert list(signed["spread"]) == pytest.approx([np.sqrt(2), np.sqrt(2)])
    magnitude = plots.neuron_summary(per_sample, "mean_abs", "gradient")
    assert list(magnitude["score"]) == [2.0, 1.0]
    assert list(magnitude["spread"]) == pytest.approx([np.sqrt(2), 0.0])


# --- the answers' figures ------------------------------------------------------------------

def test_example_images_tile_each_sample_with_its_channel_map_on_two_rows():
    images = [np.full((1, 8, 8), float(i)) + np.eye(8) for i in range(3)]
    maps = [np.arange(4.0).reshape(2, 2) * (i + 1) for i in range(3)]
    fig = plots.example_images(examples(images, maps), neuron=5)
    mosaic, overlay = (np.asarray(t.z, dtype=float) for t in fig.data)
    assert mosaic.shape == overlay.shape == (2 * 12, 2 * 9)  # rows: caption band 4 + 8
    np.testing.assert_array_equal(mosaic[4:12, 9:17], np.eye(8))  # sample 1, scaled to 0..1
    np.testing.assert_array_equal(overlay[16:18, 0:4], np.zeros((2, 4)))  # sample 2's map,
    np.testing.assert_array_equal(overlay[20:24, 4:8], np.full((4, 4), 9.0))  # upsampled
    assert np.isnan(mosaic[16:24, 9:17]).all()  # the second row has one sample
    assert np.isnan(mosaic[12:16]).all()  # the band for the second row's captions
    assert fig.data[1].zmax == pytest.approx(9.0)  # one colour scale for every map
    captions = [(a.text, a.x, a.y) for a in fig.layout.annotations]
    assert [c[0] for c in captions] == ["#0 · 4<br>3", "#1<br>2", "#2 · 1<br>0"]
    assert captions[2][1] == captions[0][1] and captions[2][2] > captions[0][2]  # row 2
    assert "most (top)" in fig.layout.title.text
    rgb = plots.example_images(examples([np.random.rand(3, 4, 4)] * 3, [None] * 3), neuron=1)
    assert [t.type for t in rgb.data] == ["image"]


def test_example_values_colour_tokens_by_the_neuron_output_or_show_feature_values():
    tokens = [np.array([5, 9, 2]), np.array([1, 1, 7]), np.array([3, 0, 4])]
    per_token = [np.array([0.5, -1.0, 2.0])] * 3
    fig = plots.example_values(examples(tokens, per_token), neuron=2)
    assert np.asarray(fig.data[0].text)[0].tolist() == ["5", "9", "2"]
    assert np.asarray(fig.data[0].z)[0].tolist() == [0.5, -1.0, 2.0]
    table = plots.example_values(examples([np.array([0.1, 0.2])] * 3, [None] * 3), neuron=2,
                                 feature_names=["<b>a</b>", "b"])
    assert list(table.data[0].x) == ["&lt;b&gt;a&lt;/b&gt;", "b"]  # names are inert
    assert table.data[0].text is None


def test_neuron_distributions_split_cluster_and_rest_in_both_panels():
    samples = pd.DataFrame({"score": [1.0, -1.0, 0.5, 0.2], "activation": [2.0, 0.0, 1.0, 3.0],
                            "in_cluster": [True, True, False, False]})
    fig = plots.neuron_distributions(samples, method="gradient", neuron=3, cluster="<i>x</i>")
    assert [t.name for t in fig.data] == ["cluster &lt;i&gt;x&lt;/i&gt; (2)",
                                          "rest of the data (2)"] * 2
    assert list(fig.data[2].x) == [2.0, 0.0] and fig.data[0].histnorm == "probability"
    assert fig.layout.xaxis2.title.text == "layer output (mean over positions)"
    flat = plots.neuron_distributions(samples, method="gradient", neuron=3, cluster=1,
                                      positions=False)  # a Linear's neuron has no positions
    assert flat.layout.xaxis2.title.text == "layer output"


def test_class_mix_bars_show_shares_largest_first():
    mix = pd.DataFrame({"name": ["six", "eight"], "count": [3, 1], "share": [0.75, 0.25]})
    fig = plots.class_mix_bars(mix, cluster=2)
    assert list(fig.data[0].x) == [0.75, 0.25] and list(fig.data[0].y) == ["six", "eight"]
    assert fig.layout.title.text == "What cluster 2 mixes"


def test_samples_heatmap_orders_neurons_by_the_chosen_reduction():
    # neuron 0: large scores of both signs (signed mean 0, mean |·| 5); neuron 1: +1 always
    per_sample = np.array([[5.0, 1.0], [-5.0, 1.0], [5.0, 1.0], [-5.0, 1.0]])
    signed = plots.tidy_sample_scores(per_sample, np.arange(4))
    magnitude = plots.tidy_sample_scores(per_sample, np.arange(4), reduce="mean_abs")
    assert list(pd.unique(signed["neuron"])) == [1, 0]
    assert list(pd.unique(magnitude["neuron"])) == [0, 1]
    title = plots.sample_heatmap(magnitude, method="gradient", cluster=0).layout.xaxis.title.text
    assert "sorted by cluster mean |·|" in title
    assert "sorted by cluster signed mean" in \
        plots.sample_heatmap(signed, method="gradient", cluster=0).layout.xaxis.title.text


def test_colour_legend_says_what_the_colours_of_these_scores_mean():
    assert plots.colour_legend([-1.0, 2.0], "mean").startswith("Signed scores: red raises")
    magnitudes = plots.colour_legend([0.0, 2.0], "mean_abs")
    assert "mean |·|" in magnitudes and "red" not in magnitudes and "sign is dropped" in magnitudes
    assert "red" not in plots.colour_legend([0.0, 2.0], "mean")
    # the words follow the scale the figure draws: zero dark purple, the largest yellow
    scale = plots._colour_range(np.array([0.0, 2.0]), signed=False)["colorscale"]
    assert scale[0][1].lower() in ("#440154", "rgb(68,1,84)")
    assert scale[-1][1].lower() in ("#fde725", "rgb(253,231,37)")
    for reduce in ("mean", "mean_abs"):
        assert "from dark purple at zero to yellow" in plots.colour_legend([0.0, 2.0], reduce)


def _summary_frame() -> pd.DataFrame:
    return pd.DataFrame({"area_ranked": [0.41234, 0.8], "area_bottom": [0.95, 0.97],
                         "area_random": [0.7, 0.9], "gap_vs_random": [0.28766, 0.1],
                         "fraction_random_beaten": [1.0, np.nan], "p_value": [1 / 21, np.nan]},
                        index=pd.Index(["cluster", "rest"], name="subset"))


def test_curve_summary_table_uses_the_apps_words_and_rounding():
    table = plots.curve_summary_table(_summary_frame(), metric="accuracy")
    assert list(table.columns) == list(plots.CURVE_SUMMARY_WORDS.values())
    assert table.iloc[0].tolist() == ["cluster", "41.2%", "95.0%", "70.0%", "+28.8 pp", "100%",
                                      "0.05"]
    assert table.iloc[1, -2:].tolist() == ["", ""]  # unknown (no random curves): blank, not nan
    logits = plots.curve_summary_table(_summary_frame(), metric="target_logit")
    assert logits.iloc[0, 1:5].tolist() == ["0.412", "0.950", "0.700", "+0.288"]


def test_oracle_table_uses_the_apps_words_and_rounding():
    table = pd.DataFrame({"method": ["gradient_x_activation"], "spearman_signed": [0.98765],
                          "spearman_abs": [0.5], "kendall_signed": [0.9], "kendall_abs": [0.4],
                          "top_k_overlap_signed": [1.0], "top_k_overlap_abs": [0.75],
                          "top_k": [4], "n": [16]})
    shown = plots.oracle_table(table)
    assert list(shown.columns) == [words for column, words in plots.ORACLE_WORDS.items()
                                   if column not in ("neurons", "samples")]  # "n" is left out
    assert shown.iloc[0].tolist() == [plots.method_label("gradient_x_activation"), "0.99",
                                      "0.50", "0.90", "0.40", "1.00", "0.75", "4"]
    sampled = plots.oracle_table(table.assign(spearman_signed_low=0.9, spearman_signed_high=1.0,
                                              neurons=256, n_neurons=3072, samples=16))
    assert list(sampled.columns) == [words for column, words in plots.ORACLE_WORDS.items()
                                     if column != "samples"]  # every sample compared
    assert sampled.iloc[0, 1] == "0.99 [0.90, 1.00]" and sampled.iloc[0, -1] == "256 of 3,072"
    assert plots.oracle_sample_words(table.assign(neurons=256, n_neurons=3072)).startswith(
        "Exact ablation measured a random sample of the neurons (and, where even the fewest "
        "pass its time budget, of the samples), as many as fit its time budget (256 of 3,072 "
        "neurons)")
    few = plots.oracle_table(table.assign(neurons=32, n_neurons=3072, samples=8))
    assert list(few.columns) == list(plots.ORACLE_WORDS.values())
    assert few.iloc[0, -2:].tolist() == ["32 of 3,072", "8 of 16"]
    assert "(32 of 3,072 neurons and 8 of 16 samples)" in plots.oracle_sample_words(
        table.assign(neurons=32, n_neurons=3072, samples=8))


def test_the_reports_tables_use_the_apps_words():
    from attribution.presentation import report

    loaded, dataset = at.load_demo("digits_mlp")
    settings = report.AnalysisSettings(layer="relu2", cluster=3, n_random=5)
    page = report.render_report(report.collect_report(loaded, dataset, settings))
    for words in ("mean over k: top-k", "gap vs random (area between curves)",
                  "random orders beaten", "Spearman ρ (signed)", "top-k overlap (|·|)"):
        assert words in page, words
    for raw in ("area_ranked", "gap_vs_random", "spearman_signed", "fraction_random_beaten"):
        assert raw not in page.replace("curve_summary", ""), raw


def test_heatmap_cells_are_clickable_points_with_the_cells_hover_text():
    scores = pd.DataFrame({"cluster": ["a", "a", "b", "b"], "neuron": [0, 1, 0, 1],
                           "score": [0.5, -1.0, 2.0, 0.0], "n": [3, 3, 4, 4]})
    fig = plots.cluster_heatmap(scores, method="gradient", reduce="mean")
    heat, cells = fig.data
    assert heat.hoverinfo == "skip" and cells.type == "scatter" and cells.mode == "markers"
    assert list(cells.x) == [0, 1, 0, 1] and list(cells.y) == ["a", "a", "b", "b"]
    assert np.asarray(cells.customdata).tolist() == [[0.5, 3], [-1.0, 3], [2.0, 4], [0.0, 4]]
    assert "%{customdata[0]:.4g}" in cells.hovertemplate and "%{customdata[1]}" in \
        cells.hovertemplate and cells.marker.opacity == 0
    samples = plots.sample_heatmap(plots.tidy_sample_scores(np.eye(3), [7, 8, 9]),
                                   method="gradient", cluster="c")
    heat, columns = samples.data
    # a click needs only the neuron: one marker per column (not per cell, which cost the
    # browser ~100 ms a redraw at 200 x 16), hovered by x, with the cells' own hover text
    assert sorted(columns.x) == ["0", "1", "2"]  # neuron ids as on the axis, once each
    assert samples.layout.hovermode == "x" and columns.hoverinfo == "none"
    assert heat.hoverinfo != "skip" and "%{z:.4g}" in heat.hovertemplate
    assert columns.marker.opacity == 0 and columns.selected.marker.opacity == 0


# --- figures built without plotly's validation are still what plotly would read -----------

@pytest.mark.parametrize("name", list(every_figure()))
def test_every_figure_is_valid_plotly_and_exactly_what_plotly_would_send(name):
    """Figures are built from dicts without plotly's validation (for speed): validating one
    now must raise on nothing (an unknown or ill-typed property raises ValueError) and change
    nothing plotly.js receives (e.g. a plotly.py-only colour scale name like "RdBu_r")."""
    figure = every_figure()[name]
    validated = go.Figure(figure.to_dict())
    as_sent = [json.dumps(json.loads(pio.to_json(f, validate=False)), sort_keys=True)
               for f in (figure, validated)]
    assert as_sent[0] == as_sent[1]


def test_a_grid_keeps_first_appearance_order_and_holes_and_refuses_a_pair_twice():
    tidy = pd.DataFrame({"row": ["b", "a", "b"], "column": [2, 1, 1], "value": [1., 2., 3.]})
    rows, columns, grid = plots._grid(tidy, "row", "column", "value")
    assert rows == ["b", "a"] and columns == [2, 1]
    np.testing.assert_array_equal(grid, [[1.0, 3.0], [np.nan, 2.0]])
    with pytest.raises(ValueError, match="more than one value"):
        plots._grid(pd.concat([tidy, tidy[:1]]), "row", "column", "value")
