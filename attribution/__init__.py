"""Neuron importance for PyTorch classifiers: scores, pruning curves and a degeneracy check.

    import attribution as at
    at.list_layers(model, example_input)
    at.neuron_scores(model, "fc2", inputs, targets, method="gradient")        # [N, n_neurons]
    at.cluster_scores(model, "fc2", inputs, targets, clusters, reduce="mean_abs")
    at.prune(model, "fc2", scores, k=8, inputs=inputs)                        # a pruned copy
    at.probe(model, "fc2", inputs, clusters).accuracy     # do the neurons encode the clusters?
    at.scorecard(model, inputs, labels, clusters)         # which method to trust, per layer

    view = at.View.of(model, "fc2", inputs, labels, clusters, method="gradient")
    at.diagnose_on(view)                          # the same analyses, on a view bound once

The names below are imported on first use (PEP 562), so `import attribution` and the command
line's overview (`python -m attribution --help`) do not import torch.
"""
import importlib

_HOMES = {
    ".errors": ("AttributionError",),
    ".engine.layers": ("LayerInfo", "list_layers"),
    ".methods.registry": ("method_names", "methods_for"),
    ".methods.scores": ("REDUCTIONS", "ScoreFacts", "cluster_scores", "neuron_scores",
                        "reduce_scores"),
    ".methods.probe": ("Probe", "probe"),
    ".analyses.pruning_curves": ("cluster_pruning_curves", "curve_summary", "model_metric",
                                 "pruning_curve"),
    ".analyses.prune": ("PruneCheck", "curve_checks", "prune", "prune_check", "save_folder",
                        "save_pt2"),
    ".analyses.oracle": ("oracle_agreement", "oracle_agreement_on"),
    ".analyses.oracle_sample": ("OraclePlan", "OracleSample", "plan_oracle", "sample_oracle"),
    ".analyses.scorecard": ("scorecard", "scorecard_cost", "scorecard_cost_on",
                            "scorecard_on", "scorecard_oracle_plans",
                            "scorecard_oracle_plans_on"),
    ".analyses.findings": ("Finding",),
    ".analyses.diagnose": ("DiagnosePlan", "diagnose", "diagnose_cost",
                           "diagnose_cost_on", "diagnose_on", "diagnose_plan",
                           "diagnose_plan_on"),
    ".analyses.view": ("View", "curve_cost_on", "pruned_model_file_on", "pruning_curves_on"),
    ".analyses.settings": ("AnalysisSettings",),
    ".inputs.architectures": ("Architecture", "parse_architecture"),
    ".inputs.loaded": ("LoadedModel",),
    ".inputs.model_formats": ("load_model",),
    ".inputs.data": ("Dataset", "StreamedData", "check_clusters", "check_data"),
    ".inputs.data_files": ("load_data",),
    ".analyses.clusters": ("CLUSTER_SOURCES", "make_clusters", "predict_classes"),
    ".inputs.demo": ("DEMOS", "demo_files", "load_demo"),
    ".engine.model_io": ("NamedInputs", "select_output"),
    ".methods.tokens": ("token_methods", "token_scores"),
    ".inputs.streaming": ("NpyRows",),
}
_SUBMODULES = {"distributed": ".analyses.distributed"}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [*_HOME_OF, *_SUBMODULES]


def __getattr__(name: str):
    """An exported name, imported from its module on first use (then an ordinary global)."""
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name], __name__)
    elif name in _HOME_OF:
        value = getattr(importlib.import_module(_HOME_OF[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *__all__})


def import_all() -> None:
    """Import every exported name's module now, as `import attribution` did before it was
    lazy: for a server that imports its libraries before its first visitor arrives."""
    for module in (*_HOMES, *_SUBMODULES.values()):
        importlib.import_module(module, __name__)
