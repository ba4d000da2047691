"""Scoring methods: one registry behind one signature, and the passes that run them.

`registry` holds every method (`register` adds one: a function plus one decorator line;
`propagation` adds the methods that change the backward pass, such as DeepLift; `probe` the
linear probe, fitted to the clusters);
`scores` runs a method over a dataset (`neuron_scores`, `cluster_scores`); `tokens` scores
each token of a sequence.
"""
from .registry import METHODS, REGISTRY, Batch, Method, MethodNames, methods_for, register
from . import propagation, probe  # noqa: F401 - register their methods

__all__ = ["METHODS", "REGISTRY", "Batch", "Method", "MethodNames", "methods_for", "register"]
