"""`probe`: the neurons that encode the clusters, found as NeuroX finds them (Dalvi et al.
2019, "What is one grain of sand in the desert?").

A multinomial logistic regression with an elastic-net penalty is fitted to the layer's
activations (pooled per neuron as `activation` pools them, standardised per neuron on the
training samples) to predict each sample's cluster; neuron j's score for cluster c is |W_cj|,
and a sample's score is its cluster's. It answers "which neurons encode this cluster", beside
the other methods' "which neurons does the output use". A probe that cannot predict the
clusters ranks nothing, so its held-out accuracy comes with it (`Probe.note`).

Fixed seed, deterministic: a stratified split (HELD_OUT of each cluster held out), then
accelerated proximal gradient descent (FISTA with restarts and a backtracking step, float64)
to the optimum of

    mean_i CE(W a_i + b, c_i) + L1 * sum|W| + L2 * sum W^2        (NeuroX's defaults)

which is scikit-learn's LogisticRegression(l1_ratio=L1 / (L1 + 2 L2),
C=1 / (n_train (L1 + 2 L2))) with the elastic-net penalty for three or more clusters; the tests
compare the two. Two clusters stay multinomial (scikit-learn fits one vector there): the
penalty is symmetric, so W_1 = -W_0 and both clusters rank the neurons alike.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_SEED
from ..errors import AttributionError
from .registry import Batch, register

L1 = 1e-3
L2 = 1e-3
HELD_OUT = 0.2
PROBE_ALPHA = 0.05
"""A probe is usable when its held-out accuracy beats the majority baseline at this level."""
MAX_ITERATIONS = 20_000
TOLERANCE = 1e-9
"""Stop when the largest entry of the proximal gradient step (in gradient units) is below."""


@dataclass(frozen=True)
class Probe:
    """A probe fitted to one layer's activations.

    Attributes:
        weights: float64 [G, n], one row per cluster, on standardised activations.
        intercept: float64 [G].
        mean, scale: float64 [n], the standardisation (scale 1 where a neuron is constant).
        ids: the G cluster ids, in the order of the rows.
        accuracy: held-out accuracy (NaN when no sample could be held out).
        chance: held-out share of the cluster most common among the training samples.
        n_train, n_test: samples fitted and held out.
        iterations: solver iterations; converged: whether TOLERANCE was reached.
        left_out: bool [N], the samples whose activations are not finite: left out of the
            fit, and scored NaN (as the engine scores a sample whose logits are not finite).
    """

    weights: torch.Tensor
    intercept: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor
    ids: pd.Index
    accuracy: float
    chance: float
    n_train: int
    n_test: int
    iterations: int
    converged: bool
    left_out: torch.Tensor

    @property
    def scores(self) -> torch.Tensor:
        """float64 [G, n]: |W|, neuron j's score for cluster c."""
        return self.weights.abs()

    def predict(self, activations: torch.Tensor) -> torch.Tensor:
        """Cluster indices (into `ids`) [N] of pooled activations [N, n]."""
        standard = (activations.double() - self.mean) / self.scale
        return (standard @ self.weights.T + self.intercept).argmax(1)

    @property
    def p_value(self) -> float:
        """The one-sided exact binomial test of its held-out accuracy against always naming
        the commonest training cluster (H0: its chance of a right answer is at most
        `chance`); NaN with nothing held out."""
        if self.n_test == 0 or not np.isfinite(self.accuracy):
            return float("nan")
        from scipy.stats import binomtest  # only a probe's note needs scipy's tests

        correct = int(round(self.accuracy * self.n_test))
        return float(binomtest(correct, self.n_test, min(max(self.chance, 0.0), 1.0),
                               alternative="greater").pvalue)

    @property
    def usable(self) -> bool:
        """Does it predict the held-out clusters better than always naming the commonest,
        by that test at level PROBE_ALPHA? (Else its weights rank nothing.)"""
        return bool(self.p_value < PROBE_ALPHA)

    @property
    def note(self) -> str:
        """One sentence on how well the probe predicts the clusters."""
        clusters = f"{len(self.ids)} clusters"
        if self.n_test == 0:
            return (f"The probe could hold no sample out to test on (each of the {clusters} "
                    "has one sample), so nothing says its weights rank anything.")
        said = (f"A linear probe predicts the {clusters} from this layer at "
                f"{self.accuracy:.1%} held-out accuracy ({self.n_test} samples; always "
                f"naming the commonest cluster: {self.chance:.1%}; binomial test p = "
                f"{self.p_value:.2g})")
        if not self.usable:
            said += (": not significantly better than chance (p >= "
                     f"{PROBE_ALPHA:g}), so its weights rank nothing")
        if not self.converged:
            said += f"; its solver stopped after {self.iterations} iterations short of the optimum"
        if self.left_out.any():
            said += (f"; {int(self.left_out.sum())} sample(s) whose activations are not finite "
                     "were left out (their scores are NaN)")
        return said + "."


def held_out_rows(codes: np.ndarray, seed: int, share: float = HELD_OUT) -> np.ndarray:
    """bool [N]: the samples held out, round(share * size) of each cluster (never all of
    one), drawn with `seed`."""
    generator = np.random.default_rng(seed)
    held = np.zeros(len(codes), dtype=bool)
    for code in np.unique(codes):
        rows = np.flatnonzero(codes == code)
        n_held = min(int(round(share * len(rows))), len(rows) - 1)
        held[generator.permutation(rows)[:n_held]] = True
    return held


def _largest_singular_value_sq(matrix: torch.Tensor, iterations: int = 100) -> float:
    """An upper estimate of sigma_max(matrix)^2 by power iteration (10% margin)."""
    vector = torch.from_numpy(np.random.default_rng(0).random(matrix.shape[1]))
    value = 0.0
    for _ in range(iterations):
        image = matrix.T @ (matrix @ vector)
        value = float(torch.linalg.vector_norm(image))
        if value == 0:
            return 1.0
        vector = image / value
    return 1.1 * value


def fit_logistic(features: np.ndarray, codes: np.ndarray, n_classes: int, *,
                 l1: float = L1, l2: float = L2, max_iterations: int = MAX_ITERATIONS,
                 tolerance: float = TOLERANCE) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Multinomial logistic regression with the elastic-net penalty of the module docstring.

    FISTA with gradient restarts and a backtracking step: it starts at 8 / L (L the
    curvature bound of the smooth part, 0.5 sigma_max([X 1])^2 / n + 2 L2), grows 10% an
    iteration and halves until the step decreases the objective enough. Near the optimum
    the softmax's curvature is far below its bound, so the steps there are long: several
    times fewer iterations than the fixed step 1 / L. In torch (float64, on the CPU): its
    row-wise reductions over a few clusters are slower in NumPy.

    Args:
        features: float64 [N, n]; codes: int [N] in 0..n_classes-1.
    Returns:
        (weights [n_classes, n], intercept [n_classes], iterations, converged).
    """
    features = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float64))
    codes = torch.from_numpy(np.asarray(codes, dtype=np.int64))
    n, width = features.shape
    rows = torch.arange(n)

    def smooth(weights: torch.Tensor, intercept: torch.Tensor, gradient: bool = True):
        """The mean cross-entropy + L2 part, and its gradient in (weights, intercept)."""
        logits = torch.addmm(intercept, features, weights.T)
        logits -= logits.amax(1, keepdim=True)
        exp = logits.exp()
        total = exp.sum(1)
        value = float((total.log().sum() - logits[rows, codes].sum()) / n
                      + l2 * (weights * weights).sum())
        if not gradient:
            return value, None, None
        residual = exp  # the softmax minus the one-hot targets, over n
        residual /= total[:, None]
        residual[rows, codes] -= 1
        residual /= n
        return value, residual.T @ features + 2 * l2 * weights, residual.sum(0)

    with_ones = torch.cat([features, features.new_ones(n, 1)], 1)
    step = 8.0 / (0.5 * _largest_singular_value_sq(with_ones) / n + 2 * l2)
    weights = features.new_zeros(n_classes, width)
    intercept = features.new_zeros(n_classes)
    ahead_w, ahead_b, momentum = weights, intercept, 1.0
    for iteration in range(1, max_iterations + 1):
        value, gradient_w, gradient_b = smooth(ahead_w, ahead_b)
        while True:
            moved = ahead_w - step * gradient_w
            new_w = moved.sign() * (moved.abs() - step * l1).clamp_min(0)
            new_b = ahead_b - step * gradient_b
            delta_w, delta_b = new_w - ahead_w, new_b - ahead_b
            bound = value + float((gradient_w * delta_w).sum() + gradient_b @ delta_b + (
                (delta_w * delta_w).sum() + delta_b @ delta_b) / (2 * step))
            if smooth(new_w, new_b, gradient=False)[0] <= bound + 1e-15:
                break
            step *= 0.5
        if max(float(delta_w.abs().max()), float(delta_b.abs().max())) / step < tolerance:
            return new_w.numpy(), new_b.numpy(), iteration, True
        if float((delta_w * (new_w - weights)).sum() + delta_b @ (new_b - intercept)) < 0:
            momentum = 1.0  # the step turned back: restart the acceleration
        next_momentum = (1 + (1 + 4 * momentum * momentum) ** 0.5) / 2
        pull = (momentum - 1) / next_momentum
        ahead_w = new_w + pull * (new_w - weights)
        ahead_b = new_b + pull * (new_b - intercept)
        weights, intercept, momentum = new_w, new_b, next_momentum
        step *= 1.1
    return weights.numpy(), intercept.numpy(), max_iterations, False


def fit_probe(activations: torch.Tensor, codes: np.ndarray, ids: pd.Index, *,
              seed: int = DEFAULT_SEED) -> Probe:
    """The probe of pooled activations [N, n] for cluster indices `codes` [N] into `ids`.
    Samples whose activations are not finite are left out of the fit (`Probe.left_out`)."""
    activations = activations.detach().to("cpu", torch.float64)
    left_out = ~torch.isfinite(activations).all(1)
    rows = np.flatnonzero(~left_out.numpy())
    codes = np.asarray(codes, dtype=np.int64)[rows]
    if len(np.unique(codes)) < 2:
        raise AttributionError("probe: fewer than two clusters have samples with finite "
                               "activations at this layer, so there is nothing to tell apart.")
    activations = activations[torch.from_numpy(rows)]
    held = held_out_rows(codes, seed)
    train, test = activations[torch.from_numpy(~held)], activations[torch.from_numpy(held)]
    mean, scale = train.mean(0), train.std(0, unbiased=False)
    scale = torch.where(scale > 1e-12 * mean.abs().clamp_min(1), scale, torch.ones_like(scale))
    weights, intercept, iterations, converged = fit_logistic(
        ((train - mean) / scale).numpy(), codes[~held], len(ids))
    probe = Probe(torch.from_numpy(weights), torch.from_numpy(intercept), mean, scale, ids,
                  float("nan"), float("nan"), int((~held).sum()), int(held.sum()), iterations,
                  converged, left_out)
    if not held.any():
        return probe
    commonest = np.bincount(codes[~held], minlength=len(ids)).argmax()
    return replace(probe, accuracy=float((probe.predict(test).numpy() == codes[held]).mean()),
                   chance=float((codes[held] == commonest).mean()))


def probe(model: torch.nn.Module, layer, inputs, clusters, *,
          batch_size: int = DEFAULT_BATCH_SIZE, seed: int = DEFAULT_SEED,
          device=None) -> Probe:
    """Fit the probe of `layer` to `clusters` (one id per sample of `inputs`)."""
    from .scores import cluster_codes, fit_method, n_samples
    codes, ids = cluster_codes(clusters, n_samples(inputs))
    return fit_method("probe", model, layer, inputs, codes, ids, batch_size=batch_size,
                      seed=seed, device=device)


def _fit(model, layer, inputs, codes: np.ndarray, ids: pd.Index, *, batch_size: int,
         seed: int, device) -> Probe:
    from .scores import neuron_scores
    activations = neuron_scores(model, layer, inputs, None, "activation",
                                batch_size=batch_size, device=device)
    if len(codes) != activations.shape[0]:
        raise AttributionError(f"clusters has {len(codes)} entries but there are "
                               f"{activations.shape[0]} samples.")
    return fit_probe(activations, codes, ids, seed=seed)


@register("probe", "|W| of a linear probe of the clusters on the layer's activations "
          "(elastic net; NeuroX, Dalvi 2019): the neurons that encode each cluster",
          label="probe |W|", units="|probe weight| per standard deviation", colour="#E7298A",
          fit=_fit)
def probe_scores(batch: Batch) -> torch.Tensor:
    if isinstance(batch.targets, str):
        raise AttributionError("probe scores clusters, not classes: targets='all' has no "
                               "meaning for it.")
    scores = batch.fitted.scores.to(torch.float32)[batch.codes]
    left_out = batch.fitted.left_out[batch.start:batch.start + len(scores)]
    return scores.masked_fill(left_out[:, None], float("nan"))
