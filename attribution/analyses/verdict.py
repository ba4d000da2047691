"""One verdict for a layer, cluster and method, from the degeneracy check's findings: what the
findings mean in plain words, the one thing to do, and the remedies an interface can apply.

    findings = at.diagnose(model, "relu2", x, y, "gradient", reduce="mean")
    answer = verdict(findings, method="gradient", reduce="mean", cluster_source="kmeans_inputs")
    answer.headline   # "Averaging cancels: the ranking is mostly noise"
    answer.remedies   # (Remedy("reduce", "mean_abs", ...), Remedy("method", ...), ...)

The cause is the first flagged finding in `CAUSES` order: a bug in one's own code first, then
scores that are not numbers, then the reasons a ranking carries nothing (constant, rounding
level, cancelling signs, dead neurons), and last the symptoms (no better than random, no
agreement with ablation) that those reasons explain when they are present.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from .diagnose import SEVERITIES, Finding
from ..engine.layers import LayerInfo
from ..methods.registry import REGISTRY

CAUSES = ("suspicious_gradient_capture", "non_finite", "constant_scores", "tiny_scores",
          "sign_cancellation", "dead_neurons", "not_better_than_random",
          "disagrees_with_ablation")
SYMPTOMS = ("not_better_than_random", "disagrees_with_ablation")
CHOICES = ("reduce", "method", "cluster_source")
"""What a remedy changes: the reduction, the scoring method, or how samples are clustered."""
ONE_CLASS_SOURCES = ("label", "predicted")
CHECK_NAMES = {  # check -> (name when it passed, name when it flagged something)
    "non_finite": ("Every score is a finite number", "Some scores are NaN or infinite"),
    "constant_scores": ("Neurons get different scores", "Every neuron gets the same score"),
    "tiny_scores": ("Scores are well above float rounding", "Scores are tiny"),
    "sign_cancellation": ("Signs agree within the cluster",
                          "Signed averaging cancels"),
    "dead_neurons": ("No neuron is dead on every sample", "Dead neurons"),
    "not_better_than_random": ("Removing top-ranked neurons hurts more than random removal",
                               "The ranking does no better than random removal"),
    "disagrees_with_ablation": ("The ranking matches removing each neuron (exact ablation)",
                                "The ranking does not match exact ablation"),
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
_RANK = {severity: position for position, severity in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Remedy:
    """A change of one analysis choice that addresses the cause.

    Attributes:
        choice: which setting (one of `CHOICES`).
        value: its new value ("mean_abs", "gradient_x_activation", "label", ...).
        label: the change in words, for a button ("Average magnitudes (mean |·|)").
    """

    choice: str
    value: str
    label: str


@dataclass(frozen=True)
class Verdict:
    """What the findings mean for this view.

    Attributes:
        severity: "ok", "warning" or "problem" (the deciding finding's).
        headline: the answer in a few plain words.
        explanation: one or two sentences of evidence behind it.
        action: the one thing to do ("" when nothing needs doing).
        remedies: the changes of settings that address the cause, best first.
        cause: the deciding check's code ("" when every check passed).
        notes: findings worth knowing that do not change the verdict.
    """

    severity: str
    headline: str
    explanation: str
    action: str
    remedies: tuple[Remedy, ...] = ()
    cause: str = ""
    notes: tuple[str, ...] = ()


def check_name(finding: Finding) -> str:
    """The check named by what it verified ("Signs agree within the cluster") when it
    passed, by what it found when it did not."""
    passed, flagged = CHECK_NAMES.get(finding.code, (finding.code, finding.code))
    return passed if finding.severity == "ok" else flagged


def verdict(findings: Sequence[Finding], *, method: str, reduce: str,
            cluster_source: Optional[str] = None, has_labels: bool = True) -> Verdict:
    """The one verdict for the findings of `diagnose` on one view.

    Args:
        findings: the `diagnose` findings of this layer, cluster and method.
        method, reduce: the view's scoring method and reduction.
        cluster_source: how the clusters were formed (`attribution.inputs.data.CLUSTER_SOURCES`);
            None = not known (no cluster remedy is offered).
        has_labels: whether the data has labels (one-class clusters by true label).
    Returns:
        A `Verdict`; remedies never repeat the current choice.
    """
    by_code = {finding.code: finding for finding in findings}
    flagged = [by_code[code] for code in CAUSES if code in by_code
               and by_code[code].severity != "ok"]
    blocking = [f for f in flagged if not (f.code == "dead_neurons" and f.severity == "warning")]
    notes = tuple(f"{check_name(f)}: {f.words(screen=True)[0]}" for f in flagged
                  if f not in blocking)
    if not blocking:
        passed = [code for code in CAUSES if code in by_code and by_code[code].severity == "ok"]
        counted = f"All {len(passed)}" if len(passed) == len(by_code) else \
            f"{len(passed)} of {len(by_code)}"
        return Verdict("ok", "These scores are usable",
                       f"{counted} checks passed: "
                       + "; ".join(check_name(by_code[code]).lower() for code in passed) + ".",
                       "", (), "", notes)
    worst = max(blocking, key=lambda f: _RANK[f.severity]).severity
    symptoms = [f for f in blocking if f.code in SYMPTOMS]
    cause = blocking[0] if blocking[0].code not in SYMPTOMS else \
        max(symptoms, key=lambda f: _RANK[f.severity])  # the worse symptom when no reason
    symptoms = [f for f in symptoms if f is not cause]
    remedies = _remedies(cause, method, reduce, cluster_source, has_labels)
    headline = _headline(cause, bool(symptoms))
    explanation = cause.words(screen=True)[0] + "".join(
        f" {check_name(f)}: {_lower_first(f.words(screen=True)[0])}" for f in symptoms)
    action = remedies[0].label + "." if remedies else cause.words(screen=True)[1]
    return Verdict(worst, headline, explanation, action, remedies, cause.code, notes)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _headline(cause: Finding, ranking_suffers: bool) -> str:
    if cause.code == "suspicious_gradient_capture":
        return CAPTURE_HEADLINES.get(cause.pattern, CAPTURE_HEADLINES["unknown"])
    if cause.code == "sign_cancellation":
        if cause.severity == "problem" or ranking_suffers:
            return "Averaging cancels: the ranking is mostly noise"
        return "Averaging partly cancels: the ranking is weaker than it could be"
    return {
        "non_finite": "The scores are not numbers: no ranking can be trusted",
        "constant_scores": "Every neuron scores the same: the ranking carries nothing",
        "tiny_scores": ("The scores are at rounding level: the ranking is noise"
                        if cause.severity == "problem" else
                        "The scores are very small: check the other findings"),
        "dead_neurons": "Most neurons are dead here: the ranking is mostly ties",
        "not_better_than_random": ("The ranking is no better than random"
                                   if cause.severity == "problem" else
                                   "The ranking is only weakly better than random"),
        "disagrees_with_ablation": "The scores do not track what removing a neuron does",
    }.get(cause.code, cause.code.replace("_", " "))


def _remedies(cause: Finding, method: str, reduce: str, cluster_source: Optional[str],
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
    }.get(cause.code, [])
    current = {"reduce": reduce, "method": method, "cluster_source": cluster_source}
    chosen, seen = [], set()
    for choice, value in options:
        if current[choice] == value or choice in seen:
            continue
        if choice == "cluster_source" and (cluster_source is None
                                           or cluster_source in ONE_CLASS_SOURCES):
            continue
        seen.add(choice)
        chosen.append(Remedy(choice, value, _REMEDY_LABELS[(choice, value)]))
    return tuple(chosen)


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
