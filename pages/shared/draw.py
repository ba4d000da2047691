"""Small drawing helpers every page uses: a plotly chart drawn the same way everywhere, user
text made inert for markdown, and a user mistake shown as a message instead of a crash."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

import plotly.graph_objects as go
import streamlit as st

import attribution as at
from pages.shared.figures import drawn_once


def escape_markdown(text: object) -> str:
    """A user-supplied string made inert for st.markdown (no links, images or formatting)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$:])", r"\\\1", str(text))


def chart(figure: go.Figure | dict, key: Optional[str] = None,
          on_click: Optional[Callable[[], None]] = None) -> None:
    """Draw a plotly figure the same way on every page (the figure's own colours).
    `on_click` runs when the user clicks a point; the selection is then in
    st.session_state[key]["selection"]["points"]."""
    clicks = {} if on_click is None else dict(on_select=on_click, selection_mode="points")
    st.plotly_chart(drawn_once(figure, clickable=on_click is not None), theme=None, key=key,
                    config={"displaylogo": False}, **clicks)


def show_error(message: object, before: str = "", after: str = "") -> None:
    """A user mistake as an error box: the message's first line as plain text (it may quote
    file names, layer or key names), further lines (a code recipe) in a code block."""
    first, *rest = str(message).split("\n")
    st.error(before + escape_markdown(first) + after, icon=":material/error:")
    if rest:
        st.code("\n".join(rest), language="python")


def guarded(action: Callable[[], Any]) -> Any:
    """Run `action`; a user mistake (AttributionError) becomes a message and None."""
    try:
        return action()
    except at.AttributionError as error:
        show_error(error)
        return None
