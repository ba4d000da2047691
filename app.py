"""Neuron importance dashboard: `streamlit run app.py` (add `-- --trust-code` only for your
own files on your own machine). Opens on the built-in digits demo with charts drawn.

Pages run through `routing.run_page` (pages/shared/routing.py): until st.navigation first runs
in the server process, Streamlit runs a page's address (a shared link on a fresh server) as
that pages/ script alone, and the page then runs this file in its place
(`routing.require_entrypoint`)."""
import importlib

import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="Neuron importance", page_icon="🧠", layout="wide",
                   initial_sidebar_state=380)  # px, so "branch0.linear · Linear · 4 neurons" fits

PAGES = [
    st.Page("pages/scores.py", title="Neuron scores", icon=":material/grid_on:", default=True),
    st.Page("pages/pruning.py", title="Pruning curves", icon=":material/show_chart:"),
    st.Page("pages/diagnosis.py", title="Diagnosis", icon=":material/health_and_safety:"),
    st.Page("pages/trust.py", title="Which method to trust", icon=":material/leaderboard:"),
    st.Page("pages/neuron.py", title="Neuron", icon=":material/neurology:"),
    st.Page("pages/data.py", title="Model & data", icon=":material/upload_file:"),
    st.Page("pages/export.py", title="Share & export", icon=":material/download:"),
]
page = st.navigation(PAGES, position="top")


@st.cache_resource(show_spinner=False)
def import_plotly_optional_modules() -> None:
    """Import numpy, pandas and PIL.Image to the end, once per server process.

    plotly (`_plotly_utils.optional_imports.get_module(name, should_load=False)`) takes these
    from sys.modules as it finds them, and a module enters sys.modules before its body has
    run: a figure built while another session's thread is still importing one fails with
    "partially initialized module 'pandas' has no attribute 'Series'". `import` waits for
    another thread's import of the same module to finish, and the cache's compute lock makes
    every session wait here until the first has done it."""
    for name in ("numpy", "pandas", "PIL.Image"):
        importlib.import_module(name)


import_plotly_optional_modules()

loading = st.empty()
if "session_started" not in st.session_state:
    # A session's first run: draw a placeholder chart before importing torch and loading the
    # model, so the browser fetches the chart library while the server works.
    st.session_state["session_started"] = True
    placeholder = go.Figure(dict(layout=dict(  # unvalidated, no template: ~0.1 s sooner
        height=160, template={}, xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text="Loading the model and scoring neurons…", showarrow=False,
                          font=dict(size=16, color="#57606A"))])), _validate=False)
    loading.plotly_chart(placeholder, theme=None, config={"staticPlot": True})

# imports torch: after the placeholder is on its way
from pages.shared import routing, startup  # noqa: E402,F401
from pages.shared.sidebar import sidebar  # noqa: E402

context = sidebar(page.url_path)
loading.empty()
# The Model & data page stays usable when the current model or data fails to load.
if context is not None or page.title == "Model & data":
    routing.run_page(page)
