"""A classifier of an image and a table together: named inputs of different per-sample shapes,
each batched on its own, through the API, the command line and the dashboard, equal to the
eager model given a dict of the two."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution import cli
from attribution.engine.model_io import NamedInputs
from attribution.inputs.data import check_data
from attribution.inputs.data_files import load_data
from tests.support.app import app_pages, assert_clean, run_app, upload

OCTET = "application/octet-stream"
N = 40
METHODS = ("gradient", "gradient_x_activation", "integrated_gradients", "conductance",
           "ablation")


class ImageAndTable(nn.Module):
    """image [N, 1, 8, 8] and tab [N, 5] -> logits [N, 3]."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.tab_fc = nn.Linear(5, 6)
        self.head = nn.Linear(10, 3)

    def forward(self, image, tab):
        pooled = torch.relu(self.conv(image)).mean((2, 3))
        return self.head(torch.cat([pooled, torch.relu(self.tab_fc(tab))], 1))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """(eager model, inputs dict, labels, folder with model.pt2, data.npz and data.pt)."""
    folder = tmp_path_factory.mktemp("multimodal")
    torch.manual_seed(0)
    model = ImageAndTable().eval()
    inputs = {"image": torch.randn(N, 1, 8, 8), "tab": torch.randn(N, 5)}
    labels = torch.arange(N) % 3
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (), {k: v[:4] for k, v in inputs.items()},
                                  dynamic_shapes={"image": {0: batch}, "tab": {0: batch}})
    torch.export.save(program, folder / "model.pt2")
    np.savez(folder / "data.npz", image=inputs["image"].numpy(), tab=inputs["tab"].numpy(),
             labels=labels.numpy())
    torch.save({**inputs, "labels": labels}, folder / "data.pt")
    return model, inputs, labels, folder


def expected(case, layer, method):
    model, inputs, labels, _ = case
    return at.neuron_scores(model, layer, NamedInputs(inputs), labels, method, n_steps=16)


def test_a_pt2_of_an_image_and_a_table_loads_with_each_inputs_own_shape(case):
    model, inputs, _, folder = case
    loaded = at.load_model(folder / "model.pt2")
    assert loaded.input_names == ("image", "tab") and loaded.n_classes == 3
    assert loaded.named_specs() == {"image": ((1, 8, 8), torch.float32),
                                    "tab": ((5,), torch.float32)}
    example = loaded.example_input(3)
    assert example["image"].shape == (3, 1, 8, 8) and example["tab"].shape == (3, 5)
    names = [info.name for info in loaded.layers()]
    assert {"conv", "tab_fc", "head"} <= set(names)


@pytest.mark.parametrize("data_file", ["data.npz", "data.pt"])
@pytest.mark.parametrize("layer", ["conv", "tab_fc"])
def test_its_scores_from_a_file_equal_the_eager_model_given_a_dict(case, data_file, layer):
    _, inputs, labels, folder = case
    loaded = at.load_model(folder / "model.pt2")
    data = check_data(load_data(folder / data_file, input_names=loaded.input_names), loaded)
    assert isinstance(data.inputs, NamedInputs) and set(data.inputs.keys()) == {"image", "tab"}
    torch.testing.assert_close(data.inputs["image"], inputs["image"])
    torch.testing.assert_close(data.labels, labels)
    for method in METHODS:
        for batch_size in (7, 64):  # each input batched on its own rows
            torch.testing.assert_close(
                at.neuron_scores(loaded.module, layer, data.inputs, data.labels, method,
                                 n_steps=16, batch_size=batch_size),
                expected(case, layer, method), rtol=1e-4, atol=1e-6)


def test_a_tuple_of_the_two_inputs_is_told_to_be_a_dict(case):
    model, inputs, labels, _ = case
    pair = (inputs["image"], inputs["tab"])
    with pytest.raises(at.AttributionError, match=r"a dict of named inputs \{argument name"):
        at.list_layers(model, pair)
    with pytest.raises(at.AttributionError, match="forward takes more than one input: pass a "
                                                  "dict of named inputs"):
        at.neuron_scores(model, "conv", inputs["image"], labels)


def test_an_input_of_the_wrong_rank_names_that_inputs_own_shape(case, tmp_path):
    _, inputs, labels, folder = case
    loaded = at.load_model(folder / "model.pt2")
    np.savez(tmp_path / "flat.npz", image=inputs["image"].numpy(),
             tab=inputs["tab"].numpy()[:, :, None], labels=labels.numpy())
    with pytest.raises(at.AttributionError, match=r"Input 'tab' has shape \[40, 5, 1\]; the "
                                                  r"model expects \[N, \.\.\.\] like its "
                                                  r"example \[N, 5\]"):
        check_data(load_data(tmp_path / "flat.npz", input_names=loaded.input_names), loaded)


def test_the_command_line_scores_it_as_the_api_does(case, tmp_path, capsys):
    _, _, _, folder = case
    code = cli.main([str(a) for a in (
        "score", "--model", folder / "model.pt2", "--data", folder / "data.npz", "--layer",
        "conv", "--method", "gradient", "integrated_gradients", "--n-steps", "16", "--out",
        tmp_path / "scores.csv", "--per-sample", tmp_path / "s.npy")])
    assert code == 0, capsys.readouterr().err
    for method in ("gradient", "integrated_gradients"):
        np.testing.assert_allclose(np.load(tmp_path / f"s.{method}.npy"),
                                   expected(case, "conv", method).numpy(), rtol=1e-4,
                                   atol=1e-6)


def test_the_dashboard_takes_it_on_every_page(case):
    _, _, _, folder = case
    app = upload(run_app(), ("m.pt2", (folder / "model.pt2").read_bytes(), OCTET),
                 ("d.npz", (folder / "data.npz").read_bytes(), OCTET))
    assert_clean(app)
    assert not app.error, [e.value for e in app.error]
    assert app.metric[0].value == str(N)
    data = app.session_state["context"].ws.data
    assert data.inputs["image"].shape == (N, 1, 8, 8) and data.inputs["tab"].shape == (N, 5)
    for page in app_pages(leave_out=("pages/data.py",)):  # uploaded there
        app.switch_page(page).run()
        assert_clean(app)
        assert not app.error, (page, [e.value for e in app.error])
        if page == "pages/neuron.py":
            assert any(info.value.startswith("Inputs of shape image 1 x 8 x 8, tab 5 are not "
                                             "drawn") for info in app.info), \
                [info.value for info in app.info]


def test_a_named_input_the_program_needs_is_never_silently_left_out(tmp_path):
    """A graph net's .pt2 takes x and adj: data loaded without the model's input names holds
    x only, and the data check refuses it naming adj and the fix (before: accepted, then a
    kwarg mismatch blamed on the feature count); with them, it scores."""
    from tests.support.families import family

    model, x = family("graph")
    at.save_pt2(model, {key: value[:4] for key, value in x.items()}, tmp_path / "g.pt2")
    np.savez(tmp_path / "g.npz", x=x["x"].numpy(), adj=x["adj"].numpy(),
             labels=np.arange(48) % 3)
    loaded = at.load_model(tmp_path / "g.pt2")
    with pytest.raises(at.AttributionError, match=r"without adj\. .*input_names=loaded"):
        at.check_data(at.load_data(tmp_path / "g.npz"), loaded)
    data = at.check_data(at.load_data(tmp_path / "g.npz", input_names=loaded.input_names),
                         loaded)
    assert at.neuron_scores(loaded.module, "act", data.inputs, data.labels).shape == (48, 16)
