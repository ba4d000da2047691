"""Small drawing helpers every page uses: a plotly chart drawn the same way everywhere, user
text made inert for markdown, a user mistake shown as a message instead of a crash, and the
choice of every path step asked."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

import plotly.graph_objects as go
import streamlit as st

import attribution as at
from attribution.analyses.costs import seconds_words
from attribution.analyses.path_steps import StepsPlan
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


def every_step_toggle(ctx, plans: Sequence[StepsPlan], key: str, copies: int = 1,
                      where: str = ""):
    """`ctx` (a page's `Context`) with path methods at every step asked where the user turns
    it on: a toggle, priced at `copies` scorings of each plan at its steps asked, drawn
    where some of `plans` took fewer to fit their budget; `ctx` itself where none did.
    `where`: which layers, in words (" on every layer")."""
    reduced = [plan for plan in plans if plan is not None and plan.reduced]
    if not reduced:
        return ctx
    seconds = copies * sum(plan.asked_seconds for plan in reduced)
    every = st.toggle(f"Integrate with every step asked{where} ({seconds_words(seconds)})",
                      key=key, help=f"Path methods take as many steps as fit "
                                    f"{reduced[0].budget:.0f} s{where}; on, the "
                                    f"{reduced[0].asked} asked, whatever they cost.")
    return ctx.with_every_step(every)
