"""Transformers as users have them: BERT and GPT-2 classifiers built from small configs (no
downloads), named inputs with padding, outputs of every kind, save_pretrained folders (and
hostile ones), tokenized text, and the command line on all of it."""
import collections
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attribution as at
from attribution.methods.scores import ScoreFacts
from attribution import cli
from attribution.analyses import distributed
from attribution.inputs import huggingface
from attribution.inputs import demo as demo_module
from attribution.inputs.data import check_data
from attribution.inputs.data_files import load_data
from attribution.methods.paths import gauss_legendre
from attribution.engine.model_io import NamedInputs, logits_of, select_output

from tests.support.models import groups
from tests.support.references import replaced_output
from tests.support import ROOT
from tests.support.app import app_pages

transformers = pytest.importorskip("transformers")

VOCAB = 40
PAD = 0
N_STEPS = 8
with torch.device("meta"):  # modules every transformer has (lrp's rules cover none of them)
    TRANSFORMER_MODULES = nn.Sequential(nn.Embedding(2, 2), nn.LayerNorm(2), nn.GELU())
METHODS_FOR_IDS = [m for m in at.methods_for(torch.int64, model=TRANSFORMER_MODULES)
                   if all(m in at.methods_for(torch.int64, kind)  # those of LAYERS' kinds
                          for kind in ("Linear", "Conv1D", "LayerNorm"))]
# (model kind, a position-wise MLP layer, a layer after the position mixing)
LAYERS = {"bert": ("bert.encoder.layer.0.intermediate.dense", "bert.pooler.dense"),
          "gpt2": ("transformer.h.0.mlp.c_fc", "transformer.ln_f")}


def build(kind: str, seed: int = 0) -> nn.Module:
    """A small BERT or GPT-2 sequence classifier (3 classes), weights large enough that
    scores are far from zero."""
    torch.manual_seed(seed)
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=24, max_position_embeddings=32, num_labels=3,
            pad_token_id=PAD, initializer_range=0.3)
        return transformers.BertForSequenceClassification(config).eval()
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2,
                                     n_positions=32, num_labels=3, pad_token_id=PAD,
                                     bos_token_id=1, eos_token_id=1, initializer_range=0.3)
    return transformers.GPT2ForSequenceClassification(config).eval()


def padded_batch(n: int = 6, length: int = 7, seed: int = 1) -> dict:
    """input_ids and attention_mask [n, length]: real tokens first, then padding (right)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (n, length), generator=generator)
    lengths = torch.randint(2, length + 1, (n,), generator=generator)
    lengths[0] = length  # one full row
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return {"input_ids": ids * mask + PAD * (1 - mask), "attention_mask": mask}


def pad_to(batch: dict, length: int) -> dict:
    extra = length - batch["input_ids"].shape[1]
    return {name: torch.cat([value, torch.full((value.shape[0], extra), PAD if name ==
                                               "input_ids" else 0, dtype=value.dtype)], 1)
            for name, value in batch.items()}


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def case(request):
    model = build(request.param)
    batch = padded_batch(n=4)
    with torch.no_grad():
        targets = model(**batch).logits.argmax(1)
    return request.param, model, batch, targets


# ------------------------------------------------------------------ slow references

def _one_sample(batch: dict, i: int) -> dict:
    """Sample i alone, cut to its real tokens: no padding at all."""
    length = int(batch["attention_mask"][i].sum())
    return {name: value[i:i + 1, :length] for name, value in batch.items()}


def _layer_out(model, module, sample):
    store = {}

    def keep(out):
        store["z"] = out.clone()  # returning None leaves the output as it is

    with torch.no_grad(), replaced_output(module, keep):
        model(**sample)
    return store["z"]  # [1, T, F]


def slow_scores(model, layer: str, batch: dict, targets, method: str,
                steps=None) -> torch.Tensor:
    """Per sample without padding, one neuron at a time: [N, F] with the sequence's
    positions summed (mean for activation); integrated gradients with each sample's `steps`
    (default N_STEPS)."""
    module = dict(model.named_modules())[layer]
    rows = []
    for i in range(batch["input_ids"].shape[0]):
        sample, target = _one_sample(batch, i), int(targets[i])
        z = _layer_out(model, module, sample)
        positions = z.dim() == 3  # [1, T, F], or [1, F] after the positions are mixed
        if method == "activation":
            rows.append(z[0].mean(0) if positions else z[0])
        elif method == "ablation":
            with torch.no_grad():
                base = model(**sample).logits[0, target]
                effects = []
                for j in range(z.shape[-1]):
                    def zeroed(out, j=j):
                        out = out.clone()
                        out[..., j] = 0
                        return out
                    with replaced_output(module, zeroed):
                        effects.append(base - model(**sample).logits[0, target])
            rows.append(torch.stack(effects))
        else:
            nodes = [(1.0, 1.0)] if method != "integrated_gradients" else \
                list(zip(*gauss_legendre(N_STEPS if steps is None else int(steps[i]))))
            total = torch.zeros_like(z)
            for weight, alpha in nodes:
                leaf = (alpha * z).requires_grad_(True)
                with replaced_output(module, lambda out: leaf * 1):
                    logit = model(**sample).logits[0, target]
                (grad,) = torch.autograd.grad(logit, leaf)
                total += weight * grad
            value = total if method == "gradient" else total * z
            rows.append(value[0].sum(0) if positions else value[0])
    return torch.stack(rows)


# ------------------------------------------------------------------ outputs

def test_every_kind_of_output_gives_its_logits():
    logits = torch.randn(4, 3)
    hidden = torch.randn(4, 5, 2)
    pair = collections.namedtuple("Pair", "hidden logits")(hidden, logits)
    model_output = transformers.modeling_outputs.SequenceClassifierOutput(logits=logits)
    for output in (logits, (logits,), {"logits": logits, "hidden": hidden}, pair,
                   model_output, (hidden, logits), {"features": hidden, "scores": logits}):
        assert logits_of(output) is logits
    assert logits_of((logits, torch.randn(4, 7)), 1).shape == (4, 7)
    assert logits_of({"a": torch.randn(4, 2), "b": logits}, "b") is logits
    assert logits_of(pair, "logits") is logits and logits_of(model_output, 0) is logits
    for output, key, words in (({"a": hidden, "b": hidden}, None, "holds no logits"),
                               ({"a": hidden}, None, "returned [4, 5, 2]"),
                               ((logits,), "logits", "no entry 'logits'"),
                               ({"a": logits}, 5, "no entry 5"),
                               (logits, "logits", "no entry"),
                               ({"a": logits, "h": hidden}, "h", "[4, 5, 2]")):
        with pytest.raises(at.AttributionError, match=words.replace("[", r"\[")):
            logits_of(output, key)


class TwoHeads(nn.Module):
    """Returns (auxiliary logits, the logits that matter) as a dict."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(5, 8)
        self.aux, self.main = nn.Linear(8, 2), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"aux": self.aux(h), "main": self.main(h)}


def test_select_output_chooses_the_logits_for_every_function():
    torch.manual_seed(0)
    model, x = TwoHeads().eval(), torch.randn(10, 5)
    first = at.neuron_scores(model, "body", x, method="ablation")  # default: the first [N, C]
    select_output(model, "main")
    try:
        chosen = at.neuron_scores(model, "body", x, method="ablation")
        with torch.no_grad():
            targets = model(x)["main"].argmax(1)
            expected = []
            for j in range(8):
                def zeroed(out, j=j):
                    out = out.clone()
                    out[:, j] = 0
                    return out
                with replaced_output(model.body, zeroed):
                    ablated = model(x)["main"].gather(1, targets[:, None])[:, 0]
                expected.append(model(x)["main"].gather(1, targets[:, None])[:, 0] - ablated)
        torch.testing.assert_close(chosen, torch.stack(expected, 1))
        assert not torch.allclose(first, chosen)
        curve = at.pruning_curve(model, "body", x, None, chosen.abs().mean(0), n_random=2)
        assert curve["ranked"].iloc[0] == 1.0  # accuracy against the "main" head's own answers
    finally:
        select_output(model, None)


# ------------------------------------------------------------------ scores against references

@pytest.mark.parametrize("method", ["gradient", "activation", "gradient_x_activation",
                                    "integrated_gradients", "ablation"])
def test_scores_of_padded_batches_match_per_sample_loops_without_padding(case, method):
    kind, model, batch, targets = case
    for layer in LAYERS[kind]:
        facts = ScoreFacts()
        scores = at.neuron_scores(model, layer, batch, targets, method=method, batch_size=4,
                                  n_steps=N_STEPS, facts=facts)
        reference = slow_scores(model, layer, batch, targets, method,
                                facts.sums.steps if facts.sums else None)
        torch.testing.assert_close(scores, reference, rtol=1e-4, atol=1e-5)
        assert scores.abs().max() > 1e-3


def test_gradient_x_activation_matches_captum(case):
    from captum.attr import LayerGradientXActivation

    kind, model, batch, targets = case
    layer = LAYERS[kind][0]

    def forward(input_ids, attention_mask):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    captum = LayerGradientXActivation(forward, dict(model.named_modules())[layer]).attribute(
        batch["input_ids"], additional_forward_args=(batch["attention_mask"],),
        target=targets)  # [N, T, F]; padding gets no gradient in a model that masks it
    real = batch["attention_mask"][:, :, None].to(captum.dtype)
    torch.testing.assert_close(
        at.neuron_scores(model, layer, batch, targets, "gradient_x_activation"),
        (captum * real).sum(1), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close((captum * (1 - real)).abs().sum(), torch.tensor(0.0))


def test_gpt2_mlp_neurons_are_features_not_positions():
    model = build("gpt2")
    batch = padded_batch(length=9)
    info = {layer.name: layer for layer in at.list_layers(model, batch)}
    c_fc = info["transformer.h.0.mlp.c_fc"]
    assert c_fc.n_neurons == model.config.n_inner or c_fc.n_neurons == 4 * model.config.n_embd
    assert at.neuron_scores(model, c_fc.name, batch, method="gradient").shape == (6, c_fc.n_neurons)


@pytest.mark.parametrize("method", METHODS_FOR_IDS)
def test_padding_a_batch_to_a_longer_length_changes_no_score(case, method):
    kind, model, batch, targets = case
    longer = pad_to(batch, batch["input_ids"].shape[1] + 5)
    for layer in LAYERS[kind]:
        options = dict(method=method, n_steps=8, clusters=groups(batch))
        short = at.neuron_scores(model, layer, batch, targets, **options)
        long = at.neuron_scores(model, layer, longer, targets, **options)
        torch.testing.assert_close(long, short, rtol=1e-4, atol=1e-6)


def test_padding_changes_no_cluster_table_and_no_curve(case):
    kind, model, batch, targets = case
    layer = LAYERS[kind][0]
    longer = pad_to(batch, batch["input_ids"].shape[1] + 3)
    clusters = np.array(["a", "b"] * 2)
    for inputs in (batch, longer):
        table = at.cluster_scores(model, layer, inputs, targets, clusters, "gradient")
        if inputs is batch:
            first = table
    pd.testing.assert_frame_equal(table, first, rtol=1e-4, atol=1e-6)
    ranking = first.drop(columns="n").abs().mean().to_numpy()
    curves = [at.pruning_curve(model, layer, inputs, targets, ranking, n_random=3,
                               metric="target_logit", ks=[0, 3, 8])
              for inputs in (batch, longer)]
    pd.testing.assert_frame_equal(curves[1], curves[0], rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        unpruned = model(**batch).logits.gather(1, targets[:, None]).mean()
    assert curves[0]["ranked"].iloc[0] == pytest.approx(float(unpruned), rel=1e-5)


def test_named_inputs_stream_shard_and_diagnose(case):
    kind, model, batch, targets = case
    layer = LAYERS[kind][0]
    whole = at.neuron_scores(model, layer, batch, targets, "gradient")
    loader = [dict(input_ids=batch["input_ids"][i:i + 3],
                   attention_mask=batch["attention_mask"][i:i + 3], labels=targets[i:i + 3])
              for i in range(0, 4, 3)]  # batches of 3 and 1
    torch.testing.assert_close(at.neuron_scores(model, layer, loader, "labels", "gradient"),
                               whole)
    pieces = [list(distributed.shards(batch, rank, 2)) for rank in range(2)]
    assert [piece[0].size for piece in pieces] == [2, 2]
    sharded = torch.cat([at.neuron_scores(model, layer, piece[0].inputs,
                                          targets[piece[0].rows()], "gradient")
                         for piece in pieces])
    torch.testing.assert_close(sharded, whole)
    findings = at.diagnose(model, layer, batch, targets, "gradient", n_random=3)
    assert {finding.code for finding in findings} >= {"non_finite", "not_better_than_random"}
    assert "conductance" not in at.oracle_agreement(model, layer, batch, targets,
                                                   top_k=3)["method"].tolist()


# ------------------------------------------------------------------ files

def test_npz_of_named_inputs_and_an_explicit_list(tmp_path):
    model = build("bert")
    batch = padded_batch()
    arrays = {name: value.numpy() for name, value in batch.items()}
    tokens = np.where(batch["attention_mask"].numpy() == 1, "w", "")
    np.savez(tmp_path / "auto.npz", **arrays, labels=np.arange(6) % 3, tokens=tokens)
    np.savez(tmp_path / "chosen.npz", ids=arrays["input_ids"], mask=arrays["attention_mask"],
             labels=np.arange(6) % 3)
    dataset = load_data(tmp_path / "auto.npz")
    assert isinstance(dataset.inputs, NamedInputs) and dataset.tokens.shape == (6, 7)
    assert list(dataset.inputs.keys()) == ["input_ids", "attention_mask"]
    chosen = load_data(tmp_path / "chosen.npz", features=["ids", "mask"])
    assert list(chosen.inputs.keys()) == ["ids", "mask"]
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    loaded = at.load_model(folder)
    checked = check_data(dataset, loaded)
    torch.testing.assert_close(at.neuron_scores(loaded.module, "bert.pooler.dense",
                                                checked.inputs, checked.labels, "gradient"),
                               at.neuron_scores(model, "bert.pooler.dense", batch,
                                                torch.arange(6) % 3, "gradient"))
    with pytest.raises(at.AttributionError, match="takes the inputs input_ids"):
        check_data(chosen, loaded)


def test_a_pt2_of_two_named_inputs_loads_and_scores(tmp_path):
    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.hidden, self.out = nn.Embedding(VOCAB, 8), nn.Linear(8, 6), \
                nn.Linear(6, 3)

        def forward(self, input_ids, attention_mask):
            h = torch.relu(self.hidden(self.embed(input_ids)))
            weights = attention_mask[..., None].to(h.dtype)
            return {"logits": self.out((h * weights).sum(1) / weights.sum(1))}

    torch.manual_seed(0)
    model, batch = Pooled().eval(), padded_batch()
    batch_dim = torch.export.Dim("batch")
    for name, program in (
            ("positional", torch.export.export(model, (batch["input_ids"],
                                                       batch["attention_mask"]),
                                               dynamic_shapes=({0: batch_dim}, {0: batch_dim}))),
            ("keywords", torch.export.export(model, (), dict(batch), dynamic_shapes={
                "input_ids": {0: batch_dim}, "attention_mask": {0: batch_dim}}))):
        torch.export.save(program, tmp_path / f"{name}.pt2")
        loaded = at.load_model(tmp_path / f"{name}.pt2")
        assert loaded.input_names == ("input_ids", "attention_mask")
        for method in ("gradient", "ablation"):
            torch.testing.assert_close(
                at.neuron_scores(loaded.module, "hidden", batch, method=method),
                at.neuron_scores(model, "hidden", batch, method=method), rtol=1e-5, atol=1e-6)


def _folder_files(model: nn.Module, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_a_save_pretrained_folder_round_trips_as_a_path_files_and_a_zip(kind, tmp_path):
    model = build(kind)
    folder = _folder_files(model, tmp_path, kind)
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as writer:
        for name, data in files.items():
            writer.writestr(f"{kind}/{name}", data)
    batch = padded_batch()
    with torch.no_grad():
        expected = model(**batch).logits
    zipped = tmp_path / f"{kind}.zip"  # the zip by path takes the upload's route
    zipped.write_bytes(archive.getvalue())
    for source in (folder, files, archive.getvalue(), zipped, io.BytesIO(archive.getvalue())):
        loaded = (at.load_model(source) if not isinstance(source, dict)
                  else huggingface.load_folder(source))
        assert loaded.source_format == "Hugging Face" and loaded.n_classes == 3
        assert loaded.input_names[:2] == ("input_ids", "attention_mask")
        with torch.no_grad():
            torch.testing.assert_close(loaded.module(**batch).logits, expected)
        layers = {layer.name: layer for layer in loaded.layers()}
        assert layers[LAYERS[kind][0]].shape[0] == huggingface.EXAMPLE_LENGTH


def test_an_image_classifier_folder_takes_image_arrays_and_every_method(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=24, num_labels=3)
    model = transformers.ViTForImageClassification(config).eval()
    loaded = at.load_model(_folder_files(model, tmp_path, "vit"))  # keys renamed on load
    assert loaded.input_names == ("pixel_values",) and loaded.input_shape == (1, 8, 8)
    images = torch.rand(5, 1, 8, 8)
    dataset = check_data(load_data(_npz_bytes(inputs=images.numpy(), labels=np.arange(5) % 3)),
                         loaded)
    assert isinstance(dataset.inputs, NamedInputs)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(pixel_values=images).logits,
                                   model(pixel_values=images).logits)
    info = next(info for info in loaded.layers() if info.n_neurons == 24)
    layer = info.name
    assert "conductance" in at.methods_for(torch.float32, info.kind)
    for method in at.methods_for(torch.float32, info.kind, loaded.module):  # conductance too
        scores = at.neuron_scores(loaded.module, layer, dataset.inputs, dataset.labels, method,
                                  n_steps=8, clusters=dataset.labels.numpy())
        assert scores.shape == (5, 24) and torch.isfinite(scores).all()


def test_data_under_the_models_own_input_name_is_found_by_the_api_and_the_cli(tmp_path,
                                                                           capsys):
    """A ViT folder takes pixel_values: a .npz keyed pixel_values is its inputs (the name was
    refused: "name it one of inputs, x, ..."); a key no rule knows is refused with the
    model's own name first and the option that chooses (features= / --features)."""
    from attribution import cli

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=24, num_labels=3)
    folder = _folder_files(transformers.ViTForImageClassification(config).eval(), tmp_path,
                           "vit")
    loaded = at.load_model(folder)
    images, labels = torch.rand(6, 1, 8, 8), np.arange(6) % 3
    (tmp_path / "own.npz").write_bytes(_npz_bytes(pixel_values=images.numpy(), labels=labels))
    for sandbox in (None, False):
        dataset = check_data(load_data(tmp_path / "own.npz", input_names=loaded.input_names,
                                       sandbox=sandbox), loaded)
        torch.testing.assert_close(dataset.inputs["pixel_values"], images)
    code = cli.main([str(a) for a in ("score", "--model", folder, "--data",
                                      tmp_path / "own.npz", "--layer", "vit.layernorm",
                                      "--method", "gradient", "--out", tmp_path / "s.csv")])
    assert code == 0, capsys.readouterr().err
    (tmp_path / "odd.npz").write_bytes(_npz_bytes(pictures=images.numpy(), labels=labels))
    with pytest.raises(at.AttributionError, match=r"name it one of pixel_values, inputs, x"
                                                  r".*features=.*--features"):
        load_data(tmp_path / "odd.npz", input_names=loaded.input_names)


def _npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _hostile(tmp_path: Path, name: str, edit=None, weights: str = "model.safetensors") -> Path:
    folder = _folder_files(build("bert"), tmp_path, name)
    config = json.loads((folder / "config.json").read_text())
    if edit is not None:
        edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    if weights != "model.safetensors":
        torch.save(build("bert").state_dict(), folder / weights)
        (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.parametrize("name, edit, weights, words", [
    ("auto_map", lambda c: c.update(auto_map={"AutoModelForSequenceClassification":
                                              "modeling_evil.Evil"}),
     "model.safetensors", "auto_map"),
    ("unknown_type", lambda c: c.update(model_type="evilnet"), "model.safetensors",
     "model_type 'evilnet'"),
    ("other_class", lambda c: c.update(architectures=["BertForMaskedLM"]),
     "model.safetensors", "BertForSequenceClassification"),
    ("pickle_weights", None, "pytorch_model.bin", "pickled"),
    ("huge_vocab", lambda c: c.update(vocab_size=10 ** 9), "model.safetensors",
     "vocab_size"),
    ("huge_model", lambda c: c.update(hidden_size=8192, intermediate_size=65536,
                                      num_attention_heads=8, num_hidden_layers=200),
     "model.safetensors", "max_parameters"),
    ("quantized", lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}),
     "model.safetensors", "quantization_config"),
    ("missing_weights", lambda c: c.update(num_hidden_layers=3), "model.safetensors",
     "lacks .* weight"),
    ("nested_auto_map", lambda c: c.update(text_config={"auto_map": {
        "AutoModel": "modeling_evil.Evil"}}), "model.safetensors", "text_config.auto_map"),
    ("listed_auto_map", lambda c: c.update(sub_configs=[{}, {"trust_remote_code": True}]),
     "model.safetensors", r"sub_configs\[1\].trust_remote_code"),
    ("attention_kernel", lambda c: c.update(attn_implementation="kernels-community/evil"),
     "model.safetensors", "attn_implementation = 'kernels-community/evil'"),
    ("nested_attention_kernel", lambda c: c.update(
        vision_config={"_attn_implementation": "flash_attention_2"}), "model.safetensors",
     "vision_config._attn_implementation"),
    ("deep", lambda c: c.update(deep=_nested(40)), "model.safetensors", "deeper than 32"),
])
def test_hostile_folders_are_refused(tmp_path, name, edit, weights, words):
    folder = _hostile(tmp_path, name, edit, weights)
    with pytest.raises(at.AttributionError, match=words):
        at.load_model(folder)


def test_a_second_config_in_a_subfolder_is_refused_not_silently_chosen(tmp_path):
    """A zip or an upload whose files flatten to two config.json: neither may win unseen."""
    folder = _folder_files(build("bert"), tmp_path, "bert")
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    other = json.dumps({**json.loads(files["config.json"]), "num_labels": 7}).encode()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as writer:
        for name, content in files.items():
            writer.writestr(f"bert/{name}", content)
        writer.writestr("bert/nested/config.json", other)
    for source in (archive.getvalue(), {**files, "nested/config.json": other}):
        with pytest.raises(at.AttributionError, match="2 files named config.json"):
            at.load_model(source)


def test_a_config_nested_past_the_json_parser_is_refused_with_the_projects_error(tmp_path):
    folder = _hostile(tmp_path, "deeper_than_the_parser")
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(at.AttributionError, match="nests"):
        at.load_model(folder)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_own_attention_implementations_load(tmp_path, attention):
    folder = _hostile(tmp_path, attention, lambda c: c.update(attn_implementation=attention))
    assert at.load_model(folder).n_classes == build("bert").config.num_labels


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {word: index for index, word in enumerate(["[PAD]", "[UNK]", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def test_a_text_column_is_tokenized_with_the_folders_tokenizer(tmp_path):
    model = build("bert")
    folder = _folder_files(model, tmp_path, "bert")
    _word_tokenizer([f"w{i}" for i in range(VOCAB - 2)]).save(str(folder / "tokenizer.json"))
    loaded = at.load_model(folder)
    table = pd.DataFrame({"text": ["w1 w2 w3", "w5 nope", "w7 w8 w9 w10 w11"],
                          "label": [0, 1, 2]})
    table.to_csv(tmp_path / "texts.csv", index=False)
    dataset = check_data(load_data(tmp_path / "texts.csv", tokenizer=loaded.tokenizer), loaded)
    assert dataset.tokens.tolist()[1] == ["w5", "[UNK]", "", "", ""]
    assert dataset.inputs["attention_mask"].sum(1).tolist() == [3, 2, 5]
    assert dataset.inputs["input_ids"][0, :3].tolist() == [3, 4, 5]  # w1 is id 3
    scores = at.neuron_scores(loaded.module, LAYERS["bert"][0], dataset.inputs,
                              dataset.labels, "gradient")
    direct = at.neuron_scores(model, LAYERS["bert"][0], {
        "input_ids": torch.tensor([[3, 4, 5]]), "attention_mask": torch.ones(1, 3).long()},
        torch.tensor([0]), "gradient")
    torch.testing.assert_close(scores[:1], direct, rtol=1e-4, atol=1e-6)


def test_token_texts_are_cut_for_display_so_one_long_token_costs_nothing(tmp_path):
    """A tokenizer whose unknown token is 20,000 characters: numpy would store every
    position of every row at that width (1.8 GB over 600 rows)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attribution.inputs.huggingface import MAX_TOKEN_CHARS

    model = build("bert")
    folder = _folder_files(model, tmp_path, "bert")
    unknown = "U" * 20_000
    tokenizer = Tokenizer(models.WordLevel({"[PAD]": 0, unknown: 1, "w2": 2}, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    loaded = at.load_model(folder)
    table = pd.DataFrame({"text": ["w2 nope", "what w2 never"], "label": [0, 1]})
    dataset = load_data(table.to_csv(index=False).encode(), tokenizer=loaded.tokenizer)
    assert dataset.tokens.dtype.itemsize == 4 * MAX_TOKEN_CHARS
    assert dataset.tokens.tolist()[0][:2] == ["w2", "U" * (MAX_TOKEN_CHARS - 1) + "…"]
    assert dataset.inputs["input_ids"].tolist() == [[2, 1, 0], [1, 2, 1]]


# ------------------------------------------------------------------ command line

def test_the_command_line_on_a_folder_and_named_inputs(tmp_path, capsys):
    model = build("gpt2")
    folder = _folder_files(model, tmp_path, "gpt2")
    batch, labels = padded_batch(n=8), np.arange(8) % 3
    arrays = {name: value.numpy() for name, value in batch.items()}
    np.savez(tmp_path / "named.npz", **arrays, labels=labels)
    np.savez(tmp_path / "renamed.npz", ids=arrays["input_ids"], mask=arrays["attention_mask"],
             labels=labels)
    np.savez(tmp_path / "with_x.npz", x=np.zeros((8, 3), np.float32), labels=labels, **arrays)
    layer = LAYERS["gpt2"][0]
    common = ["--model", folder, "--data", tmp_path / "named.npz", "--layer", layer]
    score = subprocess.run(  # one real process: the whole path, as a user runs it
        [sys.executable, "-m", "attribution", "score", *map(str, common), "--method",
         "gradient", "ablation", "--out", str(tmp_path / "scores.csv"), "--per-sample",
         str(tmp_path / "s.npy"), "--output", "logits"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert score.returncode == 0, score.stderr
    targets = torch.as_tensor(labels)
    for method in ("gradient", "ablation"):
        np.testing.assert_allclose(np.load(tmp_path / f"s.{method}.npy"), at.neuron_scores(
            model, layer, batch, targets, method).numpy(), rtol=1e-4, atol=1e-6)

    def run(*args):
        code = cli.main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, out, err = run("layers", "--model", folder, "--format", "json")
    assert code == 0, err
    listed = {row["name"]: row for row in json.loads(out)}
    assert listed[layer]["neurons"] == 4 * model.config.n_embd
    with zipfile.ZipFile(tmp_path / "gpt2.zip", "w") as writer:  # the folder zipped
        for path in folder.iterdir():
            writer.write(path, f"gpt2/{path.name}")
    code, out, err = run("layers", "--model", tmp_path / "gpt2.zip", "--format", "json")
    assert code == 0, err
    assert json.loads(out) == list(listed.values())
    code, _, err = run("curve", *common, "--n-random", "3", "--ks", "0,8,32",
                       "--out", tmp_path / "curve.csv")
    assert code == 0, err
    assert len(pd.read_csv(tmp_path / "curve.csv")) == 3
    code, _, err = run("diagnose", *common, "--n-random", "3", "--out",
                       tmp_path / "findings.json")
    assert code in (0, 1), err  # 1: a finding says problem
    assert json.loads((tmp_path / "findings.json").read_text())
    code, _, err = run("score", "--model", folder, "--data", tmp_path / "with_x.npz", "--layer",
                       layer, "--input-names", "input_ids,attention_mask", "--method",
                       "gradient", "--out", tmp_path / "chosen.csv", "--per-sample",
                       tmp_path / "c.npy")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"),
                               np.load(tmp_path / "s.gradient.npy"), rtol=1e-6)
    code, _, err = run("score", "--model", folder, "--data", tmp_path / "renamed.npz",
                       "--layer", layer, "--input-names", "ids,mask", "--out",
                       tmp_path / "x.csv")
    assert code == 2 and "takes the inputs input_ids" in err
    code, _, err = run("score", *common, "--output", "hidden", "--out", tmp_path / "y.csv")
    assert code == 2 and "no entry 'hidden'" in err


# ------------------------------------------------------------------ the text demo

@pytest.fixture(scope="module")
def text_demo():
    return at.load_demo("text")


def test_the_text_demo_loads_scores_and_separates_positions_from_features(text_demo):
    model, dataset = text_demo
    assert model.source_format == "Hugging Face" and model.class_names == ("negative",
                                                                           "positive")
    accuracy = (at.predict_classes(model, dataset.inputs) == dataset.labels).float().mean()
    assert accuracy >= 0.9
    layers = {info.name: info for info in model.layers()}
    mlp = layers["bert.encoder.layer.1.intermediate.dense"]
    assert mlp.shape == (huggingface.EXAMPLE_LENGTH, mlp.n_neurons) and mlp.neuron_axis == 2
    assert mlp.n_neurons == model.module.config.intermediate_size
    assert layers["bert.pooler.dense"].shape == (model.module.config.hidden_size,)
    subset = dataset.inputs[:40]
    for method in METHODS_FOR_IDS:
        scores = at.neuron_scores(model.module, mlp.name, subset, dataset.labels[:40],
                                  method=method, n_steps=8, clusters=dataset.clusters[:40])
        assert scores.shape == (40, mlp.n_neurons) and torch.isfinite(scores).all()
    table = at.cluster_scores(model.module, mlp.name, subset, dataset.labels[:40],
                              dataset.clusters[:40], "gradient")
    assert set(table.index) == {"negated", "plain"}
    assert dataset.tokens[0, 0] == "[CLS]"
    assert (dataset.tokens != "").sum(1).tolist() == dataset.inputs["attention_mask"].sum(
        1).tolist()


def test_token_scores_add_up_to_the_sample_scores(text_demo):
    model, dataset = text_demo
    layer, neuron, n = "bert.encoder.layer.0.intermediate.dense", 5, 30
    inputs, targets = dataset.inputs[:n], dataset.labels[:n]
    per_token = at.token_scores(model.module, layer, inputs, neuron, targets,
                                tokens=dataset.tokens[:n])
    assert list(per_token.columns) == ["sample", "position", "token", "score"]
    assert len(per_token) == int(inputs["attention_mask"].sum())
    assert per_token["token"].iloc[0] == "[CLS]" and "" not in set(per_token["token"])
    summed = per_token.groupby("sample")["score"].sum().to_numpy()
    expected = at.neuron_scores(model.module, layer, inputs, targets,
                                "gradient_x_activation")[:, neuron].numpy()
    np.testing.assert_allclose(summed, expected, rtol=1e-4, atol=1e-6)
    activation = at.token_scores(model.module, layer, inputs, neuron, method="activation")
    np.testing.assert_allclose(activation.groupby("sample")["score"].mean().to_numpy(),
                               at.neuron_scores(model.module, layer, inputs, None,
                                                "activation")[:, neuron].numpy(), rtol=1e-5)
    for bad, words in ((("bert.pooler.dense", 0), "no token positions"),
                       ((layer, 10_000), "neuron must be an index")):
        with pytest.raises(at.AttributionError, match=words):
            at.token_scores(model.module, bad[0], inputs, bad[1])


def test_the_dashboard_takes_a_zipped_folder_and_a_text_table():
    from streamlit.testing.v1 import AppTest

    from attribution.inputs.demo import DEMO_FILES

    folder = next(f for f in DEMO_FILES if f.name == "text_classifier")
    texts, labels, _ = demo_module.text_data(40, seed=7)
    table = pd.DataFrame({"review": texts, "label": labels}).to_csv(index=False).encode()
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180).run()
    app.switch_page("pages/data.py").run()
    app.file_uploader(key="model_file").set_value(("bert.zip", folder.content(),
                                                    "application/zip"))
    app.file_uploader(key="data_file").set_value(("reviews.csv", table, "text/csv"))
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    assert app.metric[0].value == "40"
    length = app.session_state["context"].ws.data.inputs["input_ids"].shape[1]
    assert length != huggingface.EXAMPLE_LENGTH  # the data's texts, not the loader's example
    assert app.metric[3].value == f"input_ids {length}, attention_mask {length}"
    layers = app.dataframe[0].value  # their positions are the data's tokens
    assert layers["units"].str.startswith(f"{length} positions").any()
    # uploaded on the data page; the scorecard of every layer of a BERT takes minutes
    for page in app_pages(leave_out=("pages/data.py", "pages/trust.py")):
        app.switch_page(page).run()
        assert not app.exception, (page, [e.value for e in app.exception])
        assert not app.error, (page, [e.value for e in app.error])


def test_mean_ablation_fills_each_position_with_its_mean_over_real_tokens(case):
    kind, model, batch, targets = case
    layer = LAYERS[kind][0]
    module = dict(model.named_modules())[layer]
    store = {}

    def keep(out):
        store["z"] = out.clone()

    with torch.no_grad(), replaced_output(module, keep):
        model(**batch)
    real = batch["attention_mask"][:, :, None].to(store["z"].dtype)  # [N, T, 1]
    fill = (store["z"] * real).sum(0) / real.sum(0).clamp_min(1)  # [T, F]
    with torch.no_grad(), replaced_output(module, lambda out: fill.expand_as(out).clone()):
        expected = model(**batch).logits.gather(1, targets[:, None]).mean()
    n_neurons = store["z"].shape[-1]
    curve = at.pruning_curve(model, layer, batch, targets, np.arange(n_neurons), ks=[n_neurons],
                             ablation="mean", metric="target_logit", n_random=2)
    assert curve["ranked"].iloc[0] == pytest.approx(float(expected), rel=1e-4, abs=1e-5)


def test_a_vit_embeddings_output_has_its_features_as_neurons_not_its_patches():
    """The embeddings' parameters hold both the patch count (position embeddings [1, 5, 16])
    and the width, and a ViT refuses half-size images, so only the layers it feeds tell its
    axes apart: 16 features, not 5 positions ('channels first', dim 1, would be wrong)."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=24, num_labels=3)
    model = transformers.ViTForImageClassification(config).eval()
    images = torch.rand(4, 1, 8, 8)
    layers = {info.name: info for info in at.list_layers(model, images)}
    embeddings = layers["vit.embeddings"]
    assert (embeddings.neuron_axis, embeddings.n_neurons, embeddings.axis_rule) == (2, 16, "users")
    assert embeddings.describe() == "5 positions × 16 features"
    scores = at.neuron_scores(model, "vit.embeddings", images, None, "gradient_x_activation")
    from captum.attr import LayerGradientXActivation
    with torch.no_grad():
        predicted = model(pixel_values=images).logits.argmax(1)
    captum = LayerGradientXActivation(lambda x: model(pixel_values=x).logits,
                                      model.vit.embeddings).attribute(images, target=predicted)
    torch.testing.assert_close(scores, captum.sum(1).detach(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------ Hugging Face folders as they come

def _decoder(kind: str, eos: int | None, positions: int = 32) -> nn.Module:
    """A GPT-2 or Llama classifier saved as transformers makes them: pad_token_id None."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2,
                                         n_positions=positions, num_labels=3,
                                         bos_token_id=eos, eos_token_id=eos,
                                         initializer_range=0.3)
        model = transformers.GPT2ForSequenceClassification(config)
    else:
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=2, max_position_embeddings=positions,
                                          num_labels=3, bos_token_id=eos, eos_token_id=eos)
        model = transformers.LlamaForSequenceClassification(config)
    assert model.config.pad_token_id is None
    return model.eval()


def _texts_scored_as_alone(loaded, dataset) -> None:
    """Each text's logits in the padded batch equal its own, unpadded."""
    ids, mask = dataset.inputs["input_ids"], dataset.inputs["attention_mask"]
    with torch.no_grad():
        batch = loaded.module(input_ids=ids, attention_mask=mask).logits
        for row in range(len(ids)):
            n = int(mask[row].sum())
            alone = loaded.module(input_ids=ids[row:row + 1, :n],
                                  attention_mask=mask[row:row + 1, :n]).logits
            torch.testing.assert_close(batch[row:row + 1], alone, rtol=1e-4, atol=1e-5)


TEXTS = pd.DataFrame({"text": ["w1 w2 w3", "w5 w6", "w7 w8 w9 w10 w11 w12"], "label": [0, 1, 2]})


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_decoder_saved_without_a_pad_id_pads_with_its_tokenizers_pad_token(kind, tmp_path):
    folder = _folder_files(_decoder(kind, eos=None), tmp_path, kind)
    tokenizer = _word_tokenizer([f"w{i}" for i in range(VOCAB - 3)])
    tokenizer.add_special_tokens(["[PAD]"])
    tokenizer.save(str(folder / "tokenizer.json"))
    loaded = at.load_model(folder)
    assert loaded.input_names == ("input_ids", "attention_mask")  # no token_type_ids to ask for
    pad = tokenizer.token_to_id("[PAD]")
    assert loaded.module.config.pad_token_id == loaded.tokenizer.pad_id == pad
    dataset = check_data(load_data(TEXTS.to_csv(index=False).encode(),
                                   tokenizer=loaded.tokenizer), loaded)
    assert (dataset.inputs["input_ids"][1, 2:] == pad).all()
    _texts_scored_as_alone(loaded, dataset)
    assert at.neuron_scores(loaded.module, loaded.layers()[2].name, dataset.inputs,
                            dataset.labels).shape[0] == 3


def test_without_a_pad_token_the_end_of_text_id_pads_and_ids_must_use_it(tmp_path):
    folder = _folder_files(_decoder("gpt2", eos=2), tmp_path, "gpt2")
    loaded = at.load_model(folder)  # no tokenizer: token ids come in a .npz
    assert loaded.module.config.pad_token_id == 2
    ids, mask = np.array([[5, 6, 7], [8, 9, 0]]), np.array([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(at.AttributionError, match="At padded positions .* input_ids hold 0, "
                                                  "but GPT2ForSequenceClassification finds "
                                                  "each text's last token by pad_token_id 2"):
        check_data(load_data(_npz_bytes(input_ids=ids, attention_mask=mask)), loaded)
    ids[1, 2] = 2
    dataset = check_data(load_data(_npz_bytes(input_ids=ids, attention_mask=mask)), loaded)
    _texts_scored_as_alone(loaded, dataset)


def test_without_any_id_to_pad_with_the_error_says_what_to_set(tmp_path):
    folder = _folder_files(_decoder("gpt2", eos=VOCAB + 10), tmp_path, "gpt2")  # outside
    with pytest.raises(at.AttributionError, match=r'Set "pad_token_id" in config.json'):
        at.load_model(folder)


def test_roberta_takes_only_the_positions_after_its_pad_id(tmp_path):
    """RoBERTa counts positions from pad_token_id + 1: 12 positions with pad id 1 take 10
    tokens, and longer texts are cut there instead of failing with an index error."""
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=16,
                                        max_position_embeddings=12, pad_token_id=1,
                                        num_labels=3)
    folder = _folder_files(transformers.RobertaForSequenceClassification(config).eval(),
                           tmp_path, "roberta")
    _word_tokenizer([f"w{i}" for i in range(VOCAB - 2)]).save(str(folder / "tokenizer.json"))
    loaded = at.load_model(folder)
    assert loaded.tokenizer.max_length == 10
    long = pd.DataFrame({"text": [" ".join(f"w{i}" for i in range(1, 16)), "w1 w2"],
                         "label": [0, 1]})
    dataset = check_data(load_data(long.to_csv(index=False).encode(),
                                   tokenizer=loaded.tokenizer), loaded)
    assert dataset.inputs["input_ids"].shape == (2, 10)
    scores = at.neuron_scores(loaded.module, "roberta.encoder.layer.0.intermediate.dense",
                              dataset.inputs, dataset.labels)
    assert torch.isfinite(scores).all()


def test_texts_for_a_folder_without_a_tokenizer_say_what_is_missing(tmp_path):
    loaded = at.load_model(_folder_files(build("bert"), tmp_path, "bert"))
    assert loaded.tokenizer is None and "token_type_ids" in loaded.input_names  # BERT's segments
    with pytest.raises(at.AttributionError, match="its folder needs the tokenizer that turns "
                                                  "them into token ids: tokenizer.save_pretrained"):
        load_data(TEXTS.to_csv(index=False).encode(), tokenizer=loaded.tokenizer)


def test_a_bart_classifier_folder_loads_with_an_example_that_ends_each_text(tmp_path):
    """BART's classifier pools each text at its <eos> and refuses a text without one: the
    loader's own example texts end in the config's eos_token_id (before, every BART folder
    was refused, the message blaming the vocabulary), and its layers score real ids."""
    import transformers

    config = transformers.BartConfig(
        vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    transformers.BartForSequenceClassification(config).eval().save_pretrained(tmp_path)
    loaded = at.load_model(tmp_path)
    assert loaded.n_classes == 3 and loaded.input_names[:2] == ("input_ids", "attention_mask")
    example = dict(loaded.example_input(3).items())
    assert (example["input_ids"][:, -1] == config.eos_token_id).all()
    ids = torch.randint(3, 60, (6, 10))
    ids[:, -1] = config.eos_token_id
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    layer = "model.encoder.layers.0.fc1"
    assert at.neuron_scores(loaded.module, layer, inputs, None).shape == (6, 32)


def test_a_folder_of_a_type_not_built_here_names_the_pt2_route_which_loads_it(tmp_path):
    """A Wav2Vec2 folder is refused, the message naming the route that works: its .pt2."""
    import transformers

    config = transformers.Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, num_labels=3)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2ForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "folder")
    with pytest.raises(at.AttributionError, match=r"model_type 'wav2vec2'.*at\w*\.save_pt2"):
        at.load_model(tmp_path / "folder")
    audio = torch.randn(4, 400)
    loaded = at.load_model(at.save_pt2(model, audio[:2]))
    with torch.no_grad():
        assert torch.allclose(logits_of(loaded.module(audio)), model(audio).logits, atol=1e-5)


def test_a_folder_changed_after_it_was_accepted_is_checked_again(tmp_path, monkeypatch):
    """Acceptance was cached by the folder's path: change config.json and load again, and no
    jail request was made, the new file parsed in this process only. A folder is now read
    once, its bytes checked in the jail (known again by their digest, never by path) and
    exactly those bytes loaded here."""
    from attribution.inputs import model_formats

    folder = _folder_files(build("bert"), tmp_path, "bert")
    monkeypatch.setattr(model_formats, "_ACCEPTED", {})  # as if never seen (other tests load it)
    requests = []
    real = model_formats.first_run
    monkeypatch.setattr(model_formats, "first_run",
                        lambda source, *a, **k: requests.append(source) or real(source, *a, **k))
    at.load_model(folder)
    assert len(requests) == 1 and isinstance(requests[0], dict)  # the bytes, not the path
    at.load_model(folder)
    assert len(requests) == 1  # the same bytes: accepted before
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evilnet"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(at.AttributionError, match="model_type 'evilnet'"):
        at.load_model(folder)
    assert len(requests) == 2
