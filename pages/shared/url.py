"""The page address: every choice a shared link reproduces is written into the URL after each
run (`sync_url`), and a link's parameters are applied once per session (`from_url`).
"""
from __future__ import annotations

from typing import Optional

import streamlit as st

from attribution.analyses.settings import SETTINGS
from pages.shared.workspace import UPLOAD

URL_KEYS = {"w_source": "source",
            **{setting.key: setting.key.removeprefix("w_") for setting in SETTINGS.values()
               if setting.key},
            "w_neuron": "neuron"}
"""Session-state key -> URL parameter, for every choice a shared link reproduces: the model
and data, every setting's widget (`attribution.analyses.settings.SETTINGS`) and the neuron
in view."""


def from_url() -> dict[str, str]:
    """URL parameters not yet applied to a widget (read once per session). A link to an
    uploaded model's view waits until the files are uploaded."""
    if "url_choices" not in st.session_state:
        st.session_state["url_choices"] = {key: st.query_params[param]
                                           for key, param in URL_KEYS.items()
                                           if param in st.query_params}
    if waits_for_upload():
        return {}
    return st.session_state["url_choices"]


def waits_for_upload() -> bool:
    return (st.session_state.get("url_choices", {}).get("w_source") == UPLOAD
            and "upload" not in st.session_state)


def url_choice(key: str) -> Optional[str]:
    """A page's own choice from a shared link, once per session (e.g. "w_neuron"), else None."""
    return from_url().pop(key, None)


def sync_url() -> None:
    """Write every choice into the page address, when it differs from what is there."""
    choices = {}
    for key, param in URL_KEYS.items():
        value = st.session_state.get(key, st.session_state.get("kept", {}).get(key))
        if value is None:
            continue
        choices[param] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    if "class" in choices and st.session_state.get("w_target") != "fixed":
        del choices["class"]
    if "k" in choices and not str(st.session_state.get("w_cluster_by", "")).startswith("kmeans"):
        del choices["k"]
    if {k: st.query_params.get(k) for k in choices} != choices or \
            set(st.query_params.keys()) - set(choices):
        st.query_params.from_dict(choices)

