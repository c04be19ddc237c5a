"""DocPolarBERT relative polar self-attention (Uthayasooriyar, Ly, Vermet, Corro 2025,
"DocPolarBERT: A Pre-trained Model for Document Understanding with Relative Polar Coordinate
Encoding of Layout Structures", arXiv 2507.08606; official code buthaya/docpolarbert
``modeling_docpolarbert.py``): the relative polar coordinates between word-box centres
(distance and angle buckets) and LayoutLMv2's 1-D buckets, read by the query.

Here: the angle and distance bucket functions, quantile edges for the distance buckets
(fitted on boxes, or the data-free ``page_distance_edges``), and the encoding. Boxes:
``document.boxes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import t5_bucket
from ...validation import check_finite_tensor, check_float, check_float_sequence, check_int
from ..base import BiasContext
from ..contextual.table import RowIndex, TableRead, query_block_context
from ..options import Bool, Custom, Float, Int
from ..registry import register
from .boxes import BoxEncoding, box_centres, padding_boxes
from .layoutlmv2 import T5_BUCKETS, T5_MAX_DISTANCE, check_t5_bucket_range

__all__ = [
    "polar_angle_bucket",
    "distance_bucket",
    "quantile_edges",
    "distance_quantile_edges",
    "page_distance_edges",
    "DocPolarBERTData",
    "DocPolarBERT",
]


# ------------------------------------------------------------------------------ bucket functions
def polar_angle_bucket(
    dx: Tensor, dy: Tensor, overlap_x: Tensor, overlap_y: Tensor, num_bins: int
) -> Tensor:
    """DocPolarBERT's angle bucket (official ``group_angles``) of the key seen from the query.

    ``dx, dy`` = key centre minus query centre (y downwards). The angle is counter-clockwise
    on the page, ``a = (360 - deg(atan2(dy, dx))) mod 360``. Buckets, later rules winning:
    ``5 + floor(a / (360 / num_bins))``; boxes overlapping vertically (same line,
    ``overlap_y``): 1 ("right", ``a < 90`` or ``a > 270``) or 3 ("left", ``90 < a < 270``);
    boxes overlapping horizontally (same column, ``overlap_x``): 2 ("above", ``a < 180``)
    or 4 ("below", ``a > 180``). Bucket 0 (the token itself) and the padding bucket are set
    by the caller. Returns int64 in ``[1, num_bins + 4]``.
    """
    a = torch.remainder(360 - torch.atan2(dy, dx) * 180 / math.pi, 360)
    general = torch.div(a, 360 / num_bins, rounding_mode="floor").long() + 5
    out = general.clamp(max=num_bins + 4)
    # nested selects, no boolean & / | (they do not lower inside a CPU FlexAttention score_mod)
    left = torch.where(a > 90, torch.where(a < 270, 3, out), out)
    line = torch.where(a < 90, 1, torch.where(a > 270, 1, left))
    out = torch.where(overlap_y, line, out)
    column = torch.where(a < 180, 2, torch.where(a > 180, 4, out))
    return torch.where(overlap_x, column, out)


def distance_bucket(dist: Tensor, edges: Tensor) -> Tensor:
    """Quantile bucket of a distance: the number of ``edges`` strictly below it
    (``torch.bucketize(dist, edges, right=False)``), capped at ``len(edges) - 1`` so that a
    distance past the last edge shares the last bucket. Element-wise (FlexAttention-safe)."""
    count = (dist > edges[0]).long()
    for e in range(1, edges.shape[0]):
        count = count + (dist > edges[e]).long()
    return count.clamp(max=edges.shape[0] - 1)


def quantile_edges(values: Tensor, num_buckets: int) -> Tensor:
    """``torch.quantile(values, linspace(0, 1, num_buckets + 1))`` (linear interpolation) for
    any number of values (``torch.quantile`` refuses more than 2^24)."""
    check_int(num_buckets, "num_buckets")
    if values.numel() == 0:
        raise ValueError("quantile_edges needs at least one value")
    ordered = values.reshape(-1).sort().values
    q = torch.linspace(0, 1, num_buckets + 1, dtype=ordered.dtype, device=ordered.device)
    ranks = q * (ordered.numel() - 1)
    below = ranks.long()
    above = ranks.ceil().long()
    return ordered[below].lerp(ordered[above], ranks - below)


def distance_quantile_edges(
    query_boxes: Tensor, key_boxes: Tensor | None = None, *, num_buckets: int = 4
) -> Tensor:
    """Quantile edges ``(num_buckets + 1,)`` of the centre distances of every (query, key)
    pair without a padding box, over the whole batch (official ``group_distances``). Fit
    them once on a corpus sample and pass them as ``distance_edges``. Memory O(B Lq Lk)."""
    key_boxes = query_boxes if key_boxes is None else key_boxes
    qc, kc = box_centres(query_boxes), box_centres(key_boxes)
    diff = qc[:, :, None, :] - kc[:, None, :, :]
    dist = torch.sqrt(diff.pow(2).sum(-1))
    valid = ~(padding_boxes(query_boxes)[:, :, None] | padding_boxes(key_boxes)[:, None, :])
    if not bool(valid.any()):
        return torch.zeros(num_buckets + 1)
    return quantile_edges(dist[valid], num_buckets)


def _square_distance_cdf(s: float) -> float:
    """CDF of the distance between two uniform points of the unit square."""
    if s <= 0:
        return 0.0
    if s <= 1:
        return math.pi * s * s - 8 / 3 * s**3 + s**4 / 2
    if s >= math.sqrt(2):
        return 1.0
    root = math.sqrt(s * s - 1)
    return (
        1 / 3
        - 2 * s * s
        - s**4 / 2
        + 4 / 3 * (2 * s * s + 1) * root
        + 2 * s * s * (math.asin(1 / s) - math.acos(1 / s))
    )


def page_distance_edges(num_buckets: int, page_size: float = 1000.0) -> Tensor:
    """Quantile edges of the distance between two points drawn uniformly on a square page of
    side ``page_size``: a data-free stand-in for edges fitted on a corpus (float32,
    ``(num_buckets + 1,)``, first edge 0, last ``page_size * sqrt(2)``)."""
    check_int(num_buckets, "num_buckets")
    page_size = check_float(page_size, "page_size", above=0.0)
    edges = []
    for k in range(num_buckets + 1):
        target, lo, hi = k / num_buckets, 0.0, math.sqrt(2)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _square_distance_cdf(mid) < target else (lo, mid)
        edges.append(0.0 if k == 0 else hi * page_size)
    edges[-1] = math.sqrt(2) * page_size  # the CDF is flat at its end: bisection stops short
    return torch.tensor(edges, dtype=torch.float32)


# ------------------------------------------------------------------------------ encoding
_EDGE_MODES = ("page", "call")


def _check_distance_edges(value: object, name: str) -> str | tuple[float, ...]:
    """``"page"``, ``"call"``, or finite numbers (a sequence or a 1-D float tensor); the
    count and the order are checked against ``rel_2d_pos_bins`` by the constructor."""
    if isinstance(value, str):
        if value not in _EDGE_MODES:
            raise ValueError(
                f"{name} must be 'page', 'call' or rel_2d_pos_bins + 1 non-decreasing "
                f"floats, got {value!r}"
            )
        return value
    if isinstance(value, Tensor):
        check_finite_tensor(value, name, floating=True)
        if value.dim() != 1:
            raise ValueError(
                f"{name} must be a 1-D tensor of edges, got shape {tuple(value.shape)}"
            )
        return tuple(float(v) for v in value.tolist())
    return check_float_sequence(value, name)


@dataclass
class DocPolarBERTData:
    """Per-call data of ``docpolarbert`` (fields of switched-off terms are None).

    ``q_1d``, ``q_dist``, ``q_angle``: the 1-D, distance and angle tables read by the
    queries (``contextual.table.TableRead``: ``q @ E^T (B, H, T, rows)`` per query block,
    multiplied by the call's scale in ``bias``); ``q_boxes (B, Lq, 4)``,
    ``k_boxes (B, Lk, 4)``; ``q_centre``, ``k_centre`` ``(B, L, 2)`` float32; ``q_pad``,
    ``k_pad`` ``(B, L)`` 0/1 int64 (no box); ``edges`` the distance edges of the call."""

    q_1d: TableRead | None = None
    q_dist: TableRead | None = None
    q_angle: TableRead | None = None
    edges: Tensor | None = None
    q_boxes: Tensor | None = None
    k_boxes: Tensor | None = None
    q_centre: Tensor | None = None
    k_centre: Tensor | None = None
    q_pad: Tensor | None = None
    k_pad: Tensor | None = None


DISTANCE_EDGES = Custom(
    _check_distance_edges,
    invalid=[
        (3, TypeError),
        ("median", ValueError),
        ([math.nan] * 5, ValueError),
        ([0.0, 1.0], ValueError),
        ([0.0, 3.0, 2.0, 4.0, 5.0], ValueError),
    ],
    doc="'page', 'call' or rel_2d_pos_bins + 1 non-decreasing floats",
)


@register("docpolarbert")
class DocPolarBERT(BoxEncoding):
    """DocPolarBERT relative polar self-attention (Uthayasooriyar, Ly, Vermet, Corro 2025,
    "DocPolarBERT: A Pre-trained Model for Document Understanding with Relative Polar
    Coordinate Encoding of Layout Structures", arXiv 2507.08606; official code
    buthaya/docpolarbert ``modeling_docpolarbert.py``, read for this implementation).

    Contextual terms read by the (scaled) query, with tables shared by the heads:

    ``logit_ij += scale * q_i . ( E1[bucket(p_j - p_i)] + E2[dist_bucket(i, j)]
    + E3[angle_bucket(i, j)] )``

    * ``E1 (rel_pos_bins, D)``: 1-D T5 buckets as LayoutLMv2 (``rel_pos_bias``, an
      ``nn.Linear(bins, D)`` weight ``(D, bins)``).
    * ``E2 (rel_2d_pos_bins + 2, D)``: the Euclidean distance between box centres, bucketed
      by quantile edges ``e_0..e_n`` (``distance_bucket``: bucket 0 for ``d <= e_0``, ``n``
      for the largest); row ``n + 1`` is padding.
    * ``E3 (rel_2d_angle_bins + 6, D)``: ``polar_angle_bucket`` (general sectors 5..n+4,
      four same-line / same-column buckets 1..4); bucket 0 for the token itself (key index
      ``i + Lk - Lq``); row ``n + 5`` is padding.

    Pairs involving a token without a box (``x0 == x1 and y0 == y1``, e.g. ``[0,0,0,0]``
    for special tokens) get no distance and no angle term (the official padding rows,
    zero). Defaults are the official config's (32 / 128 / 4 / 8).

    Assumptions and deviations (official code read; paper-only details are unverified):

    * Distance edges. The official code takes the quantiles of all valid pair distances
      of the *batch* at every call, so a token's bucket depends on the other documents in
      the batch, and a KV-cache step would bucket differently from the full forward.
      ``distance_edges="call"`` reproduces that. The default ``"page"`` uses fixed edges:
      the quantiles of the distance between two uniform points on a ``page_size`` square
      page (``page_distance_edges``); pass edges fitted on your corpus
      (``distance_quantile_edges``) as a sequence for real use. Edges are a buffer
      (``distance_edges``, saved in the state dict).
    * Official bugs not reproduced: a real distance equal to the padding value (or an angle
      of ``bins + 5`` degrees) was treated as padding, and padding pairs could fall into a
      same-line / same-column bucket; the 1-D table was gathered under ``no_grad`` (never
      trained). Here padding is decided from the boxes and every table trains.
    * The official model uses CogView's PB-relax softmax; that is the same softmax in exact
      arithmetic and is not part of the encoding.
    """

    paper = "Uthayasooriyar et al. 2025 (DocPolarBERT)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        rel_pos_bins: Annotated[int, T5_BUCKETS] = 32,
        max_rel_pos: Annotated[int, T5_MAX_DISTANCE] = 128,
        rel_2d_pos_bins: Annotated[
            int, Int(minimum=1, doc="distance buckets between box centres")
        ] = 4,
        rel_2d_angle_bins: Annotated[int, Int(minimum=1, doc="general angle sectors")] = 8,
        distance_edges: Annotated[str | Sequence[float] | Tensor, DISTANCE_EDGES] = "page",
        page_size: Annotated[float, Float(above=0.0)] = 1000.0,
        has_relative_attention_bias: Annotated[bool, Bool()] = True,
        has_spatial_attention_bias: Annotated[bool, Bool()] = True,
        has_angle_attention_bias: Annotated[bool, Bool()] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if not (
            has_relative_attention_bias or has_spatial_attention_bias or has_angle_attention_bias
        ):
            raise ValueError("every term is switched off: the encoding would add nothing")
        check_t5_bucket_range(rel_pos_bins, max_rel_pos, "rel_pos_bins", "max_rel_pos")
        self.rel_pos_bins, self.max_rel_pos = rel_pos_bins, max_rel_pos
        self.rel_2d_pos_bins, self.rel_2d_angle_bins = rel_2d_pos_bins, rel_2d_angle_bins
        self.has_relative_attention_bias = has_relative_attention_bias
        self.has_spatial_attention_bias = has_spatial_attention_bias
        self.has_angle_attention_bias = has_angle_attention_bias
        pad_d, pad_a = rel_2d_pos_bins + 1, rel_2d_angle_bins + 5
        if has_relative_attention_bias:
            self.rel_pos_bias = nn.Linear(rel_pos_bins, head_dim, bias=False)
            nn.init.normal_(self.rel_pos_bias.weight, std=0.02)  # official initializer_range
        if has_spatial_attention_bias:
            self.rel_pos_2D_embedding = self._table(pad_d + 1, head_dim, pad_d)
        if has_angle_attention_bias:
            self.rel_pos_angle_embedding = self._table(pad_a + 1, head_dim, pad_a)
        if isinstance(distance_edges, str):  # "page" or "call" (checked by the option)
            self.edges_mode = distance_edges
            edges = page_distance_edges(rel_2d_pos_bins, page_size)
        else:
            self.edges_mode = "fixed"
            edges = torch.tensor(distance_edges, dtype=torch.float32)
            if edges.shape != (rel_2d_pos_bins + 1,) or bool((edges[1:] < edges[:-1]).any()):
                raise ValueError(
                    f"distance_edges must be {rel_2d_pos_bins + 1} non-decreasing floats "
                    f"(rel_2d_pos_bins + 1), got {distance_edges!r}"
                )
        self.register_buffer("distance_edges", edges)

    @staticmethod
    def _table(rows: int, dim: int, padding_idx: int) -> nn.Embedding:
        """``N(0, 0.02^2)`` rows, the padding row zero (official ``_init_weights``)."""
        table = nn.Embedding(rows, dim, padding_idx=padding_idx)
        nn.init.normal_(table.weight, std=0.02)
        with torch.no_grad():
            table.weight[padding_idx].zero_()
        return table

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> DocPolarBERTData:
        data = DocPolarBERTData()
        if self.has_relative_attention_bias:
            data.q_1d = TableRead.queries(q, self.rel_pos_bias.weight.t().to(q.dtype), 0)
        if not (self.has_spatial_attention_bias or self.has_angle_attention_bias):
            return data
        boxes = self.query_key_boxes(q, k, inputs)
        qb, kb = boxes.query, boxes.key
        data.q_boxes, data.k_boxes = qb, kb
        data.q_centre, data.k_centre = box_centres(qb), box_centres(kb)
        # 0/1 integers, not bool: boolean logic does not lower in a CPU FlexAttention score_mod
        data.q_pad, data.k_pad = padding_boxes(qb).long(), padding_boxes(kb).long()
        if self.has_spatial_attention_bias:
            data.q_dist = TableRead.queries(q, self.rel_pos_2D_embedding.weight.to(q.dtype), 0)
            if self.edges_mode == "call":
                edges = distance_quantile_edges(qb, kb, num_buckets=self.rel_2d_pos_bins)
                data.edges = edges.to(q.device)
            else:
                data.edges = self.distance_edges
        if self.has_angle_attention_bias:
            data.q_angle = TableRead.queries(q, self.rel_pos_angle_embedding.weight.to(q.dtype), 0)
        return data

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        return query_block_context(ctx, i)  # q_block @ E^T for the block's queries

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        d = ctx.data
        terms = []
        if self.has_relative_attention_bias:
            rel = ctx.k_pos[b, j] - ctx.q_pos[b, i]
            bucket = t5_bucket(rel, num_buckets=self.rel_pos_bins, max_distance=self.max_rel_pos)
            terms.append(d.q_1d.read(b, h, i, RowIndex(bucket, None, 0)))
        if self.has_spatial_attention_bias or self.has_angle_attention_bias:
            qc, kc = d.q_centre, d.k_centre  # scalar gathers per coordinate
            dx, dy = kc[b, j, 0] - qc[b, i, 0], kc[b, j, 1] - qc[b, i, 1]
            pad = (d.q_pad[b, i] + d.k_pad[b, j]) > 0
            if self.has_spatial_attention_bias:
                dist = torch.sqrt(dx * dx + dy * dy)
                term = d.q_dist.read(b, h, i, RowIndex(distance_bucket(dist, d.edges), None, 0))
                terms.append(torch.where(pad, torch.zeros_like(term), term))
            if self.has_angle_attention_bias:
                qb, kb = d.q_boxes, d.k_boxes
                # intervals [x0, x1] overlap iff min(q.x1 - k.x0, k.x1 - q.x0) >= 0
                overlap_x = torch.minimum(qb[b, i, 2] - kb[b, j, 0], kb[b, j, 2] - qb[b, i, 0]) >= 0
                overlap_y = torch.minimum(qb[b, i, 3] - kb[b, j, 1], kb[b, j, 3] - qb[b, i, 1]) >= 0
                angle = polar_angle_bucket(dx, dy, overlap_x, overlap_y, self.rel_2d_angle_bins)
                itself = j == i + (ctx.k_pos.shape[1] - ctx.q_pos.shape[1])
                term = d.q_angle.read(b, h, i, RowIndex(torch.where(itself, 0, angle), None, 0))
                masked = torch.where(pad, torch.zeros_like(term), term)
                terms.append(torch.where(itself, term, masked))
        out = terms[0]
        for term in terms[1:]:
            out = out + term
        return out * ctx.scale

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rel_pos_bins={self.rel_pos_bins}, "
            f"max_rel_pos={self.max_rel_pos}, rel_2d_pos_bins={self.rel_2d_pos_bins}, "
            f"rel_2d_angle_bins={self.rel_2d_angle_bins}, distance_edges={self.edges_mode!r}"
        )
