"""`probe` (NeuroX's linear probe, Dalvi et al. 2019) against scikit-learn: activations taken
by an independent forward hook and pooled per neuron as `activation` pools them (mean over a
conv channel's positions, over a sequence's tokens), standardised on the training samples,
and fitted by LogisticRegression with the same elastic-net penalty; neuron j's score for
cluster c is |W_cj|, the same weights to solver tolerance, so the same ranking."""
import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from torch import nn

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution.analyses import distributed
from attribution.methods.probe import L1, L2, fit_logistic, held_out_rows

from tests.support.models import SequenceNet, TokenNet, build, exported


def hooked_activations(model: nn.Module, layer: str, x, neuron_axis: int = 1) -> np.ndarray:
    """[N, n]: the layer's output, averaged over every axis after the neurons' (positions)."""
    seen = []
    handle = dict(model.named_modules())[layer].register_forward_hook(
        lambda module, args, output: seen.append(output.detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    z = seen[0].movedim(neuron_axis, 1)
    return (z.flatten(2).mean(-1) if z.dim() > 2 else z).double().numpy()


def sklearn_probe(activations: np.ndarray, clusters: np.ndarray, seed: int = 0):
    """(|W| [G, n], held-out accuracy) of scikit-learn's probe on the same split."""
    ids, codes = np.unique(clusters, return_inverse=True)
    held = held_out_rows(codes, seed)
    train = activations[~held]
    mean, scale = train.mean(0), train.std(0)
    scale[scale <= 1e-12] = 1.0
    strength = L1 + 2 * L2
    fitted = LogisticRegression(l1_ratio=L1 / strength, C=1 / (len(train) * strength),
                                solver="saga", tol=1e-10, max_iter=200_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # versions differ on how the penalty is named
        fitted.fit((train - mean) / scale, codes[~held])
    accuracy = (fitted.predict((activations[held] - mean) / scale) == codes[held]).mean()
    return np.abs(fitted.coef_), accuracy


def assert_same_probe(scores: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(scores, expected, atol=2e-5 * max(1.0, expected.max()))
    for row, reference in zip(scores, expected):  # the same neurons, in the same order
        clear = np.abs(reference - np.median(reference)) > 1e-3  # ties within tolerance aside
        strongest = np.argsort(-reference)[:3]
        assert list(np.argsort(-row)[:3][clear[strongest]]) == \
            list(strongest[clear[strongest]])


def demo():
    loaded, data = at.load_demo("digits_mlp")
    return loaded.module, data.inputs, data.labels


@pytest.mark.parametrize("layer", ["fc1", "relu2"])
def test_the_probe_is_scikit_learns_logistic_regression_on_the_pooled_activations(layer):
    model, x, labels = demo()
    clusters = labels.numpy()
    expected, accuracy = sklearn_probe(hooked_activations(model, layer, x), clusters)
    table = at.cluster_scores(model, layer, x, labels, clusters, "probe")
    assert_same_probe(table.drop(columns="n").to_numpy(), expected)
    probe = at.probe(model, layer, x, clusters)
    assert probe.accuracy == pytest.approx(accuracy) and probe.accuracy > 0.8
    assert table.attrs["method_note"] == probe.note and table.attrs["method_usable"]
    assert f"{probe.accuracy:.1%} held-out accuracy" in probe.note


@pytest.mark.parametrize("arch,layer", [("residual_conv", "conv2"), ("residual_mlp", "bn"),
                                        ("branching", "left.0")])
def test_conv_channels_and_other_layers_are_probed_on_their_pooled_activations(arch, layer):
    model, x, _ = build(arch)
    x = torch.cat([x, x + 0.1 * torch.randn_like(x)])
    clusters = np.arange(len(x)) % 3
    expected, _ = sklearn_probe(hooked_activations(model, layer, x), clusters)
    table = at.cluster_scores(model, layer, x, None, clusters, "probe")
    assert_same_probe(table.drop(columns="n").to_numpy(), expected)


def test_sequences_token_ids_and_exported_programs_are_probed(tmp_path):
    torch.manual_seed(0)
    sequence, x = SequenceNet().eval(), torch.randn(60, 9, 3)
    clusters = np.array(["down", "flat", "up"])[np.digitize(x[:, :, 0].mean(1), [-0.2, 0.2])]
    expected, _ = sklearn_probe(hooked_activations(sequence, "proj", x, neuron_axis=2),
                                clusters)
    table = at.cluster_scores(sequence, "proj", x, None, clusters, "probe")
    assert_same_probe(table.drop(columns="n").to_numpy(), expected)

    tokens, ids = TokenNet().eval(), torch.randint(0, 20, (60, 5))
    clusters = (ids[:, 0] % 3).numpy()
    expected, _ = sklearn_probe(hooked_activations(tokens, "fc1", ids), clusters)
    assert_same_probe(at.cluster_scores(tokens, "fc1", ids, None, clusters, "probe")
                      .drop(columns="n").to_numpy(), expected)

    model, x, y = build("residual_conv")
    program = exported(model, x, tmp_path / "conv.pt2")
    clusters = y.numpy()
    torch.testing.assert_close(
        at.neuron_scores(program, "conv2", x, y, "probe", clusters=clusters),
        at.neuron_scores(model, "conv2", x, y, "probe", clusters=clusters))


def test_a_samples_score_is_its_clusters_and_every_path_agrees():
    model, x, labels = demo()
    clusters = labels.numpy()
    probe = at.probe(model, "relu2", x, clusters, batch_size=100)
    per_sample = at.neuron_scores(model, "relu2", x, labels, "probe", clusters=clusters,
                                  batch_size=64)
    torch.testing.assert_close(per_sample, probe.scores.float()[torch.from_numpy(clusters)])
    for reduce in ("mean", "mean_abs"):
        table = at.cluster_scores(model, "relu2", x, labels, clusters, "probe", reduce=reduce)
        np.testing.assert_allclose(table.drop(columns="n").to_numpy(), probe.scores.numpy(),
                                   rtol=1e-6, atol=1e-7)
    sharded = distributed.cluster_scores(model, "relu2", x, labels, clusters, "probe")
    np.testing.assert_allclose(sharded.drop(columns="n").to_numpy(), probe.scores.numpy(),
                               rtol=1e-6, atol=1e-7)
    again = at.probe(model, "relu2", x, clusters)  # deterministic, batch size aside
    assert torch.equal(again.weights, probe.weights) and again.accuracy == probe.accuracy
    dead = np.flatnonzero(hooked_activations(model, "relu2", x).max(0) == 0)
    assert len(dead) and (probe.scores.numpy()[:, dead] == 0).all()  # dead units score 0


def test_two_clusters_share_one_row_of_scores():
    """With two clusters the probe stays multinomial: the penalty is symmetric, so the optimum
    has W_1 = -W_0 and both clusters' scores are the same neurons' |W|."""
    model, x, labels = demo()
    clusters = np.where(labels.numpy() < 5, "low", "high")
    table = at.cluster_scores(model, "relu2", x, labels, clusters, "probe")
    np.testing.assert_allclose(table.loc["low"].drop("n"), table.loc["high"].drop("n"),
                               atol=1e-6)


def test_the_probe_reports_a_layer_that_cannot_tell_the_clusters_apart():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every unit dead: nothing to predict from
    x, clusters = torch.randn(50, 4), np.arange(50) % 2
    probe = at.probe(model, "1", x, clusters)
    assert not probe.usable and (probe.scores == 0).all()
    assert "not significantly better than chance (p >= 0.05), so its weights rank nothing" \
        in probe.note
    facts = ScoreFacts()
    at.neuron_scores(model, "1", x, None, "probe", clusters=clusters, facts=facts)
    assert facts.fit.usable is False and facts.fit.note == probe.note


def test_the_probe_refuses_without_clusters_with_one_cluster_and_for_every_class():
    model, x, labels = demo()
    with pytest.raises(at.AttributionError, match="needs them: pass clusters="):
        at.neuron_scores(model, "relu2", x, labels, "probe")
    with pytest.raises(at.AttributionError, match="these samples form one cluster"):
        at.cluster_scores(model, "relu2", x, labels, np.zeros(len(x)), "probe")
    with pytest.raises(at.AttributionError, match="targets='all' has no meaning"):
        at.neuron_scores(model, "relu2", x, "all", "probe", clusters=labels.numpy())


def test_the_solver_reaches_the_penalised_optimum():
    """The FISTA solution is a minimum: its objective is not beaten by small moves of any
    weight (the elastic-net objective is strictly convex)."""
    generator = np.random.default_rng(0)
    features = generator.standard_normal((200, 5))
    codes = (features[:, 0] + 0.5 * generator.standard_normal(200) > 0).astype(int) + \
        (features[:, 1] > 1).astype(int)
    weights, intercept, _, converged = fit_logistic(features, codes, 3)
    assert converged

    def objective(w, b):
        logits = features @ w.T + b
        logits = logits - logits.max(1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        return -log_p[np.arange(200), codes].mean() + L1 * np.abs(w).sum() + L2 * (w ** 2).sum()

    best = objective(weights, intercept)
    for _ in range(200):
        nudge = 1e-3 * generator.standard_normal(weights.shape)
        assert objective(weights + nudge, intercept) >= best - 1e-12
    assert (weights[:, 2:] == 0).mean() > 0.3  # the L1 part zeroes uninformative weights


def test_a_sample_whose_activations_are_not_finite_is_left_out_and_scored_nan():
    model, x, labels = build("residual_mlp")
    x = x.repeat(3, 1)
    x[5] = float("inf")
    clusters = np.arange(len(x)) % 3
    scores = at.neuron_scores(model, "fc2", x, None, "probe", clusters=clusters)
    assert scores[5].isnan().all() and torch.isfinite(scores[torch.arange(len(x)) != 5]).all()
    kept = torch.arange(len(x)) != 5
    expected = at.probe(model, "fc2", x[kept], clusters[kept.numpy()])
    probe = at.probe(model, "fc2", x, clusters)
    assert "1 sample(s) whose activations are not finite were left out" in probe.note
    torch.testing.assert_close(probe.weights, expected.weights)


def test_data_streamed_from_disk_or_a_dataloader_is_probed_alike(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    model, x, labels = demo()
    clusters = labels.numpy()
    expected = at.cluster_scores(model, "relu2", x, labels, clusters, "probe")
    np.save(tmp_path / "x.npy", x.numpy())
    streamed = at.cluster_scores(model, "relu2", at.NpyRows(tmp_path / "x.npy", batch_size=100),
                                 labels, clusters, "probe")
    loader = DataLoader(TensorDataset(x, labels), batch_size=64)
    batched = at.cluster_scores(model, "relu2", loader, "labels", clusters, "probe")
    for table in (streamed, batched):
        np.testing.assert_array_equal(table.to_numpy(), expected.to_numpy())


def test_a_probe_is_usable_only_when_a_binomial_test_says_it_beats_the_majority():
    """A held-out accuracy a hair above the majority baseline on a few dozen samples is
    chance: usable only where the one-sided exact binomial test gives p < 0.05."""
    model, x, labels = demo()
    fitted = at.probe(model, "relu2", x, labels.numpy())
    assert fitted.usable and fitted.p_value < 1e-12 and "binomial test p = " in fitted.note

    def tail(correct, n, chance):  # P(Binomial(n, chance) >= correct), summed exactly
        return sum(math.comb(n, i) * chance ** i * (1 - chance) ** (n - i)
                   for i in range(correct, n + 1))

    for accuracy, n_test, chance, usable in ((22 / 40, 40, 0.5, False),
                                             (30 / 40, 40, 0.5, True),
                                             (13 / 30, 30, 0.3, False),
                                             (15 / 30, 30, 0.3, True)):
        probe = replace(fitted, accuracy=accuracy, n_test=n_test, chance=chance)
        assert probe.p_value == pytest.approx(tail(round(accuracy * n_test), n_test, chance),
                                              rel=1e-9)
        assert probe.usable is usable, (accuracy, n_test, chance, probe.p_value)
        assert ("not significantly better than chance" in probe.note) is not usable
    assert np.isnan(replace(fitted, n_test=0, accuracy=float("nan")).p_value)
