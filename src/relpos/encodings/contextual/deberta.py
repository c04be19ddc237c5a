"""DeBERTa disentangled attention (He et al. 2021, arXiv 2006.03654), v2/v3 code: content
reads a projected, log-bucketed relative table from both sides.

``logit_ij = [ q_i.k_j + q_i.K^r[idx(i, j)] + k_j.Q^r[idx(i, j)] ] / sqrt(3 d)``: ``q . K^r``
(c2p) is a query read of the table reader (``table.py``, products per query block), ``k . Q^r``
(p2c) a key read; ``idx`` is evaluated once per distance (``DistanceRows``). Also here: the
bucket functions ``deberta_log_bucket`` and ``deberta_relative_index``
(microsoft/DeBERTa ``make_log_bucket_position``, ``build_relative_position``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import BiasContext
from ..options import Bool, Custom, Float, Int
from ..registry import register
from .table import (
    DistanceRows,
    TableData,
    TableEncoding,
    TableRead,
    TwoSidedTableBias,
    scaled_sum,
)
from .transformer_xl import DROPOUT

__all__ = [
    "DeBERTa",
    "DeBERTaData",
    "deberta_log_bucket",
    "deberta_relative_index",
    "table_saturation",
]


@cache
def _log_ratio(max_position: int, mid: int) -> float:
    """``log((max_position - 1) / mid)`` exactly as ``transformers`` forms it (a float32 log of a
    float32 0-d tensor), as a Python float holding that float32 value."""
    return float(torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32)))


def _log_bucket(
    rp: Tensor, bucket_size: int, max_position: int, clamp: bool, log_ratio: float
) -> Tensor:
    """``deberta_log_bucket`` with the denominator given (FlexAttention traces this: no
    tensor-to-float conversion inside)."""
    rp = rp.to(torch.int64)
    if clamp:
        rp = rp.clamp(-(max_position - 1), max_position - 1)
    mid = bucket_size // 2
    abs_pos = torch.where((rp < mid) & (rp > -mid), mid - 1, rp.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid) / log_ratio * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rp, (log_pos * torch.sign(rp)).to(torch.int64))


def deberta_log_bucket(
    relative_pos: Tensor, bucket_size: int, max_position: int, *, clamp: bool = True
) -> Tensor:
    """DeBERTa's log-bucketed relative position (``make_log_bucket_position``), int64.

    With ``mid = bucket_size // 2``: ``delta`` itself when ``|delta| <= mid``, otherwise
    ``sign(delta) * (ceil(log(|delta| / mid) / log((max_position - 1) / mid) * (mid - 1)) + mid)``,
    so buckets run from ``-(bucket_size - 1)`` to ``bucket_size - 1`` for
    ``|delta| <= max_position - 1``. Computed in float32 as the torch versions of the official
    code and ``transformers`` do (float32 ``log`` is not correctly rounded, so the float32 steps
    matter at bucket edges; tests/oracle checks a grid against ``transformers``).

    ``clamp=True`` (the official "faster" version) first clamps ``delta`` to
    ``±(max_position - 1)``, so every farther distance shares the outermost bucket.
    ``clamp=False`` is ``transformers``' (and the official numpy) function: beyond
    ``max_position - 1`` the buckets keep growing; after DeBERTa's index clamp this only
    changes distances ``delta <= -max_position``, which then select table row 0 instead of 1.
    """
    mid = bucket_size // 2
    return _log_bucket(
        relative_pos, bucket_size, max_position, clamp, _log_ratio(max_position, mid)
    )


def _relative_index(
    rp: Tensor, position_buckets: int, max_relative_positions: int, clamp: bool, log_ratio: float
) -> Tensor:
    span = position_buckets if position_buckets > 0 else max_relative_positions
    rp = rp.to(torch.int64)
    if position_buckets > 0:
        rp = _log_bucket(rp, position_buckets, max_relative_positions, clamp, log_ratio)
    return (rp + span).clamp(0, 2 * span - 1)


def deberta_relative_index(
    relative_pos: Tensor,
    *,
    position_buckets: int,
    max_relative_positions: int,
    clamp_buckets: bool = True,
) -> Tensor:
    """Row of DeBERTa's relative-embedding table for ``delta = query - key``.

    ``span = position_buckets`` if > 0 else ``max_relative_positions``;
    ``idx = clamp(bucket(delta) + span, 0, 2 span - 1)`` with ``bucket`` = ``deberta_log_bucket``
    when ``position_buckets > 0``, the identity otherwise. int64, same shape.
    """
    log_ratio = (
        _log_ratio(max_relative_positions, position_buckets // 2) if position_buckets > 0 else 1.0
    )
    return _relative_index(
        relative_pos, position_buckets, max_relative_positions, clamp_buckets, log_ratio
    )


def _first(holds, limit: int = 1 << 40) -> int:
    """Smallest ``n >= 0`` with ``holds(n)``, for a predicate that stays true once true."""
    if holds(0):
        return 0
    top = 1
    while not holds(top):
        top *= 2
        if top > limit:
            raise ValueError("the table rows never saturate")  # unreachable for DeBERTa
    low = top // 2  # holds(top), not holds(low)
    while top - low > 1:
        mid = (low + top) // 2
        low, top = (low, mid) if holds(mid) else (mid, top)
    return top


@cache
def table_saturation(
    position_buckets: int, max_relative_positions: int, clamp_buckets: bool
) -> tuple[int, int]:
    """Distances ``(lo, hi)`` (``lo <= 0 <= hi``) beyond which DeBERTa's table row no longer
    changes: ``idx(d) = idx(hi)`` for every ``d >= hi`` and ``idx(d) = idx(lo)`` for every
    ``d <= lo`` (``deberta_relative_index``), the smallest such ``|lo|``, ``hi``.

    The row is non-decreasing in ``d`` and ends at the table's edges: rows ``0`` and
    ``2 span - 1``, or with clamped log buckets those of ``d = -/+(max_relative_positions - 1)``
    (row 1 on the negative side). Found by bisection on the bucket function itself (its float32
    steps decide the exact point: with 256 buckets and 512 positions ``hi = 506``: bucket 255 is
    reached below 511)."""
    log_ratio = (
        _log_ratio(max_relative_positions, position_buckets // 2) if position_buckets > 0 else 1.0
    )

    def row(d: int) -> int:
        rp = torch.tensor([d], dtype=torch.int64)
        return int(
            _relative_index(rp, position_buckets, max_relative_positions, clamp_buckets, log_ratio)
        )

    span = position_buckets if position_buckets > 0 else max_relative_positions
    top, bottom = 2 * span - 1, 0
    if position_buckets > 0 and clamp_buckets:
        top, bottom = row(max_relative_positions - 1), row(-(max_relative_positions - 1))
    return -_first(lambda n: row(-n) <= bottom), _first(lambda n: row(n) >= top)


# ---------------------------------------------------------------------------- DeBERTa
_POS_TYPES = ("c2p", "p2c")


def _pos_att_type(value: Any, name: str = "pos_att_type") -> tuple[str, ...]:
    """``"c2p|p2c"`` or a sequence of the term names, as a tuple without repeats."""
    if isinstance(value, str):
        value = [x for x in value.lower().replace(",", "|").split("|") if x.strip()]
    if not isinstance(value, Sequence) or not all(isinstance(x, str) for x in value):
        raise TypeError(
            f"{name} must be a subset of {list(_POS_TYPES)} (a list or 'c2p|p2c'), got {value!r}"
        )
    types = tuple(dict.fromkeys(x.strip().lower() for x in value))
    unknown = [x for x in types if x not in _POS_TYPES]
    if unknown or not types:
        hint = " (p2p is not in the DeBERTa v2/v3 code)" if "p2p" in unknown else ""
        raise ValueError(
            f"{name} must be a non-empty subset of {list(_POS_TYPES)}, got {value!r}{hint}"
        )
    return types


@dataclass
class DeBERTaData(TableData):
    """Per call: ``q . K^r`` (``c2p``, a query read of the ``(H, R, D)`` projected rows) and
    ``k . Q^r`` (``p2c``, a key read ``(B, H, Lk, R)``), each None when the term is off."""

    c2p: TableRead | None = None
    p2c: TableRead | None = None


POS_ATT_TYPE = Custom(
    _pos_att_type,
    invalid=[(3, TypeError), ("p2p", ValueError), ([], ValueError), ("c2p|x", ValueError)],
    doc="subset of c2p, p2c ('c2p|p2c' or a list)",
)


@register("deberta")
class DeBERTa(TableEncoding):
    """DeBERTa disentangled attention, v2/v3 code (He et al. 2021, arXiv 2006.03654;
    microsoft/DeBERTa and transformers ``DisentangledSelfAttention``, read).

    ``logit_ij = [ q_i.k_j + q_i.K^r[idx(i,j)] + k_j.Q^r[idx(i,j)] ] / sqrt(d * F)``

    * ``idx(i, j) = clamp(bucket(i - j) + span, 0, 2 span - 1)`` (``deberta_relative_index``:
      log buckets when ``position_buckets > 0``, ``span = position_buckets``; otherwise
      ``span = max_relative_positions`` and plain clipping), ``i - j = q_pos - k_pos``.
    * ``K^r = pos_key_proj(P)`` (c2p), ``Q^r = pos_query_proj(P)`` (p2c), split into heads;
      ``P`` = ``rel_embeddings (2 span, hidden_size)``, LayerNorm-ed when
      ``norm_rel_embeddings`` (v3's ``norm_rel_ebd = layer_norm``), ``dropout`` in training.
    * ``F = 1 + len(pos_att_type)`` (``default_scale``: ``1/sqrt(3 d)`` for c2p and p2c); an
      explicit ``scale`` replaces ``1/sqrt(d F)`` for all terms.

    **Code, not paper.** The official code and ``transformers`` use the *same* index
    ``delta(i, j) = i - j`` for the p2c term; the paper (Eq. 4) writes ``delta(j, i)``.
    relpos follows the code (checkpoints were trained with it); ``paper_p2c=True`` gives the
    paper's form, ``k_j . Q^r[idx(j, i)]``.

    **Attention level.** q and k arrive already projected (DeBERTa's ``query_proj`` /
    ``key_proj`` content projections); the encoding owns the relative table and *its own*
    projections of it. With ``share_att_key=False`` they are ``pos_key_proj`` /
    ``pos_query_proj`` (v2). With ``share_att_key=True`` (v3) DeBERTa reuses the layer's content
    projections: here they are called ``key_proj`` / ``query_proj`` and start independent — a
    model port copies the layer's ``query_proj`` / ``key_proj`` weights into them, or calls
    ``tie_projections(query_proj, key_proj)`` so that they *are* the layer's modules (shared
    training, as in v3). ``transformers`` keeps one ``rel_embeddings`` table (and LayerNorm) per
    encoder for all layers: share one encoding across layers for that
    (``TransformerLM(share_encoding=True)``).

    The c2p projection's bias adds ``q_i . b`` to every logit of row i, a constant that the
    softmax cancels: it is kept for checkpoint parity but frozen (``requires_grad=False``), its
    gradient being zero.

    Generalisations: any integer positions (``i - j`` from ``q_pos - k_pos``, batch-specific
    positions, ``Lq != Lk``); grouped-query keys; causal masks. ``clamp_buckets=False``
    reproduces ``transformers``' buckets for distances ``<= -max_relative_positions``
    (``deberta_log_bucket``). Not implemented: ``p2p`` (absent from the v2/v3 code).

    Per call: the rows ``lo .. hi`` the call's distances reach (``R <= 2 span``), their
    projections ``K^r``, ``Q^r`` ``(H, R, D)`` and ``kr = k . Q^r (B, H, Lk, R)``; per query
    block ``qr = q . K^r (B, H, T, R_block)``; ``bias`` gathers both.

    Far from the diagonal the row stops changing (``saturation``: ``|d| >= 506`` for 256
    buckets over 512 positions), so the bias is a query term plus a key term there: the
    ``fold`` backend (path ``fold-band``, ``relpos.attention.disentangled``) folds those
    regions into two extra q/k channels and gathers only the band.
    """

    paper = "He et al. 2021 (DeBERTa)"
    folds_outside_band = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        position_buckets: Annotated[
            int, Int(minimum=-1, doc="log buckets (-1 or 0: none, plain clipping)")
        ] = 256,
        max_relative_positions: Annotated[
            int, Int(minimum=1, doc="span without buckets; log range")
        ] = 512,
        pos_att_type: Annotated[str | Sequence[str], POS_ATT_TYPE] = ("c2p", "p2c"),
        share_att_key: Annotated[
            bool, Bool(doc="v3: the layer's content projections read the table")
        ] = False,
        hidden_size: Annotated[
            int | None, Int(minimum=1, optional=True, doc="width of rel_embeddings (H * D)")
        ] = None,
        norm_rel_embeddings: Annotated[bool, Bool(doc="LayerNorm the relative table (v3)")] = True,
        layer_norm_eps: Annotated[float, Float(above=0.0, doc="eps of that LayerNorm")] = 1e-7,
        paper_p2c: Annotated[
            bool, Bool(doc="the paper's p2c index delta(j, i) instead of the code's")
        ] = False,
        clamp_buckets: Annotated[
            bool, Bool(doc="clamp distances before bucketing (official 'faster' code)")
        ] = True,
        dropout: Annotated[float, DROPOUT] = 0.0,
        init_std: Annotated[
            float, Float(minimum=0.0, doc="std of the N(0, std^2) initialisation")
        ] = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if position_buckets > 0 and not (
            position_buckets >= 2 and max_relative_positions - 1 > position_buckets // 2
        ):
            raise ValueError(
                f"log buckets need position_buckets >= 2 and max_relative_positions - 1 > "
                f"position_buckets // 2, got position_buckets={position_buckets}, "
                f"max_relative_positions={max_relative_positions}"
            )
        hidden_size = num_heads * head_dim if hidden_size is None else hidden_size
        self.position_buckets = position_buckets
        self.max_relative_positions = max_relative_positions
        self.span = position_buckets if position_buckets > 0 else max_relative_positions
        self.pos_att_type = _pos_att_type(pos_att_type)  # the default is not checked
        self.both_signs = paper_p2c and "p2c" in self.pos_att_type
        self.share_att_key = share_att_key
        self.hidden_size = hidden_size
        self.paper_p2c = paper_p2c
        self.clamp_buckets = clamp_buckets
        self.dropout = float(dropout)
        # computed here, outside any trace (FlexAttention's score_mod calls table_row)
        self._log_ratio = (
            _log_ratio(max_relative_positions, position_buckets // 2)
            if position_buckets > 0
            else 1.0
        )
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, hidden_size) * init_std)
        self.rel_norm = (
            nn.LayerNorm(hidden_size, eps=layer_norm_eps) if norm_rel_embeddings else None
        )
        width = num_heads * head_dim
        names = {"c2p": "key_proj", "p2c": "query_proj"}
        self._proj_names = {
            t: (names[t] if share_att_key else f"pos_{names[t]}") for t in self.pos_att_type
        }
        for t, attr in self._proj_names.items():
            proj = nn.Linear(hidden_size, width, bias=True)
            nn.init.normal_(proj.weight, std=init_std)
            nn.init.zeros_(proj.bias)
            if t == "c2p":
                proj.bias.requires_grad_(False)  # q_i . b is constant along the softmax row
            setattr(self, attr, proj)

    @classmethod
    def example_options(cls) -> dict:
        # 8 log buckets over 16 positions: the suite's lengths (12 .. 300) reach the log
        # buckets and the saturated rows (|d| >= 10), so every backend, the fold's outer
        # regions included, is compared on all three kinds of rows
        return {"position_buckets": 8, "max_relative_positions": 16}

    def default_scale(self, head_dim: int) -> float:
        """``1 / sqrt(d * F)``, ``F = 1 + number of position terms`` (3 for c2p and p2c)."""
        return (head_dim * (1 + len(self.pos_att_type))) ** -0.5

    def projection(self, term: str) -> nn.Linear:
        """The projection of the relative table used by ``term`` ("c2p" or "p2c")."""
        return getattr(self, self._proj_names[term])

    def tie_projections(
        self, query_proj: nn.Linear | None = None, key_proj: nn.Linear | None = None
    ) -> None:
        """``share_att_key=True``: use a layer's own content projections (the modules, so their
        parameters are shared) as ``query_proj`` (p2c) and ``key_proj`` (c2p)."""
        if not self.share_att_key:
            raise ValueError("tie_projections needs share_att_key=True")
        for term, arg, module in (("p2c", "query_proj", query_proj), ("c2p", "key_proj", key_proj)):
            if module is None:
                continue
            if term not in self.pos_att_type:
                raise ValueError(f"{arg} given, but pos_att_type {self.pos_att_type} has no {term}")
            width = self.num_heads * self.head_dim
            if not isinstance(module, nn.Linear) or (module.in_features, module.out_features) != (
                self.hidden_size,
                width,
            ):
                raise ValueError(
                    f"{arg} must be an nn.Linear({self.hidden_size}, {width}), got {module!r}"
                )
            setattr(self, arg, module)

    def table_row(self, distance: Tensor) -> Tensor:
        return _relative_index(
            distance,
            self.position_buckets,
            self.max_relative_positions,
            self.clamp_buckets,
            self._log_ratio,
        )

    def two_sided_bias(self, ctx: BiasContext) -> TwoSidedTableBias | None:
        """c2p and p2c as a ``TwoSidedTableBias`` (the p2c column at ``idx(-d)`` with
        ``paper_p2c``), None when the call's data is not DeBERTa's."""
        data = getattr(ctx, "data", None)
        if not isinstance(data, DeBERTaData):
            return None
        return TwoSidedTableBias(data.c2p, data.p2c, data.rows, self.paper_p2c, self.saturation())

    def saturation(self) -> tuple[int, int]:
        """Distances ``(lo, hi)`` (``lo <= 0 <= hi``) outside which *both* position terms read
        one table row each: for every pair with ``q_pos - k_pos >= hi`` the c2p row is
        ``idx(hi)`` and the p2c row ``idx(hi)`` (``paper_p2c``: ``idx(-hi)``), and likewise
        below ``lo``. There the bias is ``scale (q_i . K^r[r] + k_j . Q^r[r'])``, a query term
        plus a key term, which the ``fold`` backend folds into two extra q/k channels
        (``relpos.attention.disentangled``). ``table_saturation`` gives the row's own edges."""
        lo, hi = table_saturation(
            self.position_buckets, self.max_relative_positions, self.clamp_buckets
        )
        if self.both_signs:  # the p2c term reads idx(-d): it saturates at -lo and -hi
            lo, hi = min(lo, -hi), max(hi, -lo)
        return lo, hi

    def table_rows(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """Rows ``lo .. hi`` of the (normalised) relative table: ``(R, hidden_size)``."""
        rows = self.rel_embeddings[lo : hi + 1]
        return self.rel_norm(rows) if self.rel_norm is not None else rows  # LayerNorm is row-wise

    def head_table(self, rows: Tensor, term: str, dtype: torch.dtype) -> Tensor:
        """``projection(term)(rows)`` split into heads: ``(R, width) -> (H, R, D)``."""
        out = self.projection(term)(rows).to(dtype)
        return out.view(rows.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def read_tables(
        self, q: Tensor, k: Tensor, ctx: BiasContext, rows: DistanceRows
    ) -> DeBERTaData:
        first, last = rows.first, rows.first + rows.count - 1
        rel = F.dropout(self.table_rows(first, last, q.device), self.dropout, self.training)
        data = DeBERTaData(rows=rows)
        if "c2p" in self.pos_att_type:
            data.c2p = TableRead.queries(q, self.head_table(rel, "c2p", q.dtype), first)
        if "p2c" in self.pos_att_type:
            table = self.head_table(rel, "p2c", q.dtype)
            data.p2c = TableRead.keys(k, table, first, self.num_heads)
        return data

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        data: DeBERTaData = ctx.data
        r = data.rows.at(ctx, b, i, j)
        terms = []
        if data.c2p is not None:
            terms.append(data.c2p.read(b, h, i, r))
        if data.p2c is not None:
            p2c_rows = data.rows.at(ctx, b, i, j, sign=-1) if self.paper_p2c else r
            terms.append(data.p2c.read(b, h, j, p2c_rows))
        return scaled_sum(terms, ctx.scale)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, position_buckets={self.position_buckets}, "
            f"max_relative_positions={self.max_relative_positions}, "
            f"pos_att_type={'|'.join(self.pos_att_type)}, share_att_key={self.share_att_key}, "
            f"hidden_size={self.hidden_size}, paper_p2c={self.paper_p2c}"
        )
