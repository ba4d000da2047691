"""`path_steps.plan_steps`: a path method's steps fitted to a time budget, each kept size
timed itself (refinement and all), and what the command line says of it."""
import io

import pandas as pd
import pytest
import torch

import attribution as at
from attribution import cli
from attribution.analyses import costs, path_steps
from attribution.analyses.settings import DEFAULT_N_STEPS
from attribution.methods.paths import PathSums
from tests.support.models import build


def test_the_steps_asked_are_kept_where_they_fit():
    model, x, y = build("residual_mlp")
    plan = path_steps.plan_steps(model, "fc2", x, y, "integrated_gradients", budget=60.0)
    assert (plan.n_steps, plan.asked, plan.reduced) == (DEFAULT_N_STEPS, DEFAULT_N_STEPS, False)
    assert plan.seconds == plan.asked_seconds > 0 and plan.n_samples == len(x)
    assert "as many as fit" not in plan.words()


@pytest.mark.parametrize("budget, chosen, timed", [
    (1e9, 32, [8, 32]),  # the guess from 8 steps: 32 fit
    (5.0, 8, [8, 16]),  # 8 steps: 4 s, a quarter refined: 16 timed, 8 s
    (9.0, 16, [8, 16]),
    (1.0, 8, [8]),  # even the fewest pass the budget: the fewest, said at their time
])
def test_the_most_steps_that_fit_are_kept_each_timed_itself(budget, chosen, timed,
                                                            monkeypatch):
    """On 800 samples a probe is 100 (one eighth); 62.5 ms a step on the probe: 8 steps
    take 4 s over every sample. Only the fewest steps and the steps kept are timed, after a
    warm-up of one sample; the steps asked, where not kept, are estimated in proportion."""
    clock, seen = [0.0], []

    def fake(model, layer, x, targets, method, *, n_steps, facts=None, **options):
        seen.append((len(x), n_steps))
        clock[0] += 0.0625 * n_steps
        if facts is not None:  # a quarter of the samples integrated again at 8 steps
            refined = n_steps * torch.ones(len(x), dtype=torch.int32)
            refined[: len(x) // 4 if n_steps == 8 else 0] = 2 * n_steps
            facts.sums = PathSums(torch.zeros(len(x)), torch.ones(len(x)), refined)

    monkeypatch.setattr(path_steps, "neuron_scores", fake)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    plan = path_steps.plan_steps(None, "fc", torch.zeros(800, 3), None, "conductance",
                                 budget=budget, batch_size=256)
    assert seen[0] == (1, 8) and {rows for rows, _ in seen[1:]} == {100}
    assert list(dict.fromkeys(steps for _, steps in seen[1:])) == timed
    assert plan.n_steps == chosen and plan.seconds == pytest.approx(0.5 * chosen)
    assert plan.asked_seconds == pytest.approx(0.5 * 32)
    assert plan.refined == (0.25 if chosen == 8 else 0.0)
    words = plan.words()
    assert words.startswith(f"conductance at {chosen} steps, ")
    assert ("as many as fit in" in words) == (chosen < 32 and budget > 1)
    assert ("the fewest it takes, and still over the 1 s budget (32 steps: about 16 s)"
            in words) == (budget == 1)
    assert ("25% of the samples missed their sum" in words) == (chosen == 8)


def test_more_steps_are_timed_where_refinement_made_the_fewest_dear(monkeypatch):
    """At 8 steps every sample misses its sum and takes twice the time (8 s over every
    sample), at 16 none does (8 s): with a 10 s budget the guess and the halving stop at 8,
    and 16, timed because 8 refined, fit; 32 (16 s) is not timed."""
    clock, seen = [0.0], []

    def fake(model, layer, x, targets, method, *, n_steps, facts=None, **options):
        seen.append(n_steps)
        clock[0] += 0.0625 * n_steps * (2 if n_steps == 8 else 1)
        if facts is not None:
            steps = torch.full((len(x),), n_steps * (2 if n_steps == 8 else 1))
            facts.sums = PathSums(torch.zeros(len(x)), torch.ones(len(x)), steps)

    monkeypatch.setattr(path_steps, "neuron_scores", fake)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])
    plan = path_steps.plan_steps(None, "fc", torch.zeros(800, 3), None, "conductance",
                                 budget=10.0, batch_size=256)
    assert list(dict.fromkeys(seen[1:])) == [8, 16]
    assert (plan.n_steps, plan.seconds, plan.refined) == (16, pytest.approx(8.0), 0.0)


def test_a_method_without_steps_is_refused():
    model, x, y = build("residual_mlp")
    with pytest.raises(at.AttributionError, match="takes no steps"):
        path_steps.plan_steps(model, "fc2", x, y, "gradient")
    assert path_steps.takes_steps("integrated_gradients") and path_steps.takes_steps(
        "conductance") and not path_steps.takes_steps("ablation")


def test_the_command_line_fits_the_steps_it_is_not_given_and_says_so(monkeypatch, capsys):
    """`score` without --n-steps: the steps that fit the budget, said on stderr, and the
    table computed at those steps; with --n-steps: those, and nothing said of a plan."""
    from tests.cli.test_cli import DATA, LAYER, MODEL

    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    common = ["score", "--model", MODEL, "--data", DATA, "--layer", LAYER, "--method",
              "integrated_gradients", "--clusters", "none", "--out", "-"]
    code = cli.main(list(map(str, common)))
    fitted = capsys.readouterr()
    assert code == 0, fitted.err
    assert "integrated_gradients at 8 steps, " in fitted.err and \
        f"({DEFAULT_N_STEPS} steps: " in fitted.err and "(--n-steps)" in fitted.err
    assert cli.main(list(map(str, common + ["--n-steps", "8"]))) == 0
    given = capsys.readouterr()
    assert "as many as fit" not in given.err
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(fitted.out)),
                                  pd.read_csv(io.StringIO(given.out)))


def test_steps_in_reads_a_count_a_plan_or_the_default():
    plan = path_steps.StepsPlan("integrated_gradients", 8, 32, 1.0, 4.0, 0.0, 10)
    given = {"fc1/integrated_gradients": plan, "fc2/integrated_gradients": 16}
    assert path_steps.steps_in(12, "anything") == 12
    assert path_steps.steps_in(given, "fc1/integrated_gradients") == 8
    assert path_steps.steps_in(given, "fc2/integrated_gradients") == 16
    assert path_steps.steps_in(given, "fc2/conductance") == DEFAULT_N_STEPS


def test_every_layer_is_planned_for_each_path_method_it_takes(monkeypatch):
    """One plan per (layer, path method): none for a method without steps, none where the
    method refuses the layer (conductance on token ids: the analysis says why), each that
    layer's own `plan_steps`, and the reduced ones said in one sentence."""
    model, x, y = build("residual_mlp")
    layers = [info.spec for info in at.list_layers(model, x[:2])]
    plans = path_steps.plan_layer_steps(model, x, y, methods=[
        "gradient", "integrated_gradients", "conductance"], budget=60.0)
    assert list(plans) == [f"{layer}/{method}" for layer in layers
                           for method in ("integrated_gradients", "conductance")]
    assert all(plan.n_steps == DEFAULT_N_STEPS and not plan.reduced for plan in plans.values())
    assert path_steps.layer_steps_words(plans) == ""
    tight = path_steps.plan_layer_steps(model, x, y, layers=layers[:2], budget=1e-9,
                                        methods=["integrated_gradients"])
    assert [plan.n_steps for plan in tight.values()] == [path_steps.FEWEST_STEPS] * 2
    assert path_steps.layer_steps_words(tight, str.upper) == (
        f"INTEGRATED_GRADIENTS at 8 steps on {layers[0]} and 8 on {layers[1]}: as many as fit "
        f"in 0 s on each layer ({DEFAULT_N_STEPS} asked)")
    from tests.support.models import TokenNet
    tokens = TokenNet().eval()
    ids = torch.randint(0, 20, (16, 5))
    planned = path_steps.plan_layer_steps(tokens, ids, None, layers=["fc1"], methods=[
        "integrated_gradients", "conductance"])
    assert list(planned) == ["fc1/integrated_gradients"]


def test_plans_already_made_are_kept_not_timed_again(monkeypatch):
    """`known` plans of the same steps and budget stand for their layer and method (the
    view layer's, planned for its scores); one made under other steps or budget does not."""
    model, x, y = build("residual_mlp")
    layers = [info.spec for info in at.list_layers(model, x[:2])][:2]
    timed = []
    real = path_steps.plan_steps
    monkeypatch.setattr(path_steps, "plan_steps", lambda m, layer, *a, **k: (
        timed.append(layer), real(m, layer, *a, **k))[1])
    mine = path_steps.StepsPlan("integrated_gradients", 8, DEFAULT_N_STEPS, 1.0, 4.0, 0.0,
                                len(x), path_steps.PATH_SECONDS)
    key = f"{layers[0]}/integrated_gradients"
    plans = path_steps.plan_layer_steps(model, x, y, layers=layers, known={key: mine},
                                        methods=["integrated_gradients"])
    assert plans[key] is mine and timed == [layers[1]]
    timed.clear()
    again = path_steps.plan_layer_steps(model, x, y, layers=layers, known={key: mine},
                                        methods=["integrated_gradients"], budget=60.0)
    assert again[key] is not mine and timed == layers


def test_a_plan_at_its_steps_asked_takes_them_and_says_their_time():
    """`at_steps_asked`: the user's choice of every step asked, at the time they were said
    to take, no longer reduced (so no "as many as fit" clause)."""
    plan = path_steps.StepsPlan("conductance", 8, 32, 7.5, 30.0, 0.25, 100, 5.0)
    asked = plan.at_steps_asked()
    assert (asked.n_steps, asked.seconds, asked.reduced) == (32, 30.0, False)
    assert "as many as fit" not in asked.words() and "at 32 steps, about 30 s" in asked.words()
    assert path_steps.layer_steps_words({"fc1/conductance": asked}) == ""


def test_the_scorecard_command_fits_each_layers_steps_and_says_so(monkeypatch, capsys,
                                                                   tmp_path):
    """`scorecard` without --n-steps: each layer's path steps fit the budget, said on
    stderr and in the table's n_steps column; with --n-steps: those everywhere."""
    from tests.cli.test_cli import DATA, MODEL

    monkeypatch.setattr(path_steps, "PATH_SECONDS", 1e-9)
    common = ["scorecard", "--model", MODEL, "--data", DATA, "--methods", "gradient",
              "integrated_gradients", "--n-boot", "20", "--n-random", "2", "--quiet"]
    assert cli.main(list(map(str, common[:-1] + ["--out", tmp_path / "fitted.csv"]))) == 0
    said = capsys.readouterr().err
    assert "integrated_gradients at 8 steps on " in said and "(--n-steps)" in said
    fitted = pd.read_csv(tmp_path / "fitted.csv")
    assert set(fitted.loc[fitted["method"] == "integrated_gradients", "n_steps"]) == {8}
    assert fitted.loc[fitted["method"] == "gradient", "n_steps"].isna().all()
    assert cli.main(list(map(str, common + ["--n-steps", "16", "--out",
                                            tmp_path / "given.csv"]))) == 0
    given = pd.read_csv(tmp_path / "given.csv")
    assert set(given.loc[given["method"] == "integrated_gradients", "n_steps"]) == {16}
