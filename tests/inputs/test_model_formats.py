"""Model loading: every accepted format, refusals that keep code from running, clear errors."""
import contextlib
import io
import json
import os
import pickle

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save as save_safetensors
from torch import nn

import attribution as at
from attribution.inputs.architectures import parse_architecture

from tests.support import fresh_python
from tests.support.hostile import program_edit, rebuilt, saved
from tests.support.models import token_files


class TinyMLP(nn.Module):
    """[B, 4] -> [B, 3] with hand-set weights, so outputs are literal numbers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.relu1 = nn.ReLU()
        self.out = nn.Linear(5, 3)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.arange(20.0).reshape(5, 4) / 20 - 0.4)
            self.fc1.bias.fill_(0.1)
            self.out.weight.copy_(torch.arange(15.0).reshape(3, 5) / 15 - 0.5)
            self.out.bias.zero_()

    def forward(self, x):
        return self.out(self.relu1(self.fc1(x)))


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(self.flat(torch.relu(self.conv(x))))


class Exploit:
    """A pickle that writes a marker file when unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


INPUTS = torch.linspace(-1, 1, 28).reshape(7, 4)


def exported_bytes(model, example, dynamic=True, **save_kwargs) -> bytes:
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    program = torch.export.export(model.eval(), (example,), dynamic_shapes=shapes)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, **save_kwargs)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def mlp_pt2() -> bytes:
    return exported_bytes(TinyMLP(), INPUTS[:3],
                          extra_files={"class_names.json": json.dumps(["a", "b", "c"])})


# ---------------------------------------------------------------- torch.export

def test_pt2_keeps_layer_names_scores_and_dynamic_batch(mlp_pt2, tmp_path):
    path = tmp_path / "model.pt2"
    path.write_bytes(mlp_pt2)
    original = TinyMLP().eval()
    for source in (path, str(path), mlp_pt2, io.BytesIO(mlp_pt2)):
        loaded = at.load_model(source)
        assert loaded.source_format == "torch.export"
        assert loaded.input_shape == (4,) and loaded.n_classes == 3
        assert loaded.class_names == ("a", "b", "c")
        assert not loaded.module.training
    layers = loaded.layers()
    assert [(info.name, info.kind, info.n_neurons) for info in layers] == [
        ("fc1", "Linear", 5), ("relu1", "ReLU", 5), ("out", "Linear", 3)]
    assert [info.name for info in at.list_layers(loaded.module, INPUTS[:1])] == [
        "fc1", "relu1", "out"]
    targets = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    for batch in (1, 7):
        assert loaded.module(INPUTS[:batch]).shape == (batch, 3)
    ours = at.neuron_scores(loaded.module, "fc1", INPUTS, targets, "gradient", batch_size=3)
    reference = at.neuron_scores(original, "fc1", INPUTS, targets, "gradient")
    torch.testing.assert_close(ours, reference)


def test_pt2_of_a_top_level_sequential_keeps_its_numbered_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).eval()
    loaded = at.load_model(exported_bytes(model, INPUTS[:3]))
    assert [(i.name, i.kind) for i in loaded.layers()] == [
        ("0", "Linear"), ("1", "BatchNorm1d"), ("2", "ReLU"), ("3", "Linear")]
    torch.testing.assert_close(at.neuron_scores(loaded.module, "1", INPUTS, method="ablation"),
                               at.neuron_scores(model, "1", INPUTS, method="ablation"))


def test_a_model_of_token_ids_keeps_integer_inputs_from_file_to_score(tmp_path):
    model, ids, labels = token_files(tmp_path)
    loaded = at.load_model(tmp_path / "tokens.pt2")
    assert loaded.input_dtype == torch.int64 and loaded.input_shape == (5,)
    assert [i.name for i in loaded.layers()] == ["embed", "fc1", "fc2"]
    dataset = at.check_data(at.load_data(tmp_path / "tokens.npz"), loaded)
    assert dataset.inputs.dtype == torch.int64 and torch.equal(dataset.inputs, ids)
    torch.testing.assert_close(
        at.neuron_scores(loaded.module, "fc1", dataset.inputs, dataset.labels, "ablation"),
        at.neuron_scores(model, "fc1", ids, labels, "ablation"))
    fractional = at.Dataset(inputs=ids.float() + 0.5, labels=labels)
    with pytest.raises(at.AttributionError, match="integer inputs.*sample 0"):
        at.check_data(fractional, loaded)


def test_pt2_conv_model_takes_image_shape():
    loaded = at.load_model(exported_bytes(TinyCNN(), torch.randn(2, 1, 4, 4)))
    assert loaded.input_shape == (1, 4, 4)
    assert loaded.example_input(3).shape == (3, 1, 4, 4)
    assert ("conv", "Conv2d", 2) in [(i.name, i.kind, i.n_neurons) for i in loaded.layers()]


def test_pt2_with_fixed_batch_says_how_to_reexport():
    data = exported_bytes(TinyMLP(), INPUTS[:2], dynamic=False)
    with pytest.raises(at.AttributionError, match="dynamic batch") as error:
        at.load_model(data)
    assert "Dim('batch')" in str(error.value)


def test_class_names_argument_wins_and_must_match(mlp_pt2):
    assert at.load_model(mlp_pt2, class_names=["x", "y", "z"]).class_names == ("x", "y", "z")
    with pytest.raises(at.AttributionError, match="2 class names but the model has 3"):
        at.load_model(mlp_pt2, class_names=["x", "y"])


def test_architecture_is_rejected_for_a_complete_model(mlp_pt2):
    with pytest.raises(at.AttributionError, match="only used with state dicts"):
        at.load_model(mlp_pt2, architecture={"kind": "mlp"})


def run_and_check_marker(load, marker):
    with pytest.raises(at.AttributionError, match="refused"):
        load()
    assert not marker.exists()


def sympy_payload(marker):
    def change(program):
        text = json.dumps(program).replace(
            "Symbol('s77', positive=True, integer=True)",
            f"__import__(\\u0027os\\u0027).system(\\u0027touch {marker}\\u0027)")
        program.clear()
        program.update(json.loads(text))
    return program_edit(change)


def guard_payload(marker):
    def change(program):
        program["guards_code"] = [f"__import__('os').system('touch {marker}') or True"]
    return program_edit(change)


def pickle_payload(marker):
    def edit(entries):
        config = json.loads(entries["data/weights/model_weights_config.json"])
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        entries["data/weights/model_weights_config.json"] = json.dumps(config).encode()
        entries["data/weights/" + first["path_name"]] = saved(Exploit(marker))
    return edit


@pytest.mark.parametrize("payload", [sympy_payload, guard_payload, pickle_payload])
def test_crafted_pt2_runs_code_in_plain_torch_but_is_refused_here(mlp_pt2, tmp_path, payload):
    marker = tmp_path / "ran"
    crafted = rebuilt(mlp_pt2, payload(marker))
    with contextlib.suppress(Exception):  # torch may fail after the payload has run
        torch.export.load(io.BytesIO(crafted)).module()(INPUTS)
    assert marker.exists(), "torch.export.load no longer runs this payload; update the docs"
    marker.unlink()
    run_and_check_marker(lambda: at.load_model(crafted), marker)


@pytest.mark.parametrize("edit, reason", [
    (program_edit(lambda p: p["graph_module"]["graph"]["nodes"][0].update(
        target="torch.os.system")), "torch.os.system"),
    (program_edit(lambda p: p["graph_module"]["graph"]["inputs"][-1]["as_tensor"].update(
        name="x=print(1)")), "not an identifier"),
    (program_edit(lambda p: p["graph_module"]["graph"]["nodes"][0]["metadata"].update(
        stack_trace='File "a", line 1, in f\rprint(1)')), "line breaks"),
    (lambda entries: entries.update({"data/aotinductor/model/model.so": b"\x7fELF"}),
     "does not write"),
    (lambda entries: entries.update({"data/sample_inputs/model.pt": saved(
        Exploit("/nonexistent/marker"))}), "sample inputs"),
])
def test_unsafe_archive_features_are_refused(mlp_pt2, edit, reason):
    with pytest.raises(at.AttributionError, match="refused") as error:
        at.load_model(rebuilt(mlp_pt2, edit))
    assert reason in str(error.value)
    assert "torch.export.export" in str(error.value)


def test_archive_declaring_a_tensor_without_data_is_refused(mlp_pt2):
    def empty_weight_of_huge_size(entries):
        config = json.loads(entries["data/weights/model_weights_config.json"])
        first = next(iter(config["config"].values()))
        first["tensor_meta"]["sizes"] = [{"as_int": 2 ** 40}]
        entries["data/weights/model_weights_config.json"] = json.dumps(config).encode()
        entries["data/weights/" + first["path_name"]] = b""
    with pytest.raises(at.AttributionError, match="missing tensor data"):
        at.load_model(rebuilt(mlp_pt2, empty_weight_of_huge_size))


def test_rebuilt_archive_without_changes_still_loads(mlp_pt2):
    assert at.load_model(rebuilt(mlp_pt2, lambda entries: None)).n_classes == 3


# ---------------------------------------------------------------- state dicts

MLP_DESCRIPTION = {"kind": "mlp", "input_shape": [4], "hidden": [5], "n_classes": 3,
                   "names": ["fc1", "relu1", "out"], "class_names": ["a", "b", "c"]}


@pytest.mark.parametrize("architecture", [
    MLP_DESCRIPTION, json.dumps(MLP_DESCRIPTION), json.dumps(MLP_DESCRIPTION).encode(),
    yaml.safe_dump(MLP_DESCRIPTION).encode(), parse_architecture(MLP_DESCRIPTION)])
def test_state_dict_with_description_reproduces_the_model(architecture):
    loaded = at.load_model(saved(TinyMLP().state_dict()), architecture=architecture)
    assert loaded.source_format == "state dict" and loaded.class_names == ("a", "b", "c")
    torch.testing.assert_close(loaded.module(INPUTS), TinyMLP()(INPUTS))
    assert [i.name for i in loaded.layers()] == ["fc1", "relu1", "out"]


def test_description_files_by_path(tmp_path):
    (tmp_path / "w.pt").write_bytes(saved(TinyMLP().state_dict()))
    (tmp_path / "arch.yaml").write_text(yaml.safe_dump(MLP_DESCRIPTION))
    loaded = at.load_model(tmp_path / "w.pt", architecture=tmp_path / "arch.yaml")
    torch.testing.assert_close(loaded.module(INPUTS), TinyMLP()(INPUTS))


def test_sequential_state_dict_needs_no_names_and_wrappers_are_unwrapped():
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    description = {"kind": "mlp", "input_shape": [4], "hidden": [6], "n_classes": 2,
                   "activation": "tanh"}
    wrapped = {"epoch": 3, "state_dict": {f"module.{k}": v
                                          for k, v in model.state_dict().items()}}
    loaded = at.load_model(saved(wrapped), architecture=description)
    torch.testing.assert_close(loaded.module(INPUTS), model(INPUTS))


def test_safetensors_with_cnn_description():
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(2 * 2 * 2, 3))
    description = {"kind": "cnn", "input_shape": [1, 4, 4], "channels": [2], "n_classes": 3}
    data = save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()})
    loaded = at.load_model(data, architecture=yaml.safe_dump(description).encode())
    assert loaded.source_format == "safetensors" and loaded.input_shape == (1, 4, 4)
    images = torch.randn(5, 1, 4, 4)
    torch.testing.assert_close(loaded.module(images), model(images))


def test_state_dict_without_architecture_explains_the_options():
    with pytest.raises(at.AttributionError, match="state dict") as error:
        at.load_model(saved(TinyMLP().state_dict()))
    assert "fc1.weight [5, 4]" in str(error.value) and "torch.export" in str(error.value)


def test_mismatched_state_dict_names_keys_shapes_and_suggests_names():
    description = {"kind": "mlp", "input_shape": [4], "hidden": [5], "n_classes": 3}
    with pytest.raises(at.AttributionError) as error:
        at.load_model(saved(TinyMLP().state_dict()), architecture=description)
    message = str(error.value)
    assert "missing from the file: 0.weight [5, 4]" in message
    assert "in the file but not in the architecture: fc1.weight [5, 4]" in message
    assert '"names": ["fc1", "relu1", "out"]' in message
    wrong_width = dict(MLP_DESCRIPTION, hidden=[6])
    with pytest.raises(at.AttributionError, match=r"fc1.weight file \[5, 4\] vs architecture "
                                                   r"\[6, 4\]"):
        at.load_model(saved(TinyMLP().state_dict()), architecture=wrong_width)


def test_description_errors_stay_short_even_for_a_yaml_alias_bomb():
    bomb = "[&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1], " + ", ".join(
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)) + "]"
    for key in ("hidden", "activation", "n_classes", "class_names", "kind"):
        text = f"kind: mlp\ninput_shape: [4]\nn_classes: 3\n{key}: {bomb}\n"
        with pytest.raises(at.AttributionError) as error:
            at.load_model(saved(TinyMLP().state_dict()), architecture=text.encode())
        assert len(str(error.value)) < 400


@pytest.mark.parametrize("change, message", [
    ({"kind": "rnn"}, "must be one of mlp, cnn"),
    ({"hiden": [5]}, "Unknown keys in the mlp description: hiden"),
    ({"hidden": [0]}, "integers from 1 to 65536"),
    ({"names": ["fc1", "out"]}, "3 modules (Linear, ReLU, Linear)"),
    ({"names": ["a.b", "c", "d"]}, "no dots"),
    ({"activation": "swish"}, "Unknown activation 'swish'"),
    ({"kind": "cnn", "input_shape": [4], "channels": [2]}, "[channels, height, width]"),
    ({"kind": "cnn", "input_shape": [1, 2, 2], "channels": [2, 2], "names": None},
     "shrink the [2, 2] input"),
])
def test_description_mistakes_are_explained(change, message):
    description = {key: value for key, value in dict(MLP_DESCRIPTION, **change).items()
                   if value is not None}
    with pytest.raises(at.AttributionError) as error:
        at.parse_architecture(description)
    assert message in str(error.value)


# ---------------------------------------------------------------- pickles, code, TorchScript

def test_pickled_module_is_refused_with_the_export_recipe(tmp_path):
    with pytest.raises(at.AttributionError, match="arbitrary code") as error:
        at.load_model(saved(TinyMLP()))
    assert "TinyMLP" in str(error.value) and "torch.export.save" in str(error.value)
    loaded = at.load_model(saved(TinyMLP()), trust_code=True)
    assert loaded.source_format == "pickled module" and loaded.input_shape == (4,)
    torch.testing.assert_close(loaded.module(INPUTS), TinyMLP()(INPUTS))


def test_models_and_data_refuse_pickled_objects_with_one_policy():
    """One weights-only unpickler (`untrusted.pickles.unpickle`) reads every untrusted
    pickle, and its refusal states one policy, with each caller's remedy after it."""
    from attribution.inputs.untrusted.pickles import WEIGHTS_ONLY

    with pytest.raises(at.AttributionError) as model_error:
        at.load_model(saved(TinyMLP()))
    with pytest.raises(at.AttributionError) as data_error:
        at.load_data(saved({"inputs": torch.zeros(3, 4), "note": TinyMLP()}))
    for error, remedy in ((model_error, "state_dict()"), (data_error, "torch.save({'inputs'")):
        assert "contains pickled Python objects" in str(error.value)
        assert WEIGHTS_ONLY in str(error.value) and remedy in str(error.value)
    with pytest.raises(at.AttributionError, match="damaged or not a PyTorch file"):
        at.load_data(b"\x80\x02garbage")


def test_pickled_module_of_a_conv_net_needs_its_input_shape():
    with pytest.raises(at.AttributionError, match="example_input"):
        at.load_model(saved(TinyCNN()), trust_code=True)
    loaded = at.load_model(saved(TinyCNN()), trust_code=True, example_input=(1, 4, 4))
    assert loaded.input_shape == (1, 4, 4) and loaded.n_classes == 3


@pytest.mark.parametrize("wrap", [lambda exploit: exploit,
                                  lambda exploit: {"state_dict": {"w": torch.ones(1)},
                                                   "x": exploit}])
def test_malicious_pickle_never_runs_without_trust(tmp_path, wrap):
    marker = tmp_path / "ran"
    data = saved(wrap(Exploit(marker)))
    for attempt in (lambda: at.load_model(data), lambda: at.load_data(data)):
        with pytest.raises(at.AttributionError):
            attempt()
    assert not marker.exists()
    legacy = pickle.dumps(Exploit(marker), protocol=2)
    with pytest.raises(at.AttributionError):
        at.load_model(legacy)
    assert not marker.exists()


PYTHON_ARCHITECTURE = b'''
import pathlib
from torch import nn
MARKER = pathlib.Path(__file__).with_name("imported")
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.relu1 = nn.ReLU()
        self.out = nn.Linear(5, 3)
    def forward(self, x):
        return self.out(self.relu1(self.fc1(x)))
'''


def test_python_architecture_runs_only_with_trust_code(tmp_path):
    script = tmp_path / "net.py"
    script.write_bytes(PYTHON_ARCHITECTURE + b"MARKER.touch()\n")
    weights = saved(TinyMLP().state_dict())
    for architecture in (script, script.read_bytes()):
        with pytest.raises(at.AttributionError, match="trust_code=True"):
            at.load_model(weights, architecture=architecture)
    assert not (tmp_path / "imported").exists()
    loaded = at.load_model(weights, architecture=script, trust_code=True)
    assert (tmp_path / "imported").exists()
    torch.testing.assert_close(loaded.module(INPUTS), TinyMLP()(INPUTS))


def test_python_architecture_with_build_model_from_bytes():
    source = PYTHON_ARCHITECTURE + b"class Other(nn.Module):\n    pass\n"
    weights = saved(TinyMLP().state_dict())
    with pytest.raises(at.AttributionError, match="build_model"):
        at.load_model(weights, architecture=source.replace(b"__file__", b"'x'"),
                      trust_code=True)
    with_builder = source.replace(b"__file__", b"'x'") + b"def build_model():\n    return Net()\n"
    loaded = at.load_model(weights, architecture=with_builder, trust_code=True)
    assert loaded.n_classes == 3


def test_torchscript_is_refused_with_reexport_recipe():
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(TinyMLP(), INPUTS[:2]), buffer)
    with pytest.raises(at.AttributionError, match="TorchScript") as error:
        at.load_model(buffer.getvalue(), trust_code=True)
    assert "forward hooks" in str(error.value) and "torch.export.export" in str(error.value)


# ---------------------------------------------------------------- sources and limits

def test_size_limit_and_empty_input(tmp_path, mlp_pt2):
    with pytest.raises(at.AttributionError, match="over the 0.0 MiB limit"):
        at.load_model(mlp_pt2, max_bytes=1000)
    (tmp_path / "big.pt2").write_bytes(mlp_pt2)
    with pytest.raises(at.AttributionError, match="limit"):
        at.load_model(tmp_path / "big.pt2", max_bytes=1000)
    with pytest.raises(at.AttributionError, match="empty"):
        at.load_model(b"")
    with pytest.raises(at.AttributionError, match="No such model file"):
        at.load_model(tmp_path / "missing.pt2")
    with pytest.raises(at.AttributionError, match="binary mode"):
        at.load_model(io.StringIO("text"))


def test_loaded_model_runs_and_is_eval(mlp_pt2):
    loaded = at.load_model(mlp_pt2)
    logits = loaded.module(loaded.example_input(2))
    assert logits.shape == (2, 3) and np.isfinite(logits.detach().numpy()).all()


def test_torch_exports_deserializer_is_imported_while_the_jail_runs_and_the_model_loads():
    """In a fresh process, the first jailed load of a .pt2 imports the deserializer in a
    thread while it waits for the jail (once), then loads and scores as ever."""
    script = (
        "import sys, torch\n"
        "from attribution.inputs import model_formats\n"
        "assert model_formats._DESERIALIZER not in sys.modules\n"
        "model = model_formats.load_model('demo/digits_mlp.pt2')\n"
        "assert len(model_formats._IMPORTING) == 1 and model_formats._DESERIALIZER in sys.modules\n"
        "model_formats.load_model('demo/digits_cnn.pt2')\n"
        "assert len(model_formats._IMPORTING) == 1\n"
        "print(model.n_classes)\n")
    done = fresh_python(script)
    assert done.returncode == 0 and done.stdout.strip() == "10", done.stderr
