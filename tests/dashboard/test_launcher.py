"""scripts/serve.py, the launcher `make run` starts, read without serving (the browser tests
serve through it: tests/dashboard/test_browser.py)."""
import importlib.util

from pages.shared import startup
from tests.support import ROOT

spec = importlib.util.spec_from_file_location("serve", ROOT / "scripts" / "serve.py")
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)


def test_the_warm_up_imports_what_app_py_imports_first_in_the_same_order():
    """plotly, set_page_config's emojis, the placeholder chart's modules, then
    startup.LIBRARIES but streamlit (the launcher imports it to serve): a library added to
    the start-up is warmed too, and both threads take the modules' import locks in one
    order."""
    placeholder = ("plotly.graph_objects", "streamlit.emojis", "numpy", "pandas", "PIL.Image")
    libraries = tuple(name for name in startup.LIBRARIES if name != "streamlit")
    expected = placeholder + tuple(name for name in libraries if name not in placeholder)
    assert serve.WARMED == expected
