"""Rank statistics of two rankings of a layer's neurons, and their bootstrap intervals: the
measures every comparison with the oracle reads (`oracle`, `oracle_sample`, `diagnose`,
`scorecard`). NumPy only (scipy on first use)."""
from __future__ import annotations

import warnings
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95
"""The level of every bootstrap interval (the scorecard's, the degeneracy checks')."""


def rank_correlation(kind: str, a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho or Kendall's tau-b (`kind` "spearman" / "kendall") of a [n] and b [n];
    NaN when either ranking is constant or not finite."""
    from scipy import stats  # imported on first use: it adds ~1 s to `import attribution`

    finite = np.isfinite(a).all() and np.isfinite(b).all()
    if not finite or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    if kind == "spearman":  # Pearson of average ranks, as scipy's, without its checks
        return float(row_spearman(row_ranks(np.asarray(a)[None]),
                                  row_ranks(np.asarray(b)[None]))[0])
    function = {"kendall": stats.kendalltau}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(function(a, b).statistic)


def row_ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis, centred and scaled to unit norm per row (NaN rows
    where the values are constant): Spearman's rho of two rows is then their dot product
    (`row_spearman`)."""
    from scipy import stats  # imported on first use, as in rank_correlation

    ranks = stats.rankdata(values, axis=-1)
    ranks = ranks - ranks.mean(-1, keepdims=True)
    norms = np.linalg.norm(ranks, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, ranks / norms, np.nan)


def row_spearman(ranks_a: np.ndarray, ranks_b: np.ndarray) -> np.ndarray:
    """Spearman's rho of rows of `row_ranks`, rounded to 12 decimals so that equal rankings
    give exactly 1 (float sums leave 1 - 2e-16)."""
    return np.round((ranks_a * ranks_b).sum(-1), 12)


KENDALL_TABLE_MOST = 256
"""`row_kendall` counts pairs in sign tables up to this many neurons, and goes through scipy
(one call a row, n log n) above: a row of n costs n^2 table entries."""


def row_kendall(a: np.ndarray, b: np.ndarray, most: int = KENDALL_TABLE_MOST) -> np.ndarray:
    """[R]: Kendall's tau-b of each row of a [R, n] with b's: the sum over pairs of
    sign(a_i - a_j) sign(b_i - b_j), over the square root of the untied pairs' counts (NaN
    where a row is constant or not finite). Rows up to `most` wide: int8 sign tables of
    their ranks, a block of rows at a time; wider rows through scipy (n log n each)."""
    if a.shape[1] > most:
        return np.array([rank_correlation("kendall", left, right) for left, right in zip(a, b)])
    from scipy import stats  # imported on first use, as in rank_correlation

    finite = np.isfinite(a).all(1) & np.isfinite(b).all(1)
    ranks_a, ranks_b = (stats.rankdata(np.where(finite[:, None], values, 0.0), axis=1,
                                       method="dense").astype(np.int16) for values in (a, b))
    result = np.full(len(a), np.nan)
    step = max(1, (1 << 24) // max(1, a.shape[1] ** 2))  # 16 MB per int8 sign table
    for begin in range(0, len(a), step):
        rows = slice(begin, begin + step)
        signs_a = np.sign(ranks_a[rows, :, None] - ranks_a[rows, None, :]).astype(np.int8)
        signs_b = np.sign(ranks_b[rows, :, None] - ranks_b[rows, None, :]).astype(np.int8)
        agreeing = np.einsum("rij,rij->r", signs_a, signs_b, dtype=np.int64)
        untied = (np.count_nonzero(signs_a, axis=(1, 2))
                  * np.count_nonzero(signs_b, axis=(1, 2)))
        with np.errstate(invalid="ignore", divide="ignore"):
            result[rows] = agreeing / np.sqrt(untied)
    result[~finite] = np.nan
    return result


def row_top_overlap(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """[R]: `top_k_overlap` of each row of a [R, n] with b's (ties in their order)."""
    top_a = np.zeros(a.shape, dtype=bool)
    top_b = np.zeros(b.shape, dtype=bool)
    np.put_along_axis(top_a, np.argsort(-a, axis=1, kind="stable")[:, :k], True, axis=1)
    np.put_along_axis(top_b, np.argsort(-b, axis=1, kind="stable")[:, :k], True, axis=1)
    return (top_a & top_b).sum(1) / k


def bootstrap_counts(n_samples: int, n_draws: int, generator: np.random.Generator
                     ) -> np.ndarray:
    """How often each of n samples is drawn in each of n_draws resamples [n_draws, n]
    (float64; a multinomial of n draws): `counts @ values / n` are the resampled means."""
    return generator.multinomial(n_samples, np.full(n_samples, 1 / n_samples),
                                 size=n_draws).astype(np.float64)


def pivot_interval(draws: np.ndarray, estimate: float, bounds: tuple[float, float],
                   confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The basic (pivotal) bootstrap interval [2 estimate - q_high, 2 estimate - q_low] of
    `draws` (NaN draws ignored), widened to contain the estimate and kept within the
    statistic's `bounds`: for an estimate biased as its resamples are biased from it (a
    rank correlation of means over a sample of the samples is attenuated, and resamples
    attenuate it again), where the percentile intervals, bias-corrected or not, stay on
    the biased side whenever the bias passes the spread."""
    finite = draws[np.isfinite(draws)]
    if not finite.size or not np.isfinite(estimate):
        return float("nan"), float("nan")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return (float(max(bounds[0], min(2 * estimate - high, estimate))),
            float(min(bounds[1], max(2 * estimate - low, estimate))))


def interval(draws: np.ndarray, estimate: float,
             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The bias-corrected percentile interval (Efron 1981) of bootstrap `draws` of a statistic
    whose value on the data is `estimate` (NaN draws ignored; NaN, NaN when none is finite).

    A rank correlation of resampled means is biased toward 0 (resampling adds noise) and
    takes few distinct values on a few neurons, so the plain percentiles can sit on the
    estimate or beside it. The bias correction z0 = Phi^-1(share of draws below the
    estimate, ties counted half) moves both percentiles to where the estimate lies among the
    draws: the interval contains the estimate, strictly unless nearly every draw equals it
    (a correlation of exactly 1, say). Where 97.5% of the draws lie on one side of it, the
    interval is widened to reach it.
    """
    finite = draws[np.isfinite(draws)]
    if not finite.size or not np.isfinite(estimate):
        return float("nan"), float("nan")
    normal = NormalDist()
    below = (np.sum(finite < estimate) + 0.5 * np.sum(finite == estimate)) / finite.size
    half = 0.5 / finite.size
    z0 = normal.inv_cdf(min(max(below, half), 1 - half))
    z = normal.inv_cdf(1 - (1 - confidence) / 2)
    levels = [100 * normal.cdf(2 * z0 - z), 100 * normal.cdf(2 * z0 + z)]
    low, high = np.percentile(finite, levels)
    return float(min(low, estimate)), float(max(high, estimate))


def top_k_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """|top-k of a ∩ top-k of b| / k (ties in their order of appearance)."""
    top_a = set(np.argsort(-a, kind="stable")[:k].tolist())
    top_b = set(np.argsort(-b, kind="stable")[:k].tolist())
    return len(top_a & top_b) / k
