"""Small models of the shapes users bring: residual adds, BatchNorm, conv channels, branches."""
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
