"""What every part of the `.pt2` check shares: the budgets of an archive's records, the
re-export recipe, and the words of a refusal."""
from __future__ import annotations

from ....errors import AttributionError
from ..limits import Limits, over_budget


EXPORT_RECIPE = (
    "    ep = torch.export.export(model.eval(), (example_batch,),\n"
    "                             dynamic_shapes=({0: torch.export.Dim('batch')},))\n"
    "    torch.export.save(ep, 'model.pt2')\n"
    "(example_batch: a few real samples, at least 2, shaped like the model's input.)"
)
MAX_PROGRAM_BYTES = 64 * 2 ** 20
"""Largest JSON record (the program, a payload config)."""
MAX_EXTRA_BYTES = 4 * 2 ** 20
"""Largest total of extra files (class names, metadata) and of the sample inputs' pickle."""
MAX_EXPRESSION_CHARS = 1_000_000
"""Most characters of shape expressions in a program: sympy parses each (2-6 us a character)
every time torch meets it; an exported transformer has tens of thousands."""
MAX_PROGRAM_VALUES = 500_000
"""Most JSON values in one record. torch turns each into a dataclass at about 80 us (a BERT
layer is about 6,000 values), so this bounds its parsing near 40 s and json's memory."""
MAX_SUBGRAPH_DEPTH = 16


def _within_budget(what: str, n_bytes: int, limits: Limits) -> None:
    if n_bytes > limits.max_decoded_bytes:
        raise AttributionError(over_budget(what, _size(n_bytes), _size(
            limits.max_decoded_bytes), "max_decoded_bytes"))


def _refuse(reason: str) -> AttributionError:
    return AttributionError(
        f"This .pt2 file was refused because {reason}; torch.export.save does not write this "
        "for an ordinary model, and loading it could run code or exhaust the machine. "
        f"Re-export the model with a plain torch.export on your own machine:\n{EXPORT_RECIPE}")


def _data_dependent(reason: str) -> AttributionError:
    return AttributionError(
        f"This .pt2 file was refused because {reason}: the sizes of its work depend on the "
        "data's values, not only on their shapes, so its cost cannot be measured before it "
        "runs on your data (a first run on one input can be cheap and the next one exhaust "
        "the machine). Export a model whose shapes follow its inputs' shapes (nonzero, "
        "masked_select, unique, boolean-mask indexing, .item() and branches on tensor values "
        "are what make them depend on values), or load your own file on your own machine "
        "without the jail (sandbox=False; --trust-code on the command line).")


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.1f} MB"
