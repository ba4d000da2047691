"""The models people study, small: ResNet- and ViT-style nets by hand, GPT-2 and BERT from
transformers configs (no downloads), and each as the `.pt2` a user would upload."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from .zoo import randomize_batchnorm

VOCABULARY, LENGTH = 50, 16


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread in a test module that imports this: small convolutions on a shared
    2-core machine run ~80x slower on 2 threads than 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
