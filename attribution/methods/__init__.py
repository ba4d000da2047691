"""Scoring methods: one registry behind one signature, each family in its own module, and the
passes that run them.

`registry` holds the types (`Batch`, `Method`), `register` and `REGISTRY`; the families
register their methods when imported, here, in the order menus list them:
`gradients` (gradient, activation, gradient × activation, the loss's Taylor terms),
`criteria` (active fraction and the data-free weight criteria), `paths` (integrated
gradients and conductance, with their quadrature and sum check), `ablation` (the exact
oracle and the random baseline), `propagation` (DeepLift, LRP: rules on the backward pass)
and `probe` (a linear probe fitted to the clusters). A new family is a module plus one name
in the import below. `shared` holds what the families share (targets' logits, their
gradients, per-neuron reduction); `scores` runs a method over a dataset (`neuron_scores`,
`cluster_scores`); `tokens` scores each token of a sequence.
"""
from .registry import REGISTRY, Batch, Method, method_names, methods_for, register
from . import gradients, criteria, paths, ablation, propagation, probe  # noqa: F401

__all__ = ["REGISTRY", "Batch", "Method", "method_names", "methods_for", "register"]
