"""Every figure builder of `attribution.plots` on small inputs, for the tests that check what
plotly and plotly.js make of them."""
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attribution.presentation import plots


def examples(inputs: list, positions: list, sides=("most", "most", "least")) -> pd.DataFrame:
    """The example samples as `plots.example_images` and `plots.example_values` take them: one
    row per input (by default two of the most activating, then one of the least)."""
    return pd.DataFrame({"sample": range(len(inputs)), "rank": 1, "side": list(sides),
                         "activation": [3.0, 2.0, 0.0], "score": 0.1, "in_cluster": True,
                         "label": [4, None, 1], "input": inputs, "positions": positions})


def every_figure() -> dict[str, go.Figure]:
    """Each figure builder on small inputs, signed and not, one panel and several."""
    rng = np.random.default_rng(3)
    signed, magnitude = rng.normal(size=(30, 5)), rng.random((30, 5))
    clusters = np.array(["a", "<b>b</b>", "c"] * 10)
    summaries = pd.concat([plots.neuron_summary(signed[:10], "mean", "gradient"),
                           plots.neuron_summary(magnitude[:10], "mean_abs", "ablation")],
                          ignore_index=True)
    curves = pd.DataFrame([dict(subset=subset, k=k, ranked=1 - k / 5, bottom=1 - k / 9,
                                random_mean=1 - k / 7, random_lo=np.nan if k == 2 else 0.5,
                                random_hi=np.nan if k == 2 else 0.9)
                           for subset in ("cluster", "rest") for k in range(6)])
    samples = pd.DataFrame({"score": [1.0, -1.0, 0.5], "activation": [2.0, 0.0, 1.0],
                            "in_cluster": [True, False, True]})
    images = [np.full((1, 6, 6), float(i)) + np.eye(6) for i in range(3)]
    tokens = examples([np.array([5, 9, 2])] * 3, [None] * 3).assign(
        tokens=[["a", "<b>", "c"], ["d"], ["e", "f"]],
        token_scores=[np.array([1.0, -2, 3]), np.array([0.5]), np.array([0.1, 0.2])])
    figures = {}
    for name, per_sample in (("signed", signed), ("magnitude", magnitude)):
        tidy = plots.tidy_cluster_scores(plots.cluster_table(per_sample, clusters, "mean"),
                                         "gradient")
        figures[f"cluster heatmap, {name}"] = plots.cluster_heatmap(
            tidy, method="gradient", reduce="mean", highlight="c")
        figures[f"sample heatmap, {name}"] = plots.sample_heatmap(
            plots.tidy_sample_scores(per_sample[:10], np.arange(10)), method="gradient",
            cluster="<i>a</i>", n_total=12)
    card = pd.DataFrame([dict(layer=layer, method=method, spearman=rho, kendall=rho / 2,
                              spearman_low=rho - 0.1, spearman_high=rho + 0.1, top_overlap=0.5,
                              curve_area=rho, after_randomization=np.nan if layer == "out"
                              else 1.0 - rho)
                         for layer, rhos in (("<b>fc1</b>", (0.9, 0.2)), ("out", (1.0, 0.5)))
                         for method, rho in zip(("gradient", "activation"), rhos)])
    figures.update({
        "scorecard": plots.scorecard_figure(card),
        "neuron bars": plots.neuron_bars(summaries[:5], method="gradient", reduce="mean"),
        "method bars": plots.method_bars(summaries, reduce="mean", top_n=3),
        "pruning, two panels": plots.pruning_figure(curves, n_neurons=5,
                                                    titles={"cluster": "<b>7</b>"}),
        "pruning, first points": plots.pruning_figure(curves[curves["k"] < 2], n_neurons=5,
                                                      metric="loss"),
        "score histogram": plots.score_histogram(samples, method="gradient", neuron=1),
        "rank correlations": plots.rank_correlation_heatmap(plots.rank_correlations(summaries)),
        "class mix": plots.class_mix_bars(pd.DataFrame({"name": ["six", "<b>8</b>"],
                                                        "count": [3, 1], "share": [.75, .25]}),
                                          cluster=2),
        "neuron distributions": plots.neuron_distributions(samples, method="gradient",
                                                           neuron=3, cluster="x"),
        "example images with maps": plots.example_images(
            examples(images, [np.ones((2, 2))] * 3), neuron=5),
        "example images, colour": plots.example_images(
            examples([rng.random((3, 4, 4))] * 3, [None] * 3), neuron=1),
        "example tokens": plots.example_values(tokens, neuron=2, method="gradient"),
        "example token ids": plots.example_values(
            examples([np.array([5, 9, 2])] * 3, [np.array([0.5, -1.0, 2.0])] * 3), neuron=2),
        "example features": plots.example_values(
            examples([np.array([0.1, 0.2])] * 3, [None] * 3), neuron=2,
            feature_names=["<b>a</b>", "b"]),
    })
    return figures
