"""Rotary encodings from Lie groups: LieRE (learned rotations) and MinkowskiPE (Lorentz).

Both replace RoPE's fixed 2x2 rotations by ``R(p) = expm(sum_a p_a G_a)`` for generators
``G_a`` of a matrix Lie algebra, and keep the relative score
``(R(m) q)^T M (R(n) k) = q^T M R(n - m) k`` whenever the generators commute and preserve the
metric ``M`` (``G^T M + M G = 0``): skew-symmetric generators preserve the dot product
(``M = I``, rotations), ``eta``-antisymmetric ones the Minkowski form (boosts).

Shared here: ``skew_part`` and ``skew_from_upper`` (skew-symmetric matrices from free
parameters, also used by ``harope``) and ``apply_blocks`` (a per-token block-diagonal map).
Sources: LieRE, official code StanfordMIMI/LieRE ``models/rope_vit.py``; MinkowskiPE and the
boosts (Hyperbolic HoPE), reconstructions from their abstracts.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import apply_rotary, rope_angles
from ..base import Encoding
from ..options import Float, Int, Refused
from ..registry import register

# --------------------------------------------------------------------------- shared helpers


def skew_part(a: Tensor) -> Tensor:
    """``(A - A^T) / 2`` over the last two axes."""
    return (a - a.mT) / 2


def skew_from_upper(packed: Tensor, size: int) -> Tensor:
    """Skew-symmetric ``(..., size, size)`` whose strict upper triangle (row-major) is
    ``packed (..., size (size - 1) / 2)``: ``S[i, j] = packed``, ``S[j, i] = -packed``."""
    rows, cols = torch.triu_indices(size, size, 1, device=packed.device)
    upper = packed.new_zeros(*packed.shape[:-1], size, size)
    upper[..., rows, cols] = packed
    return upper - upper.mT


def apply_blocks(x: Tensor, mats: Tensor) -> Tensor:
    """Block-diagonal map per token: ``x (B, H, L, D)``, ``mats (B|1, L, n, g, g)`` with
    ``n g = D``; block ``b`` of channels ``b g .. b g + g - 1`` is multiplied by ``mats[.., b]``.
    Runs in ``x.dtype``."""
    B, H, L, D = x.shape
    n, g = mats.shape[-3], mats.shape[-1]
    mats = mats.to(x.dtype).expand(B, *mats.shape[1:])
    out = torch.einsum("blnij,bhlnj->bhlni", mats, x.reshape(B, H, L, n, g))
    return out.reshape(B, H, L, D)


def orthogonal_power(base: Tensor, exponent: Tensor) -> Tensor:
    """``base^p`` for orthogonal ``base (..., g, g)`` and integer ``exponent (B, L)``:
    ``(B, L, ..., g, g)``, by binary powering (``log2 max|p|`` batched products; a negative
    power is the transpose). For ``base = expm(S)`` this is ``expm(p S)``, exactly in exact
    arithmetic and to ``~ |p| eps`` in floating point, at a fraction of a batched
    ``matrix_exp``'s cost."""
    mag = exponent.abs()
    eye = torch.eye(base.shape[-1], dtype=base.dtype, device=base.device)
    out = eye.expand(*exponent.shape, *base.shape)
    lead = (...,) + (None,) * base.dim()
    power = base
    for bit in range(max(int(mag.max()), 1).bit_length() if mag.numel() else 0):
        out = torch.where(((mag >> bit) & 1).bool()[lead], out @ power, out)
        power = power @ power
    return torch.where((exponent < 0)[lead], out.mT, out)


def orthogonal_powers(base: Tensor, exponent: Tensor) -> Tensor:
    """``orthogonal_power(base, exponent)``, computed as a table of every power from
    ``min(exponent)`` to ``max(exponent)`` (doubling: ``log2`` batched products, one matrix
    product per table row) gathered per token, when that range is at most twice the number
    of tokens (the usual case: one range of positions, batch rows overlapping); otherwise
    binary powering per token."""
    if exponent.numel() == 0:
        return orthogonal_power(base, exponent)
    lo, hi = int(exponent.min()), int(exponent.max())
    size = hi - lo + 1
    if size > 2 * exponent.numel():
        return orthogonal_power(base, exponent)
    table = orthogonal_power(base, torch.tensor([[lo]], device=exponent.device))[0]  # base^lo
    step = base
    while table.shape[0] < size:
        table = torch.cat((table, table @ step), dim=0)  # rows lo .. lo + 2 len - 1
        step = step @ step
    return table[exponent - lo]


def _as_coordinates(pos: Tensor) -> Tensor:
    """``(B|1, L)`` or ``(B|1, L, m)`` -> float64 ``(B|1, L, m)``."""
    pos = pos.to(torch.float64)
    return pos[..., None] if pos.dim() == 2 else pos


# --------------------------------------------------------------------------- LieRE


#: the common RoPE options (``rope.RoPE``'s) LieRE takes only to refuse them by name
LIERE_NOT_ROPE = Refused(
    "LieRE learns dense skew-symmetric generators: there is no RoPE base, pair "
    "layout or frequency spectrum to set, rotate partly or rescale"
)


@register("liere")
class LieRE(Encoding):
    """LieRE, Lie rotational position encodings (Ostmeier et al. 2024; official
    code read: ``StanfordMIMI/LieRE``, ``LierePositionEncoder``).

    For coordinates ``p in R^m`` the rotation is ``R(p) = expm(sum_a p_a S_a)`` with learned
    skew-symmetric ``g x g`` generators ``S_a``, applied blockwise (``head_dim / g`` blocks,
    each with its own generators) to q and k: ``q' = R(p_q) q``, ``k' = R(p_k) k``. The score
    ``q^T R(p_q)^T R(p_k) k`` is relative when the generators commute: always in 1-D, and
    for ``generator_dim = 2`` (then LieRE with ``S = [[0, -theta_i], [theta_i, 0]]`` per
    block is RoPE, interleaved pairs). Dense generators in 2-D/3-D do not commute in general,
    so such an encoding sets ``relative = False``.

    Parameters (as the source): one set of generators per position axis, shared by heads
    (and by layers when the encoding module is shared); the strict upper triangle is stored,
    ``~ U(0, init_range)`` with ``init_range = 2 pi`` (the source's ``triu(raw) - 0.5``,
    minus its transpose, has exactly these upper entries). The source feeds coordinates on a
    grid that spans ``[0, 1]`` at the training resolution (``linspace(0, steps /
    expected_steps, steps)``, about ``index / expected_steps``); relpos likewise divides
    positions by ``expected_steps`` (default 512, a training length; use e.g. 14 for a
    14 x 14 patch grid). Integer 1-D positions use ``R(p) = expm(S / expected_steps)^p``
    (``orthogonal_power``: one ``matrix_exp`` per block instead of one per token);
    everything runs in float64 (the source: float32), so rotations at large positions keep
    their precision, and is cast to the dtype of q and k.

    Args:
        dims: position axes ``m`` (positions ``(B, L, m)``; 1-D also takes ``(L,)``/``(B, L)``).
        generator_dim: block size ``g`` (default ``head_dim``: one dense block, as the source).
        init_range: upper-triangle entries start ``~ U(0, init_range)``.
        expected_steps: positions are divided by it (the training extent of an axis).
    Shapes: ``x (B, H, L, D)``; parameter ``generator (m, head_dim / g, g (g - 1) / 2)``.
    """

    paper = "Ostmeier et al. 2024 (LieRE)"
    has_rotary = True
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: Annotated[
            int | None, Int(minimum=1, optional=True, doc="position axes (default: the class's)")
        ] = None,
        generator_dim: Annotated[
            int | None, Int(minimum=2, optional=True, doc="block size g (even, divides D)")
        ] = None,
        init_range: Annotated[
            float, Float(minimum=0.0, doc="generator entries start ~ U(0, init_range)")
        ] = 2 * math.pi,
        expected_steps: Annotated[
            float, Float(above=0.0, doc="positions are divided by it")
        ] = 512.0,
        base: Annotated[None, LIERE_NOT_ROPE] = None,
        layout: Annotated[None, LIERE_NOT_ROPE] = None,
        partial_rotary_factor: Annotated[None, LIERE_NOT_ROPE] = None,
        scaling: Annotated[None, LIERE_NOT_ROPE] = None,
        max_position_embeddings: Annotated[None, LIERE_NOT_ROPE] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for liere, got {head_dim}")
        g = head_dim if generator_dim is None else generator_dim
        if g % 2 or head_dim % g:
            raise ValueError(
                f"generator_dim must be an even int >= 2 dividing head_dim={head_dim} (an "
                f"odd-size skew-symmetric generator always fixes a direction), got {g!r}"
            )
        if dims is not None:  # default: the class's (1 for liere, 2 for liere-2d)
            self.dims = dims
        dims = self.dims
        self.expected_steps = expected_steps
        self.generator_dim = g
        self.relative = dims == 1 or g == 2  # commuting generators
        packed = torch.rand(dims, head_dim // g, g * (g - 1) // 2) * init_range
        self.generator = nn.Parameter(packed)

    def generators(self) -> Tensor:
        """Skew-symmetric generators ``(m, head_dim / g, g, g)``."""
        return skew_from_upper(self.generator, self.generator_dim)

    def rotations(self, pos: Tensor) -> Tensor:
        """``R(p) = expm(sum_a p_a S_a)`` per token and block: ``(B|1, L, n, g, g)`` float64."""
        gens = self.generators().double() / self.expected_steps
        if self.dims == 1 and not pos.is_floating_point():
            # integer 1-D positions: R(p) = expm(S)^p, one matrix_exp per block
            return orthogonal_powers(torch.linalg.matrix_exp(gens[0]), pos.reshape(pos.shape[:2]))
        algebra = torch.einsum("bla,ankm->blnkm", _as_coordinates(pos), gens)
        return torch.linalg.matrix_exp(algebra)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has head_dim {x.shape[-1]} but the encoding was created with "
                f"head_dim={self.head_dim}"
            )
        return apply_blocks(x, self.rotations(pos))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, dims={self.dims}, generator_dim={self.generator_dim}, "
            f"expected_steps={self.expected_steps:g}"
        )


@register("liere-2d")
class LieRE2D(LieRE):
    """LieRE on image patches (Ostmeier et al. 2024, the paper's ViT setting): ``liere`` with
    ``dims = 2`` (positions ``(B, L, 2)`` = (row, column)) by default, so the registry and
    its conformance suite cover the N-D case: dense generators per axis that do not commute,
    hence not relative. Use ``dims = 3`` for video. Args, shapes: as ``liere``."""

    dims = 2  # the default of the ``dims`` option
    relative = False  # dense generators per axis do not commute (the instance decides)


# --------------------------------------------------------------------------- MinkowskiPE


def boost_pairs(x: Tensor, rapidity: Tensor, metric: bool) -> Tensor:
    """Lorentz boost of channel pairs ``(x_{4b}, x_{4b+1})`` by ``rapidity (B|1, 1, L, n)``:
    ``(a cosh + c sinh, a sinh + c cosh)``; ``metric`` then flips the second channel
    (``eta = diag(1, -1)``). Computed in float64, returned in ``x.dtype``."""
    a, c = x[..., 0::4].double(), x[..., 1::4].double()
    ch, sh = torch.cosh(rapidity), torch.sinh(rapidity)
    first, second = a * ch + c * sh, a * sh + c * ch
    if metric:
        second = -second
    return torch.stack((first, second), dim=-1).to(x.dtype)


#: the common RoPE options (``rope.RoPE``'s) besides ``base`` MinkowskiPE refuses by name
MINKOWSKI_NOT_ROPE = Refused(
    "MinkowskiPE's 4-channel boost + rotation blocks fix the channel layout and its "
    "rapidity rates are not a RoPE spectrum an HF scaling dict could rescale"
)
MAX_RAPIDITY = Float(above=0.0, doc="rapidity rate of the first block")


@register("minkowski")
class MinkowskiPE(Encoding):
    """MinkowskiPE (Li et al. 2026, arXiv 2609.33804; abstract only, no code).

    The abstract: space-time coordinates parameterise Lorentz transformations of q and k,
    the score depends only on the space-time displacement (invariant to global
    translation), and the dot-product interface is kept.

    What relpos assumes. Positions are ``(t, x_1 .. x_{m-1})`` (``dims = m >= 2``; time
    first). The head splits into 4-D blocks ``(c0, c1 | c2, c3)`` with metric
    ``diag(1, -1) + I``; a block's transformation is ``B(kappa_b t) + R(theta_b x_a(b))``:
    a boost in the (c0, c1) plane by rapidity ``kappa_b t`` and a rotation in the
    (c2, c3) plane by RoPE angle ``theta_b x_a(b)``. Boost and rotation generators act on
    disjoint planes, so they commute (in SO(1, 3): a boost along x and the rotation about
    x), which makes the score relative:

        s = sum_b  q01^T eta B(kappa_b (t_k - t_q)) k01  +  q23^T R(theta_b (x_k - x_q)) k23.

    The metric is applied to the keys (the second boost channel changes sign), so the
    backends see a plain dot product. Spatial axes are axial: block ``b`` rotates with axis
    ``a(b) = 1 + b mod (m - 1)`` and the ``j``-th block of an axis has
    ``theta = base^(-j / n_a)`` (``n_a`` blocks per axis); rapidity rates are
    ``kappa_b = max_rapidity * base^(-b / n)`` (``n = head_dim / 4``). A boost grows
    (``e^{+kappa dt}``) along one light-cone direction and shrinks along the other, so
    large ``kappa * time span`` loses float32 precision: the default ``max_rapidity`` is
    1/1024, times are centred per call on the midpoint of the key times (they cancel in the
    score; keys are therefore cached raw, ``cache_rotated_keys = False``), and a call whose
    rapidities exceed 60 raises. Nothing is learned.

    Args: ``dims`` (default 3: t, y, x), ``base`` (10000), ``max_rapidity`` (1/1024).
    Shapes: ``x (B, H, L, D)`` with ``D % 4 == 0``, ``pos (B|1, L, m)``.
    """

    paper = "Li et al. 2026 (MinkowskiPE)"
    has_rotary = True
    continuous = True
    cache_rotated_keys = False
    dims = 3

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: Annotated[int, Int(minimum=2, doc="time + space axes")] = 3,
        base: Annotated[
            float, Float(above=1.0, doc="spectrum of the rotations and rapidity rates")
        ] = 10000.0,
        max_rapidity: Annotated[float, MAX_RAPIDITY] = 1 / 1024,
        layout: Annotated[None, MINKOWSKI_NOT_ROPE] = None,
        partial_rotary_factor: Annotated[None, MINKOWSKI_NOT_ROPE] = None,
        scaling: Annotated[None, MINKOWSKI_NOT_ROPE] = None,
        max_position_embeddings: Annotated[None, MINKOWSKI_NOT_ROPE] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4 for minkowski, got {head_dim}")
        self.dims = dims
        self.base = base
        self.max_rapidity = max_rapidity
        n = head_dim // 4
        blocks = torch.arange(n, dtype=torch.float64)
        axis = 1 + blocks.long() % (dims - 1)
        rank = blocks.long() // (dims - 1)  # j: index of the block within its axis
        per_axis = torch.bincount(axis - 1, minlength=dims - 1).double()[axis - 1]
        theta = self.base ** (-rank.double() / per_axis)
        # (m, n) maps coordinates to the rotation angle of each block (axial: one axis each)
        angle_map = torch.zeros(dims, n, dtype=torch.float64)
        angle_map[axis, torch.arange(n)] = theta
        self.register_buffer("angle_map", angle_map, persistent=False)
        rates = self.max_rapidity * self.base ** (-blocks / n)
        self.register_buffer("rates", rates, persistent=False)

    def _transform(self, x: Tensor, pos: Tensor, role: str, t0: Tensor) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has head_dim {x.shape[-1]} but the encoding was created with "
                f"head_dim={self.head_dim}"
            )
        coords = _as_coordinates(pos)
        rapidity = ((coords[..., 0] - t0)[..., None] * self.rates)[:, None]  # (B|1, 1, L, n)
        if rapidity.numel() and float(rapidity.abs().max()) > 60:
            raise ValueError(
                f"minkowski: {role} positions span too much time for max_rapidity="
                f"{self.max_rapidity:g} (|rapidity| > 60 overflows); lower max_rapidity"
            )
        boosted = boost_pairs(x, rapidity, metric=role == "k")  # (B, H, L, n, 2)
        ang = rope_angles(coords, self.angle_map)  # (B|1, L, m, n) summed below
        ang = ang.sum(-2) if ang.dim() == 4 else ang
        spatial = torch.stack((x[..., 2::4], x[..., 3::4]), dim=-1).flatten(-2)
        rotated = apply_rotary(spatial, ang.cos()[:, None], ang.sin()[:, None], "interleaved")
        rotated = rotated.unflatten(-1, (-1, 2))
        return torch.cat((boosted, rotated), dim=-1).flatten(-2)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        times = _as_coordinates(k_pos)[..., 0]
        t0 = torch.floor((times.min() + times.max()) / 2) if times.numel() else times.new_zeros(())
        return self._transform(q, q_pos, "q", t0), self._transform(k, k_pos, "k", t0)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        return self._transform(x, pos, role, torch.zeros((), dtype=torch.float64))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, dims={self.dims}, base={self.base:g}, "
            f"max_rapidity={self.max_rapidity:g}"
        )
