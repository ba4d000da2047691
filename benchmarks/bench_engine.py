"""Engine: each scoring method against the obvious way to compute the same numbers.

A digits MLP 64-128-64-10 (trained briefly), the digits repeated to 10,782 samples, batch
256, torch's default threads; scored: its 64-unit hidden layer "2". Against:
- gradient: the per-sample backward-hook loop from the question this tool answers (its bugs
  fixed; target: at least 100x slower than the engine), and one plain forward+backward of
  the model, the floor (a gradient at a layer needs one forward and one backward; target:
  the engine within 3x of it);
- gradient x activation: Captum's LayerGradientXActivation (target: the engine at least 2x
  faster);
- conductance, 32 steps, a quarter of the samples: Captum's LayerConductance (target: at
  least 2x faster);
- integrated gradients, 32 steps: the part of the model before the layer runs once per batch
  and only the part after it runs per step (FxRunner), against the whole model per step
  (HookRunner);
- ablation of every neuron of the hidden layer and of the 10-unit output layer: one hooked
  forward per neuron (target: at least 3x faster on the late layer);
- targets="all" (10 classes): one forward and a retain_graph backward per class, bare and
  keeping its gradients [N, C, n] as "all" returns them, and a forward+backward per class.

On a model this small the ratios against Captum measure per-call overheads; on a resnet18
both sit at the forward+backward floor (`bench_models.py captum`).

    python -m benchmarks.bench_engine [--results FILE]
"""
import sys

import torch
from captum.attr import LayerConductance, LayerGradientXActivation

import attribution as at
from attribution.engine.guards import eval_mode
from attribution.engine.runners import HookRunner, runner_for
from attribution.methods.registry import REGISTRY, Batch
from benchmarks.common import (batches, digits_mlp, interleaved_medians, note, report, run,
                               zeroed)

BATCH = 256


def per_sample_hook_loop(model, layer, x, y):
    """The hand-written loop from the user's question, with its bugs fixed."""
    rows = []

    def keep(module, grad_input, grad_output):
        rows.append(grad_output[0].detach())

    handle = layer.register_full_backward_hook(keep)
    try:
        for i in range(len(x)):
            sample = x[i:i + 1].clone().requires_grad_(True)
            model(sample)[0, y[i]].backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return torch.cat(rows)


def plain_forward_backward(model, x, y):
    for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
        xb = xb.clone().requires_grad_(True)
        torch.autograd.grad(model(xb).gather(1, yb[:, None]).sum(), xb)


def captum_batched(explainer, x, y, **kwargs):
    for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
        explainer.attribute(xb, target=yb, **kwargs)


def hooked_forward_per_neuron(model, layer, x, y):
    """Exact ablation the obvious way: one hooked full forward per neuron and batch."""
    with torch.no_grad():
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            base = model(xb).gather(1, yb[:, None])
            for j in range(layer.out_features):
                with zeroed(layer, j):
                    base - model(xb).gather(1, yb[:, None])


def runner_scores(model, runner, x, y, method, n_steps=32):
    function = REGISTRY[method].function
    with eval_mode(model):
        for start in range(0, len(x), BATCH):
            function(Batch(runner, x[start:start + BATCH], y[start:start + BATCH], n_steps,
                           start, 0, 1 << 18))


def logits_and_layer_output(model, layer, xb):
    """(logits, the layer's output) of one forward pass, for gradients w.r.t. the layer."""
    store = {}
    handle = layer.register_forward_hook(lambda m, a, out: store.setdefault("z", out))
    try:
        logits = model(xb)
    finally:
        handle.remove()
    return logits, store["z"]


def all_classes_retain_graph(model, layer, x, keep=False):
    """One forward per batch, a retain_graph backward per class; `keep`: the gradients are
    kept as targets="all" returns them ([N, C, n]), else dropped (the loop's bare cost)."""
    kept = []
    for xb in batches(x, BATCH):
        logits, z = logits_and_layer_output(model, layer, xb)
        grads = [torch.autograd.grad(logits[:, c].sum(), z, retain_graph=True)[0]
                 for c in range(logits.shape[1])]
        if keep:
            kept.append(torch.stack(grads, 1))
    return torch.cat(kept) if keep else None


def all_classes_forward_per_class(model, layer, x):
    for xb in batches(x, BATCH):
        for c in range(10):
            logits, z = logits_and_layer_output(model, layer, xb)
            torch.autograd.grad(logits[:, c].sum(), z)


def main():
    torch.manual_seed(0)
    model, x, y = digits_mlp()
    hidden, late = model[2], model[4]  # second hidden Linear (64 units); the output Linear
    print(f"digits MLP 64-128-64-10, {len(x)} samples, batch {BATCH}, "
          f"{torch.get_num_threads()} threads")
    note(f"Digits MLP 64-128-64-10, {len(x)} samples, batch {BATCH}, "
         f"{torch.get_num_threads()} threads.")

    report(f"gradient on {len(x)} samples: against the per-sample backward-hook loop",
           interleaved_medians({
               "at.neuron_scores gradient": lambda: at.neuron_scores(model, "2", x, y, "gradient"),
               "per-sample register_full_backward_hook loop":
                   lambda: per_sample_hook_loop(model, hidden, x, y),
           }, repeats=3), "at.neuron_scores gradient")

    report(f"gradient / gradient_x_activation on {len(x)} samples",
           interleaved_medians({
               "at.neuron_scores gradient": lambda: at.neuron_scores(model, "2", x, y, "gradient"),
               "at.neuron_scores gradient_x_activation":
                   lambda: at.neuron_scores(model, "2", x, y, "gradient_x_activation"),
               "plain forward+backward (the floor)": lambda: plain_forward_backward(model, x, y),
               "captum LayerGradientXActivation":
                   lambda: captum_batched(LayerGradientXActivation(model, hidden), x, y),
           }), "at.neuron_scores gradient")

    report(f"conductance, 32 steps, {len(x) // 4} samples",
           interleaved_medians({
               "at.neuron_scores conductance": lambda: at.neuron_scores(
                   model, "2", x[:len(x) // 4], y[:len(x) // 4], "conductance"),
               "captum LayerConductance": lambda: captum_batched(
                   LayerConductance(model, hidden), x[:len(x) // 4], y[:len(x) // 4], n_steps=32),
           }, repeats=3), "at.neuron_scores conductance")

    with eval_mode(model):
        fx_runner = runner_for(model, "2", hidden, x[:BATCH])
    hook_runner = HookRunner(model, "2", hidden)
    front_calls = []
    handle = model[0].register_forward_hook(lambda *args: front_calls.append(1))
    try:
        at.neuron_scores(model, "2", x[:BATCH], y[:BATCH], "integrated_gradients", n_steps=32)
    finally:
        handle.remove()
    print(f"\nintegrated_gradients, 32 steps: the front (layer 0) ran {len(front_calls)} time(s) "
          f"for one batch ({type(fx_runner).__name__})")
    note(f"integrated_gradients, 32 steps: the front (layer 0) ran {len(front_calls)} time(s) "
         f"for one batch ({type(fx_runner).__name__}).")
    report(f"integrated_gradients, 32 steps, {len(x) // 4} samples",
           interleaved_medians({
               "tail only (FxRunner)": lambda: runner_scores(
                   model, fx_runner, x[:len(x) // 4], y[:len(x) // 4], "integrated_gradients"),
               "full model per step (HookRunner)": lambda: runner_scores(
                   model, hook_runner, x[:len(x) // 4], y[:len(x) // 4], "integrated_gradients"),
           }, repeats=3), "tail only (FxRunner)")

    report(f"ablation of every neuron of the 64-unit hidden layer '2', {len(x)} samples",
           interleaved_medians({
               "at.neuron_scores ablation": lambda: at.neuron_scores(model, "2", x, y, "ablation"),
               "one hooked forward per neuron":
                   lambda: hooked_forward_per_neuron(model, hidden, x, y),
           }, repeats=3), "at.neuron_scores ablation")

    report(f"ablation of every neuron of the late (output) layer '4', {len(x)} samples",
           interleaved_medians({
               "at.neuron_scores ablation": lambda: at.neuron_scores(model, "4", x, y, "ablation"),
               "one hooked forward per neuron":
                   lambda: hooked_forward_per_neuron(model, late, x, y),
           }, repeats=3), "at.neuron_scores ablation")

    report(f"targets='all' (10 classes) gradient, {len(x)} samples",
           interleaved_medians({
               "at.neuron_scores targets='all'": lambda: at.neuron_scores(model, "2", x, "all",
                                                                          "gradient"),
               "one forward, a retain_graph backward per class":
                   lambda: all_classes_retain_graph(model, hidden, x),
               "the same, keeping the gradients [N, C, n]":
                   lambda: all_classes_retain_graph(model, hidden, x, keep=True),
               "a forward+backward per class":
                   lambda: all_classes_forward_per_class(model, hidden, x),
           }, repeats=9), "at.neuron_scores targets='all'")


if __name__ == "__main__":
    sys.exit(run(main, "bench_engine"))
