"""Neuron importance for PyTorch classifiers: scores, pruning curves and a degeneracy check.

    import attribution as at
    at.list_layers(model, example_input)
    at.neuron_scores(model, "fc2", inputs, targets, method="gradient")        # [N, n_neurons]
    at.cluster_scores(model, "fc2", inputs, targets, clusters, reduce="mean_abs")
    at.prune(model, "fc2", scores, k=8, inputs=inputs)                        # a pruned copy
    at.probe(model, "fc2", inputs, clusters).accuracy     # do the neurons encode the clusters?
    at.scorecard(model, inputs, labels, clusters)         # which method to trust, per layer
"""
from .errors import AttributionError
from .engine.layers import LayerInfo, list_layers
from .methods.registry import METHODS, methods_for
from .methods.scores import REDUCTIONS, cluster_scores, neuron_scores, reduce_scores
from .methods.probe import Probe, probe
from .analyses.pruning import cluster_pruning_curves, curve_summary, model_metric, pruning_curve
from .analyses.prune import prune, save_pt2
from .analyses.oracle import oracle_agreement
from .analyses.scorecard import scorecard
from .analyses.diagnose import Finding, diagnose
from .inputs.architectures import Architecture, parse_architecture
from .inputs.loaded import LoadedModel
from .inputs.loading import load_model
from .inputs.data import (CLUSTER_SOURCES, Dataset, StreamedData, check_clusters, check_data,
                          load_data, make_clusters, predict_classes)
from .inputs.demo import DEMOS, demo_files, load_demo
from .engine.model_io import NamedInputs, select_output
from .methods.tokens import TOKEN_METHODS, token_scores
from .inputs.streaming import NpyRows
from .analyses import distributed

__all__ = [
    "AttributionError", "LayerInfo", "METHODS", "methods_for", "REDUCTIONS", "cluster_scores",
    "list_layers", "neuron_scores", "reduce_scores", "Probe", "probe",
    "pruning_curve", "cluster_pruning_curves", "curve_summary", "model_metric", "prune",
    "save_pt2", "oracle_agreement", "scorecard",
    "Finding", "diagnose",
    "Architecture", "parse_architecture", "LoadedModel", "load_model", "CLUSTER_SOURCES",
    "Dataset", "StreamedData", "check_clusters", "check_data", "load_data", "make_clusters",
    "predict_classes",
    "DEMOS", "demo_files", "load_demo", "NamedInputs", "select_output", "TOKEN_METHODS",
    "token_scores",
    "NpyRows", "distributed",
]
