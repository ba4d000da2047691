"""The tests' models. Small models of the shapes users bring: residual adds, BatchNorm, conv
channels, branches, token ids, sequences. Then the models people study, small: ResNet- and
ViT-style nets by hand, GPT-2 and BERT from transformers configs (no downloads), and each as
the `.pt2` a user would upload."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class ResidualMLP(nn.Module):
    """Linear -> BatchNorm -> ReLU, then a residual block; not an nn.Sequential."""

    def __init__(self, n_in=10, width=16, n_classes=3):
        super().__init__()
        self.fc1 = nn.Linear(n_in, width)
        self.bn = nn.BatchNorm1d(width)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.ReLU(inplace=True)
        self.out = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.act(self.bn(self.fc1(x)))
        return self.out(self.act2(self.fc2(h)) + h)


class ResidualConvNet(nn.Module):
    """Conv channels with BatchNorm and a residual add, then global pooling and a head."""

    def __init__(self, channels=6, n_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.relu = nn.ReLU()
        self.relu2 = nn.ReLU()
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu2(self.conv2(h) + h)
        return self.head(h.mean((2, 3)))


class BranchingNet(nn.Module):
    """Two branches read the same input and are concatenated before the head."""

    def __init__(self, n_in=6, n_classes=3):
        super().__init__()
        self.left = nn.Sequential(nn.Linear(n_in, 5), nn.Tanh())
        self.right = nn.Sequential(nn.Linear(n_in, 7), nn.ReLU())
        self.head = nn.Linear(12, n_classes)

    def forward(self, x):
        return self.head(torch.cat([self.left(x), self.right(x) * 2.0], dim=1))


class UntraceableNet(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, hooks must be used."""

    def __init__(self, n_in=6, n_classes=3):
        super().__init__()
        self.fc1 = nn.Linear(n_in, 8)
        self.fc2 = nn.Linear(8, n_classes)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if h.sum() > 0:
            h = h * 1.5
        return self.fc2(h)


class ThreeBranchNet(nn.Module):
    """The sanity model: each branch reads one input feature (Linear(1, w) -> ReLU)."""

    def __init__(self, width=4):
        super().__init__()
        self.branch0 = nn.Sequential(nn.Linear(1, width), nn.ReLU())
        self.branch1 = nn.Sequential(nn.Linear(1, width), nn.ReLU())
        self.branch2 = nn.Sequential(nn.Linear(1, width), nn.ReLU())
        self.head = nn.Linear(3 * width, 2)

    def forward(self, x):
        parts = [self.branch0(x[:, [0]]), self.branch1(x[:, [1]]), self.branch2(x[:, [2]])]
        return self.head(torch.cat(parts, dim=1))


class TokenNet(nn.Module):
    """A classifier of token ids: LongTensor [N, T] -> Embedding -> mean over T -> MLP."""

    def __init__(self, vocabulary=20, n_classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 8)
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, n_classes)

    def forward(self, ids):
        return self.fc2(torch.relu(self.fc1(self.embed(ids).mean(1))))


class SequenceNet(nn.Module):
    """Per-position layers on a sequence [N, T, 3]: Linear -> GELU -> LayerNorm, a residual
    Linear, then the mean over positions and a head. Their neurons are the last dim."""

    def __init__(self, n_classes=3):
        super().__init__()
        self.proj = nn.Linear(3, 6)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, n_classes)

    def forward(self, x):
        h = self.norm(self.act(self.proj(x)))
        return self.head((h + torch.relu(self.mix(h))).mean(1))


class UntraceableSequenceNet(SequenceNet):
    """SequenceNet behind data-dependent control flow: the hook runner's path."""

    def forward(self, x):
        if x.sum() > 1e9:
            x = x * 0
        return super().forward(x)


def token_files(folder, n=24, length=5, seed=0):
    """(model, ids [n, length], labels [n]) and the .pt2 + .npz a user would upload."""
    import numpy as np

    torch.manual_seed(seed)
    model = TokenNet().eval()
    ids, labels = torch.randint(0, 20, (n, length)), torch.randint(0, 3, (n,))
    program = torch.export.export(model, (ids[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, folder / "tokens.pt2")
    np.savez(folder / "tokens.npz", inputs=ids.numpy(), labels=labels.numpy())
    return model, ids, labels


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give BatchNorm layers non-trivial running statistics and affine parameters."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                shape = module.running_mean.shape
                module.running_mean.copy_(torch.randn(shape, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(shape, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(shape, generator=generator) * 0.3)
    return model


def build(name: str, seed: int = 0):
    """(model in eval mode, inputs, targets) for one of the zoo's architectures."""
    torch.manual_seed(seed)
    if name == "residual_mlp":
        model, x, n_classes = ResidualMLP(), torch.randn(40, 10), 3
    elif name == "residual_conv":
        model, x, n_classes = ResidualConvNet(), torch.randn(24, 1, 6, 6), 4
    elif name == "branching":
        model, x, n_classes = BranchingNet(), torch.randn(40, 6), 3
    elif name == "untraceable":
        model, x, n_classes = UntraceableNet(), torch.randn(40, 6), 3
    else:
        raise KeyError(name)
    randomize_batchnorm(model, seed).eval()
    return model, x, torch.randint(0, n_classes, (x.shape[0],))


# ------------------------------------------------------------------ the models people study

VOCABULARY, LENGTH = 50, 16


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: one ReLU module called twice, optional downsample."""

    def __init__(self, n_in: int, n_out: int, stride: int = 1, inplace: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(n_in, n_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(n_out)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(n_out, n_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(n_out)
        self.downsample = None
        if stride != 1 or n_in != n_out:
            self.downsample = nn.Sequential(nn.Conv2d(n_in, n_out, 1, stride, bias=False),
                                            nn.BatchNorm2d(n_out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's resnet layout (stem, four stages of BasicBlocks, pool, fc) at any width;
    widths (64, 128, 256, 512) and blocks (2, 2, 2, 2) give resnet18 (11.2M parameters);
    `inplace` as torchvision's (True) or timm's style (False) ReLU."""

    def __init__(self, widths=(8, 16, 16, 32), blocks=(2, 2, 1, 1), n_classes=5, n_in=3,
                 inplace: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(n_in, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, n = [], widths[0]
        for index, (width, count) in enumerate(zip(widths, blocks)):
            stride = 1 if index == 0 else 2
            stage = [BasicBlock(n, width, stride, inplace)] + [
                BasicBlock(width, width, 1, inplace) for _ in range(count - 1)]
            stages.append(nn.Sequential(*stage))
            n = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(n, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Block(nn.Module):
    """A pre-norm transformer block as in timm's ViT: x + attn(norm1(x)), x + mlp(norm2(x))."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch-embedding conv, a class token, learned position embeddings (a fixed patch count),
    blocks, a final norm and a head on the class token."""

    def __init__(self, image=16, patch=4, dim=24, depth=2, heads=2, n_classes=5, n_in=3):
        super().__init__()
        self.patch_embed = nn.Conv2d(n_in, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.1)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + (image // patch) ** 2, dim) * 0.1)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [N, P, dim]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class Logits(nn.Module):
    """A transformers classifier called with `input_ids` only, returning `.logits` [N, C]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def gpt2(n_classes: int = 3, width: int = 32) -> nn.Module:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    config = GPT2Config(n_layer=2, n_embd=width, n_head=2, vocab_size=VOCABULARY,
                        n_positions=64, pad_token_id=0, num_labels=n_classes)
    return Logits(GPT2ForSequenceClassification(config))


def bert(n_classes: int = 3, width: int = 32) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(num_hidden_layers=2, hidden_size=width, num_attention_heads=2,
                        intermediate_size=4 * width, vocab_size=VOCABULARY,
                        max_position_embeddings=64, num_labels=n_classes)
    return Logits(BertForSequenceClassification(config))


def build_model(name: str, n: int = 12, seed: int = 0):
    """(model in eval mode, inputs [n, ...], targets [n]) for "resnet", "vit", "gpt2", "bert"."""
    torch.manual_seed(seed)
    if name == "resnet":
        model, x = randomize_batchnorm(ResNet(), seed), torch.randn(n, 3, 32, 32)
    elif name == "vit":
        model, x = ViT(), torch.randn(n, 3, 16, 16)
    elif name == "gpt2":
        model, x = gpt2(), torch.randint(1, VOCABULARY, (n, LENGTH))
    elif name == "bert":
        model, x = bert(), torch.randint(1, VOCABULARY, (n, LENGTH))
    else:
        raise KeyError(name)
    model.eval()
    with torch.no_grad():
        n_classes = model(x[:2]).shape[1]
    return model, x, torch.randint(0, n_classes, (n,))


def exported(model: nn.Module, x: torch.Tensor, path) -> nn.Module:
    """Save `model` as the .pt2 a user uploads (dynamic batch) and load it back unflattened."""
    program = torch.export.export(model, (x[:4],),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, path)
    return torch.export.unflatten(torch.export.load(path))


def methods_scoring(*kinds: str, model: nn.Module | None = None) -> list[str]:
    """The registered methods that score float inputs at layers of every kind in `kinds`
    ("Linear", "Conv2d", ...; `at.methods_for`) of `model` (methods whose rules do not cover
    its modules, such as lrp on a model with a BatchNorm1d, refuse it: they are tested where
    they apply), in registration order."""
    import attribution as at

    return [method for method in at.method_names()
            if all(method in at.methods_for(torch.float32, kind, model) for kind in kinds)]


def groups(x) -> np.ndarray:
    """Three clusters of the samples of x [N, ...] (or named inputs), by position. Every
    method takes clusters (only one fitted to them, the probe, reads them), so a test of
    every method passes these."""
    from attribution.engine import model_io

    return np.arange(model_io.n_rows(model_io.named(x))) % 3


# ------------------------------------------- four samples of a table, and a model that reads them

INPUTS = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 11.0]],
                  dtype=np.float32)
LABELS = np.array([0, 1, 1, 0])


def picker_model():
    """A `LoadedModel` whose logits are the first two features: class 1 wins where b > a
    (every row of INPUTS)."""
    from attribution.inputs.loaded import LoadedModel

    linear = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    return LoadedModel(module=nn.Sequential(linear).eval(), input_shape=(3,), n_classes=2,
                       class_names=("zero", "one"))
