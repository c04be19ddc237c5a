"""What the engine hands an encoding's hooks for one call.

* ``BiasContext``: the batch-expanded positions, the encoding's per-call data, the logit
  scale and the call's position facts (read by ``bias``, ``value_term``, ``piece_index`` ...);
* ``KeySegment``: one key range scored with one piece (piecewise encodings' layout);
* ``RowAffineTables``: a bias affine in a per-row scalar over one block of query rows
  (``BiasRole.row_affine_tables``: FIRE above its threshold);
* ``QueryGroups``: a rotation state per group of queries (query-dependent key encodings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..positions import CallPositions, Positions

__all__ = ["BiasContext", "KeySegment", "QueryGroups", "RowAffineTables"]


@dataclass
class BiasContext:
    """What ``prepare`` computes once per call and ``bias`` reads.

    ``q_pos`` and ``k_pos`` are expanded to the batch: ``(B, Lq[, m])`` and ``(B, Lk[, m])``.
    ``data`` holds the encoding's own per-call precomputation (e.g. ``q @ E_rel^T``).
    """

    q_pos: Tensor
    k_pos: Tensor
    #: what the encoding's ``precompute`` returned: a small dataclass declared next to the
    #: encoding (typed fields instead of string keys), or None
    data: Any = None
    #: the logit scale of the call (set by the backends after ``prepare``): bias terms that
    #: read q or k (``q @ E_rel^T``) are multiplied by it, as the content term is.
    scale: float = 1.0
    #: the call's position facts (``relpos.positions.CallPositions``), set by the engine
    positions: CallPositions | None = None

    @property
    def distance_range(self) -> tuple[int, int] | None:
        """Smallest and largest ``q_pos - k_pos`` of the call's pairs (1-D integer
        positions; None for float or m-D positions or an empty call). Computed once per call
        and without a host sync when the positions are ranges: read this instead of
        ``q_pos.min()`` / ``k_pos.max()``."""
        if self.positions is None:
            self.positions = CallPositions(Positions(self.q_pos), Positions(self.k_pos))
        return self.positions.distance_range


@dataclass(frozen=True)
class KeySegment:
    """One range of keys scored with one piece (piecewise encodings, ``key_segments``).

    Keys at positions ``lo <= p_j < hi`` (None: unbounded) are scored with piece ``piece`` by
    every query ``i`` with ``d_min <= p_j - p_i <= d_max`` (None: unbounded). The bounds are
    ints for a block of queries, or integer tensors when ``key_segments`` is evaluated
    element-wise (``Encoding.piece_index``).
    """

    piece: int
    lo: int | Tensor | None
    hi: int | Tensor | None
    d_min: int | Tensor | None
    d_max: int | Tensor | None

    def holds(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Whether this segment scores the pair ``(q_pos, k_pos)`` (broadcasting tensors)."""
        d = k_pos - q_pos
        hit = torch.ones(
            torch.broadcast_shapes(q_pos.shape, k_pos.shape), dtype=torch.bool, device=k_pos.device
        )
        if self.lo is not None:
            hit = hit & (k_pos >= self.lo)
        if self.hi is not None:
            hit = hit & (k_pos < self.hi)
        if self.d_min is not None:
            hit = hit & (d >= self.d_min)
        if self.d_max is not None:
            hit = hit & (d <= self.d_max)
        return hit


@dataclass(frozen=True)
class RowAffineTables:
    """The bias over groups of query rows, each group ``g`` as ``constant[h, g, n] +
    row_scale[g, t] * slope[h, g, n]`` at the pair of its row ``t`` and its distance
    ``distance[g, n] = q_pos - k_pos``, for every ``n`` with ``exact[g, n]``; at the other
    distances the group's rows do not share one affine form and the engine evaluates ``bias``
    per pair. A group of one row is one affine form at every distance (the engine evaluates
    the other pairs as such groups).

    Shapes: ``constant``, ``slope`` ``(H, G, N)``, their last dimension contiguous (the
    engine reads each group's ``(H, N)`` slice as a Hankel view, without a copy);
    ``row_scale (G, R)``; ``exact (G, N)`` bool. The tensors are the call's own: in causal
    calls the engine writes ``-inf`` (and a zero slope, ``exact`` True) at future keys in
    place, without a copy.
    """

    constant: Tensor
    slope: Tensor
    row_scale: Tensor
    exact: Tensor


@dataclass
class QueryGroups:
    """A rotation state (``prepare_rotary``) for encodings whose key encoding depends on the
    query (RayRoPE: keys are expressed in the query's camera). ``groups``: a list of
    ``(rows, state)``, ``rows (B|1, Lq)`` bool selecting the queries of the group and
    ``state`` the ordinary rotation state of that group (``rotate(x, pos, role, state)``).
    The engine runs one attention per group, with q, k, v and the output rotated by the
    group's state, and keeps each query's row from its own group: exact, at the cost of one
    attention per group. No KV cache (the keys' encoding changes with the queries)."""

    groups: list[tuple[Tensor, Any]]
