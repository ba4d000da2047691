"""Data loading in every accepted layout, and checks against a model."""
import io

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attribution as at
from attribution.inputs.loaded import LoadedModel
from tests.support.hostile import saved
from tests.support.models import INPUTS, LABELS, picker_model

def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def csv_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return buffer.getvalue()


def table(**extra) -> pd.DataFrame:
    frame = pd.DataFrame(INPUTS, columns=["a", "b", "c"])
    for column, values in extra.items():
        frame[column] = values
    return frame


# ---------------------------------------------------------------- formats

@pytest.mark.parametrize("data", [
    npz_bytes(inputs=INPUTS, labels=LABELS, clusters=np.array(["p", "q", "p", "q"]),
              feature_names=np.array(["a", "b", "c"]), class_names=np.array(["no", "yes"])),
    npz_bytes(X=INPUTS, y=LABELS, cluster=np.array([0, 1, 0, 1]),
              cluster_names=np.array(["p", "q"]), feature_names=np.array(["a", "b", "c"]),
              class_names=np.array(["no", "yes"])),
    saved({"inputs": torch.from_numpy(INPUTS), "labels": torch.from_numpy(LABELS),
              "clusters": ["p", "q", "p", "q"], "feature_names": ["a", "b", "c"],
              "class_names": ["no", "yes"]}),
    csv_bytes(table(label=LABELS, cluster=["p", "q", "p", "q"])),
    parquet_bytes(table(Label=LABELS, group=["p", "q", "p", "q"])),
], ids=["npz", "npz-aliases", "pt-dict", "csv", "parquet"])
def test_every_format_gives_the_same_dataset(data):
    dataset = at.load_data(data)
    torch.testing.assert_close(dataset.inputs, torch.from_numpy(INPUTS))
    assert dataset.labels.tolist() == LABELS.tolist() and dataset.labels.dtype == torch.int64
    assert dataset.clusters.tolist() == ["p", "q", "p", "q"]
    assert dataset.feature_names == ("a", "b", "c") and len(dataset) == 4


def test_pt_tensor_tuple_and_npy_and_images(tmp_path):
    images = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    assert at.load_data(saved(torch.from_numpy(images))).inputs.shape == (2, 1, 3, 3)
    pair = at.load_data(saved((torch.from_numpy(INPUTS), torch.from_numpy(LABELS))))
    assert pair.labels.tolist() == LABELS.tolist() and pair.clusters is None
    np.save(tmp_path / "x.npy", np.asfortranarray(INPUTS.astype(np.float64)))
    loaded = at.load_data(tmp_path / "x.npy")
    assert loaded.inputs.dtype == torch.float32 and loaded.labels is None
    torch.testing.assert_close(loaded.inputs, torch.from_numpy(INPUTS))
    with open(tmp_path / "x.npy", "rb") as handle:
        assert at.load_data(handle).inputs.shape == (4, 3)


def test_the_row_index_written_by_pandas_is_not_a_feature():
    frame = table(label=LABELS)
    features = tuple(c for c in frame.columns if c != "label")
    saved = frame.to_csv().encode()  # index=True: a first column without a header
    assert saved.startswith(b",a,")
    assert at.load_data(saved).feature_names == features
    filtered = frame[frame["label"] == 1].sample(frac=1, random_state=1).to_csv().encode()
    assert at.load_data(filtered).feature_names == features  # rows 2, 1: still the index
    repeated = frame.set_index(pd.Index([0, 0, 1, 1])).to_csv().encode()  # not an index
    assert at.load_data(repeated).feature_names == ("Unnamed: 0",) + features


def test_columns_and_keys_can_be_chosen():
    frame = table(target=LABELS, kind=[5, 6, 5, 6], note=["x", "y", "z", "w"])
    with pytest.raises(at.AttributionError, match="note are not numeric.*--features"):
        at.load_data(csv_bytes(frame))
    chosen = at.load_data(csv_bytes(frame), features=["a", "c"], label="target", cluster="kind")
    assert chosen.inputs.shape == (4, 2) and chosen.clusters.tolist() == [5, 6, 5, 6]
    without = at.load_data(csv_bytes(table(label=LABELS)), label="")
    assert without.labels is None and without.inputs.shape == (4, 4)
    arrays = npz_bytes(pixels=INPUTS, truth=LABELS)
    with pytest.raises(at.AttributionError, match="available: pixels, truth"):
        at.load_data(arrays)
    assert at.load_data(arrays, features="pixels", label="truth").labels.tolist() == [0, 1, 1, 0]
    with pytest.raises(at.AttributionError, match="no labels array 'nope'"):
        at.load_data(arrays, features="pixels", label="nope")


@pytest.mark.parametrize("data, message", [
    (csv_bytes(table(label=["cat", "dog", "cat", "dog"])), "found 'cat'"),
    (csv_bytes(table(label=[0, None, 1, 0])), "integer class ids .*; found nan"),
    (b"a,label\n1,99999999999999999999\n2,1\n", "0..C-1; found 1e\\+20"),
    (csv_bytes(table(label=LABELS, cluster=["p", None, "p", "q"])), "no cluster id"),
    (npz_bytes(inputs=np.where(INPUTS == 4, np.nan, INPUTS)), r"row 1, value 1"),
    (csv_bytes(table(label=LABELS).replace(7.0, np.inf)), "row 2, column 'b'"),
    (b"1,2,3\n4,5,6\n", "header row"),
    (csv_bytes(table(label=LABELS).iloc[:0]), "no rows"),
    (npz_bytes(inputs=np.array(["a", "b"])), "must be numbers"),
    (npz_bytes(inputs=np.zeros(3, np.float32)), r"shape \[N, ...\]"),
    (npz_bytes(inputs=INPUTS, feature_names=np.array(["a", "b"])), "2 feature names"),
    (npz_bytes(inputs=INPUTS, labels=LABELS[:3]), "one class id per sample"),
    (npz_bytes(inputs=INPUTS, clusters=np.array([0, 5, 0, 1]), cluster_names=np.array(["p", "q"])),
     "integer ids 0..1"),
    (saved({"inputs": torch.ones(2, 2), "labels": torch.ones(2, dtype=torch.complex64)}),
     "of dtype torch.complex64"),
    (saved({"inputs": [[1.0, 2.0], [3.0]]}), "rectangular"),
    (saved({"inputs": torch.ones(2, 2), "labels": torch.ones(2, dtype=torch.bfloat16)}),
     None),
], ids=["text-label", "missing-label", "huge-label",
        "missing-cluster",
        "nan-input", "inf-in-table", "no-header", "no-rows", "text-inputs", "1d-inputs",
        "feature-name-count", "label-count", "cluster-name-ids", "complex-labels",
        "ragged-inputs", "bfloat16-labels-are-fine"])
def test_bad_values_are_named(data, message):
    if message is None:
        assert at.load_data(data).labels.tolist() == [1, 1]
        return
    with pytest.raises(at.AttributionError, match=message):
        at.load_data(data)


def test_real_labels_load_as_values_and_a_classifier_refuses_them_by_name():
    """Labels that are no class ids (1.5, -1) are a regression head's true values: they load
    as float32, and `check_data` against a classifier names the first one."""
    classifier = at.LoadedModel(torch.nn.Linear(3, 2).eval(), (3,), 2)
    for labels, message in (([0, 1.5, 1, 0], "integer class ids; found 1.5"),
                            ([0, -1, 1, 0], ">= 0; found -1")):
        data = at.load_data(csv_bytes(table(label=labels)))
        assert data.labels.dtype == torch.float32 and data.labels.tolist() == labels
        with pytest.raises(at.AttributionError, match=message):
            at.check_data(data, classifier)


def test_object_arrays_are_refused_without_unpickling():
    buffer = io.BytesIO()
    np.savez(buffer, inputs=INPUTS, feature_names=np.array(["a", 1, None], dtype=object))
    with pytest.raises(at.AttributionError, match="dtype=object"):
        at.load_data(buffer.getvalue())


def test_size_and_row_limits_are_configurable(monkeypatch):
    data = npz_bytes(inputs=INPUTS, labels=LABELS)
    with pytest.raises(at.AttributionError, match="over the in-memory limit of 3"):
        at.load_data(data, max_rows=3)
    with pytest.raises(at.AttributionError, match="limit"):
        at.load_data(data, max_bytes=100)
    for limited in (csv_bytes(table(label=LABELS)), parquet_bytes(table(label=LABELS)),
                    saved(torch.from_numpy(INPUTS))):
        with pytest.raises(at.AttributionError, match="in-memory limit"):
            at.load_data(limited, max_rows=2)
    monkeypatch.setattr(at.inputs.data_files, "MAX_ROWS", 3)
    with pytest.raises(at.AttributionError, match="limit of 3"):
        at.load_data(data)
    monkeypatch.setattr(at.inputs.untrusted.files, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(at.AttributionError, match="MiB limit"):
        at.load_data(data)


def test_truncated_npy_inside_npz_is_caught_before_allocation():
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (10 ** 9, 64)})
    buffer = io.BytesIO()
    with __import__("zipfile").ZipFile(buffer, "w") as archive:
        archive.writestr("inputs.npy", b"\x93NUMPY\x01\x00" + header.getvalue()[8:] + b"\0" * 16)
    with pytest.raises(at.AttributionError, match="truncated or damaged"):
        at.load_data(buffer.getvalue())


# ---------------------------------------------------------------- checks against a model

def test_check_data_reshapes_flat_inputs_and_fills_class_names():
    model = LoadedModel(module=nn.Sequential(nn.Flatten(), nn.Linear(4, 2)),
                        input_shape=(1, 2, 2), n_classes=2, class_names=("n", "y"))
    flat = at.Dataset(inputs=np.arange(8, dtype=np.float32).reshape(2, 4), labels=[0, 1],
                      feature_names=["p0", "p1", "p2", "p3"])
    checked = at.check_data(flat, model)
    assert checked.inputs.shape == (2, 1, 2, 2) and checked.class_names == ("n", "y")
    assert checked.feature_names is None


def test_check_data_names_the_shape_problem():
    with pytest.raises(at.AttributionError, match=r"shape \[3\] \(3 values\); the data has \[2\] "
                                                   r"\(2 feature columns\)"):
        at.check_data(at.Dataset(inputs=INPUTS[:, :2]), picker_model())


def test_check_data_rejects_labels_outside_the_model_classes():
    with pytest.raises(at.AttributionError, match=r"1 label\(s\) are outside the model's "
                                                   r"classes 0..1 \(e.g. 2\)"):
        at.check_data(at.Dataset(inputs=INPUTS, labels=[0, 1, 2, 0]), picker_model())


def test_check_data_rejects_single_sample_clusters():
    dataset = at.Dataset(inputs=INPUTS, labels=LABELS, clusters=["p", "p", "p", "lonely"])
    with pytest.raises(at.AttributionError, match=r"too small: 'lonely' \(1\). Merge them "
                                                   "with others in the data's cluster ids"):
        at.check_data(dataset, picker_model())
    at.check_clusters(dataset.clusters, min_size=1)
    with pytest.raises(at.AttributionError, match="no samples"):
        at.check_clusters(np.array([]))


# ---------------------------------------------------------------- cluster sources

class PanicException(BaseException):
    """What pyo3 raises when Rust code (the tokenizers library) panics: a BaseException, so
    an `except Exception` misses it."""


class Tokenizer:
    """A tokenizer whose encoding fails as `error`."""

    def __init__(self, error: BaseException):
        self.error = error

    def encode(self, texts):
        raise self.error


@pytest.mark.parametrize("container", ["bare", "dict"])
def test_a_tensor_numpy_cannot_hold_is_refused_with_the_projects_error(container):
    tensor = torch.zeros([1] * 70)  # numpy holds at most 64 dims
    with pytest.raises(at.AttributionError, match="could not be read"):
        at.load_data(saved(tensor if container == "bare" else {"inputs": tensor}))


def test_a_native_panic_while_reading_is_the_projects_error_and_an_interrupt_is_not():
    table = csv_bytes(pd.DataFrame({"text": ["a b", "c"], "label": [0, 1]}))
    with pytest.raises(at.AttributionError, match="PanicException: regex"):
        at.load_data(table, tokenizer=Tokenizer(PanicException("regex too big")), sandbox=False)
    with pytest.raises(KeyboardInterrupt):
        at.load_data(table, tokenizer=Tokenizer(KeyboardInterrupt()), sandbox=False)


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_])
def test_budgets_count_the_float32_the_data_becomes(dtype):
    """1.5 MB of uint8 or bool values becomes 6 MB of float32: over a 4 MB budget, in a .npy,
    in a .npz (where the arrays share the budget) and in a .pt."""
    limits = at.inputs.untrusted.limits.Limits(max_decoded_bytes=4 * 10 ** 6)
    values = np.zeros((1500, 1000), dtype)
    npy = io.BytesIO()
    np.save(npy, values)
    half = values[:750]  # 3 MB each as float32: one fits, the two together do not
    for data in (npy.getvalue(), npz_bytes(inputs=values), npz_bytes(inputs=half, more=half),
                 saved({"inputs": torch.from_numpy(values)})):
        with pytest.raises(at.AttributionError, match="max_decoded_bytes"):
            at.load_data(data, limits=limits)
    assert at.load_data(npz_bytes(inputs=half), limits=limits).inputs.shape == (750, 1000)


def test_an_inputs_array_under_another_name_is_found_by_saying_which():
    data = npz_bytes(pixel_values=np.zeros((3, 4), np.float32), labels=np.arange(3))
    with pytest.raises(at.AttributionError, match=r'features="name".*--features.*pixel_values'):
        at.load_data(data)
    assert at.load_data(data, features="pixel_values").inputs.shape == (3, 4)
    # as the README says: the model's own input name is found given input_names
    assert at.load_data(data, input_names=("pixel_values",)).inputs.shape == (3, 4)
