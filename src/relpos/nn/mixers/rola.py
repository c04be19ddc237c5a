"""RoLA: the low-rank linear-attention branch with RoPE outside the feature map, on a subset
of a model's (N-D) rotary schedule.

Only RoLA's abstract was available (its title and arXiv id could not be confirmed; no code was
found): a reconstruction. RoLA's global branch of a sparse + low-rank
video-DiT attention puts "RoPE outside the nonlinear low-rank feature map" -- RoFormer's order
(eq. 19, ``relpos.attention.linear.rotary_features``): features first, rotation second, denominator
unrotated -- and uses "a truncated subset of the pre-trained rotary schedule matched to the
low-rank bottleneck":

    z_i = sum_j (R^S_i phi(q_i)) . (R^S_j phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)

``phi: R^d -> R^r`` the low-rank feature map (``LowRankFeatures``: ``elu(W x) + 1``, a learnt
``W (r, d)``; any ``FeatureMap`` with ``r`` features), ``R^S_p`` the rotation of ``r/2``
pairs of the model's schedule ``F (H|1, P, m)`` (``angle_p = pos . F[p]``: RoPE ``m = 1``,
axial / M-RoPE / mixed m-D schedules), chosen by ``frequency_subset``:

* ``"lowest"`` (default): the ``r/2`` pairs of smallest ``|F_p|`` (longest wavelengths), kept
  in the schedule's order; ties broken by pair index;
* ``"highest"``: the ``r/2`` largest;
* a sequence of ``r/2`` distinct pair indices (in the order given).

Assumed (the abstract does not say): which subset (hence the option, default lowest), the
feature map (elu+1 of a learnt projection, non-negative so the denominator stays > 0), and
that the subset is ranked by frequency magnitude across all axes of an N-D schedule (give
indices to keep pairs per axis). No positional parameters are added. Rotation angles are
float64 products reduced modulo 2 pi, applied in the features' dtype. With ``r = d`` and the
whole schedule it is RoFormer's linear form (``relpos.attention.linear.rotary_features``).

Shapes: ``q (B, H, Lq, d)``, ``k (B, H, Lk, d)``, ``v (B, H, Lk, Dv)``; positions ``(L,)``,
``(B|1, L)`` or ``(B|1, L, m)`` (default ``0..L-1`` on every axis, queries the last ``Lq``);
output ``(B, H, Lq, Dv)``. Causal calls run by prefix sums and continue a
``relpos.attention.linear.state.LinearState`` (decoding: O(r Dv) per token).

The full sparse + low-rank module (RoLA's fixed-sparsity softmax branch plus this branch over
the blocks it does not cover) is ``relpos.nn.mixers.sparse_lowrank``; RoPeSLR (arXiv 2605.20659), a
baseline with a learnable absolute 3-D PE instead of the rotation, is its
``lowrank="ropeslr"`` option (``relpos.nn.mixers.ropeslr``).

The layer: ``RoLAAttention``: RoLA's low-rank linear-attention branch as a layer (the
functions above hold the math).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...attention.linear.feature_maps import FeatureMap, LowRankFeatures
from ...attention.linear.kernelized import kernelized_attention
from ...attention.linear.state import LinearState
from ...encodings.base import Encoding
from ...encodings.rotary.nd import SectionedRoPE
from ...encodings.rotary.rope import RoPE
from ...functional import apply_rotary
from ...validation import check_choice, check_int
from ..attention import build_encoding
from ..head_projections import ProjectedHeads

__all__ = [
    "rola_attention",
    "rotary_schedule",
    "select_frequencies",
    "schedule_positions",
    "rotate_by_schedule",
    "RoLAAttention",
]


def rotary_schedule(encoding: Encoding, device: torch.device | None = None) -> Tensor:
    """The rotary schedule ``F (H|1, P, m)`` (float64) of ``encoding``: RoPE's (scaled)
    frequencies as ``(1, P, 1)``, a sectioned m-D RoPE's frequency matrix. ``ValueError`` for
    other encodings, length-dependent scalings (no single schedule) and attention factors
    other than 1 (a rescaled rotation is not a rotation)."""
    if isinstance(encoding, RoPE) and type(encoding).rotate is RoPE.rotate:
        if encoding.length_dependent:
            raise ValueError(
                f"encoding {encoding.name!r} has a length-dependent scaling (dynamic NTK, "
                "LongRoPE): its schedule changes with the call, RoLA needs one schedule"
            )
        inv_freq, factor = encoding.call_frequencies(None, device or encoding.inv_freq.device)
        freq = inv_freq.double()[None, :, None]
    elif isinstance(encoding, SectionedRoPE):
        if encoding.length_dependent:
            raise ValueError(
                f"encoding {encoding.name!r} has a length-dependent scaling: its schedule "
                "changes with the call, RoLA needs one schedule"
            )
        freq, factor = encoding.frequency_matrix(device or torch.device("cpu"))
        freq = freq.double()
    else:
        raise ValueError(
            f"RoLA takes the rotary schedule of 'rope' or of a sectioned m-D RoPE (rope-axial, "
            f"m-rope, rope-mixed, ...), got encoding {getattr(encoding, 'name', encoding)!r}"
        )
    if factor != 1.0:
        raise ValueError(
            f"encoding {encoding.name!r} scales cos/sin by an attention factor {factor:g} "
            "(YaRN-style scaling): RoLA rotates features by the schedule alone; use a scaling "
            "without an attention factor"
        )
    return freq


def select_frequencies(
    schedule: Tensor, rank: int, frequency_subset: str | Sequence[int] = "lowest"
) -> Tensor:
    """``r/2`` pairs of ``schedule (H|1, P, m)``: ``(H|1, r/2, m)`` (module docstring)."""
    rank = check_int(rank, "rank", minimum=2)
    if rank % 2:
        raise ValueError(f"rank must be even (features are rotated in pairs), got {rank}")
    G, P, _ = schedule.shape
    n = rank // 2
    if n > P:
        raise ValueError(
            f"rank={rank} needs {n} rotary pairs but the schedule has {P} (rank <= {2 * P})"
        )
    if isinstance(frequency_subset, str):
        check_choice(frequency_subset, "frequency_subset", ("lowest", "highest"))
        size = schedule.detach().norm(dim=-1)  # (G, P)
        if frequency_subset == "highest":
            size = -size
        order = torch.sort(size, dim=-1, stable=True).indices[:, :n]
        index = torch.sort(order, dim=-1).values  # the schedule's own order
    else:
        if isinstance(frequency_subset, Tensor) or not isinstance(frequency_subset, Sequence):
            raise TypeError(
                "frequency_subset must be 'lowest', 'highest' or a sequence of pair indices, "
                f"got {type(frequency_subset).__name__}"
            )
        idx = [
            check_int(i, f"frequency_subset[{p}]", minimum=0, maximum=P - 1)
            for p, i in enumerate(frequency_subset)
        ]
        if len(idx) != n or len(set(idx)) != n:
            raise ValueError(
                f"frequency_subset must hold rank/2 = {n} distinct pair indices in 0..{P - 1}, "
                f"got {list(frequency_subset)}"
            )
        index = torch.tensor(idx, device=schedule.device)[None].expand(G, n)
    return torch.gather(
        schedule, 1, index.to(schedule.device)[..., None].expand(G, n, schedule.shape[-1])
    )


def schedule_positions(
    pos: Tensor | None, length: int, dims: int, device: torch.device, start: int
) -> Tensor:
    """``(B|1, L, m)`` float64 positions (default ``start .. start + L - 1`` on every axis)."""
    if pos is None:
        pos = torch.arange(start, start + length, device=device)
    if not isinstance(pos, Tensor):
        raise TypeError(f"positions must be a tensor, got {type(pos).__name__}")
    if pos.dim() == 1:
        pos = pos[None]
    if pos.dim() == 2:
        pos = pos[..., None].expand(*pos.shape, dims)
    if pos.dim() != 3 or pos.shape[1] != length or pos.shape[-1] != dims:
        raise ValueError(
            f"positions must be (L,), (B|1, L) or (B|1, L, {dims}) with L = {length}, got "
            f"{tuple(pos.shape)}"
        )
    return pos.double()


def rotate_by_schedule(phi: Tensor, pos: Tensor, freq: Tensor, layout: str) -> Tensor:
    """``phi (B, H, L, r)`` rotated by ``angle = pos . freq`` (float64, reduced mod 2 pi)."""
    ang = torch.einsum("blm,gpm->bglp", pos, freq.to(pos.device))
    ang = torch.remainder(ang, 2 * math.pi)
    return apply_rotary(phi, ang.cos(), ang.sin(), layout)


def rola_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding,
    feature_map: FeatureMap,
    *,
    frequency_subset: str | Sequence[int] = "lowest",
    causal: bool = False,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    key_valid: Tensor | None = None,
    state: LinearState | None = None,
) -> Tensor:
    """RoLA's low-rank branch (module docstring): ``(B, H, Lq, Dv)`` in the dtype of q.

    ``encoding``: the model's rotary encoding (its schedule, ``rotary_schedule``; its
    ``layout`` pairs the ``r`` features); ``feature_map``: ``r = num_features`` features
    (``LowRankFeatures``). ``key_valid (B, Lk)`` bool: False for padded keys. ``state``: a
    ``LinearState`` continued by a causal call (decoding; default positions continue
    ``state.length``)."""
    if not isinstance(feature_map, FeatureMap):
        raise TypeError(
            f"feature_map must be a relpos.attention.linear.feature_maps.FeatureMap, got "
            f"{type(feature_map).__name__}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a tensor of shape (B, H, L, D)")
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if k.shape[:2] != (B, H) or v.shape[:3] != (B, H, Lk):
        raise ValueError(
            f"k must be (B, H, Lk, D) = ({B}, {H}, Lk, D) and v (B, H, Lk, Dv); got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if state is not None and not causal:
        raise ValueError(
            "state (LinearState) is the recurrent state of causal calls: pass causal=True"
        )
    schedule = rotary_schedule(encoding, q.device)
    freq = select_frequencies(schedule, feature_map.num_features, frequency_subset)
    dims = schedule.shape[-1]
    start = state.length if state is not None else 0
    kp = schedule_positions(k_pos, Lk, dims, q.device, start)
    if q_pos is None:
        if Lq > Lk:
            raise ValueError(f"q_pos is needed when Lq ({Lq}) > Lk ({Lk})")
        qp = kp[:, Lk - Lq :]  # the last Lq keys' positions, as relpos.attention
    else:
        qp = schedule_positions(q_pos, Lq, dims, q.device, 0)
    scale = q.shape[-1] ** -0.5
    phi_q, _ = feature_map(q, "q", scale)
    phi_k, log_offset = feature_map(k, "k", scale)
    sums = None
    if state is not None:
        state.check_shape(B, H, phi_k.shape[-1], v.shape[-1])
        factor, log_offset = state.absorb_offset(log_offset)
        if factor is not None:
            phi_k = phi_k * factor
        sums = state.sums()
        if sums is not None:
            sums = (sums[0].to(phi_k.dtype), sums[1].to(phi_k.dtype))
    layout = encoding.layout
    rotated = (
        rotate_by_schedule(phi_q, qp, freq, layout),
        rotate_by_schedule(phi_k, kp, freq, layout),
    )
    valid = None if key_valid is None else key_valid[:, None, :]
    if Lq == 0 or Lk == 0:
        if state is not None:
            state.length += Lk
        return q.new_zeros(B, H, Lq, v.shape[-1])
    out, final = kernelized_attention(
        phi_q, phi_k, v, causal=causal, rotated=rotated, key_valid=valid, state=sums
    )
    if state is not None:
        assert final is not None
        state.update(final, log_offset, Lk)
    return out.to(q.dtype)


class RoLAAttention(ProjectedHeads, nn.Module):
    """Multi-head RoLA low-rank branch (a reconstruction from the abstract).

    ``z_i = sum_j (R^S_i phi(q_i)) . (R^S_j phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)`` per
    head, ``q, k, v`` projections of ``x``, ``phi = LowRankFeatures(head_dim, rank)`` (one
    learnt ``W (rank, head_dim)`` shared by the heads) or a given ``FeatureMap``, and
    ``R^S`` the rotation of ``rank / 2`` pairs of the encoding's rotary schedule
    (``frequency_subset``: ``"lowest"``, ``"highest"`` or pair indices).

    Args:
        dim, num_heads: model width and heads.
        encoding: the model's rotary encoding, a registry name (``"rope"``,
            ``"rope-axial"`` with ``encoding_options={"dims": 3}``, ``"m-rope"``, ...) or an
            instance; only its schedule and layout are read (no positional parameters are
            added beyond a learned schedule of its own).
        rank: the bottleneck ``r`` (even, at most twice the schedule's pairs).
        feature_map: a ``FeatureMap`` with ``rank`` features instead of ``LowRankFeatures``.

    ``forward(x (B, L, dim), pos=None, causal=False, mask=None, state=None) -> (B, L, dim)``:
    positions ``(B|1, L[, m])`` (default ``0..L-1`` on every axis, continued from
    ``state``); ``mask (B, L)`` bool, False for padded tokens; ``state`` a ``LinearState``
    for causal decoding (``new_state()``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding = "rope",
        *,
        rank: int | None = None,
        frequency_subset: str | Sequence[int] = "lowest",
        encoding_options: dict[str, Any] | None = None,
        feature_map: FeatureMap | None = None,
        seed: int | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        enc = build_encoding(encoding, num_heads, self.head_dim, encoding_options or {})
        assert enc is not None
        self.encoding = enc
        if feature_map is None:
            rank = self.head_dim if rank is None else check_int(rank, "rank", minimum=2)
            feature_map = LowRankFeatures(self.head_dim, rank, seed=seed)
        elif rank is not None and rank != feature_map.num_features:
            raise ValueError(
                f"rank ({rank}) must equal the feature map's num_features "
                f"({feature_map.num_features})"
            )
        self.feature_map = feature_map
        self.rank = feature_map.num_features
        self.frequency_subset = frequency_subset
        select_frequencies(rotary_schedule(enc), self.rank, frequency_subset)  # checks now
        self._build_projections(bias)

    @staticmethod
    def new_state() -> LinearState:
        """An empty recurrent state for causal decoding."""
        return LinearState()

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
        state: LinearState | None = None,
    ) -> Tensor:
        q, k, v = self._project(x)
        out = rola_attention(
            q,
            k,
            v,
            self.encoding,
            self.feature_map,
            frequency_subset=self.frequency_subset,
            causal=causal,
            q_pos=pos,
            k_pos=pos,
            key_valid=mask,
            state=state,
        )
        return self._merge(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, rank={self.rank}"
