"""Which script runs: app.py's st.navigation picks the page, and every page script first makes
sure app.py ran (`require_entrypoint`); `switch_page` moves to another page keeping every
choice.

Streamlit 1.67 treats a pages/ folder next to app.py as its legacy folder navigation until
st.navigation first runs in the server process (and AppTest re-enters it on every run): a
page's address (/pruning?layer=...) then runs that page script alone, without app.py. Each
page therefore starts with `require_entrypoint()`, which runs app.py in its place, the way
Streamlit itself runs app.py for the root address in that mode. That navigation lists only
pages/*.py: the modules of pages/shared/ are never pages.
"""
from __future__ import annotations

import runpy
from pathlib import Path

import streamlit as st

NEURON_CHOICE = "neuron_choice"  # session state: the neuron the Neuron page opens
NEURON_PAGE = "pages/neuron.py"
SCORES_PAGE = "pages/scores.py"
APP_SCRIPT = Path(__file__).resolve().parents[2] / "app.py"
ENTRYPOINT_RAN = "entrypoint_ran"  # session-state flag: app.py is about to run a page


def run_page(page: st.Page) -> None:
    """Run the page st.navigation chose (in app.py), telling its `require_entrypoint` so."""
    st.session_state[ENTRYPOINT_RAN] = True
    page.run()


def require_entrypoint() -> None:
    """Call first in every page script. When app.py did not run this page, run app.py here
    instead: its st.navigation picks this same page from the address, with the sidebar and
    the URL's settings, and this run stops after it."""
    if st.session_state.pop(ENTRYPOINT_RAN, False):
        return
    runpy.run_path(str(APP_SCRIPT), run_name="__main__")
    st.stop()


def switch_page(page: str, **params: str) -> None:
    """st.switch_page that keeps every choice. Streamlit drops widget values on a rerun the
    script itself requests, so the choices travel in the page address (with `params` added)
    and the next run applies them as it applies a shared link."""
    address = {param: value for param, value in st.query_params.to_dict().items()}
    address.update(params)
    st.session_state.pop("url_choices", None)  # url.from_url reads the address again
    st.switch_page(page, query_params=address)

