"""A model whose neuron importance is known by construction, its data, and the user's own
hand-written attribution loops (seeds 000 and 002) that the degeneracy check must catch."""
import torch
from torch import nn


WIDTH = 8


class HandSetNet(nn.Module):
    """x [N, 2] -> fc (8 pre-activations, all on) -> relu -> head (2 logits).

    Neuron j adds w_j * z_j to logit 0 and subtracts it from logit 1, with w falling 4 .. 0.5,
    so importance is known: the gradient of logit 0 is +w, of logit 1 is -w.
    """

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, WIDTH)
        self.relu = nn.ReLU()
        self.head = nn.Linear(WIDTH, 2)
        generator = torch.Generator().manual_seed(0)
        weights = torch.linspace(4.0, 0.5, WIDTH)
        with torch.no_grad():
            self.fc.weight.copy_(0.1 * torch.randn(WIDTH, 2, generator=generator))
            self.fc.bias.fill_(2.0)
            self.head.weight.copy_(torch.stack([weights, -weights]))
            self.head.bias.zero_()

    def forward(self, x):
        return self.head(self.relu(self.fc(x)))


def data(n=40):
    """(inputs [n, 2], targets alternating 0, 1)."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 2, generator=generator), torch.arange(n) % 2


# ------------------------------------------------------------------ the user's own loops

def seed_002_whole_batch_loop(model, layer, inputs, targets):
    """Seed 002: `inputs.unsqueeze(0)` feeds the whole batch on every iteration.

    (As written, `output[target_i]` picks a row of the [B, C] output and cannot backward;
    indexing sample i is the smallest change that runs.) Returns the seed's result, the mean
    over dim 0 of the captured [1, B, n] gradients: [B, n].
    """
    inputs = inputs.clone()
    inputs.requires_grad = True
    attributions = []

    def hook_fn(module, grad_input, grad_output):
        attributions.append(grad_output[0].detach().cpu())

    handle = layer.register_full_backward_hook(hook_fn)
    for i in range(len(inputs)):
        input_i = inputs.unsqueeze(0)  # Add batch dimension
        output = model(input_i).squeeze()
        target_i = targets[i].item()
        output[i, target_i].backward()
    handle.remove()
    grads_tensor = torch.cat(attributions, dim=0)
    return grads_tensor.mean(dim=0)


def seed_002_whole_batch_rows(model, layer, inputs, targets):
    """The same loop, keeping every captured gradient: [B, B, n]."""
    inputs = inputs.clone().requires_grad_(True)
    attributions = []
    handle = layer.register_full_backward_hook(
        lambda module, grad_input, grad_output: attributions.append(grad_output[0].detach()))
    for i in range(len(inputs)):
        output = model(inputs.unsqueeze(0)).squeeze()
        output[i, targets[i].item()].backward()
    handle.remove()
    return torch.cat(attributions, dim=0)


def seed_000_stale_gradient_loop(model, layer, inputs, targets):
    """Seed 000's loop and belief ("no need to zero the grads"), reading dF/dz of a Linear
    from its bias gradient, which does accumulate across backward calls. [B, n]"""
    rows = []
    for i in range(len(inputs)):
        input_i = inputs[i].unsqueeze(0)
        output = model(input_i).squeeze()
        target_i = targets[i].item()
        output[target_i].backward()
        # We do not need to zero the grads since only the model param grads are accumulated
        rows.append(layer.bias.grad.detach().clone())
    return torch.stack(rows)


class LeakyGradientAttribution:
    """Seed 000's class with its hook registered per call and never removed, appending to a
    list the object keeps: the second call returns rows from both calls and both hooks."""

    def __init__(self, model):
        self.model = model
        self.attributions = []

    def attribute(self, layer, inputs, targets):
        layer.register_full_backward_hook(
            lambda module, grad_input, grad_output:
                self.attributions.append(grad_output[0].detach().cpu()))
        for i in range(len(inputs)):
            output = self.model(inputs[i].unsqueeze(0).requires_grad_(True)).squeeze()
            output[targets[i].item()].backward()
        return torch.cat(self.attributions, dim=0)
