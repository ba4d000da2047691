"""The sidebar's neuron-axis choice for layers with positions, through Streamlit's AppTest."""
import numpy as np
import torch

import attribution as at
from tests.support.app import OCTET, assert_clean, run_app, sidebar_widget, upload
from tests.support.models import SequenceNet

N, T = 48, 5  # SequenceNet's per-position layers: [N, T=5, 6 features]


def _sequence_upload(tmp_path):
    torch.manual_seed(0)
    model = SequenceNet().eval()
    x, labels = torch.randn(N, T, 3), torch.arange(N) % 3
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "s.pt2")
    np.savez(tmp_path / "s.npz", inputs=x.numpy(), labels=labels.numpy())
    files = (("s.pt2", (tmp_path / "s.pt2").read_bytes(), OCTET),
             ("s.npz", (tmp_path / "s.npz").read_bytes(), OCTET))
    return model, x, labels, files


def _captions(app) -> list[str]:
    return [c.value for c in app.sidebar.caption]


def test_a_sequence_layers_neuron_axis_is_shown_chosen_and_used_everywhere(tmp_path):
    model, x, labels, files = _sequence_upload(tmp_path)
    app = upload(run_app(), *files)
    sidebar_widget(app, "w_layer").set_value("proj").run()
    assert_clean(app)
    axis = sidebar_widget(app, "w_axis")
    assert axis.options == ["positions · 5 (dim 1)", "features · 6 (dim 2, found from the data)"]
    assert axis.value == 2
    assert any(c.startswith("Neurons: 6 features along dim 2, found") for c in _captions(app))
    ctx = app.session_state["context"]
    assert (ctx.settings.layer, ctx.n_neurons) == ("proj", 6)
    assert "axis" in dict(app.query_params) and dict(app.query_params)["axis"] == "2"

    axis.set_value(1).run()  # the positions as neurons: 5 of them
    assert_clean(app)
    ctx = app.session_state["context"]
    assert (ctx.settings.layer, ctx.n_neurons) == ("proj:1", 5)
    assert "Neurons: 5 neurons along dim 1, chosen by hand." in _captions(app)
    assert dict(app.query_params)["axis"] == "1"
    expected = at.neuron_scores(model, "proj:1", x, labels, ctx.settings.method).numpy()
    np.testing.assert_allclose(ctx.scores(ctx.settings.method), expected, rtol=1e-4, atol=1e-6)
    app.switch_page("pages/pruning.py").run()  # every page computes on the chosen axis
    assert_clean(app)
    curves = app.session_state["curves"][app.session_state["context"].curve_key()]
    assert curves.attrs["n_neurons"] == 5
    app.switch_page("pages/diagnosis.py").run()  # its findings are about the chosen axis
    assert_clean(app)

    sidebar_widget(app, "w_layer").set_value("norm").run()  # another layer: its own axis
    assert sidebar_widget(app, "w_axis").value == 2
    assert app.session_state["context"].settings.layer == "norm"
    sidebar_widget(app, "w_layer").set_value("head").run()  # [N, 3]: nothing to choose
    assert_clean(app)
    assert not [w for w in app.sidebar.selectbox if w.key == "w_axis"]
    assert "axis" not in dict(app.query_params)


def test_a_link_with_a_chosen_axis_reproduces_it(tmp_path):
    model, x, labels, files = _sequence_upload(tmp_path)
    app = run_app({"source": "upload", "layer": "mix", "axis": "1", "method": "gradient"})
    app = upload(app, *files)
    assert_clean(app)
    assert sidebar_widget(app, "w_axis").value == 1
    ctx = app.session_state["context"]
    assert (ctx.settings.layer, ctx.n_neurons) == ("mix:1", 5)
    expected = at.neuron_scores(model, "mix:1", x, labels, "gradient").numpy()
    np.testing.assert_allclose(ctx.scores("gradient"), expected, rtol=1e-4, atol=1e-6)
