"""Integer grid coordinates bounded by a window or a feature map: the shared base of the
spatial encodings (Swin tables, MViTv2) and its size option.

Positions are integer grid coordinates ``(B|1, L, m)`` (``m = dims``: ``(h, w)`` or
``(t, h, w)``) of the tokens inside one attention window (Swin) or one feature map
(MViTv2); ``grid_coordinates(size)`` gives the row-major coordinates of a whole grid (Swin's
token order). Every encoding here has a learned table that covers its grid only:
coordinates outside ``[0, size_a)`` on some axis ``a`` raise ``ValueError``
(``max_positions`` is the smallest side; ``check_positions`` checks each axis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ...positions_nd import grid_positions
from ...validation import check_int, check_int_sequence
from ..base import BiasContext, Encoding
from ..options import OptionSpec

__all__ = ["grid_size", "grid_coordinates", "GridSize", "GridEncoding"]


def grid_size(value: object, dims: int, name: str, minimum: int = 1) -> tuple[int, ...]:
    """An int (the same side on every axis) or a sequence of ``dims`` ints, each
    ``>= minimum``, as a tuple. ``TypeError`` for another type (bools and strings included),
    ``ValueError`` for a wrong count or a side below ``minimum``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (check_int(value, name, minimum=minimum),) * dims
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be an int or a sequence of {dims} ints (one per axis, each >= "
            f"{minimum}), got {value!r}"
        )
    return check_int_sequence(value, name, length=dims, minimum=minimum)


def grid_coordinates(size: Sequence[int]) -> Tensor:
    """Coordinates of the cells of a grid of ``size`` in row-major order (the last axis
    fastest; Swin's token order inside a window): ``(N, m)`` int64, ``N = prod(size)``
    (``relpos.positions_nd.grid_positions`` of the checked sides)."""
    return grid_positions(*grid_size(tuple(size), len(size), "size"))


@dataclass(frozen=True)
class GridSize(OptionSpec):
    """Option spec of a grid size: an int (every axis) or ``dims`` ints, each
    ``>= minimum``; normalised to a tuple of ``dims`` ints. ``dims=None`` leaves the number
    of axes to the subclasses (a base class's spec, narrowed by each subclass's
    ``option_overrides``): an int stays an int, a sequence of any length becomes a tuple."""

    dims: int | None = 2
    minimum: int = 1
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> int | tuple[int, ...]:
        if self.dims is not None:
            return grid_size(value, self.dims, name, self.minimum)
        if isinstance(value, int) and not isinstance(value, bool):
            return check_int(value, name, minimum=self.minimum)
        if isinstance(value, (bool, str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(
                f"{name} must be an int or a sequence of ints (one per axis, each >= "
                f"{self.minimum}), got {value!r}"
            )
        return check_int_sequence(value, name, minimum=self.minimum)

    @property
    def form(self) -> str:
        count = "one per axis" if self.dims is None else str(self.dims)
        return f"an int or {count} ints >= {self.minimum}"

    def invalid_examples(self) -> list[tuple[Any, type[Exception]]]:
        low = self.minimum - 1
        dims = 2 if self.dims is None else self.dims
        out: list[tuple[Any, type[Exception]]] = [("7", TypeError), (True, TypeError)]
        out.append((2.5, TypeError))
        if self.dims is not None:
            out.append(((7,) * self.dims + (7,), ValueError))
        out.append((low, ValueError))
        out.append(((self.minimum,) * (dims - 1) + (low,), ValueError))
        return out


class GridEncoding(Encoding):
    """Base of encodings over integer grid coordinates bounded by a window / feature map.

    Queries live on a grid of ``q_size`` and keys on one of ``k_size`` (equal except for
    MViTv2's pooled keys). ``check_positions`` raises ``ValueError`` for any coordinate
    outside ``[0, size_a)`` on axis ``a``; ``max_positions`` is the smallest side, so
    coordinates below it are valid on every axis.
    """

    has_bias = True
    relative = True

    def _set_sizes(self, q_size: tuple[int, ...], k_size: tuple[int, ...]) -> None:
        self.q_size = q_size
        self.k_size = k_size
        self.max_positions = min(q_size + k_size)

    def check_positions(self, pos: Tensor, name: str) -> None:
        if pos.numel() == 0:
            return
        sizes = self.q_size if name.startswith("q") else self.k_size
        flat = pos.reshape(-1, pos.shape[-1])
        lo, hi = flat.amin(0).tolist(), flat.amax(0).tolist()
        for a, size in enumerate(sizes):
            if lo[a] < 0 or hi[a] >= size:
                raise ValueError(
                    f"{name} axis {a} spans coordinates {lo[a]}..{hi[a]}, but encoding "
                    f"{self.name!r} has a learned table for a grid of {sizes} "
                    f"(axis {a}: 0..{size - 1}; max_positions={self.max_positions} on every "
                    f"axis); coordinates are positions inside the window"
                )

    @staticmethod
    def axis_offsets(ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor, dims: int) -> list[Tensor]:
        """``q_pos - k_pos`` per axis at the index grids. Positions are gathered one axis at
        a time (``q_pos[b, i, a]``): FlexAttention's score_mod needs scalar gathers (an
        ``(m,)`` gather per score compiles to wrong results in torch 2.13)."""
        return [ctx.q_pos[b, i, a] - ctx.k_pos[b, j, a] for a in range(dims)]
