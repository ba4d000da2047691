"""The dashboard's answers in a real headless Chromium: the Diagnosis verdict on the
demo's healthy view and on a cancelling mixed cluster, a remedy button moving the curve, a
click on a bar opening the neuron with its top samples drawn as images, and a pruning curve
that survives leaving its page. Screenshots in test-artifacts/answers-*.png; timings in the
run's summary (cold start to the first heatmap, redraw after a sidebar change, neuron open)."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch
from torch import nn

from attribution.inputs.demo import DEMO_DIR
from tests.support.browser import BROWSER_TIMINGS, RANKED_POINTS, REDRAW_S, within_budget

pytestmark = pytest.mark.browser

NEURON_OPEN_S = 1.0  # the goal on an idle machine (stretched by CONTENTION)
COLD_HEATMAP_S = 5.0
DIAGNOSIS_CURVE = "What happens when neurons are removed"
CURVE_Y = """(title) => { const plot = [...document.querySelectorAll('.js-plotly-plot')]
    .find(e => ((e.layout && e.layout.title && e.layout.title.text) || '').includes(title));
    if (!plot) return null;
    const ranked = plot._fullData.find(t => (t.name || '').startsWith('top-k'));
    return ranked ? Array.from(ranked.y) : null; }"""
HEADING = """(start) => [...document.querySelectorAll('h1')]
    .some(h => h.innerText.startsWith(start))"""


def verdict_alert(app, headline: str):
    """The verdict: the first alert of the page, which must start with `headline`."""
    first = app.page.get_by_test_id("stAlertContainer").first
    first.wait_for(timeout=120_000)
    app.page.get_by_test_id("stAlertContainer").filter(has_text=headline).first.wait_for(
        timeout=120_000)
    return first.inner_text()


def test_cold_start_to_the_first_heatmap(app, server):
    app.open()
    app.wait_for_chart("score per cluster")
    BROWSER_TIMINGS["answers: cold start to the first heatmap (from launching as `make run`)"] \
        = seconds = time.monotonic() - server.started
    app.start_click_clock()  # the first redraw, while the cold page may still be drawing
    app.choose("Method", "gradient")
    BROWSER_TIMINGS["answers: first redraw after the cold start (method, click to both charts, "
                     "in the page)"] = redraw = app.seconds_since_click_to_charts(
        "gradient score per cluster", "Highest 16 neurons by gradient score")
    assert within_budget(seconds, COLD_HEATMAP_S * 2)  # the 5 s goal, with a loaded 2-core box
    assert within_budget(redraw, REDRAW_S)


def test_the_healthy_demo_view_gets_a_usable_verdict_first(app):
    app.open("/diagnosis")
    text = verdict_alert(app, "These scores are usable")
    assert "These scores are usable" in text.split("\n")[-1]
    assert app.page.get_by_role("button", name="Use one-class clusters").count() == 0
    app.page.get_by_text("Signs agree within the cluster").first.wait_for()
    assert app.page.get_by_text("✓").count() == 0
    app.wait_for_chart(DIAGNOSIS_CURVE)
    app.screenshot("answers-1-verdict-healthy")


def test_a_mixed_cluster_is_called_cancelling_and_a_remedy_moves_the_curve(app):
    app.open("/diagnosis?cluster_by=correctness&method=gradient")
    text = verdict_alert(app, "The signed mean cancels")
    assert "The signed mean cancels, yet the ranking still carries signal" in text.split("\n")[-1]
    app.wait_for_chart("What cluster correct mixes")
    app.wait_for_chart(DIAGNOSIS_CURVE)
    before = app.page.evaluate(CURVE_Y, DIAGNOSIS_CURVE)
    app.screenshot("answers-2-verdict-cancelling")
    started = time.monotonic()
    app.page.get_by_role("button", name="Use one-class clusters (by true label)").click()
    verdict_alert(app, "These scores are usable")
    app.page.get_by_text("Before the change").wait_for(timeout=60_000)
    app.page.wait_for_function(f"(old) => {{ const y = ({CURVE_Y})('{DIAGNOSIS_CURVE}'); "
                               "return y && JSON.stringify(y) !== JSON.stringify(old); }",
                               arg=before, timeout=60_000, polling=50)
    BROWSER_TIMINGS["answers: remedy click to the new verdict and curve"] = \
        time.monotonic() - started
    app.page.wait_for_url(re.compile("[?&]cluster_by=label(&|$)"), timeout=60_000)
    app.screenshot("answers-3-remedy-applied")


def test_clicking_a_bar_opens_the_neuron_with_its_top_samples_as_images(app):
    app.open("/?source=digits_cnn&layer=conv2&cluster=3")
    app.wait_for_chart("Highest")
    timings = []
    for bar in (2, 5):  # the first open computes the layer's activations; the second reuses
        if timings:
            app.go_to("Neuron scores")
            app.wait_for_chart("Highest")
        chart = app.page.locator(".js-plotly-plot").filter(has_text="Highest").first
        chart.evaluate("plot => plot.on('plotly_click', event => "  # what plotly says was hit
                       "{ window.clickedBar = event.points[0].y; })")
        started = time.monotonic()
        chart.locator("g.point path").nth(bar).click(force=True)
        neuron = app.page.wait_for_function("() => window.clickedBar", timeout=10_000,
                                            polling=20).json_value().split()[-1]  # "neuron 7"
        app.page.wait_for_function(HEADING, arg=f"Neuron {neuron} of conv2", timeout=60_000,
                                   polling=20)
        app.wait_for_chart("the samples that activate it most")
        timings.append(time.monotonic() - started)
    tiles, traces = app.page.evaluate("""() => { const plot = [...document.querySelectorAll(
        '.js-plotly-plot')].find(e => e.layout.title.text.includes('activate it most'));
        return [plot.layout.annotations.length, plot._fullData.map(t => t.type)]; }""")
    assert tiles == 2 * 8 and traces == ["heatmap", "heatmap"]  # 16 images, their maps
    app.page.wait_for_url(lambda address: all(parameter in address for parameter in (
        "source=digits_cnn", "layer=conv2", "cluster=3", f"neuron={neuron}")), timeout=60_000)
    sidebar = app.page.get_by_test_id("stSidebar")
    assert sidebar.get_by_role("combobox", name="Layer").input_value().startswith("conv2")
    BROWSER_TIMINGS["answers: neuron view open after a click (first, computes activations)"] = \
        timings[0]
    BROWSER_TIMINGS["answers: neuron view open after a click (second)"] = timings[1]
    app.screenshot("answers-4-neuron-view")
    assert within_budget(timings[1], NEURON_OPEN_S * 3), timings  # goal 1 s; see the summary


def test_leaving_the_pruning_page_mid_curve_and_coming_back_resumes(app):
    app.open("/pruning?layer=relu1&random=100")
    with app.server_paused_mid_curve() as points:
        seen = max(points)
        assert seen < 33, "the curve finished before leaving; nothing to resume"
        app.go_to("Neuron scores")
    app.wait_for_chart("score per cluster")
    started = time.monotonic()
    app.go_to("Pruning curves")
    app.page.get_by_text("Resuming from the").first.wait_for(timeout=60_000)
    first = app.page.wait_for_function(  # the first curve drawn after coming back
        f"() => {{ const points = ({RANKED_POINTS})(); return points.length ? points : null; }}",
        timeout=60_000, polling=20).json_value()
    assert min(first) >= seen, (first, seen)  # the kept points at once, not from zero
    BROWSER_TIMINGS["answers: kept points back on screen after returning"] = \
        time.monotonic() - started
    app.screenshot("answers-5-pruning-resumed")
    app.wait_for_text("Verdict:", timeout_s=300)
    assert app.finished_curve_points() == [33, 33]


TEXT_FITS = """() => [...document.querySelectorAll(
    '[data-testid="stSidebar"] [data-testid="stSelectbox"] input')].map(input => {
    const style = getComputedStyle(input), context = document.createElement('canvas')
        .getContext('2d');
    context.font = style.font;
    return [input.value, context.measureText(input.value).width,
            input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)];
    })"""


def test_layer_names_are_not_cut_off_in_the_sidebar(app):
    app.open("/?source=sanity&layer=branch0.linear")
    app.wait_for_chart("score per cluster")
    shown = app.page.evaluate(TEXT_FITS)
    assert "branch0.linear · Linear · 4 neurons" in [value for value, _, _ in shown]
    for value, needed, room in shown:
        assert needed <= room, (value, needed, room)  # at Streamlit's default 300 px: 197 > 190


def test_the_toolbar_stop_leaves_no_frozen_progress_but_the_summary_of_the_points(app):
    app.open("/pruning?layer=relu1&random=100")
    with app.server_paused_mid_curve() as points:
        seen = max(points)
        assert seen < 33
        app.page.get_by_role("button", name="Stop", exact=True).click()  # Streamlit's toolbar
    started = time.monotonic()
    app.page.get_by_role("button", name="Continue the curve").wait_for(timeout=30_000)
    app.page.get_by_text("In words, from the points computed so far").wait_for()
    app.page.get_by_text(re.compile(r"Stopped: the curve shows the \d+ of 33 k values")).wait_for()
    BROWSER_TIMINGS["answers: toolbar Stop to the stopped curve's summary"] = \
        time.monotonic() - started
    assert app.page.get_by_test_id("stProgress").count() == 0  # no frozen progress bar
    assert app.page.get_by_role("button", name="Stop the curve").count() == 0  # nor dead button
    assert seen <= max(app.ranked_points()) < 33  # the points computed, kept
    app.screenshot("answers-6-toolbar-stopped")
    app.page.get_by_role("button", name="Continue the curve").click()
    app.page.wait_for_function(  # [].every(...) is true: a curve must be drawn
        f"() => {{ const n = ({RANKED_POINTS})(); return n.length && n.every(k => k === 33); }}",
        polling=50, timeout=120_000)
    app.wait_for_text("Verdict:")


def test_clicking_a_cluster_heatmap_cell_opens_that_neuron_of_that_cluster(app):
    app.open("/")
    app.wait_for_chart("score per cluster")
    chart = app.page.locator(".js-plotly-plot").filter(has_text="score per cluster").first
    chart.evaluate("plot => plot.on('plotly_click', event => "
                   "{ window.clickedCell = [event.points[0].x, event.points[0].y]; })")
    area = chart.locator(".nsewdrag").first.bounding_box()
    started = time.monotonic()
    app.page.mouse.click(area["x"] + area["width"] * 0.53, area["y"] + area["height"] * 0.35)
    neuron, cluster = app.page.wait_for_function("() => window.clickedCell", timeout=10_000,
                                                 polling=20).json_value()
    app.page.wait_for_function(HEADING, arg=f"Neuron {neuron} of relu2", timeout=60_000,
                               polling=20)
    BROWSER_TIMINGS["answers: neuron view open after a heatmap click (digits MLP)"] = \
        time.monotonic() - started
    # the address is synced at the end of the run that drew the heading: wait for it
    app.page.wait_for_url(lambda address: f"neuron={neuron}" in address
                          and f"cluster={cluster.split()[0]}" in address, timeout=60_000)
    sidebar = app.page.get_by_test_id("stSidebar")
    assert sidebar.get_by_role("combobox", name="Cluster", exact=True).input_value().startswith(
        cluster)


def test_a_wide_layers_scores_page_redraws_in_time_and_its_cells_open_their_neuron(app, tmp_path):
    """A 3072-wide layer (a transformer MLP's width) with 10 clusters: the cluster heatmap
    shows 128 of its neurons, so a redraw does not make the browser draw 30,720 click
    markers (~3.5 s), and a click on a cell opens that neuron of that cluster."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(64, 3072))
    model.add_module("relu1", nn.ReLU())
    model.add_module("out", nn.Linear(3072, 10))
    digits = np.load(DEMO_DIR / "digits.npz")
    program = torch.export.export(model.eval(), (torch.tensor(digits["inputs"][:8]),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "wide_mlp.pt2")
    np.savez(tmp_path / "wide_digits.npz", inputs=digits["inputs"], labels=digits["labels"],
             class_names=digits["class_names"])  # no clusters: one per label
    app.open_with_files(tmp_path / "wide_mlp.pt2", tmp_path / "wide_digits.npz")
    app.choose("Layer", "fc1")
    app.page.wait_for_url(re.compile("[?&]layer=fc1(&|$)"), timeout=60_000)
    app.go_to("Neuron scores")
    app.wait_for_chart("Each sample of cluster", timeout_s=120)
    app.page.wait_for_timeout(1000)
    app.start_click_clock()
    app.choose("Cluster", "7 (seven)")
    redraw = app.seconds_since_click_to_charts("Each sample of cluster 7 (seven)")
    BROWSER_TIMINGS["answers: Scores redraw after a cluster change (3072-wide layer)"] = redraw
    assert within_budget(redraw, REDRAW_S), redraw
    chart = app.page.locator(".js-plotly-plot").filter(has_text="score per cluster").first
    assert "128 of 3072" in chart.evaluate("plot => plot.layout.xaxis.title.text")
    chart.evaluate("plot => plot.on('plotly_click', event => "
                   "{ window.clickedCell = [event.points[0].x, event.points[0].y]; })")
    area = chart.locator(".nsewdrag").first.bounding_box()
    app.page.mouse.click(area["x"] + area["width"] * 0.61, area["y"] + area["height"] * 0.55)
    neuron, cluster = app.page.wait_for_function("() => window.clickedCell", timeout=10_000,
                                                 polling=20).json_value()
    app.page.wait_for_function(HEADING, arg=f"Neuron {neuron} of fc1", timeout=60_000,
                               polling=20)
    # the address is synced at the end of the run that drew the heading: wait for it
    app.page.wait_for_url(lambda address: f"neuron={neuron}" in address
                          and f"cluster={cluster.split()[0]}" in address, timeout=60_000)
    assert not cluster.startswith("7")  # the clicked row's cluster, not the one in focus
    sidebar = app.page.get_by_test_id("stSidebar")
    assert sidebar.get_by_role("combobox", name="Cluster", exact=True).input_value().startswith(
        cluster)


def test_which_method_to_trust_draws_every_layer_and_a_click_opens_that_view(app):
    """The scorecard page of the demo: layers x methods with the sanity panel beside it, the
    interval on hover; a click on a cell opens the Scores page on that layer and method."""
    app.open("/trust")
    app.wait_for_chart("Which method to trust", timeout_s=120)
    chart = app.page.locator(".js-plotly-plot").filter(has_text="Which method to trust").first
    layers, methods = chart.evaluate("plot => [plot.data[0].y, plot.data[0].x]")
    assert layers == ["fc1", "relu1", "fc2", "relu2", "out"] and len(methods) == 7
    app.screenshot("answers-8-which-method-to-trust")
    chart.evaluate("plot => plot.on('plotly_click', event => "
                   "{ window.clickedCell = [event.points[0].x, event.points[0].y]; })")
    area = chart.locator(".nsewdrag").first.bounding_box()
    # the cell of the third layer and the first method (rows top down, columns left right)
    app.page.mouse.click(area["x"] + area["width"] * 0.46 / 14, area["y"] + area["height"] * 0.5)
    method, layer = app.page.wait_for_function("() => window.clickedCell", timeout=10_000,
                                               polling=20).json_value()
    assert layer == "fc2" and method == methods[0]
    app.page.wait_for_function(HEADING, arg="Neuron scores", timeout=60_000, polling=20)
    app.wait_for_chart(f"{method} score per cluster", timeout_s=60)
    app.page.wait_for_url(lambda address: "layer=fc2" in address, timeout=60_000)
    sidebar = app.page.get_by_test_id("stSidebar")
    assert sidebar.get_by_role("combobox", name="Layer", exact=True).input_value().startswith(
        "fc2 ·")
    assert sidebar.get_by_role("combobox", name="Method", exact=True).input_value() == method


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.activation = nn.ReLU()

    def forward(self, x):
        return self.activation(self.conv(x))


class _DeepNamedImageNet(nn.Module):
    """An image model whose layers have long dotted names (encoder.layers.0.activation)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([_Block()])
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.encoder.layers[0](x).mean((2, 3)))


SAMPLE_TICKS = """(title) => [...document.querySelectorAll('.js-plotly-plot')]
    .filter(plot => plot.layout.title.text.startsWith(title))
    .map(plot => [...plot.querySelectorAll('.xtick text')].map(t => t.textContent))[0]"""


def test_an_image_model_with_long_layer_names_reads_in_full(app, tmp_path):
    """The sidebar writes out a layer choice its box cuts; the neuron axis of an image layer
    is said to follow the input's height and width; the Model & data table has the page's
    width; the samples heatmap labels each of its 16 neurons (it labelled every other)."""
    torch.manual_seed(0)
    model = _DeepNamedImageNet().eval()
    images = np.load(DEMO_DIR / "digits_images.npz")
    height, width = (torch.export.Dim(name, min=4, max=64) for name in ("height", "width"))
    program = torch.export.export(model, (torch.tensor(images["inputs"][:8]),),
                                  dynamic_shapes=({0: torch.export.Dim("batch"), 2: height,
                                                   3: width},))
    torch.export.save(program, tmp_path / "deep_names.pt2")
    app.open_with_files(tmp_path / "deep_names.pt2", DEMO_DIR / "digits_images.npz")
    app.page.get_by_text("Layers that can be scored").wait_for()
    app.screenshot("edges-1-layer-table")
    app.choose("Layer", "encoder.layers.0.activation")
    app.page.wait_for_url(re.compile("[?&]layer=encoder.layers.0.activation(&|$)"),
                          timeout=60_000)
    sidebar = app.page.get_by_test_id("stSidebar")
    sidebar.get_by_text("encoder.layers.0.activation · ReLU · 8 × 8 positions × 16 channels",
                        exact=True).wait_for()
    sidebar.get_by_text("the other axes follow the input's height and width").wait_for()
    app.go_to("Neuron scores")
    app.wait_for_chart("Each sample of cluster", timeout_s=120)
    ticks = app.page.evaluate(SAMPLE_TICKS, "Each sample of cluster")
    assert sorted(map(int, ticks)) == list(range(16)), ticks
    app.screenshot("edges-2-sample-heatmap")
