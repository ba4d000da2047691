"""Two gloo processes on the CPU give the single-process results (scores, per-sample, curves)."""
import datetime
import json
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, TensorDataset

import attribution as at
from attribution import cli
from attribution.analyses import distributed
from attribution.analyses import pruning_curves
from attribution.inputs.streaming import NpyRows

from tests.support.models import build
from tests.support import ROOT

WORLD_SIZE = 2
SCORED = [("gradient", "std"), ("random", "mean"), ("ablation", "mean_abs"),
          ("integrated_gradients", "mean")]
N_RANDOM = 6


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def problem():
    """(model, layer, inputs [N, ...], labels [N], cluster ids [N], one score per neuron)."""
    model, x, y = build("residual_mlp")
    x, y = torch.cat([x, x[:13] * 0.5]), torch.cat([y, y[:13]])  # N = 53: shards of 27 and 26
    clusters = np.array(["a", "b", "c", "d"])[np.arange(len(x)) % 4]
    neuron_order = np.random.default_rng(0).permutation(16).astype(float)
    return model, "fc1", x, y, clusters, neuron_order


class FailingDataset(Dataset):
    """Fails on one sample, which lies in the last rank's shard."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if index == len(self.x) - 1:
            raise at.AttributionError("sample 52 is unreadable")
        return self.x[index]


def compute(model, layer, x, y, clusters, neuron_order, folder):
    """Everything the test compares; the distributed functions run in one process without a
    process group, so the same code gives the reference."""
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    batches = [(x[i:i + 10], y[i:i + 10]) for i in range(0, len(x), 10)]
    rows = NpyRows(folder / "inputs.npy", batch_size=6)
    results = {
        f"{method}-{reduce}": distributed.cluster_scores(model, layer, x, y, clusters, method,
                                                         reduce=reduce, n_steps=8)
        for method, reduce in SCORED
    }
    results["all-classes"] = distributed.cluster_scores(model, layer, x, "all", clusters,
                                                        "gradient")
    results["loader"] = distributed.cluster_scores(model, layer, loader, "labels", clusters,
                                                   "gradient_x_activation", reduce="mean_abs")
    results["batches"] = distributed.cluster_scores(model, layer, batches, "labels", clusters,
                                                    "random", reduce="std")
    results["npy-rows"] = distributed.cluster_scores(model, layer, rows, None, clusters, "gradient")
    results["curve"] = distributed.pruning_curve(model, layer, x, y, neuron_order,
                                                 n_random=N_RANDOM, metric="loss")
    results["cluster-curves"] = distributed.cluster_pruning_curves(
        model, layer, loader, "labels", clusters, "b", neuron_order, n_random=N_RANDOM,
        ks=[0, 2, 5, 16])
    statistics = distributed.cluster_statistics(model, layer, x, "all", clusters, "gradient",
                                                batch_size=5,
                                                per_sample=folder / "per_sample.npy")
    results["per-sample"] = np.load(folder / "per_sample.npy")
    results["with-per-sample"] = statistics.frame("mean")
    return results


def worker(rank, port, folder):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60))
    try:
        results = compute(*problem(), folder)
        model, layer, x, _, clusters, _ = problem()
        try:
            distributed.cluster_scores(model, layer, DataLoader(FailingDataset(x), batch_size=4),
                                       None, clusters, "gradient")
            results["failure"] = "no error"
        except at.AttributionError as error:
            results["failure"] = str(error)
        results["rank"] = distributed.rank_and_size()
        torch.save({key: (value, getattr(value, "attrs", None)) for key, value in results.items()},
                   folder / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """(single-process results, [results of rank 0, rank 1], the folder they wrote to)."""
    folder = tmp_path_factory.mktemp("distributed")
    np.save(folder / "inputs.npy", problem()[2].numpy())
    single = compute(*problem(), folder)
    mp.spawn(worker, args=(free_port(), folder), nprocs=WORLD_SIZE)
    ranks = []
    for rank in range(WORLD_SIZE):
        saved = torch.load(folder / f"rank{rank}.pt", weights_only=False)
        for value, attrs in saved.values():
            if attrs is not None:
                value.attrs = attrs
        ranks.append({key: value for key, (value, _) in saved.items()})
    return single, ranks, folder


@pytest.mark.parametrize("key", [f"{m}-{r}" for m, r in SCORED]
                         + ["all-classes", "with-per-sample", "loader", "batches", "npy-rows"])
def test_cluster_scores_equal_single_process(outcomes, key):
    single, ranks, _ = outcomes
    for results in ranks:
        pd.testing.assert_frame_equal(results[key], single[key], rtol=1e-6, atol=1e-7)
    sizes = single[key]["n"]
    assert (sizes if sizes.index.nlevels == 1 else sizes.xs(0, level="class")).sum() == 53


def test_direct_call_equals_the_engine():
    model, layer, x, y, clusters, _ = problem()
    pd.testing.assert_frame_equal(
        distributed.cluster_scores(model, layer, x, y, clusters, "gradient", reduce="std"),
        at.cluster_scores(model, layer, x, y, clusters, "gradient", reduce="std"))


@pytest.mark.parametrize("key", ["curve", "cluster-curves"])
def test_pruning_curves_equal_single_process(outcomes, key):
    single, ranks, _ = outcomes
    for results in ranks:
        pd.testing.assert_frame_equal(results[key], single[key], rtol=1e-9, atol=1e-12)
        assert results[key].attrs["n_samples"] == single[key].attrs["n_samples"]
        pd.testing.assert_frame_equal(pruning_curves.curve_summary(results[key]),
                                      pruning_curves.curve_summary(single[key]))


def test_curves_equal_the_engine():
    model, layer, x, y, clusters, neuron_order = problem()
    pd.testing.assert_frame_equal(
        distributed.pruning_curve(model, layer, x, y, neuron_order, n_random=N_RANDOM),
        pruning_curves.pruning_curve(model, layer, x, y, neuron_order, n_random=N_RANDOM))


def test_per_sample_scores_equal_single_process(outcomes):
    single, ranks, folder = outcomes
    assert not list(folder.glob("*.part*"))  # rank 0 joined and removed every rank's part
    model, layer, x, *_ = problem()
    np.testing.assert_allclose(single["per-sample"],
                               at.neuron_scores(model, layer, x, "all", "gradient").numpy(),
                               rtol=1e-6)
    for results in ranks:
        np.testing.assert_allclose(results["per-sample"], single["per-sample"], rtol=1e-5,
                                   atol=1e-7)


def test_a_failure_on_one_rank_stops_every_rank(outcomes):
    _, ranks, _ = outcomes
    assert [results["rank"] for results in ranks] == [(0, 2), (1, 2)]
    assert "Another process failed" in ranks[0]["failure"]
    assert ranks[1]["failure"] == "sample 52 is unreadable"


@pytest.mark.parametrize("total,size", [(53, 2), (5, 4), (3, 5), (0, 3), (100, 7)])
def test_shards_cover_every_sample_once(total, size):
    shares = [distributed.shard_range(total, rank, size) for rank in range(size)]
    assert [i for share in shares for i in share] == list(range(total))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_shuffled_loader_cannot_be_sharded():
    _, _, x, y, _, _ = problem()
    shuffled = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    with pytest.raises(at.AttributionError, match="shuffle=False"):
        list(distributed.shards(shuffled, 0, 2))


def test_mean_ablation_needs_one_process(monkeypatch):
    model, layer, x, y, _, neuron_order = problem()
    monkeypatch.setattr(distributed, "rank_and_size", lambda group=None: (0, 2))
    with pytest.raises(at.AttributionError, match="without torchrun"):
        distributed.pruning_curve(model, layer, x, y, neuron_order, ablation="mean")


# ------------------------------------------------------------- the command line under torchrun

def test_torchrun_command_line_equals_one_process(tmp_path, capsys):
    root = ROOT
    # the demo's own even/odd cluster column, the command line's default before the label
    common = ["--model", root / "demo" / "digits_mlp.pt2", "--data", root / "demo" / "digits.npz",
              "--layer", "fc2", "--reduce", "mean_abs", "--clusters", "provided"]
    commands = {
        # conductance at 2 steps: samples refined (the sum check counted on each rank's
        # shard, then summed)
        "score": ["score", *common, "--method", "gradient", "random", "conductance",
                  "--n-steps", "2", "--per-sample", "{folder}/samples.npy",
                  "--out", "{folder}/scores.csv"],
        "curve": ["curve", *common, "--cluster", "odd", "--n-random", "6", "--ks", "0,1,4,16",
                  "--out", "{folder}/curve.csv", "--summary", "{folder}/summary.json"],
    }
    for folder in ("single", "torchrun"):
        (tmp_path / folder).mkdir()
    launched = [subprocess.Popen(  # both torchrun jobs at once; each picks a free port
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={WORLD_SIZE}", "-m", "attribution",
         *[str(a).format(folder=tmp_path / "torchrun") for a in arguments]],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for arguments in commands.values()]
    said = []
    for arguments in commands.values():
        single = [str(a).format(folder=tmp_path / "single") for a in arguments]
        assert cli.main(single) == 0, capsys.readouterr().err
        said.append(capsys.readouterr().err)
    for process, single_said in zip(launched, said):
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        sums = [[line for line in text.splitlines() if line.startswith("conductance:")]
                for text in (err, single_said)]
        assert sums[0] == sums[1]
    assert "718 took more than the 2 steps asked for" in said[0]
    for table in ("scores.csv", "curve.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "torchrun" / table),
                                      pd.read_csv(tmp_path / "single" / table), rtol=1e-6)
    assert (pd.read_csv(tmp_path / "single" / "scores.csv")["sum_missing"] == 0).sum() == 32
    for method in ("gradient", "random", "conductance"):
        np.testing.assert_allclose(np.load(tmp_path / "torchrun" / f"samples.{method}.npy"),
                                   np.load(tmp_path / "single" / f"samples.{method}.npy"),
                                   rtol=1e-5, atol=1e-7)
    sharded, single = (json.loads((tmp_path / folder / "summary.json").read_text())
                       for folder in ("torchrun", "single"))
    assert sharded["n_samples"] == single["n_samples"] == {"cluster": 363, "rest": 356}
    for subset in ("cluster", "rest"):
        assert sharded["subsets"][subset] == pytest.approx(single["subsets"][subset])
    assert sorted(p.name for p in (tmp_path / "torchrun").iterdir()) == sorted(
        p.name for p in (tmp_path / "single").iterdir())  # rank 0 alone wrote, no parts left
