"""The dashboard in a real headless Chromium, served as `make run` serves it (scripts/serve.py;
plain `streamlit run app.py` too where a fresh server matters): real file inputs, every page,
the exported report opened offline; screenshots in test-artifacts/ and the timings of a cold
start, a redraw and the first pruning points, against their budgets."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses import settings as analysis
from attribution.inputs.demo import DEMO_DIR, load_demo
from tests.support.browser import (ARTIFACTS, BROWSER_TIMINGS, CHART_WITH_TITLE, COLD_START_S,
                                   ENTRY_POINTS, FIRST_POINTS_S, RANKED_POINTS, REDRAW_S,
                                   SCRIPT_IDLE,
                                   check_and_close, open_tab, streamlit_server, within_budget)

pytestmark = pytest.mark.browser

CHART_DRAWS = """() => { window.chartDraws = []; const seen = new WeakSet();
    const watch = () => document.querySelectorAll('.js-plotly-plot').forEach(chart => {
        if (seen.has(chart) || !chart.on) return;
        seen.add(chart);
        for (const kind of ['plotly_beforeplot', 'plotly_afterplot'])
            chart.on(kind, () => window.chartDraws.push(kind)); });
    new MutationObserver(watch).observe(document.body, {subtree: true, childList: true});
    watch(); }"""
CHART_WIDTHS = """() => [...document.querySelectorAll('.js-plotly-plot')]
    .map(e => e.layout && e.layout.width ? e._fullLayout.width : 0)"""


def test_cold_start_opens_the_demo_with_charts(app, server):
    opened = app.open()
    app.wait_for_chart("score per cluster")
    now = time.monotonic()
    BROWSER_TIMINGS["first page with charts, from launching the server as `make run` (cold)"] = \
        now - server.started
    BROWSER_TIMINGS["first page with charts, from opening the page (cold)"] = now - opened
    for part in ("Highest 16 neurons", "Each sample of cluster 0", "under each method"):
        app.wait_for_chart(part)
    app.screenshot("1-scores")
    assert within_budget(now - server.started, COLD_START_S)


def test_changing_method_or_cluster_redraws_quickly(app):
    """From the click on the sidebar choice to the charts it changes drawn: after a method
    change the cluster heatmap and the bars under the new method; after a cluster change the
    samples heatmap of the new cluster (the third chart; the fourth is drawn in the same
    frame). Timed in the page from its click event; the driver's own wall time, Playwright's
    click included, is reported beside it."""
    app.open()
    app.wait_for_chart("Each sample of cluster 0")
    app.start_click_clock()
    started = app.choose("Method", "ablation")
    method_redraw = app.seconds_since_click_to_charts("ablation score per cluster",
                                                      "Highest 16 neurons by ablation score")
    method_wall = time.monotonic() - started
    started = app.choose("Cluster", "7 (seven)")
    cluster_redraw = app.seconds_since_click_to_charts("Each sample of cluster 7 (seven)")
    cluster_wall = time.monotonic() - started
    BROWSER_TIMINGS["redraw after changing the method (click to both charts, in the page)"] = \
        method_redraw
    BROWSER_TIMINGS["redraw after changing the cluster (click to the third chart, in the page)"] \
        = cluster_redraw
    BROWSER_TIMINGS["the same two, the test driver's wall time (its click included)"] = \
        max(method_wall, cluster_wall)
    assert "method=ablation" in app.page.url and "cluster=7" in app.page.url
    assert within_budget(method_redraw, REDRAW_S) and within_budget(cluster_redraw, REDRAW_S)


def test_a_redraw_plots_each_chart_once_and_the_charts_follow_the_window(app):
    """Streamlit's frontend calls Plotly.react twice on each new chart: at plotly's own size,
    then with the column's width. pages.shared.figures.drawn_once makes the second call a
    restyle rather than a second full plot (plotly_beforeplot). The watch starts inside a chart's
    first plot (plotly.js gives the chart `on` there), so any plotly_beforeplot it sees is a
    second full plot; a chart has had its second call once its layout has a width."""
    app.open()
    app.wait_for_chart("Each sample of cluster 0")
    app.page.wait_for_timeout(1000)
    app.page.evaluate(CHART_DRAWS)
    app.choose("Cluster", "7 (seven)")
    app.wait_for_chart("Each sample of cluster 7 (seven)")
    app.page.wait_for_function(f"() => {{ const w = ({CHART_WIDTHS})(); "
                               "return w.length === 4 && w.every(Boolean); }", timeout=60_000)
    app.page.wait_for_timeout(300)
    draws = app.page.evaluate("() => window.chartDraws")
    assert draws.count("plotly_afterplot") >= 4 and "plotly_beforeplot" not in draws, draws
    wide = app.page.evaluate(CHART_WIDTHS)
    app.page.set_viewport_size({"width": 1100, "height": 1000})
    app.page.wait_for_function(f"(wide) => ({CHART_WIDTHS})().every((w, i) => w && w < wide[i])",
                               arg=wide, timeout=30_000)


def test_pruning_curve_draws_live_and_completes(app):
    app.open()
    app.wait_for_chart("score per cluster")
    first_points = []
    for cluster in ("0 (zero)", "4 (four)", "7 (seven)"):  # a new curve each time: median of 3
        if cluster != "0 (zero)":
            app.go_to("Model & data")
            app.wait_for_text("Sample files")
            app.choose("Cluster", cluster)
            app.page.wait_for_function("id => location.href.includes('cluster=' + id)",
                                       arg=cluster.split()[0], polling=20, timeout=60_000)
        started = app.go_to("Pruning curves")
        app.page.wait_for_function(f"() => ({RANKED_POINTS})().some(n => n > 0)", polling=20,
                                   timeout=60_000)
        first_points.append(time.monotonic() - started)
        app.wait_for_text("Verdict:")
        assert app.finished_curve_points() == [17, 17]  # every k of 16 neurons, both panels
        if cluster == "0 (zero)":
            app.screenshot("2-pruning")
    median = sorted(first_points)[1]
    BROWSER_TIMINGS["first pruning-curve points after opening the page (median of 3)"] = median
    assert within_budget(median, FIRST_POINTS_S), first_points


def test_stop_button_stops_the_curve_and_the_app_keeps_working(app):
    app.open("/pruning?layer=relu1&random=100")
    with app.server_paused_mid_curve() as points:  # stopped with points: their summary shows
        assert max(points) < 33
        app.page.get_by_role("button", name="Stop the curve").click()
    app.page.get_by_role("button", name="Continue the curve").wait_for(timeout=60_000)
    app.page.get_by_text(re.compile(r"Stopped: the curve shows the \d+ of \d+ k values")).wait_for()
    app.page.get_by_text("In words, from the points computed so far").wait_for()
    app.screenshot("9-pruning-stopped")
    app.page.get_by_role("button", name="Continue the curve").click()
    app.page.wait_for_function(  # the summary of the points so far also says "Verdict:"
        f"() => {{ const n = ({RANKED_POINTS})(); return n.length && n.every(k => k === 33); }}",
        polling=50, timeout=120_000)
    assert app.finished_curve_points() == [33, 33]


def test_diagnosis_page(app):
    app.open("/diagnosis")
    app.wait_for_chart("Do the methods rank neurons alike")
    app.wait_for_chart("each sample's score")
    alerts = app.page.get_by_test_id("stAlertContainer").count()
    assert alerts >= 7  # one finding per check
    app.page.get_by_text("Agreement with exact ablation").wait_for()
    app.screenshot("3-diagnosis")


def test_upload_model_and_data_then_choose_and_see_every_chart(app):
    app.open_with_files(DEMO_DIR / "digits_cnn.pt2", DEMO_DIR / "digits_images.npz")
    app.page.get_by_test_id("stMetricValue").get_by_text("719", exact=True).wait_for()  # samples
    app.screenshot("4-model-and-data")
    for label, option, parameter in (("Layer", "conv2 · Conv2d", "layer=conv2"),
                                     ("Clusters from", "predicted label", "cluster_by=predicted"),
                                     ("Cluster", "3 (three)", "cluster=3"),
                                     ("Method", "integrated gradients",
                                      "method=integrated_gradients")):
        app.choose(label, option)
        app.page.wait_for_url(re.compile(f"[?&]{parameter}(&|$)"), timeout=60_000)
    app.go_to("Neuron scores")
    app.wait_for_chart("integrated gradients score per cluster")
    app.wait_for_chart("Highest 16 neurons by integrated gradients")
    app.wait_for_chart("Each sample of cluster 3 (three)")
    app.screenshot("5-scores-uploaded-cnn")
    app.go_to("Pruning curves")
    app.wait_for_text("Verdict:", timeout_s=120)
    assert app.finished_curve_points() == [17, 17]  # 16 channels


def test_a_bad_upload_shows_a_readable_message(app, tmp_path):
    pickled = tmp_path / "whole_model.pt"
    torch.save(nn.Linear(64, 10), pickled)
    app.open("/data")
    app.page.get_by_text("Sample files").wait_for(timeout=60_000)
    app.upload("Model file", pickled)
    app.upload("Data file", DEMO_DIR / "digits.npz")
    app.page.get_by_text("These files could not be used").wait_for(timeout=60_000)
    assert "torch.export.save(ep" in app.page.get_by_test_id("stCode").inner_text()
    app.screenshot("8-bad-upload")


def test_export_report_and_open_it_offline(app, browser):
    app.open("/export")
    app.page.get_by_role("button", name="Build report").click()
    download_button = app.page.get_by_role("button", name="Download report (HTML)")
    download_button.wait_for(timeout=120_000)
    with app.page.expect_download() as download:
        download_button.click()
    report = ARTIFACTS / "report.html"
    download.value.save_as(report)
    app.screenshot("6-export")

    offline = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    tab = offline.new_page()
    problems = []
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.goto(report.as_uri())
    tab.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 8",
                          timeout=30_000)  # with the top neuron's samples as 8 x 8 images
    # and the scorecard of every layer
    assert "Findings" in tab.inner_text("body")
    assert tab.evaluate(CHART_WITH_TITLE, ["the samples that activate it most", False])
    assert tab.evaluate(CHART_WITH_TITLE, ["Which method to trust, layer by layer", True])
    tab.screenshot(path=str(ARTIFACTS / "7-report-offline.png"), full_page=True)
    offline.close()
    assert not problems, problems


def test_the_pruned_model_downloaded_from_the_page_measures_the_curve(app):
    """Choose k on the finished curve, prepare the file, download it as a browser does: the
    downloaded .pt2's accuracy on each subset is the blue curve's point at that k."""
    app.open("/pruning?layer=fc2&random=5")
    app.wait_for_text("Take the pruned model away", timeout_s=120)
    slider = app.page.get_by_test_id("stSlider").filter(
        has_text="Neurons to remove, lowest-ranked first").get_by_role("slider")
    slider.focus()
    slider.press("Home")  # k = 0, then 6 steps right: k = 6 (every k of 16 neurons)
    for _ in range(6):
        slider.press("ArrowRight")
    app.page.get_by_role("button", name="Prepare the model with the 6 lowest-ranked neurons "
                                        "removed").click()
    download_button = app.page.get_by_role(
        "button", name="Download this model with the 6 lowest-ranked neurons removed")
    download_button.wait_for(timeout=120_000)
    with app.page.expect_download() as download:
        download_button.click()
    path = ARTIFACTS / "fc2-pruned-6.pt2"
    download.value.save_as(path)
    assert download.value.suggested_filename == "fc2-pruned-6.pt2"
    app.screenshot("11-pruning-take-away")

    loaded, data = load_demo("digits_mlp")
    ranking = at.cluster_scores(loaded.module, "fc2", data.inputs, data.labels,
                                data.labels.numpy(), analysis.DEFAULT_METHOD,
                                reduce=analysis.DEFAULT_REDUCE).loc[[0]]
    curves = at.cluster_pruning_curves(loaded.module, "fc2", data.inputs, data.labels,
                                       data.labels.numpy(), 0, ranking, ks=[6], n_random=1)
    pruned = at.load_model(path).module
    zeros = data.labels == 0
    for subset, rows in (("cluster", zeros), ("rest", ~zeros)):
        measured = at.model_metric(pruned, data.inputs[rows], data.labels[rows])
        expected = curves[curves["subset"] == subset]["bottom"].item()
        assert measured == pytest.approx(expected, abs=1e-9), subset


def test_two_sessions_at_once_get_their_own_correct_results(browser, server):
    loaded, data = load_demo("digits_mlp")
    tabs = [open_tab(browser, server) for _ in range(2)]
    methods = ("ablation", "gradient")
    for (tab, _), method in zip(tabs, methods):  # both sessions compute at the same time
        tab.page.goto(f"{server.url}/?method={method}&compare=activation", wait_until="commit")
    for (tab, context), method in zip(tabs, methods):
        tab.wait_for_chart(f"{method} score per cluster", exact=True)
        shown = np.array(tab.page.evaluate("""() => [...document.querySelectorAll(
            '.js-plotly-plot')].find(e => e.layout.title.text.includes('per cluster'))
            ._fullData[0].z.map(row => Array.from(row))"""), dtype=float)
        expected = at.cluster_scores(loaded.module, "relu2", data.inputs, data.labels,
                                     data.labels.numpy(), method=method)
        np.testing.assert_allclose(shown, expected.drop(columns="n").to_numpy(), rtol=1e-4,
                                   atol=1e-6)
        check_and_close(tab, context)


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_a_shared_link_opened_first_on_a_fresh_server_shows_its_page_and_settings(browser,
                                                                                   entry_point):
    """Until st.navigation first runs in a server process, Streamlit runs a pages/ script
    alone for its address (legacy folder navigation); the page must run app.py in its place
    and show itself with the link's settings, not fail without the sidebar's context. Both
    ways to start the server: `make run`'s launcher and plain `streamlit run app.py`."""
    log = f"streamlit-shared-link-{entry_point.replace(' ', '-')}.log"
    with streamlit_server(log, entry_point) as fresh:
        app, context = open_tab(browser, fresh)
        app.open("/pruning?layer=relu1&method=ablation&random=5")
        app.wait_for_text("Verdict:", timeout_s=120)
        assert app.page.locator("h1").all_inner_texts() == ["Pruning curves"]
        sidebar = app.page.get_by_test_id("stSidebar")
        assert sidebar.get_by_role("combobox", name="Layer").input_value() == \
            "relu1 · ReLU · 32 neurons"
        assert sidebar.get_by_role("combobox", name="Method").input_value() == "ablation"
        # every k of relu1's 32 neurons, once the finished curve is drawn (under load it can
        # follow its summary: issue 20)
        assert app.ranked_points() == [33, 33]
        assert app.page.get_by_text("of the 5 random orders").count() == 1
        address = app.page.evaluate("location.href")  # Playwright's page.url misses pushState
        assert address.startswith(fresh.url + "/pruning?")
        for parameter in ("layer=relu1", "method=ablation", "random=5"):
            assert re.search(f"[?&]{parameter}(&|$)", address), address
        app.screenshot("10-shared-link-fresh-server")
        # the next run goes through st.navigation: the sidebar's widgets get new ids (the
        # first ran under the page script's), and must still show the link's choices
        app.go_to("Neuron scores")
        app.wait_for_chart("score per cluster")
        app.page.locator(SCRIPT_IDLE).wait_for(timeout=60_000)
        assert sidebar.get_by_role("combobox", name="Layer").input_value() == \
            "relu1 · ReLU · 32 neurons"
        assert sidebar.get_by_role("combobox", name="Method").input_value() == "ablation"
        assert "layer=relu1" in app.page.evaluate("location.href")
        check_and_close(app, context)


def test_the_launcher_passes_streamlit_its_flags_and_the_app_its_arguments(browser):
    """scripts/serve.py (`make run`) serves app.py with every flag it was given: the port and
    headless mode (`streamlit_server`), and after `--` the app's own `--trust-code`, which
    the Model & data page shows."""
    with streamlit_server("streamlit-launcher-flags.log", "make run", ("--trust-code",)) as fresh:
        app, context = open_tab(browser, fresh)
        app.open("/data")
        app.wait_for_text("Sample files", timeout_s=120)
        app.page.get_by_test_id("stSidebar").get_by_text("Model and data").wait_for()
        assert app.page.locator("h1").all_inner_texts() == ["Model & data"]
        assert app.page.get_by_text("Started with --trust-code").count() == 1
        check_and_close(app, context)


COLD_START_SERVERS, COLD_START_TABS = 5, 3
COLD_START_STAGGER_S = (0.0, 0.4, 0.8, 1.2, 1.6)  # between tabs, one value per fresh server
STARTED = """() => document.querySelector('[data-testid="stException"]') || ((%s)(
    ['score per cluster', false]) && [...document.querySelectorAll(
    '[data-testid="stSidebar"] [data-testid="stWidgetLabel"]')].some(
    e => e.innerText === 'Model and data'))""" % CHART_WITH_TITLE


def test_sessions_opened_together_on_a_fresh_server_all_start(browser):
    """Collaborators opening the app at once on a cold server: a session's first
    run draws a placeholder chart, and plotly takes numpy and pandas from sys.modules as it
    finds them, half-initialised while another thread is still importing them: another
    session's, or the launcher's warm-up (`make run`), which lasts a few seconds from the
    server's start. The imports take seconds, so the tabs open a little apart (a different
    spacing on each fresh server, started by the launcher and by plain `streamlit run` in
    turn); every tab must reach its charts and sidebar without an exception."""
    for round_, stagger_s in enumerate(COLD_START_STAGGER_S[:COLD_START_SERVERS]):
        entry_point = list(ENTRY_POINTS)[round_ % len(ENTRY_POINTS)]
        with streamlit_server(f"streamlit-cold-{round_}.log", entry_point) as fresh:
            tabs = [open_tab(browser, fresh) for _ in range(COLD_START_TABS)]
            for index, (tab, _) in enumerate(tabs):
                time.sleep(stagger_s if index else 0.0)
                tab.page.goto(fresh.url, wait_until="commit")
            for tab, context in tabs:
                tab.page.wait_for_function(STARTED, timeout=120_000, polling=50)
                check_and_close(tab, context)


def test_the_cluster_box_shows_the_current_partition_and_keeps_it_across_pages(app):
    """The cluster box in the browser, where Streamlit's selectbox keeps the option's label as
    its value: after the clusters change, the box must show a cluster of the new partition with
    its own size, say so when the old one is gone, and keep it on the next page."""
    loaded, data = load_demo("digits_mlp")
    predicted = int((at.predict_classes(loaded, data.inputs) == 3).sum())
    labelled = int((data.labels == 3).sum())
    assert predicted != labelled  # else this test could not tell the two partitions apart
    app.open()
    app.wait_for_chart("score per cluster")

    def box_shows(start: str) -> None:
        app.page.wait_for_function(
            """start => [...document.querySelectorAll('[data-testid="stSidebar"] input')]
                .some(e => e.getAttribute('aria-label') === 'Cluster'
                           && e.value.startsWith(start))""", arg=start, polling=50,
            timeout=30_000)

    app.choose("Cluster", "3 (three)")
    box_shows(f"3 (three) · {labelled} samples")
    app.choose("Clusters from", "predicted label")  # class 3 exists there: kept, new size
    box_shows(f"3 (three) · {predicted} samples")
    app.choose("Clusters from", "k-means on the inputs")  # cluster 3 of labels is gone
    app.page.get_by_test_id("stSidebar").get_by_text(
        "does not exist in k-means on the inputs").first.wait_for(timeout=60_000)
    box_shows("0 · ")
    app.page.wait_for_function("() => location.href.includes('cluster=0')", polling=20,
                               timeout=60_000)
    app.go_to("Pruning curves")
    app.wait_for_text("Verdict:", timeout_s=120)
    box_shows("0 · ")
    assert "cluster=0" in app.page.evaluate("location.href")


AT_COMPLETE = """() => { window.atComplete = null;
    const check = () => {
        if (window.atComplete !== null || !document.body) return;
        if (document.body.innerText.includes('Complete. Change the cluster'))
            window.atComplete = (%s)();  // the curves drawn at that very moment
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true,
                                                    characterData: true});
    check(); }""" % RANKED_POINTS
CPU_HOG = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"


def test_five_curve_visitors_under_cpu_load_each_see_the_curve_drawn_when_it_is_complete(
        browser, server):
    """Five visitors on the Scores page (charts drawn) move to the Pruning page at once,
    beside two CPU-bound processes: the moment each page reads "Complete." (its last run's
    caption, under the chart) a curve is drawn there, and it becomes the finished curve, with
    every point, in place. The finished view's chart is the element the live draws ended
    with, never a new, empty one plotted after its own summary (before, 0 charts in 11 of
    30 such pages; the browser may still be applying the last points when the caption
    lands, and a stale partial chart of the run leaves when the run ends)."""
    tabs = []
    for index in range(5):  # each its own cluster: five computations
        tab, context = open_tab(browser, server)
        tab.page.add_init_script(f"({AT_COMPLETE})()")  # runs in every new document
        tab.open(f"/?layer=relu1&cluster={index}")
        tabs.append((tab, context))
    for tab, _ in tabs:
        tab.wait_for_chart("score per cluster", timeout_s=120)  # the chart library is loaded
    hogs = [subprocess.Popen([sys.executable, "-c", CPU_HOG]) for _ in range(2)]
    try:
        for tab, _ in tabs:
            tab.go_to("Pruning curves")
        for tab, _ in tabs:
            drawn = tab.page.wait_for_function("() => window.atComplete", timeout=240_000,
                                               polling=100).json_value()
            assert drawn, "the page read 'Complete.' above no drawn curve"
            tab.page.wait_for_function(  # then exactly the finished curve, in place
                f"() => {{ const n = ({RANKED_POINTS})(); "
                "return n.length && n.every(k => k === 33); }", polling=50, timeout=60_000)
    finally:
        for hog in hogs:
            hog.kill()
    for tab, context in tabs:
        check_and_close(tab, context)
