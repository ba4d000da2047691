"""`FxRunner`: splits the model's fx graph at the layer, so the tail is all that re-runs;
values that the tail reads from the front (residual inputs, branches) are carried in `state`."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from ..guards import engine_modes, leaf_like
from ..layers import run_model
from ..model_io import call, logits_of, n_rows, output_key
from .ablation import columns_of, per_neuron_prefix, run_nodes, shifted
from .base import LayerRunner, repeat_batch, runs_own_hooks, zeroed_variants
from .fx_graph import batch_sizes, graph_of, input_signature, may_write_in_place, parts_of


class FxRunner(LayerRunner):
    """Splits the model's fx graph at the layer; the tail re-runs alone on stacked variants."""

    def __init__(self, model: nn.Module, name: str, module: nn.Module, example: Any = None):
        super().__init__(model, name, module)
        if runs_own_hooks(model):
            raise ValueError("the model's own forward hooks would be skipped")
        graph, owner, layer_node = graph_of(model, name, example)
        # an export specializes on the per-sample shapes it saw; fx and .pt2 graphs do not
        self._signature = input_signature(example) if owner is not model else None
        nodes = list(graph.nodes)
        layer_nodes = [layer_node]
        cut = nodes.index(layer_node) + 1
        front, tail = nodes[:cut], nodes[cut:]
        tail_set = set(tail)
        from_input: set[fx.Node] = set()  # parameters and buffers are not per-sample values
        for node in front:
            if node.op == "placeholder" or any(arg in from_input
                                               for arg in node.all_input_nodes):
                from_input.add(node)
        sizes = batch_sizes(front[:-1], from_input)
        live = [layer_nodes[0]] + [
            n for n in front[:-1] if n not in sizes and any(user in tail_set for user in n.users)
        ]
        self._per_sample = tuple(node in from_input for node in live[1:])

        front_graph, env = fx.Graph(), {}
        for node in front:
            env[node] = front_graph.node_copy(node, lambda arg: env[arg])
        front_graph.output(tuple(env[n] for n in live))

        tail_graph = fx.Graph()
        env = {node: tail_graph.placeholder(f"live_{i}") for i, node in enumerate(live)}
        for node in sizes:
            env[node] = (tail_graph.call_function(node.target, (env[live[0]], 0))
                         if node.target is torch.ops.aten.sym_size.int
                         else tail_graph.node_copy(node, lambda arg: env[arg]))
        for node in tail:
            if node.op == "output":
                tail_graph.output(fx.map_arg(node.args[0], lambda arg: env[arg]))
            else:
                env[node] = tail_graph.node_copy(node, lambda arg: env[arg])
        self.front = fx.GraphModule(owner, front_graph)
        self.back = fx.GraphModule(owner, tail_graph)
        # the owner of the graphs' targets: held weakly when it is the model itself
        self._export = owner if owner is not model else None
        self.tail_graph, self._prefix = tail_graph, None
        # a gradient's leaf z is copied before the tail only where the tail may write into
        # it (a copy per batch is a visible share of a small model's gradient); a missed
        # in-place op on
        # the leaf is autograd's error, never a silent change of z
        self._tail_writes_in_place = may_write_in_place(tail_graph, owner)
        self._constants: Optional[tuple] = None  # see `_shortcut_constants`
        self._output_key = output_key(model)  # read again by `renew`, not per batch
        calls = getattr(owner, "module_call_graph", None)  # torch.export: flat outputs
        self._out_spec = calls[0].signature.out_spec if calls else None
        self._read = [node.target for node in graph.nodes if node.op == "get_attr"]
        self._parts = parts_of(model, self._read)  # the split graphs hold these objects

    def is_current(self, module: nn.Module) -> bool:
        """Also False once a submodule, parameter, buffer or tensor attribute has been
        replaced by another object (e.g. `model.head = nn.Linear(...)`), or once calling the
        model runs hooks the split would skip (`runs_own_hooks`)."""
        parts = parts_of(self.model, self._read)
        return (super().is_current(module) and not runs_own_hooks(self.model)
                and len(parts) == len(self._parts)
                and all(name == old_name and value is old_value for (name, value), (
                    old_name, old_value) in zip(parts, self._parts)))

    def accepts(self, x):
        """False for inputs of other per-sample shapes than an export of the model saw, and
        for a single row: an export's dynamic batch starts at 2, and a size the data
        decides (BART's <eos> tokens, one per row) keeps that bound as a runtime check."""
        return self._signature is None or (self._signature == input_signature(x)
                                           and n_rows(x) >= 2)

    def _front(self, x):
        try:
            return call(self.front.forward, x)  # not __call__: fx prints failures to stderr
        except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:
            run_model(self.model, x)  # re-raise the model's own message as AttributionError
            raise error

    def capture(self, x):
        with torch.no_grad():
            output, *saved = self._front(x)
            z = self.to_neurons(output)
            state = (saved, x.shape[0])
            logits = self.tail(z.clone(), state, 1)  # an in-place op after the layer keeps z
        return z, state, logits

    def tail(self, z, state, repeats):
        saved, batch = state
        saved = [repeat_batch(value, batch, repeats) if per_sample else value
                 for value, per_sample in zip(saved, self._per_sample)]
        if z.requires_grad:
            self.check_differentiable_once()
            if z.is_leaf and self._tail_writes_in_place:
                z = z.clone()  # in-place ops after the layer must not touch the leaf
        z = self.from_neurons(z)  # exported graphs view it: keep the model's own layout
        return self._logits(self.back.forward(z if z.is_contiguous() else z.contiguous(),
                                              *saved))

    def renew(self) -> None:
        super().renew()
        self._constants = None
        self._output_key = output_key(self.model)

    @property
    def owner(self) -> nn.Module:
        """The module whose submodules and attributes the graphs' nodes name."""
        return self._export if self._export is not None else self.model

    def ablate(self, z, state, neurons):
        """As `LayerRunner.ablate`; where the tail starts with ops that act on each neuron
        alone (BatchNorm, activations), they run once on z and once on a zeroed z, and only
        the rest of the tail runs on the K variants; where an affine op follows them (z
        [B, n]), its output moves by one column per ablated neuron, so the variants start
        after it."""
        if self._prefix is None:
            self._prefix = per_neuron_prefix(self, z[:2])
        if not self._prefix:
            return super().ablate(z, state, neurons)
        chain, affine, rest = self._prefix
        owner = self.owner
        moved = self.from_neurons(z).clone()  # an in-place op in the chain must keep z
        after = run_nodes(owner, chain, moved)
        zeroed, columns = self._shortcut_constants(moved)
        if affine is None:
            variants = self.from_neurons(zeroed_variants(
                self.to_neurons(after), neurons, self.to_neurons(zeroed)))
        else:  # z [B, n]: the affine op's output moves by (new - old value) x its column
            change = (zeroed[0].index_select(0, neurons)[None]
                      - after.index_select(1, neurons))  # [B, K]
            variants = shifted(run_nodes(owner, (affine,), after), change,
                                columns.index_select(0, neurons))
        saved, batch = state
        saved = [repeat_batch(value, batch, len(neurons)) if per_sample else value
                 for value, per_sample in zip(saved, self._per_sample)]
        return self._logits(rest(variants.contiguous(), *saved))

    def _shortcut_constants(self, moved: torch.Tensor
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(the chain's value at zero [1, ...], the affine op's `columns_of` [n, m] or None)
        for z like `moved`, computed once per computation (until `renew`)."""
        key = (moved.shape[1:], moved.dtype, moved.device)
        constants = self._constants
        if constants is None or constants[0] != key:
            chain, affine, _ = self._prefix
            zeroed = run_nodes(self.owner, chain, torch.zeros_like(moved[:1]))
            columns = None if affine is None else columns_of(self.owner, affine, zeroed)
            self._constants = constants = (key, zeroed, columns)
        return constants[1], constants[2]

    def _logits(self, output):
        if self._out_spec is not None:  # the model's own structure (a ModelOutput, a dict)
            output = pytree.tree_unflatten(
                list(output) if isinstance(output, (tuple, list)) else [output], self._out_spec)
        return logits_of(output, self._output_key)

    def forward_with_leaf(self, x):
        with engine_modes():
            with torch.no_grad():
                output, *saved = self._front(x)
            leaf = _leaf(self.to_neurons(output), saved)
            logits = self.tail(leaf, (saved, x.shape[0]), 1)
        return leaf, logits


def _leaf(z: torch.Tensor, saved: list) -> torch.Tensor:
    """The front's output z as an autograd leaf. `tail` copies a leaf before the tail's ops
    run, so z itself can be the leaf (a copy is a visible share of a wide layer's gradient)
    unless a
    value the tail reads from the front shares its memory (an in-place layer's input kept
    for a residual): then the leaf is a copy, which no tail op can reach."""
    if saved:
        memory = z.untyped_storage().data_ptr()
        if any(isinstance(value, torch.Tensor)
               and value.untyped_storage().data_ptr() == memory for value in saved):
            return leaf_like(z)
    return z.detach().requires_grad_(True)
