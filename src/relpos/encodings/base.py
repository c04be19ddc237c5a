"""The ``Encoding`` base class: the four places a relative positional encoding can act.

Every RPE changes attention through some of

    logit(h, i, j) = < R_h(p_i) q_i , R_h(p_j) k_j > * scale  +  b_h(i, j [, q_i, k_j])

* ``rotate(x, pos, role)`` — the multiplicative part ``R_h(p)`` (roles "q", "k", "v", "o");
  rotations that read per-call ``inputs`` (camera matrices) build a state once per call in
  ``prepare_rotary(q_pos, k_pos, inputs)``; the engine then calls ``rotate(x, pos, role,
  state)`` for q, k, v and the output (``state`` is passed only when it is not None, so
  encodings without one keep the three-argument ``rotate``);
* ``bias(ctx, b, h, i, j)`` — the additive part as an element-wise function of index tensors
  (the FlexAttention ``score_mod`` shape), so one formula serves every backend;
* ``prepare(q, k, q_pos, k_pos, inputs)`` — per-call precomputation captured by ``bias``
  (e.g. ``q @ E_rel^T``), reading optional per-call ``inputs`` (graphs, boxes);
* ``embed(pos, dim)`` — absolute encodings added to the token embeddings by ``relpos.nn``.

Further hooks change the attention weights themselves (backends that only take an
additive score modification, SDPA and FlexAttention, cannot run them; ``eager`` and
``chunked`` can, see ``needs_probabilities``):

* ``value_term(ctx, p, b, h, i, j)`` — an extra output term ``sum_j p_ij a^V_ij`` (Shaw's
  relative value embeddings, iRPE contextual values);
* ``prob_multiplier(ctx, b, h, i, j)`` — an element-wise factor on the softmax weights (URPE);
* ``pieces(q, k, q_pos, k_pos)`` + ``key_segments(first, last)`` — piecewise rotary logits:
  the logit of pair (i, j) is ``<q^r_i, k^r_j>`` for the piece ``r = piece_index(i, j)``
  (-1 masks the pair). Dual Chunk Attention, Self-Extend and LM-Infinite are of this form;
  one softmax over the union of pieces equals merging the pieces by log-sum-exp. A schedule
  states its layout once, as ``KeySegment`` s (key range + distance band per piece, for a
  block of queries); ``piece_index`` is derived from them here, and the engine's piecewise
  kernel (``relpos.attention.piecewise``) reads the same segments block by block.
* ``row_gates(ctx, s, b, h, i, j)`` + ``row_bias(ctx, s, g, count, b, h, i, j)`` — a
  row-dependent logit term (flag ``row_dependent``; CoPE, TRA): the term at (i, j) reads the
  suffix sum ``count_ij = sum_{t >= j} g_it`` of gates computed from the whole row of content
  logits ``s`` (gates of masked keys are 0). Not a score_mod: the engine forms the suffix sum
  (eager over the row, chunked walking key blocks right to left with the running sum).

Position facts: ``BiasContext.distance_range`` (and ``ctx.positions``, a
``relpos.positions.CallPositions``) give the reachable ``q_pos - k_pos`` range and whether the
positions are ranges, computed once per call by the engine (no host sync for defaulted
positions). Encodings read them instead of calling ``q_pos.min()`` / ``k_pos.max()``.

Capability flags are instance attributes: the class gives the default, and an encoding
whose capabilities depend on its options sets them in ``__init__`` (Shaw without value
tables has no value term). Everything that reports or dispatches on flags (backends,
``relpos list``, the README table, the conformance suite) reads instances, and the
conformance suite checks every flag against behaviour (``tests/conformance/test_flags.py``).

Options: each constructor keyword is declared in ``options`` (``relpos.encodings.options``);
``__init_subclass__`` merges the declarations along the class hierarchy into
``option_specs`` and checks declared keywords before the constructor body runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..positions import CallPositions, Positions
from ..validation import check_int
from .options import OptionSpec, check_options


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


class Encoding(nn.Module):
    """Base class of every relpos encoding. Identity everywhere unless a subclass overrides.

    Capability flags (instance attributes; see the module docstring):
        family: the subpackage of ``relpos.encodings`` ("rotary", "bias", "contextual",
            "spatial", "graph", "document") or "absolute" / "none".
        relative: logits depend on positions only through ``q_pos - k_pos``.
        distance_only: ``bias`` is ``bias_at_distance(h, q_pos - k_pos)``; lets the chunked
            backend tabulate it per distance (O(L) memory, Toeplitz views, diagonal-sum grads).
        causal_only: meant for causal attention only (a warning-free contract, see docs).
        dims: number of position axes (1 for sequences).
        continuous: accepts floating-point positions.
        has_rotary / has_bias / adds_to_input: which of the hooks are active.
        max_positions: for learned tables, positions must lie in ``[0, max_positions)``.
        cache_rotated_keys: keys may be cached after ``rotate`` (their rotation never depends
            on later tokens). False makes ``relpos.nn`` cache raw keys and re-rotate.
        has_value_term / multiplies_probs / piecewise / row_dependent: which of the
            weight-changing hooks are active (see the module docstring); any of them sets
            ``needs_probabilities``.
        required_inputs / optional_inputs: per-call tensors the encoding reads, passed as
            ``relpos.attention(..., inputs={name: tensor})``: ``{name: expected form}``.
        keeps_own_init: models (``relpos.nn``) leave the encoding's parameters as the
            encoding initialised them.
        rotates_values: ``rotate`` acts on values ("v") and outputs ("o") too (RoVE, the
            per-token camera frames of ``relpos.encodings.camera``).
        se3_invariant: logits and outputs are unchanged when every camera of the call is
            moved by one rigid transform of the world (camera encodings; the conformance
            module ``test_camera.py`` checks it).
        mixes_tokens: the rotation of a token reads the features of the other tokens of
            its side of the call, later ones included (AW-RoPE's walk transport over a
            graph): not causal in the tokens, so a KV cache is refused by name and one call's
            rows are not the rows of a larger call.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: the subpackage of ``relpos.encodings`` the class lives in (set by
    #: ``__init_subclass__``); classes in top-level modules declare it (``absolute``, ``none``)
    family: ClassVar[str] = "none"
    #: declared constructor options of this class (merged into ``option_specs``)
    options: ClassVar[dict[str, OptionSpec]] = {}
    option_specs: ClassVar[dict[str, OptionSpec]] = {}

    # capability flags: class defaults, set per instance where options change them
    relative: bool = True
    distance_only: bool = False
    causal_only: bool = False
    dims: int = 1
    continuous: bool = False
    has_rotary: bool = False
    has_bias: bool = False
    adds_to_input: bool = False
    cache_rotated_keys: bool = True
    has_value_term: bool = False
    multiplies_probs: bool = False
    piecewise: bool = False
    rotates_values: bool = False
    se3_invariant: bool = False
    #: ``rotate`` at a token reads the other tokens' features (AW-RoPE's graph transport):
    #: no KV cache, and a sub-call is not a slice of the full call
    mixes_tokens: bool = False
    #: the logit term at (i, j) reads the whole row of content logits through a suffix sum of
    #: gates over keys (``row_gates`` / ``row_bias``): CoPE's counted positions, TRA
    row_dependent: bool = False
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
    #: the bias is a ``TwoSidedTableBias`` (``two_sided_bias``; DeBERTa's c2p + p2c): outside
    #: a band around the diagonal it is a query term plus a key term, which the ``fold``
    #: backend folds into q/k channels
    folds_outside_band: bool = False
    #: parameters initialise themselves: models must not re-initialise them
    keeps_own_init: bool = False
    #: submodules (by name, as in ``named_modules``) that keep their own init even when the
    #: rest of the encoding takes the model's (FIRE's scalar-input layer ``mlp_in``)
    own_init_modules: ClassVar[tuple[str, ...]] = ()
    required_inputs: dict[str, str] = {}
    optional_inputs: dict[str, str] = {}
    #: True when the encoding cannot run without per-call inputs even though each of them is
    #: optional (graphs: an adjacency *or* precomputed distances)
    needs_inputs: bool = False

    #: the flags reported by ``capabilities()`` (``relpos list``, the README table)
    FLAGS: ClassVar[tuple[str, ...]] = (
        "relative",
        "distance_only",
        "causal_only",
        "dims",
        "continuous",
        "has_rotary",
        "has_bias",
        "adds_to_input",
        "cache_rotated_keys",
        "has_value_term",
        "multiplies_probs",
        "piecewise",
        "rotates_values",
        "se3_invariant",
        "row_dependent",
        "mixes_tokens",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        module = cls.__module__.split(".")
        if module[:2] == ["relpos", "encodings"] and len(module) > 3:
            cls.family = module[2]  # the family is the subpackage, by construction
        specs: dict[str, OptionSpec] = {}
        for klass in reversed(cls.__mro__):
            specs.update(klass.__dict__.get("options", {}))
        cls.option_specs = specs
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_checks_options", False):

            @functools.wraps(init)
            def checked_init(self, *args: Any, **options: Any) -> None:
                checked = check_options(type(self).option_specs, options)
                if "_given_options" not in self.__dict__:  # the outermost constructor's call
                    given = {k: v for k, v in checked.items() if k in type(self).option_specs}
                    object.__setattr__(self, "_given_options", given)
                init(self, *args, **checked)

            checked_init._checks_options = True  # type: ignore[attr-defined]
            cls.__init__ = checked_init  # type: ignore[method-assign]

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = check_int(num_heads, "num_heads")
        self.head_dim = check_int(head_dim, "head_dim")
        self.max_positions: int | None = None

    def modules_keeping_init(self) -> list[nn.Module]:
        """The submodules a model (``relpos.nn``) must leave as this encoding initialised
        them: all with ``keeps_own_init``, else those named in ``own_init_modules``."""
        if self.keeps_own_init:
            return list(self.modules())
        named = dict(self.named_modules())
        return [named[name] for name in self.own_init_modules if name in named]

    def capabilities(self) -> dict[str, Any]:
        """This instance's capability flags (``FLAGS``) plus ``needs_inputs`` /
        ``required_inputs`` / ``learnable``, as reported by ``relpos list``."""
        out = {flag: getattr(self, flag) for flag in self.FLAGS}
        out["required_inputs"] = dict(self.required_inputs)
        out["needs_inputs"] = bool(self.required_inputs) or self.needs_inputs
        out["learnable"] = self.learnable
        out["needs_probabilities"] = self.needs_probabilities
        return out

    # ----------------------------------------------------------------- capabilities
    @property
    def learnable(self) -> bool:
        """True when the encoding has trainable parameters."""
        return any(p.requires_grad for p in self.parameters())

    @property
    def needs_probabilities(self) -> bool:
        """The encoding changes the attention weights beyond an additive score term (value
        terms, multiplied probabilities, piecewise logits, row-dependent terms): only the
        ``eager`` and ``chunked`` backends run it."""
        return self.has_value_term or self.multiplies_probs or self.piecewise or self.row_dependent

    @property
    def needs_context(self) -> bool:
        """Whether the backends must call ``prepare`` (any hook that reads a ``BiasContext``)."""
        return self.has_bias or self.needs_probabilities

    def default_scale(self, head_dim: int) -> float:
        """The logit scale used when the caller passes ``scale=None``: ``head_dim ** -0.5``
        (DeBERTa overrides it: three terms share ``1/sqrt(3 d)``)."""
        return head_dim**-0.5

    @classmethod
    def example_options(cls) -> dict:
        """Options for short tests (L of a few dozen) that exercise every part of the
        encoding; the defaults may be sized for real models (e.g. DCA's chunks) and reduce to
        a simpler encoding at test lengths. The conformance suite uses them."""
        return {}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Valid random ``inputs`` for a call of these lengths (tests, docs). Encodings with
        ``required_inputs`` override this."""
        return {}

    # ----------------------------------------------------------------- hooks
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

    def query_span_limit(self, dtype: torch.dtype) -> float | None:
        """The widest span of query positions one call may encode in activations of
        ``dtype``, or None (no limit). ``relpos.attention`` cuts a wider call into blocks of
        consecutive queries (``attention/query_split.py``: exact, rows are independent);
        xPos's per-call envelope centre needs it. Encodings with a limit cache raw keys
        (``cache_rotated_keys = False``)."""
        return None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"

    def __repr__(self) -> str:
        """``nn.Module``'s repr, with every option given a non-default value appended to the
        encoding's own line (``_with_given_options``): scalings included."""
        text = super().__repr__()
        own = self.extra_repr()
        full = self._with_given_options(own)
        return text.replace(own, full, 1) if own and full != own else text

    def _with_given_options(self, text: str) -> str:
        """``text`` plus every option the constructor was given with a value other than its
        default (``relpos.encodings.registry.option_defaults``) that ``text`` does not show
        yet: the repr of an encoding states how it was built, scaling dicts included."""
        from .registry import option_defaults  # the registry module imports this one

        defaults = option_defaults(type(self))
        extra = []
        for name, value in getattr(self, "_given_options", {}).items():
            if f"{name}=" in text or _same(value, defaults.get(name)):
                continue
            extra.append(f"{name}={value!r}")
        return ", ".join([text, *extra]) if extra else text


def _same(value: Any, default: Any) -> bool:
    """``value == default`` for option values (tensors and sequences compare whole)."""
    if value is default:
        return True
    try:
        return bool(value == default)
    except (RuntimeError, TypeError, ValueError):  # tensors of several elements
        return False
