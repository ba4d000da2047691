"""The degeneracy check's findings: each check, from one cluster's measurements
(`Evidence`), to one `Finding`; `attribution.analyses.diagnose` measures and calls them.

`diagnose` returns one `Finding` per check (severity "ok", "warning" or "problem"). With
several clusters every check runs on each and reports the worst. Value measured; thresholds:

- non_finite: share of the analysed samples whose logits or scores are NaN/inf (named in the
  message). Problem if > 0 (the other checks are then skipped).
- flat_output: the largest change of the evidence curve's metric (every order and k,
  removing all neurons included) from the unpruned value; for the target logit as a share
  of the logit scale. Problem if it is within float precision (PRECISION of the values) or,
  for the target logit, under FLAT_SHARE (1%) of the scale: the output does not depend on
  this layer, so no ranking can beat random (random weights give such curves). It leads the
  verdict.
- constant_scores: (max - min) / max |s| of the cluster scores. Problem if <= 1e3 float32 eps
  (every neuron equal to float32 resolution).
- tiny_scores: largest neuron effect / logit scale (std of all logits). Problem if <= 1e3
  float32 eps (float32 rounding of the logits); warning if < 0.01 / n_neurons (under 1% of
  an equal share of the logit scale).
- sign_cancellation: median over neurons of |mean s| / mean |s|, with its 95% bootstrap
  interval over the cluster's samples (`Finding.low`, `.high`). With samples of equal
  magnitude and a share p of one sign this is |2p - 1|: warning if < 0.5 (the minority sign
  carries > 25% of the magnitude), problem if < 0.2 (> 40%). Only reduce="mean" averages signs.
- dead_neurons: share of neurons dead on the cluster. Warning if a neuron is dead on every
  sample analysed (the model never uses it), problem if >= 50% (most of the ranking is ties).
- not_better_than_random: share of random orders whose pruning-curve area the ranking beats,
  and the permutation test's p-value (`Finding.p_value`, `curve_summary`'s p_value): a
  random ranking is one more random order, so its p-value is uniform. Ok if p <= 0.1 (at
  most 1 random ranking in 10 does this well: 19 of 20 orders beaten) and the ranked curve
  leaves the 5-95% random band at some k (`curve_summary`'s outside_band), problem if p > 0.5
  (a typical random order does as much damage), else warning.
- disagrees_with_ablation: Spearman with the exact single-neuron ablation oracle, with its 95%
  bootstrap interval and its one-sided p-value against a random ranking of the neurons
  compared (`Finding.p_value`). The oracle is exact on every neuron when that fits
  `oracle_sample.ORACLE_SECONDS`, else on a random sample of them (`oracle_sample`), said
  in the message ("on 256 of 3,072 neurons"): the interval then spans both the samples and
  the neurons drawn. Ok if the whole interval is >= 0.6 (above
  activation's 0.56 in Molchanov et al. 2017); problem if it is all < 0.3 (weight
  magnitude's 0.27 there; random is 0), if a random ranking agrees as well with p > 0.05
  (with 16 neurons, rho under about 0.43), or if the correlation does not exist; else
  warning. On a sample of the neurons, a ranking a random one matches (p > 0.05) whose
  interval still reaches 0.6 is a warning, not a problem: too few neurons drawn to tell
  (the hint: ablate more).
- incomplete_integral (integrated_gradients, conductance: `Method.sums_to`): the largest
  share by which a sample's scores, summed over the layer, miss the difference they
  integrate (F(z) - F(0) at the layer; F(x) - F(0) at the inputs), after the engine
  integrated every sample that missed by more than 1% again, with up to
  `Method.refine_factor` (16) x `n_steps` steps (integrated gradients: doubled; conductance:
  its path bisected where the gradient jumps). Warning if a
  sample still misses by more than 1%. Conductance's sum applies only where the layer
  carries every path from the input (run from the zero input with the layer's output of x,
  the model gives F(x)); other samples are counted, not checked.
- suspicious_gradient_capture: relative error of the user's scores vs the engine's. Problem if
  > 1e-3 (float32 reassociation differences stay far below); known bug patterns are named.

A neuron is dead on a set of samples when its output is exactly 0 on all of them (a post-ReLU
layer) or the gradient of every class's logit is exactly 0 on all of them (a pre-activation
that never turns on, or a layer whose effect a zero weight after it removes, such as a
BatchNorm gamma initialised to 0; the other logits of an output layer are not dead). The
finding says which: output 0, or an output with no gradient, and the zero weights after the
layer. Messages name settings in the API's words (reduce='mean_abs', target_logit) and
`Finding.words(screen=True)` in the dashboard's (mean |·|, target logit).
"Effect" in tiny_scores is in logit units, as the method's registry entry says
(`Method.logit_effect`): the score itself (gradient_x_activation, integrated_gradients,
conductance, ablation), or |score| x mean |activation| (gradient); methods without logit units
(activation, random) are checked against float precision only.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import pandas as pd
import torch

from ..engine import model_io
from ..errors import AttributionError
from .ranks import interval
from .oracle_sample import OracleSample, sampled_spearman
from ..methods.paths import SUM_TOLERANCE, SumCheck
from ..methods.registry import REGISTRY, method_label
from .settings import METRIC_LABELS, REDUCTION_LABELS, metric_label
from .costs import CurvePlan, draw_samples
from .pruning_curves import curve_summary, pruning_curve

SEVERITIES = ("ok", "warning", "problem")
CHECKS = ("non_finite", "flat_output", "constant_scores", "tiny_scores", "sign_cancellation",
          "dead_neurons",
          "not_better_than_random", "disagrees_with_ablation", "incomplete_integral",
          "suspicious_gradient_capture")
PRECISION = 1e3 * float(np.finfo(np.float32).eps)  # ~1.2e-4: float32 rounding, with headroom
CANCELLATION_WARNING, CANCELLATION_PROBLEM = 0.5, 0.2
SHARE_WARNING = 0.01
FLAT_SHARE = 0.01  # removing a whole layer moves the target logit by under 1% of its scale
METRIC_UNITS = {"accuracy": "", "loss": "nats", "squared_error": "squared units"}
DEAD_PROBLEM = 0.5
SIGNAL_P, NO_SIGNAL_P = 0.1, 0.5  # permutation p-values of not_better_than_random
FEWEST_RANDOM_ORDERS = math.ceil(1 / SIGNAL_P) - 1  # 9: fewer cannot reach p <= SIGNAL_P
ORACLE_OK, ORACLE_WARNING = 0.6, 0.3
RANK_P = 0.05  # a Spearman a random ranking reaches more often than this shows nothing
TOO_FEW_NEURONS = "too_few_neurons"  # disagrees_with_ablation's pattern: a sample cannot tell
CAPTURE_TOLERANCE = 1e-3
CAPTURE_PATTERNS = ("whole_batch", "stale_hooks", "accumulating", "scaled", "non_finite",
                    "unknown")
PATTERN_TOLERANCE = 1e-2  # how closely a known bug's signature must fit


@dataclass(frozen=True)
class Finding:
    """One check's verdict.

    Attributes:
        code: which check (one of `CHECKS`).
        severity: "ok", "warning" or "problem".
        message: one sentence saying what was measured and what it means.
        value: the measured number (see the module's table).
        hint: what to do instead ("" when nothing needs doing).
        pattern: for a failed suspicious_gradient_capture, the bug its signature fits (one
            of `CAPTURE_PATTERNS`); for disagrees_with_ablation on a sample of the neurons
            too small to tell, TOO_FEW_NEURONS; "" otherwise.
        curve: for not_better_than_random, the evidence: the pruning curve the check
            measured (a `pruning_curve` frame: k, ranked, bottom, random_mean, random_lo,
            random_hi; its attrs as there), of the cluster it reports (the worst one among
            several); None for the other checks. Not compared by ==.
        low, high: the 95% bootstrap interval of `value` over the cluster's samples
            (sign_cancellation, disagrees_with_ablation); NaN for the other checks.
        p_value: not_better_than_random's permutation p-value; disagrees_with_ablation's
            p-value of its Spearman against a random ranking; NaN for the other checks.
    """

    code: str
    severity: str
    message: str
    value: float
    hint: str = ""
    pattern: str = ""
    screen_message: str = ""
    screen_hint: str = ""
    curve: Optional[pd.DataFrame] = field(default=None, compare=False, repr=False)
    low: float = field(default=float("nan"), compare=False)
    high: float = field(default=float("nan"), compare=False)
    p_value: float = field(default=float("nan"), compare=False)

    def words(self, screen: bool) -> tuple[str, str]:
        """(message, hint) in the dashboard's words ("mean |·|", "target logit") when
        `screen`, else in the API's (reduce='mean_abs', target_logit) as in `message`/`hint`."""
        if screen:
            return self.screen_message or self.message, self.screen_hint or self.hint
        return self.message, self.hint


_TERM = re.compile(r"«(\w+)=([^»]+)»")  # «setting=value» in a finding's text


def _term(setting: str, value: str, screen: bool) -> str:
    """One setting's value as the API writes it, or as the dashboard shows it."""
    if not screen:
        if setting == "output_metric":
            return f"metric={value!r}"
        if setting == "oracle_neurons":
            return f"oracle_neurons={value}"
        return f"{setting}={value!r}" if setting in ("reduce", "metric") else value
    if setting == "reduce":
        return REDUCTION_LABELS.get(value, value)
    if setting == "metric":
        return METRIC_LABELS.get(value, value)
    if setting == "output_metric":  # a regression head's: its target logit is its output
        return metric_label(value, regression=True)
    if setting == "method":
        return method_label(value)
    if setting == "oracle_neurons":  # the Diagnosis page's toggle
        return f"“Ablate all {int(value):,} neurons exactly”"
    return value.replace("_", " ")  # a check's code


def _finding(code: str, severity: str, message: str, value: float, hint: str = "",
             pattern: str = "") -> Finding:
    """A Finding whose text may name settings as «setting=value» (reduce, metric, method,
    check): written in API words in message/hint and in screen words beside them."""
    def say(text: str, screen: bool) -> str:
        return _TERM.sub(lambda m: _term(m.group(1), m.group(2), screen), text)

    return Finding(code, severity, say(message, False), value, say(hint, False), pattern,
                   say(message, True), say(hint, True))


@dataclass
class Evidence:
    """Per-sample measurements [m, n] of one cluster's m samples, and what follows from them."""

    name: object
    x: torch.Tensor
    targets: Optional[torch.Tensor]
    scores: np.ndarray
    cluster_score: np.ndarray
    gradients: np.ndarray
    activations: np.ndarray
    oracle: OracleSample  # exact ablation of (a sample of) the neurons, on these samples
    logit_scale: float
    reach: np.ndarray  # sum over classes of |dF_c/dz|: 0 where no class depends on the neuron
    draws: np.ndarray  # [BOOTSTRAP_DRAWS, m]: how often each sample is drawn in each resample
    regression: bool = False  # one output: effects are in its own units, not logits

    @property
    def units(self) -> str:
        return "output units" if self.regression else "logits"

    @property
    def scale_name(self) -> str:
        return "output's scale" if self.regression else "logit scale"



def dead_mask(reach: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """[n] bool: output exactly 0 on every sample, or no class's logit depends on it on any
    sample (a pre-activation that never turns on)."""
    return (activations == 0).all(0) | (reach == 0).all(0)


# ------------------------------------------------------------------------------ checks
# Each check returns (Finding for one cluster, badness); `worst` keeps the worst cluster.

def non_finite(scores: np.ndarray, logits: np.ndarray, sample_ids: np.ndarray) -> Finding:
    """Name the samples whose logits [m, C] or scores [m, ...] are NaN/inf; `sample_ids` [m]
    are their positions in the inputs."""
    bad_logits = ~np.isfinite(logits).all(1)
    bad_scores = ~np.isfinite(scores.reshape(len(scores), -1)).all(1)
    parts = []
    if bad_logits.any():
        parts.append("The model's logits are NaN or inf on "
                     + _neuron_list(sample_ids[bad_logits], noun="sample"))
    if bad_scores.any():
        parts.append(f"{float((~np.isfinite(scores)).mean()):.1%} of the per-sample scores are "
                     f"NaN or inf ({_neuron_list(sample_ids[bad_scores], noun='sample')})")
    return Finding(
        "non_finite", "problem",
        "; ".join(parts) + ", so no ranking can be trusted (the other checks were skipped).",
        float((bad_logits | bad_scores).mean()),
        "Check the model on these samples (weights, inputs, a log of 0, an overflow) and that "
        "the inputs are scaled as in training, or leave the samples out.")


def constant(group: Evidence) -> tuple[Finding, float]:
    values = group.cluster_score
    scale = float(np.abs(values).max())
    spread = float(np.ptp(values)) / scale if scale > 0 else 0.0
    if spread <= PRECISION:
        return _finding(
            "constant_scores", "problem",
            f"Every neuron gets the same score ({values[0]:.3g}), so the ranking carries no "
            "information and pruning order is arbitrary.", spread,
            "Check that the layer's output varies between neurons and samples; try "
            "«method=gradient_x_activation» or «method=ablation»."), -spread
    return Finding("constant_scores", "ok",
                   f"Scores vary across neurons (spread {spread:.2g} of the largest).",
                   spread), -spread


def tiny(group: Evidence, method: str) -> tuple[Finding, float]:
    n_neurons = group.cluster_score.shape[0]
    magnitude = np.abs(group.cluster_score)
    logit_effect = REGISTRY[method].logit_effect
    if logit_effect is not None:
        effect = magnitude * (np.abs(group.activations).mean(0)
                              if logit_effect == "times_activation" else 1.0)
        largest = float(np.nanmax(effect)) if effect.size else 0.0
        scale = group.logit_scale
        value = largest / scale if scale > 0 else (0.0 if largest == 0 else np.inf)
        described = (f"the largest neuron effect is {largest:.3g} {group.units}, {value:.2g} "
                     f"of the {group.scale_name} ({scale:.3g})")
        warn_below = SHARE_WARNING / n_neurons
    else:
        largest = float(np.nanmax(magnitude))
        typical = float(np.abs(group.scores).mean(0).max())
        value = largest / typical if typical > 0 else 0.0
        described = (f"the largest cluster score is {value:.2g} of the largest per-sample "
                     "magnitude")
        warn_below = 0.0
    if value <= PRECISION:
        return _finding(
            "tiny_scores", "problem",
            f"Scores are at float32 rounding level: {described}, so their order is noise.",
            value, "Average magnitudes («reduce=mean_abs») or use "
            "«method=gradient_x_activation»; if the logits do not depend on this layer, pick "
            "a layer that feeds them."), -value
    if value < warn_below:
        return _finding(
            "tiny_scores", "warning",
            f"Scores are small: {described}, under 1% of an equal share per neuron.",
            value, "Small gradients are not a bug by themselves; compare "
            "«method=gradient_x_activation» (logit units) and check "
            "«check=sign_cancellation»."), -value
    return Finding("tiny_scores", "ok", f"Scores are well above float precision: {described}.",
                   value), -value


def _cancellation_ratio(means: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """Median over neurons of |mean s| / mean |s| for rows of means and mean magnitudes
    [..., n], over the neurons with a nonzero magnitude (NaN where none has one)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.where(magnitudes > 0, np.abs(means) / magnitudes, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without an active neuron
        return np.nanmedian(ratios, axis=-1)


def cancellation(group: Evidence, reduce: str) -> tuple[Finding, float]:
    magnitude = np.abs(group.scores).mean(0)
    if not (magnitude > 0).any():
        return Finding("sign_cancellation", "ok", "No neuron has a nonzero score, so nothing "
                       "can cancel (see constant_scores).", float("nan")), 0.0
    ratio = float(_cancellation_ratio(group.scores.mean(0), magnitude))
    size = len(group.scores)
    values = group.scores.astype(np.float64)
    low, high = interval(_cancellation_ratio(group.draws @ values / size,
                                             group.draws @ np.abs(values) / size), ratio)
    kept = (f"the signed mean keeps {ratio:.0%} of the mean |score| (median over neurons; 95% "
            f"interval {low:.0%} to {high:.0%})")
    bounds = dict(low=low, high=high)
    if reduce != "mean":
        return replace(_finding("sign_cancellation", "ok",
                                f"«reduce={reduce}» does not average signs ({kept} with "
                                "«reduce=mean»).", ratio), **bounds), -ratio
    hint = ("Use «reduce=mean_abs» or «method=gradient_x_activation», or split the cluster "
            "into smaller, more homogeneous ones (e.g. one class each).")
    if ratio < CANCELLATION_PROBLEM:
        finding = _finding("sign_cancellation", "problem",
                           f"Signed averaging cancels: {kept}, because per-sample scores "
                           "disagree in sign; this is why average gradients look tiny.",
                           ratio, hint)
    elif ratio < CANCELLATION_WARNING:
        finding = _finding("sign_cancellation", "warning",
                           f"Signed averaging partly cancels: {kept}.", ratio, hint)
    else:
        finding = Finding("sign_cancellation", "ok", f"Signs agree across samples: {kept}.",
                          ratio)
    return replace(finding, **bounds), -ratio


def _what_is_zero(dead: np.ndarray, activations: np.ndarray, zeroed: list[str]) -> str:
    """Which of the `dead` [n] neurons output exactly 0, and which have an output but no
    gradient (something after the layer removes them: a closed ReLU, a zero weight)."""
    silent = np.flatnonzero(dead & (activations == 0).all(0))
    unreached = np.flatnonzero(dead & ~(activations == 0).all(0))
    parts = []
    if silent.size:
        parts.append(f"{_neuron_list(silent)} {'outputs' if silent.size == 1 else 'output'} "
                     "exactly 0")
    if unreached.size:
        where = ("a zero weight after this layer: " + ", ".join(zeroed[:3]) if zeroed else
                 "e.g. a ReLU after this layer that never turns on for them")
        one = unreached.size == 1
        parts.append(f"{_neuron_list(unreached)} {'has' if one else 'have'} a nonzero output, "
                     "but the gradient of every logit with respect to "
                     f"{'it' if one else 'them'} is exactly 0 on every sample: something after "
                     f"this layer removes {'it' if one else 'them'} ({where})")
    return "; ".join(parts)


def dead_neurons(group: Evidence, everywhere_dead: np.ndarray,
                  zeroed: list[str]) -> tuple[Finding, float]:
    dead = dead_mask(group.reach, group.activations)
    share = float(dead.mean())
    never_used = dead & everywhere_dead
    hint = ("Their scores are exactly 0 and tie, so their order is arbitrary; exclude them, or "
            "check the biases, initialisation or zero weights that switched them off.")
    if share >= DEAD_PROBLEM:
        return Finding("dead_neurons", "problem",
                       f"{dead.sum()} of {dead.size} neurons are dead on these samples, so "
                       "most of the ranking is ties: "
                       f"{_what_is_zero(dead, group.activations, zeroed)}.", share,
                       hint), share
    if never_used.any():
        return Finding("dead_neurons", "warning",
                       f"{never_used.sum()} of {dead.size} neurons are dead on every sample: "
                       f"{_what_is_zero(never_used, group.activations, zeroed)}.",
                       share, hint), share
    listed = _neuron_list(np.flatnonzero(dead))
    if dead.any():
        return Finding("dead_neurons", "ok",
                       f"{dead.sum()} of {dead.size} neurons are silent on this cluster only "
                       f"({listed}); they work on other samples.", share), share
    return Finding("dead_neurons", "ok", "No neuron is dead on these samples.", share), share


def random_severity(p_value: float, outside_band: float = float("nan")) -> str:
    """The severity of a ranking against random orders, by its permutation p-value and the
    share of k at which its curve leaves the random band (`curve_summary`): "ok" when p <=
    SIGNAL_P and the curve leaves the band somewhere (or that is unknown), "problem" when p >
    NO_SIGNAL_P (or unknown), else "warning". One rule for not_better_than_random and the
    pruning page's words: "beats random" and "inside the band at every k" never meet."""
    if not p_value <= NO_SIGNAL_P:
        return "problem"
    return "ok" if p_value <= SIGNAL_P and outside_band != 0 else "warning"


def permutation_words(p_value: float, n_random: int) -> str:
    """"permutation p = 0.12", saying where p is the smallest `n_random` orders can give."""
    said = f"permutation p = {p_value:.2g}"
    if np.isfinite(p_value) and p_value <= 1 / (n_random + 1) + 1e-12:
        said += f", the smallest {n_random} random orders can give"
    return said


def evidence_curve(model, layer, group: Evidence, metric, ablation, plan: CurvePlan, seed,
                    batch_size) -> pd.DataFrame:
    """The pruning curve the flat and random checks read, as `plan` sizes it: its k steps,
    random orders and share of the cluster's samples (drawn at random, `draw_samples`)."""
    rows = torch.from_numpy(draw_samples(np.zeros(len(group.x), dtype=np.int64), plan.share,
                                         seed))
    return pruning_curve(model, layer, model_io.take(group.x, rows),
                         None if group.targets is None else group.targets[rows],
                         np.nan_to_num(group.cluster_score, nan=0.0),
                         ks=plan.ks(group.cluster_score.shape[0]), n_random=plan.n_random,
                         seed=seed, ablation=ablation, metric=metric, batch_size=batch_size)


def metric_term(metric: str, group: Evidence) -> str:
    """The «metric=...» term of a finding; a regression head's target logit is its output."""
    return f"«{'output_metric' if group.regression else 'metric'}={metric}»"


def flat(group: Evidence, curve: pd.DataFrame, metric: str) -> tuple[Finding, float]:
    """flat_output: does removing this layer's neurons move the output at all? Value: the
    largest change of the metric over every order and k (removing all neurons included)
    against the unpruned value, as a share of the logit scale for the target logit."""
    columns = ["ranked", "bottom", "random_mean", "random_lo", "random_hi"]
    start = float(curve.loc[curve["k"] == 0, "ranked"].iloc[0])
    change = float(np.nanmax(np.abs(curve[columns].to_numpy() - start)))
    scale = group.logit_scale
    units = group.units if metric == "target_logit" else METRIC_UNITS.get(metric, "")
    floor = PRECISION * max(abs(start), scale if metric == "target_logit" else 0.0, 1e-30)
    described = (f"removing any of its neurons (all of them included) moves the "
                 f"{metric_term(metric, group)} by at most {change:.3g} {units}").rstrip()
    if metric == "target_logit":
        value = change / scale if scale > 0 else 0.0
        described += f", {value:.2g} of the {group.scale_name} ({scale:.3g})"
        flat = change <= floor or value < FLAT_SHARE
    else:
        value = change
        flat = change <= floor or (metric == "accuracy" and change < 1 / max(len(group.x), 1))
    if flat:
        return _finding(
            "flat_output", "problem",
            f"The model's output is flat on this layer: {described}, so no ranking of its "
            "neurons can be told from random.", value,
            "Pick a layer that feeds the output, or check that the model is trained: a model "
            "of random weights gives flat curves."), -value
    return _finding("flat_output", "ok", f"The output depends on this layer: {described}.",
                    value), -value


def random_baseline(curve: pd.DataFrame, metric: str, n_random: int, sized: str = ""
                     ) -> tuple[Finding, float]:
    """not_better_than_random from the evidence `curve`; `metric` as `metric_term` names it;
    `sized`: how the budget sized the curve (`costs.CurvePlan.words`), "" for the full one."""
    summary = curve_summary(curve).iloc[0]
    beaten, p_value = float(summary["fraction_random_beaten"]), float(summary["p_value"])
    outside = float(summary["outside_band"])
    severity = random_severity(p_value, outside)
    band = ("its curve is never beyond the 5-95% random band" if outside == 0 else
            f"its curve is beyond the 5-95% random band at {outside:.0%} of k"
            if np.isfinite(outside) else "")
    measured = (f"removing the top-ranked neurons does more damage than {beaten:.0%} of "
                f"{n_random} random orders ({permutation_words(p_value, n_random)}; "
                f"{metric}, area under the curve" + (f", {sized}" if sized else "") + ")"
                + (f"; {band}" if band else ""))
    hint = ("Compare «method=gradient_x_activation» or «method=ablation» on the pruning page; "
            "for signed gradients see «check=sign_cancellation».")
    if n_random < FEWEST_RANDOM_ORDERS:
        hint += (f" With {n_random} random orders no ranking can show p <= {SIGNAL_P}: use at "
                 f"least {FEWEST_RANDOM_ORDERS}.")
    if severity == "problem":
        finding = _finding("not_better_than_random", "problem",
                           f"The ranking is no better than random: {measured}.", beaten, hint)
    elif severity == "warning":
        finding = _finding("not_better_than_random", "warning",
                           f"The ranking is not clearly better than random: {measured}.",
                           beaten, hint)
    else:
        finding = _finding("not_better_than_random", "ok",
                           f"The ranking beats random: {measured}.", beaten)
    return replace(finding, curve=curve, p_value=p_value), p_value


def oracle(group: Evidence, reduce: str, generator: np.random.Generator
            ) -> tuple[Finding, float]:
    """disagrees_with_ablation on one cluster, its neurons resampled by `generator`."""
    signed = reduce == "mean"
    agreement = sampled_spearman(group.scores, group.oracle, reduce, group.draws, generator)
    rho, low, high = agreement.value, agreement.low, agreement.high
    compared = agreement.n_sampled
    chance = _chance_of(rho, compared)
    convention = "signed" if signed else "absolute-value"
    odds = f"p = {chance:.2g}" if chance >= 1e-12 else "p < 1e-12"
    sampled = ("" if group.oracle.exact else
               f", on {compared:,} of the {agreement.n_neurons:,} neurons"
               + (f" and {agreement.samples:,} of the cluster's {agreement.n_samples:,} "
                  "samples" if agreement.samples < agreement.n_samples else "")
               + " drawn at random (the interval spans both draws: samples and neurons)")
    measured = (f"Spearman {rho:.2f} (95% interval {low:.2f} to {high:.2f}; {convention}; a "
                f"random ranking of {compared} neurons agrees as well with {odds}) with the "
                "exact single-neuron ablation effect on the "
                + ("output" if group.regression else "target logit") + sampled)
    hint = ("Rank by «method=gradient_x_activation» (a first-order ablation estimate) or by "
            "«method=ablation» itself; see the oracle table.")
    bounds = dict(low=low, high=high, p_value=chance)
    if np.isnan(rho):
        return replace(_finding(
            "disagrees_with_ablation", "problem", "The ranking or the ablation effects are "
            "constant, so they cannot agree.", rho, hint), **bounds), np.inf
    undecided = not group.oracle.exact and chance > RANK_P and high >= ORACLE_OK
    if low >= ORACLE_OK:
        finding = Finding("disagrees_with_ablation", "ok",
                          f"The scores track ablation: {measured}.", rho)
    elif undecided:  # too few neurons drawn for a weak agreement to tell anything
        finding = _finding("disagrees_with_ablation", "warning",
                           "Too few neurons were ablated to tell whether the scores track "
                           f"what removing a neuron does: {measured}.", rho,
                           "Ablate more of the neurons to tell: «oracle_neurons="
                           f"{agreement.n_neurons}» measures every one.", TOO_FEW_NEURONS)
    elif high < ORACLE_WARNING or chance > RANK_P:
        finding = _finding("disagrees_with_ablation", "problem",
                           f"The scores barely track what removing a neuron does: {measured}.",
                           rho, hint)
    else:
        finding = _finding("disagrees_with_ablation", "warning",
                           "The scores only loosely track what removing a neuron does: "
                           f"{measured}.", rho, hint)
    return replace(finding, **bounds), -rho


def _chance_of(rho: float, n_neurons: int) -> float:
    """The one-sided p-value of a Spearman rho over n neurons against a random ranking (the
    chance that a random order agrees at least as well); 1 where it cannot be told."""
    if not np.isfinite(rho) or n_neurons < 3:
        return 1.0
    from scipy import stats  # as ranks.rank_correlation: on first use

    # the t approximation of scipy's spearmanr, one-sided
    t = rho * np.sqrt((n_neurons - 2) / max(1e-300, (1 - rho) * (1 + rho)))
    return float(stats.t.sf(t, n_neurons - 2))


def worst(results: list[tuple[Finding, float]], groups: list[Evidence],
           labelled: bool) -> Finding:
    """The worst cluster's finding (by severity, then badness), naming it among several."""
    rank = {severity: position for position, severity in enumerate(SEVERITIES)}
    position = max(range(len(results)),
                   key=lambda i: (rank[results[i][0].severity], results[i][1]))
    finding = results[position][0]
    if not labelled:
        return finding
    flagged = sum(result[0].severity != "ok" for result in results)
    prefix = f"Cluster {groups[position].name!r}"
    if flagged:
        prefix += f" (worst of {flagged} flagged out of {len(results)} clusters)"
    else:
        prefix += f" (least good of {len(results)} clusters, all ok)"
    return replace(finding, message=f"{prefix}: {finding.message}",
                   screen_message=f"{prefix}: {finding.words(screen=True)[0]}")


def integral_finding(checked: SumCheck, method: str, n_steps: int) -> Finding:
    """incomplete_integral: do the path method's scores of each sample sum to the difference
    they integrate (`Method.sums_to`), after the engine took more steps where they did not
    (`paths.sum_check` of the scores' sums)? Value: the largest miss, as a share of
    that difference. Also what the scores page says under a path method's scores."""
    target = REGISTRY[method].sums_to
    tolerance = f"{SUM_TOLERANCE:.0%}"
    bypassed = (f" For {checked.n_bypassed} sample(s) a path bypasses the layer (its output "
                "does not carry all of the input's effect), so the sum does not apply and is "
                "not checked." if checked.n_bypassed else "")
    if checked.n_missing:
        return _finding(
            "incomplete_integral", "warning",
            f"For {checked.n_missing} of {checked.n_samples} samples the «method={method}» "
            f"scores miss {target} by more than {tolerance} (by up to {checked.worst:.1%}) "
            f"after up to {checked.most_steps} integration steps: their integral is "
            "inaccurate." + bypassed,
            checked.worst, f"Raise n_steps (--n-steps on the command line; it is "
            f"{n_steps}): " + (
                f"the engine integrates a sample whose sum misses again with up to "
                f"{REGISTRY[method].refine_factor} times that many steps." if
                REGISTRY[method].refine_factor > 1 else
                "the engine checks this method's sum without integrating again."))
    if not checked.n_samples:
        return _finding("incomplete_integral", "ok",
                        f"No sample's «method={method}» scores have a sum to check." + bypassed,
                        0.0)
    refined = (f" ({checked.n_refined} of them took more than the {n_steps} steps asked for, "
               f"up to {checked.most_steps})" if checked.n_refined else "")
    return _finding("incomplete_integral", "ok",
                    f"Every sample's «method={method}» scores sum to {target} within "
                    f"{tolerance}{refined}." + bypassed, checked.worst)


def _neuron_list(indices: np.ndarray, shown: int = 8, noun: str = "neuron") -> str:
    listed = ", ".join(str(int(i)) for i in indices[:shown])
    more = f", ... ({len(indices) - shown} more)" if len(indices) > shown else ""
    return f"{noun}{'s' if len(indices) != 1 else ''} {listed}{more}"


# ------------------------------------------------------------------ the user's own scores

def capture(user_scores, engine: np.ndarray, method: str) -> Finding:
    """Compare one's own per-sample [m, n] (or [k, m, n], or cluster [n]) scores with ours."""
    if isinstance(user_scores, torch.Tensor):
        user_scores = user_scores.detach().cpu().numpy()
    user = np.asarray(user_scores, dtype=np.float64)
    n_samples_, n_neurons = engine.shape
    if user.ndim == 3:
        user = user.reshape(-1, user.shape[-1])
    if user.ndim not in (1, 2) or user.shape[-1] != n_neurons:
        raise AttributionError(f"user_scores must be per-sample [{n_samples_}, {n_neurons}] or "
                               f"one cluster score [{n_neurons}]; got shape "
                               f"{list(np.shape(user_scores))}.")
    hint = ("Compute one sample per pass (inputs[i].unsqueeze(0)), clear gradients before each "
            "backward, register hooks inside try/finally and remove them, or use "
            "at.neuron_scores.")
    code = "suspicious_gradient_capture"
    if user.ndim == 2 and user.shape[0] != n_samples_:
        repeats, leftover = divmod(user.shape[0], n_samples_)
        if leftover or repeats == 0:
            raise AttributionError(f"user_scores has {user.shape[0]} rows but {n_samples_} "
                                   "samples were analysed; pass one row per sample, in order "
                                   "(for one cluster: its samples' rows, or every sample's).")
        if repeats == n_samples_:
            pattern = "whole_batch"
            message = (f"Your array has {n_samples_} x {n_samples_} rows: every backward "
                       "captured the whole batch's gradient [1, B, n], i.e. the loop feeds "
                       "inputs.unsqueeze(0) instead of inputs[i].unsqueeze(0).")
        else:
            pattern = "stale_hooks"
            message = (f"Your array has {repeats}x as many rows as samples: each backward "
                       f"appended {repeats} rows, i.e. hooks registered by earlier calls are "
                       "still attached (never removed) or the list kept rows from earlier "
                       "calls.")
        return Finding(code, "problem", message, float(repeats), hint, pattern)
    if not np.isfinite(user).all():
        return Finding(code, "problem", "Your scores contain NaN or inf where the engine's are "
                       "finite.", float("inf"), hint, "non_finite")
    reference = engine.astype(np.float64) if user.ndim == 2 else engine.mean(0)
    error = _relative(user, reference)
    if error <= CAPTURE_TOLERANCE:
        return Finding(code, "ok", f"Your {method} scores match the engine's (relative "
                       f"difference {error:.1e}).", error)
    pattern, message = _explain(user, engine.astype(np.float64), reference, error, method)
    return Finding(code, "problem", message, error, hint, pattern)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    norm = np.linalg.norm(b)
    difference = np.linalg.norm(a - b)
    return float(difference / norm) if norm > 0 else (0.0 if difference == 0 else np.inf)


def _explain(user: np.ndarray, engine: np.ndarray, reference: np.ndarray, error: float,
             method: str) -> tuple[str, str]:
    """(pattern, message): the bug whose signature fits the difference, if one does."""
    denominator = float((reference * reference).sum())
    scale = float((user * reference).sum()) / denominator if denominator > 0 else 0.0
    if scale != 0 and _relative(user, scale * reference) <= PATTERN_TOLERANCE:
        batch = round(1 / scale)
        if batch >= 2 and abs(1 / scale - batch) <= PATTERN_TOLERANCE * batch:
            return "whole_batch", (
                f"Your scores are the engine's divided by {batch}: each pass fed a batch of "
                f"{batch} samples (inputs.unsqueeze(0) instead of inputs[i].unsqueeze(0)), so "
                "the hook captured [1, B, n] and averaging over it divided by B.")
        return "scaled", f"Your scores are {scale:.3g} x the engine's {method} scores."
    cumulative = np.cumsum(engine, axis=0)
    if user.ndim == 2 and user.shape[0] > 1:
        if _relative(np.diff(user, axis=0), engine[1:]) <= PATTERN_TOLERANCE:
            return "accumulating", (
                "Your row i is the sum of the engine's rows 0..i: gradients accumulate across "
                "backward calls (.grad is never zeroed between samples).")
        spread = np.ptp(user, axis=0).max()
        if spread <= PRECISION * np.abs(user).max() and np.ptp(engine, axis=0).max() > 0:
            return "whole_batch", ("Every row of your array is the same, while the engine's "
                                   "differ per sample: one gradient was captured for the "
                                   "whole batch.")
    elif user.ndim == 1 and _relative(user, cumulative.mean(0)) <= PATTERN_TOLERANCE:
        return "accumulating", (
            "Your cluster score is the mean of running sums of the engine's per-sample "
            "scores: gradients accumulate across backward calls (.grad is never zeroed).")
    return "unknown", (f"Your scores differ from the engine's {method} scores by {error:.0%} "
                       "(relative); no known bug pattern fits, so compare one sample by hand.")
