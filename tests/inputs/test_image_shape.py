"""Data that declares its image shape (`image_shape`): a table of pixels is drawn as images on
the Neuron page and in the report. Declared in a .npz/.pt (`image_shape` array), or given to
`load_data`, `--image-shape` or the dashboard's Image shape box; checked against the data."""
import io
import re

import numpy as np
import pandas as pd
import pytest
import torch

import attribution as at
from attribution import cli
from attribution.analyses.neuron import input_kind, neuron_view
from attribution.analyses.settings import AnalysisSettings
from attribution.inputs.demo import DEMO_DIR
from attribution.presentation import plots
from attribution.presentation.report import collect_report, render_report


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def pixels(n: int = 12, shape=(3, 4)) -> np.ndarray:
    return np.random.default_rng(0).random((n, int(np.prod(shape))), dtype=np.float32)


def test_a_data_file_declares_its_image_shape_or_is_given_one():
    x = pixels()
    assert at.load_data(npz(inputs=x, image_shape=np.array([3, 4]))).image_shape == (3, 4)
    pt = io.BytesIO()
    torch.save({"inputs": torch.tensor(x), "image_shape": torch.tensor([1, 3, 4])}, pt)
    assert at.load_data(pt.getvalue()).image_chw == (1, 3, 4)
    table = pd.DataFrame(x, columns=[f"p{i}" for i in range(12)]).assign(label=0)
    data = at.load_data(table.to_csv(index=False).encode(), image_shape="3x4")
    assert data.image_shape == (3, 4) and data.image_chw == (1, 3, 4)
    assert data.feature_names[0] == "p0"  # still a table: the columns keep their names
    assert at.load_data(npz(inputs=x)).image_shape is None  # a table stays a table
    assert at.load_data(npz(inputs=x.reshape(12, 1, 3, 4))).image_chw == (1, 3, 4)  # its own
    rgb = at.load_data(npz(inputs=pixels(shape=(3, 2, 2))), image_shape=(3, 2, 2))
    assert rgb.image_chw == (3, 2, 2)


@pytest.mark.parametrize("shape, message", [
    ("5x5", "holds 25 values, but each sample has 12"),
    ((2, 3, 2), "1, 3 or 4 channels"),
    ("3 by 4", "write it as HxW or CxHxW"),
    ((12,), "give \\(height, width\\)"),
    (np.ones(10**6, dtype=np.int64), "holds 1000000 values"),  # refused before it is read
    (np.array(["3", "4"]), "of dtype <U1"),
])
def test_an_image_shape_that_does_not_fit_the_data_is_refused_with_the_reason(shape, message):
    with pytest.raises(at.AttributionError, match=message):
        at.load_data(npz(inputs=pixels()), image_shape=shape)
    with pytest.raises(at.AttributionError, match="named inputs or integer ids"):
        at.load_data(npz(input_ids=np.zeros((4, 6), dtype=np.int64)), image_shape="2x3")


def test_the_digits_demo_declares_8x8_and_survives_the_check_against_its_model():
    loaded, data = at.load_demo("digits_mlp")
    assert data.image_shape == (8, 8) and data.inputs.shape[1:] == (64,)
    cnn = at.load_model(DEMO_DIR / "digits_cnn.pt2")  # the same pixels reshaped for a CNN
    reshaped = at.check_data(at.load_data(DEMO_DIR / "digits.npz"), cnn)
    assert reshaped.inputs.shape[1:] == (1, 8, 8) and reshaped.image_chw == (1, 8, 8)


def test_a_neuron_of_a_table_of_pixels_is_shown_with_its_samples_as_images():
    loaded, data = at.load_demo("digits_mlp")
    model, x, y = loaded.module, data.inputs, data.labels
    scores = at.neuron_scores(model, "relu2", x, y, "gradient_x_activation").numpy()
    activations = at.neuron_scores(model, "relu2", x, y, "activation").numpy()
    focus = y.numpy() == 3
    view = neuron_view(model, "relu2", x, y, scores, activations, focus, 5, n_examples=4,
                       image_shape=data.image_shape)
    assert view.input_kind == "image" and input_kind(x) == "table"
    for _, example in view.examples.iterrows():  # each sample's own pixels, row by row
        np.testing.assert_array_equal(example["input"],
                                      x[example["sample"]].numpy().reshape(1, 8, 8))
    figure = plots.example_images(view.examples, neuron=5)
    mosaic = np.asarray(figure.data[0].z, dtype=float)
    first = view.examples.iloc[0]
    image = first["input"][0]
    scaled = (image - image.min()) / (image.max() - image.min())
    band = 4  # the caption band above each 8-pixel-high tile
    np.testing.assert_allclose(mosaic[band:band + 8, :8], scaled, rtol=1e-6)


def test_the_report_draws_the_top_neurons_samples_as_images_for_image_data(tmp_path):
    loaded, data = at.load_demo("digits_mlp")
    settings = AnalysisSettings(layer="relu2", cluster=3, n_random=2)
    content = collect_report(loaded, data, settings)
    assert content.examples is not None and content.examples["input"].iloc[0].shape == (1, 8, 8)
    assert "the samples that activate it most" in render_report(content)
    sanity, tabular = at.load_demo("sanity")  # a table of features: no images
    assert collect_report(sanity, tabular, AnalysisSettings(layer="concat", n_random=2)
                          ).examples is None


def test_the_command_line_takes_an_image_shape_for_its_report(tmp_path, capsys):
    table = tmp_path / "digits.csv"
    with np.load(DEMO_DIR / "digits.npz") as archive:
        frame = pd.DataFrame(archive["inputs"][:200], columns=[f"p{i}" for i in range(64)])
        frame["label"] = archive["labels"][:200]
    frame.to_csv(table, index=False)
    common = ["report", "--model", str(DEMO_DIR / "digits_mlp.pt2"), "--data", str(table),
              "--layer", "relu2", "--n-random", "2", "--quiet"]
    assert cli.main([*common, "--image-shape", "8x8", "--out", str(tmp_path / "a.html")]) == 0
    assert "the samples that activate it most" in (tmp_path / "a.html").read_text()
    assert cli.main([*common, "--out", str(tmp_path / "b.html")]) == 0
    assert "the samples that activate it most" not in (tmp_path / "b.html").read_text()
    with pytest.raises(SystemExit):
        cli.main([*common, "--image-shape", "8 by 8", "--out", str(tmp_path / "c.html")])
    assert re.search(r"HxW or CxHxW", capsys.readouterr().err)
