"""The `.pt2` boundary: an uploaded torch.export archive is checked here before torch reads it.

`check_export_archive` runs the parts in order: `archive` (the zip layout, versions, tensor
records, sample inputs), then `program` (the graph, its nodes and subgraphs, signature,
metadata, guards and declared costs), whose nodes `operators` checks; `schema` types the
program's JSON and `common` holds the budgets and the words of a refusal.

Threat model. Whoever uploads a `.pt2` controls every byte of it: the zip layout, the program
(`models/model.json`), the payload configs, the tensor records, the pickled sample inputs and the
extra files. `torch.export.load` is not safe on such bytes (its docstring says so). Reading torch
2.13's loader (`torch/export/pt2_archive/_package.py`, `torch/_export/serde/serialize.py`), it
- resolves names by `getattr` from `torch`, `math` and `operator`: node targets, `as_operator`
  argument values and `source_fn_stack` metadata; whatever callable it finds becomes a call in
  the graph (a sympy Function class reached through `torch.utils._sympy` as the callable of
  `wrap_with_set_grad_enabled` evals an `as_string` argument when the model runs);
- parses every symbolic shape (`expr_str`) with `sympy.sympify`, which calls `eval`;
- unpickles: payloads marked `use_pickle` (`torch.load(weights_only=False)`), custom objects
  (`torch._C._pickle_load_obj`), opaque objects (`pickle.loads`), sample inputs whenever the
  `weights_only=True` load fails, and the legacy layout it falls back to on any RuntimeError;
- imports modules named in treespec contexts (`"__enum__"`, defaultdict factories), keeps
  `guards_code` (Python that `ExportedProgram.module()` execs), regenerates Python source from
  node names and metadata, and runs `cond`/`map_impl`/`scan`/`while_loop` on callables;
- allocates what the archive declares: an empty weight record becomes `torch.zeros` of its
  declared shape, a deflated record its declared size, and a range-constraint key `u<n>` makes
  it count to n.

What passes (deny by default; anything else is an `AttributionError` with the re-export
recipe, before torch reads a byte):
- the entries `torch.export.save` writes, listed alike by torch's zip reader and Python's (so
  the legacy fallback finds nothing), unpacking within `limits.max_decoded_bytes`;
- tensor records exactly as long as their tensors' declared dtype x shape x strides span, all
  tensors within `limits.max_decoded_bytes`; strided layout, known dtypes and devices; no
  tensor the graph declares (at the example's sizes) over that budget either;
- sample inputs: a torch.save zip whose pickle (under 4 MB) names only tensor rebuilders and
  which holds plain CPU tensors ((args...), {name: tensor}); extra files under 4 MB;
- every JSON record (under 64 MB and 500,000 values) validated field by field against the
  schema of an ordinary export, unknown fields and kinds refused;
- node targets: ATen/prims operators (looked up in the registry first), integer arithmetic on
  sizes (no powers or shifts), and the higher-order ops `wrap_with_set_grad_enabled`,
  `wrap_with_autocast`, `cond`, `map_impl`, `scan` (bounded by their inputs) whose callables
  are subgraphs of the same archive; `while_loop` is refused (nothing bounds it);
- only work whose sizes follow the input shapes, so that the first run, at the batch size
  used, measures what every later batch costs: operators whose output's size or value is
  read from the data (tagged `dynamic_output_shape` or `data_dependent_output`: nonzero,
  masked_select, unique, .item(), indexing by a boolean mask), sizes torch reads from the
  data (symbols u<n>, zuf<n>) and a `cond` on a tensor's value are refused;
- operator arguments of the kinds their schema declares (tensors, numbers, symbolic numbers,
  dtypes, layouts, devices, memory formats, their lists); strings only for the schema's
  string arguments with known values (`reduce`, `approximate`, `rounding_mode`, `padding`,
  an einsum equation, ...); `as_operator` and custom (script) objects nowhere;
- shape expressions of sympy constructors, symbol names and arithmetic, a million characters
  at most (sympy parses each one every time torch meets it); range-constraint
  symbols with at most 6 digits; guards that compare input sizes (`L['x'].size()[0] == 2`);
- treespecs of builtin containers or transformers outputs with plain-JSON contexts; metadata
  as text: no carriage returns (stack traces may hold line feeds), module paths as dotted
  names, `source_fn_stack` resolving through already-loaded modules only, `from_node` and
  `custom` as plain JSON; verifiers ATEN or TRAINING.
"""
from __future__ import annotations

import io

import torch

from ....errors import reading
from ..limits import DEFAULT_LIMITS, Limits
from .archive import (_PAYLOADS, _SAMPLE_INPUTS, _SMALL_ENTRIES, _check_layout, _check_payloads,
                      _check_sample_inputs, _check_versions, _json_record)
from .common import (EXPORT_RECIPE, MAX_EXTRA_BYTES, MAX_PROGRAM_VALUES, _refuse, _size,
                     _within_budget)
from .program import _check_costs, _check_program

__all__ = ["EXPORT_RECIPE", "MAX_PROGRAM_VALUES", "check_export_archive"]


def check_export_archive(data: bytes, limits: Limits = DEFAULT_LIMITS) -> dict[str, bytes]:
    """Refuse a `.pt2` that could run code or exceed the budgets (see the module docstring).

    Args:
        data: the whole archive.
        limits: `max_decoded_bytes` bounds its tensors and its unpacked size.
    Returns:
        The extra files, name (without "extra/") -> bytes, read as torch reads them.
    """
    with reading("The .pt2 archive is damaged or truncated",
                 f"save it again with torch.export.save:\n{EXPORT_RECIPE}"):
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        records = list(reader.get_all_records())
        _check_layout(data, records, limits)
        sizes = {name: reader.get_record_size(name) for name in records}
        _within_budget("This .pt2 unpacks to", sum(sizes.values()), limits)
        for name in _SMALL_ENTRIES:
            if sizes.get(name, 0) > 64:
                raise _refuse(f"its entry {name} is {sizes[name]} bytes long")
        _check_versions(reader, records)
        weight_bytes = sum(_check_payloads(reader, sizes, *payload) for payload in _PAYLOADS)
        if sizes.get(_SAMPLE_INPUTS):
            _check_sample_inputs(reader.get_record(_SAMPLE_INPUTS), weight_bytes, limits)
        extras = {name: size for name, size in sizes.items() if name.startswith("extra/")}
        if sum(extras.values()) > MAX_EXTRA_BYTES:
            raise _refuse(f"its extra files take {_size(sum(extras.values()))}")
        program = _json_record(reader, sizes, "models/model.json")
        _check_program(program)
        _check_costs(program, limits)
        return {name[len("extra/"):]: reader.get_record(name) for name in extras}
