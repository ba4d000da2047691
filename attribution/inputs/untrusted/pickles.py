"""Pickles (torch.save files): the one place where this package unpickles a model's bytes.

Threats: unpickling runs code named in the file (`torch.save(model)` pickles a class to
import and call); PyTorch's safe unpickler reads about 1-3 s per MB of pickle, so a small
file of many tiny tensors or long lists takes minutes; a pickle of shared references (pickle
laughs) or of a list that contains itself expands without bound when converted.

`torch_load` reads a checkpoint with PyTorch's weights-only unpickler after its pickle's size
is checked against `Limits.max_pickle_bytes` (`check_pickle_size`), and unpickles anything
only with `trust_code` (your own file, on your own machine; never an upload). `pickled_size`
counts an unpickled value's values and bytes, shared references as often as reached, before
it is converted.
"""
from __future__ import annotations

import io
import pickle
import re
import zipfile
from typing import Any, Optional

import torch

from ...errors import AttributionError, reading
from .export_guard import EXPORT_RECIPE
from .files import sniff
from .limits import MB, Limits, over_budget
from .tensors import check_tensor


def check_pickle_size(data: bytes, limits: Limits) -> None:
    """Refuse a torch.save file whose pickle (data.pkl, or the whole file in the legacy
    format) is over `limits.max_pickle_bytes`, before the slow unpickler reads it."""
    size = len(data)
    if sniff(data) == "zip":
        with reading("The .pt file is damaged"):
            size = max((entry.file_size for entry in zipfile.ZipFile(io.BytesIO(data)).infolist()
                        if entry.filename.endswith("/data.pkl")), default=0)
    if size > limits.max_pickle_bytes:
        raise AttributionError(over_budget(
            "The .pt file's pickle is", f"{size / MB:,.1f} MB",
            f"{limits.max_pickle_bytes / MB:,.1f} MB", "max_pickle_bytes")
            + " Such a pickle holds many small tensors or long Python lists: save a few "
            "large tensors instead, e.g. torch.save({'inputs': torch.tensor(x)}, path).")


def torch_load(data: bytes, trust_code: bool, limits: Limits) -> Any:
    """Unpickle a torch.save file: weights only, or anything when `trust_code`."""
    if not trust_code:
        check_pickle_size(data, limits)
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(error))))
        if "Unsupported global" not in str(error) and "GLOBAL" not in str(error):
            raise AttributionError(f"The checkpoint is damaged or not a PyTorch file "
                                   f"({str(error).splitlines()[0][:200]}).") from None
        if not trust_code:
            raise AttributionError(
                "This checkpoint contains pickled Python objects"
                + (f" ({', '.join(found)})" if found else "")
                + ", e.g. a whole model saved with torch.save(model). Unpickling it can run "
                "arbitrary code, so it is refused here. Either save only the weights "
                "(torch.save(model.state_dict(), 'weights.pt')) and describe the architecture, "
                f"or export the model, which needs no code to load:\n{EXPORT_RECIPE}\n"
                "On your own machine, for a file you made yourself, trust_code=True loads it."
            ) from None
    except Exception as error:
        raise AttributionError(f"The checkpoint could not be read; it is damaged or not a "
                               f"PyTorch file ({type(error).__name__}: "
                               f"{str(error).strip()[:200]}).") from None
    with reading("The checkpoint could not be unpickled even with trust_code=True "
                  "(a class it needs may not be importable here)"):
        return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


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
            return 1, item.numel() * item.element_size()
        return 1, 4 * len(item) if isinstance(item, (str, bytes)) else 8

    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        key = id(item)
        children = children_of(item)
        if children is None:
            costs[key] = leaf_cost(item)  # only the root can be a leaf here
        elif children_done:
            open_ids.discard(key)
            values, size = 1, 0
            for child in children:
                child_values, child_size = (costs[id(child)] if isinstance(child, _CONTAINERS)
                                            else leaf_cost(child))
                values, size = values + child_values, size + child_size
            costs[key] = values, size
            if values > limits.max_pickle_nodes:
                raise AttributionError(over_budget(
                    f"{what} expands (counting shared references) to", f"{values:,} values",
                    f"{limits.max_pickle_nodes:,}", "max_pickle_nodes")
                    + " Save the data as tensors rather than nested lists.")
            if size > limits.max_decoded_bytes:
                raise AttributionError(over_budget(
                    f"{what} decodes to", f"{size / MB:,.0f} MB",
                    f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
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
