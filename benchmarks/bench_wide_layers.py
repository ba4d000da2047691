"""Research-size layers: GPT-2 small's h.6 MLP (3,072 neurons) and a ResNet-50-shaped last
stage (2,048 channels), both with random weights built from their shapes (no downloads).

    python -m benchmarks.bench_wide_layers [--sequences 256] [--images 64] [--only MODEL]
                                           [--no-scorecard] [--results FILE]

Per model, on this machine: one forward and one forward+backward of the whole batch; the
`gradient` scores of every neuron against that forward+backward; diagnose's plan
(`diagnose_plan`: the oracle as many neurons, and where needed samples, as fit
`oracle_sample.ORACLE_SECONDS`; the evidence curve sized to `costs.CURVE_SECONDS`), each
part's time as said against as taken; the agreement table of two methods with that oracle,
each with its interval over the samples and the neurons drawn; diagnose itself at its
defaults and the scorecard of the layer (its default seven methods on that oracle), each
said (`diagnose_cost`, `scorecard_cost`) against taken; integrated gradients at the steps
that fit `path_steps.PATH_SECONDS` (`plan_steps`), said against taken; the scorecard takes
each path method's steps so fitted (`plan_layer_steps`, as the front ends do); the Pruning
page's curves at their defaults (`AnalysisSettings.curve_plan`, sized to
`settings.PAGE_CURVE_SECONDS`), said against taken.
"""
import argparse
import time

import torch
from torch import nn

import attribution as at
from attribution.analyses.costs import CURVE_SECONDS, draw_samples, seconds_words
from attribution.analyses.path_steps import PATH_SECONDS, plan_layer_steps, plan_steps
from attribution.analyses.settings import (PAGE_CURVE_SECONDS, SCORECARD_METHODS,
                                           AnalysisSettings)
from attribution.analyses.view import View, curve_cost_on, pruning_curves_on
from attribution.analyses.oracle_sample import ORACLE_SECONDS
from benchmarks.common import note, record, run

LAYERS = {"gpt2": "model.transformer.h.6.mlp.act", "resnet": "stage.1.out"}


class Logits(nn.Module):
    """A sequence classifier's logits [B, classes] from token ids [B, T]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def gpt2_small(sequences: int, length: int = 32):
    """(GPT-2 small for 2 classes, token ids [sequences, length], classes)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = GPT2Config(num_labels=2, pad_token_id=0)  # 12 layers, 768 wide, MLP 3,072
    model = Logits(GPT2ForSequenceClassification(config)).eval()
    ids = torch.randint(1, config.vocab_size, (sequences, length))
    return model, ids, torch.randint(0, 2, (sequences,))


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1x1 (width), 3x3 (width), 1x1 (4 x width), batch norms, the
    identity (or a projection) added, a ReLU (`out`)."""

    def __init__(self, channels: int, width: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width))
        self.skip = (nn.Identity() if stride == 1 and channels == 4 * width else nn.Sequential(
            nn.Conv2d(channels, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width)))
        self.out = nn.ReLU()

    def forward(self, x):
        return self.out(self.body(x) + self.skip(x))


def resnet50_last_stage(images: int, size: int = 64):
    """(a stem to 1,024 channels at 1/16 size, ResNet-50's last stage (3 bottlenecks, 2,048
    channels at 1/32), pooling and 10 classes; images [images, 3, size, size]; classes)."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.Conv2d(3, 1024, 16, 16), nn.BatchNorm2d(1024),
                                           nn.ReLU()))
    model.add_module("stage", nn.Sequential(Bottleneck(1024, 512, 2), Bottleneck(2048, 512),
                                            Bottleneck(2048, 512)))
    model.add_module("pool", nn.AdaptiveAvgPool2d(1))
    model.add_module("flat", nn.Flatten())
    model.add_module("fc", nn.Linear(2048, 10))
    for module in model.modules():  # running statistics as a trained net has them
        if isinstance(module, nn.BatchNorm2d):
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.normal_(module.bias, 0.0, 0.1)
    model.eval()
    x = torch.randn(images, 3, size, size)
    return model, x, torch.randint(0, 10, (images,))


def timed(work):
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def forward_backward(model: nn.Module, x: torch.Tensor, targets: torch.Tensor,
                     batch_size: int) -> float:
    """Seconds of one forward+backward of the target logits, batch by batch."""
    def work():
        for start in range(0, len(x), batch_size):
            logits = model(x[start:start + batch_size])
            logits.gather(1, targets[start:start + batch_size, None]).sum().backward()
    return timed(work)[0]


def measure(name: str, model: nn.Module, x: torch.Tensor, targets: torch.Tensor,
            batch_size: int, with_scorecard: bool = True) -> None:
    layer = LAYERS[name]
    with torch.no_grad():
        forward = timed(lambda: [model(x[s:s + batch_size]) for s in range(0, len(x),
                                                                              batch_size)])[0]
    both = forward_backward(model, x, targets, batch_size)
    model.zero_grad(set_to_none=True)
    options = dict(batch_size=batch_size)
    gradient, scores = timed(lambda: at.neuron_scores(model, layer, x, targets, "gradient",
                                                      **options))
    n_neurons = scores.shape[1]
    sizing, planned = timed(lambda: at.diagnose_plan(model, layer, x, targets, **options))
    plan, curve = planned.oracle, planned.curve
    oracle_seconds, oracle = timed(lambda: at.sample_oracle(model, layer, x, targets, plan,
                                                            **options))
    ranking = scores.mean(0).numpy()
    measured = torch.from_numpy(draw_samples(torch.zeros(len(x)).long().numpy(), curve.share))
    curve_seconds, _ = timed(lambda: at.pruning_curve(
        model, layer, x[measured], targets[measured], ranking, ks=curve.ks(n_neurons),
        n_random=curve.n_random, metric="target_logit", **options))
    table_seconds, table = timed(lambda: at.oracle_agreement(
        model, layer, x, targets, methods=["gradient", "gradient_x_activation"],
        oracle_neurons=plan, **options))
    cost_seconds, cost = timed(lambda: at.diagnose_cost(model, layer, x, targets, "gradient",
                                                        plan=planned, **options))
    diagnose_seconds, findings = timed(lambda: at.diagnose(model, layer, x, targets,
                                                           "gradient", plan=planned, **options))
    steps_seconds, steps = timed(lambda: plan_steps(model, layer, x, targets,
                                                    "integrated_gradients", **options))
    path_seconds, _ = timed(lambda: at.neuron_scores(model, layer, x, targets,
                                                     "integrated_gradients",
                                                     n_steps=steps.n_steps, **options))
    clusters = targets.numpy()
    page = View(model, x, targets, clusters, AnalysisSettings(layer=layer,
                                                              cluster=int(targets[0])),
                labels=targets)
    page_plan_seconds, page_plan = timed(lambda: page.settings.curve_plan(
        curve_cost_on(page), clusters))
    page_seconds, _ = timed(lambda: pruning_curves_on(page, ranking, plan=page_plan))
    card_plans = {layer: plan}
    if with_scorecard:
        card_steps_seconds, card_steps = timed(lambda: plan_layer_steps(
            model, x, targets, layers=[layer], methods=SCORECARD_METHODS, **options))
        card_options = dict(layers=[layer], oracle_neurons=card_plans, n_steps=card_steps,
                            **options)
        card_cost_seconds, card_cost = timed(lambda: at.scorecard_cost(
            model, x, targets, **card_options))
        card_seconds, card = timed(lambda: at.scorecard(model, x, targets, **card_options))
    samples = f" on {plan.samples} of {plan.n_samples} samples" if plan.share < 1 else ""
    curve_words = (f"{len(curve.ks(n_neurons))} k x {curve.n_random + 2} orders on "
                   f"{curve.samples} of {curve.n_samples} samples")
    rows = [("one forward", f"{forward:.1f} s", ""),
            ("one forward+backward", f"{both:.1f} s", "1.00x"),
            (f"gradient scores, all {n_neurons:,} neurons", f"{gradient:.1f} s",
             f"{gradient / both:.2f}x"),
            ("diagnose's plan (ablation of 1, then 5 or more neurons, timed)", f"{sizing:.1f} s",
             ""),
            (f"exact ablation of all {n_neurons:,}, as estimated", f"{plan.exact_seconds:.0f} s",
             ""),
            (f"exact ablation of {plan.neurons:,} of {n_neurons:,} neurons{samples} (budget "
             f"{ORACLE_SECONDS:.0f} s)", f"{oracle_seconds:.1f} s",
             f"said/took {plan.seconds / oracle_seconds:.2f}"),
            (f"evidence curve, {curve_words} (budget {CURVE_SECONDS:.0f} s)",
             f"{curve_seconds:.1f} s", f"said/took {curve.seconds / curve_seconds:.2f}"),
            ("  the full curve, as estimated", f"{curve.full_seconds:.0f} s", ""),
            ("agreement table, 2 methods, on that sample", f"{table_seconds:.1f} s", ""),
            ("diagnose at its defaults (method gradient)", f"{diagnose_seconds:.1f} s",
             f"said/took {cost.seconds / diagnose_seconds:.2f}"),
            ("  its estimate (diagnose_cost), computed in", f"{cost_seconds:.1f} s", ""),
            (f"integrated gradients at {steps.n_steps} steps, fitted to {PATH_SECONDS:.0f} s "
             f"({steps.asked} steps: {seconds_words(steps.asked_seconds)})",
             f"{path_seconds:.1f} s", f"said/took {steps.seconds / path_seconds:.2f}"),
            ("  its plan (plan_steps), computed in", f"{steps_seconds:.1f} s", ""),
            (f"Pruning page's curves at their defaults, {len(page_plan.ks(n_neurons))} k on "
             f"{page_plan.samples} of {page_plan.n_samples} samples (budget "
             f"{PAGE_CURVE_SECONDS:.0f} s)", f"{page_seconds:.1f} s",
             f"said/took {page_plan.seconds / page_seconds:.2f}"),
            ("  their plan (curve_cost, curve_plan), computed in",
             f"{page_plan_seconds:.1f} s", "")]
    if with_scorecard:
        rows += [(f"scorecard of this layer, {card['method'].nunique()} methods, on the "
                  "oracle's sample", f"{card_seconds:.1f} s",
                  f"said/took {card_cost.seconds / card_seconds:.2f}"),
                 ("  its estimate (scorecard_cost), computed in", f"{card_cost_seconds:.1f} s",
                  ""),
                 ("  its path steps (plan_layer_steps: " + ", ".join(
                     f"{key.rsplit('/', 1)[1]} {steps_plan.n_steps}"
                     for key, steps_plan in card_steps.items()) + "), computed in",
                  f"{card_steps_seconds:.1f} s", "")]
    for row in table.itertuples():
        rows.append((f"  {row.method}: on {row.neurons:,} of {row.n_neurons:,} neurons, "
                     f"{row.samples} of {row.n} samples",
                     f"ρ = {row.spearman_signed:.2f} [{row.spearman_signed_low:.2f}, "
                     f"{row.spearman_signed_high:.2f}]", ""))
    for row in card.itertuples() if with_scorecard else ():
        rows.append((f"  scorecard {row.method}: on {row.neurons:,} of {row.n_neurons:,} "
                     f"neurons, {row.samples} of {row.n_samples} samples",
                     f"ρ = {row.spearman:.2f} [{row.spearman_low:.2f}, "
                     f"{row.spearman_high:.2f}]", ""))
    for finding in findings:
        if finding.code in ("disagrees_with_ablation", "not_better_than_random"):
            rows.append((f"  {finding.code}: {finding.severity}", f"{finding.value:.2f}", ""))
            note(f"{name} {finding.code}: {finding.message}")
    title = f"{name} {layer}: {len(x)} samples, batch {batch_size}"
    print(f"\n{title}")
    for row in rows:
        print(f"  {row[0]:<72} {row[1]:>24} {row[2]:>14}")
    record(title, ("", "time", "/ forward+backward"), rows)
    note(f"{name}: the default oracle ablated {len(oracle.neurons):,} of {n_neurons:,} "
         f"neurons{samples} in {oracle_seconds:.1f} s against a budget of "
         f"{ORACLE_SECONDS:.0f} s; diagnose took {diagnose_seconds:.0f} s.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--only", choices=sorted(LAYERS))
    parser.add_argument("--no-scorecard", action="store_true",
                        help="leave out the scorecard and its estimate (minutes on GPT-2)")
    args = parser.parse_args()
    with_scorecard = not args.no_scorecard
    if args.only in (None, "resnet"):
        measure("resnet", *resnet50_last_stage(args.images), batch_size=64,
                with_scorecard=with_scorecard)
    if args.only in (None, "gpt2"):
        measure("gpt2", *gpt2_small(args.sequences), batch_size=64,
                with_scorecard=with_scorecard)


if __name__ == "__main__":
    raise SystemExit(run(main, "bench_wide_layers"))
