"""Model families the project was not built on, each small and built in the test (no
downloads, no torchvision): `FAMILIES` names them, `family(name)` builds one with its inputs,
and `state_of` / `assert_same_state` hold a model's whole state (parameters, buffers, modes
and every module attribute) so a test can say the model was left exactly as found."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

N_SAMPLES = 48
N_CLASSES = 3


class TransformerClassifier(nn.Module):
    """nn.TransformerEncoder over [N, T, 4] series, mean-pooled."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(1))


def cnn1d(channels: int = 2) -> nn.Sequential:
    """A 1D-CNN for time series [N, channels, 32]."""
    return nn.Sequential(nn.Conv1d(channels, 8, 5), nn.ReLU(), nn.Conv1d(8, 16, 5), nn.ReLU(),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, N_CLASSES))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.reduce, self.expand = nn.Linear(channels, 4), nn.Linear(4, channels)
        self.act, self.gate = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        weights = self.gate(self.expand(self.act(self.reduce(x.mean((2, 3))))))
        return x * weights[:, :, None, None]


class SeparableNet(nn.Module):
    """A depthwise-separable CNN with squeeze-excite and hardswish (MobileNetV3's block)."""

    def __init__(self):
        super().__init__()
        self.stem, self.stem_act = nn.Conv2d(3, 8, 3, padding=1), nn.Hardswish()
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn = nn.BatchNorm2d(8)
        self.se = SqueezeExcite(8)
        self.pointwise, self.act = nn.Conv2d(8, 16, 1), nn.Hardswish()
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x):
        x = self.se(self.bn(self.depthwise(self.stem_act(self.stem(x)))))
        return self.head(self.act(self.pointwise(x)).mean((2, 3)))


class Tabular(nn.Module):
    """Two named inputs: category ids `cat` [N, 3] (embedded) and numbers `num` [N, 5]."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.fc1, self.act = nn.Linear(12 + 5, 16), nn.ReLU()
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, cat, num):
        return self.head(self.act(self.fc1(torch.cat([self.embed(cat).flatten(1), num], 1))))


class GraphNet(nn.Module):
    """A graph convolution over node features `x` [N, 6, 4] and adjacency `adj` [N, 6, 6]."""

    def __init__(self):
        super().__init__()
        self.conv, self.act = nn.Linear(4, 16), nn.ReLU()
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x, adj):
        return self.head(self.act(self.conv(adj @ x)).mean(1))


def swin() -> nn.Module:
    """Hugging Face Swin from a small config: its second stage adapts its window to small
    inputs (a change that outlived the call when layers were listed on halved images)."""
    import transformers

    config = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16,
                                     depths=[1, 1], num_heads=[2, 2], window_size=4,
                                     num_labels=N_CLASSES)
    return transformers.SwinForImageClassification(config)


def bart() -> nn.Module:
    """Hugging Face BART for sequence classification from a small config: it reads the
    sentence at each row's last <eos> token."""
    import transformers

    config = transformers.BartConfig(vocab_size=40, d_model=16, encoder_layers=1,
                                     decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32,
                                     num_labels=N_CLASSES, eos_token_id=2, pad_token_id=1,
                                     bos_token_id=0, decoder_start_token_id=2)
    return transformers.BartForSequenceClassification(config)


def _token_inputs(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Token ids [N, 8] ending in <eos> (2), and an attention mask stored as floats (as
    tokenizers' masks often are once saved): the mask is not an input a path can scale."""
    ids = torch.randint(3, 40, (N_SAMPLES, 8), generator=generator)
    ids[:, -1] = 2
    return {"input_ids": ids, "attention_mask": torch.ones(N_SAMPLES, 8)}


def regression() -> nn.Sequential:
    """A regression MLP: one real output per sample, trained on squared error."""
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))


def regression_targets(inputs: torch.Tensor) -> torch.Tensor:
    """Real targets [N] that a `regression` model can learn from its inputs [N, 6]."""
    return inputs[:, 0] - 2 * inputs[:, 1] + inputs[:, 2] * inputs[:, 3]


def _graph_inputs(generator: torch.Generator) -> dict[str, torch.Tensor]:
    adj = (torch.rand(N_SAMPLES, 6, 6, generator=generator) > 0.5).float()
    return {"x": torch.randn(N_SAMPLES, 6, 4, generator=generator), "adj": adj}


_BUILDERS: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Any]]] = {
    "transformer_encoder": (TransformerClassifier,
                            lambda g: torch.randn(N_SAMPLES, 6, 4, generator=g)),
    "cnn1d": (cnn1d, lambda g: torch.randn(N_SAMPLES, 2, 32, generator=g)),
    "separable_cnn": (SeparableNet, lambda g: torch.randn(N_SAMPLES, 3, 12, 12, generator=g)),
    "swin": (swin, lambda g: torch.randn(N_SAMPLES, 3, 32, 32, generator=g)),
    "bfloat16_cnn": (lambda: cnn1d().to(torch.bfloat16),
                     lambda g: torch.randn(N_SAMPLES, 2, 32, generator=g).to(torch.bfloat16)),
    "tabular": (Tabular, lambda g: {"cat": torch.randint(0, 10, (N_SAMPLES, 3), generator=g),
                                    "num": torch.randn(N_SAMPLES, 5, generator=g)}),
    "graph": (GraphNet, _graph_inputs),
    "bart": (bart, _token_inputs),
    "regression": (regression, lambda g: torch.randn(N_SAMPLES, 6, generator=g)),
}
FAMILIES = tuple(_BUILDERS)


def family(name: str, seed: int = 0) -> tuple[nn.Module, Any]:
    """(model in eval mode, inputs [N_SAMPLES, ...] or a dict of named inputs)."""
    build, inputs = _BUILDERS[name]
    torch.manual_seed(seed)
    model = build().eval()
    return model, inputs(torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the state of a model

def state_of(model: nn.Module) -> dict:
    """Everything a call could change: each parameter's and buffer's values (copies), each
    module's mode, and every other attribute of each module (tensors copied, the rest by
    identity and repr, containers by their items)."""
    tensors = {f"{kind}:{name}": (id(tensor), tensor.detach().clone())
               for kind, named in (("parameter", model.named_parameters(remove_duplicate=False)),
                                   ("buffer", model.named_buffers(remove_duplicate=False)))
               for name, tensor in named}
    modules = {}
    for name, module in model.named_modules():
        attributes = {}
        for key, value in vars(module).items():
            if key in _HOOK_TABLES:
                continue
            if isinstance(value, torch.Tensor):
                attributes[key] = (id(value), value.detach().clone())
            elif isinstance(value, dict):
                attributes[key] = (id(value), {k: id(v) for k, v in value.items()})
            elif isinstance(value, (list, tuple, set)):
                attributes[key] = (id(value), [id(v) for v in value], repr(value)[:2000])
            else:
                attributes[key] = (id(value), repr(value)[:2000])
        modules[name] = attributes
    return {"tensors": tensors, "modules": modules}


_HOOK_TABLES = frozenset(key for key in vars(nn.Module()) if "hook" in key)


def assert_same_state(model: nn.Module, before: dict, what: str = "") -> None:
    """AssertionError naming the first difference between `model` and `state_of` before."""
    after = state_of(model)
    assert after["tensors"].keys() == before["tensors"].keys(), what
    for name, (identity, value) in before["tensors"].items():
        now_identity, now = after["tensors"][name]
        assert now_identity == identity, f"{what}: {name} was replaced"
        assert now.dtype == value.dtype and torch.equal(now, value), f"{what}: {name} changed"
    assert after["modules"].keys() == before["modules"].keys(), f"{what}: modules changed"
    for name, attributes in before["modules"].items():
        now = after["modules"][name]
        assert now.keys() == attributes.keys(), (
            f"{what}: attributes of {name!r}: {sorted(now.keys() ^ attributes.keys())}")
        for key, value in attributes.items():
            if isinstance(value[1], torch.Tensor):
                assert now[key][0] == value[0] and torch.equal(now[key][1], value[1]), (
                    f"{what}: {name}.{key} changed")
            else:
                assert now[key] == value, f"{what}: {name}.{key} changed: {now[key]} != {value}"


# ------------------------------------------------------------------ a trained model

def noisy_series(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(series [n, 2, 32], classes [n]): three frequencies under heavy noise."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, N_CLASSES, (n,), generator=generator)
    frequency = (labels.float() + 1)[:, None] * 0.35
    phase = torch.rand(n, 1, generator=generator) * 6.28
    t = torch.arange(32.0)
    x = torch.stack([torch.sin(frequency * t + phase), torch.cos(0.5 * frequency * t + phase)], 1)
    return x + 1.2 * torch.randn(x.shape, generator=generator), labels


def trained_cnn1d(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(a `cnn1d` trained to about 99% accuracy, its series [600, 2, 32], classes [600]):
    seconds of Adam. Its conv2 ("2") has neurons whose gradient x activation is large and
    negative on average, which a signed-mean ranking puts at its bottom."""
    x, y = noisy_series(600, seed)
    torch.manual_seed(seed)
    model = cnn1d()
    optimizer = torch.optim.Adam(model.parameters(), 0.01)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval().requires_grad_(False), x, y
