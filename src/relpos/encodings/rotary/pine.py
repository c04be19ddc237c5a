"""PINE (Z. Wang et al. 2024, arXiv 2407.01100): position-invariant inference, a selecting
piecewise RoPE schedule (``pine``). See ``PINE``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..base import BiasContext
from ..registry import register
from .rope import rotate_pairs
from .schedules import PiecewiseRoPE

__all__ = ["PINE", "PineSelection", "pine_layout", "document_shifts"]

#: query rows per block of the importance computation (its logits are rows x Lk)
IMPORTANCE_ROWS = 512


@dataclass
class PineLayout:
    """The PINE layout of a batch of segment ids (``pine_layout``).

    ``segments (B, Lk)`` (keys past the given ids are suffix), ``positions (B, Lk)`` the
    right-aligned positions, ``lengths (B, N)`` document lengths (0 for documents a row does
    not have), ``documents (B,)`` the number ``n`` of documents of each row."""

    segments: Tensor
    positions: Tensor
    lengths: Tensor
    documents: Tensor

    @property
    def is_document(self) -> Tensor:
        """``(B, Lk)``: the key lies in a document."""
        return (self.segments >= 0) & (self.segments < self.documents[:, None])


def pine_layout(segments: Tensor, length: int) -> PineLayout:
    """PINE's positions for segment ids ``(B, Ls)`` (``-1`` prefix, ``0 .. n-1`` documents in
    order, ``n`` the suffix) over ``length >= Ls`` keys (keys past ``Ls`` are suffix: generated
    tokens). Prefix and suffix keep their index; every document is right-aligned to end at
    ``P + T - 1`` (``P`` prefix tokens, ``T`` document tokens): document ``d`` of length
    ``l_d`` holds positions ``P + T - l_d .. P + T - 1`` (``ps_call`` of the official
    tokenizer). Checks the ids (``ValueError`` naming ``inputs['segments']``)."""
    _check_segments(segments, length)
    B, Ls = segments.shape
    suffix = segments[:, -1:]  # the row's last id is its suffix
    seg = torch.cat([segments, suffix.expand(B, length - Ls)], dim=1).long()
    n = suffix[:, 0].long()
    N = int(n.max()) if B else 0
    docs = torch.arange(max(N, 1), device=seg.device)
    onehot = seg[:, :, None] == docs  # (B, Lk, N)
    lengths = onehot.sum(1) * (docs < n[:, None])  # (B, N)
    prefix = (seg == -1).sum(1)  # (B,)
    total = lengths.sum(1)
    start = prefix[:, None] + torch.cumsum(lengths, 1) - lengths  # first index of each doc
    j = torch.arange(length, device=seg.device).expand(B, length)
    d = seg.clamp(0, max(N, 1) - 1)
    in_doc = (seg >= 0) & (seg < n[:, None])
    doc_pos = (prefix + total)[:, None] - lengths.gather(1, d) + (j - start.gather(1, d))
    positions = torch.where(in_doc, doc_pos, j)
    return PineLayout(seg, positions, lengths[:, :N], n)


def _check_segments(segments: object, length: int) -> None:
    form = "(B, Ls) integer ids: -1 prefix, 0..n-1 documents in order, n the suffix"
    if not isinstance(segments, Tensor):
        raise TypeError(f"inputs['segments'] must be a tensor {form}")
    if segments.dim() != 2 or segments.dtype.is_floating_point or segments.dtype == torch.bool:
        raise ValueError(
            f"inputs['segments'] must be {form}, got {segments.dtype} {tuple(segments.shape)}"
        )
    if segments.shape[1] == 0 or segments.shape[1] > length:
        raise ValueError(
            f"inputs['segments'] must cover 1 .. Lk = {length} keys (later keys are suffix), "
            f"got {segments.shape[1]}"
        )
    step = segments[:, 1:] - segments[:, :-1]
    if bool((segments < -1).any()) or bool(((step != 0) & (step != 1)).any()):
        raise ValueError(
            f"inputs['segments'] must be {form}: ids from -1 rising by 0 or 1 along each row "
            f"(prefix, documents 0, 1, ..., then the suffix)"
        )
    if bool((segments[:, -1] < 0).any()):
        raise ValueError(f"inputs['segments'] must end in the suffix (id n >= 0): {form}")


def document_shifts(order: Tensor, lengths: Tensor) -> Tensor:
    """``shift (..., N)``: the summed lengths of the documents ranked before each document,
    for rankings ``order (..., N)`` (document ids, most important first) and ``lengths
    (..., N)`` (broadcasting). Example: ranking ``[2, 0, 1]`` of lengths ``[3, 2, 4]`` gives
    ``[4, 7, 0]``."""
    lengths = lengths.expand(order.shape)
    ranked = lengths.gather(-1, order)
    before = torch.cumsum(ranked, -1) - ranked
    return torch.empty_like(before).scatter_(-1, order, before)


@dataclass
class PineSelection:
    """The per-call layout of ``pine`` (``ctx.data``): ``shift (B, H, Lq, N)`` of every
    document for every query and head, the key layout, the queries' positions ``q_pos (B, Lq)``
    and ``alive (B, Lq)`` (queries with a key of their own; the others see no key)."""

    shift: Tensor
    layout: PineLayout
    q_pos: Tensor
    q_segment: Tensor
    alive: Tensor


@register("pine")
class PINE(PiecewiseRoPE):
    """PINE: position-invariant inference (Z. Wang, Zhang, Kim, Ma, Ghazvininejad, Neubig 2024,
    "Eliminating Position Bias of Language Models: A Mechanistic Approach", arXiv 2407.01100;
    official code wzq016/PINE, ``pine/models/llama/modeling_llama.py``
    ``LlamaAttentionWithPS.forward`` and ``tokenization_llama.py`` ``ps_call``, read).

    Position bias comes from causal attention and from RoPE; PINE makes the documents of a
    prompt ``[prefix | D_1 .. D_n | suffix]`` attend to each other bidirectionally and places
    them, per layer, head and query, in the order of the model's own attention, so the output
    does not depend on the order the documents were given in. Training-free.

    Layout (``pine_layout``): prefix ``0 .. P-1``; every document right-aligned to end at
    ``P + T - 1``; suffix from ``P + T``. Per head ``h`` and query ``i`` (raw, unrotated
    ``q . k / sqrt(d)``):

    * a query of document ``e``: softmax over the document keys with its own document masked,
      the per-document mean of the weights, summed over ``e``'s queries: ``W[e, d]``;
      ``W[e, e] = +max``; documents sorted by ``W[e, .]`` descending (stable);
    * a suffix (or generated) query: softmax over the document keys, per-document mean, sorted
      per token;
    * ``shift(i, d)`` = the summed lengths of the documents ranked before ``d``
      (``document_shifts``); document keys sit at ``p_j - shift(i, d_j)``, prefix and suffix
      keys at ``p_j``; a key is masked when its position exceeds the query's. So a document
      sees its own document causally and every other document and the prefix fully, never the
      suffix; the suffix sees everything before it; the prefix is plain causal RoPE.

    relpos form: a selecting piecewise schedule. Piece ``d < N`` scores the
    keys of document ``d`` with the query rotated at ``p_i + shift(h, i, d)`` against keys
    rotated at their layout position (``<R(p_i + s) q, R(p_j) k> = <R(p_i) q, R(p_j - s) k>``:
    per-head key positions as per-head query rotations); piece ``N`` scores prefix and suffix
    keys. ``select_pieces`` computes the shifts from the raw q/k and stores ``PineSelection``
    as ``ctx.data``; ``piece_index`` masks by the shifted positions. The schedule's mask *is*
    its causal mask (``own_causal_mask``): a call with ``causal=True`` lets documents see
    later documents.

    Inputs: ``inputs={"segments": (B, Ls)}`` ids ``-1`` prefix, ``0 .. n-1`` documents in
    order, ``n`` the suffix (each row ends in its suffix; ``Ls <= Lk``, later keys are suffix:
    a decoding step passes the prompt's ids unchanged). Query ``i`` is key ``i + Lk - Lq``
    (bottom-right). The positions of the call (``q_pos``/``k_pos``) are not read: PINE
    replaces them by its layout. A document query's ranking sums over the queries of its
    document present in the call (all of them in a prefill; the official code ranks in the
    prefill only, where that is the whole document).

    Differences from the official code: batches of rows with different layouts are allowed
    (the official code takes one layout); ``n = 2`` takes the general formula, which gives the
    official special case (each document shifted by the other's length). Cost: O(Lq Lk) for the
    rankings (an explicit softmax per head, in blocks of ``IMPORTANCE_ROWS`` queries) and
    ``N + 1`` query rotations; the logits on the probability path (``eager``, ``chunked``).
    Keys are cached raw (``cache_rotated_keys = False``).

    Args: as ``rope`` (base, layout, partial_rotary_factor, scaling, max_position_embeddings).
    Shapes as ``rope``.
    """

    paper = "Wang et al. 2024 (PINE, position-invariant inference)"
    # the call's positions are not read (the layout comes from the segments): shifting them
    # changes nothing
    relative = True
    selects = True
    own_causal_mask = True
    required_inputs = {"segments": "(B, Ls) ids: -1 prefix, 0..n-1 documents, n suffix"}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """A prefix, three documents of random lengths and a suffix per row."""
        rows = []
        for _ in range(batch):
            prefix = length_k // 8
            suffix = max(1, length_k // 8)
            middle = length_k - prefix - suffix
            n = min(3, middle)
            ids = [-1] * prefix
            if n:
                cuts = torch.randperm(max(middle - 1, 1), generator=generator)[: n - 1] + 1
                edges = [0, *sorted(int(c) for c in cuts), middle]
                for d in range(n):
                    ids += [d] * (edges[d + 1] - edges[d])
            ids += [n] * suffix
            rows.append(ids)
        return {"segments": torch.tensor(rows, dtype=torch.long)}

    def select_pieces(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor],
        *,
        past_queries: Tensor | None = None,
    ) -> tuple[list[tuple[Tensor, Tensor]], PineSelection]:
        self._check_qk(q, k)
        B, H, Lq, D = q.shape
        Lk = k.shape[2]
        segments = inputs["segments"].to(q.device)
        if segments.shape[0] not in (1, B):
            raise ValueError(
                f"inputs['segments'] must have batch 1 or B = {B}, got {segments.shape[0]}"
            )
        layout = pine_layout(segments.expand(B, -1), Lk)
        index = torch.arange(Lq, device=q.device) + (Lk - Lq)  # the query's own key
        alive = (index >= 0).expand(B, Lq)
        own = index.clamp(min=0).expand(B, Lq)
        q_pos_pine = layout.positions.gather(1, own)
        q_segment = layout.segments.gather(1, own)
        with torch.no_grad():
            shift = self.shifts(q, k, layout, q_segment, alive)
        seq_len = int(layout.positions.max()) + 1 if self.length_dependent else None
        k_rot = self._rotate_at(k, layout.positions, seq_len)
        pieces = []
        for d in range(shift.shape[-1]):
            pos = q_pos_pine[:, None, :] + shift[..., d]  # (B, H, Lq): per head
            cos, sin = self.cos_sin(pos.reshape(B * H, Lq), seq_len)
            cos, sin = (t.reshape(B, H, Lq, -1) for t in (cos, sin))
            pieces.append((rotate_pairs(q, cos, sin, self.layout), k_rot))
        pieces.append((self._rotate_at(q, q_pos_pine, seq_len), k_rot))
        return pieces, PineSelection(shift, layout, q_pos_pine, q_segment, alive)

    def shifts(
        self, q: Tensor, k: Tensor, layout: PineLayout, q_segment: Tensor, alive: Tensor
    ) -> Tensor:
        """``shift (B, H, Lq, N)`` (zeros for prefix queries) from the raw ``q (B, H, Lq,
        D)`` and ``k (B, Hkv, Lk, D)``."""
        B, H, Lq, D = q.shape
        N = layout.lengths.shape[1]
        if N == 0:
            return torch.zeros(B, H, Lq, 0, dtype=torch.long, device=q.device)
        groups = H // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
        docs = torch.arange(N, device=q.device)
        key_doc = layout.segments[:, :, None] == docs  # (B, Lk, N)
        lengths = layout.lengths.to(q.dtype).clamp(min=1)
        is_doc_key = key_doc.any(-1)  # (B, Lk)
        q_in_doc = (q_segment[:, :, None] == docs) & alive[:, :, None]  # (B, Lq, N)
        parts = []
        for s in range(0, Lq, IMPORTANCE_ROWS):
            e = min(s + IMPORTANCE_ROWS, Lq)
            logits = torch.matmul(q[:, :, s:e], k.transpose(-1, -2)) * D**-0.5
            allowed = is_doc_key[:, None, None, :]
            # a document query: its own document's keys are masked
            own = (key_doc[:, None, :, :] & q_in_doc[:, s:e, None, :]).any(-1)  # (B, T, Lk)
            allowed = allowed & ~own[:, None]
            logits = logits.masked_fill(~allowed, -torch.inf)
            dead = ~allowed.any(-1, keepdim=True)
            p = torch.softmax(logits.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
            parts.append(torch.matmul(p, key_doc[:, None].to(p.dtype)) / lengths[:, None, None])
        weight = torch.cat(parts, dim=2)  # (B, H, Lq, N): per-document mean weight
        # document queries: W[e, d] summed over the queries of document e, own document first
        per_doc = torch.matmul(q_in_doc.transpose(1, 2)[:, None].to(weight.dtype), weight)
        doc_rows = torch.matmul(q_in_doc[:, None].to(weight.dtype), per_doc)  # (B, H, Lq, N)
        in_doc = q_in_doc.any(-1)[:, None, :, None]
        importance = torch.where(in_doc, doc_rows, weight)
        importance = torch.where(q_in_doc[:, None], torch.inf, importance)
        absent = docs >= layout.documents[:, None]  # (B, N): documents a row does not have
        importance = importance.masked_fill(absent[:, None, None, :], -torch.inf)
        order = torch.sort(importance, dim=-1, descending=True, stable=True).indices
        shift = document_shifts(order, layout.lengths[:, None, None, :])
        is_prefix = (q_segment < 0)[:, None, :, None]
        return shift.masked_fill(is_prefix, 0)

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Piece ``d`` for the keys of document ``d``, ``N`` for prefix and suffix keys; -1
        where the (shifted) key position exceeds the query's, and for queries without a key."""
        data: PineSelection = ctx.data
        layout = data.layout
        N = data.shift.shape[-1]
        seg = layout.segments[b, j]
        doc = (seg >= 0) & (seg < layout.documents[b])
        pq, pk = data.q_pos[b, i], layout.positions[b, j]
        if N:
            shift = data.shift[b, h, i, seg.clamp(0, N - 1)]
            pk = torch.where(doc, pk - shift, pk)
        visible = (pk <= pq) & data.alive[b, i]
        return torch.where(visible, torch.where(doc, seg, N), -1)
