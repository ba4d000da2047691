"""Every call leaves the model exactly as found: parameters, buffers, modes and every module
attribute, on model families the project was not built on (a Swin that adapts its window to
small inputs, a model that counts its calls and caches, a bfloat16 CNN, named inputs), and a
model that changes its own parameters when it runs is refused with the reason."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses import settings
from attribution.engine import model_io
from tests.support.families import FAMILIES, assert_same_state, family, state_of


def _first(x, n=2):
    return {key: value[:n] for key, value in x.items()} if isinstance(x, dict) else x[:n]


def _taken_away_and_back(pruned, x, folder):
    """`pruned` saved as a .pt2 (or, where torch.export cannot read that back, as a Hugging
    Face folder) and loaded: its logits are the pruned copy's."""
    try:
        loaded = at.load_model(at.save_pt2(pruned, _first(x)))
    except at.AttributionError as error:
        assert "cannot read it back" in str(error)
        at.save_folder(pruned, folder / "pruned")
        loaded = at.load_model(folder / "pruned")
    rows = _first(x, 6)
    with torch.no_grad():
        expected = model_io.logits_of(model_io.call(pruned, rows)).float()
        got = model_io.logits_of(model_io.call(loaded.module, rows)).float()
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * (1 + expected.abs().max()))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_call_leaves_the_model_as_found(name, tmp_path):
    model, x = family(name)
    model.train()  # a user's model may come in train mode: it goes back to it
    model.get_submodule(next(n for n, _ in model.named_modules() if n)).eval()
    before = state_of(model)
    layers = at.list_layers(model, _first(x))
    assert_same_state(model, before, "list_layers")
    layer = settings.default_layer(layers)
    scores = at.neuron_scores(model, layer, x, None, "gradient_x_activation", batch_size=20)
    at.neuron_scores(model, layer, x, None, "ablation", batch_size=20)
    assert_same_state(model, before, "neuron_scores")
    ranking = scores.abs().mean(0)
    at.pruning_curve(model, layer, x, None, ranking, ks=[0, 1, 3], n_random=2)
    assert_same_state(model, before, "pruning_curve")
    at.diagnose(model, layer, x, None, clusters=np.arange(len(scores)) % 2, n_random=2)
    assert_same_state(model, before, "diagnose")
    at.scorecard(model, x, None, layers=[layer], methods=["gradient", "ablation", "random"],
                 n_boot=20, n_random=2, curve_points=2)
    assert_same_state(model, before, "scorecard")
    _taken_away_and_back(at.prune(model, layer, ranking, 2, inputs=x), x, tmp_path)
    assert_same_state(model, before, "prune, save and load")


def test_a_swin_listed_on_halved_images_still_runs_at_its_own_size():
    """Swin shrinks a stage's window_size to fit a small input, for good: listing its layers
    (which runs it on halved and doubled inputs) made every later call fail."""
    model, x = family("swin")
    with torch.no_grad():
        expected = model(x[:4]).logits
    at.list_layers(model, x[:2])
    with torch.no_grad():
        assert torch.equal(model(x[:4]).logits, expected)


class Stateful(nn.Module):
    """Counts its calls, keeps the last batch size in a list and a dict, adds an attribute,
    and updates a buffer in place on every call, as caches and running statistics do."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)
        self.calls = 0
        self.sizes: list[int] = []
        self.cache: dict[str, int] = {}
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        self.sizes.append(x.shape[0])
        self.cache["last"] = x.shape[0]
        self.last_input_shape = tuple(x.shape)
        self.seen += x.shape[0]
        return self.fc2(self.act(self.fc1(x)))


def test_a_model_that_changes_its_own_attributes_and_buffers_is_put_back():
    model = Stateful()
    x = torch.randn(30, 5)
    before = state_of(model)
    at.list_layers(model, x[:2])
    at.neuron_scores(model, "act", x, None, "gradient", batch_size=7)
    at.pruning_curve(model, "act", x, None, torch.arange(8.0), n_random=2)
    assert_same_state(model, before, "a stateful model")
    assert model.calls == 0 and model.sizes == [] and model.cache == {}
    assert not hasattr(model, "last_input_shape") and float(model.seen) == 0.0


class NormalisesItsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x):
        with torch.no_grad():
            self.fc1.weight.div_(self.fc1.weight.norm())
        return self.fc2(self.act(self.fc1(x)))


def test_a_model_that_changes_its_own_parameters_is_refused_with_the_reason():
    with pytest.raises(at.AttributionError, match=r"changed its own parameter fc1\.weight"):
        at.neuron_scores(NormalisesItsWeight(), "act", torch.randn(6, 5), None, "gradient")
