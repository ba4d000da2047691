"""Tensors from a file: only dense CPU tensors of real numbers, and a state dict's weights
within the decoded budget before they are converted.

Threats: tensors that are not plain numbers (sparse, quantized, meta, nested; complex or
exotic dtypes) reach code that assumes dense real arrays (`check_tensor` refuses them by
name); a small file whose tensors expand when converted (a stride-0 view of one float as
10^10 values): a state dict's size as float32 is checked against `Limits.max_decoded_bytes`
before `.float()` allocates it (`checked_state`). Safetensors is a data format (no code);
`load_safetensors` reads it and applies the same checks.
"""
from __future__ import annotations

import torch

from ...errors import AttributionError, reading
from .limits import MB, Limits, over_budget

_TENSOR_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                            torch.bool})


def check_tensor(tensor: torch.Tensor, what: str) -> None:
    """Refuse, by name, tensors that are not dense CPU numbers (sparse, quantized, meta,
    nested; complex or exotic dtypes), and tensors whose pickle set attributes on them (an
    attribute named like a method, `numpy` or `detach`, would shadow it)."""
    attributes = sorted(map(str, getattr(tensor, "__dict__", {}) or {}))
    if attributes:
        raise AttributionError(
            f"{what} carries attributes ({', '.join(a[:40] for a in attributes[:5])}); only "
            "plain tensors are read. Save tensor.detach().clone() instead.")
    if tensor.is_quantized:
        kind = f"quantized ({tensor.dtype})"
    elif tensor.layout != torch.strided:
        kind = f"sparse ({tensor.layout})"
    elif getattr(tensor, "is_nested", False):
        kind = "nested"
    elif tensor.is_meta or tensor.device.type != "cpu":
        kind = f"a {tensor.device.type} tensor without data" if tensor.is_meta \
            else f"on {tensor.device.type}"
    elif tensor.dtype not in _TENSOR_DTYPES:
        kind = f"of dtype {tensor.dtype}"
    else:
        return
    raise AttributionError(
        f"{what} is {kind}; only dense CPU tensors of real numbers are read. Save a plain "
        "tensor instead, e.g. tensor.to_dense() / tensor.dequantize() / tensor.float().")


def checked_state(state: dict[str, torch.Tensor], limits: Limits) -> dict[str, torch.Tensor]:
    """A state dict's tensors, each checked (`check_tensor`) and all within
    `limits.max_decoded_bytes` as float32 before floating ones are converted to float32."""
    for key, value in state.items():
        check_tensor(value, f"Tensor {key[:80]!r} of the state dict")
    as_float = sum(value.numel() * 4 for value in state.values())
    if as_float > limits.max_decoded_bytes:
        raise AttributionError(over_budget(
            "The state dict's weights take", f"{as_float / MB:,.0f} MB as float32",
            f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
    return {key: value.float() if value.is_floating_point() else value
            for key, value in state.items()}


def load_safetensors(data: bytes, limits: Limits) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file's bytes, checked (`checked_state`)."""
    from safetensors.torch import load

    with reading("The .safetensors file is damaged or truncated"):
        state = load(data)
    if not state:
        raise AttributionError("The .safetensors file holds no tensors.")
    return checked_state(state, limits)
