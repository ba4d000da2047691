"""One verdict for a layer, cluster and method, concluded from the degeneracy check's
measurements: what they support in plain words, the one thing to do, and the remedies an
interface can apply (and measure first: `try_remedies`).

    findings = at.diagnose(model, "relu2", x, y, "gradient", reduce="mean")
    answer = verdict(findings, method="gradient", reduce="mean", cluster_source="kmeans_inputs")
    answer.headline   # "The signed mean cancels, yet the ranking still carries signal"
    answer.remedies   # (Remedy("reduce", "mean_abs", ...), Remedy("method", ...), ...)

The headline is a rules table over the checks' outcomes (`outcomes`), which tests enumerate:

1. A broken computation decides alone (`BROKEN`, first flagged): one's own gradient code
   (named by its bug), scores that are not numbers, an output that removing the layer's
   neurons does not move (flat curves: a model of random weights), scores equal for every
   neuron.
2. Otherwise two checks measure whether the ranking carries signal, each with its
   uncertainty: the permutation test against random orders ("beats" when p <= 0.1, "unclear",
   "no_better" when p > 0.5) and the rank agreement with exact ablation ("agrees" when its 95%
   interval lies above 0.6, "loosely", "disagrees" when it lies below 0.3; "untold" where a
   sample of the neurons was too small to tell, and the action is then to ablate more of
   them, not to change the method). `SIGNAL` maps the pair to strong, some or none signal,
   and says it in words.
3. The reason the scores look degenerate, if one is flagged (`REASONS`, first flagged):
   rounding-level scores, most neurons dead, signs cancelling in the signed mean.
   `HEADLINES[reason][signal]` is the headline: a reason never makes it claim noise while a
   check shows signal ("the signed mean cancels, yet the ranking still carries signal").

Severity: "ok" for strong signal without a reason, "problem" for no signal (or a broken
computation), else "warning".
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from .findings import TOO_FEW_NEURONS, Finding
from ..engine.layers import LayerInfo
from ..methods.registry import REGISTRY

CAUSES = ("suspicious_gradient_capture", "non_finite", "flat_output", "constant_scores",
          "tiny_scores",
          "sign_cancellation", "dead_neurons", "not_better_than_random",
          "disagrees_with_ablation", "incomplete_integral")
"""Every check, in the order their findings are listed as notes."""
BROKEN = ("suspicious_gradient_capture", "non_finite", "flat_output", "constant_scores")
"""Checks whose problem means no ranking was computed worth judging (first flagged decides)."""
EVIDENCE = ("not_better_than_random", "disagrees_with_ablation")
"""The two checks that measure whether the ranking carries signal."""
OUTCOMES = {  # evidence check -> its finding's severity -> the outcome
    "not_better_than_random": {"ok": "beats", "warning": "unclear", "problem": "no_better"},
    "disagrees_with_ablation": {"ok": "agrees", "warning": "loosely", "problem": "disagrees"},
}
SIGNAL = {  # (random, ablation) -> (signal, what the two checks say together)
    ("beats", "agrees"): ("strong", "the ranking tracks exact ablation and beats random "
                                    "removal"),
    ("beats", "loosely"): ("some", "the ranking beats random removal but only loosely tracks "
                                   "exact ablation"),
    ("beats", "disagrees"): ("some", "the ranking beats random removal but does not track "
                                     "exact ablation"),
    ("beats", "untold"): ("some", "the ranking beats random removal; too few neurons were "
                                  "ablated to tell whether it tracks exact ablation"),
    ("unclear", "agrees"): ("some", "the ranking tracks exact ablation, though its pruning "
                                    "curve is not clearly better than random"),
    ("unclear", "loosely"): ("some", "the ranking carries some signal, but neither check is "
                                     "conclusive"),
    ("unclear", "disagrees"): ("none", "the ranking neither tracks exact ablation nor clearly "
                                       "beats random removal"),
    ("unclear", "untold"): ("some", "neither check is conclusive: the pruning curve is not "
                                    "clearly better than random, and too few neurons were "
                                    "ablated to tell whether it tracks exact ablation"),
    ("no_better", "agrees"): ("some", "the ranking tracks exact ablation, yet removing its top "
                                      "neurons does no more damage than random removal"),
    ("no_better", "loosely"): ("some", "the ranking only loosely tracks exact ablation and does "
                                       "no better than random removal"),
    ("no_better", "disagrees"): ("none", "the ranking is noise: no better than random removal "
                                         "and unlike exact ablation"),
    ("no_better", "untold"): ("none", "removing the top-ranked neurons does no more damage "
                                      "than random removal, and too few neurons were ablated "
                                      "to tell whether the ranking tracks exact ablation"),
}
REASONS = {  # reason -> (its check, the severities that flag it), first flagged decides
    "rounding": ("tiny_scores", ("problem",)),
    "dead": ("dead_neurons", ("problem",)),
    "cancels": ("sign_cancellation", ("warning", "problem")),
}
HEADLINES = {  # reason -> signal -> headline ({signal}: SIGNAL's words, capitalised)
    "none": {"strong": "These scores are usable", "some": "{signal}", "none": "{signal}"},
    "cancels": {
        "strong": "The signed mean cancels, yet the ranking tracks ablation and beats random",
        "some": "The signed mean cancels, yet the ranking still carries signal",
        "none": "Averaging cancels: the ranking is mostly noise"},
    "dead": {
        "strong": "Most neurons are dead here, yet the live ones are ranked as ablation ranks "
                  "them",
        "some": "Most neurons are dead here, yet the ranking still carries signal",
        "none": "Most neurons are dead here: the ranking is mostly ties"},
    "rounding": {
        "strong": "The scores are at rounding level, yet their ranking tracks ablation: check "
                  "the precision",
        "some": "The scores are at rounding level, yet their ranking carries some signal",
        "none": "The scores are at rounding level: the ranking is noise"},
}
BROKEN_HEADLINES = {
    "non_finite": "The scores are not numbers: no ranking can be trusted",
    "flat_output": "The model's output does not depend on this layer: no ranking of its "
                   "neurons can mean anything",
    "constant_scores": "Every neuron scores the same: the ranking carries nothing",
}
CHOICES = ("reduce", "method", "cluster_source")
"""What a remedy changes: the reduction, the scoring method, or how samples are clustered."""
ONE_CLASS_SOURCES = ("label", "predicted")
CHECK_NAMES = {  # check -> (name when it passed, name when it flagged something)
    "non_finite": ("Every score is a finite number", "Some scores are NaN or infinite"),
    "flat_output": ("Removing this layer's neurons moves the output",
                    "The output is flat on this layer"),
    "constant_scores": ("Neurons get different scores", "Every neuron gets the same score"),
    "tiny_scores": ("Scores are well above float rounding", "Scores are tiny"),
    "sign_cancellation": ("Signs agree within the cluster",
                          "Signed averaging cancels"),
    "dead_neurons": ("No neuron is dead on every sample", "Dead neurons"),
    "not_better_than_random": ("Removing top-ranked neurons hurts more than random removal",
                               "The ranking is not shown to beat random removal"),
    "disagrees_with_ablation": ("The ranking matches removing each neuron (exact ablation)",
                                "The ranking does not clearly match exact ablation"),
    "incomplete_integral": ("Each sample's scores sum to what they integrate",
                            "Some samples' integrals miss their sum"),
    "suspicious_gradient_capture": ("Your own scores match the engine's",
                                    "Your own scores differ from the engine's"),
}
CAPTURE_HEADLINES = {
    "whole_batch": "Your hook code feeds the whole batch",
    "stale_hooks": "Your hooks are never removed: each call adds rows",
    "accumulating": "Your gradients accumulate from one sample to the next",
    "scaled": "Your scores are a scaled copy of the engine's",
    "non_finite": "Your scores contain NaN or infinite values",
    "unknown": "Your scores differ from the engine's",
}
SIGNAL_RANK = {"none": 0, "some": 1, "strong": 2}


@dataclass(frozen=True)
class Remedy:
    """A change of one analysis choice that addresses the cause.

    Attributes:
        choice: which setting (one of `CHOICES`).
        value: its new value ("mean_abs", "gradient_x_activation", "label", ...).
        label: the change in words, for a button ("Average magnitudes (mean |·|)").
        cluster: for a change of `cluster_source`, the cluster to look at after it (None:
            the interface's own choice).
    """

    choice: str
    value: str
    label: str
    cluster: object = None


@dataclass(frozen=True)
class Verdict:
    """What the findings mean for this view.

    Attributes:
        severity: "ok", "warning" or "problem".
        headline: the answer in a few plain words (the rules table of the module).
        explanation: the measurements behind it, with their uncertainty.
        action: the one thing to do ("" when nothing needs doing).
        remedies: the changes of settings that address the cause, best first (untried:
            `try_remedies` measures them).
        cause: the deciding check's code ("" when every check passed).
        notes: findings worth knowing that do not change the verdict.
        signal: "strong", "some" or "none" (`SIGNAL`), "" for a broken computation.
    """

    severity: str
    headline: str
    explanation: str
    action: str
    remedies: tuple[Remedy, ...] = ()
    cause: str = ""
    notes: tuple[str, ...] = ()
    signal: str = ""


def check_name(finding: Finding) -> str:
    """The check named by what it verified ("Signs agree within the cluster") when it
    passed, by what it found when it did not."""
    passed, flagged = CHECK_NAMES.get(finding.code, (finding.code, finding.code))
    return passed if finding.severity == "ok" else flagged


def outcomes(findings: Sequence[Finding]) -> dict[str, str]:
    """The outcome of each check the rules read: "broken" (the first flagged of `BROKEN`, or
    ""), "random" and "ablation" (`OUTCOMES`; "" when not measured; "untold" where a sample of
    the neurons was too small to tell) and "reason" (the first flagged of `REASONS`, else
    "none")."""
    by_code = {finding.code: finding for finding in findings}
    flagged = {code for code, finding in by_code.items() if finding.severity != "ok"}
    broken = next((code for code in BROKEN
                   if code in flagged and by_code[code].severity == "problem"), "")
    reason = next((name for name, (code, severities) in REASONS.items()
                   if code in by_code and by_code[code].severity in severities), "none")
    ablation = by_code.get("disagrees_with_ablation")
    return {"broken": broken, "reason": reason,
            "random": OUTCOMES["not_better_than_random"].get(
                getattr(by_code.get("not_better_than_random"), "severity", ""), ""),
            "ablation": "untold" if getattr(ablation, "pattern", "") == TOO_FEW_NEURONS
            else OUTCOMES["disagrees_with_ablation"].get(getattr(ablation, "severity", ""), "")}


def headline(reason: str, random: str, ablation: str) -> tuple[str, str, str]:
    """(severity, headline, signal) of the rules table for these outcomes."""
    signal, words = SIGNAL[(random, ablation)]
    text = HEADLINES[reason][signal].format(signal=words[:1].upper() + words[1:])
    severity = ("ok" if signal == "strong" and reason == "none" else
                "problem" if signal == "none" else "warning")
    return severity, text, signal


def verdict(findings: Sequence[Finding], *, method: str, reduce: str,
            cluster_source: Optional[str] = None, has_labels: bool = True) -> Verdict:
    """The one verdict for the findings of `diagnose` on one view.

    Args:
        findings: the `diagnose` findings of this layer, cluster and method.
        method, reduce: the view's scoring method and reduction.
        cluster_source: how the clusters were formed (`clusters.CLUSTER_SOURCES`); None =
            not known (no cluster remedy is offered).
        has_labels: whether the data has labels (one-class clusters by true label).
    Returns:
        A `Verdict`; remedies never repeat the current choice.
    """
    by_code = {finding.code: finding for finding in findings}
    seen = outcomes(findings)
    if seen["broken"] or not (seen["random"] and seen["ablation"]):
        cause = by_code[seen["broken"] or "non_finite"]
        text = (CAPTURE_HEADLINES.get(cause.pattern, CAPTURE_HEADLINES["unknown"])
                if cause.code == "suspicious_gradient_capture" else BROKEN_HEADLINES[cause.code])
        remedies = _remedies(cause.code, method, reduce, cluster_source, has_labels)
        return Verdict("problem", text, _words(cause),
                       remedies[0].label + "." if remedies else cause.words(screen=True)[1],
                       remedies, cause.code, _notes(findings, {cause.code}))
    severity, text, signal = headline(seen["reason"], seen["random"], seen["ablation"])
    evidence = [by_code[code] for code in EVIDENCE]
    reason = by_code[REASONS[seen["reason"]][0]] if seen["reason"] != "none" else None
    weakest = max(evidence, key=lambda f: ("ok", "warning", "problem").index(f.severity))
    cause = reason if reason is not None else (weakest if weakest.severity != "ok" else None)
    used = {code for code in EVIDENCE} | ({cause.code} if cause is not None else set())
    explanation = " ".join(_words(f) for f in ([reason] if reason is not None else [])
                           + evidence)
    if severity == "ok":
        passed = [code for code in CAUSES if code in by_code and by_code[code].severity == "ok"]
        counted = f"All {len(passed)}" if len(passed) == len(by_code) else \
            f"{len(passed)} of {len(by_code)}"
        explanation = (f"{counted} checks passed: " + "; ".join(
            check_name(by_code[code]).lower() for code in passed) + ". " + explanation)
        return Verdict("ok", text, explanation, "", (), "", _notes(findings, used), signal)
    remedies = () if cause.pattern == TOO_FEW_NEURONS else \
        _remedies(cause.code, method, reduce, cluster_source, has_labels)  # first: measure
    action = remedies[0].label + "." if remedies else cause.words(screen=True)[1]
    return Verdict(severity, text, explanation, action, remedies, cause.code,
                   _notes(findings, used), signal)


def _words(finding: Finding) -> str:
    """A finding's measurement in the dashboard's words."""
    return finding.words(screen=True)[0]


def _notes(findings: Sequence[Finding], used: set[str]) -> tuple[str, ...]:
    """The flagged findings the headline does not rest on, in `CAUSES` order."""
    by_code = {finding.code: finding for finding in findings}
    return tuple(f"{check_name(by_code[code])}: {_words(by_code[code])}" for code in CAUSES
                 if code in by_code and code not in used and by_code[code].severity != "ok")


def _remedies(cause: str, method: str, reduce: str, cluster_source: Optional[str],
              has_labels: bool) -> tuple[Remedy, ...]:
    one_class = "label" if has_labels else "predicted"
    options = {
        "sign_cancellation": [("cluster_source", one_class), ("reduce", "mean_abs"),
                              ("method", "gradient_x_activation")],
        "tiny_scores": [("reduce", "mean_abs"), ("method", "gradient_x_activation")],
        "constant_scores": [("method", "gradient_x_activation"), ("method", "ablation")],
        "not_better_than_random": [("method", "gradient_x_activation"), ("method", "ablation")],
        "disagrees_with_ablation": [("method", "gradient_x_activation"),
                                    ("method", "ablation")],
    }.get(cause, [])
    current = {"reduce": reduce, "method": method, "cluster_source": cluster_source}
    chosen = []
    for choice, value in options:
        if current[choice] == value or (choice, value) in [(r.choice, r.value) for r in chosen]:
            continue
        if choice == "cluster_source" and (cluster_source is None
                                           or cluster_source in ONE_CLASS_SOURCES):
            continue
        chosen.append(Remedy(choice, value, _REMEDY_LABELS[(choice, value)]))
    return tuple(chosen)


@dataclass(frozen=True)
class TriedRemedy:
    """A remedy measured before it is offered.

    Attributes:
        remedy: the change.
        after: the verdict of the view it leads to.
        changes: the measurements before -> after, in words ("Spearman ρ with ablation 0.56
            → 0.98"); of other samples when `samples` says so.
        samples: "" when the view after compares the same samples; else which it compares.
        improves: whether `after` is a better verdict than the one before (`verdict_rank`).
    """

    remedy: Remedy
    after: Verdict
    changes: tuple[str, ...]
    samples: str
    improves: bool


MEASURES = (  # check -> (words, format) of the measurements a remedy's preview compares
    ("not_better_than_random", "random orders beaten", "{:.0%}"),
    ("disagrees_with_ablation", "Spearman ρ with ablation", "{:.2f}"),
    ("sign_cancellation", "signed mean keeps of |score|", "{:.0%}"),
)


def verdict_rank(answer: Verdict, findings: Sequence[Finding]) -> tuple:
    """How good a verdict is, for comparing two views: its signal, then its severity, then
    the agreement with ablation (to 2 decimals); a broken computation ranks lowest."""
    rho = next((f.value for f in findings if f.code == "disagrees_with_ablation"), np.nan)
    severity = ("problem", "warning", "ok").index(answer.severity)
    return (SIGNAL_RANK.get(answer.signal, -1), severity,
            round(float(rho), 2) if np.isfinite(rho) else -2.0)


def measured_changes(before: Sequence[Finding], after: Sequence[Finding]) -> tuple[str, ...]:
    """The `MEASURES` of two views side by side: ("random orders beaten: 95% → 100%", ...)."""
    old = {f.code: f.value for f in before}
    new = {f.code: f.value for f in after}
    return tuple(f"{words}: {form.format(old[code])} → {form.format(new[code])}"
                 for code, words, form in MEASURES
                 if code in old and code in new and np.isfinite(old[code])
                 and np.isfinite(new[code]))


def try_remedies(answer: Verdict, findings: Sequence[Finding],
                 evaluate: Callable[[Remedy], tuple[Sequence[Finding], str]], *,
                 method: str, reduce: str, cluster_source: Optional[str] = None,
                 has_labels: bool = True) -> tuple[TriedRemedy, ...]:
    """Measure each of the verdict's remedies before offering it.

    Args:
        answer, findings: the verdict of the view and the findings it came from.
        evaluate: remedy -> (the findings of the view it leads to, "" when that view compares
            the same samples, else which samples it compares).
        method, reduce, cluster_source, has_labels: the view's, as given to `verdict`.
    Returns:
        Every remedy tried, those that improve the verdict first (best measured first), then
        the rest in the verdict's order.
    """
    before = verdict_rank(answer, findings)
    tried = []
    for remedy in answer.remedies:
        after_findings, samples = evaluate(remedy)
        settings = {"method": method, "reduce": reduce, "cluster_source": cluster_source,
                    remedy.choice: remedy.value}
        after = verdict(after_findings, has_labels=has_labels, **settings)
        rank = verdict_rank(after, after_findings)
        tried.append((rank, TriedRemedy(remedy, after, measured_changes(findings, after_findings),
                                        samples, rank > before)))
    helpful = sorted((item for item in tried if item[1].improves), key=lambda item: item[0],
                     reverse=True)
    return tuple(item[1] for item in helpful) + tuple(item[1] for item in tried
                                                      if not item[1].improves)


def dominant_class(clusters: Sequence, classes: Sequence[int], cluster: object) -> int:
    """The most common class among `cluster`'s samples (the smallest id among ties): where a
    one-class partition continues from a mixed cluster."""
    composition = cluster_composition(clusters, classes)
    return int(composition[composition["cluster"] == cluster].iloc[0]["class"])


_REMEDY_LABELS = {
    ("reduce", "mean_abs"): "Average magnitudes (mean |·|)",
    ("method", "gradient_x_activation"): "Switch to gradient × activation",
    ("method", "ablation"): "Switch to exact ablation",
    ("cluster_source", "label"): "Use one-class clusters (by true label)",
    ("cluster_source", "predicted"): "Use one-class clusters (by predicted label)",
}


def cluster_composition(clusters: Sequence, classes: Sequence[int],
                        class_names: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """What each cluster mixes: the share of each class among its samples.

    Args:
        clusters: cluster id per sample [N].
        classes: class id per sample [N] (true or predicted labels).
        class_names: names of the class ids, or None.
    Returns:
        rows (cluster, class, name, count, share), each cluster's classes by falling share.
    """
    frame = pd.DataFrame({"cluster": np.asarray(clusters), "class": np.asarray(classes)})
    counts = frame.groupby(["cluster", "class"], sort=True).size().rename("count").reset_index()
    counts["share"] = counts["count"] / counts.groupby("cluster")["count"].transform("sum")
    counts["name"] = [str(class_names[c]) if class_names is not None and 0 <= c < len(class_names)
                      else str(c) for c in counts["class"]]
    counts = counts.sort_values(["cluster", "share", "class"], ascending=[True, False, True],
                                kind="stable")
    return counts[["cluster", "class", "name", "count", "share"]].reset_index(drop=True)


def describe_mix(composition: pd.DataFrame, cluster: object, shown: int = 2) -> str:
    """A cluster's mix in a few words: "62% six, 21% eight, 3 more classes"."""
    part = composition[composition["cluster"] == cluster]
    words = [f"{share:.0%} {name}" for share, name in
             zip(part["share"].head(shown), part["name"].head(shown))]
    if len(part) > shown:
        others = len(part) - shown
        words.append(f"{others} more class{'es' if others > 1 else ''}")
    return ", ".join(words)


# ------------------------------------------------------------ the own-code check's package

def check_package(inputs: torch.Tensor, targets: torch.Tensor, sample_ids: np.ndarray,
                  labels: Optional[torch.Tensor] = None) -> bytes:
    """What one's own code needs to be checked against the engine, as one .npz file.

    Args:
        inputs: the analysed samples [m, ...], in the order the scores must come back.
        targets: the class whose logit each row is scored for, int64 [m].
        sample_ids: each row's index in the full data [m].
        labels: true class ids [m], or None.
    Returns:
        .npz bytes with arrays inputs, targets, sample_ids (and labels).
    """
    arrays = {**{name: value.detach().cpu().numpy()
                 for name, value in _stored_inputs(inputs).items()},
              "targets": targets.detach().cpu().numpy().astype(np.int64),
              "sample_ids": np.asarray(sample_ids, dtype=np.int64)}
    if labels is not None:
        arrays["labels"] = labels.detach().cpu().numpy().astype(np.int64)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _stored_inputs(inputs) -> dict:
    """The inputs under the names `check_package` stores them by: named inputs (a
    transformers model's input_ids, attention_mask) under their own, a tensor as "inputs"."""
    named = model_io.named(inputs)
    return dict(named.items()) if isinstance(named, model_io.NamedInputs) else {"inputs": inputs}


def expected_loop(layer: LayerInfo, method: str, inputs=None,
                  file_name: str = "cluster_check.npz") -> str:
    """A short, correct per-sample loop for `method` on `layer` (of `list_layers`, with the
    neuron axis the scores use), reading `check_package`'s file of `inputs` (None: one
    tensor) and saving the [m, n] scores the check compares (Python source). Where the
    module returns a tuple or ModelOutput, the hook takes the layer's tensor from it; where
    the neurons are not at dim 1, the loop moves them there; named inputs are passed by
    name, a transformers model's logits taken from its output, and where there is an
    attention mask only real tokens count (as in the engine). The score line is the
    registry's `Method.score_line` (a placeholder where the method has none)."""
    entry = REGISTRY.get(method)
    score = (entry.score_line if entry is not None and entry.score_line
             else f"<your {method} score of each neuron, shape [n]>")
    names = tuple(_stored_inputs(inputs))
    if names == ("inputs",):
        load = 'x, targets = torch.from_numpy(pack["inputs"]), torch.from_numpy(pack["targets"])'
        run = "logits = model(x[i:i + 1])"
    else:
        load = (f"x = {{name: torch.from_numpy(pack[name]) for name in {names!r}}}\n"
                'targets = torch.from_numpy(pack["targets"])')
        run = ("output = model(**{name: value[i:i + 1] for name, value in x.items()})\n"
               '        logits = output.logits if hasattr(output, "logits") else output')
    entry, axis = layer.output_entry, layer.neuron_axis
    taken = "" if not entry else (
        f"    # {layer.kind} returns several values: the layer is out{entry}\n")
    moved = "" if axis == 1 else (
        f"    z, grad = z.movedim({axis}, 1), grad.movedim({axis}, 1)  # neurons (dim {axis}) "
        "to dim 1\n")
    if model_io.attention_mask(inputs) is not None and len(layer.positions) == 1:
        real = f"    real = x[{model_io.MASK_NAME!r}][i] > 0"
        moved += (f"{real:<45}# padding does not count\n"
                  "    z, grad = z[..., real], grad[..., real]\n")
    return f'''import numpy as np
import torch

pack = np.load("{file_name}")
{load}
layer = model.get_submodule({layer.name!r})
model.eval()
rows = []
for i in range(len(targets)):                # one sample per pass: x[i:i + 1]
    captured = {{}}
{taken}    handle = layer.register_forward_hook(lambda m, args, out: captured.update(z=out{entry}))
    try:
        model.zero_grad()                    # no gradient left from the last sample
        {run}
        z = captured["z"]
        grad, = torch.autograd.grad(logits[0, targets[i]], z)  # dF/dz, shaped like z
    finally:
        handle.remove()                      # never leave a hook behind
{moved}    rows.append(({score}).detach())
np.save("my_scores.npy", torch.stack(rows).numpy())  # [samples, neurons], in file order
'''
