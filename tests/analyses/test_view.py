"""The view (`attribution.analyses.view`): the analyses take one View, and the flat functions
of the notebooks are thin wrappers that pass every argument into it."""
import dataclasses
import inspect

import numpy as np
import pytest
import torch

import attribution as at
from attribution.analyses.view import (View, curve_cost_on, pruned_model_file_on,
                                      pruning_curves_on)
from tests.support.diagnosis import HandSetNet, data


def _view(**settings):
    model, (x, y) = HandSetNet().eval(), data()
    return View.of(model, "fc", x, y, y.numpy() % 2, **settings)


def _values(findings):
    return [(f.code, f.severity, f.value, f.low, f.high, f.message) for f in findings]


def test_the_flat_diagnose_is_the_view_of_its_arguments():
    """Every setting the flat function takes reaches the analysis: the same findings from
    `diagnose` and from `diagnose_on` of a view holding those settings, and different
    findings where one setting differs."""
    options = dict(method="gradient", reduce="mean_abs", cluster=1, n_random=5, seed=3,
                   batch_size=7)
    view = _view(**options)
    flat = at.diagnose(view.model, "fc", view.inputs, view.targets, clusters=view.clusters,
                       **options)
    assert _values(at.diagnose_on(view)) == _values(flat)
    assert _values(at.diagnose_on(view.with_settings(reduce="mean"))) != _values(flat)


def test_a_plan_made_on_the_view_is_the_one_its_estimate_and_its_run_keep():
    view = _view(method="gradient", cluster=0)
    plan = at.diagnose_plan_on(view, oracle_neurons=3)
    assert plan.oracle.neurons == 3
    cost = at.diagnose_cost_on(view, plan=plan)
    assert cost.seconds > 0
    findings = {f.code: f for f in at.diagnose_on(view, plan=plan)}
    assert "on 3 of" in findings["disagrees_with_ablation"].message
    with pytest.raises(at.AttributionError, match="not both"):
        at.diagnose_on(view, plan=plan, oracle_neurons=3)


def test_the_flat_estimate_takes_every_option_the_analysis_takes():
    """`diagnose_cost` passes every keyword of `diagnose_on` but the view on to the
    analysis (progress, the plan...), and the rest into the view."""
    view = _view(method="gradient")
    options = {name: parameter.default for name, parameter in
               inspect.signature(at.diagnose_on).parameters.items() if name != "view"}
    options.update(progress=lambda *_: None, metric="accuracy", oracle_neurons=2)
    cost = at.diagnose_cost(view.model, "fc", view.inputs, view.targets, "gradient",
                            view.clusters, seed=4, **options)
    assert cost.seconds > 0


def test_a_view_reads_its_settings_and_refuses_what_is_not_one():
    view = _view(method="integrated_gradients", reduce="mean_abs")
    assert view.layer == "fc" and view.settings.reduce == "mean_abs"
    assert view.steps() == 32 and view.steps("gradient") == 32
    assert dataclasses.replace(view, n_steps={"integrated_gradients": 8}).steps() == 8
    assert view.with_settings(cluster=1).settings.cluster == 1
    assert view.settings.cluster is None  # frozen: the original is unchanged
    with pytest.raises(TypeError):
        _view(n_stepz=8)
    with pytest.raises(at.AttributionError, match="reduce"):
        _view(reduce="median")


def test_the_view_leaves_the_model_as_found():
    view = _view(method="gradient")
    before = {name: value.clone() for name, value in view.model.state_dict().items()}
    at.diagnose_on(view)
    assert view.placed() is view.model  # no device asked: the model where it is
    assert all(torch.equal(before[name], value)
               for name, value in view.model.state_dict().items())
    assert not view.model.training and np.ndim(view.clusters) == 1


def test_the_flat_oracle_agreement_is_the_view_of_its_arguments():
    options = dict(cluster=1, reduce="mean_abs", seed=2, batch_size=5, n_steps=4)
    view = _view(**options)
    methods = ["gradient", "integrated_gradients", "ablation"]
    flat = at.oracle_agreement(view.model, "fc", view.inputs, view.targets, methods,
                               view.clusters, top_k=2, **options)
    on_view = at.oracle_agreement_on(view, methods, top_k=2)
    assert on_view.equals(flat) and list(on_view["cluster"].unique()) == [1]
    assert not at.oracle_agreement_on(view.with_settings(reduce="mean"), methods,
                                      top_k=2).equals(flat)


def test_the_flat_scorecard_and_its_estimate_are_the_view_of_their_arguments():
    """Batch size, steps and seed reach the scorecard through the view; a different seed
    draws a different card."""
    view = dataclasses.replace(_view(seed=4, batch_size=9), n_steps=4)
    card = dict(methods=["gradient", "integrated_gradients", "ablation"], n_boot=20,
                n_random=2, curve_points=2)
    flat = at.scorecard(view.model, view.inputs, view.targets, view.clusters, seed=4,
                        batch_size=9, n_steps=4, **card)
    on_view = at.scorecard_on(view, **card)
    assert on_view.equals(flat) and set(on_view["n_steps"].dropna()) == {4}
    assert not at.scorecard_on(view.with_settings(seed=5), **card).equals(flat)
    plans = at.scorecard_oracle_plans_on(view)
    assert at.scorecard_cost_on(view, oracle_neurons=plans, **card).seconds > 0


def test_the_views_pruning_curves_are_the_flat_curves_of_its_settings():
    """The view's cluster against the rest, measured by its metric against its labels (or
    the targets scored), with its random orders and seed; a plan's share of the samples
    draws them from each subset."""
    view = _view(method="gradient", cluster=1, n_random=3, seed=2, metric="accuracy")
    view = dataclasses.replace(view, labels=view.targets, targets=None)
    ranking = np.arange(view.model.fc.out_features, dtype=float)
    ks = view.settings.curve_ks(len(ranking))
    flat = at.cluster_pruning_curves(view.model, "fc", view.inputs, view.labels, view.clusters,
                                     1, ranking, ks=ks, n_random=3, seed=2, metric="accuracy")
    assert pruning_curves_on(view, ranking).equals(flat)
    logit = view.with_settings(metric="target_logit")
    assert logit.curve_targets is None  # the predicted class's logit: no targets scored
    assert not pruning_curves_on(logit, ranking).equals(flat)
    assert curve_cost_on(view).seconds > 0


def test_the_views_pruned_model_measures_its_curves_bottom_point(tmp_path):
    """The k lowest-ranked neurons removed, as the curves remove them: the file's target
    logit on each subset is the curves' "bottom" point at k, and differs from k = 0."""
    view = _view(method="gradient", cluster=1, n_random=1, metric="target_logit")
    ranking = np.linspace(1.0, 0.0, view.model.fc.out_features)
    curves = pruning_curves_on(view, ranking)
    path = tmp_path / "pruned.pt2"
    path.write_bytes(pruned_model_file_on(view, ranking, 3))
    pruned = at.load_model(path, sandbox=False).module
    ones = torch.from_numpy(view.clusters == 1)
    for subset, rows in (("cluster", ones), ("rest", ~ones)):
        measured = at.model_metric(pruned, view.inputs[rows], view.targets[rows],
                                   metric="target_logit")
        points = curves[curves["subset"] == subset].set_index("k")["bottom"]
        assert measured == pytest.approx(points[3], abs=1e-5) and points[3] != points[0]
