"""Streaming inputs (DataLoader, memory-mapped .npy, NpyRows) and devices give in-memory results."""
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import attribution as at
from attribution.methods.scores import cluster_codes, cluster_statistics, on_device, score_batches
from attribution.inputs.streaming import NpyRows, read_per_sample
from attribution.inputs.untrusted.limits import Limits

from tests.support.models import build

CASES = [("residual_mlp", "fc1"), ("residual_conv", "conv2")]
METHODS = ["gradient", "gradient_x_activation", "integrated_gradients", "ablation", "random"]


def clusters_for(n):
    return np.array(["even", "odd", "third"])[np.arange(n) % 3]


@pytest.fixture(params=CASES, ids=[arch for arch, _ in CASES])
def case(request):
    arch, layer = request.param
    model, x, y = build(arch)
    return model, layer, x, y


@pytest.fixture
def saved_inputs(case, tmp_path):
    path = tmp_path / "inputs.npy"
    np.save(path, case[2].numpy())
    return path


@pytest.mark.parametrize("method", METHODS)
def test_dataloader_with_labels_equals_in_memory(case, method):
    model, layer, x, y = case
    clusters = clusters_for(len(x))
    expected = at.cluster_scores(model, layer, x, y, clusters, method, reduce="std",
                                 n_steps=8, batch_size=64)
    loader = DataLoader(TensorDataset(x, y), batch_size=7)
    streamed = at.cluster_scores(model, layer, loader, "labels", clusters, method,
                                 reduce="std", n_steps=8)
    pd.testing.assert_frame_equal(streamed, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["gradient", "random"])
def test_memory_mapped_npy_and_npy_rows_equal_in_memory(case, saved_inputs, method):
    model, layer, x, y = case
    expected = at.neuron_scores(model, layer, x, y, method)
    mapped = np.load(saved_inputs, mmap_mode="r")
    torch.testing.assert_close(at.neuron_scores(model, layer, mapped, y, method, batch_size=5),
                               expected, rtol=1e-5, atol=1e-6)
    rows = NpyRows(saved_inputs, batch_size=9)
    torch.testing.assert_close(at.neuron_scores(model, layer, rows, y, method), expected,
                               rtol=1e-5, atol=1e-6)
    clusters = clusters_for(len(x))
    pd.testing.assert_frame_equal(
        at.cluster_scores(model, layer, rows, y, clusters, method, reduce="mean_abs"),
        at.cluster_scores(model, layer, x, y, clusters, method, reduce="mean_abs"),
        rtol=1e-5, atol=1e-6)


def test_all_classes_stream_from_a_dataloader(case):
    model, layer, x, _ = case
    loader = DataLoader(TensorDataset(x), batch_size=11)
    torch.testing.assert_close(at.neuron_scores(model, layer, loader, "all", "gradient"),
                               at.neuron_scores(model, layer, x, "all", "gradient"),
                               rtol=1e-5, atol=1e-6)


def test_statistics_of_two_shards_add_up_to_the_whole(case):
    model, layer, x, y = case
    codes, ids = cluster_codes(clusters_for(len(x)), len(x))
    whole = cluster_statistics(model, layer, x, y, codes, ids, "random")
    cut = len(x) // 3
    first = cluster_statistics(model, layer, x[:cut], y[:cut], codes[:cut], ids, "random")
    second = cluster_statistics(model, layer, x[cut:], y[cut:], codes[cut:], ids, "random",
                                first_index=cut)
    for total, a, b in zip(whole.tensors(), first.tensors(), second.tensors()):
        torch.testing.assert_close(a + b, total)
    for reduce in at.REDUCTIONS:
        pd.testing.assert_frame_equal(whole.frame(reduce), at.cluster_scores(
            model, layer, x, y, clusters_for(len(x)), "random", reduce=reduce))


def test_npy_rows_slices_lazily(saved_inputs, case):
    x = case[2]
    rows = NpyRows(saved_inputs, batch_size=4)
    assert rows.shape == tuple(x.shape) and len(rows) == len(x)
    part = rows[5:14]
    assert part.shape[0] == 9
    np.testing.assert_array_equal(np.concatenate(list(part)), x[5:14].numpy())
    assert [len(batch) for batch in part] == [4, 4, 1]
    assert len(rows[len(x) + 3:]) == 0


def test_npy_rows_reads_big_endian_files(tmp_path):
    path = tmp_path / "big_endian.npy"
    values = np.arange(12, dtype=">f8").reshape(4, 3)
    np.save(path, values)
    np.testing.assert_array_equal(np.concatenate(list(NpyRows(path))), values)


@pytest.mark.parametrize("content,message", [
    (b"not a numpy file at all", "not a valid .npy"),
    (None, "truncated"),
    ("fortran", "C order"),
    ("objects", "numeric array"),
    ("nested", "not a valid .npy"),
])
@pytest.mark.parametrize("sandbox", [None, False], ids=["jail", "here"])
def test_npy_rows_refuses_bad_files(tmp_path, content, message, sandbox):
    """The same refusal whether the header is read in the jail (the default) or here."""
    path = tmp_path / "bad.npy"
    if content is None:
        np.save(path, np.zeros((50, 4), dtype=np.float32))
        path.write_bytes(path.read_bytes()[:-40])
    elif content == "fortran":
        np.save(path, np.asfortranarray(np.zeros((5, 4))))
    elif content == "objects":
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif content == "nested":  # a header numpy's literal parser recurses into
        header = ("{'descr': '<f4', 'fortran_order': False, 'shape': "
                  + "(" * 3000 + ")" * 3000 + "}").encode()
        path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
    else:
        path.write_bytes(content)
    with pytest.raises(at.AttributionError, match=message):
        NpyRows(path, sandbox=sandbox)


@pytest.mark.parametrize("sandbox", [None, False], ids=["jail", "here"])
def test_missing_npy_file_is_a_clear_error(tmp_path, sandbox):
    with pytest.raises(at.AttributionError, match="No such data file"):
        NpyRows(tmp_path / "absent.npy", sandbox=sandbox)


def test_npy_rows_that_shrink_after_their_header_was_read_are_an_error(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.zeros((50, 4), dtype=np.float32))
    rows = NpyRows(path, batch_size=8)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(at.AttributionError, match="ended early"):
        list(rows)


@pytest.mark.parametrize("sandbox", [None, False], ids=["jail", "here"])
def test_per_sample_files_are_read_whole_as_numbers_or_text(tmp_path, sandbox):
    np.save(tmp_path / "ids.npy", np.array([b"even", b"odd", b"even"]))
    np.save(tmp_path / "labels.npy", np.arange(3))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "big.npy", np.zeros(1000))
    ids = read_per_sample(tmp_path / "ids.npy", "cluster ids", sandbox=sandbox)
    assert ids.dtype.kind == "U" and list(ids) == ["even", "odd", "even"]
    np.testing.assert_array_equal(read_per_sample(tmp_path / "labels.npy", "labels",
                                                  sandbox=sandbox), np.arange(3))
    for name, message in (("objects.npy", "not a readable .npy file of labels"),
                          ("absent.npy", "No such labels file"),
                          ("big.npy", "over the limit of 0 MB.*max-decoded-mb")):
        with pytest.raises(at.AttributionError, match=message):
            read_per_sample(tmp_path / name, "labels", sandbox=sandbox,
                            limits=Limits(max_decoded_bytes=4000))


def test_labels_need_labelled_batches(case):
    model, layer, x, _ = case
    with pytest.raises(at.AttributionError, match="carry no labels"):
        at.neuron_scores(model, layer, DataLoader(TensorDataset(x), batch_size=8), "labels",
                         "gradient")
    with pytest.raises(at.AttributionError, match="LongTensor"):
        at.neuron_scores(model, layer, x, "labels", "gradient")
    float_labels = DataLoader(TensorDataset(x, torch.rand(len(x))), batch_size=8)
    with pytest.raises(at.AttributionError, match="integer class ids"):
        at.neuron_scores(model, layer, float_labels, "labels", "gradient")
    out_of_range = DataLoader(TensorDataset(x, torch.full((len(x),), 99)), batch_size=8)
    with pytest.raises(at.AttributionError, match="must lie in"):
        at.neuron_scores(model, layer, out_of_range, "labels", "gradient")


def test_cpu_device_gives_the_same_scores_and_keeps_the_model(case):
    model, layer, x, y = case
    assert on_device(model, "cpu") is model and on_device(model, None) is model
    torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "gradient", device="cpu"),
                               at.neuron_scores(model, layer, x, y, "gradient"))
    torch.testing.assert_close(at.neuron_scores(model, layer, x, y, "gradient",
                                                device=torch.device("cpu")),
                               at.neuron_scores(model, layer, x, y, "gradient"))


def test_cuda_device_runs_on_the_gpu_or_says_why_not(case):
    model, layer, x, y = case
    expected = at.neuron_scores(model, layer, x, y, "gradient")
    if torch.cuda.is_available():
        on_gpu = at.neuron_scores(model, layer, x, y, "gradient", device="cuda")
        torch.testing.assert_close(on_gpu, expected, rtol=1e-4, atol=1e-5)
        assert next(model.parameters()).device.type == "cpu"  # the caller's model stays put
    else:
        with pytest.raises(at.AttributionError, match="CUDA is not available"):
            at.neuron_scores(model, layer, x, y, "gradient", device="cuda")


@pytest.mark.parametrize("device,message", [("banana", "Unknown device"),
                                            ("mps", "not supported")])
def test_unknown_devices_are_refused(case, device, message):
    model, layer, x, y = case
    with pytest.raises(at.AttributionError, match=message):
        at.cluster_scores(model, layer, x, y, clusters_for(len(x)), "gradient", device=device)


def test_out_of_range_targets_are_refused_before_any_batch_is_scored(case):
    """Every class id is checked once, before the first batch: no batch before a bad id is
    scored and handed out."""
    model, layer, x, y = case
    bad = y.clone()
    bad[-1] = 99
    batches = score_batches(model, layer, x, bad, batch_size=4)
    with pytest.raises(at.AttributionError, match=r"must lie in 0\.\.\d .*\.\.99\."):
        next(batches)
