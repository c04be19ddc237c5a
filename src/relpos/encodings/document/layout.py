"""Document-layout encodings: relative positions between the bounding boxes of words.

* ``layoutlmv2`` — LayoutLMv2's 1-D bucket bias plus 2-D x / y bucket biases (learned scalars).
* ``docpolarbert`` — DocPolarBERT's relative polar coordinates between box centres (distance
  and angle buckets) read by the query, plus the same 1-D buckets.

Boxes arrive per call as ``relpos.attention(..., inputs={"boxes": (B|1, Lk, 4)})``: integer
``(x0, y0, x1, y1)`` of every key token (LayoutLM's page coordinates ``0..1000``; y grows
downwards). Queries are the last ``Lq`` tokens of the keys (the default positions' rule, so a
KV-cache step reads the same boxes), or ``inputs["query_boxes"] (B|1, Lq, 4)`` when given.
1-D token positions are the usual ``q_pos`` / ``k_pos``. Relative positions are key minus
query (``j - i``), as in both official codes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ...functional import _check_bool, _check_int, t5_bucket
from ...registry import register
from ..base import BiasContext, Encoding

__all__ = [
    "example_boxes",
    "box_centres",
    "padding_boxes",
    "polar_angle_bucket",
    "distance_bucket",
    "quantile_edges",
    "distance_quantile_edges",
    "page_distance_edges",
    "LayoutLMv2Bias",
    "DocPolarBERT",
]

_BOX_FORM = "(B|1, Lk, 4) integer boxes (x0, y0, x1, y1) of the keys, x0 <= x1, y0 <= y1"
_QUERY_BOX_FORM = "(B|1, Lq, 4) integer boxes of the queries (default: the last Lq key boxes)"


# ------------------------------------------------------------------------------ pure functions
def example_boxes(batch: int, length: int, generator: torch.Generator) -> Tensor:
    """Random word boxes ``(batch, length, 4)`` on a 1000 x 1000 page; token 0 has the
    ``[0, 0, 0, 0]`` box of a special token (CLS). Drawn token by token, so the boxes of
    the first ``n`` tokens do not depend on ``length`` (KV-cache tests)."""
    raw = torch.randint(0, 10_000, (length, batch, 4), generator=generator)
    x0, y0 = raw[..., 0] % 900, raw[..., 1] % 950
    x1, y1 = x0 + raw[..., 2] % 100, y0 + raw[..., 3] % 40
    boxes = torch.stack((x0, y0, x1, y1), dim=-1).transpose(0, 1).contiguous()
    boxes[:, :1] = 0
    return boxes


def box_centres(boxes: Tensor) -> Tensor:
    """``((x0 + x1) / 2, (y0 + y1) / 2)``: ``(..., 2)`` float32 (exact for coordinates below
    2^23)."""
    return (boxes[..., :2] + boxes[..., 2:]).to(torch.float32) / 2


def padding_boxes(boxes: Tensor) -> Tensor:
    """Tokens without a box (special tokens, padding): ``x0 == x1`` and ``y0 == y1``."""
    return (boxes[..., 0] == boxes[..., 2]) & (boxes[..., 1] == boxes[..., 3])


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
    edges = []
    for k in range(num_buckets + 1):
        target, lo, hi = k / num_buckets, 0.0, math.sqrt(2)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _square_distance_cdf(mid) < target else (lo, mid)
        edges.append(0.0 if k == 0 else hi * page_size)
    edges[-1] = math.sqrt(2) * page_size  # the CDF is flat at its end: bisection stops short
    return torch.tensor(edges, dtype=torch.float32)


# ------------------------------------------------------------------------------ base class
class BoxEncoding(Encoding):
    """Base: reads ``inputs["boxes"]`` (and optional ``inputs["query_boxes"]``)."""

    family = "bias"
    has_bias = True
    relative = True  # 1-D terms read q_pos - k_pos; box terms do not read positions at all
    required_inputs: ClassVar[dict[str, str]] = {"boxes": _BOX_FORM}
    optional_inputs: ClassVar[dict[str, str]] = {"query_boxes": _QUERY_BOX_FORM}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        return {"boxes": example_boxes(batch, length_k, generator)}

    @staticmethod
    def _check_boxes(boxes: Tensor, name: str, form: str, batch: int, length: int) -> Tensor:
        if boxes.dim() != 3 or boxes.shape[-1] != 4:
            raise ValueError(f"{name} must have shape {form}, got {tuple(boxes.shape)}")
        if boxes.shape[1] != length or boxes.shape[0] not in (1, batch):
            raise ValueError(
                f"{name} has shape {tuple(boxes.shape)} but the call has batch {batch} and "
                f"length {length}; expected {form}"
            )
        if boxes.is_floating_point() or boxes.is_complex() or boxes.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor {form}, got dtype {boxes.dtype}")
        if bool((boxes[..., 2] < boxes[..., 0]).any() or (boxes[..., 3] < boxes[..., 1]).any()):
            raise ValueError(f"{name} must have x0 <= x1 and y0 <= y1 in every box ({form})")
        return boxes.expand(batch, -1, -1)

    def query_key_boxes(
        self, q: Tensor, k: Tensor, inputs: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """Validated ``(B, Lq, 4)`` query boxes and ``(B, Lk, 4)`` key boxes on q's device."""
        inputs = inputs or {}
        if "boxes" not in inputs:
            raise ValueError(f"encoding {self.name!r} needs inputs={{'boxes': {_BOX_FORM}}}")
        batch, lq, lk = q.shape[0], q.shape[2], k.shape[2]
        keys = self._check_boxes(inputs["boxes"], "inputs['boxes']", _BOX_FORM, batch, lk)
        if "query_boxes" in inputs:
            queries = self._check_boxes(
                inputs["query_boxes"], "inputs['query_boxes']", _QUERY_BOX_FORM, batch, lq
            )
        elif lq <= lk:
            queries = keys[:, lk - lq :]
        else:
            raise ValueError(
                f"more queries ({lq}) than keys ({lk}): pass inputs['query_boxes'] "
                f"{_QUERY_BOX_FORM}"
            )
        return queries.to(q.device).contiguous(), keys.to(q.device).contiguous()


@register("layoutlmv2")
class LayoutLMv2Bias(BoxEncoding):
    """LayoutLMv2 spatial-aware self-attention (Xu et al. 2021, "LayoutLMv2: Multi-modal
    Pre-training for Visually-rich Document Understanding", arXiv 2012.14740; HF
    ``LayoutLMv2Encoder``, microsoft/unilm ``layoutlmft``).

    ``b_h(i, j) = W1[h, bucket(p_j - p_i; rel_pos_bins, max_rel_pos)]
    + Wx[h, bucket(x0_j - x0_i; rel_2d_pos_bins, max_rel_2d_pos)]
    + Wy[h, bucket(y1_j - y1_i; rel_2d_pos_bins, max_rel_2d_pos)]``,
    added after the ``1/sqrt(d)`` scaling. ``bucket`` is the bidirectional T5 bucket
    (``functional.t5_bucket``, identical to LayoutLMv2's ``relative_position_bucket``: tested
    against transformers). x uses the *left* edge ``x0`` and y the *bottom* edge ``y1`` of the
    boxes, as the official code does (``bbox[:, :, 0]``, ``bbox[:, :, 3]``). Tables are the
    official ``nn.Linear(bins, H, bias=False)`` weights ``(H, bins)`` (``rel_pos_bias``,
    ``rel_pos_x_bias``, ``rel_pos_y_bias``: the same names, so encoder weights load
    directly), initialised ``N(0, 0.02^2)``; defaults are the LayoutLMv2 config's.
    The transformers port gathers the tables under ``torch.no_grad()`` (they never train);
    the official code (one-hot @ weight) and relpos train them.
    """

    paper = "Xu et al. 2021 (LayoutLMv2)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        rel_pos_bins: int = 32,
        max_rel_pos: int = 128,
        rel_2d_pos_bins: int = 64,
        max_rel_2d_pos: int = 256,
        has_relative_attention_bias: bool = True,
        has_spatial_attention_bias: bool = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.rel_pos_bins = _check_int(rel_pos_bins, "rel_pos_bins")
        self.max_rel_pos = _check_int(max_rel_pos, "max_rel_pos")
        self.rel_2d_pos_bins = _check_int(rel_2d_pos_bins, "rel_2d_pos_bins")
        self.max_rel_2d_pos = _check_int(max_rel_2d_pos, "max_rel_2d_pos")
        self.has_relative_attention_bias = _check_bool(
            has_relative_attention_bias, "has_relative_attention_bias"
        )
        self.has_spatial_attention_bias = _check_bool(
            has_spatial_attention_bias, "has_spatial_attention_bias"
        )
        if not (self.has_relative_attention_bias or self.has_spatial_attention_bias):
            raise ValueError(
                "has_relative_attention_bias and has_spatial_attention_bias are both False: "
                "the encoding would add nothing"
            )
        if self.has_relative_attention_bias:
            self.rel_pos_bias = nn.Linear(rel_pos_bins, num_heads, bias=False)
            nn.init.normal_(self.rel_pos_bias.weight, std=0.02)
        if self.has_spatial_attention_bias:
            self.rel_pos_x_bias = nn.Linear(rel_2d_pos_bins, num_heads, bias=False)
            self.rel_pos_y_bias = nn.Linear(rel_2d_pos_bins, num_heads, bias=False)
            nn.init.normal_(self.rel_pos_x_bias.weight, std=0.02)
            nn.init.normal_(self.rel_pos_y_bias.weight, std=0.02)

    def bucket_1d(self, relative_position: Tensor) -> Tensor:
        """Bucket of ``p_j - p_i``."""
        return t5_bucket(
            relative_position, num_buckets=self.rel_pos_bins, max_distance=self.max_rel_pos
        )

    def bucket_2d(self, relative_coordinate: Tensor) -> Tensor:
        """Bucket of ``x_j - x_i`` (or ``y``)."""
        return t5_bucket(
            relative_coordinate,
            num_buckets=self.rel_2d_pos_bins,
            max_distance=self.max_rel_2d_pos,
        )

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        if self.has_spatial_attention_bias:
            qb, kb = self.query_key_boxes(q, k, inputs)
            x, y = (0, 3)  # the official x0 and y1
            ctx.extra.update(
                q_x=qb[..., x].contiguous(),
                q_y=qb[..., y].contiguous(),
                k_x=kb[..., x].contiguous(),
                k_y=kb[..., y].contiguous(),
            )
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        out = None
        if self.has_relative_attention_bias:
            rel = ctx.k_pos[b, j] - ctx.q_pos[b, i]
            out = self.rel_pos_bias.weight[h, self.bucket_1d(rel)]
        if self.has_spatial_attention_bias:
            ex = ctx.extra
            x = self.rel_pos_x_bias.weight[h, self.bucket_2d(ex["k_x"][b, j] - ex["q_x"][b, i])]
            y = self.rel_pos_y_bias.weight[h, self.bucket_2d(ex["k_y"][b, j] - ex["q_y"][b, i])]
            out = x + y if out is None else out + x + y
        assert out is not None
        return out

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rel_pos_bins={self.rel_pos_bins}, "
            f"max_rel_pos={self.max_rel_pos}, rel_2d_pos_bins={self.rel_2d_pos_bins}, "
            f"max_rel_2d_pos={self.max_rel_2d_pos}"
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

    Assumptions and deviations (Authority A code, C paper details):

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

    family = "contextual"

    paper = "Uthayasooriyar et al. 2025 (DocPolarBERT)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        rel_pos_bins: int = 32,
        max_rel_pos: int = 128,
        rel_2d_pos_bins: int = 4,
        rel_2d_angle_bins: int = 8,
        distance_edges: str | Sequence[float] | Tensor = "page",
        page_size: float = 1000.0,
        has_relative_attention_bias: bool = True,
        has_spatial_attention_bias: bool = True,
        has_angle_attention_bias: bool = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.rel_pos_bins = _check_int(rel_pos_bins, "rel_pos_bins")
        self.max_rel_pos = _check_int(max_rel_pos, "max_rel_pos")
        self.rel_2d_pos_bins = _check_int(rel_2d_pos_bins, "rel_2d_pos_bins")
        self.rel_2d_angle_bins = _check_int(rel_2d_angle_bins, "rel_2d_angle_bins")
        self.has_relative_attention_bias = _check_bool(
            has_relative_attention_bias, "has_relative_attention_bias"
        )
        self.has_spatial_attention_bias = _check_bool(
            has_spatial_attention_bias, "has_spatial_attention_bias"
        )
        self.has_angle_attention_bias = _check_bool(
            has_angle_attention_bias, "has_angle_attention_bias"
        )
        if not (
            self.has_relative_attention_bias
            or self.has_spatial_attention_bias
            or self.has_angle_attention_bias
        ):
            raise ValueError("every term is switched off: the encoding would add nothing")
        if isinstance(page_size, bool) or not isinstance(page_size, (int, float)) or page_size <= 0:
            raise ValueError(f"page_size must be a positive number, got {page_size!r}")
        pad_d, pad_a = rel_2d_pos_bins + 1, rel_2d_angle_bins + 5
        if self.has_relative_attention_bias:
            self.rel_pos_bias = nn.Linear(rel_pos_bins, head_dim, bias=False)
            nn.init.normal_(self.rel_pos_bias.weight, std=0.02)  # official initializer_range
        if self.has_spatial_attention_bias:
            self.rel_pos_2D_embedding = self._table(pad_d + 1, head_dim, pad_d)
        if self.has_angle_attention_bias:
            self.rel_pos_angle_embedding = self._table(pad_a + 1, head_dim, pad_a)
        self.edges_mode = "fixed"
        if isinstance(distance_edges, str):
            if distance_edges not in ("page", "call"):
                raise ValueError(
                    f"distance_edges must be 'page', 'call' or {rel_2d_pos_bins + 1} "
                    f"increasing floats, got {distance_edges!r}"
                )
            self.edges_mode = distance_edges
            edges = page_distance_edges(rel_2d_pos_bins, float(page_size))
        else:
            edges = torch.as_tensor(distance_edges, dtype=torch.float32)
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

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        ex = ctx.extra
        if self.has_relative_attention_bias:
            ex["q_1d"] = torch.matmul(q, self.rel_pos_bias.weight.to(q.dtype))
        if not (self.has_spatial_attention_bias or self.has_angle_attention_bias):
            return ctx
        qb, kb = self.query_key_boxes(q, k, inputs)
        ex.update(q_boxes=qb, k_boxes=kb, q_centre=box_centres(qb), k_centre=box_centres(kb))
        # 0/1 integers, not bool: boolean logic does not lower in a CPU FlexAttention score_mod
        ex.update(q_pad=padding_boxes(qb).long(), k_pad=padding_boxes(kb).long())
        if self.has_spatial_attention_bias:
            ex["q_dist"] = torch.matmul(q, self.rel_pos_2D_embedding.weight.t().to(q.dtype))
            if self.edges_mode == "call":
                edges = distance_quantile_edges(qb, kb, num_buckets=self.rel_2d_pos_bins)
                ex["edges"] = edges.to(q.device)
            else:
                ex["edges"] = self.distance_edges
        if self.has_angle_attention_bias:
            ex["q_angle"] = torch.matmul(q, self.rel_pos_angle_embedding.weight.t().to(q.dtype))
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        ex = ctx.extra
        terms = []
        if self.has_relative_attention_bias:
            rel = ctx.k_pos[b, j] - ctx.q_pos[b, i]
            bucket = t5_bucket(rel, num_buckets=self.rel_pos_bins, max_distance=self.max_rel_pos)
            terms.append(ex["q_1d"][b, h, i, bucket])
        if self.has_spatial_attention_bias or self.has_angle_attention_bias:
            qc, kc = ex["q_centre"], ex["k_centre"]  # scalar gathers per coordinate
            dx, dy = kc[b, j, 0] - qc[b, i, 0], kc[b, j, 1] - qc[b, i, 1]
            pad = (ex["q_pad"][b, i] + ex["k_pad"][b, j]) > 0
            if self.has_spatial_attention_bias:
                dist = torch.sqrt(dx * dx + dy * dy)
                term = ex["q_dist"][b, h, i, distance_bucket(dist, ex["edges"])]
                terms.append(torch.where(pad, torch.zeros_like(term), term))
            if self.has_angle_attention_bias:
                qb, kb = ex["q_boxes"], ex["k_boxes"]
                # intervals [x0, x1] overlap iff min(q.x1 - k.x0, k.x1 - q.x0) >= 0
                overlap_x = torch.minimum(qb[b, i, 2] - kb[b, j, 0], kb[b, j, 2] - qb[b, i, 0]) >= 0
                overlap_y = torch.minimum(qb[b, i, 3] - kb[b, j, 1], kb[b, j, 3] - qb[b, i, 1]) >= 0
                angle = polar_angle_bucket(dx, dy, overlap_x, overlap_y, self.rel_2d_angle_bins)
                itself = j == i + (ctx.k_pos.shape[1] - ctx.q_pos.shape[1])
                term = ex["q_angle"][b, h, i, torch.where(itself, 0, angle)]
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
