"""Neuron importance dashboard: `streamlit run app.py` (add `-- --trust-code` only for your
own files on your own machine). Opens on the built-in digits demo with charts drawn.

The page scripts live in views/, not pages/: Streamlit treats a pages/ folder next to the
main script as the legacy folder-based navigation until st.navigation first runs, so a shared
link to a page, opened first on a fresh server, would skip this file."""
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="Neuron importance", page_icon="🧠", layout="wide")

PAGES = [
    st.Page("views/scores.py", title="Neuron scores", icon=":material/grid_on:", default=True),
    st.Page("views/pruning.py", title="Pruning curves", icon=":material/show_chart:"),
    st.Page("views/diagnosis.py", title="Diagnosis", icon=":material/health_and_safety:"),
    st.Page("views/data.py", title="Model & data", icon=":material/upload_file:"),
    st.Page("views/export.py", title="Share & export", icon=":material/download:"),
]
page = st.navigation(PAGES, position="top")

loading = st.empty()
if "session_started" not in st.session_state:
    # A session's first run: draw a placeholder chart before importing torch and loading the
    # model, so the browser fetches the chart library while the server works.
    st.session_state["session_started"] = True
    placeholder = go.Figure(layout=dict(
        height=160, xaxis_visible=False, yaxis_visible=False, template="plotly_white",
        annotations=[dict(text="Loading the model and scoring neurons…", showarrow=False,
                          font=dict(size=16, color="#57606A"))]))
    loading.plotly_chart(placeholder, theme=None, config={"staticPlot": True})

from views import common  # noqa: E402  (imports torch: after the placeholder is on its way)

context = common.sidebar()
loading.empty()
# The Model & data page stays usable when the current model or data fails to load.
if context is not None or page.title == "Model & data":
    page.run()
