"""Argument checks shared by the schedule helpers: errors name the argument and its form."""

from __future__ import annotations

import torch
from torch import Tensor


def check_int(value: object, name: str, *, minimum: int | None = None) -> int:
    """``value`` as an int (bools refused), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def check_int_tensor(value: object, name: str, *, dims: tuple[int, ...] = (1, 2)) -> Tensor:
    """An integer tensor with ``dim()`` in ``dims``; ``(L,)`` is the usual unbatched form."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() not in dims:
        forms = " or ".join({1: "(L,)", 2: "(B, L)"}.get(d, f"{d}-D") for d in dims)
        raise ValueError(f"{name} must have shape {forms}, got {tuple(value.shape)}")
    return value


def check_generator(generator: object) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    return generator
