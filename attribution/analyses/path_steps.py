"""A path method's steps fitted to a budget.

Integrated gradients and conductance take one pass per step and sample (integrated
gradients: the layer's tail, forward and backward, the front once per batch; conductance:
the whole model, its inputs scaled), so on a wide, deep tail the default steps can take
minutes. `plan_steps` keeps the most steps, halving from those asked (at least
FEWEST_STEPS), whose time fits the budget: each timed on a sample of the samples (one
batch at most) and scaled to all of them. A path method integrates a sample that misses
its sum again with more steps (`paths`), and fewer steps miss more often, so the time is
not linear in the steps: the steps kept are timed themselves, refinement included (said),
after a first guess from the fewest steps' time; where the steps kept refined samples,
twice as many are timed too, since they may refine fewer and fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
from torch import nn

from ..defaults import DEFAULT_BATCH_SIZE, DEFAULT_N_STEPS
from ..engine.layers import list_layers
from ..engine.model_io import n_rows, named, take
from ..errors import AttributionError
from ..methods.paths import sum_check
from ..methods.registry import REGISTRY
from ..methods.scores import Inputs, ScoreFacts, check_method, neuron_scores
from .costs import SAMPLED_RUNS, fastest, seconds_words, take_rows

PATH_SECONDS = 30.0
"""The time a path method's scores may take when its steps are not given (`plan_steps`)."""
FEWEST_STEPS = 8
"""The fewest steps `plan_steps` keeps: eight Gauss-Legendre nodes integrate a smooth path
to float precision, and a sample they miss is integrated again (`paths.MAX_STEPS_FACTOR`)."""
PROBE_SHARE = 8
"""`plan_steps` times the method on one batch, and on at most 1/PROBE_SHARE of the samples
(every sample where fewer than PROBE_SHARE), so that the plan costs a small part of the
work it sizes."""


StepsChoice = Union[int, Mapping[str, Union[int, "StepsPlan"]]]
"""A path method's steps: one count for every method (and layer), or a count or a
`StepsPlan` per key ("layer/method" in a scorecard, the method in one layer's table), the
default steps where it has none (`steps_in`)."""


def takes_steps(method: str) -> bool:
    """Does `method` integrate along a path (its cost grows with `n_steps`)? (An unknown
    name does not: the analysis that takes it says so.)"""
    spec = REGISTRY.get(method)
    return spec is not None and spec.sums_to is not None and spec.refine_factor > 1


@dataclass(frozen=True)
class StepsPlan:
    """A path method's steps sized to a budget: `n_steps` of the `asked`, estimated at
    `seconds` over the `n_samples` (`asked_seconds` at the steps asked); `refined`: the
    share of the timed samples the method integrated again at `n_steps` (their extra
    steps are in the estimate) (`plan_steps`)."""

    method: str
    n_steps: int
    asked: int
    seconds: float
    asked_seconds: float
    refined: float
    n_samples: int
    budget: float = PATH_SECONDS

    @property
    def reduced(self) -> bool:
        return self.n_steps < self.asked

    def at_steps_asked(self) -> "StepsPlan":
        """This plan at every step asked, whatever they cost (a user's choice): `n_steps` and
        `seconds` those asked; `refined` 0, as no share refined at them was measured."""
        return replace(self, n_steps=self.asked, seconds=self.asked_seconds, refined=0.0)

    def words(self, name: Optional[str] = None) -> str:
        """"integrated_gradients at 8 steps, about 24 s: as many as fit in 30 s (32 steps:
        about 1.6 min); in the timing 3% of the samples missed their sum and were integrated
        again with more steps (counted)"; "...: the fewest it takes, and still over the 30 s
        budget (...)" where even FEWEST_STEPS pass it. `name`: the method's, in words."""
        said = f"{name or self.method} at {self.n_steps} steps, {seconds_words(self.seconds)}"
        asked = f"{self.asked} steps: {seconds_words(self.asked_seconds)}"
        if self.reduced and self.seconds <= self.budget:
            said += f": as many as fit in {self.budget:.0f} s ({asked})"
        elif self.reduced:
            said += (f": the fewest it takes, and still over the {self.budget:.0f} s budget "
                     f"({asked})")
        if self.refined:
            said += (f"; in the timing {self.refined:.0%} of the samples missed their sum and "
                     "were integrated again with more steps (counted)")
        return said


def plan_steps(model: nn.Module, layer, inputs: Inputs, targets=None,
               method: str = "integrated_gradients", *, n_steps: int = DEFAULT_N_STEPS,
               budget: Optional[float] = None, batch_size: int = DEFAULT_BATCH_SIZE,
               device=None) -> StepsPlan:
    """The steps of path `method` on these inputs (in memory [N, ...]; targets as in
    `neuron_scores`) that fit `budget` seconds (None: PATH_SECONDS): `n_steps` where they
    fit, else half as many until they do or FEWEST_STEPS (said either way), then twice as
many while they fit and the steps kept refined samples or fit twice over. Each timed
    on the first samples (one batch, at most 1/PROBE_SHARE of them), refinement included,
    the fastest of SAMPLED_RUNS runs, and scaled to every sample; the steps asked are
    timed where kept, else estimated in proportion to the steps kept."""
    check_method(method)
    if not takes_steps(method):
        raise AttributionError(f"{method} takes no steps: only a path method's are planned.")
    budget = PATH_SECONDS if budget is None else budget
    total = n_rows(named(inputs))
    rows = min(total, batch_size, max(1, total // PROBE_SHARE))
    probe, probe_targets = (take_rows(value, np.arange(rows)) for value in (inputs, targets))
    refined: dict[int, float] = {}

    def seconds(steps: int) -> float:
        facts = ScoreFacts()

        def score() -> None:
            neuron_scores(model, layer, probe, probe_targets, method, batch_size=batch_size,
                          n_steps=steps, device=device, facts=facts)
        took = fastest(score, SAMPLED_RUNS)
        checked = sum_check(facts.sums, steps)
        refined[steps] = checked.n_refined / max(checked.n_samples, 1) if checked else 0.0
        return took

    fewest = min(FEWEST_STEPS, n_steps)
    first = np.arange(1)
    neuron_scores(model, layer, take_rows(probe, first), take_rows(probe_targets, first),
                  method, n_steps=fewest, device=device)  # builds what is built once per model
    timed = {fewest: seconds(fewest)}
    scale = total / rows
    chosen = n_steps  # a first guess from the fewest steps' time, refinement and all:
    while chosen > fewest and timed[fewest] * chosen / fewest * scale > budget:
        chosen = max(fewest, chosen // 2)  # it errs toward fewer
    while True:
        if chosen not in timed:
            timed[chosen] = seconds(chosen)
        if timed[chosen] * scale <= budget or chosen <= fewest:
            break
        chosen = max(fewest, chosen // 2)
    while timed[chosen] * scale <= budget and chosen * 2 <= n_steps:
        larger = chosen * 2  # refinement makes fewer steps dearer than their share: timed
        if not refined[chosen] and timed[chosen] * 2 * scale > budget:
            break
        if larger not in timed:
            timed[larger] = seconds(larger)
        if timed[larger] * scale > budget:
            break
        chosen = larger
    asked_seconds = timed.get(n_steps, timed[chosen] * n_steps / chosen) * scale
    return StepsPlan(method, chosen, n_steps, timed[chosen] * scale, asked_seconds,
                     refined[chosen], total, budget)


def steps_in(n_steps: StepsChoice, key: str) -> int:
    """The steps `n_steps` gives `key` ("layer/method" or "method"): itself where it is a
    count, else its entry's (a `StepsPlan`'s n_steps), DEFAULT_N_STEPS where it has none."""
    if not isinstance(n_steps, Mapping):
        return int(n_steps)
    chosen = n_steps.get(key, DEFAULT_N_STEPS)
    return chosen.n_steps if isinstance(chosen, StepsPlan) else int(chosen)


def plan_layer_steps(model: nn.Module, inputs: Inputs, targets=None, *,
                     layers: Optional[Sequence[str]] = None, methods: Sequence[str],
                     n_steps: int = DEFAULT_N_STEPS, budget: Optional[float] = None,
                     batch_size: int = DEFAULT_BATCH_SIZE, device=None,
                     known: Mapping[str, StepsPlan] = MappingProxyType({})
                     ) -> dict[str, StepsPlan]:
    """{"layer/method": its `plan_steps`} for every path method of `methods` on every layer
    of `layers` (None: every layer of `list_layers`) that takes it (one that refuses a layer,
    conductance on token ids, has no entry: the analysis says why). A scorecard's `n_steps`
    (`steps_in`): each layer's steps those of its scores on their own, in `budget` seconds
    each. `known`: plans already made under the same steps and budget, kept rather than
    timed again (the view's own layer, planned for its scores). In-memory inputs only."""
    if layers is None:
        layers = [info.spec for info in list_layers(model, take(named(inputs), slice(0, 2)))]
    budget = PATH_SECONDS if budget is None else budget

    def plan(layer: str, method: str) -> StepsPlan:
        kept = known.get(f"{layer}/{method}")
        if kept is not None and (kept.asked, kept.budget) == (n_steps, budget):
            return kept
        return plan_steps(model, layer, inputs, targets, method, n_steps=n_steps,
                          budget=budget, batch_size=batch_size, device=device)

    return layer_plans(layers, methods, plan)


def layer_plans(layers: Sequence[str], methods: Sequence[str],
                plan: Callable[[str, str], StepsPlan]) -> dict[str, StepsPlan]:
    """{"layer/method": plan(layer, method)} for every path method of `methods` on every
    layer of `layers`; a layer the method refuses (`plan` raises AttributionError:
    conductance on token ids) has no entry, and the analysis says why."""
    plans = {}
    for layer in layers:
        for method in filter(takes_steps, dict.fromkeys(methods)):
            try:
                plans[f"{layer}/{method}"] = plan(layer, method)
            except AttributionError:
                continue
    return plans


def layer_steps_words(plans: Mapping[str, StepsPlan], label=str) -> str:
    """"integrated_gradients at 8 steps on fc1 and 16 on fc2: as many as fit in 30 s on
    each layer (32 asked)" for the plans of `plan_layer_steps` that reduced their steps,
    one clause per method (`label`: its name in words); "" where none did."""
    said = []
    for method in dict.fromkeys(key.rsplit("/", 1)[1] for key in plans):
        reduced = [(key.rsplit("/", 1)[0], plan) for key, plan in plans.items()
                   if key.rsplit("/", 1)[1] == method and plan.reduced]
        if reduced:
            parts = [f"{plan.n_steps}{' steps' if not i else ''} on {layer}"
                     for i, (layer, plan) in enumerate(reduced)]
            listed = parts[0] if len(parts) == 1 else \
                ", ".join(parts[:-1]) + " and " + parts[-1]
            first = reduced[0][1]
            said.append(f"{label(method)} at {listed}: as many as fit in "
                        f"{first.budget:.0f} s on each layer ({first.asked} asked)")
    return "; ".join(said)
