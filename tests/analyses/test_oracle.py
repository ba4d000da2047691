"""Agreement with the exact single-neuron ablation oracle."""
import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

import attribution as at
from attribution.analyses.oracle import ORACLE_COLUMNS
from attribution.analyses.settings import DEFAULT_N_STEPS
from attribution.analyses.oracle_sample import Resamples, agreement_draws
from attribution.analyses.ranks import bootstrap_counts

from tests.support.models import build, build_model


def reversed_importance_net():
    """Activations rise 1..6 across neurons while their effect on logit 0 falls 1/z: 1 .. 1/6."""
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.copy_(torch.arange(1.0, 7.0))
        model[2].weight.copy_(torch.stack([1 / torch.arange(1.0, 7.0) ** 2, torch.zeros(6)]))
        model[2].bias.zero_()
    return model.eval()


def test_literal_case_activation_is_the_oracle_reversed():
    model = reversed_importance_net()
    x, y = torch.randn(10, 3), torch.zeros(10, dtype=torch.long)
    table = at.oracle_agreement(model, "1", x, y, methods=["activation", "ablation"], top_k=1)
    activation = table.set_index("method").loc["activation"]
    assert activation["spearman_signed"] == pytest.approx(-1.0)
    assert activation["kendall_signed"] == pytest.approx(-1.0)
    assert activation["spearman_abs"] == pytest.approx(-1.0)
    assert activation["top_k_overlap_signed"] == 0.0  # neuron 5 against neuron 0
    oracle_row = table.set_index("method").loc["ablation"]
    for column in ("spearman_signed", "spearman_abs", "kendall_signed", "kendall_abs",
                   "top_k_overlap_signed", "top_k_overlap_abs"):
        assert oracle_row[column] == pytest.approx(1.0)


def test_table_layout_per_cluster_and_method_in_the_order_given():
    model, x, y = build("residual_mlp")
    clusters = np.array(["b", "a"] * 20)
    methods = ["random", "gradient", "ablation"]
    table = at.oracle_agreement(model, "fc2", x, y, methods=methods, clusters=clusters)
    assert list(table.columns) == list(ORACLE_COLUMNS)
    assert table["cluster"].tolist() == ["a"] * 3 + ["b"] * 3
    assert table["method"].tolist() == methods * 2
    assert table["n"].tolist() == [20] * 6
    assert table["top_k"].tolist() == [2] * 6  # 10% of 16 neurons, rounded up


@pytest.mark.parametrize("reduce", ["mean", "mean_abs"])
def test_values_equal_scipy_on_the_cluster_score_tables(reduce):
    model, x, y = build("branching")
    clusters = np.arange(40) % 3
    table = at.oracle_agreement(model, "right.0", x, y, methods=["gradient", "conductance"],
                                clusters=clusters, reduce=reduce, top_k=3)
    oracle = at.cluster_scores(model, "right.0", x, y, clusters, "ablation").drop(columns="n")
    for method in ("gradient", "conductance"):
        scores = at.cluster_scores(model, "right.0", x, y, clusters, method,
                                   reduce=reduce).drop(columns="n")
        for cluster in range(3):
            row = table[(table["method"] == method) & (table["cluster"] == cluster)].iloc[0]
            a, b = scores.loc[cluster].to_numpy(), oracle.loc[cluster].to_numpy()
            assert row["spearman_signed"] == pytest.approx(stats.spearmanr(a, b).statistic)
            assert row["kendall_abs"] == pytest.approx(
                stats.kendalltau(np.abs(a), np.abs(b)).statistic)
            top = set(np.argsort(-np.abs(a))[:3]) & set(np.argsort(-np.abs(b))[:3])
            assert row["top_k_overlap_abs"] == pytest.approx(len(top) / 3)


def test_gradient_x_activation_is_exact_when_the_rest_of_the_network_is_linear():
    model, x, y = build("residual_mlp")  # the output Linear reads act2(fc2) + h
    table = at.oracle_agreement(model, "act2", x, y,
                                methods=["gradient_x_activation", "random"])
    taylor = table.set_index("method").loc["gradient_x_activation"]
    assert taylor["spearman_signed"] == pytest.approx(1.0)
    assert taylor["top_k_overlap_signed"] == 1.0
    assert table["cluster"].tolist() == ["all", "all"]


def test_constant_rankings_give_nan_not_a_number_that_looks_meaningful():
    scores, effects = np.tile(np.arange(5.0), (4, 1)), np.zeros((4, 5))
    resamples = Resamples(effects, 5, bootstrap_counts(4, 20, np.random.default_rng(0)),
                          np.random.default_rng(1))
    result = agreement_draws(scores, resamples, "mean", top_k=2)
    assert np.isnan(result["spearman", "signed"].value)
    assert np.isnan(result["kendall", "abs"].value)
    assert np.isnan(result["spearman", "signed"].interval()).all()


def test_progress_streams_the_table_and_a_raising_one_leaves_the_model_untouched():
    model, x, y = build("residual_mlp")
    updates = []
    table = at.oracle_agreement(model, "fc2", x, y, methods=["gradient", "activation"],
                                progress=lambda fraction, part: updates.append((fraction,
                                                                                len(part))))
    fractions = [fraction for fraction, _ in updates]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert updates[-1][1] == len(table) == 2

    class Stop(Exception):
        pass

    def stop(fraction, part):
        raise Stop

    model.train()
    with pytest.raises(Stop):
        at.oracle_agreement(model, "fc2", x, y, progress=stop)
    assert all(module.training for module in model.modules())
    assert all(not module._forward_hooks for module in model.modules())


@pytest.mark.parametrize("change,match", [
    (dict(methods=["saliency"]), "Unknown method"),
    (dict(methods=[]), "at least one"),
    (dict(reduce="median"), "reduce"),
    (dict(targets="all"), "one target logit"),
    (dict(top_k=17), "1..16"),
])
def test_user_mistakes_raise_one_actionable_error(change, match):
    model, x, y = build("residual_mlp")
    arguments = dict(targets=y, methods=["gradient"])
    arguments.update(change)
    targets = arguments.pop("targets")
    with pytest.raises(at.AttributionError, match=match):
        at.oracle_agreement(model, "fc2", x, targets, **arguments)


def test_every_method_leaves_out_those_that_refuse_the_model_and_says_why():
    model, x, y = build_model("resnet", n=6)  # deeplift: a block's ReLU runs twice
    table = at.oracle_agreement(model, "layer1.0.conv1", x, y)
    assert "deeplift" not in set(table["method"]) and "gradient" in set(table["method"])
    assert "runs more than once" in table.attrs["refused"]["deeplift"]
    with pytest.raises(at.AttributionError, match="runs more than once"):  # asked for by name
        at.oracle_agreement(model, "layer1.0.conv1", x, y, methods=["gradient", "deeplift"])


def test_each_path_method_takes_the_steps_it_is_given():
    """n_steps as {method: steps}: a method's rows are those of a table at its steps; a
    path method it leaves out takes the default steps."""
    model, x, y = build("residual_mlp")
    clusters = np.array(["b", "a"] * 20)
    methods = ["gradient", "integrated_gradients", "conductance"]

    def table(n_steps):
        return at.oracle_agreement(model, "fc2", x, y, methods=methods, clusters=clusters,
                                   n_steps=n_steps).set_index(["cluster", "method"])

    mixed = table({"integrated_gradients": 2})
    fewer, default = table(2), table(DEFAULT_N_STEPS)
    ig, conductance = (mixed.index.get_level_values("method") == m
                       for m in ("integrated_gradients", "conductance"))
    assert mixed[ig].equals(fewer[ig]) and mixed[~ig].equals(default[~ig])
    assert not fewer[ig | conductance].equals(default[ig | conductance])  # steps tell
