"""The relative-table reader of the contextual encodings: a table read by q or k.

Shaw, NEZHA, the Music Transformer, Huang et al. 2020, Transformer-XL and DeBERTa (and the
spatial / document encodings that port onto it) add to the content logit terms of the form

    q_i . W[row(i, j)]      (a table read by the query)      or
    k_j . W[row(i, j)]      (a table read by the key)

for a table ``W`` of relative embeddings, ``(R, D)`` shared by the heads or ``(H, R, D)`` per
head, and a row that depends on the pair (for the sequence encodings: on the distance
``q_pos - k_pos`` only). Nothing of shape ``(L, L, D)`` is ever built: the products
``x @ W^T`` are formed over the rows the call (or a query block of it) can reach,
``(B, H, N, R)``, and ``bias`` gathers one entry per pair from them.

Building blocks (all typed; no string-keyed context):

* ``DistanceRows``: the table row of every distance ``q_pos - k_pos`` a call reaches, as a
  lookup over ``dmin .. dmax`` (so DeBERTa's log buckets are evaluated once per distance, not
  per pair), the first row reached and the number of rows; ``restrict`` gives the same for a
  query block, ``at(ctx, b, i, j)`` the rows of the pairs at the index grids (``RowIndex``).
* ``TableRead``: one table read by the queries (``TableRead.queries``: products formed per
  query block, see below) or by the keys (``TableRead.keys``: products of the whole call);
  ``read(b, h, n, rows)`` is the one fast gather (``table_ops.gather_rows``).
* ``TableData``: base of the per-encoding dataclasses that ``precompute`` returns (``ctx.data``):
  ``rows`` plus the encoding's reads as fields.
* ``TableEncoding``: base of the encodings built on them. It implements ``precompute`` (rows,
  then the subclass's ``read_tables``) and ``block_context``.

**Per-block products.** ``Encoding.block_context(ctx, i, j)`` is called by the backends for the
block of query indices ``i`` and key indices ``j`` they evaluate (the chunked backend per tile,
inside its activation checkpoint; dense and FlexAttention once for the whole call). For a
``TableEncoding`` it restricts the rows to those the block reaches and forms the query reads'
products for the block's queries only: ``(B, H, T, R_block)``. So the chunked backend never
holds a ``(B, H, L, R)`` product, and the backward of each tile writes into its own small
product instead of a full-size gradient buffer (for the unclipped Music Transformer the call's
``R`` is ``L``). A query read that was not formed for a block (``bias`` called directly with
the call's context) is formed for the whole call on the fly.

How an encoding uses it::

    @dataclass
    class MyData(TableData):
        query: TableRead                              # q_i . W[row(i, j)]

    class MyEncoding(TableEncoding):
        def table_row(self, distance):                # int64 rows; NO_ROW: no embedding
            return distance.clamp(-k, k) + k
        def read_tables(self, q, k, ctx, rows):       # rows: DistanceRows of the call
            w = self.table[rows.first : rows.first + rows.count]
            return MyData(rows=rows, query=TableRead.queries(q, w, rows.first))
        def bias(self, ctx, b, h, i, j):
            r = ctx.data.rows.at(ctx, b, i, j)
            return r.zero_outside(ctx.data.query.read(b, h, i, r)) * ctx.scale

Encodings whose rows are not a function of the distance (iRPE's buckets, 2-D tables) use
``TableRead`` alone: ``read(b, h, n, RowIndex(rows, None, first))`` with their own row index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ..base import BiasContext, Encoding
from .table_ops import gather_rows

__all__ = [
    "NO_ROW",
    "DistanceRows",
    "RowIndex",
    "TableRead",
    "TableData",
    "TableEncoding",
    "TwoSidedTableBias",
    "query_block_context",
    "distance_range",
    "scaled_sum",
]

#: what ``TableEncoding.table_row`` returns for a distance that has no embedding (it reads 0)
NO_ROW = -(2**62)


def distance_range(q_pos: Tensor, k_pos: Tensor, both_signs: bool = False) -> tuple[int, int]:
    """Smallest and largest ``q_pos - k_pos`` over the pairs of each batch row (positions of
    different rows never meet): ``q_pos (B|1, Lq)``, ``k_pos (B|1, Lk)``. ``both_signs`` also
    covers ``k_pos - q_pos``. ``(0, 0)`` for empty positions. Two host syncs."""
    if q_pos.numel() == 0 or k_pos.numel() == 0:
        return 0, 0
    lo = int((q_pos.amin(1) - k_pos.amax(1)).min())
    hi = int((q_pos.amax(1) - k_pos.amin(1)).max())
    if both_signs:
        lo, hi = min(lo, -hi), max(hi, -lo)
    return lo, hi


@dataclass
class RowIndex:
    """Table rows of the pairs at some index grids: ``rows`` (int64, counted from table row
    ``first``) and, for tables with no row beyond a window, ``inside`` (bool, else None)."""

    rows: Tensor
    inside: Tensor | None
    first: int

    def zero_outside(self, x: Tensor) -> Tensor:
        """``x`` with the pairs that have no table row set to 0."""
        return x if self.inside is None else torch.where(self.inside, x, 0.0)


@dataclass
class DistanceRows:
    """Table row of each distance ``d = q_pos - k_pos`` in ``dmin .. dmax``.

    ``lookup[d - dmin]`` is the row minus ``first`` (``-1``: no row, the pair reads 0);
    ``count`` rows ``first .. first + count - 1`` are reached. With ``bounds`` (distances
    beyond which the row no longer changes: a clipped window) the domain is clipped to them and
    ``at`` clamps the distances, so sparse far-apart positions do not make the lookup long.
    ``dmin`` / ``dmax`` are also kept as 0-d tensors: FlexAttention captures them as buffers
    instead of compiling a kernel per value.
    """

    lookup: Tensor
    lo: int
    hi: int
    dmin: Tensor
    dmax: Tensor
    first: int
    count: int
    gaps: bool
    clamp: bool

    @classmethod
    def build(
        cls,
        row_of: Callable[[Tensor], Tensor],
        q_pos: Tensor,
        k_pos: Tensor,
        *,
        both_signs: bool = False,
        bounds: tuple[int, int] | None = None,
    ) -> DistanceRows:
        """The rows of every distance between ``q_pos (B|1, Lq)`` and ``k_pos (B|1, Lk)``;
        ``row_of(distance)`` gives int64 rows (``NO_ROW`` for none)."""
        lo, hi = distance_range(q_pos, k_pos, both_signs)
        if bounds is not None:
            lo, hi = min(max(lo, bounds[0]), bounds[1]), max(min(hi, bounds[1]), bounds[0])
        keys = row_of(torch.arange(lo, hi + 1, device=q_pos.device))
        return cls._from_rows(keys, lo, hi, clamp=bounds is not None)

    @classmethod
    def _from_rows(cls, keys: Tensor, lo: int, hi: int, clamp: bool) -> DistanceRows:
        valid = keys != NO_ROW
        if not bool(valid.any()):  # no pair has a row: one dummy row, every pair reads 0
            first, last, gaps = 0, 0, True
        else:
            first, last = int(keys[valid].min()), int(keys[valid].max())
            gaps = not bool(valid.all())
        lookup = torch.where(valid, keys - first, -1)
        dev = keys.device
        return cls(
            lookup=lookup,
            lo=lo,
            hi=hi,
            dmin=torch.tensor(lo, dtype=torch.int64, device=dev),
            dmax=torch.tensor(hi, dtype=torch.int64, device=dev),
            first=first,
            count=last - first + 1,
            gaps=gaps,
            clamp=clamp,
        )

    def restrict(self, q_pos: Tensor, k_pos: Tensor, both_signs: bool = False) -> DistanceRows:
        """The same lookup for a block of the call (``q_pos``, ``k_pos``: the block's
        positions): only the distances and rows that block reaches."""
        lo, hi = distance_range(q_pos, k_pos, both_signs)
        lo, hi = min(max(lo, self.lo), self.hi), max(min(hi, self.hi), self.lo)
        part = self.lookup[lo - self.lo : hi - self.lo + 1]
        keys = torch.where(part >= 0, part + self.first, NO_ROW)
        return self._from_rows(keys, lo, hi, self.clamp)

    def at(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor, *, sign: int = 1) -> RowIndex:
        """Rows of the pairs at the index grids of ``bias`` (distance ``q_pos[b, i] -
        k_pos[b, j]``, or its negative with ``sign=-1``)."""
        d = ctx.q_pos[b, i] - ctx.k_pos[b, j]
        if sign < 0:
            d = -d
        if self.clamp:
            d = torch.clamp(d, self.dmin, self.dmax)
        rows = self.lookup[d - self.dmin]
        if not self.gaps:
            return RowIndex(rows, None, self.first)
        return RowIndex(rows.clamp_min(0), rows >= 0, self.first)


def _group_products(x: Tensor, table: Tensor) -> Tensor:
    """``x_n . table[h, r]`` for every head h of a per-head table ``(H, R, D)``, from
    ``x (B, Hx, N, D)`` with ``Hx`` dividing H (grouped-query keys serve their group):
    ``(B, H, N, R)``."""
    B, Hx, N, D = x.shape
    H, R = table.shape[:2]
    if Hx == H:
        return torch.matmul(x, table.transpose(-1, -2))
    grouped = table.reshape(Hx, H // Hx, R, D).transpose(-1, -2)  # (Hx, g, D, R)
    return torch.matmul(x[:, :, None], grouped).reshape(B, H, N, R)


@dataclass
class TableRead:
    """A relative table ``W`` read by the queries (``by="q"``) or the keys (``by="k"``).

    ``x (B, Hx, N, D)`` are the queries or keys that read it, ``table`` the rows
    ``first .. first + R - 1`` of ``W``: ``(R, D)`` shared by the heads or ``(H, R, D)`` per
    head. ``products = x @ table^T``: ``(B, H', N, R)`` with ``H' = H / group`` (a shared table
    read by grouped-query keys keeps the key heads; query head h reads ``h // group``).
    ``offset`` is the index of ``x``'s first row in the call (a query block's start).

    Query reads are formed lazily: ``block`` forms them for one query block, and ``read``
    forms them for the whole call if nothing did.
    """

    x: Tensor
    table: Tensor
    first: int
    by: str
    group: int = 1
    offset: int = 0
    products: Tensor | None = None

    @classmethod
    def queries(cls, q: Tensor, table: Tensor, first: int) -> TableRead:
        """The table read by the queries ``q (B, H, Lq, D)``; products per block."""
        return cls(x=q, table=table, first=first, by="q")

    @classmethod
    def keys(cls, k: Tensor, table: Tensor, first: int, num_heads: int) -> TableRead:
        """The table read by the keys ``k (B, Hkv, Lk, D)`` for ``num_heads`` query heads;
        products of the whole call ``(B, H | Hkv, Lk, R)``, formed now."""
        if table.dim() == 3:
            return cls(k, table, first, "k", 1, 0, _group_products(k, table))
        products = torch.matmul(k, table.transpose(-1, -2))
        return cls(k, table, first, "k", num_heads // k.shape[1], 0, products)

    def compute(self) -> Tensor:
        """``x @ table^T`` over all of ``x``."""
        if self.products is not None:
            return self.products
        if self.table.dim() == 3:
            return _group_products(self.x, self.table)
        return torch.matmul(self.x, self.table.transpose(-1, -2))

    def block(self, start: int, end: int, first: int, count: int) -> TableRead:
        """The read of ``x[:, :, start:end]`` over table rows ``first .. first + count - 1``
        (within this read's rows), products formed now."""
        lo = first - self.first
        part = replace(
            self,
            x=self.x[:, :, start:end],
            table=self.table.narrow(-2, lo, count),
            first=first,
            offset=self.offset + start,
            products=None,
        )
        part.products = part.compute()
        return part

    def read(self, b: Tensor, h: Tensor, n: Tensor, r: RowIndex) -> Tensor:
        """``products[b, h, n, row]`` at the index grids of ``bias``: ``n`` is the query
        index for a query read and the key index for a key read; ``r`` the rows."""
        rows = r.rows if r.first == self.first else r.rows + (r.first - self.first)
        if self.group > 1:
            h = h // self.group
        if self.offset:
            n = n - self.offset
        return gather_rows(self.compute(), b, h, n, rows, by_keys=self.by == "k")


@dataclass
class TableData:
    """Base of the per-call data of a ``TableEncoding`` (``ctx.data``): the rows of the
    call's distances; subclasses add their ``TableRead`` fields (and any other tensors)."""

    rows: DistanceRows

    def for_block(self, start: int, end: int, rows: DistanceRows) -> TableData:
        """The data of query rows ``start:end``: ``rows`` of the block, query reads formed
        for its queries over the rows it reaches (key reads and other fields are shared)."""
        changes: dict[str, Any] = {"rows": rows}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TableRead) and value.by == "q":
                changes[f.name] = value.block(start, end, rows.first, rows.count)
        return replace(self, **changes)


def scaled_sum(terms: list[Tensor], scale: float) -> Tensor:
    """``sum(terms) * scale``. The first term is a fresh gather result: over index grids, when
    it already has the full shape, the rest are added to it in place (one (B, H, T, S) tensor
    per tile instead of several); 0-d terms (FlexAttention) stay out of place."""
    out = terms[0]
    if out.dim() == 0 or torch.broadcast_shapes(*(t.shape for t in terms)) != out.shape:
        for t in terms[1:]:
            out = out + t
        return out * scale
    for t in terms[1:]:
        out.add_(t)
    return out.mul_(scale)


@dataclass(frozen=True)
class TwoSidedTableBias:
    """A bias read from a relative table once by the query and once by the key::

        bias(b, h, i, j) = C[b, h, i, col(d)] + P[b, h, j, col'(d)],   d = q_pos[i] - k_pos[j]

    ``query_read`` gives ``C (B, H, Lq, R)`` and ``key_read`` ``P (B, H|Hkv, Lk, R)`` (either
    None when its term is off); ``col(d) = rows.lookup[d - rows.lo]`` and ``col'`` the same at
    ``-d`` when ``key_reads_negated``. Outside ``saturation = (lo, hi)`` both columns stop
    changing, so there the bias is a query term plus a key term: what the ``fold`` backend
    folds into two extra q/k channels (``relpos.attention.disentangled``). An encoding whose
    bias has this form sets ``folds_outside_band`` and returns it from ``two_sided_bias``."""

    query_read: TableRead | None
    key_read: TableRead | None
    rows: DistanceRows
    key_reads_negated: bool
    saturation: tuple[int, int]


class TableEncoding(Encoding):
    """Base of the contextual encodings that read relative tables at a distance-given row.

    Subclasses give ``table_row(distance)`` (int64 rows of ``distance = q_pos - k_pos``,
    element-wise; ``NO_ROW`` where there is no embedding), optionally ``row_bounds`` (the
    distances beyond which the row is constant) and ``both_signs`` (``bias`` also reads rows of
    ``k_pos - q_pos``), and ``read_tables(q, k, ctx, rows)`` returning their ``TableData``.
    This class computes the call's ``DistanceRows`` (``precompute``) and the per-block data
    (``block_context``).
    """

    has_bias = True
    relative = True
    both_signs: bool = False

    def two_sided_bias(self, ctx: BiasContext) -> TwoSidedTableBias | None:
        """This call's bias as a ``TwoSidedTableBias`` when it has that form (encodings with
        ``folds_outside_band``), else None."""
        return None

    def table_row(self, distance: Tensor) -> Tensor:
        """Table row (int64) selected by ``distance = q_pos - k_pos``; ``NO_ROW`` for none."""
        raise NotImplementedError

    @property
    def row_bounds(self) -> tuple[int, int] | None:
        """Distances ``(lo, hi)`` outside which ``table_row`` is constant, or None."""
        return None

    def read_tables(self, q: Tensor, k: Tensor, ctx: BiasContext, rows: DistanceRows) -> TableData:
        """The call's ``TableData`` from the rows it reaches."""
        raise NotImplementedError

    def check_head_dim(self, x: Tensor, name: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} has head_dim {x.shape[-1]} but encoding {self.name!r} was created with "
                f"head_dim={self.head_dim}"
            )

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        self.check_head_dim(q, "q")
        self.check_head_dim(k, "k")
        rows = DistanceRows.build(
            self.table_row,
            ctx.q_pos,
            ctx.k_pos,
            both_signs=self.both_signs,
            bounds=self.row_bounds,
        )
        return self.read_tables(q, k, ctx, rows)

    #: the fewest query rows of a chunked tile for a table encoding: the unclipped Music
    #: Transformer's training step gets several times faster from 128-row to 512-row tiles
    #: (docs/benchmarks.md, "Shaw / Music Transformer training step"; per-tile products,
    #: gathers and the SDPA call have a cost that does not shrink with the tile)
    MIN_BLOCK_ROWS = 512

    def block_rows(self, ctx: BiasContext) -> int:
        """At least ``MIN_BLOCK_ROWS`` query rows per chunked tile, and at least ``R`` when a
        key read is involved: each tile's backward writes a full ``(B, H, Lk, R)`` gradient of
        the key products, so ``T >= R`` keeps that fixed cost below the tile's own ``T x Lk``
        work (DeBERTa at L = 2048: 128-row tiles took twice the time of 512-row ones)."""
        data = ctx.data
        if isinstance(data, TableData) and any(
            isinstance(getattr(data, f.name), TableRead) and getattr(data, f.name).by == "k"
            for f in fields(data)
        ):
            return max(self.MIN_BLOCK_ROWS, data.rows.count)
        return self.MIN_BLOCK_ROWS

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        data = ctx.data
        if not isinstance(data, TableData) or i.dim() != 1 or j.dim() != 1 or i.numel() == 0:
            return ctx
        start, end = int(i[0]), int(i[-1]) + 1
        if end - start != i.numel() or j.numel() == 0:
            return ctx  # not a block of consecutive queries: read the call's products
        rows = data.rows.restrict(ctx.q_pos[:, start:end], ctx.k_pos[:, j], self.both_signs)
        return replace(ctx, data=data.for_block(start, end, rows))


def query_block_context(ctx: BiasContext, i: Tensor) -> BiasContext:
    """``block_context`` of encodings whose table rows are not a function of the distance
    (iRPE's buckets, MViTv2's per-axis tables, DocPolarBERT's box buckets): their ``ctx.data``
    is a dataclass whose ``TableRead`` fields (alone or in tuples / lists) cover every row of
    their tables. For a block of consecutive query indices ``i (T,)`` each read by the
    queries is formed for the block's queries only, ``(B, H, T, R)``; key reads and other
    fields are shared. Anything else (no data, indices that are not one consecutive block):
    the call's ``ctx``."""
    data = ctx.data
    if data is None or not is_dataclass(data) or i.dim() != 1 or i.numel() == 0:
        return ctx
    start, end = int(i[0]), int(i[-1]) + 1
    if end - start != i.numel():
        return ctx

    def block(value: Any) -> Any:
        if isinstance(value, TableRead) and value.by == "q":
            return value.block(start, end, value.first, value.table.shape[-2])
        if isinstance(value, (tuple, list)) and any(isinstance(v, TableRead) for v in value):
            return type(value)(block(v) for v in value)
        return value

    changes = {f.name: block(getattr(data, f.name)) for f in fields(data)}
    return replace(ctx, data=replace(data, **changes))
