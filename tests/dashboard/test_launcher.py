"""scripts/serve.py, the launcher `make run` starts, read without serving (the browser tests
serve through it: tests/dashboard/test_browser.py)."""
import importlib.util

from pages.shared import startup
from tests.support import ROOT
from tests.support.browser import streamlit_server, wait_until_healthy

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


def test_a_served_dashboard_writes_every_threads_stack_when_asked_and_keeps_serving():
    """SIGUSR1 (`Server.stacks`, which a failed browser test shows): the launcher's threads,
    the main one serving; the server still answers after it."""
    with streamlit_server("stacks.log") as server:
        stacks = server.stacks()
        assert "Thread 0x" in stacks and "most recent call first" in stacks, stacks[-2000:]
        assert "tornado" in stacks or "asyncio" in stacks, stacks[-2000:]
        wait_until_healthy(server.url, server.process, server.log)
