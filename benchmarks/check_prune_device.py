"""On a GPU: `at.prune` of a model on the device measures what the device's pruning curve says
at k, and its outputs equal the CPU's pruned copy's (float tolerance), on an MLP, a CNN and a
ResNet-style net, every layer kind, both ablations. Prints one line per case and exits 1 on a
mismatch.

    python -m benchmarks.check_prune_device [--device cuda]
"""
from __future__ import annotations

import argparse
import sys

import torch

import attribution as at
from tests.support.models import build, build_model

CASES = [("digits_mlp", "fc2"), ("digits_mlp", "relu1"), ("digits_cnn", "conv1"),
         ("digits_cnn", "relu2"), ("resnet", "layer1.0.bn1"), ("resnet", "layer2.0.conv1"),
         ("residual_conv", "relu")]


def _problem(name: str):
    if name.startswith("digits"):
        loaded, data = at.load_demo(name)
        return loaded.module, data.inputs, data.labels
    if name == "resnet":
        return build_model(name, n=64)
    return build(name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    device = parser.parse_args().device
    failures = 0
    for name, layer in CASES:
        model, x, y = _problem(name)
        scores = at.neuron_scores(model, layer, x, y, "gradient").abs().mean(0)
        k = scores.shape[0] // 3
        on_device = at.prune(model, layer, scores, 0, inputs=x).to(device)  # a copy there
        for mode in ("zero", "mean"):
            curve = at.pruning_curve(on_device, layer, x, y, scores, ks=[k], ablation=mode,
                                     metric="target_logit", n_random=1, device=device)
            pruned = at.prune(on_device, layer, scores, k, mode=mode, inputs=x, device=device)
            measured = at.model_metric(pruned, x, y, "target_logit", device=device)
            on_cpu = at.prune(model, layer, scores, k, mode=mode, inputs=x)
            with torch.no_grad():
                gap = (pruned(x.to(device)).cpu() - on_cpu(x)).abs().max().item()
            ok = abs(measured - curve["bottom"].item()) < 1e-4 and gap < 1e-4
            failures += not ok
            print(f"{'ok ' if ok else 'BAD'} {name:14s} {layer:16s} {mode:4s} k={k:3d} "
                  f"metric {measured:.6f} curve {curve['bottom'].item():.6f} "
                  f"max |device - cpu| {gap:.2e}", flush=True)
    print(f"{len(CASES) * 2 - failures} of {len(CASES) * 2} cases agree on {device} "
          f"({torch.cuda.get_device_name() if device.startswith('cuda') else device})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
