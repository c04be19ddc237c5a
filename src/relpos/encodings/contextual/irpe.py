"""iRPE, image relative position encoding (Wu, Peng, Chen, Fu, Chao 2021, "Rethinking and
Improving Relative Position Encoding for Vision Transformer", ICCV 2021, arXiv 2107.14222;
official code microsoft/Cream ``iRPE/DeiT-with-iRPE/irpe.py``, read).

A 2-D relative position ``(dr, dc) = p_i - p_j`` (query minus key, row and column) falls into
a bucket through the piecewise index function ``g`` (Eq. 18, ``piecewise_index``): exact for
``|x| <= alpha``, logarithmic up to ``gamma``, saturated at ``beta`` beyond. The methods
(official ``METHOD``):

* ``euc``: ``g(round(sqrt(dr^2 + dc^2)))``;
* ``quant``: ``g(dr^2 + dc^2)``;
* ``cross``: two tables, ``g(dr)`` and ``g(dc)``; their terms are summed;
* ``product``: ``(g(dr) + b)(2b + 1) + (g(dc) + b)``, ``b = int(beta)``;

non-product ids are shifted by ``+b``; ``alpha, beta, gamma = ratio, 2 ratio, 8 ratio``.

Each bucket holds a learned encoding, used in one of two modes and on queries, keys and/or
values (``rpe_on``, the official option):

* ``bias``: ``b_ij = T[h, bucket(i, j)]`` added to the scaled logits (``T (H|1, nb)``);
* ``contextual`` on keys: ``scale * q_i . W_k[h, :, bucket(i, j)]`` (``W (H|1, D, nb)``);
  on queries: ``scale * k_j . W_q[h, :, bucket(j, i)]`` (the official code transposes the
  query term: its bucket is that of ``p_j - p_i``); on values:
  ``out_i += sum_j p_ij W_v[h, bucket(i, j), :]`` (``W_v (H|1, nb, D)``).

Memory: the tables are read through ``contextual.table.TableRead``: ``q @ W_k``
``(B, H, T, nb)`` per query block (and ``k @ W_q`` per call); ``bias`` gathers at the pair's
bucket: O(L nb) as in the official code, never ``(L, L, D)``. The
value term scatter-adds the softmax weights of a query block into buckets ``(B, H, T, nb)``
and multiplies by ``W_v``: O(T S + T nb D).

Extra tokens (CLS, distillation: the official ``skip``): the first ``skip`` tokens of the
sequence have no position; every pair that involves one reads one extra bucket ``nb`` of
each table. Query ``i`` is token ``i + Lk - Lq`` of the sequence (queries are the last ``Lq``
tokens, as for causal masks and KV-cache decoding); key ``j`` is token ``j``. The positions
given for those tokens are ignored (``irpe_positions`` builds a DeiT token layout).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, ClassVar

import torch
from torch import Tensor, nn

from ...positions_nd import grid_positions
from ...validation import check_float, check_int, check_str
from ..base import BiasContext, Encoding
from ..options import Bool, Choice, Custom, Float, Int
from ..registry import register
from .table import RowIndex, TableRead, query_block_context
from .table_ops import weighted_rows

__all__ = [
    "METHODS",
    "MODES",
    "piecewise_index",
    "irpe_coefficients",
    "irpe_num_buckets",
    "irpe_bucket",
    "irpe_bucket_ids_2d",
    "irpe_positions",
    "IRPE",
    "IRPEData",
    "IRPEBias",
    "IRPEQKV",
]

#: the official method names (``get_rpe_config``'s aliases of ``METHOD``)
METHODS = ("euc", "quant", "cross", "product")
#: the official modes (``"ctx"`` is accepted for ``"contextual"``, as in ``get_rpe_config``)
MODES = ("bias", "contextual")
_MODE_NAMES = (*MODES, "ctx")
# the bucket function of one table: cross has a table for rows and one for columns
_TABLE_METHODS = ("euc", "quant", "product", "cross_rows", "cross_cols")


# ------------------------------------------------------------------------------ pure functions
def piecewise_index(relative_position: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    """The piecewise index function ``g`` (Eq. 18; official ``piecewise_index``), int64.

    ``|x| <= alpha``: ``round(x)``; otherwise
    ``sign(x) trunc(min(beta, round(alpha + ln(|x| / alpha) / ln(gamma / alpha) (beta - alpha))))``,
    in ``[-int(beta), int(beta)]``. The arithmetic is the official one: float32 for integer
    inputs (the input's float dtype otherwise), rounding half to even, and the clipped
    magnitude truncated to an integer, so ``beta = 3.8`` saturates at 3.
    """
    if not isinstance(relative_position, Tensor):
        raise TypeError(
            f"relative_position must be a torch.Tensor, got {type(relative_position).__name__}"
        )
    x = relative_position if relative_position.is_floating_point() else relative_position.float()
    magnitude = x.abs()
    far = alpha + torch.log(magnitude / alpha) / math.log(gamma / alpha) * (beta - alpha)
    far = torch.sign(x) * far.round().clip(max=beta)
    return torch.where(magnitude <= alpha, x.round(), far).long()


def irpe_coefficients(ratio: float) -> tuple[float, float, float]:
    """``(alpha, beta, gamma) = (ratio, 2 ratio, 8 ratio)`` (official ``get_single_rpe_config``)."""
    ratio = check_float(ratio, "ratio", above=0.0)
    return 1 * ratio, 2 * ratio, 8 * ratio


def _table_method(method: str) -> str:
    if method not in _TABLE_METHODS:
        raise ValueError(
            f"method must be one of {', '.join(map(repr, _TABLE_METHODS))} for one table "
            f"('cross' has two: 'cross_rows' and 'cross_cols'), got {method!r}"
        )
    return method


def irpe_num_buckets(method: str, ratio: float, skip: int = 0) -> int:
    """Buckets of one table (official ``get_num_buckets``): ``(2 b + 1)^2`` for ``product``,
    ``2 b + 1`` otherwise (each of the two ``cross`` tables), ``b = int(2 ratio)``; one more
    when ``skip > 0`` (the extra tokens' bucket)."""
    if method != "cross":
        _table_method(method)
    beta_int = int(irpe_coefficients(ratio)[1])
    side = 2 * beta_int + 1
    return (side * side if method == "product" else side) + (skip > 0)


def _bucket(
    dr: Tensor, dc: Tensor, method: str, beta_int: int, g: Callable[[Tensor], Tensor]
) -> Tensor:
    """Bucket ids of integer row and column offsets ``dr``, ``dc`` for one table, with the
    index function ``g``: the composition of the official ``_rp_2d_*`` functions and the
    ``+ beta_int`` shift of ``get_bucket_ids_2d_without_skip``."""
    if method == "product":
        return (g(dr) + beta_int) * (2 * beta_int + 1) + (g(dc) + beta_int)
    if method == "euc":  # the official float32 distance, rounded half to even
        x = torch.sqrt((dr * dr + dc * dc).float()).round().long()
    elif method == "quant":
        x = dr * dr + dc * dc
    else:
        x = dr if method == "cross_rows" else dc
    return g(x) + beta_int


def irpe_bucket(delta: Tensor, method: str, ratio: float = 1.9) -> Tensor:
    """Bucket ids ``(...)`` (int64) of the 2-D offsets ``delta = p_query - p_key`` ``(..., 2)``.

    ``method``: ``euc``, ``quant``, ``product``, or one of the two tables of ``cross``
    (``cross_rows``: ``g(dr)``, ``cross_cols``: ``g(dc)``). Ids lie in
    ``[0, irpe_num_buckets(method, ratio))``.
    """
    if not isinstance(delta, Tensor) or delta.dim() < 1 or delta.shape[-1] != 2:
        raise ValueError(
            f"delta must be a (..., 2) tensor of (row, column) offsets, got {delta!r:.80}"
        )
    if delta.is_floating_point():
        raise TypeError(f"delta must hold integer offsets, got dtype {delta.dtype}")
    alpha, beta, gamma = irpe_coefficients(ratio)
    g = partial(piecewise_index, alpha=alpha, beta=beta, gamma=gamma)
    return _bucket(delta[..., 0], delta[..., 1], _table_method(method), int(beta), g)


def irpe_bucket_ids_2d(
    method: str, height: int, width: int, *, ratio: float = 1.9, skip: int = 0
) -> tuple[Tensor, int]:
    """The official ``get_bucket_ids_2d``: bucket ids ``(skip + L, skip + L)`` of every pair
    of an ``height x width`` feature map in row-major order after ``skip`` extra tokens
    (``L = height * width``), and the number of buckets (with the extra one when
    ``skip > 0``). Rows and columns of the extra tokens hold the extra bucket id."""
    check_int(height, "height")
    check_int(width, "width")
    check_int(skip, "skip", minimum=0)
    pos = grid_positions(height, width)
    ids = irpe_bucket(pos[:, None, :] - pos[None, :, :], method, ratio)
    n = irpe_num_buckets(method, ratio)
    if skip == 0:
        return ids, n
    out = torch.full((skip + ids.shape[0],) * 2, n, dtype=ids.dtype)
    out[skip:, skip:] = ids
    return out, n + 1


def irpe_positions(height: int, width: int, skip: int = 0) -> Tensor:
    """Positions ``(skip + height * width, 2)`` (int64) of a DeiT token sequence: ``skip``
    extra tokens (position ``(0, 0)``, ignored by iRPE) then the patches in row-major order
    (the official ``get_absolute_positions``)."""
    check_int(skip, "skip", minimum=0)
    grid = grid_positions(height, width)
    return torch.cat([grid.new_zeros(skip, 2), grid])


# ------------------------------------------------------------------------------ tables
class _LookupTable(nn.Module):
    """One table of one official ``iRPE`` module (the parameter names are the official ones,
    so ``rpe_k.lookup_table_weight`` etc. load from the released checkpoints' attention
    blocks): ``lookup_table_bias (H|1, nb)`` (bias mode), ``lookup_table_weight
    (H|1, D, nb)`` (contextual on queries / keys, "transposed") or ``(H|1, nb, D)`` (values)."""

    def __init__(
        self,
        method: str,
        heads: int,
        head_dim: int,
        buckets: int,
        mode: str,
        role: str,
        init_std: float,
    ) -> None:
        super().__init__()
        self.method = method
        if mode == "bias":
            shape: tuple[int, ...] = (heads, buckets)
        elif role == "v":
            shape = (heads, buckets, head_dim)
        else:
            shape = (heads, head_dim, buckets)
        table = torch.zeros(shape)
        if init_std > 0:
            nn.init.normal_(table, std=init_std)
        name = "lookup_table_bias" if mode == "bias" else "lookup_table_weight"
        self.register_parameter(name, nn.Parameter(table))
        self._name = name

    @property
    def table(self) -> Tensor:
        return getattr(self, self._name)

    def rows(self) -> Tensor:
        """A contextual q / k table as rows of embeddings: ``(nb, D)`` shared, ``(H, nb, D)``
        per head (the official layout ``(H|1, D, nb)`` transposed)."""
        rows = self.table.transpose(-1, -2)
        return rows[0] if rows.shape[0] == 1 else rows


class _CrossTables(nn.Module):
    """The official ``iRPE_Cross``: a rows table and a columns table, terms summed."""

    def __init__(
        self, heads: int, head_dim: int, buckets: int, mode: str, role: str, init_std: float
    ) -> None:
        super().__init__()
        self.rp_rows = _LookupTable("cross_rows", heads, head_dim, buckets, mode, role, init_std)
        self.rp_cols = _LookupTable("cross_cols", heads, head_dim, buckets, mode, role, init_std)


# ------------------------------------------------------------------------------ encodings
def _check_rpe_on(value: object, name: str) -> str:
    """``rpe_on``: a non-empty string of distinct letters from "q", "k", "v"."""
    check_str(value, name)
    assert isinstance(value, str)
    if not value or set(value) - set("qkv") or len(set(value)) != len(value):
        raise ValueError(
            f"{name} must be a non-empty string of distinct letters from 'q', 'k', 'v' "
            f"(e.g. 'k', 'qk', 'qkv'), got {value!r}"
        )
    return "".join(r for r in "qkv" if r in value)


@dataclass
class IRPEData:
    """Per-call data of iRPE's contextual mode: one entry per table (two for ``cross``), as
    ``contextual.table.TableRead``: ``on_keys[n]``, ``W_k`` read by the queries (products
    ``q @ W_k (B, H, T, nb)`` per query block), and ``on_queries[n]``, ``W_q`` read by the keys
    (``k @ W_q (B, Hk|H, Lk, nb)``); empty where iRPE is not on that role."""

    on_keys: list[TableRead]
    on_queries: list[TableRead]


RPE_ON = Custom(
    _check_rpe_on,
    invalid=[(3, TypeError), ("x", ValueError), ("", ValueError), ("kk", ValueError)],
    optional=True,
    doc="letters from 'q', 'k', 'v'; default: the class's default_rpe_on",
)


@register("irpe")
class IRPE(Encoding):
    """iRPE (Wu et al. 2021, arXiv 2107.14222; microsoft/Cream ``iRPE``): bucketed 2-D
    relative positions read by the queries, keys and/or values (module docstring).

    Logits ``scale q_i . k_j + sum over rpe_on`` of

    * ``"k"``: ``scale * q_i . W_k[h, :, bucket(p_i - p_j)]`` (contextual) or
      ``T_k[h, bucket(p_i - p_j)]`` (bias);
    * ``"q"``: ``scale * k_j . W_q[h, :, bucket(p_j - p_i)]`` or ``T_q[h, bucket(p_j - p_i)]``;

    and output ``sum_j p_ij v_j + sum_j p_ij W_v[h, bucket(p_i - p_j), :]`` for ``"v"``
    (contextual only; then only the ``eager`` and ``chunked`` backends run it). ``cross``
    sums a rows table and a columns table in each place. Positions ``(B|1, L, 2)`` integer
    ``(row, column)`` coordinates (any integers: ``g`` saturates, there is no window).

    Args:
        method: ``"euc"``, ``"quant"``, ``"cross"`` or ``"product"``.
        mode: ``"contextual"`` (``"ctx"``) or ``"bias"``.
        rpe_on: where the encodings attach, any of ``"q"``, ``"k"``, ``"v"`` (e.g. ``"qkv"``);
            ``"v"`` needs the contextual mode (official: no bias on values).
        ratio: the bucket ratio: ``alpha, beta, gamma = ratio, 2 ratio, 8 ratio``
            (DeiT: 1.9 for product, 20 for euc and cross, 33 for quant).
        shared_head: one table for all heads (``(1, ...)``) or one per head (``(H, ...)``).
        skip: number of extra tokens (CLS) at the start of the sequence; pairs involving one
            read one extra bucket per table (released DeiT models: 1).
        init_std: 0 (the official zero initialisation) or the std of a normal init.

    Parameters (official names): ``rpe_q``, ``rpe_k``, ``rpe_v`` modules holding
    ``lookup_table_bias (H|1, nb)`` or ``lookup_table_weight`` ``(H|1, D, nb)`` (q, k) /
    ``(H|1, nb, D)`` (v); with ``cross``, ``rpe_*.rp_rows.*`` and ``rpe_*.rp_cols.*``.
    ``nb = irpe_num_buckets(method, ratio, skip)``.

    Defaults here: the official ``get_rpe_config()`` (contextual product, ratio 1.9, shared,
    on keys: 49 buckets; the released DeiT models add ``skip=1``: 50).

    Beyond the official code (which runs one square ``L x L`` map): any integer positions,
    per batch row, and ``Lq != Lk`` with the extra tokens aligned as in the module docstring
    (queries are the last ``Lq`` tokens), so KV-cache decoding equals the full forward.
    """

    paper = "Wu et al. 2021 (iRPE)"
    dims = 2
    relative = True
    has_bias = True  # per instance: False when rpe_on is "v" alone
    default_mode: ClassVar[str] = "contextual"
    default_rpe_on: ClassVar[str] = "k"
    default_shared_head: ClassVar[bool] = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        method: Annotated[str, Choice(METHODS)] = "product",
        mode: Annotated[
            str | None, Choice(_MODE_NAMES, optional=True, doc="default: the class's default_mode")
        ] = None,
        rpe_on: Annotated[str | None, RPE_ON] = None,
        ratio: Annotated[float, Float(above=0.0)] = 1.9,
        shared_head: Annotated[bool | None, Bool(optional=True)] = None,
        skip: Annotated[int, Int(minimum=0)] = 0,
        init_std: Annotated[float, Float(minimum=0.0)] = 0.0,
    ) -> None:
        super().__init__(num_heads, head_dim)
        mode = self.default_mode if mode is None else mode
        mode = "contextual" if mode == "ctx" else mode
        rpe_on = self.default_rpe_on if rpe_on is None else rpe_on
        if mode == "bias" and "v" in rpe_on:
            raise ValueError(
                f"rpe_on={rpe_on!r}: the bias mode has no value term (official iRPE: 'Bias "
                f"non-transposed RPE does not exist'); use mode='contextual' for 'v'"
            )
        shared_head = self.default_shared_head if shared_head is None else shared_head
        alpha, beta, gamma = irpe_coefficients(ratio)
        self.method, self.mode, self.rpe_on = method, mode, rpe_on
        self.ratio, self.shared_head, self.skip = ratio, shared_head, skip
        self.beta_int = int(beta)
        self.has_bias = "q" in rpe_on or "k" in rpe_on
        self.has_value_term = "v" in rpe_on
        # g tabulated on 0 .. ceil(gamma) + 1: beyond gamma it is int(beta) (checked here),
        # so g(x) = sign(x) g_table[min(|x|, last)]: exact for integer x, identical on every
        # backend (no transcendental functions inside FlexAttention's score_mod)
        g = piecewise_index(torch.arange(math.ceil(gamma) + 2), alpha, beta, gamma)
        assert int(g[-2]) == int(g[-1]) == self.beta_int, "g saturates from gamma on"
        self.register_buffer("g_table", g, persistent=False)
        self.num_buckets = irpe_num_buckets(method, ratio, skip)  # per table
        heads = 1 if shared_head else num_heads
        sizes = (heads, head_dim, self.num_buckets, mode)
        for role in "qkv":
            module: nn.Module | None = None
            if role in rpe_on:
                if method == "cross":
                    module = _CrossTables(*sizes, role, init_std)
                else:
                    module = _LookupTable(method, *sizes, role, init_std)
            setattr(self, f"rpe_{role}", module)

    # ------------------------------------------------------------ indexing
    def tables(self, role: str) -> list[_LookupTable]:
        """The tables of ``role`` (``"q"``, ``"k"``, ``"v"``): one, or rows and columns
        (``cross``); empty when iRPE is not on ``role``."""
        module = getattr(self, f"rpe_{role}")
        if module is None:
            return []
        return [module.rp_rows, module.rp_cols] if self.method == "cross" else [module]

    def index(self, x: Tensor) -> Tensor:
        """``g(x)`` for integer ``x`` (any shape), read from the tabulated ``g``."""
        last = self.g_table.shape[0] - 1
        return self.g_table[x.abs().clamp(max=last)] * x.sign()

    @staticmethod
    def offsets(ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> tuple[Tensor, Tensor]:
        """Row and column offsets ``p_i - p_j`` at the index grids. Each axis is read by one
        indexing expression (``q_pos[b, i, a]``): indexing the last axis of ``q_pos[b, i]``
        afterwards is miscompiled by inductor's CPU FlexAttention in torch 2.13."""
        dr = ctx.q_pos[b, i, 0] - ctx.k_pos[b, j, 0]
        dc = ctx.q_pos[b, i, 1] - ctx.k_pos[b, j, 1]
        return dr, dc

    def bucket(self, dr: Tensor, dc: Tensor, method: str, extra: Tensor | None = None) -> Tensor:
        """Bucket ids of row and column offsets in a table of ``method``; pairs where
        ``extra`` is True (an extra token) read the extra bucket."""
        ids = _bucket(dr, dc, method, self.beta_int, self.index)
        if extra is not None:
            ids = torch.where(extra, self.num_buckets - 1, ids)
        return ids

    def _extra_pairs(self, ctx: BiasContext, i: Tensor, j: Tensor) -> Tensor | None:
        """Pairs with an extra token: query token ``i + Lk - Lq`` or key ``j`` below ``skip``."""
        if not self.skip:
            return None
        offset = ctx.k_pos.shape[1] - ctx.q_pos.shape[1]
        # one comparison, no boolean | (it does not lower in a CPU FlexAttention score_mod)
        return torch.minimum(i + offset, j) < self.skip

    @staticmethod
    def _head(h: Tensor, table: Tensor) -> Tensor:
        """Head index into a table of ``H`` or 1 (shared) heads."""
        return h if table.shape[0] > 1 else h * 0

    # ------------------------------------------------------------ hooks
    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> IRPEData | None:
        """Contextual mode: the key tables read by the queries and the query tables read by
        the keys (``IRPEData``); None in the bias mode."""
        if self.mode != "contextual":
            return None
        return IRPEData(
            on_keys=[TableRead.queries(q, t.rows().to(q.dtype), 0) for t in self.tables("k")],
            on_queries=[
                TableRead.keys(k, t.rows().to(q.dtype), 0, self.num_heads) for t in self.tables("q")
            ],
        )

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        return query_block_context(ctx, i)  # q_block @ W_k for the block's queries

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        dr, dc = self.offsets(ctx, b, i, j)
        extra = self._extra_pairs(ctx, i, j)
        out: Tensor | None = None
        for role in ("k", "q"):
            sign = 1 if role == "k" else -1  # the query term reads bucket(p_j - p_i)
            for n, t in enumerate(self.tables(role)):
                ids = self.bucket(sign * dr, sign * dc, t.method, extra)
                if self.mode == "bias":
                    term = t.table[self._head(h, t.table), ids]
                elif role == "k":
                    term = ctx.data.on_keys[n].read(b, h, i, RowIndex(ids, None, 0)) * ctx.scale
                else:
                    term = ctx.data.on_queries[n].read(b, h, j, RowIndex(ids, None, 0)) * ctx.scale
                out = term if out is None else out + term
        assert out is not None
        return out

    def value_term(
        self, ctx: BiasContext, p: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """``sum_j p_ij W_v[h, bucket(i, j), :]``: ``p`` scatter-added into buckets
        ``(B, H, T, nb)``, then one matmul with ``W_v (H|1, nb, D)``."""
        dr, dc = self.offsets(ctx, b, i, j)
        extra = self._extra_pairs(ctx, i, j)
        out: Tensor | None = None
        for t in self.tables("v"):
            ids = self.bucket(dr, dc, t.method, extra)
            term = weighted_rows(p, ids, t.table.to(p.dtype))
            out = term if out is None else out + term
        assert out is not None
        return out

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, method={self.method!r}, mode={self.mode!r}, "
            f"rpe_on={self.rpe_on!r}, ratio={self.ratio}, shared_head={self.shared_head}, "
            f"skip={self.skip}, num_buckets={self.num_buckets}"
        )


@register("irpe-bias")
class IRPEBias(IRPE):
    __doc__ = IRPE.__doc__ + (
        "\n    ``irpe-bias``: the bias mode, a learned scalar per bucket and head added to the"
        "\n    logits (``T_k (H, nb)``; on keys by default). Heads have their own tables by"
        "\n    default (``shared_head=False``); the official ``get_rpe_config`` defaults to a"
        "\n    shared one: pass ``shared_head=True`` for that.\n"
    )
    default_mode = "bias"
    default_shared_head = False


@register("irpe-qkv")
class IRPEQKV(IRPE):
    __doc__ = IRPE.__doc__ + (
        "\n    ``irpe-qkv``: contextual on queries, keys and values (the released"
        "\n    ``deit_*_ctx_product_50_shared_qkv`` configuration, there with ``skip=1``); the"
        "\n    value term makes it run on ``eager`` and ``chunked`` only.\n"
    )
    default_rpe_on = "qkv"
    has_value_term = True
