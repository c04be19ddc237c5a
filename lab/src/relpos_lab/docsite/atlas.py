"""The atlas: what each registered encoding does to attention, computed from its code.

Every number here comes from ``relpos.scores`` / ``relpos.attention`` (or ``embed`` for
absolute encodings) on an instance built by ``relpos.create``; nothing is tabulated by hand.
Three views, chosen per encoding from its capability flags (never from its name):

* ``distance_profile`` (1-D encodings that act on the logits): per head, the logit the
  encoding adds for a *similar key* at relative distance ``d = q_pos - k_pos``: every query
  and key is the same random vector ``u`` (one per head and draw, ``|u|^2 = D``), so the
  content part of the logit is the constant ``scale * |u|^2``, which is subtracted. For a bias
  encoding this is the bias ``b_h(d)``; for a rotary encoding the rotary score
  ``scale * <R(p_i) u, R(p_j) u> - scale * |u|^2`` (RoFormer's long-term decay), averaged over
  draws;
* ``embedding_profile`` (encodings that only add an embedding to the input): cosine
  similarity of the position embeddings ``e(p_i)`` and ``e(p_j)`` against ``d``;
* ``grid_map`` (encodings of 2 or more position axes): the same similar-key logit from the
  centre query to every cell of a grid (axes 1 and 2 of an m-D position form the grid for
  m >= 3, axis 0 takes three values, further axes stay 0);
* ``attention_patterns`` (all): the attention weights at a few lengths, for the shared vector
  ``u`` (positional structure only) and for independent random ``q, k``.

Encodings that read per-call inputs (graphs, boxes, cameras, panels, segments) get the random
valid ones of ``Encoding.example_inputs``; encodings are built with their
``example_options`` (the short-test sizes that exercise every part) at ``ATLAS_HEADS`` heads
of ``ATLAS_HEAD_DIM`` channels. Learned parameters are drawn by their own initialisation
(seed 0), except parameters initialised to exactly zero, which get ``N(0, 0.1^2)`` values so
their shape shows; ``AtlasEncoding.filled`` names them and the page says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import relpos
from relpos import config
from relpos.positions_nd import grid_positions
from relpos.registry import encoding_class

__all__ = [
    "ATLAS_HEADS",
    "ATLAS_HEAD_DIM",
    "PATTERN_SIDES",
    "PATTERN_LENGTHS",
    "AtlasEncoding",
    "Profile",
    "GridMap",
    "Patterns",
    "atlas_encoding",
    "distance_profile",
    "embedding_profile",
    "grid_map",
    "attention_patterns",
    "views",
    "eager_rotations",
]

#: the model size the atlas draws (``relpos list`` uses the same)
ATLAS_HEADS, ATLAS_HEAD_DIM = 8, 64
#: 1-D sequence lengths of the attention patterns
PATTERN_LENGTHS = (16, 64, 256)
#: grid sides of the m-D attention patterns (clipped to a learned table's size)
PATTERN_SIDES = (4, 8, 16)
#: the largest ``|q_pos - k_pos|`` of a distance profile
PROFILE_DISTANCE = 64
#: the largest grid side of a grid map (odd, so one cell is the centre)
GRID_SIDE = 15
#: random draws averaged in profiles and grid maps
DRAWS = 4
#: values taken by axis 0 of an m-D grid (m >= 3)
SLICES = 3


@dataclass
class AtlasEncoding:
    """One encoding as the atlas draws it: the instance, the options it was built with, the
    parameters filled with random values (exactly zero at initialisation) and notes the page
    prints (lengths a learned table cannot hold, parts not drawn)."""

    name: str
    encoding: relpos.Encoding
    options: dict[str, Any]
    filled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Profile:
    """A curve per head (``values (H, n)``; one row for embedding profiles) against
    ``distances (n,)``; NaN where a pair is masked by the encoding itself."""

    distances: Tensor
    values: Tensor
    ylabel: str
    title: str


@dataclass(frozen=True)
class GridMap:
    """``values (H, S, side, side)``: the similar-key logit from the query at ``centre`` to
    each grid cell, ``S`` slices along axis 0 (1 for 2-D encodings)."""

    values: Tensor
    centre: tuple[int, ...]
    slice_values: tuple[int, ...]


@dataclass(frozen=True)
class Patterns:
    """Attention weights per length: ``shared[n]`` / ``random[n]`` are ``(Lq, Lk)`` of head 0
    for ``lengths[n]`` tokens (``shapes[n]`` the grid of m-D encodings), ``causal`` whether a
    causal mask applied."""

    lengths: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    shared: tuple[Tensor, ...]
    random: tuple[Tensor, ...]
    causal: bool


def atlas_encoding(name: str, seed: int = 0) -> AtlasEncoding:
    """``relpos.create(name)`` at the atlas size with the encoding's ``example_options``,
    learned parameters from seed ``seed`` (zero-initialised ones drawn ``N(0, 0.1^2)``)."""
    options = dict(encoding_class(name).example_options())
    torch.manual_seed(seed)
    enc = relpos.create(name, num_heads=ATLAS_HEADS, head_dim=ATLAS_HEAD_DIM, **options)
    enc.eval()
    filled = []
    with torch.no_grad():
        for pname, p in enc.named_parameters():
            if p.requires_grad and p.is_floating_point() and p.numel() and bool((p == 0).all()):
                p.copy_(0.1 * torch.randn_like(p))
                filled.append(pname)
    return AtlasEncoding(name, enc, options, filled)


def views(enc: relpos.Encoding) -> list[str]:
    """The atlas views of an encoding, from its flags: ``"profile"`` (1-D, acts on logits),
    ``"embedding"`` (only an input embedding), ``"grid"`` (2 or more position axes), and
    ``"patterns"`` always."""
    acts_on_logits = enc.has_rotary or enc.has_bias or enc.needs_probabilities
    out = []
    if enc.dims == 1:
        out.append("profile" if acts_on_logits or not enc.adds_to_input else "embedding")
    else:
        out.append("grid")
    out.append("patterns")
    return out


def _needs_inputs(enc: relpos.Encoding) -> bool:
    return bool(enc.required_inputs) or enc.needs_inputs


def _inputs(enc: relpos.Encoding, batch: int, length: int, seed: int) -> dict[str, Tensor]:
    """The encoding's ``example_inputs`` for one sequence of ``length`` tokens, repeated over
    ``batch`` rows (the draws share one graph / document / camera rig)."""
    if not _needs_inputs(enc):
        return {}
    gen = torch.Generator().manual_seed(seed)
    one = enc.example_inputs(1, length, length, gen)
    return {name: t.expand(batch, *t.shape[1:]) for name, t in one.items()}


@contextmanager
def eager_rotations() -> Iterator[None]:
    """No gradients and ``relpos.config.FUSED_ROTARY`` off while inside: the atlas evaluates
    each shape once, where ``torch.compile`` would cost more than it saves."""
    saved = config.FUSED_ROTARY
    config.FUSED_ROTARY = False
    try:
        with torch.no_grad():
            yield
    finally:
        config.FUSED_ROTARY = saved


def _shared_vectors(draws: int, heads: int, dim: int, seed: int) -> Tensor:
    """``(draws, H, 1, D)`` random vectors of norm ``sqrt(D)`` (uniform on that sphere)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(draws, heads, 1, dim, generator=gen)
    return u * (dim**0.5) / u.norm(dim=-1, keepdim=True)


def _similar_key_row(
    enc: relpos.Encoding, pos: Tensor, query: int, draws: int, seed: int
) -> Tensor:
    """Mean over draws of the logit the encoding adds for ``q_i = k_j = u``, row ``query``:
    ``(H, L)`` float64, NaN where the encoding masks the pair (piecewise schedules)."""
    length = pos.shape[0]
    h, d = enc.num_heads, enc.head_dim
    u = _shared_vectors(draws, h, d, seed).expand(draws, h, length, d).contiguous()
    scale = enc.default_scale(d)
    with eager_rotations():
        logits = relpos.scores(
            u, u, enc, q_pos=pos, k_pos=pos, inputs=_inputs(enc, draws, length, seed) or None
        )
    row = logits[:, :, query, :].double() - scale * d  # |u|^2 = D exactly
    row = torch.where(torch.isfinite(row), row, torch.nan)
    return row.mean(0)


def _profile_reach(enc: relpos.Encoding) -> int:
    """The largest ``|d|`` a profile shows: ``PROFILE_DISTANCE``, or less when a learned
    table holds fewer positions (``2 N + 1`` tokens)."""
    if enc.max_positions is None:
        return PROFILE_DISTANCE
    return min(PROFILE_DISTANCE, (enc.max_positions - 1) // 2)


def distance_profile(item: AtlasEncoding, draws: int = DRAWS, seed: int = 0) -> Profile:
    """The similar-key logit of each head against ``d = q_pos - k_pos`` (1-D encodings):
    ``2 N + 1`` tokens at positions ``0..2N``, the query in the middle, ``N =
    PROFILE_DISTANCE`` (less for a small learned table)."""
    enc = item.encoding
    n = _profile_reach(enc)
    if n < PROFILE_DISTANCE:
        item.notes.append(
            f"the distance profile reaches |d| = {n}: the encoding holds "
            f"{enc.max_positions} positions (`max_positions`)"
        )
    pos = torch.arange(2 * n + 1)
    row = _similar_key_row(enc, pos, n, draws, seed)
    return Profile(
        distances=n - pos,
        values=row,
        ylabel="logit added (similar key)",
        title="logit added vs d = q_pos - k_pos, per head",
    )


def embedding_profile(item: AtlasEncoding) -> Profile:
    """Cosine similarity of the position embeddings ``e(N)`` and ``e(N - d)`` (encodings that
    add an embedding to the input; ``dim = heads * head_dim``, the model width)."""
    enc = item.encoding
    n = _profile_reach(enc)
    pos = torch.arange(2 * n + 1)[None]
    with eager_rotations():
        e = enc.embed(pos, enc.num_heads * enc.head_dim)[0].double()  # (L, dim)
    e = e / e.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    cos = e @ e[n]
    return Profile(
        distances=n - pos[0],
        values=cos[None],
        ylabel="cos(e(p_i), e(p_j))",
        title="position-embedding similarity vs d = p_i - p_j",
    )


def _grid_side(enc: relpos.Encoding, side: int) -> int:
    if enc.max_positions is not None:
        side = min(side, enc.max_positions)
    return side


def _grid_positions(enc: relpos.Encoding, side: int, slices: int) -> tuple[Tensor, list[int]]:
    """Positions ``(L, m)`` of an m-D grid, row-major: axes (0, 1) for m = 2; axis 0 over
    ``slices`` values and axes (1, 2) for m >= 3, further axes 0. Returns positions and the
    grid's shape."""
    if enc.dims == 2:
        shape = [side, side]
        return grid_positions(side, side), shape
    shape = [slices, side, side]
    grid = grid_positions(slices, side, side)
    pos = torch.zeros(grid.shape[0], enc.dims, dtype=grid.dtype)
    pos[:, :3] = grid
    return pos, shape


def grid_map(item: AtlasEncoding, draws: int = 4, seed: int = 0) -> GridMap:
    """The similar-key logit from the centre query to every cell of a grid (encodings of 2
    or more position axes), per head."""
    enc = item.encoding
    side = _grid_side(enc, GRID_SIDE)
    if side % 2 == 0:
        side -= 1
    if side < GRID_SIDE:
        item.notes.append(
            f"the grid map is {side} x {side}: the encoding's table holds "
            f"{enc.max_positions} positions per axis (`max_positions`)"
        )
    slices = 1 if enc.dims == 2 else SLICES
    pos, shape = _grid_positions(enc, side, slices)
    centre = tuple(s // 2 for s in shape)
    query = sum(c * math.prod(shape[a + 1 :]) for a, c in enumerate(centre))  # row-major
    row = _similar_key_row(enc, pos, query, draws, seed)  # (H, L)
    values = row.reshape(enc.num_heads, *([1] if enc.dims == 2 else []), *shape)
    return GridMap(values=values, centre=centre, slice_values=tuple(range(slices)))


def _weights(
    enc: relpos.Encoding,
    q: Tensor,
    k: Tensor,
    pos: Tensor,
    causal: bool,
    inputs: dict[str, Tensor],
) -> Tensor:
    """Attention weights ``(B, H, L, L)`` as the engine computes them: ``relpos.attention``
    with the identity as values (``auto`` backend); for encodings that act on the values
    (value terms, rotated values) the values are not the identity's, and the weights are the
    softmax of ``relpos.scores`` under the same mask (those hooks leave the weights alone);
    selecting schedules (LongHeads) get the same, with the keys standing in for the values in
    their selection, as ``relpos.scores`` does."""
    length = q.shape[2]
    kw: dict[str, Any] = {"q_pos": pos, "k_pos": pos, "inputs": inputs or None}
    with eager_rotations():
        if not (enc.has_value_term or enc.rotates_values or enc.selects):
            eye = torch.eye(length).expand(q.shape[0], enc.num_heads, length, length)
            return relpos.attention(q, k, eye.contiguous(), enc, causal=causal, **kw)
        logits = relpos.scores(q, k, enc, **kw)
        if causal and not enc.own_causal_mask:
            future = torch.ones(length, length, dtype=torch.bool).triu(1)
            logits = logits.masked_fill(future, -math.inf)
        return torch.softmax(logits, dim=-1)


def _embedding_weights(enc: relpos.Encoding, pos: Tensor, causal: bool) -> Tensor:
    """Weights of tokens that are their position embedding only, identity projections:
    ``softmax(e_i . e_j / sqrt(dim))`` (absolute encodings act before the projections)."""
    dim = enc.num_heads * enc.head_dim
    with eager_rotations():
        e = enc.embed(pos[None], dim)[0]
    logits = (e @ e.T) / dim**0.5
    if causal:
        future = torch.ones(len(pos), len(pos), dtype=torch.bool).triu(1)
        logits = logits.masked_fill(future, -math.inf)
    return torch.softmax(logits, dim=-1)[None, None]


def attention_patterns(item: AtlasEncoding, seed: int = 0) -> Patterns:
    """Head 0's attention weights at ``PATTERN_LENGTHS`` tokens (1-D, causal) or on grids of
    ``PATTERN_SIDES`` (m-D, no mask): for ``q_i = k_j = u`` (one random vector) and for
    independent random ``q, k ~ N(0, I)``. Lengths a learned table cannot hold are left out
    (and noted); encodings that only add an input embedding show
    ``softmax(e_i . e_j / sqrt(dim))`` in both rows."""
    enc = item.encoding
    causal = enc.dims == 1
    embedding_only = views(enc)[0] == "embedding"
    h, d = enc.num_heads, enc.head_dim
    cases: list[tuple[Tensor, tuple[int, ...]]] = []
    skipped: list[int] = []
    if enc.dims == 1:
        for length in PATTERN_LENGTHS:
            if enc.max_positions is not None and length > enc.max_positions:
                skipped.append(length)
                continue
            cases.append((torch.arange(length), (length,)))
    else:
        sides = sorted({_grid_side(enc, s) for s in PATTERN_SIDES})
        for side in sides:
            pos, shape = _grid_positions(enc, side, 2)
            cases.append((pos, tuple(shape)))
        if len(sides) < len(PATTERN_SIDES):
            item.notes.append(
                f"attention patterns on grids of side {', '.join(map(str, sides))}: the "
                f"encoding's table holds {enc.max_positions} positions per axis"
            )
    if skipped:
        item.notes.append(
            f"no attention pattern at L = {', '.join(map(str, skipped))}: the encoding holds "
            f"{enc.max_positions} positions (`max_positions`)"
        )
    shared, random = [], []
    gen = torch.Generator().manual_seed(seed)
    for pos, _shape in cases:
        length = pos.shape[0]
        if embedding_only:
            w = _embedding_weights(enc, pos, causal)[0, 0]
            shared.append(w)
            random.append(w)
            continue
        inputs = _inputs(enc, 1, length, seed)
        u = _shared_vectors(1, h, d, seed).expand(1, h, length, d).contiguous()
        shared.append(_weights(enc, u, u, pos, causal, inputs)[0, 0])
        q = torch.randn(1, h, length, d, generator=gen)
        k = torch.randn(1, h, length, d, generator=gen)
        random.append(_weights(enc, q, k, pos, causal, inputs)[0, 0])
    return Patterns(
        lengths=tuple(pos.shape[0] for pos, _ in cases),
        shapes=tuple(shape for _, shape in cases),
        shared=tuple(shared),
        random=tuple(random),
        causal=causal,
    )
