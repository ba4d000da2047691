"""Long work says how long it takes: the estimator (`attribution.progress.TimeLeft`) with an
injected clock, and the app's progress lines on slowed-down computations (AppTest)."""
import re

import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses import costs, settings as analysis, view
from attribution.progress import SAY_ABOVE_SECONDS, TimeLeft
from pages.shared import context
from tests.support.app import (ESTIMATE, assert_clean, assert_no_line_left, run_app,
                               slowed_first_step)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the estimator


def test_the_first_step_gives_the_estimate():
    clock = Clock()
    time_left = TimeLeft(clock=clock)
    assert time_left.seconds(0.0) is None and time_left.words(0.0) == ""  # nothing measured
    clock.now += 2.0
    assert time_left.seconds(0.1) == pytest.approx(18.0)  # 10% in 2 s: 90% in 18 s
    assert time_left.words(0.1) == "about 18 s left"
    clock.now += 2.0
    assert time_left.seconds(0.5) == pytest.approx(4.0)  # the rate so far: 50% in 4 s
    assert time_left.words(1.0) == ""  # done


def test_short_work_says_nothing_and_long_work_says_minutes():
    clock = Clock()
    time_left = TimeLeft(clock=clock)
    clock.now += 0.5
    assert time_left.seconds(0.2) == pytest.approx(2.0)
    assert time_left.words(0.2) == ""  # under SAY_ABOVE_SECONDS: not worth a line
    assert time_left.words(0.2, above=1.0) == "about 2 s left"
    clock.now += 59.5
    assert time_left.words(0.25) == "about 3 min left"  # 180 s


def test_a_resumed_run_measures_only_its_own_progress():
    clock = Clock()
    time_left = TimeLeft(start_fraction=0.6, clock=clock)  # 60% computed before
    clock.now += 1.0
    assert time_left.seconds(0.7) == pytest.approx(3.0)  # 10% per second, 30% left
    time_left.restart()  # the kept points were dropped: from zero, from now
    clock.now += 5.0
    assert time_left.seconds(0.5) == pytest.approx(5.0)


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), -0.5])
def test_an_unknown_or_backwards_fraction_gives_no_estimate(fraction):
    clock = Clock()
    time_left = TimeLeft(clock=clock)
    clock.now += 3.0
    assert time_left.seconds(fraction) is None and time_left.words(fraction) == ""


def test_a_clock_that_did_not_move_gives_no_estimate():
    time_left = TimeLeft(clock=Clock())
    assert time_left.seconds(0.5) is None


def test_the_app_says_above_a_few_seconds():
    assert 2.0 <= SAY_ABOVE_SECONDS <= 5.0  # "more than a few seconds"


# ------------------------------------------------------------------ the app


@pytest.fixture
def cold():
    """The cached computations the pages call, emptied: the next run computes them."""
    cached = (context._findings, context._oracle, context._per_sample, context._scorecard,
              context._findings_cost, context._scorecard_cost)
    for function in cached:
        function.clear()
    yield
    for function in cached:
        function.clear()  # no slowed results left for other tests


def build(app) -> None:
    next(button for button in app.button if button.label == "Build report").click().run()
    assert_clean(app)


def test_a_slow_diagnosis_says_how_long_it_takes(monkeypatch, drawn, cold):
    app = run_app()
    checks = slowed_first_step(monkeypatch, at, "diagnose_on")
    oracle = slowed_first_step(monkeypatch, at, "oracle_agreement_on")
    drawn.clear()
    app.switch_page("pages/diagnosis.py").run()
    assert_no_line_left(app)  # each line removed when its work ended
    assert checks and checks[0] <= 0.4 and oracle and oracle[0] <= 0.4
    for what in ("Running the degeneracy checks", "Comparing every method with exact ablation"):
        lines = [text for text in drawn if text.startswith(what)]
        assert lines and ESTIMATE.search(lines[0]), (what, drawn)
    drawn.clear()
    app.run()  # the cache hit replays the lines' drawing: it must end as nothing, no error
    assert_no_line_left(app)
    assert not any(ESTIMATE.search(text) for text in drawn)


def test_a_slow_report_says_how_long_it_takes(monkeypatch, drawn, cold):
    app = run_app()
    app.switch_page("pages/export.py").run()
    assert_clean(app)
    curves = slowed_first_step(monkeypatch, view, "cluster_pruning_curves")
    oracle = slowed_first_step(monkeypatch, at, "oracle_agreement_on")
    drawn.clear()
    build(app)
    assert curves and curves[0] <= 0.4 and oracle and oracle[0] <= 0.4
    assert any(text.startswith("Pruning curves: about") and ESTIMATE.search(text)
               for text in drawn), drawn
    assert any(text.startswith("Comparing every method") and ESTIMATE.search(text)
               for text in drawn), drawn
    assert app.session_state["report"][1].startswith(b"<!")  # the report was built
    assert not app.get("progress")


def test_the_fast_demo_views_show_no_estimate(drawn, cold):
    app = run_app()
    for page in ("pages/diagnosis.py", "pages/export.py"):
        app.switch_page(page).run()
        assert_no_line_left(app)
    build(app)  # the report, computed on the demo
    said = [text for text in drawn if ESTIMATE.search(text)
            and not text.startswith("Measuring every method on every layer")]
    assert not said, said  # the report's scorecard takes several seconds, and says so


def test_a_slow_pruning_curve_says_how_long_it_takes(monkeypatch, drawn):
    app = run_app()
    curves = slowed_first_step(monkeypatch, view, "cluster_pruning_curves")
    drawn.clear()
    app.switch_page("pages/pruning.py").run()
    assert_no_line_left(app)
    assert curves and curves[0] <= 0.4
    assert any(ESTIMATE.search(text) and "estimated from the points so far" in text
               for text in drawn), drawn


def test_diagnose_reports_from_its_first_batch():
    """The estimate comes from the first batch: diagnose reports before its first whole step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.randn(40, 6)
    fractions = []
    at.diagnose(model, "1", x, None, "gradient", batch_size=10,
                progress=lambda fraction, _: fractions.append(fraction))
    assert fractions[0] == pytest.approx(0.2 * 10 / 40)  # one batch of 40 samples scored
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_slow_scoring_says_how_long_it_takes_on_the_first_page(monkeypatch, drawn, cold):
    scored = slowed_first_step(monkeypatch, at, "neuron_scores")  # what Context.scores calls
    app = run_app()
    assert_no_line_left(app)
    assert scored and scored[0] <= 0.4
    assert any(text.startswith("Scoring neurons by") and ESTIMATE.search(text)
               for text in drawn), drawn


def test_the_pruning_page_says_the_curves_cost_and_its_cheaper_setting_first(monkeypatch):
    """Before the curve runs, beside its controls: its passes and time, and where it costs
    more than a few seconds the cheaper number of random orders (a choice of the slider);
    the command line's flags are not offered on the page."""
    from attribution.analyses import costs

    app = run_app()
    app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    said = [c.value for c in app.caption if c.value.startswith("This curve costs ")]
    n_neurons = app.session_state["context"].n_neurons
    s = app.session_state["context"].settings
    masks = costs.distinct_masks(n_neurons, s.n_random, s.curve_ks(n_neurons), s.seed)
    assert len(said) == 1 and f"{masks} masked passes" in said[0], said
    monkeypatch.setattr(costs, "WORTH_SAYING_SECONDS", 0.0)
    app.switch_page("pages/scores.py").run()
    app.session_state["w_random"] = 50  # another curve: its cost measured anew
    app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    said = [c.value for c in app.caption if c.value.startswith("This curve costs ")]
    assert len(said) == 1 and f"cheaper: {costs.CHEAPER_N_RANDOM} random orders (" in said[0]
    assert "--" not in said[0] and costs.CHEAPER_N_RANDOM in analysis.RANDOM_ORDERS


@pytest.mark.parametrize("page, patched, said", [
    ("pages/diagnosis.py", "diagnose_on", "These checks take "),
    ("pages/trust.py", "scorecard_on", "The scorecard takes "),
])
def test_the_diagnosis_and_trust_pages_say_their_cost_before_they_run(monkeypatch, cold,
                                                                       page, patched, said):
    """The work is priced first (`diagnose_cost`, `scorecard_cost`: the estimate times
    what it times on samples, `costs.sampled_cost`) and said above its result; then the work
    runs on every sample."""
    from attribution.analyses import diagnose, scorecard
    module = diagnose if patched == "diagnose_on" else scorecard
    real, real_cost, calls = getattr(at, patched), module.sampled_cost, []

    def recorded(*args, progress=None, **kwargs):
        calls.append("work" if progress is not None else "run timed")
        return real(*args, progress=progress, **kwargs)

    def timing(*args, **kwargs):
        calls.append("timing")
        return real_cost(*args, **kwargs)
    monkeypatch.setattr(at, patched, recorded)
    monkeypatch.setattr(module, patched, recorded)
    monkeypatch.setattr(module, "sampled_cost", timing)
    app = run_app()
    app.switch_page(page).run()
    assert_clean(app)
    words = [c.value for c in app.caption if c.value.startswith(said)]
    assert len(words) == 1 and re.search(r"(about|at most) \d+(\.\d)? s|under 1 s",
                                         words[0]), words
    assert "timing" in calls and calls.index("timing") < calls.index("work"), calls
    app.run()  # a rerun: both cached, nothing timed again
    assert calls.count("work") == 1 and calls.count("timing") == 1


def test_a_path_method_takes_the_steps_that_fit_and_says_so(monkeypatch, cold):
    """With a budget no step count fits, integrated gradients on the Scores page takes the
    fewest steps, says so and what the steps asked would take, and its scores are those
    of that many steps; the toggle of every step asked, priced as said, takes them all."""
    from attribution.analyses import path_steps

    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    context._steps_plan.clear()
    scored = []
    real = at.neuron_scores

    def recording(*args, n_steps, **options):
        scored.append(n_steps)
        return real(*args, n_steps=n_steps, **options)

    monkeypatch.setattr(at, "neuron_scores", recording)
    try:
        app = run_app({"method": "integrated_gradients", "compare": ""})
        assert_clean(app)
        said = [caption.value.replace("\\", "") for caption in app.caption  # escaped
                if caption.value.startswith("Integrated gradients at ")]
        assert len(said) == 1 and said[0].startswith("Integrated gradients at 8 steps, ")
        assert "still over the 0 s budget (32 steps: " in said[0]
        assert scored == [8]  # the page's scores; the plan's timings are path_steps' own
        every = app.toggle(key="every_step")  # every step asked, at the price said
        price = said[0].split("(32 steps: ")[1].split(")")[0]
        assert every.label == f"Integrate with every step asked ({price})"
        monkeypatch.setattr(costs, "WORTH_SAYING_SECONDS", -1.0)  # its time always said
        every.set_value(True).run()
        assert_clean(app)
        said = [caption.value.replace("\\", "") for caption in app.caption
                if caption.value.startswith("Integrated gradients at ")]
        assert scored == [8, 32] and len(said) == 1
        assert said[0].startswith(f"Integrated gradients at 32 steps, {price}")
        assert "budget" not in said[0]
    finally:
        context._steps_plan.clear()


def test_the_diagnosis_page_offers_every_step_asked_of_its_path_method(monkeypatch, cold):
    """The Diagnosis page of a path method whose steps were cut to the budget says so and
    offers every step asked (priced); on, its checks score the method at those steps."""
    from attribution.analyses import path_steps

    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    context._steps_plan.clear()
    checked = []
    real = at.diagnose_on
    monkeypatch.setattr(at, "diagnose_on", lambda view, **options: (
        checked.append(view.steps()), real(view, **options))[1])
    try:
        app = run_app({"method": "integrated_gradients", "compare": ""})
        app.switch_page("pages/diagnosis.py").run()
        assert_clean(app)
        every = app.toggle(key="diagnosis_every_step")
        assert every.label.startswith("Integrate with every step asked (")
        assert checked == [path_steps.FEWEST_STEPS]

        def said() -> list[str]:
            return [caption.value.replace("\\", "") for caption in app.caption
                    if caption.value.startswith("Integrated gradients at ")]
        assert len(said()) == 1 and said()[0].startswith("Integrated gradients at 8 steps, ")
        every.set_value(True).run()
        assert_clean(app)
        assert checked == [path_steps.FEWEST_STEPS, analysis.DEFAULT_N_STEPS] and not said()
    finally:
        context._steps_plan.clear()
