"""Start-up: what the server process settles once, before any page runs.

`TRUST_CODE` is the one start-up setting. Importing this module also imports the libraries
the dashboard's modules use and freezes what they made out of the garbage collector: the
hundreds of thousands of objects of torch, pandas, plotly and attribution live as long as the
server, and Streamlit collects garbage fully after every run (runner.postScriptGC), walking
them while holding the GIL while the run's last messages wait to be sent. Frozen, they are skipped.
app.py imports it after its placeholder chart is on its way (torch takes a while).
"""
import gc
import importlib
import os
import sys

LIBRARIES = (  # what the dashboard's modules import: made before the freeze
    "numpy", "plotly.graph_objects", "streamlit", "torch", "attribution",
    "attribution.presentation.plots", "attribution.inputs.data", "attribution.inputs.demo",
    "attribution.inputs.model_formats", "attribution.progress", "attribution.analyses.settings",
    "attribution.analyses.verdict")
for _name in LIBRARIES:
    importlib.import_module(_name)
importlib.import_module("attribution").import_all()  # the package imports lazily

gc.collect()  # nothing unreachable is frozen
gc.freeze()

TRUST_CODE = "--trust-code" in sys.argv[1:] or os.environ.get("ATTRIBUTION_TRUST_CODE") == "1"
"""Start-up setting (`streamlit run app.py -- --trust-code`): lets uploads run code. Only for
one's own files on one's own machine; never a widget."""
