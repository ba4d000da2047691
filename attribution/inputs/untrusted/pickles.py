"""Pickles (torch.save files): the one place where this package unpickles bytes.

Threats: unpickling runs code named in the file (`torch.save(model)` pickles a class to
import and call); PyTorch's safe unpickler reads about 1-3 s per MB of pickle, so a small
file of many tiny tensors or long lists takes minutes; a pickle of shared references (pickle
laughs) or of a list that contains itself expands without bound when converted.

Policy (`unpickle`): without `trust_code`, only PyTorch's weights-only unpickler
(`torch.load(weights_only=True, map_location="cpu")`) runs, after the pickle's size is
checked against `Limits.max_pickle_bytes` (`check_pickle_size`); a file naming any other
Python object is refused with `WEIGHTS_ONLY`, one text for every caller. `trust_code=True`
(your own file, on your own machine; never an upload) unpickles anything. `pickled_size`
counts an unpickled value's values and bytes, shared references as often as reached,
before it is converted.
"""
from __future__ import annotations

import io
import pickle
import re
from typing import Any, Optional

import torch

from ...errors import AttributionError, reading
from .files import sniff, zip_directory
from .limits import MB, Limits, held_bytes, over_budget
from .tensors import check_tensor

WEIGHTS_ONLY = ("Unpickling Python objects can run arbitrary code, so only tensors, numbers, "
                "strings and lists, tuples and dicts of them are read here (PyTorch's "
                "weights-only unpickler).")
"""The policy, in the words of every refusal of a pickled object."""


def unpickle(data: bytes, limits: Limits, *, what: str, remedy: str = "",
             trust_code: bool = False) -> Any:
    """The value of a torch.save file's bytes, tensors on the CPU.

    Args:
        data: the file.
        limits: `max_pickle_bytes` bounds the pickle (unless `trust_code`).
        what: the file in messages, e.g. "This checkpoint".
        remedy: what to save instead, appended to a refusal of pickled objects.
        trust_code: unpickle anything (runs code the file names): your own files only.
    Raises:
        AttributionError: the pickle is over budget, damaged, or (without `trust_code`)
        names a Python object other than tensors and plain containers.
    """
    if trust_code:
        with reading(f"{what} could not be unpickled with trust_code=True (it is damaged, or "
                     "a class it needs is not importable here)"):
            return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
    check_pickle_size(data, limits)
    with reading(f"{what} is damaged or not a PyTorch file"):
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as error:
            raise _refusal(str(error), what, remedy) from None


def _refusal(text: str, what: str, remedy: str) -> AttributionError:
    """The refusal of a weights-only load that failed with `text`: the policy when the file
    names Python objects, else the file is damaged."""
    if "Unsupported global" in text or "GLOBAL" in text:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", text)))
        return AttributionError(f"{what} contains pickled Python objects"
                                + (f" ({', '.join(found)})" if found else "")
                                + f". {WEIGHTS_ONLY}" + (f" {remedy}" if remedy else ""))
    detail = text.split("WeightsUnpickler error:", 1)[-1].strip() or text.strip()
    return AttributionError(f"{what} is damaged or not a PyTorch file "
                            f"({detail.splitlines()[0][:200] if detail else 'no detail'}).")


def check_pickle_size(data: bytes, limits: Limits) -> None:
    """Refuse a torch.save file whose pickle (data.pkl, or the whole file in the legacy
    format) is over `limits.max_pickle_bytes`, before the slow unpickler reads it."""
    size = len(data)
    if sniff(data) == "zip":
        with reading("The .pt file is damaged"):
            size = max((entry.file_size for entry in zip_directory(data, limits).infolist()
                        if entry.filename.endswith("/data.pkl")), default=0)
    if size > limits.max_pickle_bytes:
        raise AttributionError(over_budget(
            "The .pt file's pickle is", f"{size / MB:,.1f} MB",
            f"{limits.max_pickle_bytes / MB:,.1f} MB", "max_pickle_bytes")
            + " Such a pickle holds many small tensors or long Python lists: save a few "
            "large tensors instead, e.g. torch.save({'inputs': torch.tensor(x)}, path).")


_CONTAINERS = (dict, list, tuple, set, frozenset)


def pickled_size(value: Any, limits: Limits, what: str = "This .pt file") -> tuple[int, int]:
    """(values, decoded bytes) of an unpickled value, within `limits`.

    A shared reference counts as often as it is reached (as `np.asarray` would copy it),
    with each container's cost computed once, so the walk is linear in the pickle's size.
    Tensors are checked with `check_tensor` and count numel x itemsize bytes.
    """
    costs: dict[int, tuple[int, int]] = {}  # id of a container -> (values, bytes)
    open_ids: set[int] = set()

    def children_of(item: Any) -> Optional[list]:
        if isinstance(item, dict):
            return [*item.keys(), *item.values()]
        return list(item) if isinstance(item, _CONTAINERS) else None

    def leaf_cost(item: Any) -> tuple[int, int]:
        if isinstance(item, torch.Tensor):
            check_tensor(item, f"A tensor in {what[0].lower() + what[1:]}")
            return 1, held_bytes(item.numel(), item.element_size())
        return 1, 4 * len(item) if isinstance(item, (str, bytes)) else 8

    def within_limits(cost: tuple[int, int]) -> tuple[int, int]:
        values, size = cost
        if values > limits.max_pickle_nodes:
            raise AttributionError(over_budget(
                f"{what} expands (counting shared references) to", f"{values:,} values",
                f"{limits.max_pickle_nodes:,}", "max_pickle_nodes")
                + " Save the data as tensors rather than nested lists.")
        if size > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                f"{what} decodes to", f"{size / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        return cost

    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        children = children_of(item)
        if children is None:  # only the root can be a leaf here: a bare tensor, say
            costs[key] = within_limits(leaf_cost(item))
        elif children_done:
            open_ids.discard(key)
            values, size = 1, 0
            for child in children:
                child_values, child_size = (costs[id(child)] if isinstance(child, _CONTAINERS)
                                            else leaf_cost(child))
                values, size = values + child_values, size + child_size
            costs[key] = within_limits((values, size))
        elif key in open_ids:
            raise AttributionError(f"{what} holds a list or dict that contains itself; save "
                                   "plain tensors, lists or dicts.")
        elif key not in costs:
            open_ids.add(key)
            stack.append((item, True))
            pending = {id(child): child for child in children
                       if isinstance(child, _CONTAINERS) and id(child) not in costs}
            for child in pending.values():
                if id(child) in open_ids:
                    raise AttributionError(f"{what} holds a list or dict that contains "
                                           "itself; save plain tensors, lists or dicts.")
                stack.append((child, False))
    return costs[id(value)]
