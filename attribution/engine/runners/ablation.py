"""The ablation shortcut: where the tail starts with ops that act on each neuron alone (and
maybe an affine op after them), ablating K neurons runs those ops once, not K times."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from .base import LayerRunner, zeroed_variants


def per_neuron_prefix(runner: LayerRunner, z: torch.Tensor) -> tuple:
    """(chain, affine, rest): an `FxRunner`'s tail cut after its longest chain of ops from z
    that act on each neuron alone (chain: their nodes, maybe none), then, for z [B, n], the
    op after it when it is affine (its node, else None); rest runs what follows
    (`_tail_after`). () when there is neither. The chain is read from the graph (one op after
    another on z, reading only parameters), and each op is checked on `z` [<=2, n, ...]:
    zeroing any neuron before the chain must equal replacing that neuron after it by the
    chain's value at zero (`_acts_per_neuron`); the affine op likewise (`_is_affine`). The
    checks run on CHECK_ELEMENTS of copies at a time: their memory is bounded whatever the
    width (every neuron's copy at once is n^2 values: 2 GB on 16,384 neurons)."""
    graph = runner.tail_graph
    owner = runner.owner
    current = next(n for n in graph.nodes if n.op == "placeholder")
    chain: list[fx.Node] = []
    candidate = None  # the first op that does not act on each neuron alone
    with torch.no_grad():
        after = runner.from_neurons(z).contiguous()  # the chain's values so far, two ways
        zeroed = torch.zeros_like(after[:1])
        for node in graph.nodes:
            if node.op in ("get_attr", "placeholder"):
                continue
            if (node.op == "output" or len(current.users) != 1 or node not in current.users
                    or not node.args or node.args[0] is not current
                    or any(n is not current and n.op != "get_attr"
                           for n in node.all_input_nodes)):
                break
            try:
                values = [run_nodes(owner, (node,), value.clone()) for value in (after, zeroed)]
            except Exception:  # noqa: BLE001 - an op that cannot run alone ends the chain
                break
            candidate, candidate_values = node, values
            if any(not isinstance(new, torch.Tensor) or new.shape != old.shape
                   for new, old in zip(values, (after, zeroed))):
                break
            if not _acts_per_neuron(runner, (*chain, node), z, *values):
                break
            after, zeroed = values
            current = node
            chain.append(node)
            candidate = None  # it joined the chain
        affine = candidate if candidate is not None and _is_affine(
            runner, tuple(chain), candidate, z, after, zeroed, candidate_values[0]) else None
    if affine is None and not chain:
        return ()
    return tuple(chain), affine, _tail_after(runner, affine or chain[-1])


CHECK_ELEMENTS = 1 << 22
"""The values of the copies `per_neuron_prefix` checks at once (16 MB of float32)."""


def _blocks(n_neurons: int, per_copy: int) -> list[torch.Tensor]:
    """The neurons 0..n-1 in blocks whose copies of `per_copy` values each hold at most
    CHECK_ELEMENTS values (one neuron a block at the least)."""
    size = max(1, CHECK_ELEMENTS // max(per_copy, 1))
    return list(torch.arange(n_neurons).split(size))


def _copies(runner: LayerRunner, nodes: tuple, z: torch.Tensor,
            block: torch.Tensor) -> torch.Tensor:
    """`nodes` run on the copies of z [B, n, ...] with neuron block[k] zeroed in copy k."""
    zero = torch.zeros((), dtype=z.dtype)
    variants = runner.from_neurons(zeroed_variants(z, block.to(z.device), zero)).contiguous()
    return run_nodes(runner.owner, nodes, variants)


def _acts_per_neuron(runner: LayerRunner, nodes: tuple, z: torch.Tensor, after: torch.Tensor,
                     zeroed: torch.Tensor) -> bool:
    """Does zeroing any neuron of z [B, n, ...] before `nodes` equal replacing it after them
    by their value at zero (`zeroed` [1, ...]; `after`: their value on z)? Every neuron
    checked, a block of copies at a time."""
    after, zeroed = runner.to_neurons(after), runner.to_neurons(zeroed)
    try:
        for block in _blocks(z.shape[1], z.numel()):
            got = _copies(runner, nodes, z, block)
            if not isinstance(got, torch.Tensor):
                return False
            got = runner.to_neurons(got)
            expected = zeroed_variants(after, block.to(z.device), zeroed)
            if got.shape != expected.shape or not torch.allclose(
                    got, expected, rtol=1e-5, atol=1e-6, equal_nan=True):
                return False
    except Exception:  # noqa: BLE001 - an op that cannot run on the copies: not per neuron
        return False
    return True


def run_nodes(owner: nn.Module, nodes: tuple[fx.Node, ...], value: Any) -> Any:
    """`value` through `nodes`, one op after another (each reading the one before and
    parameters of `owner` only), with the current parameters; `value` if there are none."""
    for node in nodes:
        env = {n: _attribute(owner, n.target) for n in node.all_input_nodes
               if n.op == "get_attr"}
        env[node.args[0]] = value
        value = _run_node(owner, node, env)
    return value


def columns_of(owner: nn.Module, affine: fx.Node, zeroed: torch.Tensor) -> torch.Tensor:
    """[n, m]: how the affine op's output [B, m] moves per unit of each of its n inputs
    (f(e_j) - f(0)); `zeroed` [1, n] gives the dtype and device. The unit rows run a block
    at a time (`_blocks`): n^2 values at once would be 1 GB on 16,384 neurons."""
    n_neurons = zeroed.shape[1]
    at_zero = run_nodes(owner, (affine,), torch.zeros_like(zeroed))
    parts = []
    for block in _blocks(n_neurons, n_neurons):
        units = torch.zeros(len(block), n_neurons, dtype=zeroed.dtype, device=zeroed.device)
        units[torch.arange(len(block)), block.to(zeroed.device)] = 1
        parts.append(run_nodes(owner, (affine,), units) - at_zero)
    return torch.cat(parts)


def shifted(base: torch.Tensor, change: torch.Tensor, columns: torch.Tensor
             ) -> torch.Tensor:
    """[K*B, m]: base [B, m] moved by change[:, k] x columns[k] in copy k (change [B, K],
    columns [K, m]); variant-major, as `LayerRunner.tail`."""
    return (torch.bmm(change.T.unsqueeze(-1), columns.unsqueeze(1)) + base).flatten(0, 1)


def _is_affine(runner: LayerRunner, chain: tuple, node: fx.Node, z: torch.Tensor,
               after: torch.Tensor, zeroed: torch.Tensor, base: torch.Tensor) -> bool:
    """Is `node`, on the chain's values [B, n] (`after` of z, `zeroed` at zero), affine per
    neuron: f(copy k) = f(after) (`base`) + change x column k, where copy k has neuron k
    replaced by its `zeroed` value? Checked a block of copies at a time, to the tolerance of
    torch.allclose(rtol=1e-5, atol=1e-5 x (1 + the largest |f(copy)|)) over every copy."""
    if after.dim() != 2 or not isinstance(base, torch.Tensor) or base.dim() != 2:
        return False
    try:
        change = zeroed[0][None] - after  # [B, n]
        columns = columns_of(runner.owner, node, zeroed)
        excess, largest = -float("inf"), 0.0  # max of |predicted - expected| - rtol |expected|
        for block in _blocks(z.shape[1], z.numel()):
            expected = _copies(runner, (*chain, node), z, block)
            predicted = shifted(base, change[:, block], columns[block])
            if predicted.shape != expected.shape:
                return False
            gap = float(((predicted - expected).abs() - 1e-5 * expected.abs()).max())
            if gap != gap:  # NaN: never close, as torch.allclose
                return False
            excess, largest = max(excess, gap), max(largest, float(expected.abs().max()))
        return excess <= 1e-5 * (1 + largest)
    except Exception:  # noqa: BLE001 - an op that cannot run on these values is not affine
        return False


def _attribute(owner: nn.Module, target: str) -> Any:
    value: Any = owner
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _run_node(owner: nn.Module, node: fx.Node, env: dict) -> Any:
    """The value of one call node of a graph of `owner`, its inputs taken from `env`."""
    args = fx.map_arg(node.args, env.__getitem__)
    kwargs = fx.map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_module":
        return owner.get_submodule(node.target)(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _tail_after(runner: LayerRunner, last: fx.Node) -> Callable[..., Any]:
    """(value of `last`, live state...) -> output: the runner's tail after node `last` of a
    chain of ops from z (each the only user of the one before)."""
    nodes = list(runner.tail_graph.nodes)
    cut = nodes.index(last) + 1
    placeholders = [n for n in nodes if n.op == "placeholder"]
    needed = {n for node in nodes[cut:] for n in node.all_input_nodes}
    if any(node in needed for node in nodes[:cut - 1]
           if node.op not in ("placeholder", "get_attr")):
        raise ValueError("the rest of the tail reads the chain's inner values")
    back = fx.Graph()
    env = {last: back.placeholder("after")}
    env.update({node: back.placeholder(f"live_{i}") for i, node in enumerate(placeholders)
                if i > 0})
    shared = [n for n in nodes[:cut] if n.op == "get_attr" and n in needed]  # fx reads a
    for node in shared + nodes[cut:]:  # parameter once, where the chain first uses it
        if node.op == "output":
            back.output(fx.map_arg(node.args[0], lambda arg: env[arg]))
        elif node not in env:
            env[node] = back.node_copy(node, lambda arg: env[arg])
    if len(back.nodes) == len(placeholders) + 1:  # placeholders and the output: no op
        output = next(iter(reversed(back.nodes))).args[0]
        inputs = [n for n in back.nodes if n.op == "placeholder"]
        return lambda *values: fx.map_arg(output, dict(zip(inputs, values)).__getitem__)
    return fx.GraphModule(runner.owner, back).forward
