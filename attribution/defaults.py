"""The default values the library's own functions take, each defined once.

`attribution.analyses.settings` is the home of every setting: it re-exports these beside the
choices and the rules that pick a setting from the data (which cluster source, which target,
which layer), and the front ends (dashboard, HTML report, command line) read them there. The
values live here, in the lowest layer (this module imports nothing), because the library's
function signatures default to them too: `neuron_scores(method=DEFAULT_METHOD,
batch_size=DEFAULT_BATCH_SIZE)`, `pruning_curve(n_random=DEFAULT_N_RANDOM)`, ... so a call
without arguments and a front end without choices compute the same thing. Why each value was
chosen is said in the settings module.
"""

DEFAULT_METHOD = "gradient_x_activation"
"""The scoring method used when none is chosen (see `analyses.settings` for why)."""
DEFAULT_REDUCE = "mean"
"""How per-sample scores become a cluster score: the signed mean."""
DEFAULT_PRUNE_REDUCE = "mean_abs"
"""How per-sample scores rank the neurons `prune` removes: their mean magnitude."""
DEFAULT_BATCH_SIZE = 256
"""Samples per pass; results do not depend on it, memory does."""
DEFAULT_N_STEPS = 32
"""Integration steps of the path methods (integrated_gradients, conductance)."""
DEFAULT_SEED = 0
"""Seed of the random orders, of the `random` method and of k-means."""
DEFAULT_N_RANDOM = 20
"""Random orders forming a pruning curve's band."""
DEFAULT_METRIC = "accuracy"
"""What a pruning curve measures."""
DEFAULT_ABLATION = "zero"
"""What a removed neuron's output becomes in a pruning curve."""
