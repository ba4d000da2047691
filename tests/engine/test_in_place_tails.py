"""A gradient's leaf is copied before the tail only where the tail may write into it: the
static check of the tail's graph (`may_write_in_place`), and scores equal to a plain loop
whichever way it decides."""
import pytest
import torch
import torch.fx as fx
from torch import nn
from torch.nn import functional

import attribution as at
from attribution.engine.runners.fx_graph import may_write_in_place


class Tail(nn.Module):
    """fc -> `after` -> head: `after` is the tail's first step."""

    def __init__(self, after):
        super().__init__()
        self.fc, self.head, self.after = nn.Linear(6, 8), nn.Linear(8, 3), after

    def forward(self, x):
        return self.head(self.after(self.fc(x)))


class AddsInPlace(nn.Module):
    def forward(self, h):
        h += 1.0
        return h


class SetsAnItem(nn.Module):
    def forward(self, h):
        h[:, 0] = 0.0
        return h


class Shifted(nn.Module):
    def forward(self, h):
        return h + 1.0


class CallsReluInPlace(nn.Module):
    def forward(self, h):
        return functional.relu(h, True)


class MethodInPlace(nn.Module):
    def forward(self, h):
        return h.relu_()


class OwnLeaf(nn.Module):  # a module the tracer keeps whole: not torch.nn's own
    def forward(self, h):
        return torch.tanh(h)


class KeepsOwnLeaf(fx.Tracer):
    def is_leaf_module(self, module, name):
        return isinstance(module, OwnLeaf) or super().is_leaf_module(module, name)


CASES = [(nn.ReLU(), False), (Shifted(), False), (nn.Dropout(0.1), False),
         (nn.ReLU(inplace=True), True), (nn.Dropout(0.1, inplace=True), True),
         (AddsInPlace(), False),  # fx traces `h += 1` as `h + 1`: its graph writes nothing
         (CallsReluInPlace(), True), (MethodInPlace(), True)]


@pytest.mark.parametrize("after,writes", CASES)
def test_the_tails_in_place_writes_are_found_in_its_graph(after, writes):
    model = Tail(after).eval()
    assert may_write_in_place(fx.symbolic_trace(model).graph, model) is writes


def test_a_module_outside_torch_nn_counts_as_writing():
    model = Tail(OwnLeaf()).eval()
    graph = KeepsOwnLeaf().trace(model)
    assert may_write_in_place(graph, model)
    assert not may_write_in_place(fx.symbolic_trace(model).graph, model)  # traced through


def test_an_exported_programs_mutating_op_is_found():
    class Exported(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 8)

        def forward(self, x):
            return self.fc(x).relu_()

    model = Exported().eval()
    program = torch.export.export(model, (torch.randn(2, 6),))
    graph = program.graph_module.graph
    assert may_write_in_place(graph, program.graph_module) is any(
        getattr(getattr(node.target, "_schema", None), "is_mutable", False)
        or getattr(node.target, "__name__", "").endswith("_") for node in graph.nodes)


@pytest.mark.parametrize("after", [after for after, _ in CASES] + [SetsAnItem()])
def test_scores_equal_a_plain_loop_whether_the_leaf_is_copied_or_not(after):
    torch.manual_seed(0)
    model = Tail(after).eval()
    x, y = torch.randn(12, 6), torch.arange(12) % 3
    expected_grad, expected_z = [], []
    for i in range(12):  # the tail on a copy of z, which it may change
        z = model.fc(x[i:i + 1]).detach()
        leaf = z.clone().requires_grad_(True)
        logit = model.head(model.after(leaf.clone()))[0, y[i]]
        expected_grad.append(torch.autograd.grad(logit, leaf)[0])
        expected_z.append(z)
    grad, z = torch.cat(expected_grad), torch.cat(expected_z)
    torch.testing.assert_close(at.neuron_scores(model, "fc", x, y, "gradient"), grad)
    torch.testing.assert_close(at.neuron_scores(model, "fc", x, y, "gradient_x_activation"),
                               grad * z)


class LogitsAreTheLayer(nn.Module):
    """The scored layer's output is the logits: its gradient for targets="all" is the
    one-hot rows themselves, a view that no product may be written into."""

    def __init__(self):
        super().__init__()
        self.body, self.out = nn.Linear(5, 3), nn.Identity()

    def forward(self, x):
        return self.out(self.body(x))


@pytest.mark.parametrize("targets", ["all", None, "ids"])
@pytest.mark.parametrize("method", ["gradient_x_activation", "taylor", "fisher"])
def test_products_written_into_the_gradient_equal_a_plain_product(method, targets):
    """z * grad is written into autograd's gradient where it owns its memory: the scores
    equal the plain product on every call (a write into a shared gradient, such as the
    cached one-hot rows of targets="all", would change the second call's)."""
    torch.manual_seed(0)
    model, x = LogitsAreTheLayer().eval(), torch.randn(7, 5)
    chosen = torch.tensor([0, 1, 2, 0, 1, 2, 0]) if targets == "ids" else targets
    first = at.neuron_scores(model, "out", x, chosen, method)
    second = at.neuron_scores(model, "out", x, chosen, method)
    z = model(x).detach()
    if method == "gradient_x_activation":  # dF_c/dz_j = [j == c]: z_j for the chosen class
        classes = z.argmax(1) if targets is None else chosen
        expected = z.unsqueeze(1) * torch.eye(3) if targets == "all" else \
            z * nn.functional.one_hot(classes, 3)
        torch.testing.assert_close(first, expected)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
