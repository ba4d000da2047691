"""The built-in demo: three small classifiers whose files ship in `demo/` (made by
`scripts/make_demo.py`), and helpers that load them the way a user's upload is loaded.

- "digits_mlp": scikit-learn's 8x8 digits, 64 pixels in [0, 1] -> fc1 (32) -> fc2 (16) -> 10.
- "digits_cnn": the same digits as [1, 8, 8] images -> two conv blocks -> fc1 (32) -> 10.
- "sanity": three features, one `Linear(1, w) -> ReLU` branch each, concatenated into a linear
  head; the label is the sign of feature 1, so branch 1 (neurons w..2w-1 of layer "concat")
  is the right answer for any importance score.
- "text": a two-layer BERT (transformers' BertForSequenceClassification, a save_pretrained
  folder with its tokenizer) reading generated reviews of a small vocabulary; a review is
  positive when its sentiment words sum to > 0, "not" flipping the word after it.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .data import Dataset, check_data
from .data_files import load_data
from ..errors import AttributionError
from .loaded import LoadedModel
from .model_formats import load_model
from .shipped import DEMO_DIR

DIGIT_NAMES = tuple("zero one two three four five six seven eight nine".split())
SANITY_CLASSES = ("negative", "positive")
SANITY_FEATURES = ("x0", "x1", "x2")


class DigitsMLP(nn.Module):
    """[B, 64] pixels in [0, 1] -> logits [B, 10]; two hidden layers."""

    def __init__(self, hidden: tuple[int, int] = (32, 16)):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden[0])
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.relu2 = nn.ReLU()
        self.out = nn.Linear(hidden[1], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


class DigitsCNN(nn.Module):
    """[B, 1, 8, 8] images in [0, 1] -> logits [B, 10]; a conv neuron is a channel."""

    def __init__(self, channels: tuple[int, int] = (8, 16), hidden: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)                          # -> [B, c0, 4, 4]
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)                          # -> [B, c1, 2, 2]
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(channels[1] * 4, hidden)
        self.relu3 = nn.ReLU()
        self.out = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.out(self.relu3(self.fc1(self.flatten(x))))


class Branch(nn.Module):
    """One input feature [B, 1] -> w non-negative units [B, w]."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(1, width)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.linear(x))


class Concat(nn.Module):
    """Concatenate [B, w] parts along dim 1 (a module, so the joined units can be scored)."""

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        return torch.cat(parts, dim=1)


class SanityModel(nn.Module):
    """[B, 3] -> logits [B, 2]; branch k reads only feature k; "concat" holds all 3w units."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.branch0 = Branch(width)
        self.branch1 = Branch(width)
        self.branch2 = Branch(width)
        self.concat = Concat()
        self.head = nn.Linear(3 * width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joined = self.concat(self.branch0(x[:, 0:1]), self.branch1(x[:, 1:2]),
                             self.branch2(x[:, 2:3]))
        return self.head(joined)


TEXT_CLASSES = ("negative", "positive")
TEXT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]")
TEXT_POSITIVE = ("good", "great", "fun", "love", "brilliant")
TEXT_NEGATIVE = ("bad", "dull", "awful", "hate", "boring")
TEXT_FILLER = ("the", "movie", "plot", "was", "and", "film", "acting", "story", "it", "really")
TEXT_VOCABULARY = TEXT_SPECIAL + TEXT_POSITIVE + TEXT_NEGATIVE + ("not",) + TEXT_FILLER


def text_data(n: int, seed: int, words: tuple[int, int] = (3, 10)
              ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(n reviews of 3..10 words, labels [n] (1 = positive), clusters [n]: "negated" when a
    "not" flips a sentiment word, else "plain"). A review's score is the sum of +1 per
    positive and -1 per negative word, a word after "not" counting with the opposite sign;
    reviews scoring 0 are drawn again."""
    rng = np.random.default_rng(seed)
    polarity = {**{w: 1 for w in TEXT_POSITIVE}, **{w: -1 for w in TEXT_NEGATIVE}}
    texts, labels, clusters = [], [], []
    while len(texts) < n:
        length = int(rng.integers(words[0], words[1] + 1))
        kinds = rng.choice(3, size=length, p=[0.35, 0.15, 0.5])  # sentiment, not, filler
        review = [str(rng.choice(TEXT_POSITIVE + TEXT_NEGATIVE)) if kind == 0 else "not"
                  if kind == 1 else str(rng.choice(TEXT_FILLER)) for kind in kinds]
        signs = [-1 if i > 0 and review[i - 1] == "not" else 1 for i in range(length)]
        score = sum(sign * polarity.get(word, 0) for word, sign in zip(review, signs))
        if score == 0:
            continue
        texts.append(" ".join(review))
        labels.append(int(score > 0))
        clusters.append("negated" if any(sign < 0 and word in polarity
                                         for word, sign in zip(review, signs)) else "plain")
    return texts, np.asarray(labels, dtype=np.int64), np.asarray(clusters)


def sanity_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [n, 3] standard normal, labels [n] = 1 where feature 1 > 0 else 0)."""
    inputs = np.random.default_rng(seed).standard_normal((n, 3)).astype(np.float32)
    return inputs, (inputs[:, 1] > 0).astype(np.int64)


@dataclass(frozen=True)
class DemoFile:
    """A file in `demo/`: its name, what it is, and which demo uses it (None: a sample)."""

    name: str
    description: str
    demo: str | None = None

    @property
    def path(self) -> Path:
        return DEMO_DIR / self.name

    @property
    def download_name(self) -> str:
        return self.name + ".zip" if self.path.is_dir() else self.name

    def content(self) -> bytes:
        """The file's bytes; a folder's files as a zip (what an upload of it takes)."""
        if not self.path.is_dir():
            return self.path.read_bytes()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(self.path.iterdir()):
                archive.writestr(zipfile.ZipInfo(f"{self.name}/{path.name}"), path.read_bytes())
        return buffer.getvalue()

    def size(self) -> int:
        """Bytes on disk (a folder's files together)."""
        paths = sorted(self.path.iterdir()) if self.path.is_dir() else [self.path]
        return sum(path.stat().st_size for path in paths)


DEMO_FILES = (
    DemoFile("digits_mlp.pt2", "torch.export program of the digits MLP (fc1 32, fc2 16 "
             "units), class names stored in the archive", "digits_mlp"),
    DemoFile("digits.npz", "held-out digits: inputs [N, 64] float32 in [0, 1], labels [N], "
             "clusters [N] (\"even\"/\"odd\"), feature_names, class_names, image_shape [8, 8] "
             "(the 64 pixels are drawn as 8 x 8 images)", "digits_mlp"),
    DemoFile("digits_cnn.pt2", "torch.export program of the digits CNN (conv1 8, conv2 16 "
             "channels, fc1 32 units)", "digits_cnn"),
    DemoFile("digits_images.npz", "the same held-out digits as images: inputs [N, 1, 8, 8], "
             "labels [N], class_names", "digits_cnn"),
    DemoFile("sanity.pt2", "torch.export program of the three-branch sanity model; branch 1 "
             "(neurons 4-7 of layer \"concat\") decides the label", "sanity"),
    DemoFile("sanity.npz", "synthetic data for it: inputs [N, 3] standard normal, labels = "
             "(x1 > 0), feature_names, class_names", "sanity"),
    DemoFile("text_classifier", "Hugging Face save_pretrained folder (config.json, "
             "model.safetensors, tokenizer.json) of a two-layer BERT for generated reviews; "
             "loaded with transformers' own class, no code from the folder", "text"),
    DemoFile("text.npz", "held-out reviews: input_ids and attention_mask [N, T] (padded on "
             "the right), labels, tokens [N, T], clusters (\"negated\"/\"plain\"), "
             "class_names", "text"),
    DemoFile("digits_mlp_state_dict.pt", "sample state dict (torch.save(model.state_dict())) "
             "of the digits MLP; load it with digits_mlp_architecture.json"),
    DemoFile("digits_mlp_architecture.json", "sample architecture description (JSON) matching "
             "digits_mlp_state_dict.pt"),
    DemoFile("digits_cnn_state_dict.safetensors", "sample safetensors state dict of the "
             "digits CNN; load it with digits_cnn_architecture.yaml"),
    DemoFile("digits_cnn_architecture.yaml", "sample architecture description (YAML) matching "
             "digits_cnn_state_dict.safetensors"),
    DemoFile("digits_sample.csv", "sample table: columns pixel_0..pixel_63, label, cluster; "
             "200 held-out rows; works with any digits model"),
)
DEMOS = ("digits_mlp", "digits_cnn", "sanity", "text")


def demo_files() -> list[DemoFile]:
    """Every file of the demo folder, models and samples, in a stable order."""
    return list(DEMO_FILES)


def load_demo(name: str = "digits_mlp") -> tuple[LoadedModel, Dataset]:
    """(model, validated data) of one demo; its files ship with the package, so they are read
    without the jail."""
    if name not in DEMOS:
        raise AttributionError(f"Unknown demo {name!r}; choose one of {', '.join(DEMOS)}.")
    model_file, data_file = (f for f in DEMO_FILES if f.demo == name)
    if not model_file.path.exists():
        raise AttributionError(f"The demo file {model_file.path} is missing; run "
                               "`python scripts/make_demo.py` to recreate the demo folder.")
    model = load_model(model_file.path, sandbox=False)  # shipped with the package: trusted
    return model, check_data(load_data(data_file.path, sandbox=False), model)
