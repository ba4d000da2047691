"""Run a model in two parts around one layer: the front (inputs -> layer output z) and the tail.

- `base`: the `LayerRunner` interface (capture, tail, forward_with_leaf, ablate) and the
  checks every runner shares;
- `hook`: `HookRunner`, any model, by replacing the layer's output in a full forward;
- `fx_graph` and `fx`: `FxRunner`, a traceable (or exportable) model split with torch.fx, so
  the tail is all that re-runs on stacked variants;
- `ablation`: the shortcut that runs per-neuron ops once when ablating many neurons;
- `select`: `runner_for`, the fastest runner that reproduces the model, cached.

Forward hooks are part of the model's function on both runners: a model whose own call runs
hooks (which the split would skip) runs on hooks.
"""
from .base import LAYER_KEYS, LayerRunner, check_differentiable, layer_attrs, runs_own_hooks
from .fx import FxRunner
from .hook import HookRunner
from .select import CHECK_ROWS, check_rows, runner_for

__all__ = ["CHECK_ROWS", "LAYER_KEYS", "FxRunner", "HookRunner", "LayerRunner",
           "check_differentiable", "check_rows", "layer_attrs", "runner_for", "runs_own_hooks"]
