"""The rank statistics every comparison with the oracle reads (attribution/analyses/ranks.py)
against scipy's."""
import numpy as np
import pytest
from scipy import stats

from attribution.analyses.ranks import KENDALL_TABLE_MOST, row_kendall


@pytest.mark.parametrize("n", [2, 7, 64, KENDALL_TABLE_MOST, KENDALL_TABLE_MOST + 1, 600])
def test_row_kendall_is_scipys_tau_b_on_every_row(n):
    """Ties (tau-b's denominator), a constant row, a row with NaN or infinity: on both
    sides of the width where the sign tables give way to scipy."""
    generator = np.random.default_rng(n)
    a = generator.standard_normal((40, n))
    b = 0.5 * a + generator.standard_normal((40, n))
    a[:, : n // 3] = np.round(a[:, : n // 3])  # ties in both
    b[::2, : n // 4] = 0.0
    a[3], b[4, 0], a[5, -1] = 1.0, np.nan, np.inf
    expected = []
    for left, right in zip(a, b):
        finite = np.isfinite(left).all() and np.isfinite(right).all()
        constant = np.ptp(left) == 0 or np.ptp(right) == 0
        expected.append(np.nan if not finite or constant
                        else stats.kendalltau(left, right).statistic)
    taus = row_kendall(a, b)
    np.testing.assert_allclose(taus, expected, rtol=0, atol=1e-12)
    assert np.isnan(taus[[3, 4, 5]]).all()
