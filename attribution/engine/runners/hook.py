"""`HookRunner`: works on any model by replacing the layer's output in a full forward."""
from __future__ import annotations

import torch

from ...errors import AttributionError
from ..guards import engine_modes, forward_hooks, leaf_like
from ..layers import output_tensor, run_logits, with_output_tensor
from ..model_io import n_rows
from .base import LayerRunner, repeat_batch


class HookRunner(LayerRunner):
    """Works on any model: replaces the layer's output inside a full forward pass."""

    def _run(self, x: torch.Tensor, replace) -> torch.Tensor:
        calls = []

        def hook(module, args, output):
            calls.append(output)
            if len(calls) > 1:
                raise AttributionError(
                    f"Layer {self.name!r} runs more than once per forward pass (a shared "
                    "module); score a module that runs once, e.g. the layer feeding it."
                )
            tensor = output_tensor(output)  # a tuple's / ModelOutput's first tensor
            if tensor is None or tensor.dim() < 2:
                shown = (f"a {type(output).__name__} holding no tensor" if tensor is None
                         else f"{type(tensor).__name__}{list(tensor.shape)}")
                raise AttributionError(
                    f"Layer {self.name!r} has no neuron axis: its output is {shown}. "
                    "Pick a layer from list_layers()."
                )
            replaced = replace(tensor)
            return None if replaced is None else with_output_tensor(output, replaced)

        with forward_hooks({self.module: hook}):
            logits = run_logits(self.model, x)
        if not calls:
            raise AttributionError(f"Layer {self.name!r} did not run in the forward pass; "
                                   "pick a layer from list_layers().")
        return logits

    def capture(self, x):
        captured = {}

        def keep(output):
            captured["z"] = self.to_neurons(output.detach().clone())
            return None

        with torch.no_grad():
            logits = self._run(x, keep)
        return captured["z"], x, logits

    def tail(self, z, state, repeats):
        x = repeat_batch(state, n_rows(state), repeats)

        def swap(output):
            moved = self.from_neurons(z)
            if output.shape != moved.shape:
                raise AttributionError(f"Internal shape mismatch at layer {self.name!r}.")
            # the model's own layout: its next op may view() it
            return moved.clone(memory_format=torch.contiguous_format) if z.requires_grad \
                else moved.contiguous()

        if z.requires_grad:
            self.check_differentiable_once()
        return self._run(x, swap)

    def forward_with_leaf(self, x):
        self.check_differentiable_once()
        captured = {}

        def to_leaf(output):
            torch.set_grad_enabled(True)  # the part before the layer ran without a graph
            captured["z"] = leaf_like(self.to_neurons(output))
            return self.from_neurons(captured["z"].clone())

        with engine_modes(), torch.no_grad():
            logits = self._run(x, to_leaf)
        return captured["z"], logits
