"""The hooks of an ``Encoding``, grouped by the role they play.

An encoding implements the hooks of its role(s) and leaves the others at their defaults
(identity, no bias, no pieces): a distance bias overrides ``BiasRole.bias_at_distance``, a
rotary encoding ``RotaryRole.rotate``, a piecewise schedule ``PieceRole.key_segments``. Each
role carries the capability flags that say whether its hooks are active; the engine reads the
flags (never the class) to choose a path.

* ``RotaryRole``: the multiplicative part ``R_h(p)`` of q, k (and v, o);
* ``BiasRole``: the additive part ``b_h(i, j)`` and row-dependent terms;
* ``WeightRole``: terms on the softmax weights (value terms, multiplied weights);
* ``PieceRole``: piecewise rotary logits and the schedules that select pieces;
* ``InputRole``: per-call inputs, positions from tokens, absolute embeddings, table checks.

``relpos.encodings.base.Encoding`` combines the five with the options, names and flags every
encoding has.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..positions import CallPositions
from .context import BiasContext, KeySegment, RowAffineTables

__all__ = ["RotaryRole", "BiasRole", "WeightRole", "PieceRole", "InputRole"]


class _Sized:
    """The attributes every role's default hooks read (set by ``Encoding.__init__``)."""

    name: str
    num_heads: int
    max_positions: int | None


class RotaryRole(_Sized):
    """The multiplicative part ``R_h(p)``: rotations of q, k (and v, o) by position."""

    has_rotary: bool = False
    cache_rotated_keys: bool = True
    rotates_values: bool = False
    #: ``rotate`` at a token reads the other tokens' features (AW-RoPE's graph transport):
    #: no KV cache, and a sub-call is not a slice of the full call
    mixes_tokens: bool = False
    se3_invariant: bool = False

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> Any:
        """Per-call state of the rotation, built once from the call's ``inputs`` (camera
        matrices, rays) and the normalised positions ``q_pos (B|1, Lq[, m])``, ``k_pos (B|1,
        Lk[, m])`` (with a KV cache: the new tokens' only). The engine calls it after checking
        the input names and passes the result to ``rotate(x, pos, role, state)`` for q, k, v
        and the output. Default None: the rotation reads positions only."""
        return None

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        """Multiplicative part. ``x (B, H, L, D)``, ``pos (B|1, L[, m])``; ``state``: what
        ``prepare_rotary`` returned (passed by the engine only when not None). Identity."""
        return x

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys together (override when the pair shares state, e.g. xPos
        centres both on one reference position). Default: ``rotate`` each."""
        if state is None:
            return self.rotate(q, q_pos, "q"), self.rotate(k, k_pos, "k")
        return self.rotate(q, q_pos, "q", state), self.rotate(k, k_pos, "k", state)

    def query_span_limit(self, dtype: torch.dtype) -> float | None:
        """The widest span of query positions one call may encode in activations of
        ``dtype``, or None (no limit). ``relpos.attention`` cuts a wider call into blocks of
        consecutive queries (``attention/query_split.py``: exact, rows are independent);
        xPos's per-call envelope centre needs it. Encodings with a limit cache raw keys
        (``cache_rotated_keys = False``)."""
        return None


class BiasRole(_Sized):
    """The additive part ``b_h(i, j)``: one element-wise formula every backend evaluates,
    its per-call data, its table over distances, and row-dependent terms (CoPE, TRA)."""

    has_bias: bool = False
    distance_only: bool = False
    #: the logit term at (i, j) reads the whole row of content logits through a suffix sum of
    #: gates over keys (``row_gates`` / ``row_bias``): CoPE's counted positions, TRA
    row_dependent: bool = False
    #: the bias is a ``TwoSidedTableBias`` (``two_sided_bias``; DeBERTa's c2p + p2c): outside
    #: a band around the diagonal it is a query term plus a key term, which the ``fold``
    #: backend folds into q/k channels
    folds_outside_band: bool = False
    #: over the rows of a block of consecutive integer query positions, the bias is affine in
    #: a per-row scalar with coefficients per distance, except at a few distances
    #: (``row_affine_tables``; FIRE above its threshold, where each row has its own
    #: normaliser): the chunked backend then reads it from two tables per block instead of
    #: evaluating it per pair
    row_affine: bool = False

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
        *,
        positions: CallPositions | None = None,
    ) -> BiasContext:
        """Per-call precomputation for ``bias``. Positions are expanded to the batch of ``q``.

        ``inputs`` holds the per-call tensors named in ``required_inputs`` /
        ``optional_inputs`` (already checked for presence by the backends); ``positions``
        the call's position facts (``ctx.distance_range``), passed by the engine."""
        batch = q.shape[0]
        ctx = BiasContext(
            q_pos=q_pos.expand(batch, *q_pos.shape[1:]),
            k_pos=k_pos.expand(batch, *k_pos.shape[1:]),
            positions=positions,
        )
        ctx.data = self.precompute(q, k, ctx, inputs or {})
        return ctx

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        """Per-call work for ``bias`` / ``value_term`` (e.g. ``q @ E_rel^T``), stored as
        ``ctx.data``. ``q (B, H, Lq, D)``, ``k (B, Hk, Lk, D)`` (after rotation); ``ctx``
        holds the batch-expanded positions. Override this instead of ``prepare``: return a
        dataclass declared next to the encoding. Default: None."""
        return None

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        """The context ``bias`` reads for one block: query indices ``i (T,)`` and key indices
        ``j (S,)`` (consecutive). Backends call it for each block they evaluate (the chunked
        backend per tile, inside its activation checkpoint, so the work is recomputed in
        backward instead of stored; dense and FlexAttention once for the whole call), so an
        encoding can do per-block work here, e.g. ``q_block @ W^T`` over the table rows the
        block reaches (``contextual.table``). Default: the call's ``ctx``."""
        return ctx

    def block_rows(self, ctx: BiasContext) -> int:
        """The fewest query rows per block the chunked backend should use for this call:
        per-block work that does not shrink with the block (a key read's ``(B, H, Lk, R)``
        gradient, see ``contextual.table``) is then shared by at least this many rows.
        Default 16."""
        return 16

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Additive logit bias at (batch b, head h, query index i, key index j).

        The index tensors broadcast against each other (full grids, tiles, or 0-d tensors
        inside FlexAttention). The default reads positions from ``ctx`` and calls
        ``bias_at_distance`` for ``distance_only`` encodings.
        """
        if not self.distance_only:
            raise RuntimeError(f"encoding {self.name!r} has no additive bias")
        return self.bias_at_distance(h, ctx.q_pos[b, i] - ctx.k_pos[b, j])

    def is_distance_only(self, ctx: BiasContext) -> bool:
        """Whether, for this call, ``bias == bias_at_distance(h, q_pos - k_pos)``.

        True for ``distance_only`` encodings; an encoding may also say so for some calls only
        (FIRE, while every query position lies below its threshold).
        """
        return self.distance_only

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        """Bias of head ``h`` at ``distance = q_pos - k_pos`` (distance-only encodings)."""
        raise RuntimeError(f"encoding {self.name!r} is not a distance-only bias")

    def distance_table(self, low: int, high: int, device: torch.device) -> Tensor:
        """``bias_at_distance`` tabulated for distances ``low .. high``: shape ``(H, n)``."""
        h = torch.arange(self.num_heads, device=device)[:, None]
        d = torch.arange(low, high + 1, device=device)[None, :]
        return self.bias_at_distance(h, d).expand(self.num_heads, d.shape[1])

    def row_affine_tables(
        self, ctx: BiasContext, rows: Tensor, distance: Tensor
    ) -> RowAffineTables:
        """``row_affine`` encodings: for groups of query positions ``rows (G, R)`` (integers)
        and position distances ``distance (G, N)``, the tables with ``bias(i, j) =
        constant[h, g, n] + row_scale[g, t] * slope[h, g, n]`` wherever ``exact[g, n]``
        (``context.RowAffineTables``); the engine evaluates ``bias`` at the other pairs."""
        raise RuntimeError(f"encoding {self.name!r} has no row-affine bias")

    def row_gates(
        self, ctx: BiasContext, s: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """Row-dependent encodings: the gates ``g (B, H, T, S)`` of a block of content logits
        ``s (B, H, T, S)`` (scaled rotated dot products, before any mask) at query indices
        ``i`` and key indices ``j`` (index grids as for ``bias``). The engine zeroes the gates
        of masked keys and forms ``count_ij = sum_{t >= j} g_it`` over the row."""
        raise RuntimeError(f"encoding {self.name!r} has no row-dependent term")

    def row_bias(
        self,
        ctx: BiasContext,
        s: Tensor,
        g: Tensor,
        count: Tensor,
        b: Tensor,
        h: Tensor,
        i: Tensor,
        j: Tensor,
    ) -> Tensor:
        """Row-dependent encodings: the logit term ``(B, H, T, S)`` added to ``s`` from the
        block's gates ``g`` (masked keys 0) and their suffix sums ``count`` over the whole row
        (``count_ij = sum_{t >= j} g_it``, float64). ``-inf`` removes a pair."""
        raise RuntimeError(f"encoding {self.name!r} has no row-dependent term")


class WeightRole(_Sized):
    """Terms that act on the softmax weights: an extra value term linear in the weights
    (Shaw, NEZHA, iRPE values) and an element-wise factor on them (URPE)."""

    has_value_term: bool = False
    multiplies_probs: bool = False

    def value_term(
        self, ctx: BiasContext, p: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """Extra output ``(B, H, T, Dv)`` from the softmax weights ``p (B, H, T, S)`` of query
        indices ``i (T,)`` and key indices ``j (S,)`` (``b``, ``h`` are index grids as for
        ``bias``). Summed over key blocks, so it must be linear in ``p``."""
        raise RuntimeError(f"encoding {self.name!r} has no value term")

    def prob_multiplier(
        self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """Element-wise factor applied to the softmax weights before they weight the values."""
        raise RuntimeError(f"encoding {self.name!r} does not multiply the attention weights")


class PieceRole(_Sized):
    """Piecewise rotary logits (DCA, Self-Extend, LM-Infinite) and the schedules that
    select their pieces per call (LongHeads, PINE)."""

    piecewise: bool = False
    #: piecewise schedules whose layout is chosen per call from the raw q·k, per head and
    #: query (LongHeads' chunks, PINE's document order, from the unrotated q·k): ``select_pieces``
    #: returns the selection with the pieces and the engine stores it as ``ctx.data``, which
    #: ``piece_index`` reads. The fused piecewise kernel's layouts assume one layout for every
    #: head, so these run on the probability path (``eager``, ``chunked``).
    selects: bool = False
    #: ``select_pieces`` reads the raw queries of earlier tokens (LongHeads' chunk features):
    #: a KV cache keeps them (``LayerCache.append_queries``) and passes them as
    #: ``past_queries``
    reads_past_queries: bool = False
    #: the schedule's ``piece_index`` (-1) is its causal mask: ``causal=True`` means that mask
    #: instead of "key index <= query index" (PINE: documents see each other)
    own_causal_mask: bool = False

    def pieces(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> list[tuple[Tensor, Tensor]]:
        """Piecewise encodings: the rotated ``(q_r, k_r)`` of every piece ``r``."""
        raise RuntimeError(f"encoding {self.name!r} is not piecewise")

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
    ) -> tuple[list[tuple[Tensor, Tensor]], Any]:
        """Piecewise encodings: the pieces of a call and the per-call selection that
        ``piece_index`` reads (as ``ctx.data``), from the *raw* ``q (B, H, Lq, D)``,
        ``k, v (B, Hkv, Lk, D)``, the positions and the per-call ``inputs``.
        ``past_queries (B, H, P, D)``: the raw queries of the first ``P`` keys, kept by a KV
        cache for encodings with ``reads_past_queries`` (None otherwise). Schedules that select
        (``selects``: LongHeads, PINE) override this; default ``(pieces(q, k, ...), None)``."""
        return self.pieces(q, k, q_pos, k_pos), None

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Piecewise encodings: which piece gives the logit of (b, h, i, j); -1 = masked.

        Derived from ``key_segments`` evaluated for each query on its own (``first = last =
        p_i`` as tensors): the piece of the segment that holds the pair, else -1. A schedule
        therefore states its layout once (``key_segments``), for the element-wise form here
        and the block-wise form of the engine's fused piecewise kernel."""
        qp, kp = ctx.q_pos[b, i], ctx.k_pos[b, j]
        segments = self.key_segments(qp, qp)
        if segments is None:
            raise RuntimeError(f"encoding {self.name!r} is not piecewise")
        shape = torch.broadcast_shapes(qp.shape, kp.shape)
        out = torch.full(shape, -1, dtype=torch.long, device=kp.device)
        for seg in segments:
            out = torch.where(seg.holds(qp, kp), seg.piece, out)
        return out

    def key_segments(self, first: int | Tensor, last: int | Tensor) -> list[KeySegment] | None:
        """Piecewise encodings: for a block of queries at the consecutive integer positions
        ``first .. last``, the key ranges of every piece and the distance band in which a
        query of the block sees them (segments of one query never overlap). None: the
        encoding is not piecewise. Also called with integer tensors ``first = last``
        (element-wise, ``piece_index``): write the bounds with tensor-safe arithmetic."""
        return None

    def next_break(self, position: int) -> int | None:
        """Piecewise encodings: the first query position after ``position`` where a block of
        queries must end for ``key_segments`` to describe it (None: anywhere)."""
        return None


class InputRole(_Sized):
    """What an encoding reads besides q and k: per-call ``inputs`` (graphs, boxes,
    cameras), positions derived from tokens (BiPE), absolute embeddings added to the input,
    and learned-table position checks."""

    adds_to_input: bool = False
    required_inputs: dict[str, str] = {}
    optional_inputs: dict[str, str] = {}
    #: True when the encoding cannot run without per-call inputs even though each of them is
    #: optional (graphs: an adjacency *or* precomputed distances)
    needs_inputs: bool = False

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Valid random ``inputs`` for a call of these lengths (tests, docs). Encodings with
        ``required_inputs`` override this."""
        return {}

    def positions_from_tokens(self, tokens: Tensor, state: Tensor | None = None) -> Any:
        """Encodings that act on the input and in attention with positions derived from the
        token ids (BiPE): ``tokens (B, L)`` and the state left by the previous call (KV-cache
        decoding) -> an object with ``input``, ``attention`` and ``state`` positions. None:
        the encoding derives no positions (models use the default ``arange``)."""
        return None

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        """Absolute embedding ``(B|1, L, dim)`` added to token embeddings (absolute family)."""
        raise RuntimeError(f"encoding {self.name!r} adds nothing to the input")

    def check_positions(self, pos: Tensor, name: str) -> None:
        """Raise if ``pos`` lies outside a learned table. Called by every backend."""
        if self.max_positions is None or pos.numel() == 0:
            return
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= self.max_positions:
            raise ValueError(
                f"{name} spans positions {lo}..{hi}, but encoding {self.name!r} has a learned "
                f"table for positions 0..{self.max_positions - 1} (max_positions="
                f"{self.max_positions})"
            )
