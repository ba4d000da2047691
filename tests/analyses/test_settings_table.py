"""`attribution.analyses.settings.SETTINGS`: one row per setting, from which the command line's
options (`cli_options.add_setting`) and the dashboard's widgets (`sidebar.choose`, `draw_setting`)
are made, and `AnalysisSettings.for_data` takes its defaults. Each test changes a row and
sees both front ends change, so a widget or an option written out by hand again fails."""
from dataclasses import replace

import pytest

from attribution import cli, model_command
from attribution.analyses import settings
from attribution.analyses.settings import SETTINGS, AnalysisSettings, DataFacts
from attribution.engine.layers import LayerInfo

COMMANDS = ("score", "curve", "prune", "diagnose", "report", "scorecard")


def options_of(command: str) -> dict:
    """flag -> argparse action, of one command of a freshly built parser."""
    parser = cli.build_parser()
    sub = next(action for action in parser._actions if action.dest == "command")
    return {flag: action for action in sub.choices[command]._actions
            for flag in action.option_strings}


def command_line_help(text: str) -> str:
    """A row's help as an option says it (argparse's style: lower case, no full stop)."""
    return text[0].lower() + text[1:].rstrip(".")


def test_every_option_of_a_setting_says_its_row(monkeypatch):
    """Each row's help, replaced by a marker, is what the option of its flag says in every
    command that has it, except where a command says what the setting means there."""
    for name, setting in SETTINGS.items():
        monkeypatch.setitem(SETTINGS, name, replace(setting, help=f"Marker {name}."))
    own_words = {("prune", "--n-random"), ("prune", "--metric"), ("scorecard", "--n-random"),
                 ("prune", "--k")}  # prune's --k counts neurons: its k-means k is --kmeans-k
    own_words |= {(command, flag) for command in COMMANDS
                  for flag in ("--cluster", "--method", "--seed")}
    seen = set()
    for command in COMMANDS:
        options = options_of(command)
        for name, setting in SETTINGS.items():
            if setting.flag not in options or (command, setting.flag) in own_words:
                continue
            seen.add(name)
            assert options[setting.flag].help.startswith(f"marker {name}"), (command, name)
    assert options_of("prune")["--kmeans-k"].help.startswith("marker k")
    assert seen == {"layer", "neuron_axis", "cluster_source", "k", "reduce", "target",
                    "metric", "n_random", "batch_size"}


def test_a_rows_default_and_values_are_the_options(monkeypatch):
    """A changed default or set of values in a row changes the option; a default the data
    decides leaves the option empty (resolved once the data is read) and says so."""
    monkeypatch.setitem(SETTINGS, "reduce", replace(SETTINGS["reduce"], default="mean_abs",
                                                    choices=("mean_abs", "mean")))
    monkeypatch.setitem(SETTINGS, "batch_size", replace(SETTINGS["batch_size"], default=77))
    monkeypatch.setitem(SETTINGS, "k", replace(SETTINGS["k"], default=5))
    options = options_of("curve")
    assert options["--reduce"].default == "mean_abs"
    assert options["--reduce"].choices == ("mean_abs", "mean")
    assert options["--batch-size"].default == 77 and options["--k"].default == 5
    assert options["--batch-size"].type is model_command.positive
    assert options["--clusters"].default is None  # the data decides: label, provided...
    assert SETTINGS["cluster_source"].default_words in options["--clusters"].help
    assert options["--metric"].choices == settings.METRICS
    assert options_of("prune")["--reduce"].default == settings.DEFAULT_PRUNE_REDUCE  # its own
    assert options_of("diagnose")["--metric"].default == settings.EVIDENCE_METRIC


@pytest.mark.parametrize("facts", [
    DataFacts(has_labels=True, has_provided_clusters=True, n_samples=500),
    DataFacts(has_labels=False, has_provided_clusters=True, n_samples=5),
    DataFacts(has_labels=False, has_provided_clusters=False, n_samples=None),
    DataFacts(has_labels=True, has_provided_clusters=False, n_samples=40, regression=True),
    DataFacts(has_labels=False, has_provided_clusters=False, n_samples=40, regression=True),
])
def test_the_settings_a_front_end_starts_from_are_the_rows_defaults(facts):
    layers = [LayerInfo("fc1", "Linear", 16, (16,)), LayerInfo("relu1", "ReLU", 16, (16,)),
              LayerInfo("fc2", "Linear", 3, (3,))]
    facts = replace(facts, layers=tuple(layers))
    started = AnalysisSettings.for_data(layers, has_labels=facts.has_labels,
                                        has_provided_clusters=facts.has_provided_clusters,
                                        n_samples=facts.n_samples, regression=facts.regression)
    for name, setting in SETTINGS.items():
        if hasattr(started, name) and setting.default_of(facts) is not None:
            assert getattr(started, name) == setting.default_of(facts), name
        if setting.menu_for is not None and setting.choices is not None:
            assert set(setting.menu(facts)) <= set(setting.choices), name
        if setting.menu(facts) and setting.default_of(facts) is not None:
            assert setting.default_of(facts) in setting.menu(facts), name
    assert started.layer == "relu1"
    assert started.target == ("predicted" if facts.regression or not facts.has_labels
                              else "true")


def test_the_problem_of_the_command_line_resolves_the_rows_data_defaults(monkeypatch):
    """What the command line resolves once the data is read is the row's `default_for`."""
    problem = type("Problem", (), {"facts": DataFacts(has_labels=False,
                                                      has_provided_clusters=False)})()
    args = cli.build_parser().parse_args(["curve", "--model", "m", "--data", "d", "--layer",
                                          "x", "--out", "o"])
    assert cli.cluster_source_of(args, problem) == "predicted"
    assert cli.metric_of(args, problem) == settings.DEFAULT_METRIC
    assert cli.target_choice(args, problem) == ("predicted", 0)
    monkeypatch.setitem(SETTINGS, "cluster_source", replace(
        SETTINGS["cluster_source"], default_for=lambda facts: "kmeans_inputs"))
    monkeypatch.setitem(SETTINGS, "metric", replace(SETTINGS["metric"],
                                                    default_for=lambda facts: "loss"))
    assert cli.cluster_source_of(args, problem) == "kmeans_inputs"
    assert cli.metric_of(args, problem) == "loss"
