"""pages.shared.figures.drawn_once: the figure a page sends is drawn by plotly.js exactly as
the figure itself (same full layout and traces, in headless Chromium with plotly.py's own
plotly.js, offline), and carries nothing that makes Streamlit's second Plotly.react replot."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly
import plotly.graph_objects as go
import plotly.io as pio
import pytest
from playwright.sync_api import sync_playwright

from pages.shared.figures import drawn_once
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.figures import every_figure

pytestmark = pytest.mark.browser

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
FIGURES = every_figure()
# plotly.js's full figure as JSON: no private (_) keys, functions or DOM nodes, typed arrays as
# arrays; trace uids are random, and the template (and items' references to it) is what
# drawn_once writes into the figure
FULL = """async (spec) => {
    const div = document.createElement('div');
    div.style.width = '700px';
    document.body.appendChild(div);
    await Plotly.newPlot(div, spec.data, spec.layout);
    const keep = (key, value) => key.startsWith('_') || typeof value === 'function'
        || (value && value.nodeType) || ['uid', 'template', 'templateitemname',
        'datarevision'].includes(key) ? undefined
        : ArrayBuffer.isView(value) ? Array.from(value) : value;
    const full = JSON.stringify({layout: div._fullLayout, data: div._fullData}, keep);
    Plotly.purge(div);
    div.remove();
    return full;
}"""


@pytest.fixture(scope="module")
def plotly_page():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_content("<html><body></body></html>")
        page.add_script_tag(path=str(PLOTLY_JS))
        yield page
        browser.close()


def _full(page, figure: go.Figure) -> dict:
    return json.loads(page.evaluate(FULL, json.loads(pio.to_json(figure, validate=False))))


@pytest.mark.parametrize("name", list(FIGURES))
def test_the_sent_figure_draws_exactly_like_the_figure(plotly_page, name):
    figure = FIGURES[name]
    assert _full(plotly_page, drawn_once(figure)) == _full(plotly_page, figure)


@pytest.mark.parametrize("name", ["cluster heatmap, signed", "neuron bars", "method bars"])
def test_the_sent_figure_has_no_template_typed_array_or_unset_revision(name):
    """What plotly.js's diff sees as changed in Streamlit's JSON copy of a figure: a
    template object, a typed array, any data array without layout.datarevision."""
    sent = json.loads(pio.to_json(drawn_once(FIGURES[name], clickable=True), validate=False))
    assert sent["layout"].get("template") is None
    assert "bdata" not in json.dumps(sent)
    assert sent["layout"]["datarevision"] == 1
    # the modes Streamlit's frontend sets for selection_mode="points", so it sets nothing
    assert (sent["layout"]["clickmode"], sent["layout"]["dragmode"]) == ("event+select", "pan")
    assert sent["layout"]["hovermode"] == (FIGURES[name].layout.hovermode or "closest")


def test_a_template_fills_items_axes_and_traces_as_plotly_does(plotly_page):
    """A template with every kind of default: per-type trace defaults that cycle, axis
    defaults for every x axis, array-item defaults, a named item used by templateitemname
    (twice), one drawn unasked, and a templateitemname that names nothing (hidden)."""
    template = dict(
        data=dict(bar=[dict(marker=dict(color="red")), dict(marker=dict(color="blue"))]),
        layout=dict(
            xaxis=dict(gridcolor="green", title=dict(font=dict(size=9))),
            font=dict(family="serif"), shapedefaults=dict(line=dict(color="orange")),
            annotations=[dict(name="note", text="from the template", x=0.5, y=0.5),
                         dict(name="stamp", text="unasked", x=0.1, y=0.1)],
            annotationdefaults=dict(font=dict(color="purple"))))
    figure = go.Figure(dict(
        data=[dict(type="bar", x=np.arange(3.0), y=[1, 2, 3]),
              dict(type="bar", x=[1, 2], y=[3, 1], xaxis="x2", marker=dict(opacity=0.5)),
              dict(type="bar", x=[1], y=[2]),
              dict(type="scatter", x=np.array([[1, 2], [3, 4]])[0], y=[1, 2])],
        layout=dict(template=template, xaxis2=dict(domain=[0.6, 1]),
                    xaxis=dict(domain=[0, 0.5], title=dict(text="x")),
                    shapes=[dict(type="line", x0=0, x1=1, y0=0, y1=1)],
                    annotations=[dict(templateitemname="note", font=dict(size=20)),
                                 dict(templateitemname="note", y=0.9),
                                 dict(templateitemname="missing", text="hidden"),
                                 dict(text="plain", x=1, y=1)])), _validate=False)
    assert _full(plotly_page, drawn_once(figure)) == _full(plotly_page, figure)


def test_a_figure_given_as_a_dict_is_sent_the_same_and_left_as_it_is():
    figure = FIGURES["neuron bars"]
    as_dict = figure.to_dict()
    as_dict["data"] = [go.Bar(as_dict["data"][0]), *as_dict["data"][1:]]  # objects inside too
    before = pio.to_json(as_dict, validate=False)
    sent = [json.loads(pio.to_json(drawn_once(f, clickable=True), validate=False))
            for f in (figure, as_dict)]
    assert sent[0] == sent[1] and pio.to_json(as_dict, validate=False) == before


OVERLAPS = """async (spec) => {
    const div = document.createElement('div');
    div.style.width = '900px';  // a full-width chart of the Neuron and Pruning pages
    document.body.appendChild(div);
    await Plotly.newPlot(div, spec.data, spec.layout);
    const box = e => e.getBoundingClientRect();
    const legend = div.querySelector('.legend');
    const titles = [...div.querySelectorAll('[class*="xtitle"] text, [class*="ytitle"] text')];
    const hit = legend && titles.filter(t => { const a = box(legend), b = box(t);
        return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom; })
        .map(t => t.textContent);
    Plotly.purge(div);
    div.remove();
    return legend ? hit : null;
}"""


@pytest.mark.parametrize("name", [name for name, figure in FIGURES.items()
                                  if any(trace.showlegend is not False for trace in figure.data
                                         if trace.name)])
def test_a_legend_below_the_plot_leaves_the_axis_titles_clear(plotly_page, name):
    """The score axis's title has two lines (its units below): the Neuron page's legend sat
    on the second line ("(logits)")."""
    hit = plotly_page.evaluate(OVERLAPS, json.loads(pio.to_json(FIGURES[name], validate=False)))
    assert hit == [], hit
