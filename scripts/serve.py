"""Serve the dashboard with its heavy imports warmed: what `make run` starts.

    python scripts/serve.py [streamlit run flags] [-- app arguments]
    python scripts/serve.py --server.port 8502 -- --trust-code

The same as `streamlit run app.py` with the same flags, in this process, plus a background
thread that imports the libraries a session's first run needs (torch, pandas, plotly and the
attribution package: ~1.5 s, most of that run) while the server starts and the browser loads
the page; the collector is paused meanwhile (~15% of that time). A visitor whose first run
starts mid-way waits on Python's per-module import lock for what this thread has begun, and
app.py imports plotly's optional modules to the end before its first figure
(`import_plotly_optional_modules`). Only modules that need neither Streamlit's runtime nor the
script's sys.argv are warmed: the app's own (pages/shared: its st.cache decorators, the
`--trust-code` argument) are left to the first run, ~0.1 s.

A server that stops answering says why: `kill -USR1 <pid>` writes every thread's stack to its
output (the tests do it when a browser test fails, and show the stacks in the report).

Here, not in attribution/ (which never imports streamlit) nor in pages/ (what Streamlit
serves and the page scripts share): it is a command run from the shell, like make_demo.py.
"""
from __future__ import annotations

import faulthandler
import gc
import importlib
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
WARMED = (  # in the order app.py's first run imports them (so both take their locks in one
    # order): plotly, set_page_config's for its emoji icon (~0.2 s), the placeholder chart's,
    # then pages.shared.startup.LIBRARIES but streamlit
    "plotly.graph_objects", "streamlit.emojis", "numpy", "pandas", "PIL.Image", "torch",
    "attribution", "attribution.presentation.plots", "attribution.inputs.data",
    "attribution.inputs.demo", "attribution.inputs.model_formats", "attribution.progress",
    "attribution.analyses.settings", "attribution.analyses.verdict")
WARMED_LINE = "  Warm-up: the first page's libraries imported in {seconds:.1f} s."


def warm_up() -> None:
    """Import `WARMED` with the garbage collector paused, then say so on stdout."""
    started = time.monotonic()
    gc.disable()
    try:
        for name in WARMED:
            importlib.import_module(name)
        importlib.import_module("attribution").import_all()  # the package imports lazily
    finally:
        gc.enable()
    print(WARMED_LINE.format(seconds=time.monotonic() - started), flush=True)


def main(arguments: list[str]) -> None:
    sys.path.insert(0, str(ROOT))  # as `streamlit run` puts app.py's folder first
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every stack
    from streamlit.web import cli  # before the warm-up: it imports PIL and plotly too

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    sys.argv = ["streamlit", "run", str(APP), *arguments]  # every argument passed on as given
    cli.main()  # click: parses sys.argv, serves until stopped, exits


if __name__ == "__main__":
    main(sys.argv[1:])
