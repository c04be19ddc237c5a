"""Position ids: defaults, validation, and the facts backends need about them.

Positions reach an encoding as ``q_pos`` and ``k_pos``. Accepted forms (``m`` = number of
position axes, ``m = encoding.dims``):

* ``(L,)`` — shared by the batch (1-D encodings);
* ``(B, L)`` — one sequence of positions per batch element (1-D encodings);
* ``(B, L, m)`` — m-D or continuous positions (``m == 1`` is accepted by 1-D encodings);
* ``(L, m)`` — m-D positions shared by the batch (m-D encodings only).

Internally positions are normalised to ``(Bp, L)`` for 1-D encodings and ``(Bp, L, m)``
otherwise, with ``Bp`` in ``{1, B}``. Integer dtypes are kept integer; floating positions
are allowed only by encodings that say ``continuous = True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def normalize_positions(
    pos: Tensor | None,
    *,
    name: str,
    batch: int,
    length: int,
    dims: int,
    continuous: bool,
    device: torch.device,
    offset: int = 0,
) -> Tensor:
    """Validate ``pos`` (argument ``name``) and return it as ``(Bp, L)`` or ``(Bp, L, m)``."""
    if pos is None:
        ar = torch.arange(offset, offset + length, device=device)
        if dims == 1:
            return ar[None]
        return ar[None, :, None].expand(1, length, dims)
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(pos).__name__}")
    if pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"{name} must hold integer or float positions, got dtype {pos.dtype}")
    if pos.is_floating_point() and not continuous:
        raise TypeError(
            f"{name} must be an integer tensor for this encoding (it has no continuous "
            f"positions), got dtype {pos.dtype}"
        )
    if pos.dim() == 1:
        pos = pos[None]
    if pos.dim() == 2 and dims != 1 and pos.shape[1] == dims and pos.shape[0] == length:
        pos = pos[None]  # (L, m): shared by the batch
    if pos.dim() == 2 and dims != 1:
        raise ValueError(
            f"{name} must have shape (B, L, {dims}) for a {dims}-D encoding, got {tuple(pos.shape)}"
        )
    if pos.dim() == 3:
        if pos.shape[-1] != dims:
            raise ValueError(
                f"{name} has {pos.shape[-1]} position axes but the encoding uses {dims}; "
                f"expected shape (B, L, {dims})"
            )
        if dims == 1:
            pos = pos[..., 0]
    if pos.dim() not in (2, 3):
        raise ValueError(
            f"{name} must have shape (L,), (B, L) or (B, L, m), got {tuple(pos.shape)}"
        )
    if pos.shape[1] != length:
        raise ValueError(f"{name} has length {pos.shape[1]} but the sequence has length {length}")
    if pos.shape[0] not in (1, batch):
        raise ValueError(f"{name} has batch size {pos.shape[0]}, expected 1 or {batch}")
    return pos.to(device)


@dataclass(frozen=True)
class Span:
    """Positions that form one integer range ``start .. start + L - 1`` for the whole batch."""

    start: int
    length: int


def as_span(pos: Tensor) -> Span | None:
    """Return the range ``pos`` covers if it is a batch-shared ``arange``, else ``None``.

    Backends use this to turn a distance-only bias into a Toeplitz table (O(L) memory).
    """
    if pos.dim() != 2 or pos.is_floating_point() or pos.shape[1] == 0:
        return None
    row = pos[0]
    start = int(row[0])
    expected = torch.arange(start, start + row.numel(), device=row.device, dtype=row.dtype)
    if not torch.equal(row, expected):
        return None
    if pos.shape[0] > 1 and not bool((pos == row).all()):
        return None
    return Span(start, row.numel())
