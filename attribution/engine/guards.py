"""Temporary changes to a shared model that never outlive a call.

A Streamlit server shares one cached model between sessions (threads), so every change
made here is either thread-bound (hooks) or reference-counted (eval mode).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ..errors import AttributionError

_MODE_LOCK = threading.Lock()
_MODE_USERS: dict[int, tuple[int, "ModelState"]] = {}


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put `model` in eval mode; when the last user leaves, leave it exactly as found: every
    submodule's own mode, its attributes (`ModelState`) and its buffers' values restored.

    Concurrent users of the same model share one eval period, so no thread sees another's
    restore of train mode (or of an attribute a run changed) in the middle of its
    computation. A model that changed one of its parameters in place cannot be put back
    (its values were not copied): that is an AttributionError naming it.
    """
    key = id(model)
    with _MODE_LOCK:
        count, saved = _MODE_USERS.get(key, (0, None))
        if count == 0:
            saved = ModelState(model)
            model.eval()
        _MODE_USERS[key] = (count + 1, saved)
    failed = True
    try:
        yield model
        failed = False
    finally:
        with _MODE_LOCK:
            count, saved = _MODE_USERS[key]
            if count == 1:
                del _MODE_USERS[key]
                changed = saved.restore()
                if changed and not failed:
                    raise AttributionError(
                        f"The model changed its own parameter {changed[0]} when it ran, so "
                        "it cannot be left as it was found: run it without that in-place "
                        "update (e.g. a weight normalised in forward) and try again.")
            else:
                _MODE_USERS[key] = (count - 1, saved)


_TORCH_ATTRIBUTES = frozenset(nn.Module().__dict__) - {"training"}
"""What every module's __dict__ holds for torch (hooks, parameter and buffer tables): the
engine's own hooks come and go there by thread, so they are never put back wholesale."""
_TABLES = ("_parameters", "_buffers", "_modules")
_COPIED_ELEMENTS = 1 << 22  # a buffer or tensor attribute up to this size is copied


class ModelState:
    """What a run may change in a model, kept to be put back: per module its mode, its own
    attributes (containers shallow-copied), its parameter, buffer and child tables, and a
    copy of every buffer and tensor attribute (up to `_COPIED_ELEMENTS` each; a larger one
    and every parameter is only watched through its version counter)."""

    def __init__(self, model: nn.Module):
        self.modules = []
        self.tensors: dict[int, tuple[torch.Tensor, int, Optional[torch.Tensor], str]] = {}
        for name, module in model.named_modules():
            own = {key: value for key, value in module.__dict__.items()
                   if key not in _TORCH_ATTRIBUTES}
            tables = {table: dict(module.__dict__.get(table, {})) for table in _TABLES}
            contents = {key: _shallow(value) for key, value in own.items()
                        if isinstance(value, (list, dict, set))}
            self.modules.append((module, own, contents, tables))
            for kind, items in (("parameter", module._parameters.items()),
                                ("buffer", module._buffers.items()),
                                ("attribute", ((key, value) for key, value in own.items()
                                               if isinstance(value, torch.Tensor)))):
                for entry, tensor in items:
                    self._watch(tensor, f"{name}.{entry}" if name else entry,
                                copied=kind != "parameter")

    def _watch(self, tensor: Optional[torch.Tensor], name: str, copied: bool) -> None:
        if tensor is None or id(tensor) in self.tensors or tensor.is_inference():
            return  # an inference tensor cannot change outside inference mode
        copy = None
        if copied and tensor.numel() <= _COPIED_ELEMENTS:
            with torch.no_grad():
                copy = tensor.detach().clone()
        self.tensors[id(tensor)] = (tensor, tensor._version, copy, name)

    def restore(self) -> list[str]:
        """Put every module back as kept; returns the names of the tensors that changed in
        place and could not be put back (parameters, large buffers)."""
        for module, own, contents, tables in self.modules:
            state = module.__dict__
            for key in [key for key in state if key not in _TORCH_ATTRIBUTES and key not in own]:
                del state[key]
            for key, value in own.items():
                if state.get(key) is not value:
                    state[key] = value
                if key in contents and not _same_contents(value, contents[key]):
                    _refill(value, contents[key])
            for table, entries in tables.items():
                current = state.get(table)
                if current is not None and (current.keys() != entries.keys() or any(
                        current[entry] is not value for entry, value in entries.items())):
                    current.clear()
                    current.update(entries)
        lost = []
        for tensor, version, copy, name in self.tensors.values():
            if tensor._version == version:
                continue
            if copy is None:
                lost.append(name)
                continue
            with torch.no_grad():
                tensor.copy_(copy)
        return lost


def _shallow(value):
    return list(value) if isinstance(value, list) else dict(value) if isinstance(
        value, dict) else set(value)


def _same_contents(value, kept) -> bool:
    if isinstance(value, dict):
        return value.keys() == kept.keys() and all(value[key] is kept[key] for key in kept)
    if isinstance(value, set):
        return value == kept
    return len(value) == len(kept) and all(a is b for a, b in zip(value, kept))


def _refill(value, kept) -> None:
    """Give the container `value` the contents `kept` again, in place."""
    if isinstance(value, list):
        value[:] = kept
    else:
        value.clear()
        value.update(kept)


ForwardHook = Callable[[nn.Module, tuple, object], object]
ForwardPreHook = Callable[[nn.Module, tuple], object]


@contextlib.contextmanager
def forward_hooks(hooks: dict[nn.Module, ForwardHook],
                  pre_hooks: Optional[dict[nn.Module, ForwardPreHook]] = None
                  ) -> Iterator[None]:
    """Register forward hooks (and forward pre-hooks: module, args -> args or None) that act
    only for the calling thread; remove them in `finally`.

    Another thread running the same module meanwhile sees its ordinary output.
    """
    owner = threading.get_ident()

    def bind(hook):
        def thread_bound(module, *arguments):
            if threading.get_ident() != owner:
                return None
            return hook(module, *arguments)
        return thread_bound

    handles = []
    try:
        for module, pre_hook in (pre_hooks or {}).items():
            handles.append(module.register_forward_pre_hook(bind(pre_hook)))
        for module, hook in hooks.items():
            handles.append(module.register_forward_hook(bind(hook)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def leaf_like(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy of `tensor` that requires grad (an autograd leaf)."""
    return tensor.detach().clone().requires_grad_(True)


class engine_modes(contextlib.AbstractContextManager):
    """The engine's own modes for the calling thread, whatever the caller's: autograd on
    (under `torch.no_grad()`, `set_grad_enabled(False)`, `inference_mode()`), inference mode
    and autocast off (an autocast context would compute in lower precision). The caller's
    modes are back on exit; tensors made inside are ordinary (not inference) ones. Nested
    inside itself (the engine's modes already on) it changes nothing and costs next to
    nothing: a class, not a generator, as it is entered twice per batch."""

    def __enter__(self) -> None:
        autocast_on = [device_type for device_type in ("cpu", "cuda")
                       if torch.is_autocast_enabled(device_type)]
        self._stack = None
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled() \
                and not autocast_on:
            return
        self._stack = stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for device_type in autocast_on:
            stack.enter_context(torch.autocast(device_type, enabled=False))

    def __exit__(self, *exception) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exception)


def autograd_input(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` detached, or an ordinary copy of it when it was made under
    `torch.inference_mode()` (such a tensor cannot be saved for a backward pass)."""
    if not tensor.is_inference() and not torch.is_inference_mode_enabled():
        return tensor.detach()
    with torch.inference_mode(False):
        return tensor.clone() if tensor.is_inference() else tensor.detach()
