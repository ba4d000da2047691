"""How plotly.js would draw a figure, written into the figure (`drawn_once`), so that
Streamlit's second draw of a new chart only restyles. No streamlit here: `draw.chart` sends
the result.

Streamlit's PlotlyChart (1.67) draws a new chart twice: Plotly.react at plotly's own size,
then again with the column's measured width, its click modes and a JSON copy of the figure
(every object new). plotly.js diffs the second call against the first and replots in full
(a large share of what a Scores chart costs Chromium) when it sees a change: a template object that
is not the same object, a typed array (how plotly.py sends numpy arrays), any new data array
when the layout has no datarevision, or a changed clickmode. `drawn_once` sends none of these,
so the second call only restyles (the click modes are the ones the frontend would set, the
template's values are written into the figure, and nothing changes data in place within one
chart: Streamlit mounts a new chart for every new spec).
"""
from __future__ import annotations

import base64
import re
from typing import Any, Optional

import numpy as np
import plotly.graph_objects as go

_ITEM_DEFAULTS = {"annotations": "annotationdefaults", "shapes": "shapedefaults",
                  "images": "imagedefaults", "selections": "selectiondefaults",
                  "sliders": "sliderdefaults", "updatemenus": "updatemenudefaults"}


def drawn_once(figure: go.Figure | dict, clickable: bool = False) -> go.Figure | dict:
    """`figure` (a plotly figure or its dict, left as it is) as Streamlit's frontend draws in
    one pass: its template applied (layout, axes, items and per-type trace defaults, as
    plotly.js applies them), arrays as lists, a fixed layout.datarevision and, when
    `clickable`, the frontend's click modes."""
    # the figure's own objects, not to_dict(): that encodes each array as base64 for _plain
    # to decode again
    spec = _plain(figure if isinstance(figure, dict) else
                  dict(data=list(figure.data), layout=figure.layout))
    layout = spec.setdefault("layout", {})
    spec.setdefault("data", [])
    categories = _category_axes(spec["data"])
    if categories is None:  # grid defaults it cannot tell: sent as it is (drawn twice)
        return figure
    template = layout.pop("template", None) or {}
    defaults = template.get("layout", {})
    for name in set(layout) | set(defaults):
        default = defaults.get(name, defaults.get(name.rstrip("0123456789")))  # xaxis2: xaxis
        if name in _ITEM_DEFAULTS:
            layout[name] = _items(layout.get(name) or [], defaults.get(name) or [],
                                  defaults.get(_ITEM_DEFAULTS[name]) or {})
        elif re.fullmatch(r"[xy]axis\d*", name):
            own = _axis_switches(layout.get(name) or {}, default or {}, name in categories)
            layout[name] = _under(own, default)
        elif name not in _ITEM_DEFAULTS.values():
            layout[name] = _under(layout.get(name), default)
    per_type: dict[str, int] = {}
    for index, trace in enumerate(spec["data"]):
        kind = trace.get("type", "scatter")
        items = template.get("data", {}).get(kind) or [{}]
        spec["data"][index] = _under(trace, items[per_type.get(kind, 0) % len(items)])
        per_type[kind] = per_type.get(kind, 0) + 1
    layout.setdefault("datarevision", 1)
    if clickable:  # what the frontend sets for selection_mode="points"
        layout["dragmode"] = layout.get("dragmode") or "pan"
        layout["clickmode"] = "event" if layout["dragmode"] in ("select", "lasso") \
            else "event+select"
        layout["hovermode"] = layout.get("hovermode") or "closest"
    sent = go.Figure(spec, _validate=False)
    sent.layout.template = None  # not plotly.py's default template: none at all
    return sent


_SWITCHED_BY = {"showline": ("linecolor", "linewidth"),
               "showgrid": ("gridcolor", "gridwidth", "griddash"),
               "zeroline": ("zerolinecolor", "zerolinewidth")}
_ORIENTATION = {  # bar-like trace -> its orientation when it sets none (plotly.js defaults)
    "bar": lambda trace: "h" if "x" in trace and "y" not in trace else "v",
    "waterfall": lambda trace: "h" if "x" in trace and "y" not in trace else "v",
    "histogram": lambda trace: "h" if "y" in trace and "x" not in trace else "v",
    "funnel": lambda trace: "v" if "y" in trace and "x" not in trace else "h",
    "box": lambda trace: None, "violin": lambda trace: None}  # from their data: not told


def _category_axes(traces: list[dict]) -> Optional[set[str]]:
    """Layout names of the axes along which bar-like traces lay their categories (plotly.js
    draws no grid or zero line there by default); None when an orientation is unknown."""
    names = set()
    for trace in traces:
        kind = trace.get("type", "scatter")
        if kind not in _ORIENTATION:
            continue
        orientation = trace.get("orientation") or _ORIENTATION[kind](trace)
        if orientation is None:
            return None
        axis = trace.get("yaxis", "y") if orientation == "h" else trace.get("xaxis", "x")
        names.add(axis[0] + "axis" + axis[1:])
    return names


def _axis_switches(own: dict, default: dict, categories: bool) -> dict:
    """A cartesian axis's own settings with its line, grid and zero-line switches as plotly.js
    sets them, where `default` (its template) has a colour or width for them: plotly.js
    switches them on for such a value in the figure, never for one in the template (grid
    and zero line are on anyway, except along categories)."""
    own = dict(own)
    for switch, values in _SWITCHED_BY.items():
        if switch not in own and any(value in default for value in values):
            given = any(own.get(value) for value in values)
            own[switch] = given if switch == "showline" else given or not categories
    return own


def _under(value: Any, default: Any) -> Any:
    """`value` with what it leaves unset taken from `default` (dicts merged key by key)."""
    if value is None:
        return default
    if isinstance(value, dict) and isinstance(default, dict):
        return {**default, **{key: _under(item, default.get(key)) for key, item in value.items()}}
    return value


def _items(entries: list, named: list, default: dict) -> list:
    """A layout array (annotations, shapes...) as its template fills it: each entry over the
    template item its templateitemname names (none found: hidden) or the array's defaults;
    named template items no entry used are drawn as well."""
    by_name = {item["name"]: item for item in named if item.get("name")}
    filled, used = [], set()
    for entry in entries:
        wanted = entry.get("templateitemname")
        if wanted in by_name:
            used.add(wanted)
            item = {key: value for key, value in by_name[wanted].items() if key != "name"}
            filled.append(_under({key: value for key, value in entry.items()
                                  if key != "templateitemname"}, item))
        else:
            hidden = dict(entry, visible=entry.get("visible") or False) if wanted else entry
            filled.append(_under(hidden, default))
    return filled + [item for name, item in by_name.items() if name not in used]


def _plain(value: Any) -> Any:
    """`value` (a figure's dict, copied) with its arrays (numpy, pandas or plotly.py's
    typed-array specs) as lists and plotly objects as dicts."""
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = [int(size) for size in str(value.get("shape", array.size)).split(",")]
            return array.reshape(shape).tolist()
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "to_plotly_json"):  # a plotly object inside a dict
        return _plain(value.to_plotly_json())
    return value.tolist() if hasattr(value, "tolist") else value  # numpy, pandas
