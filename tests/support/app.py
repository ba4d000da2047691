"""Driving the dashboard through Streamlit's AppTest: run it, upload files, read its widgets and
figures, and slow down what its pages call to see their progress lines."""
import ast
import base64
import json
import re
import time

import numpy as np
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.testing.v1 import AppTest

from attribution.analyses import view as view_module
from attribution.inputs.shipped import DEMO_DIR
from tests.support import ROOT

APP = str(ROOT / "app.py")
OCTET = "application/octet-stream"


def app_pages(leave_out: tuple[str, ...] = ()) -> list[str]:
    """The pages app.py lists (each st.Page's path, in its order), less `leave_out`: a test
    that visits every page then visits a page added later too."""
    tree = ast.parse((ROOT / "app.py").read_text())
    pages = [call.args[0].value for call in ast.walk(tree) if isinstance(call, ast.Call)
             and getattr(call.func, "attr", None) == "Page"]
    assert pages and set(leave_out) <= set(pages), (pages, leave_out)
    return [page for page in pages if page not in leave_out]


def run_app(query: dict | None = None) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=120)
    app.query_params.update(query or {})
    return app.run()


def assert_clean(app: AppTest) -> None:
    assert not app.exception, [e.value for e in app.exception]


def figures(app: AppTest) -> dict[str, dict]:
    """Plotly charts on the page by title: {title: figure spec}."""
    specs = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    return {spec["layout"].get("title", {}).get("text", ""): spec for spec in specs}


def figure(app: AppTest, title_part: str) -> dict:
    matches = [spec for title, spec in figures(app).items() if title_part in title]
    assert len(matches) == 1, (title_part, list(figures(app)))
    return matches[0]


def values(encoded) -> np.ndarray:
    """A figure's data array as plotly's JSON holds it (plain list or base64 typed array)."""
    if isinstance(encoded, dict) and "bdata" in encoded:
        flat = np.frombuffer(base64.b64decode(encoded["bdata"]), dtype=encoded["dtype"])
        shape = [int(n) for n in str(encoded.get("shape", len(flat))).split(",")]
        return flat.reshape(shape)
    return np.asarray(encoded)


def sidebar_widget(app: AppTest, key: str):
    for kind in ("selectbox", "multiselect", "radio", "select_slider"):
        found = [w for w in getattr(app.sidebar, kind) if w.key == key]
        if found:
            return found[0]
    raise KeyError(key)


def demo_bytes(name: str) -> bytes:
    return (DEMO_DIR / name).read_bytes()


# ------------------------------------------------------------------ uploads

GOOD_MODEL = ("m.pt2", demo_bytes("digits_mlp.pt2"), OCTET)
GOOD_DATA = ("d.npz", demo_bytes("digits.npz"), OCTET)


def upload(app: AppTest, model: tuple, data: tuple, architecture: tuple | None = None):
    app.switch_page("pages/data.py").run()
    app.file_uploader(key="model_file").set_value(model)
    if architecture is not None:
        app.file_uploader(key="architecture_file").set_value(architecture)
    app.file_uploader(key="data_file").set_value(data)
    return app.run()


# ------------------------------------------------------------------ slowed work

def stop_at_first_points(monkeypatch) -> None:
    """Make the pruning page's run stop at its curve's first progress update, as a stop
    reaches a script (a request of its run, raised at its next Streamlit call: inside that
    update): the stop lands mid-curve however fast or loaded the machine, without a clock."""
    real = view_module.cluster_pruning_curves  # what the page calls, through the view

    def stopping(*args, progress, **kwargs):
        def stop(fraction, partial):
            get_script_run_ctx().script_requests.request_stop()
            progress(fraction, partial)
            raise AssertionError("the progress update did not raise the stop requested")
        return real(*args, progress=stop, **kwargs)

    monkeypatch.setattr(view_module, "cluster_pruning_curves", stopping)


ESTIMATE = re.compile(r"about \d+ (s|min) left")
FIRST_STEP_SECONDS = 2.5  # the slowed first step: at 40% done or less, >= 3.75 s left


def slowed_first_step(monkeypatch, module, name: str) -> list[float]:
    """Patch `module.name` (what the app really calls) so that its first progress report
    comes FIRST_STEP_SECONDS late; returns the fractions it reported."""
    real, reported = getattr(module, name), []

    def slow(*args, progress=None, **kwargs):
        def late(fraction, *rest):
            if not reported:
                time.sleep(FIRST_STEP_SECONDS)
            reported.append(fraction)
            return progress(fraction, *rest)
        return real(*args, progress=None if progress is None else late, **kwargs)

    monkeypatch.setattr(module, name, slow)
    return reported


def assert_no_line_left(app) -> None:
    assert_clean(app)
    assert not app.get("progress"), [e.proto for e in app.get("progress")]
