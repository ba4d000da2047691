"""The fast split's check (`split.runner_for`) runs on `check_rows` of the first batch, not on
the whole batch: a first call costs about what a warm call costs, the runner checked on those
rows is the one that runs the whole batch (an export of a transformers model included), and a
wrong split is still refused."""
import pytest
import torch
from torch import nn

import attribution as at
from attribution.engine.guards import eval_mode
from attribution.engine.layers import output_tensor, run_logits
from attribution.engine.model_io import NamedInputs, n_rows
from attribution.engine.runners import CHECK_ROWS, FxRunner, HookRunner, check_rows, runner_for

from tests.support.models import build


def padded_gpt2(n: int):
    """(a small GPT-2 classifier, n sequences with padding: input_ids and attention_mask
    [n, 9], targets [n])."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                        num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                        initializer_range=0.3, use_cache=False)  # as `huggingface` loads it
    lengths = torch.randint(2, 10, (n,))
    lengths[0] = 9
    mask = (torch.arange(9)[None] < lengths[:, None]).long()
    ids = torch.randint(2, 40, (n, 9)) * mask
    return (GPT2ForSequenceClassification(config).eval(),
            NamedInputs({"input_ids": ids, "attention_mask": mask}), torch.randint(0, 3, (n,)))


CASES = {  # name -> (model, inputs, targets), the layer, the runner it gets
    "fx split": (lambda: build("residual_mlp"), "fc2", FxRunner),
    "hooks (data-dependent control flow)": (lambda: build("untraceable"), "fc1", HookRunner),
    "torch.export of a transformers model, padded named inputs": (
        lambda: padded_gpt2(3 * CHECK_ROWS + 1), "transformer.h.0.mlp.c_fc", FxRunner),
}


class RowsSeen:
    """Rows of every real batch that reaches `module` (fake tensors of an export are not
    counted)."""

    def __init__(self, module: nn.Module):
        self.rows: list[int] = []
        self.handle = module.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        if type(args[0]) is torch.Tensor:
            self.rows.append(args[0].shape[0])

    def taken(self) -> list[int]:
        rows, self.rows = self.rows, []
        return rows


def test_check_rows_spread_over_the_batch_and_slice_every_named_input_alike():
    model, x, _ = padded_gpt2(3 * CHECK_ROWS + 1)
    rows = check_rows(x)
    assert n_rows(rows) == CHECK_ROWS
    spread = torch.linspace(0, n_rows(x) - 1, CHECK_ROWS).round().long()
    assert spread[0] == 0 and spread[-1] == n_rows(x) - 1
    for name in ("input_ids", "attention_mask"):
        assert torch.equal(rows[name], x[name][spread])
    small = x[:CHECK_ROWS]
    assert check_rows(small) is small


@pytest.mark.parametrize("make, layer, kind", CASES.values(), ids=CASES.keys())
def test_the_split_is_checked_on_a_few_rows_and_runs_the_whole_batch(make, layer, kind):
    """The check's reference pass (and the runner's capture) see `check_rows`, not the batch;
    the runner checked on them reproduces the model on the whole batch, alone and stacked."""
    model, x, _ = make()
    module = model.get_submodule(layer)
    seen = RowsSeen(module)
    try:
        with eval_mode(model):
            runner = runner_for(model, layer, module, x)
        checked = seen.taken()
    finally:
        seen.handle.remove()
    assert isinstance(runner, kind)
    assert checked and max(checked) <= CHECK_ROWS < n_rows(x)
    hooked = []
    with eval_mode(model), torch.no_grad():
        handle = module.register_forward_hook(
            lambda m, args, out: hooked.append(output_tensor(out).clone()))
        try:
            expected = run_logits(model, x)
        finally:
            handle.remove()
        z, state, logits = runner.capture(x)
        doubled = runner.tail(torch.cat([z, z]), state, 2)
    torch.testing.assert_close(z.movedim(1, runner.axis), hooked[0])
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(doubled, expected.repeat(2, 1))


@pytest.mark.parametrize("make, layer, kind", CASES.values(), ids=CASES.keys())
def test_a_first_call_runs_the_layer_on_less_than_one_batch_more_than_a_warm_call(
        make, layer, kind):
    """Rows through the layer's module in a first gradient x activation call and in the
    next: the check adds a few rows (it added three batches: a reference pass and two
    captures, on the whole first batch)."""
    model, x, y = make()
    seen = RowsSeen(model.get_submodule(layer))
    try:
        first = at.neuron_scores(model, layer, x, y, "gradient_x_activation")
        first_rows = sum(seen.taken())
        warm = at.neuron_scores(model, layer, x, y, "gradient_x_activation")
        warm_rows = sum(seen.taken())
    finally:
        seen.handle.remove()
    torch.testing.assert_close(first, warm)
    assert 0 < first_rows - warm_rows < n_rows(x)


class TwoOutputs(nn.Module):
    """A layer returning (h, 2 tanh(h)); as a layer it stands for h (`output_tensor`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)

    def forward(self, x):
        h = self.fc(x)
        return h, 2 * torch.tanh(h)


class ReadsTheSecondOutput(nn.Module):
    """Reads only the second output of `pair`: fx's one use of the layer takes entry 1, a
    cut at the wrong value (hooks replace entry 0, which nothing reads)."""

    def __init__(self):
        super().__init__()
        self.pair, self.head = TwoOutputs(), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.pair(x)[1])


def test_a_split_at_the_wrong_entry_of_a_tuple_is_refused_on_the_checked_rows():
    """The graph's cut (entry 1) differs from what hooks replace (entry 0): the check on the
    rows sees z differ and falls back to hooks, which find that the logits do not depend on
    the layer (the model never reads entry 0); the wrong cut would give scores."""
    torch.manual_seed(0)
    model, x = ReadsTheSecondOutput().eval(), torch.randn(3 * CHECK_ROWS + 1, 6)
    y = torch.randint(0, 3, (len(x),))
    with eval_mode(model):
        assert isinstance(runner_for(model, "pair", model.pair, x), HookRunner)
    with pytest.raises(at.AttributionError, match="do not depend on layer 'pair'"):
        at.neuron_scores(model, "pair", x, y, "gradient")
