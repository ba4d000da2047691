"""The models people study: nested layers, a resnet18, a GPT-2-small-sized MLP layer.

One CPU thread (on a shared machine two threads ran small convolutions about 80x slower
under load). Parts, each runnable alone:
- pt2: a .pt2 (torch.export, unflattened) against the eager model on nested layers of a
  hand-built resnet18 (11M parameters, 64x64 images) and a GPT-2-style model (2 blocks,
  d=64, 16 sequences of 16 tokens); target: the .pt2 within 1.5x of the eager model. Both
  run on the same split: torch.export's unflattened modules are inlined into one graph, and
  an eager model that torch.fx cannot trace (transformers') is exported once per input
  shape and split the same way;
- captum: resnet18 layer3.0.bn2, 8 images: gradient x activation and conductance (8 steps)
  against Captum and against the floor, one plain forward+backward per evaluation (9 for
  conductance); target: parity with Captum, both near the floor. The floor's backward runs
  to the inputs while a layer's gradient stops at the layer, so the engine can be under it;
- gpt2: GPT-2 small's widths (d=768, 12 heads, MLP 3072) at 128 tokens, 256 sequences
  through 1 of its 12 blocks and a 2-class head (the scored layer, h.0.mlp.act, is full
  size): gradient, gradient x activation and a pruning curve (20 random orders, 5 k)
  against one forward+backward of the 256; wall medians of 2 interleaved runs after a
  warm-up, then each one's CPU time and peak resident memory. A curve's masks re-run only
  the part after the layer (here c_proj and the head), so its ratio depends on where the
  layer sits: more blocks after it lengthen both that part and the floor;
- first: on that layer, a first gradient x activation call (torch.export of the model and
  the check of the split on 4 rows of the first batch included) against a warm call;
- ablation: exact ablation of the 48 units of a 64-96-48-10 MLP with BatchNorm (layers "3"
  and "5", 1,797 digits), first call included, against one hooked forward per neuron;
  target: at least 3x faster.

    python -m benchmarks.bench_models [PART ...] [--results FILE]
"""
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from captum.attr import LayerConductance, LayerGradientXActivation
from torch import nn

import attribution as at
from benchmarks.common import (interleaved_medians, record, report, run, trained_on_digits,
                               zeroed)
from tests.support.models import ResNet, exported


def digits_bn_mlp(seed: int = 0):
    """(model, inputs [1797, 64], labels): 64-96-48-10 with BatchNorm, trained briefly."""
    torch.manual_seed(seed)
    return trained_on_digits(
        nn.Sequential(nn.Linear(64, 96), nn.BatchNorm1d(96), nn.ReLU(), nn.Linear(96, 48),
                      nn.BatchNorm1d(48), nn.ReLU(), nn.Linear(48, 10)), epochs=5)


def hooked_forward_per_neuron(model, layer, x, y, n_neurons):
    """Exact ablation the obvious way: one hooked forward of every sample per neuron."""
    with torch.no_grad():
        base = model(x).gather(1, y[:, None])[:, 0]
        return torch.stack([base - _zeroed_logit(model, layer, x, y, j)
                            for j in range(n_neurons)], 1)


def _zeroed_logit(model, layer, x, y, neuron):
    with zeroed(layer, [neuron]):
        return model(x).gather(1, y[:, None])[:, 0]


def ablation_of_the_last_hidden_layer(repeats: int = 9):
    model, x, y = digits_bn_mlp()
    for name in ("3", "5"):  # the 48-unit Linear, and the ReLU after its BatchNorm
        layer = model.get_submodule(name)
        torch.testing.assert_close(at.neuron_scores(model, name, x, y, "ablation"),
                                   hooked_forward_per_neuron(model, layer, x, y, 48),
                                   rtol=1e-4, atol=1e-5)
        fresh = iter([copy.deepcopy(model) for _ in range(repeats + 1)])  # + the warm-up
        report(f"ablation of the 48 units of layer '{name}' (64-96-48-10 MLP with BatchNorm), "
               f"{len(x)} digits, first call included (a fresh copy of the model each time, "
               "copied before the clock starts)",
               interleaved_medians({
                   "at.neuron_scores ablation": lambda: at.neuron_scores(
                       next(fresh), name, x, y, "ablation"),
                   "one hooked forward per neuron": lambda: hooked_forward_per_neuron(
                       model, layer, x, y, 48),
               }, repeats=repeats), "at.neuron_scores ablation")


def resnet18(n_classes: int = 10) -> nn.Module:
    """torchvision's resnet18 layout by hand: 11.2M parameters."""
    torch.manual_seed(0)
    return ResNet((64, 128, 256, 512), (2, 2, 2, 2), n_classes).eval()


def pt2_against_eager():
    """Nested layers of a resnet18 and a GPT-2-style model: the .pt2 (torch.export,
    unflattened) against the eager model, both on the fast split."""
    model, x = resnet18(), torch.randn(8, 3, 64, 64)
    y = torch.randint(0, 10, (8,))
    with tempfile.TemporaryDirectory() as folder:
        loaded = exported(model, x, Path(folder) / "resnet18.pt2")
    for layer, method, n in (("layer4.0.bn2", "ablation", 4),
                             ("layer2.0.bn2", "gradient_x_activation", 8),
                             ("layer3.1", "gradient_x_activation", 8)):
        report(f"resnet18 {method} of {layer}, {n} images 64x64",
               interleaved_medians({
                   "eager": lambda: at.neuron_scores(model, layer, x[:n], y[:n], method),
                   ".pt2": lambda: at.neuron_scores(loaded, layer, x[:n], y[:n], method),
               }, repeats=3), "eager")
    from tests.support.models import gpt2
    torch.manual_seed(0)
    model, ids = gpt2(width=64).eval(), torch.randint(1, 50, (16, 16))
    y = torch.randint(0, 3, (16,))
    with tempfile.TemporaryDirectory() as folder:
        loaded = exported(model, ids, Path(folder) / "gpt2.pt2")
    layer = "model.transformer.h.0.mlp.c_fc"
    for method in ("ablation", "gradient_x_activation"):
        report(f"GPT-2-style (2 blocks, d=64) {method} of {layer}, 16 sequences of 16 tokens",
               interleaved_medians({
                   "eager (exported once, cached)": lambda: at.neuron_scores(
                       model, layer, ids, y, method),
                   ".pt2": lambda: at.neuron_scores(loaded, layer, ids, y, method),
               }, repeats=3), "eager (exported once, cached)")


def forward_backward(model, x, y):
    x = x.clone().requires_grad_(True)
    torch.autograd.grad(model(x).gather(1, y[:, None]).sum(), x)


def resnet18_against_captum(n_steps: int = 8):
    model, x = resnet18(), torch.randn(8, 3, 64, 64)
    y = torch.randint(0, 10, (8,))
    layer = "layer3.0.bn2"
    module = model.get_submodule(layer)
    report(f"resnet18 {layer}, {len(x)} images 64x64: gradient x activation",
           interleaved_medians({
               "at.neuron_scores": lambda: at.neuron_scores(model, layer, x, y,
                                                            "gradient_x_activation"),
               "Captum LayerGradientXActivation": lambda: LayerGradientXActivation(
                   model, module).attribute(x, target=y),
               "one plain forward+backward": lambda: forward_backward(model, x, y),
           }, repeats=3), "at.neuron_scores")
    report(f"resnet18 {layer}, {len(x)} images 64x64: conductance, {n_steps} steps",
           interleaved_medians({
               "at.neuron_scores": lambda: at.neuron_scores(model, layer, x, y, "conductance",
                                                            n_steps=n_steps),
               "Captum LayerConductance": lambda: LayerConductance(model, module).attribute(
                   x, target=y, n_steps=n_steps),
               f"{n_steps + 1} plain forward+backward": lambda: [
                   forward_backward(model, x, y) for _ in range(n_steps + 1)],
           }, repeats=2), "at.neuron_scores")


def gpt2_small_mlp(n_samples: int = 256, n_layer: int = 1):
    """GPT-2 small's widths (d=768, 12 heads, MLP 3072) at 128 tokens, `n_samples` sequences,
    `n_layer` of its 12 blocks (one keeps the run short: the layer scored, h.0's MLP, is
    GPT-2-small-sized either way) and a 2-class head; every call at the default batch size.
    Prints wall medians of 2 interleaved runs after a warm-up, then each candidate's CPU
    time and peak resident memory."""
    model, ids, y, layer = _gpt2_small(n_samples, n_layer)
    scores = at.neuron_scores(model, layer, ids, y, "gradient_x_activation")
    assert scores.shape == (n_samples, 3072)
    ks = np.linspace(0, 3072, 5).round().astype(int)
    calls: dict[str, list[tuple[float, float]]] = {}
    candidates = {
        "gradient": lambda: at.neuron_scores(model, layer, ids, y, "gradient"),
        "gradient_x_activation": lambda: at.neuron_scores(model, layer, ids, y,
                                                          "gradient_x_activation"),
        f"pruning curve, 20 random orders, {len(ks)} k": lambda: at.pruning_curve(
            model, layer, ids, y, scores.mean(0), ks=ks, n_random=20),
        "one plain forward+backward": lambda: _embedding_backward(model, ids, y),
    }
    report(f"GPT-2-small-sized MLP layer {layer} (3072 features x 128 tokens), {n_samples} "
           f"sequences, {n_layer} block(s) of d=768 + the classification head",
           interleaved_medians({name: _measured(calls, name, run)
                                for name, run in candidates.items()}, repeats=2),
           "one plain forward+backward")
    floor = statistics.median(seconds for seconds, _ in calls["one plain forward+backward"][1:])
    rows = []
    for name, measured in calls.items():  # the first call of each is the warm-up
        seconds = statistics.median(seconds for seconds, _ in measured[1:])
        print(f"  {name:<48} {seconds * 1000:10.1f} ms CPU {seconds / floor:5.2f}x, "
              f"peak resident memory {max(mib for _, mib in measured):6.0f} MiB")
        rows.append((name, f"{seconds * 1000:.1f} ms", f"{seconds / floor:.2f}x",
                     f"{max(mib for _, mib in measured):.0f} MiB"))
    record(f"the same, CPU time and peak resident memory of each ({n_samples} sequences)",
           ("", "CPU time", "CPU time / one plain forward+backward", "peak resident memory"),
           rows)


def _gpt2_small(n_samples: int, n_layer: int = 1):
    """(model, token ids [n_samples, 128], targets, the layer scored): GPT-2 small's widths,
    `n_layer` blocks, a 2-class head."""
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from tests.support.models import Logits

    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_embd=768, n_head=12, n_inner=3072, vocab_size=1000,
                        n_positions=128, bos_token_id=999, eos_token_id=999, pad_token_id=0,
                        num_labels=2)
    model = Logits(GPT2ForSequenceClassification(config)).eval()
    ids, y = torch.randint(1, 1000, (n_samples, 128)), torch.randint(0, 2, (n_samples,))
    return model, ids, y, "model.transformer.h.0.mlp.act"


def first_call_against_warm(n_samples: int = 256):
    """The GPT-2-small-sized MLP layer: a first gradient x activation call (a fresh copy of
    the model, copied before the clock starts: torch.export and the split's check included)
    against a warm one, interleaved, medians of 3."""
    model, ids, y, layer = _gpt2_small(n_samples)
    fresh = iter([copy.deepcopy(model) for _ in range(4)])  # + the warm-up
    report(f"GPT-2-small-sized MLP layer {layer}, {n_samples} sequences x 128 tokens, "
           "gradient_x_activation: first call against a warm call",
           interleaved_medians({
               "first call": lambda: at.neuron_scores(next(fresh), layer, ids, y,
                                                      "gradient_x_activation"),
               "warm call": lambda: at.neuron_scores(model, layer, ids, y,
                                                     "gradient_x_activation"),
           }, repeats=3), "warm call")


def _embedding_backward(model, ids, y):
    """One forward and backward of the whole model (to the token embeddings)."""
    embeddings = model.model.transformer.wte
    store = {}

    def keep(module, args, output):
        store["e"] = output
    handle = embeddings.register_forward_hook(keep)
    try:
        logits = model(ids)
        torch.autograd.grad(logits.gather(1, y[:, None]).sum(), store["e"])
    finally:
        handle.remove()


def _measured(calls: dict[str, list[tuple[float, float]]], name: str, run):
    """`run`, wrapped to append (CPU seconds, peak resident MiB) of each call to calls[name].
    CPU time (user + system, one thread) is what a call costs whatever else the shared
    machine runs; the peak is the process's during the call: Linux's VmHWM, reset before
    it through /proc/self/clear_refs (which resets getrusage's ru_maxrss too)."""
    def measured():
        Path("/proc/self/clear_refs").write_text("5")
        start = time.process_time()
        run()
        seconds = time.process_time() - start
        status = Path("/proc/self/status").read_text().splitlines()
        kib = int(next(line for line in status if line.startswith("VmHWM")).split()[1])
        calls.setdefault(name, []).append((seconds, kib / 1024))
    return measured


PARTS = {"ablation": ablation_of_the_last_hidden_layer, "pt2": pt2_against_eager,
         "captum": resnet18_against_captum, "gpt2": gpt2_small_mlp,
         "first": first_call_against_warm}


def main() -> None:
    torch.set_num_threads(1)
    for part in sys.argv[1:] or PARTS:
        PARTS[part]()


if __name__ == "__main__":
    sys.exit(run(main, "bench_models"))
