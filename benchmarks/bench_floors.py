"""Each computation against its floor, the least plain PyTorch that does the same work.

Timed side by side in 5 interleaved runs: each row gives the floor, the median of the 5
per-run ratios, and their spread (min-max), so a slow run shows as the machine (every ratio
holds) or as the code (the ratio moves). Each ratio is the candidate's time over the floor's
timed just before it, each the least of 3 timings back to back.

Floors, over the same batches (256 samples; inputs on the CPU, as users pass them):
- `gradient`, `gradient_x_activation`: one plain forward+backward of the target logits,
  backward to the inputs (a layer's gradient stops at the layer, so the engine can be under
  it); Captum's `LayerGradientXActivation` against the same floor;
- `taylor`, `fisher`: one plain forward+backward of the cross-entropy;
- `probe` of the labels: the target logits' floor (its own work is one forward for the
  activations and the fit); scikit-learn's `LogisticRegression` (saga, tol 1e-6) with the same
  penalty on the same activations beside it;
- `deeplift`, `lrp`: the target logits' floor; Captum's `LayerDeepLift` (zero baseline) and
  `LayerLRP` against it too (LRP where Captum's rules cover the model: not the conv net, whose
  Flatten has no rule);
- exact `ablation` of every neuron: the front once, then one plain tail per neuron with that
  neuron zeroed;
- a pruning curve, 9 k x 11 orders (ranked, bottom, 9 random): the front once, then one plain
  masked tail per (order, k).

On a light tail, an MLP (64-128-64-10 on the digits, 10,782 samples; layer "2", 64 units),
and a heavy one, a 3-conv net (32 channels, 16x16 images; its first conv, 32 channels, 256
images; the curve on 64). `--device cuda` runs everything on a GPU (times synchronised),
after checking every method there against the CPU on the test models (exit status 1 beyond
1e-4 of the scores' scale); its results file belongs in `benchmarks/kept/`, which `make
bench`, run where there is no GPU, keeps beside its own runs.

    python -m benchmarks.bench_floors [--device cuda] [--results FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np
import torch
from captum.attr import LayerDeepLift, LayerGradientXActivation, LayerLRP
from torch import nn

import attribution as at
from attribution.engine.layers import module_kind
from attribution.analyses.pruning_curves import random_orders
from benchmarks.common import batches, digits_mlp, note, record, run

BATCH, RUNS, REPEATS, N_RANDOM = 256, 5, 3, 9


def conv_net(n_images: int = 256, side: int = 16, seed: int = 0
             ) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(3-conv net, images [n_images, 3, side, side], labels): untrained, seeded."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10)).eval()
    x = torch.randn(n_images, 3, side, side)
    return model, x, torch.randint(0, 10, (n_images,))


class Timer:
    """Seconds of a call, the device synchronised before and after it."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, call: Callable[[], object]) -> float:
        self.sync()
        start = time.perf_counter()
        call()
        self.sync()
        return time.perf_counter() - start

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def ratios_to_floor(timer: Timer, floor: Callable[[], object],
                    candidates: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Per candidate, its time over the floor's in each of `RUNS` interleaved runs, after one
    warm-up of each. In a run, the floor and then the candidate each take the least of
    `REPEATS` timings back to back (timeit's rule: the least is the code, the rest is other
    work on the machine), so a slow spell shows in neither side rather than in one; "floor"
    holds each run's floor seconds."""
    floor()
    for call in candidates.values():
        call()
    seconds: dict[str, list[float]] = {"floor": []}
    ratios: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(RUNS):
        for name, call in candidates.items():
            base = min(timer(floor) for _ in range(REPEATS))
            seconds["floor"].append(base)
            ratios[name].append(min(timer(call) for _ in range(REPEATS)) / base)
    return {"floor": seconds["floor"], **ratios}


def report_floor(title: str, floor_name: str, ratios: dict[str, list[float]]) -> None:
    """Print and record each candidate's median ratio and spread over the runs."""
    floor_ms = statistics.median(ratios["floor"]) * 1000
    print(f"\n{title}\n  floor: {floor_name}, median {floor_ms:.1f} ms")
    rows = []
    for name, values in ratios.items():
        if name == "floor":
            continue
        median, low, high = statistics.median(values), min(values), max(values)
        print(f"  {name:<40} {median:6.2f}x the floor   ({low:.2f}-{high:.2f} over {RUNS} runs)")
        rows.append((name, floor_name, f"{floor_ms:.1f} ms", f"{median:.2f}x",
                     f"{low:.2f}-{high:.2f}x"))
    record(title, ("", "floor", "floor's median", "median ratio to the floor",
                   f"spread over {RUNS} interleaved runs"), rows)


def logit_floor(model, x, y, device, loss: bool = False):
    """One plain forward+backward per batch (to the inputs): of the target logits, or of
    the cross-entropy."""
    def call():
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            xb = xb.to(device).requires_grad_(True)
            logits = model(xb)
            yb = yb.to(device)
            value = (nn.functional.cross_entropy(logits, yb, reduction="sum") if loss
                     else logits.gather(1, yb[:, None]).sum())
            torch.autograd.grad(value, xb)
    return call


def captum_gxa(model, module, x, y, device):
    explainer = LayerGradientXActivation(model, module)

    def call():
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            explainer.attribute(xb.to(device), target=yb.to(device))
    return call


def captum_rules(model, module, x, y, device, lrp: bool = False):
    """Captum's LayerDeepLift (zero baseline) or LayerLRP, batch by batch."""
    explainer = LayerLRP(model, module) if lrp else LayerDeepLift(model, module)

    def call():
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            xb = xb.to(device)
            if lrp:
                explainer.attribute(xb, target=yb.to(device))
            else:
                explainer.attribute(xb, torch.zeros_like(xb), target=yb.to(device))
    return call


def sklearn_probe(model, path: str, x, y):
    """The same probe fitted by scikit-learn: the activations, then its saga solver with the
    same penalty and standardisation (tol 1e-6)."""
    from sklearn.linear_model import LogisticRegression

    from attribution.methods.probe import L1, L2, held_out_rows

    def call():
        activations = at.neuron_scores(model, path, x, None, "activation").double().numpy()
        codes = y.numpy()
        train = activations[~held_out_rows(codes, 0)]
        mean, scale = train.mean(0), train.std(0)
        scale[scale <= 1e-12] = 1.0
        strength = L1 + 2 * L2
        LogisticRegression(l1_ratio=L1 / strength, C=1 / (len(train) * strength),
                           solver="saga", tol=1e-6, max_iter=10_000).fit(
            (train - mean) / scale, codes[~held_out_rows(codes, 0)])
    return call


def ablation_floor(front, tail, x, y, n_neurons, device):
    """The front once per batch, then one plain tail per neuron with it zeroed."""
    @torch.no_grad()
    def call():
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            z, yb = front(xb.to(device)), yb.to(device)
            base = tail(z).gather(1, yb[:, None])
            for j in range(n_neurons):
                zeroed = z.clone()
                zeroed[:, j] = 0
                base - tail(zeroed).gather(1, yb[:, None])
    return call


def curve_floor(front, tail, x, y, orders, ks, device):
    """The front once per batch, then one plain masked tail per (order, k): accuracy."""
    @torch.no_grad()
    def call():
        correct = torch.zeros(len(orders), len(ks), device=device)
        for xb, yb in zip(batches(x, BATCH), batches(y, BATCH)):
            z, yb = front(xb.to(device)), yb.to(device)
            shape = (1, z.shape[1]) + (1,) * (z.dim() - 2)
            for row, order in enumerate(orders):
                for column, k in enumerate(ks):
                    mask = torch.ones(z.shape[1], device=device)
                    mask[order[:k]] = 0
                    correct[row, column] += (tail(z * mask.view(shape)).argmax(1) == yb).sum()
        return correct.cpu() / len(x)
    return call


def case(name: str, model: nn.Module, layer: int, x, y, curve_rows: int,
         device: torch.device) -> None:
    """Every row for one model, scored at Sequential index `layer`."""
    timer, path = Timer(device), str(layer)
    front, tail = model[:layer + 1], model[layer + 1:]
    module = model[layer]
    n_neurons = front(x[:1].to(device)).shape[1]

    def ours(method):
        return lambda: at.neuron_scores(model, path, x, y, method)

    report_floor(f"{name}: gradients, {len(x)} samples", "plain forward+backward of the "
                 "target logits", ratios_to_floor(timer, logit_floor(model, x, y, device), {
                     "gradient": ours("gradient"),
                     "gradient_x_activation": ours("gradient_x_activation"),
                     "Captum LayerGradientXActivation": captum_gxa(model, module, x, y,
                                                                    device)}))
    report_floor(f"{name}: loss criteria, {len(x)} samples", "plain forward+backward of the "
                 "cross-entropy", ratios_to_floor(timer, logit_floor(model, x, y, device, True),
                                                  {"taylor": ours("taylor"),
                                                   "fisher": ours("fisher")}))
    rules = {"deeplift": ours("deeplift"),
             "Captum LayerDeepLift": captum_rules(model, module, x, y, device)}
    if "lrp" in at.methods_for(x.dtype, module_kind(path, module), model):
        rules.update({"lrp": ours("lrp"),
                      "Captum LayerLRP": captum_rules(model, module, x, y, device, lrp=True)})
    report_floor(f"{name}: propagation rules, {len(x)} samples", "plain forward+backward of "
                 "the target logits", ratios_to_floor(timer, logit_floor(model, x, y, device),
                                                      rules))
    report_floor(f"{name}: the probe of the labels, {len(x)} samples", "plain forward+backward "
                 "of the target logits", ratios_to_floor(timer, logit_floor(model, x, y, device), {
                     "probe": lambda: at.neuron_scores(model, path, x, y, "probe",
                                                       clusters=y.numpy()),
                     "scikit-learn's LogisticRegression (saga) on the same activations":
                         sklearn_probe(model, path, x, y)}))
    report_floor(f"{name}: exact ablation of all {n_neurons} neurons, {len(x)} samples",
                 "the front once, a plain tail per neuron zeroed",
                 ratios_to_floor(timer, ablation_floor(front, tail, x, y, n_neurons, device),
                                 {"ablation": ours("ablation")}))
    xc, yc = x[:curve_rows], y[:curve_rows]
    scores = np.random.default_rng(0).random(n_neurons)
    ks = [int(k) for k in np.linspace(0, n_neurons, 9).round()]
    orders = [np.argsort(-scores, kind="stable"), np.argsort(scores, kind="stable")]
    orders += list(random_orders(n_neurons, N_RANDOM, 0).numpy())
    report_floor(f"{name}: pruning curve, {len(ks)} k x {len(orders)} orders, {len(xc)} samples",
                 "the front once, a plain masked tail per (order, k)",
                 ratios_to_floor(timer, curve_floor(front, tail, xc, yc, orders, ks, device),
                                 {"pruning_curve": lambda: at.pruning_curve(
                                     model, path, xc, yc, scores, ks=ks, n_random=N_RANDOM)}))


def equal_to_cpu(device: torch.device) -> bool:
    """Every method on `device` against the CPU, on the test models (TF32 off: float32
    throughout); records the largest difference relative to the scores' scale."""
    from tests.support.models import SequenceNet, TokenNet, build, build_model, groups

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cases = [(*build("residual_mlp"), ("fc1", "bn", "fc2")),
             (*build("residual_conv"), ("conv1", "conv2")),
             (SequenceNet().eval(), torch.randn(12, 9, 3), torch.randint(0, 3, (12,)),
              ("proj", "mix")),
             (TokenNet().eval(), torch.randint(0, 20, (12, 5)), torch.randint(0, 3, (12,)),
              ("fc1",))]
    gpt2, ids, labels = build_model("gpt2", n=8)
    cases.append((gpt2, ids, labels, ("model.transformer.h.0.mlp.c_fc",)))
    rows, worst = [], 0.0
    for model, x, y, layers in cases:
        for layer in layers:
            kind = module_kind(layer, model.get_submodule(layer))
            for method in at.methods_for(x.dtype, kind):
                options = dict(n_steps=8, clusters=groups(x))
                cpu = at.neuron_scores(model, layer, x, y, method, **options)
                other = at.neuron_scores(model, layer, x, y, method, device=device, **options)
                scale = float(cpu.abs().max()) or 1.0
                difference = float((other - cpu).abs().max()) / scale
                worst = max(worst, difference)
                rows.append((f"{type(model).__name__} {layer}", method, f"{difference:.1e}"))
    print(f"every method on {device} against the CPU: largest relative difference {worst:.1e}")
    record(f"Every method on {device} against the CPU (largest |difference| / largest |score|)",
           ("model and layer", "method", "relative difference"), rows)
    return worst <= 1e-4


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not torch.cuda.is_available():
        note("No CUDA device on this machine: the GPU rows were not measured.")
        print("no CUDA device")
        return 0
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"CPU, {torch.get_num_threads()} threads")
    note(f"On {where}; batches of {BATCH}; {RUNS} interleaved runs after a warm-up.")
    print(where)
    same = equal_to_cpu(device) if device.type != "cpu" else True
    mlp, x, y = digits_mlp()
    case("MLP 64-128-64-10", mlp.to(device), 2, x, y, len(x), device)
    conv, x, y = conv_net()
    case("3-conv net, first conv", conv.to(device), 0, x, y, 64, device)
    if device.type == "cuda":  # work that fills a GPU: 4,096 images of 64x64
        conv, x, y = conv_net(4096, 64)
        case("3-conv net on 64x64 images, first conv", conv.to(device), 0, x, y, 1024, device)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run(main, "bench_floors"))
