"""Train the built-in demo models and write every demo file (seeded, a few seconds on a CPU).

    python scripts/make_demo.py            # writes demo/
    python scripts/make_demo.py --out DIR  # writes DIR/ (the tests use this to check
                                           # that the shipped files are reproducible)
Prints each model's held-out accuracy.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from safetensors.torch import save as save_safetensors
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from attribution.inputs import huggingface
from attribution.inputs.architectures import parse_architecture
from attribution.inputs.demo import (DEMO_DIR, DEMO_FILES, DIGIT_NAMES, SANITY_CLASSES,
                                     SANITY_FEATURES, TEXT_CLASSES, TEXT_VOCABULARY, DigitsCNN,
                                     DigitsMLP, SanityModel, sanity_data, text_data)

SEED = 0
MLP_ARCHITECTURE = {"kind": "mlp", "input_shape": [64], "hidden": [32, 16], "n_classes": 10,
                    "names": ["fc1", "relu1", "fc2", "relu2", "out"],
                    "class_names": list(DIGIT_NAMES)}
CNN_ARCHITECTURE = {"kind": "cnn", "input_shape": [1, 8, 8], "channels": [8, 16],
                    "kernel_size": 3, "padding": 1, "pool": 2, "hidden": [32], "n_classes": 10,
                    "names": ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten",
                              "fc1", "relu3", "out"],
                    "class_names": list(DIGIT_NAMES)}


def train(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *, epochs: int,
          lr: float, batch_size: int = 64, weight_decay: float = 0.0) -> nn.Module:
    """Mini-batch Adam on cross-entropy with a seeded shuffle; returns the model in eval mode."""
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(inputs), generator=generator)
        for start in range(0, len(inputs), batch_size):
            index = order[start:start + batch_size]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[index]), labels[index]).backward()
            optimizer.step()
    return model.eval()


def accuracy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(inputs).argmax(dim=1) == labels).float().mean())


def export(model: nn.Module, example: torch.Tensor, path: Path, class_names) -> None:
    """Save as a torch.export program with a dynamic batch dim and the class names."""
    example = example.clone()  # a view would save its whole base tensor as the sample input
    program = torch.export.export(model.eval(), (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    for node in program.graph.nodes:  # source paths of this machine: not for shipped files
        node.meta.pop("stack_trace", None)
    torch.export.save(program, path,
                      extra_files={"class_names.json": json.dumps(list(class_names))})


def write_readme(out: Path, accuracies: dict[str, float]) -> None:
    lines = [
        "# Demo files",
        "",
        "Written by `python scripts/make_demo.py` (seeded; trained on scikit-learn's digits "
        "and on synthetic data). Each file is also a template for your own uploads.",
        "",
        "| file | size | what it is |",
        "|---|---|---|",
    ]
    for demo_file in DEMO_FILES:
        path = out / demo_file.name
        size = sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() \
            else path.stat().st_size
        lines.append(f"| `{demo_file.name}` | {size / 1024:.1f} KiB | {demo_file.description} |")
    lines += [
        "",
        "Held-out accuracy: " + ", ".join(f"{name} {value:.1%}"
                                          for name, value in accuracies.items()) + ".",
        "",
        "## Exporting your own model (recommended: no code needed to load it)",
        "",
        "```python",
        "import json, torch",
        "model.eval()",
        "example = inputs[:8]  # a few real samples, at least 2, shaped like the model's input",
        "ep = torch.export.export(model, (example,),",
        "                         dynamic_shapes=({0: torch.export.Dim('batch')},))",
        "torch.export.save(ep, 'model.pt2',",
        "                  extra_files={'class_names.json': json.dumps(class_names)})  # optional",
        "```",
        "",
        "The model must take one tensor `[batch, ...]` and return logits `[batch, n_classes]`.",
        "Also accepted: a state dict (`torch.save(model.state_dict(), 'w.pt')` or "
        "`.safetensors`) together with an architecture description like "
        "`digits_mlp_architecture.json` (kinds `mlp` and `cnn`; `names` lists one module name "
        "per layer so the keys match). Whole pickled models (`torch.save(model)`) and Python "
        "architecture files run code, so they load only with `trust_code=True` on your own "
        "machine; TorchScript files cannot be hooked and are refused.",
        "",
        "## Data layouts",
        "",
        "- `.npz` / `.pt`: `inputs` `[N, ...]` (any shape the model takes: `[N, F]` tables, "
        "`[N, C, H, W]` images), optional `labels` `[N]` (class ids), `clusters` `[N]` (ids or "
        "names), `cluster_names`, `feature_names`, `class_names`, `image_shape` (`[H, W]` or "
        "`[C, H, W]`: a table of pixels is drawn as images). A `.pt` may also hold a "
        "tensor of inputs or an `(inputs, labels)` tuple; it is read with "
        "`weights_only=True`.",
        "- `.npy`: the inputs array alone.",
        "- `.csv` / `.parquet`: one row per sample with a header; a `label` column, an "
        "optional `cluster` column, every other column a numeric feature (see "
        "`digits_sample.csv`). Flattened images work when the count matches the model's "
        "input; `image_shape=\"8x8\"` (`--image-shape 8x8`, or the dashboard's Image shape box) "
        "draws them as images.",
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(out: Path) -> dict[str, float]:
    torch.set_num_threads(1)  # tiny models: one thread is fastest and runs the same everywhere
    out.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    train_x, test_x, train_y, test_y = train_test_split(
        pixels, digits.target, test_size=0.4, random_state=SEED, stratify=digits.target)
    train_x, test_x = torch.from_numpy(train_x), torch.from_numpy(test_x)
    train_y, test_y = torch.from_numpy(train_y).long(), torch.from_numpy(test_y).long()
    accuracies = {}

    torch.manual_seed(SEED)
    mlp = train(DigitsMLP(), train_x, train_y, epochs=60, lr=3e-3)
    accuracies["digits_mlp"] = accuracy(mlp, test_x, test_y)
    export(mlp, test_x[:8], out / "digits_mlp.pt2", DIGIT_NAMES)
    parity = np.where(test_y.numpy() % 2 == 0, "even", "odd")
    np.savez_compressed(out / "digits.npz", inputs=test_x.numpy(), labels=test_y.numpy(),
                        clusters=parity, feature_names=[f"pixel_{i}" for i in range(64)],
                        class_names=list(DIGIT_NAMES), image_shape=np.array([8, 8]))
    torch.save(mlp.state_dict(), out / "digits_mlp_state_dict.pt")
    (out / "digits_mlp_architecture.json").write_text(
        json.dumps(parse_architecture(MLP_ARCHITECTURE).to_dict(), indent=2) + "\n")
    rows = np.random.default_rng(SEED).choice(len(test_x), size=200, replace=False)
    table = {f"pixel_{i}": test_x.numpy()[rows, i] for i in range(64)}
    table.update(label=test_y.numpy()[rows], cluster=parity[rows])
    pd.DataFrame(table).to_csv(out / "digits_sample.csv", index=False, float_format="%g")

    torch.manual_seed(SEED)
    images_train, images_test = train_x.reshape(-1, 1, 8, 8), test_x.reshape(-1, 1, 8, 8)
    cnn = train(DigitsCNN(), images_train, train_y, epochs=40, lr=3e-3)
    accuracies["digits_cnn"] = accuracy(cnn, images_test, test_y)
    export(cnn, images_test[:8], out / "digits_cnn.pt2", DIGIT_NAMES)
    np.savez_compressed(out / "digits_images.npz", inputs=images_test.numpy(),
                        labels=test_y.numpy(), class_names=list(DIGIT_NAMES))
    (out / "digits_cnn_state_dict.safetensors").write_bytes(
        save_safetensors({k: v.contiguous() for k, v in cnn.state_dict().items()}))
    (out / "digits_cnn_architecture.yaml").write_text(
        yaml.safe_dump(parse_architecture(CNN_ARCHITECTURE).to_dict(), sort_keys=False,
                       default_flow_style=None, width=100))

    torch.manual_seed(SEED)
    sanity_train_x, sanity_train_y = sanity_data(1000, seed=SEED)
    sanity_test_x, sanity_test_y = sanity_data(600, seed=SEED + 1)
    sanity = train(SanityModel(), torch.from_numpy(sanity_train_x),
                   torch.from_numpy(sanity_train_y), epochs=30, lr=1e-2, weight_decay=1e-2)
    accuracies["sanity"] = accuracy(sanity, torch.from_numpy(sanity_test_x),
                                    torch.from_numpy(sanity_test_y))
    export(sanity, torch.from_numpy(sanity_test_x[:8]), out / "sanity.pt2", SANITY_CLASSES)
    np.savez_compressed(out / "sanity.npz", inputs=sanity_test_x, labels=sanity_test_y,
                        feature_names=list(SANITY_FEATURES), class_names=list(SANITY_CLASSES))

    accuracies["text"] = text_demo(out)
    write_readme(out, accuracies)
    return accuracies


def text_demo(out: Path) -> float:
    """Train the text demo's BERT and write its folder and data; its held-out accuracy."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification

    vocabulary = {word: index for index, word in enumerate(TEXT_VOCABULARY)}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", vocabulary["[CLS]"])])
    encoder = huggingface.TextEncoder(tokenizer, pad_id=vocabulary["[PAD]"], max_length=16)
    train_texts, train_y, _ = text_data(3000, seed=SEED)
    test_texts, test_y, test_clusters = text_data(600, seed=SEED + 1)
    train_x, _ = encoder.encode(train_texts)
    test_x, test_tokens = encoder.encode(test_texts)
    config = BertConfig(vocab_size=len(vocabulary), hidden_size=24, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=48, max_position_embeddings=16,
                        type_vocab_size=1, num_labels=2, pad_token_id=vocabulary["[PAD]"],
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        id2label=dict(enumerate(TEXT_CLASSES)),
                        label2id={name: i for i, name in enumerate(TEXT_CLASSES)})
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(12):
        order = torch.randperm(len(train_texts), generator=generator)
        for start in range(0, len(order), 64):
            index = order[start:start + 64]
            optimizer.zero_grad()
            logits = model(**dict(train_x[index].items())).logits
            nn.functional.cross_entropy(logits, torch.from_numpy(train_y)[index]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(**dict(test_x.items())).logits.argmax(1).numpy()
    folder = out / "text_classifier"
    model.save_pretrained(folder)
    tokenizer.save(str(folder / huggingface.TOKENIZER))
    np.savez_compressed(out / "text.npz", input_ids=test_x["input_ids"].numpy(),
                        attention_mask=test_x["attention_mask"].numpy(), labels=test_y,
                        tokens=test_tokens, clusters=test_clusters,
                        class_names=list(TEXT_CLASSES))
    return float((predicted == test_y).mean())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEMO_DIR, help="output folder")
    for demo, value in main(parser.parse_args().out).items():
        print(f"{demo}: held-out accuracy {value:.1%}")
