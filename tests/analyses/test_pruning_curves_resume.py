"""A pruning curve interrupted mid-way resumes from the points it had (resume=), computing
only the rest, and ends exactly where an uninterrupted run ends."""
import numpy as np
import pandas as pd
import pytest

import attribution as at
from attribution.analyses.pruning_curves import refinement_rounds


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def demo():
    loaded, data = at.load_demo("digits_mlp")
    scores = at.neuron_scores(loaded.module, "relu1", data.inputs, data.labels,
                              "gradient_x_activation").mean(0).numpy()
    return loaded.module, data, scores


def interrupted_after(rounds: int, run) -> pd.DataFrame:
    """The last partial frame `run` handed to progress before being stopped after `rounds`."""
    seen = []

    def progress(fraction, partial):
        seen.append(partial)
        if len(seen) == rounds:
            raise Interrupted

    with pytest.raises(Interrupted):
        run(progress=progress)
    return seen[-1]


@pytest.mark.parametrize("clustered", [False, True])
def test_a_resumed_curve_equals_the_uninterrupted_one_and_skips_the_done_points(demo, clustered):
    model, data, scores = demo
    clusters = data.labels.numpy()

    def run(**kwargs):
        if clustered:
            return at.cluster_pruning_curves(model, "relu1", data.inputs, data.labels, clusters,
                                             3, scores, n_random=7, **kwargs)
        return at.pruning_curve(model, "relu1", data.inputs, data.labels, scores, n_random=7,
                                **kwargs)

    full = run()
    partial = interrupted_after(2, run)
    n_ks = len(scores) + 1
    assert partial["k"].nunique() == sum(map(len, refinement_rounds(n_ks)[:2])) < n_ks
    fractions = []
    resumed = run(resume=partial, progress=lambda fraction, frame: fractions.append(
        (fraction, frame["k"].nunique())))
    first_new_round = len(refinement_rounds(n_ks)[2])
    assert fractions[0][1] == partial["k"].nunique() + first_new_round  # done ones kept
    assert len(fractions) == len(refinement_rounds(n_ks)) - 2  # only the remaining rounds
    pd.testing.assert_frame_equal(resumed, full, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(at.curve_summary(resumed).to_numpy(dtype=float),
                               at.curve_summary(full).to_numpy(dtype=float), rtol=1e-12)


def test_resuming_from_a_curve_of_other_scores_or_metric_is_refused(demo):
    model, data, scores = demo

    def run(values=scores, metric="accuracy", **kwargs):
        return at.pruning_curve(model, "relu1", data.inputs, data.labels, values, n_random=5,
                                metric=metric, **kwargs)

    partial = interrupted_after(1, run)
    with pytest.raises(at.AttributionError, match="resume=None"):
        run(values=-scores, resume=partial)
    with pytest.raises(at.AttributionError, match="resume=None"):
        run(metric="loss", resume=partial)
    with pytest.raises(at.AttributionError, match="resume=None"):
        at.pruning_curve(model, "relu1", data.inputs[:100], data.labels[:100], scores,
                         n_random=5, resume=partial)
    finished = run(resume=run())  # a finished curve resumes to itself, computing nothing
    pd.testing.assert_frame_equal(finished, run())


def test_a_partial_cut_from_a_finished_frame_is_refused_not_misread(demo):
    model, data, scores = demo
    full = at.pruning_curve(model, "relu1", data.inputs, data.labels, scores, n_random=5)
    cut = full.iloc[:5]  # rows of 5 k, random curves of every k (pandas keeps attrs)
    with pytest.raises(at.AttributionError, match="random curves"):
        at.pruning_curve(model, "relu1", data.inputs, data.labels, scores, n_random=5,
                         resume=cut)


def test_the_summary_of_a_slice_of_rows_leaves_the_random_share_unknown(demo):
    model, data, scores = demo
    full = at.pruning_curve(model, "relu1", data.inputs, data.labels, scores, n_random=5)
    summary = at.curve_summary(full.iloc[:5])  # attrs still hold every k's random curves
    assert np.isnan(summary["fraction_random_beaten"].iloc[0])
    assert np.isfinite(summary["area_ranked"].iloc[0])
