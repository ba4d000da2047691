"""The Trust and Diagnosis pages stopped mid-way by their own Stop button: the work done
stays on the page, and Continue (the scorecard: the layers not measured; the checks: all of
them again) ends where an uninterrupted run ends. The click is played at a progress call:
it marks the run stopped and reruns the page, as the button's callback and rerun do."""
import numpy as np
import pytest
import streamlit as st

import attribution as at
import attribution.progress
from pages.shared import stoppable
from tests.support.app import assert_clean, figure, run_app

TRUST, DIAGNOSIS = "pages/trust.py", "pages/diagnosis.py"


@pytest.fixture
def stop_when(monkeypatch):
    """stop_when(condition): the first partial result meeting `condition` is kept, then the
    run is stopped and the page rerun (the Stop button's click); the buttons always shown."""
    monkeypatch.setattr(attribution.progress, "SAY_ABOVE_SECONDS", 0.0)
    original, fired = stoppable.StoppableRun.keep, []

    def arm(condition):
        def keep(run, partial):
            original(run, partial)
            if not fired and condition(partial):
                fired.append(partial)
                run.stop()
                st.rerun()
        monkeypatch.setattr(stoppable.StoppableRun, "keep", keep)
        return fired
    return arm


def button(app, label: str):
    return next(b for b in app.button if b.label == label)


def test_a_stopped_scorecard_shows_its_layers_done_and_continues_with_the_rest(monkeypatch,
                                                                               stop_when):
    st.cache_data.clear()
    resumed, original = [], at.scorecard_on
    monkeypatch.setattr(at, "scorecard_on", lambda *args, **kwargs: resumed.append(
        kwargs.get("resume")) or original(*args, **kwargs))
    fired = stop_when(lambda card: len(card.attrs["layers_done"]) == 1)
    app = run_app()
    app.switch_page(TRUST).run()
    assert_clean(app)
    context = app.session_state["context"]
    first = context.ws.layers[0].name
    assert len(fired) == 1 and [b.label for b in app.button] == ["Continue the scorecard"]
    assert any(f"Stopped: the scorecard shows the 1 of {len(context.ws.layers)} layers"
               in info.value for info in app.info)
    assert figure(app, "Which method to trust")["data"][0]["y"] == [first]
    assert len(app.dataframe[0].value) == int((fired[0]["layer"] == first).sum())
    button(app, "Continue the scorecard").click().run()
    assert_clean(app)
    assert not any(b.label.startswith(("Stop", "Continue")) for b in app.button)
    assert resumed[0] is None and resumed[1].attrs["layers_done"] == [first]
    data = context.ws.data
    steps = {key: plan.n_steps for key, plan in context.scorecard_steps().items()}
    expected = at.scorecard(context.ws.model, data.inputs, data.labels, data.labels.numpy(),
                            n_steps=steps)
    shown = figure(app, "Which method to trust")["data"][0]
    assert shown["y"] == [info.name for info in context.ws.layers]
    grid = expected.pivot(index="layer", columns="method", values="spearman")
    np.testing.assert_allclose(np.asarray(shown["z"], dtype=float),
                               grid.loc[shown["y"], list(dict.fromkeys(expected["method"]))],
                               rtol=1e-9)


def test_stopped_checks_show_those_that_ran_and_run_again_to_the_verdict(stop_when):
    st.cache_data.clear()
    fired = stop_when(lambda findings: len(findings) > 0)
    app = run_app()
    app.switch_page(DIAGNOSIS).run()
    assert_clean(app)
    done = len(fired[0])
    assert [b.label for b in app.button] == ["Run the checks again"]
    assert any(f"Stopped: the {done} checks that had run" in info.value for info in app.info)
    assert len(app.success) + len(app.warning) + len(app.error) + len(app.info) == done + 1
    assert not any(s.value == "Evidence" for s in app.subheader)
    button(app, "Run the checks again").click().run()
    assert_clean(app)
    assert not any(b.label in ("Stop the checks", "Run the checks again") for b in app.button)
    assert any(s.value == "Evidence" for s in app.subheader)


def test_the_remedies_are_priced_before_they_are_measured_and_can_be_stopped(monkeypatch):
    """A verdict with remedies (gradient on the correctly classified digits): their cost
    is estimated before they are measured; a stop while they are measured keeps the
    verdict, offers no unmeasured remedy, and "Measure the changes" measures them; once
    measured, a rerun neither prices nor measures them again."""
    from pages.shared import context as shared

    monkeypatch.setattr(attribution.progress, "SAY_ABOVE_SECONDS", 0.0)
    st.cache_data.clear()
    calls = []
    priced, measured = shared.Context.remedies_cost, shared.Context.tried_remedies

    def pricing(ctx, answer, checks_seconds):
        calls.append("priced")
        return priced(ctx, answer, checks_seconds)

    def measuring(ctx, answer, findings):
        calls.append("measured")
        if calls.count("measured") == 1:  # the Stop button's click while they are measured
            ctx.remedies_run(answer).stop()
            st.rerun()
        return measured(ctx, answer, findings)

    monkeypatch.setattr(shared.Context, "remedies_cost", pricing)
    monkeypatch.setattr(shared.Context, "tried_remedies", measuring)
    app = run_app({"cluster_by": "correctness", "method": "gradient"})
    app.switch_page(DIAGNOSIS).run()
    assert_clean(app)
    assert calls == ["priced", "measured"]
    assert "The signed mean cancels" in app.warning[0].value  # the verdict stays
    assert not [b for b in app.button if b.key and b.key.startswith("remedy_")]
    assert any(c.value.startswith("The changes this verdict suggests were not measured")
               for c in app.caption)
    button(app, "Measure the changes").click().run()
    assert_clean(app)
    assert calls == ["priced", "measured", "priced", "measured"]
    assert [b.key for b in app.button if b.key and b.key.startswith("remedy_")] == [
        "remedy_method_gradient_x_activation", "remedy_cluster_source_label"]
    app.run()
    assert_clean(app)
    assert calls[4:] == ["measured"]  # cached and finished: not priced again
