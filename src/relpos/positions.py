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

One position fact per call: ``relpos.attention`` normalises each side once into a
``Positions`` (the tensor plus whether it is a batch-shared integer range and its offset,
known without a host sync when the positions were defaulted), and the pair into
``CallPositions`` (the reachable distance range, computed at most once, lazily). Backends
and encodings read these facts instead of rediscovering them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    if pos.is_floating_point() and pos.numel() and not bool(torch.isfinite(pos).all()):
        bad = pos[~torch.isfinite(pos)][0].item()
        raise ValueError(f"{name} must be finite, got a position of {bad}")
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


_UNKNOWN: Any = object()  # a fact not computed yet


class Positions:
    """One side's positions of a call, normalised once (``normalize_positions``).

    ``tensor``: ``(Bp, L)`` or ``(Bp, L, m)``. ``span``: the integer range the positions
    cover when they are one batch-shared ``arange`` (else None); known without a host sync
    when the positions were defaulted, else discovered once, on first use (one sync).
    """

    def __init__(self, tensor: Tensor, span: Span | None = _UNKNOWN) -> None:
        self.tensor = tensor
        self._span = span

    @classmethod
    def default(cls, *, length: int, dims: int, device: torch.device, offset: int = 0) -> Positions:
        """The positions a call gets when none are passed: ``offset .. offset + L - 1``."""
        tensor = normalize_positions(
            None,
            name="",
            batch=1,
            length=length,
            dims=dims,
            continuous=False,
            device=device,
            offset=offset,
        )
        return cls(tensor, Span(offset, length) if dims == 1 and length else None)

    @property
    def length(self) -> int:
        return self.tensor.shape[1]

    @property
    def span(self) -> Span | None:
        """The batch-shared integer range of the positions, or None (lazy, cached)."""
        if self._span is _UNKNOWN:
            self._span = as_span(self.tensor)
        return self._span

    @property
    def offset(self) -> int | None:
        """The first position when the positions are a batch-shared range, else None."""
        span = self.span
        return None if span is None else span.start

    def __repr__(self) -> str:
        known = "?" if self._span is _UNKNOWN else self._span
        return f"Positions(shape={tuple(self.tensor.shape)}, span={known})"


class CallPositions:
    """The query and key positions of one call and the facts derived from the pair.

    ``distance_range``: the smallest and largest ``q_pos - k_pos`` over the pairs of the call
    (per batch row), for 1-D integer positions; None for float or m-D positions or an empty
    call. From the spans when both sides are ranges (no host sync), else one host sync, once.
    """

    def __init__(self, q: Positions, k: Positions) -> None:
        self.q, self.k = q, k
        self._distance_range: tuple[int, int] | None = _UNKNOWN
        self._shared: bool = _UNKNOWN

    @property
    def distance_range(self) -> tuple[int, int] | None:
        if self._distance_range is _UNKNOWN:
            self._distance_range = self._compute_distance_range()
        return self._distance_range

    def _compute_distance_range(self) -> tuple[int, int] | None:
        qp, kp = self.q.tensor, self.k.tensor
        if qp.dim() != 2 or qp.is_floating_point() or kp.is_floating_point():
            return None
        if qp.shape[1] == 0 or kp.shape[1] == 0:
            return None
        qs, ks = self.q.span, self.k.span
        if qs is not None and ks is not None:
            return qs.start - (ks.start + ks.length - 1), qs.start + qs.length - 1 - ks.start
        low = (qp.amin(1) - kp.amax(1)).min()
        high = (qp.amax(1) - kp.amin(1)).max()
        lo, hi = torch.stack((low, high)).tolist()
        return int(lo), int(hi)

    @property
    def batch_shared(self) -> bool:
        """Every batch row has the same query positions and the same key positions."""
        if self._shared is _UNKNOWN:
            qp, kp = self.q.tensor, self.k.tensor
            if qp.shape[0] == 1 and kp.shape[0] == 1:
                self._shared = True
            elif self.q.span is not None and self.k.span is not None:
                self._shared = True
            else:
                self._shared = bool((qp == qp[:1]).all() and (kp == kp[:1]).all())
        return self._shared
