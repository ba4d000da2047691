"""pages/shared/figures.py without a browser: the plotly.js defaults `drawn_once` writes into a
figure, rule by rule (tests/dashboard/test_chart_draws.py compares the results with plotly.js
itself, in Chromium)."""
import base64

import numpy as np
import plotly.graph_objects as go
import pytest

from pages.shared.figures import (_axis_switches, _category_axes, _items, _plain, _under,
                                  drawn_once)

TEMPLATE = dict(
    data=dict(bar=[dict(marker=dict(color="red")), dict(marker=dict(color="blue"))]),
    layout=dict(xaxis=dict(gridcolor="green", linecolor="grey", title=dict(standoff=15)),
                yaxis=dict(zerolinecolor="black"), font=dict(family="serif"),
                annotationdefaults=dict(font=dict(color="purple")),
                annotations=[dict(name="note", text="from the template", x=0.5)]))


def figure(*traces, **layout) -> go.Figure:
    return go.Figure(dict(data=list(traces), layout=dict(template=TEMPLATE, **layout)),
                     _validate=False)


# ------------------------------------------------------------------ the helpers

def test_under_fills_what_a_value_leaves_unset_key_by_key():
    default = dict(font=dict(size=10, family="serif"), width=2, dash=[1, 2])
    assert _under(None, default) is default
    assert _under(dict(font=dict(size=12), dash=[3]), default) == \
        dict(font=dict(size=12, family="serif"), width=2, dash=[3])
    assert _under(5, dict(a=1)) == 5  # a value set is kept, whatever the default
    assert _under(dict(a=1), None) == dict(a=1)


def test_items_fill_from_their_template_item_or_the_array_defaults():
    named = [dict(name="note", text="template", x=0.5), dict(name="stamp", text="unasked")]
    default = dict(font=dict(color="purple"))
    filled = _items([dict(templateitemname="note", x=0.9), dict(text="plain"),
                     dict(templateitemname="missing", text="hidden")], named, default)
    assert filled[0] == dict(text="template", x=0.9)  # the template item, no name
    assert filled[1] == dict(text="plain", font=dict(color="purple"))
    assert filled[2]["visible"] is False  # names nothing: plotly.js hides it
    assert filled[3] == dict(name="stamp", text="unasked")  # drawn although nobody asked
    assert len(filled) == 4


@pytest.mark.parametrize("trace,axes", [
    (dict(type="bar", x=[1, 2], y=[3, 4]), {"xaxis"}),
    (dict(type="bar", x=[1, 2]), {"yaxis"}),  # only x: horizontal
    (dict(type="bar", y=[1], orientation="h", yaxis="y3"), {"yaxis3"}),
    (dict(type="histogram", y=[1, 2]), {"yaxis"}),
    (dict(type="histogram", x=[1, 2], xaxis="x2"), {"xaxis2"}),
    (dict(type="funnel", x=[1], y=[2]), {"yaxis"}),  # funnels lie by default
    (dict(type="waterfall", y=[1]), {"xaxis"}),
    (dict(type="scatter", x=[1], y=[2]), set()),  # no categories along an axis
    (dict(type="box", y=[1, 2]), None),  # orientation from the data: not told
    (dict(type="violin", x=[1, 2]), None),
])
def test_category_axes_are_those_bar_like_traces_lay_categories_along(trace, axes):
    assert _category_axes([trace]) == axes


def test_one_trace_of_unknown_orientation_makes_every_axis_unknown():
    assert _category_axes([dict(type="bar", x=[1], y=[2]), dict(type="box", y=[1])]) is None


def test_axis_switches_follow_plotly_js_for_values_from_the_template():
    default = dict(gridcolor="green", linecolor="grey", zerolinecolor="black")
    assert _axis_switches({}, default, categories=False) == dict(
        showline=False, showgrid=True, zeroline=True)
    assert _axis_switches({}, default, categories=True) == dict(
        showline=False, showgrid=False, zeroline=False)
    # a value in the figure itself switches its part on, also along categories
    assert _axis_switches(dict(linewidth=2, gridcolor="red"), default, categories=True) == \
        dict(linewidth=2, gridcolor="red", showline=True, showgrid=True, zeroline=False)
    assert _axis_switches(dict(showgrid=False), default, False)["showgrid"] is False
    assert _axis_switches({}, {}, categories=False) == {}  # nothing in the template: unset


def test_plain_turns_arrays_and_plotly_objects_into_lists_and_dicts():
    typed = dict(dtype="f8", bdata=base64.b64encode(np.arange(6.0).tobytes()).decode(),
                 shape="2, 3")
    assert _plain(typed) == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert _plain(dict(x=np.arange(2), y=(1, 2), marker=go.bar.Marker(color="red"))) == \
        dict(x=[0, 1], y=[1, 2], marker=dict(color="red"))
    assert _plain(np.float32(0.5)) == 0.5 and type(_plain(np.int64(3))) is int


# ------------------------------------------------------------------ drawn_once

def test_the_template_is_written_into_the_figure_and_sent_as_none():
    sent = drawn_once(figure(dict(type="scatter", x=[1], y=[2]), title=dict(text="t")))
    assert sent.layout.template.to_plotly_json() == {}
    layout = sent.to_plotly_json()["layout"]
    assert layout["font"] == dict(family="serif")
    assert layout["title"] == dict(text="t")
    assert layout["xaxis"]["gridcolor"] == "green" and layout["xaxis"]["showgrid"] is True
    assert layout["annotations"] == [dict(name="note", text="from the template", x=0.5)]
    assert "annotationdefaults" not in layout


def test_per_type_trace_defaults_cycle_over_the_traces_of_that_type():
    sent = drawn_once(figure(*[dict(type="bar", x=[1], y=[k]) for k in range(3)],
                             dict(type="scatter", x=[1], y=[1]),
                             dict(type="bar", x=[1], y=[1], marker=dict(color="green"))))
    colours = [trace.marker.color for trace in sent.data]
    assert colours == ["red", "blue", "red", None, "green"]  # scatter: no default; own kept


def test_bars_get_no_grid_or_zero_line_along_their_categories():
    sent = drawn_once(figure(dict(type="bar", x=["a", "b"], y=[1, 2])))
    assert sent.layout.xaxis.showgrid is False and sent.layout.xaxis.showline is False
    assert sent.layout.yaxis.zeroline is True


def test_arrays_go_as_lists_and_the_revision_is_fixed():
    sent = drawn_once(figure(dict(type="scatter", x=np.arange(3), y=np.ones(3))))
    trace = sent.to_plotly_json()["data"][0]
    assert trace["x"] == [0, 1, 2] and trace["y"] == [1.0, 1.0, 1.0]
    assert sent.layout.datarevision == 1
    own = drawn_once(figure(dict(type="scatter", y=[1]), datarevision=7))
    assert own.layout.datarevision == 7


@pytest.mark.parametrize("dragmode,clickmode", [(None, "event+select"), ("zoom", "event+select"),
                                                ("select", "event"), ("lasso", "event")])
def test_a_clickable_chart_gets_the_modes_streamlits_frontend_would_set(dragmode, clickmode):
    layout = {} if dragmode is None else dict(dragmode=dragmode)
    sent = drawn_once(figure(dict(type="bar", x=[1], y=[1]), **layout), clickable=True)
    assert sent.layout.dragmode == (dragmode or "pan")
    assert sent.layout.clickmode == clickmode
    assert sent.layout.hovermode == "closest"
    assert drawn_once(figure(dict(type="bar", x=[1], y=[1]))).layout.clickmode is None


def test_a_figure_whose_grid_defaults_it_cannot_tell_goes_as_it_is():
    box = figure(dict(type="box", y=[1, 2, 3]))
    assert drawn_once(box) is box


def test_a_figure_given_as_a_dict_is_left_as_it_is():
    spec = dict(data=[dict(type="bar", x=np.arange(2), y=[1, 2])],
                layout=dict(template=TEMPLATE, xaxis=dict(title=dict(text="x"))))
    sent = drawn_once(spec)
    assert isinstance(spec["data"][0]["x"], np.ndarray) and "template" in spec["layout"]
    assert spec["layout"]["xaxis"] == dict(title=dict(text="x"))
    assert sent.layout.xaxis.title.text == "x" and sent.layout.xaxis.title.standoff == 15
