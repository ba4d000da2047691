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

_MODE_LOCK = threading.Lock()
_MODE_USERS: dict[int, tuple[int, list[tuple[nn.Module, bool]]]] = {}


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put `model` in eval mode; restore every submodule's own mode when the last user leaves.

    Concurrent users of the same model share one eval period, so no thread sees another's
    restore of train mode in the middle of its computation.
    """
    key = id(model)
    with _MODE_LOCK:
        count, saved = _MODE_USERS.get(key, (0, None))
        if count == 0:
            saved = [(module, module.training) for module in model.modules()]
            model.eval()
        _MODE_USERS[key] = (count + 1, saved)
    try:
        yield model
    finally:
        with _MODE_LOCK:
            count, saved = _MODE_USERS[key]
            if count == 1:
                del _MODE_USERS[key]
                for module, was_training in saved:
                    module.training = was_training
            else:
                _MODE_USERS[key] = (count - 1, saved)


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
