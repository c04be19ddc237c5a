"""Content-position attention over a projected relative-embedding table: Transformer-XL, DeBERTa.

Both add to the content logit ``q_i . k_j`` terms that pair the content of one side with a
per-head projection of a relative-position embedding, looked up at a row ``r(i, j)`` that
depends on the distance ``q_pos[i] - k_pos[j]`` only:

    Transformer-XL:  + (q_i + v) . (W_R R)[r(i, j)]  +  u . k_j
    DeBERTa:         + q_i . K^r[r(i, j)]  +  k_j . Q^r[r(i, j)]

Nothing of shape ``(L, L, D)`` is ever built. ``prepare`` evaluates the table rows the call can
reach (``R`` rows: those selected by the distances between the smallest and the largest
distance of the call), multiplies them once with the queries and keys, ``(B, H, Lq, R)`` and
``(B, H, Lk, R)`` (O(L * R) memory), and tabulates distance -> row once (a lookup of
``dmax - dmin + 1`` entries, so DeBERTa's log buckets are not recomputed per pair). ``bias``
then *gathers* per (i, j) from those products, one element-wise formula for every backend (a
full grid for eager / dense SDPA, a tile for chunked, the FlexAttention ``score_mod`` as is).
Terms that read q or k are multiplied by the call's scale (``ctx.scale``), as the backends
scale ``q . k``. Positions far apart with gaps (a sparse stream) make the lookup as long as
their distance range: bound it with ``clamp_len`` (Transformer-XL); DeBERTa's rows are bounded
by ``2 span`` anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import _check_int, sinusoidal_table
from ...registry import register
from ..base import BiasContext, Encoding

__all__ = [
    "RelativeTableAttention",
    "TransformerXL",
    "DeBERTa",
    "deberta_log_bucket",
    "deberta_relative_index",
    "gather_rows",
    "scaled_sum",
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

    ``clamp=True`` (the official "faster" version, spec §11) first clamps ``delta`` to
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
    """Row of DeBERTa's relative-embedding table for ``delta = query - key`` (spec §11).

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


def _is_grid(b: Tensor, h: Tensor, n: Tensor, axis: int) -> bool:
    """``b (Bb,1,1,1)``, ``h (1,Hh,1,1)`` and ``n`` a query (axis 2) or key (axis 3) index grid."""
    if b.dim() != 4 or h.dim() != 4 or n.dim() != 4:
        return False
    other = 5 - axis  # the grid axis of the other index
    return (
        b.shape[1:] == (1, 1, 1)
        and h.shape[0] == 1
        and h.shape[2:] == (1, 1)
        and n.shape[:2] == (1, 1)
        and n.shape[other] == 1
    )


def _select(table: Tensor, dim: int, index: Tensor) -> Tensor:
    """``table.index_select(dim, index)``; a view when ``index`` is ``start, start + 1, ...``
    (the usual grid), so neither a copy nor an ``index_add`` in backward is needed."""
    flat = index.reshape(-1)
    if flat.numel() == 0:
        return table.index_select(dim, flat)
    start = int(flat[0])
    span = torch.arange(start, start + flat.numel(), device=flat.device, dtype=flat.dtype)
    if torch.equal(flat, span):
        if start == 0 and flat.numel() == table.shape[dim]:
            return table  # the whole axis (all keys, all heads): no view, no backward copy
        return table.narrow(dim, start, flat.numel())
    return table.index_select(dim, flat)


def gather_rows(table: Tensor, b: Tensor, h: Tensor, n: Tensor, row: Tensor, axis: int) -> Tensor:
    """``table[b, h, n, row]`` for a per-call product ``table (B, H, N, R)``, where ``n`` is the
    query (``axis=2``) or key (``axis=3``) index and ``row (Bb|1, 1, T, S)`` the table row.

    Over index grids (eager, dense, chunked tiles) the batch rows, heads and rows ``n`` are
    selected first (views for the usual consecutive indices) and then gathered along ``R``:
    the backward is a ``scatter_add`` of ``T x S`` values into that selection, much cheaper
    than the accumulating ``index_put`` of advanced indexing. 0-d indices (FlexAttention) use
    plain indexing.
    """
    if row.dim() != 4 or not _is_grid(b, h, n, axis):
        return table[b, h, n, row]
    sel = _select(_select(_select(table, 2, n), 0, b), 1, h)
    rows = row.expand(sel.shape[0], sel.shape[1], row.shape[2], row.shape[3])
    if axis == 2:
        return sel.gather(-1, rows)
    return sel.gather(-1, rows.transpose(-1, -2)).transpose(-1, -2)


def scaled_sum(terms: list[Tensor], scale: float) -> Tensor:
    """``sum(terms) * scale``. The first term is a fresh gather result: over index grids, when
    it already has the full shape, the rest are added to it in place (one (B, H, T, S) tensor
    per tile instead of three); 0-d terms (FlexAttention) stay out of place."""
    out = terms[0]
    if out.dim() == 0 or torch.broadcast_shapes(*(t.shape for t in terms)) != out.shape:
        for t in terms[1:]:
            out = out + t
        return out * scale
    for t in terms[1:]:
        out.add_(t)
    return out.mul_(scale)


class RelativeTableAttention(Encoding):
    """Base of encodings whose logits pair q or k with per-head projections of a relative table.

    A subclass says which table row a distance selects (``table_key``) and what the rows are
    (``table_rows``); this class finds the rows a call reaches (``prepare_rows``), and provides
    the products with queries and keys and the gathers ``bias`` needs (``row``,
    ``gather_rows``, ``scaled_sum``).

    Shapes: ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``; per-head tables ``(H, R, D)``; products
    ``(B, H, Lq, R)`` and ``(B, H, Lk, R)`` (grouped-query keys serve every query head of their
    group).
    """

    family = "contextual"
    has_bias = True
    relative = True

    def table_key(self, distance: Tensor) -> Tensor:
        """Table row (int64) selected by ``distance = q_pos - k_pos`` (element-wise)."""
        raise NotImplementedError

    def table_rows(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """The position embeddings of rows ``lo .. hi``: ``(hi - lo + 1, width)``."""
        raise NotImplementedError

    # ----------------------------------------------------------------- shared steps
    def check_head_dim(self, x: Tensor, name: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} has head_dim {x.shape[-1]} but encoding {self.name!r} was created with "
                f"head_dim={self.head_dim}"
            )

    def prepare_rows(
        self, ctx: BiasContext, q_pos: Tensor, k_pos: Tensor, *, both_signs: bool = False
    ) -> tuple[int, int]:
        """Find the table rows the call reaches and store the distance -> row lookup in
        ``ctx.extra`` (``row_of`` over distances ``dmin .. dmax``, rows counted from the first
        one reached), so ``bias`` never recomputes ``table_key`` (DeBERTa's log buckets) per
        pair. ``both_signs`` also covers ``k_pos - q_pos``. Returns the first and last row.
        ``q_pos (B|1, Lq)``, ``k_pos (B|1, Lk)``."""
        dev = q_pos.device
        if q_pos.numel() == 0 or k_pos.numel() == 0:
            dmin = dmax = 0
        else:
            # per batch row (positions of different rows never meet), then over the batch
            dmin = int((q_pos.amin(1) - k_pos.amax(1)).min())
            dmax = int((q_pos.amax(1) - k_pos.amin(1)).max())
            if both_signs:
                dmin, dmax = min(dmin, -dmax), max(dmax, -dmin)
        keys = self.table_key(torch.arange(dmin, dmax + 1, device=dev))
        lo, hi = int(keys.min()), int(keys.max())
        ctx.extra["row_of"] = keys - lo
        ctx.extra["dmin"] = torch.tensor(dmin, dtype=torch.int64, device=dev)
        return lo, hi

    def row(self, ctx: BiasContext, distance: Tensor) -> Tensor:
        """Row (from the first row of the call) that ``distance`` selects."""
        return ctx.extra["row_of"][distance - ctx.extra["dmin"]]

    def head_table(self, rows: Tensor, proj: nn.Linear, dtype: torch.dtype) -> Tensor:
        """``proj(rows)`` split into heads: ``(R, width) -> (H, R, D)`` in ``dtype``."""
        out = proj(rows).to(dtype)
        return out.view(rows.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def against_keys(self, k: Tensor, table: Tensor) -> Tensor:
        """``k_j . table[h, r]`` for every query head h: ``(B, H, Lk, R)`` from
        ``k (B, Hkv, Lk, D)`` and ``table (H, R, D)``; key head ``h // (H / Hkv)`` serves h."""
        B, Hkv, Lk, D = k.shape
        H, R = table.shape[:2]
        grouped = table.reshape(Hkv, H // Hkv, R, D).transpose(-1, -2)  # (Hkv, g, D, R)
        return torch.matmul(k[:, :, None], grouped).reshape(B, H, Lk, R)

    def distance(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return ctx.q_pos[b, i] - ctx.k_pos[b, j]


# ---------------------------------------------------------------------------- Transformer-XL
@register("transformer-xl")
class TransformerXL(RelativeTableAttention):
    """Transformer-XL relative attention (Dai et al. 2019, arXiv 1901.02860;
    kimiyoung/transformer-xl ``RelPartialLearnableMultiHeadAttn``; spec §10, Authority A).

    ``logit_ij = [ q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j} ] * scale``, i.e.
    ``(q_i + u).k_j + (q_i + v).(W_R R_{i-j})``, scale ``1/sqrt(d)`` on the sum; ``i - j`` is
    ``q_pos - k_pos``.

    * ``R_t = [sin(t w), cos(t w)]`` (concatenated, not interleaved), ``w_k = base^(-2k/d_model)``,
      dimension ``d_model`` (default ``H * head_dim``).
    * ``W_R`` = ``r_net`` (``Linear(d_model, H * head_dim, bias=False)``), ``u`` = ``r_w_bias``
      and ``v`` = ``r_r_bias`` ``(H, head_dim)``, all ``N(0, init_std^2)`` (0.02, the official
      ``--init normal``). The official model shares ``u, v`` across layers and has one ``W_R`` per
      layer: ``TransformerLM(share_encoding=True)`` shares all three, ``False`` none.
    * ``clamp_len``: distances beyond ``±clamp_len`` use ``R_{±clamp_len}`` (official:
      ``pos_seq.clamp_(max=clamp_len)``). ``dropout`` is applied to ``R`` in training (official
      ``drop(pos_emb)``).

    Beyond the paper: distances may be negative (keys after the query, non-causal use); the
    sinusoid is evaluated there too, as XLNet's bidirectional form does. The official code
    computes only ``i - j >= 0`` (``_rel_shift``; the rest is masked). Keys may precede the
    queries (memory, ``Lk > Lq``: queries default to the last ``Lq`` key positions); see
    ``relpos.nn.SegmentRecurrence`` for the segment-level recurrence.

    Per call: ``qr = (q + v) . (W_R R)^T`` over the ``R`` distances of the call
    ``(B, H, Lq, R)`` and ``u.k (B, H, Lk)``; ``bias`` gathers ``qr[b, h, i, d_ij]``.
    """

    paper = "Dai et al. 2019 (Transformer-XL)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        d_model: int | None = None,
        clamp_len: int | None = None,
        base: float = 10000.0,
        dropout: float = 0.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        d_model = num_heads * head_dim if d_model is None else d_model
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0 or d_model % 2:
            raise ValueError(f"d_model must be a positive even int, got {d_model!r}")
        if clamp_len is not None and (
            isinstance(clamp_len, bool) or not isinstance(clamp_len, int) or clamp_len < 0
        ):
            raise ValueError(f"clamp_len must be a non-negative int or None, got {clamp_len!r}")
        if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 1:
            raise ValueError(f"base must be a number > 1, got {base!r}")
        _check_dropout(dropout)
        self.d_model, self.clamp_len, self.base = d_model, clamp_len, float(base)
        self.dropout = float(dropout)
        self.r_net = nn.Linear(d_model, num_heads * head_dim, bias=False)
        nn.init.normal_(self.r_net.weight, std=init_std)
        self.r_w_bias = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # u
        self.r_r_bias = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)  # v

    def table_key(self, distance: Tensor) -> Tensor:
        d = distance.to(torch.int64)
        if self.clamp_len is not None:
            d = d.clamp(-self.clamp_len, self.clamp_len)
        return d

    def table_rows(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """``R_t`` for ``t = lo .. hi``: ``(R, d_model)``, ``[sin(t w), cos(t w)]``."""
        t = torch.arange(lo, hi + 1, device=device)
        table = sinusoidal_table(t, self.d_model, self.base)  # interleaved sin, cos
        return torch.cat((table[..., 0::2], table[..., 1::2]), dim=-1)

    def prepare(self, q, k, q_pos, k_pos, inputs=None) -> BiasContext:
        self.check_head_dim(q, "q")
        self.check_head_dim(k, "k")
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        lo, hi = self.prepare_rows(ctx, ctx.q_pos, ctx.k_pos)
        rows = self.table_rows(lo, hi, q.device).to(self.r_net.weight.dtype)
        rows = F.dropout(rows, self.dropout, self.training)
        table = self.head_table(rows, self.r_net, q.dtype)  # (H, R, D)
        v_bias = self.r_r_bias.to(q.dtype)[None, :, None, :]
        ctx.extra["qr"] = torch.matmul(q + v_bias, table.transpose(-1, -2))  # (B, H, Lq, R)
        u = self.r_w_bias.to(q.dtype)[:, None, :]  # (H, 1, D)
        ctx.extra["uk"] = self.against_keys(k, u)[..., 0]  # (B, H, Lk)
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        row = self.row(ctx, self.distance(ctx, b, i, j))
        qr = gather_rows(ctx.extra["qr"], b, h, i, row, axis=2)
        return scaled_sum([qr, ctx.extra["uk"][b, h, j]], ctx.scale)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, d_model={self.d_model}, clamp_len={self.clamp_len}, "
            f"dropout={self.dropout}"
        )


# ---------------------------------------------------------------------------- DeBERTa
_POS_TYPES = ("c2p", "p2c")


def _check_dropout(p: object) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {p!r}")


def _pos_att_type(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [x for x in value.lower().replace(",", "|").split("|") if x.strip()]
    if not isinstance(value, Sequence) or not all(isinstance(x, str) for x in value):
        raise ValueError(
            f"pos_att_type must be a subset of {list(_POS_TYPES)} (a list or 'c2p|p2c'), "
            f"got {value!r}"
        )
    types = tuple(dict.fromkeys(x.strip().lower() for x in value))
    unknown = [x for x in types if x not in _POS_TYPES]
    if unknown or not types:
        hint = " (p2p is not in the DeBERTa v2/v3 code)" if "p2p" in unknown else ""
        raise ValueError(
            f"pos_att_type must be a non-empty subset of {list(_POS_TYPES)}, got {value!r}{hint}"
        )
    return types


@register("deberta")
class DeBERTa(RelativeTableAttention):
    """DeBERTa disentangled attention, v2/v3 code (He et al. 2021, arXiv 2006.03654;
    microsoft/DeBERTa and transformers ``DisentangledSelfAttention``; spec §11, Authority A).

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

    Per call: the rows ``lo .. hi`` the call's distances reach (``R <= 2 span``),
    ``qr = q . K^r (B, H, Lq, R)`` and ``kr = k . Q^r (B, H, Lk, R)``; ``bias`` gathers them.
    """

    paper = "He et al. 2021 (DeBERTa)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        position_buckets: int = 256,
        max_relative_positions: int = 512,
        pos_att_type: str | Sequence[str] = ("c2p", "p2c"),
        share_att_key: bool = False,
        hidden_size: int | None = None,
        norm_rel_embeddings: bool = True,
        layer_norm_eps: float = 1e-7,
        paper_p2c: bool = False,
        clamp_buckets: bool = True,
        dropout: float = 0.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if isinstance(position_buckets, bool) or not isinstance(position_buckets, int):
            raise ValueError(
                f"position_buckets must be an int (<= 0: none), got {position_buckets!r}"
            )
        _check_int(max_relative_positions, "max_relative_positions")
        if position_buckets > 0 and not (
            position_buckets >= 2 and max_relative_positions - 1 > position_buckets // 2
        ):
            raise ValueError(
                f"log buckets need position_buckets >= 2 and max_relative_positions - 1 > "
                f"position_buckets // 2, got position_buckets={position_buckets}, "
                f"max_relative_positions={max_relative_positions}"
            )
        hidden_size = num_heads * head_dim if hidden_size is None else hidden_size
        _check_int(hidden_size, "hidden_size")
        _check_dropout(dropout)
        for flag, value in (
            ("share_att_key", share_att_key),
            ("norm_rel_embeddings", norm_rel_embeddings),
            ("paper_p2c", paper_p2c),
            ("clamp_buckets", clamp_buckets),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be a bool, got {value!r}")
        self.position_buckets = max(position_buckets, -1)
        self.max_relative_positions = max_relative_positions
        self.span = position_buckets if position_buckets > 0 else max_relative_positions
        self.pos_att_type = _pos_att_type(pos_att_type)
        self.share_att_key = share_att_key
        self.hidden_size = hidden_size
        self.paper_p2c = paper_p2c
        self.clamp_buckets = clamp_buckets
        self.dropout = float(dropout)
        # computed here, outside any trace (FlexAttention's score_mod calls table_key)
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

    def table_key(self, distance: Tensor) -> Tensor:
        return _relative_index(
            distance,
            self.position_buckets,
            self.max_relative_positions,
            self.clamp_buckets,
            self._log_ratio,
        )

    def table_rows(self, lo: int, hi: int, device: torch.device) -> Tensor:
        """Rows ``lo .. hi`` of the (normalised) relative table: ``(R, hidden_size)``."""
        rows = self.rel_embeddings[lo : hi + 1]
        return self.rel_norm(rows) if self.rel_norm is not None else rows  # LayerNorm is row-wise

    def prepare(self, q, k, q_pos, k_pos, inputs=None) -> BiasContext:
        self.check_head_dim(q, "q")
        self.check_head_dim(k, "k")
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        both = self.paper_p2c and "p2c" in self.pos_att_type
        lo, hi = self.prepare_rows(ctx, ctx.q_pos, ctx.k_pos, both_signs=both)
        rows = F.dropout(self.table_rows(lo, hi, q.device), self.dropout, self.training)
        if "c2p" in self.pos_att_type:
            table = self.head_table(rows, self.projection("c2p"), q.dtype)
            ctx.extra["qr"] = torch.matmul(q, table.transpose(-1, -2))  # (B, H, Lq, R)
        if "p2c" in self.pos_att_type:
            table = self.head_table(rows, self.projection("p2c"), q.dtype)
            ctx.extra["kr"] = self.against_keys(k, table)  # (B, H, Lk, R)
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        delta = self.distance(ctx, b, i, j)
        row = self.row(ctx, delta)
        terms = []
        if "c2p" in self.pos_att_type:
            terms.append(gather_rows(ctx.extra["qr"], b, h, i, row, axis=2))
        if "p2c" in self.pos_att_type:
            p2c_row = self.row(ctx, -delta) if self.paper_p2c else row
            terms.append(gather_rows(ctx.extra["kr"], b, h, j, p2c_row, axis=3))
        return scaled_sum(terms, ctx.scale)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, position_buckets={self.position_buckets}, "
            f"max_relative_positions={self.max_relative_positions}, "
            f"pos_att_type={'|'.join(self.pos_att_type)}, share_att_key={self.share_att_key}, "
            f"hidden_size={self.hidden_size}, paper_p2c={self.paper_p2c}"
        )
