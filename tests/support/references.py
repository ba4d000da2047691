"""Slow, obviously-correct references: one sample, one neuron, one step at a time."""
import contextlib

import numpy as np
import torch

from attribution.methods.paths import gauss_legendre


@contextlib.contextmanager
def replaced_output(module, make_output):
    """Temporarily replace `module`'s output with make_output(original)."""
    handle = module.register_forward_hook(lambda mod, args, out: make_output(out))
    try:
        yield
    finally:
        handle.remove()


def layer_output(model, module, x):
    """The layer's output as it left the layer (a copy: in-place ops after it do not count)."""
    store = {}

    def keep(out):
        store["z"] = out.clone()  # returning None leaves the model's own tensor in place

    with torch.no_grad(), replaced_output(module, keep):
        model(x)
    return store["z"]


def _per_neuron(t):
    """[n, *spatial] -> [n]: a conv channel's positions are summed."""
    return t.flatten(1).sum(1) if t.dim() > 1 else t


def integrated_gradients(model, module, x, targets, n_steps):
    """z * sum_k w_k dF/dz(alpha_k z), one sample and one step at a time. [N, n_neurons];
    `n_steps` an int, or one per sample (the steps the engine took: `ScoreFacts.sums.steps`)."""
    rows = []
    for i in range(x.shape[0]):
        weights, alphas = gauss_legendre(int(n_steps if np.ndim(n_steps) == 0 else n_steps[i]))
        z = layer_output(model, module, x[i:i + 1])
        total = torch.zeros_like(z)
        for weight, alpha in zip(weights, alphas):
            leaf = (alpha * z).requires_grad_(True)
            with replaced_output(module, lambda out: leaf * 1):
                logit = model(x[i:i + 1])[0, targets[i]]
            (grad,) = torch.autograd.grad(logit, leaf)
            total += weight * grad
        rows.append(_per_neuron((z * total)[0]))
    return torch.stack(rows)


def ablation(model, module, x, targets):
    """F(x) - F(x with neuron j zeroed), one sample and one neuron at a time. [N, n_neurons]"""
    rows = []
    with torch.no_grad():
        for i in range(x.shape[0]):
            base = model(x[i:i + 1])[0, targets[i]]
            n_neurons = layer_output(model, module, x[i:i + 1]).shape[1]
            effects = []
            for j in range(n_neurons):
                def zero_j(out, j=j):
                    out = out.clone()
                    out[:, j] = 0
                    return out
                with replaced_output(module, zero_j):
                    effects.append(base - model(x[i:i + 1])[0, targets[i]])
            rows.append(torch.stack(effects))
    return torch.stack(rows)


def _one_sample(model, module, sample):
    """(the layer's output z as the model computed it, logits [1, C]) for one sample [1, ...]
    (floating-point inputs require grad, as a user's loop makes them); the model goes on
    with a copy of z, so an in-place op after the layer does not overwrite it."""
    store = {}

    def keep(mod, args, out):
        store["z"] = out
        return out.clone()

    handle = module.register_forward_hook(keep)
    try:
        sample = sample.clone()
        logits = model(sample.requires_grad_(True) if sample.is_floating_point() else sample)
    finally:
        handle.remove()
    return store["z"], logits


def per_sample_gradient(model, module, x, targets):
    """dF/dz for each sample with its own forward/backward (the correct hand-written loop)."""
    rows = []
    for i in range(x.shape[0]):
        z, logits = _one_sample(model, module, x[i:i + 1])
        (grad,) = torch.autograd.grad(logits[0, targets[i]], z)
        rows.append(_per_neuron(grad[0]))
    return torch.stack(rows)


def per_sample_loss_taylor(model, module, x, targets, neuron_axis=1):
    """sum_p z * dL/dz for each sample with its own forward/backward, L the cross-entropy of
    the sample against its target, summed over every axis of z but the neuron's: [N, n] (the
    signed term of `taylor` and `fisher`)."""
    rows = []
    for i in range(x.shape[0]):
        z, logits = _one_sample(model, module, x[i:i + 1])
        loss = torch.nn.functional.cross_entropy(logits, targets[i:i + 1])
        (grad,) = torch.autograd.grad(loss, z)
        term = (z * grad).detach()[0].movedim(neuron_axis - 1, 0)
        rows.append(term.flatten(1).sum(1) if term.dim() > 1 else term)
    return torch.stack(rows)


FINE_STEPS = 2048
"""Captum's conductance at this many steps stands in for the integral itself."""


def assert_conductance_matches(scores, steps, n_steps, captum):
    """Conductance scores [N, n] of a computation whose samples took `steps` [N] (its
    `about["sum_steps"]`) against `captum(rows, n_steps)`, Captum's LayerConductance of
    those samples [R, n]: equal at `n_steps` where a sample met its sum there; within 2% of
    the scale of Captum at FINE_STEPS where the engine bisected the sample's path."""
    refined = torch.from_numpy(np.asarray(steps) > n_steps)
    if refined.any():
        fine = captum(refined, FINE_STEPS).float()
        torch.testing.assert_close(scores[refined], fine, rtol=0,
                                   atol=0.02 * float(fine.abs().max()))
    if not refined.all():
        torch.testing.assert_close(scores[~refined], captum(~refined, n_steps).float(),
                                   rtol=1e-4, atol=1e-5)
