"""The verdict: one answer in plain words from the real findings of `diagnose`, with the
remedies that address the cause, on models whose health is known by construction; and its
rules table, enumerated: no headline asserts what a shown check refutes."""
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses.findings import CAPTURE_PATTERNS, CHECKS
from attribution.analyses.verdict import (CAPTURE_HEADLINES, CAUSES, CHECK_NAMES, CHOICES,
                                          HEADLINES, SIGNAL, Finding, Remedy, check_name,
                                          check_package, cluster_composition, describe_mix,
                                          dominant_class, expected_loop, headline, outcomes,
                                          try_remedies, verdict, verdict_rank)
from attribution.methods.registry import REGISTRY

from tests.support.diagnosis import (WIDTH, HandSetNet, LeakyGradientAttribution, data,
                                     seed_000_stale_gradient_loop, seed_002_whole_batch_loop)

LOOPED = [name for name in at.method_names() if REGISTRY[name].score_line]  # a slow-loop line each


def findings_of(method="gradient", reduce="mean", one_class=True, **kwargs):
    """HandSetNet: the gradient of logit 0 is +w, of logit 1 is -w. With 22 targets of
    class 0 and 18 of class 1 the class-0 cluster agrees in sign, while over all samples
    the signed mean keeps |22 - 18| / 40 = 10% of the magnitude."""
    model, (x, _) = HandSetNet().eval(), data()
    y = torch.tensor([0] * 22 + [1] * 18)
    clusters = y.numpy() if one_class else None
    cluster = 0 if one_class else None
    return at.diagnose(model, "fc", x, y, method, clusters, cluster=cluster, reduce=reduce,
                       **kwargs)


def test_every_check_has_a_place_in_the_causes_and_names_for_both_outcomes():
    assert set(CAUSES) == set(CHECKS) == set(CHECK_NAMES)
    assert set(CAPTURE_HEADLINES) == set(CAPTURE_PATTERNS)
    for code, (passed, flagged) in CHECK_NAMES.items():
        assert passed != flagged
        assert check_name(Finding(code, "ok", "", 0.0)) == passed
        assert check_name(Finding(code, "warning", "", 0.0)) == flagged


def test_a_one_class_cluster_gets_usable_scores_and_no_remedy():
    answer = verdict(findings_of(), method="gradient", reduce="mean", cluster_source="label")
    assert answer.severity == "ok" and answer.headline == "These scores are usable"
    assert answer.remedies == () and answer.action == "" and answer.cause == ""
    assert f"All {len(CHECKS) - 2} checks passed" in answer.explanation  # no user scores,
    # and the gradient has no sum to check (incomplete_integral)


def test_signs_cancelling_over_a_mixed_cluster_say_so_and_offer_the_three_remedies():
    """The signed mean keeps 10% of the magnitude, yet (the signs are those of one weight
    vector) the ranking still beats every random order and matches ablation: the headline
    says both, never "noise"."""
    findings = findings_of(one_class=False)
    answer = verdict(findings, method="gradient", reduce="mean", cluster_source="kmeans_inputs")
    assert answer.cause == "sign_cancellation" and answer.severity == "warning"
    assert answer.signal == "strong"
    assert answer.headline == ("The signed mean cancels, yet the ranking tracks ablation and "
                               "beats random")
    assert [(r.choice, r.value) for r in answer.remedies] == [
        ("cluster_source", "label"), ("reduce", "mean_abs"), ("method", "gradient_x_activation")]
    assert answer.action == "Use one-class clusters (by true label)."
    assert {r.choice for r in answer.remedies} <= set(CHOICES)


def test_one_class_clusters_and_magnitudes_clear_the_cancellation_verdict():
    mixed = verdict(findings_of(one_class=False), method="gradient", reduce="mean",
                    cluster_source="kmeans_inputs")
    for remedy in mixed.remedies[:2]:  # gradient x activation keeps the signs of w here
        settings = {"method": "gradient", "reduce": "mean", "cluster_source": "kmeans_inputs",
                    remedy.choice: remedy.value}
        findings = findings_of(one_class=settings["cluster_source"] == "label",
                               method=settings["method"], reduce=settings["reduce"])
        after = verdict(findings, **settings)
        assert after.cause != "sign_cancellation", remedy


def test_remedies_never_repeat_the_current_choice():
    findings = findings_of(one_class=False)
    answer = verdict(findings, method="gradient_x_activation", reduce="mean",
                     cluster_source="label")
    assert ("method", "gradient_x_activation") not in [(r.choice, r.value)
                                                        for r in answer.remedies]
    assert all(r.choice != "cluster_source" for r in answer.remedies)  # already one class
    without_labels = verdict(findings, method="gradient", reduce="mean",
                             cluster_source="correctness", has_labels=False)
    assert Remedy("cluster_source", "predicted", "Use one-class clusters (by predicted label)") \
        in without_labels.remedies


def test_dead_neurons_alone_are_a_note_not_a_verdict():
    dead = Finding("dead_neurons", "warning", "2 of 16 neurons are dead on every sample.", 0.1)
    findings = [f if f.code != "dead_neurons" else dead for f in findings_of()]
    answer = verdict(findings, method="gradient", reduce="mean", cluster_source="label")
    assert answer.headline == "These scores are usable"
    assert answer.notes == ("Dead neurons: 2 of 16 neurons are dead on every sample.",)
    assert answer.explanation.startswith(f"{len(findings) - 1} of {len(findings)} checks "
                                         "passed") and "dead" not in answer.explanation


@pytest.mark.parametrize("loop, pattern", [
    (seed_002_whole_batch_loop, "whole_batch"),
    (seed_000_stale_gradient_loop, "accumulating"),
])
def test_the_users_own_buggy_loop_decides_the_verdict(loop, pattern):
    model, (x, y) = HandSetNet().eval(), data()
    model.zero_grad()
    user = loop(model, model.fc, x, y)
    findings = at.diagnose(model, "fc", x, y, "gradient", user_scores=user)
    answer = verdict(findings, method="gradient", reduce="mean")
    assert answer.cause == "suspicious_gradient_capture" and answer.severity == "problem"
    assert answer.headline == CAPTURE_HEADLINES[pattern]


def test_hooks_left_attached_are_named_in_the_verdict():
    model, (x, y) = HandSetNet().eval(), data()
    attribution = LeakyGradientAttribution(model)
    attribution.attribute(model.fc, x, y)
    user = attribution.attribute(model.fc, x, y)  # the engine refuses the leaky model itself
    findings = at.diagnose(HandSetNet().eval(), "fc", x, y, "gradient", user_scores=user)
    assert verdict(findings, method="gradient", reduce="mean").headline == \
        CAPTURE_HEADLINES["stale_hooks"]


def test_cluster_composition_counts_each_clusters_classes():
    clusters = np.array([0, 0, 0, 0, 1, 1, 1])
    classes = np.array([6, 6, 6, 8, 1, 2, 3])
    names = tuple("zero one two three four five six seven eight nine".split())
    table = cluster_composition(clusters, classes, names)
    first = table[table["cluster"] == 0]
    assert first["name"].tolist() == ["six", "eight"] and first["count"].tolist() == [3, 1]
    assert first["share"].tolist() == [0.75, 0.25]
    assert table.groupby("cluster")["share"].sum().tolist() == pytest.approx([1.0, 1.0])
    assert describe_mix(table, 0) == "75% six, 25% eight"
    assert describe_mix(table, 1, shown=1) == "33% one, 2 more classes"
    assert cluster_composition(clusters, classes)["name"].iloc[0] == "6"


def test_a_mixed_kmeans_cluster_of_the_demo_is_described_by_its_classes():
    loaded, dataset = at.load_demo("digits_mlp")
    clusters = at.make_clusters("kmeans_inputs", dataset, loaded, k=2)
    table = cluster_composition(clusters, dataset.labels.numpy(), dataset.class_names)
    assert (table.groupby("cluster").size() > 1).all()  # two clusters of ten digits: mixed
    counts = table.groupby("cluster")["count"].sum()
    assert counts.tolist() == np.bincount(clusters).tolist()
    assert torch.equal(torch.as_tensor(sorted(table["class"].unique())),
                       dataset.labels.unique())


def layer_of(model: nn.Module, x: torch.Tensor, name: str) -> at.LayerInfo:
    """Layer `name` as the dashboard lists it (`list_layers`)."""
    return next(info for info in at.list_layers(model, x) if info.name == name)


@pytest.mark.parametrize("method", LOOPED)
def test_the_loop_shown_to_the_user_matches_the_engine_on_the_downloaded_package(
        method, tmp_path, monkeypatch):
    model, (x, y) = HandSetNet().eval(), data()
    ids = np.arange(100, 100 + len(x))
    (tmp_path / "cluster_check.npz").write_bytes(check_package(x, y, ids, labels=y))
    monkeypatch.chdir(tmp_path)
    loop = expected_loop(layer_of(model, x, "fc"), method)
    assert "captured.update(z=out))" in loop and "movedim" not in loop  # a tensor: as simple
    exec(loop, {"model": model})  # the snippet as the page shows it
    user = np.load(tmp_path / "my_scores.npy")
    assert user.shape == (len(x), WIDTH)
    findings = {f.code: f for f in at.diagnose(model, "fc", x, y, method, user_scores=user)}
    assert findings["suspicious_gradient_capture"].severity == "ok"
    package = np.load(tmp_path / "cluster_check.npz")
    assert package["sample_ids"].tolist() == ids.tolist()
    assert package["targets"].tolist() == package["labels"].tolist() == y.tolist()


def test_output_entry_indexes_the_tensor_output_tensor_takes():
    """`output_entry` as Python code, applied to the output, gives `output_tensor`'s tensor:
    nested tuples and lists, dicts and ModelOutputs with empty fields, a plain tensor."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from attribution.engine.layers import output_entry, output_tensor

    a, b = torch.ones(2, 3), torch.zeros(2, 4)
    outputs = [a, (a, b), [None, (b, a)], {"sizes": 3, "hidden": b, "other": a},
               BaseModelOutputWithPooling(last_hidden_state=None, pooler_output=b)]
    for output in outputs:
        assert eval("output" + output_entry(output)) is output_tensor(output)
    assert [output_entry(output) for output in outputs[:3]] == ["", "[0]", "[1][0]"]


class AttentionBlock(nn.Module):
    """h + attention(h) [N, T, 8], returned as a ModelOutput with the attention weights."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, h, *_):
        from transformers.modeling_outputs import BaseModelOutput

        attended, weights = self.attention(h, h, h)
        return BaseModelOutput(last_hidden_state=h + attended, attentions=weights)


class AttentionNet(nn.Module):
    """Token features [N, T, 4] -> Linear -> `attention` (a module returning a tuple or a
    ModelOutput, its first entry [N, T, 8]) -> tanh, mean over tokens -> 3 logits."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.embed, self.attention, self.head = nn.Linear(4, 8), attention, nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        return self.head(torch.tanh(self.attention(h, h, h)[0]).mean(1))


ATTENTION = {"tuple (MultiheadAttention)": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                                             "[0]"),
             "ModelOutput": (AttentionBlock, "['last_hidden_state']")}


@pytest.mark.parametrize("method", LOOPED)
@pytest.mark.parametrize("make, entry", ATTENTION.values(), ids=ATTENTION.keys())
def test_the_loop_takes_the_layer_from_a_tuple_or_model_output_and_its_features_axis(
        make, entry, method, tmp_path, monkeypatch):
    """A layer whose module returns several values, its neurons along dim 2 (features of
    tokens): the snippet, run as the user would copy it, gives the engine's scores."""
    torch.manual_seed(0)
    model, x = AttentionNet(make()).eval(), torch.randn(6, 5, 4)
    y = torch.randint(0, 3, (len(x),))
    layer = layer_of(model, x, "attention")
    assert (layer.output_entry, layer.neuron_axis, layer.n_neurons) == (entry, 2, 8)
    (tmp_path / "cluster_check.npz").write_bytes(check_package(x, y, np.arange(len(x))))
    monkeypatch.chdir(tmp_path)
    loop = expected_loop(layer, method)
    assert f"captured.update(z=out{entry}))" in loop and "movedim(2, 1)" in loop
    exec(loop, {"model": model})
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "my_scores.npy")),
                               at.neuron_scores(model, layer.spec, x, y, method),
                               rtol=1e-4, atol=1e-5)


def transformers_classifier(kind: str) -> nn.Module:
    """A small GPT-2 or BERT sequence classifier (3 classes, vocabulary of 40), as
    `attribution.inputs.huggingface` loads one (no key/value cache)."""
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2,
                                         n_positions=32, num_labels=3, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=1, use_cache=False)
        return transformers.GPT2ForSequenceClassification(config).eval()
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=24,
                                     max_position_embeddings=32, num_labels=3, pad_token_id=0)
    return transformers.BertForSequenceClassification(config).eval()


TRANSFORMERS_LAYERS = {  # a layer whose module returns several values, its entry
    "gpt2": ("transformer", "['last_hidden_state']"),  # GPT2Model: a ModelOutput
    "bert": ("bert.encoder.layer.0.attention.self", "[0]")}  # BertSelfAttention: a tuple


@pytest.mark.parametrize("method", LOOPED)
@pytest.mark.parametrize("kind", list(TRANSFORMERS_LAYERS))
def test_the_loop_on_a_transformers_layer_with_named_inputs_and_padding(
        kind, method, tmp_path, monkeypatch):
    """GPT2Model (a ModelOutput) / BertSelfAttention (a tuple), features along dim 2, in a
    classifier fed input_ids and an attention mask with padding, returning a ModelOutput:
    the snippet for the package of those named inputs gives the engine's scores (padding
    left out of the mean of `activation`)."""
    model = transformers_classifier(kind)
    lengths = torch.tensor([7, 3, 5, 7, 2])
    mask = (torch.arange(7)[None] < lengths[:, None]).long()
    x = {"input_ids": torch.randint(2, 40, (5, 7)) * mask, "attention_mask": mask}
    y = torch.randint(0, 3, (5,))
    name, entry = TRANSFORMERS_LAYERS[kind]
    layer = layer_of(model, x, name)
    assert (layer.output_entry, layer.neuron_axis) == (entry, 2)
    (tmp_path / "cluster_check.npz").write_bytes(check_package(x, y, np.arange(5)))
    monkeypatch.chdir(tmp_path)
    exec(expected_loop(layer, method, x), {"model": model})
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "my_scores.npy")),
                               at.neuron_scores(model, layer.spec, x, y, method),
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------- the rules table: never against a check

RANDOM_OUTCOMES, ABLATION_OUTCOMES = ("beats", "unclear", "no_better"), (
    "agrees", "loosely", "disagrees", "untold")


def refuted_claims(text: str, random: str, ablation: str, reason: str) -> list[str]:
    """What `text` asserts that the checks with these outcomes refute."""
    said = text.lower()
    claims_random = re.search(r"(?<!clearly )beats random", said) or "usable" in said
    claims_ablation = re.search(r"(?<!loosely )(?<!neither )(?<!whether it )(?<!whether the "
                                r"ranking )tracks (exact )?ablation",
                                said) or "usable" in said or "as ablation ranks" in said
    wrong = []
    if random == "beats" and re.search(r"noise|no better than random|no more damage than "
                                       r"random|carries nothing|mostly ties", said):
        wrong.append("denies a ranking that beats random")
    if random != "beats" and claims_random:
        wrong.append("claims a ranking that is not shown to beat random")
    if ablation == "agrees" and re.search(r"noise|do(es)? not track|unlike exact ablation|"
                                          r"loosely|neither tracks", said):
        wrong.append("denies the agreement with ablation")
    if ablation != "agrees" and claims_ablation:
        wrong.append("claims an agreement with ablation that is not shown")
    for word, cause in (("cancel", "cancels"), ("dead", "dead"), ("rounding", "rounding")):
        if word in said and reason != cause:
            wrong.append(f"names {cause} that no check flagged")
    return wrong


def test_every_combination_of_outcomes_has_one_headline_no_shown_check_refutes():
    table = {}
    for reason in HEADLINES:
        for random in RANDOM_OUTCOMES:
            for ablation in ABLATION_OUTCOMES:
                severity, text, signal = headline(reason, random, ablation)
                assert severity in ("ok", "warning", "problem") and text
                assert not refuted_claims(text, random, ablation, reason), (
                    reason, random, ablation, text)
                assert (severity == "problem") == (signal == "none")
                assert (severity == "ok") == (signal == "strong" and reason == "none")
                table[(reason, random, ablation)] = text
    assert len(table) == len(HEADLINES) * 12 and set(SIGNAL) == {
        (r, a) for r in RANDOM_OUTCOMES for a in ABLATION_OUTCOMES}
    assert table[("cancels", "beats", "loosely")] == (
        "The signed mean cancels, yet the ranking still carries signal")
    assert table[("cancels", "no_better", "disagrees")] == (
        "Averaging cancels: the ranking is mostly noise")


def test_an_agreement_too_few_neurons_can_tell_asks_to_ablate_more_not_to_change_method():
    """disagrees_with_ablation on a sample too small to tell (`TOO_FEW_NEURONS`): the ranking
    is "untold", not "loosely" tracking ablation; the action is its hint (ablate more), no
    method is offered in its place, and the headline says what the curve showed."""
    from attribution.analyses.findings import TOO_FEW_NEURONS

    severities = {code: "ok" for code in CHECKS if code != "suspicious_gradient_capture"}
    findings = [Finding(code, severity, f"{code} measured.", 0.5) for code, severity
                in severities.items() if code != "disagrees_with_ablation"]
    untold = Finding("disagrees_with_ablation", "warning", "Too few neurons were ablated.",
                     0.16, "Ablate more of the neurons to tell.", TOO_FEW_NEURONS)
    answer = verdict(findings + [untold], method="gradient", reduce="mean",
                     cluster_source="kmeans_inputs")
    assert outcomes(findings + [untold])["ablation"] == "untold"
    assert answer.severity == "warning" and answer.cause == "disagrees_with_ablation"
    assert answer.headline.startswith("The ranking beats random removal; too few neurons")
    assert answer.remedies == () and answer.action == "Ablate more of the neurons to tell."
    loosely = verdict(findings + [replace(untold, pattern="")], method="gradient",
                      reduce="mean", cluster_source="kmeans_inputs")
    assert "loosely" in loosely.headline and loosely.remedies  # the same severity, measured


REASON_FINDINGS = {"none": {}, "cancels": {"sign_cancellation": "problem"},
                   "dead": {"dead_neurons": "problem"}, "rounding": {"tiny_scores": "problem"}}


@pytest.mark.parametrize("reason", list(REASON_FINDINGS))
def test_the_verdict_of_any_findings_is_the_tables_row(reason):
    """Findings with every pair of evidence outcomes (and notes that decide nothing: a dead
    neuron, small scores): the verdict's headline is the table's, with those notes."""
    for random_severity in ("ok", "warning", "problem"):
        for ablation_severity in ("ok", "warning", "problem"):
            severities = {code: "ok" for code in CHECKS if code != "suspicious_gradient_capture"}
            severities.update(not_better_than_random=random_severity,
                              disagrees_with_ablation=ablation_severity,
                              **REASON_FINDINGS[reason])
            if reason != "dead":
                severities["dead_neurons"] = "warning"  # a note, not a reason
            findings = [Finding(code, severity, f"{code} measured.", 0.5)
                        for code, severity in severities.items()]
            answer = verdict(findings, method="gradient", reduce="mean",
                             cluster_source="kmeans_inputs")
            seen = outcomes(findings)
            assert seen["reason"] == reason
            expected = headline(reason, seen["random"], seen["ablation"])
            assert (answer.severity, answer.headline, answer.signal) == expected
            assert not refuted_claims(answer.headline, seen["random"], seen["ablation"],
                                      reason)
            if reason != "dead":
                assert any(note.startswith("Dead neurons") for note in answer.notes)


# ------------------------------------------------- many real views: remedies measured first

VIEWS = [  # (demo, layer, method, reduce, cluster source)
    ("digits_mlp", "relu1", "gradient", "mean", "correctness"),
    ("digits_mlp", "fc2", "gradient", "mean", "correctness"),
    ("digits_mlp", "fc2", "gradient", "mean_abs", "kmeans_inputs"),
    ("digits_mlp", "relu2", "activation", "mean", "kmeans_inputs"),
    ("digits_mlp", "relu2", "random", "mean", "correctness"),
    ("digits_mlp", "relu1", "gradient_x_activation", "mean", "label"),
    ("digits_cnn", "conv2", "gradient", "mean", "correctness"),
    ("digits_cnn", "fc1", "activation", "mean_abs", "kmeans_inputs"),
]


@pytest.fixture(scope="module")
def demos():
    return {name: at.load_demo(name) for name in ("digits_mlp", "digits_cnn")}


@pytest.mark.parametrize("view", VIEWS, ids=lambda view: "-".join(view))
def test_no_headline_contradicts_a_shown_check_and_no_offered_remedy_makes_it_worse(demos,
                                                                                  view):
    """On real views: the headline asserts nothing its own checks refute; each remedy is
    measured on the view it leads to (for one-class clusters: the most common class of the
    cluster), only those that improve the verdict are offered, best first, and the view a
    click leads to, computed afresh, has the verdict the preview promised."""
    name, layer, method, reduce, source = view
    loaded, data = demos[name]
    model, x, y = loaded.module, data.inputs, data.labels
    clusters = at.make_clusters(source, data, loaded, None, 8, 0)
    cluster = np.unique(clusters)[0]

    def view_of(method, reduce, clusters, cluster):
        return at.diagnose(model, layer, x, y, method, clusters, cluster=cluster,
                           reduce=reduce)

    def evaluate(remedy):
        if remedy.choice == "cluster_source":
            return view_of(method, reduce, y.numpy(), remedy.cluster), "other samples"
        settings = {"method": method, "reduce": reduce, remedy.choice: remedy.value}
        return view_of(settings["method"], settings["reduce"], clusters, cluster), ""

    findings = view_of(method, reduce, clusters, cluster)
    answer = verdict(findings, method=method, reduce=reduce, cluster_source=source)
    seen = outcomes(findings)
    assert not refuted_claims(answer.headline, seen["random"], seen["ablation"],
                              seen["reason"]), answer.headline
    answer = replace(answer, remedies=tuple(
        replace(r, cluster=dominant_class(clusters, y.numpy(), cluster))
        if r.choice == "cluster_source" else r for r in answer.remedies))
    tried = try_remedies(answer, findings, evaluate, method=method, reduce=reduce,
                         cluster_source=source)
    assert [t.remedy for t in tried if not t.improves] == [
        r for r in answer.remedies if r not in [t.remedy for t in tried if t.improves]]
    before = verdict_rank(answer, findings)
    offered = [t for t in tried if t.improves]
    for trial in offered:
        again, _ = evaluate(trial.remedy)
        settings = {"method": method, "reduce": reduce, "cluster_source": source,
                    trial.remedy.choice: trial.remedy.value}
        after = verdict(again, **settings)
        assert after.headline == trial.after.headline
        assert verdict_rank(after, again) > before
    ranks = [verdict_rank(t.after, evaluate(t.remedy)[0]) for t in offered]
    assert ranks == sorted(ranks, reverse=True)  # best measured first
