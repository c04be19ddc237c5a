"""RelFlexformer: masked linear attention over tokens at arbitrary (non-uniform) m-D positions.

Paper: Kim, Sehanobish, Dubey, Oh, Choromanski, "RelFlexformer" (2026, arXiv 2605.10706).
Only the abstract was read. It names an integrable modulation ``f`` of relative positions, the
NU-FFT and O(L log L); the construction below is a reconstruction, with a dense reference
defining correctness. Assumed (not read in the paper): the
RPE multiplies the kernel of linear attention (``c_ij = f(r_i - r_j) >= 0``, as Luo et al.'s
Toeplitz RPE does on a uniform grid), the numerator and the denominator carry the same ``f``,
one modulation scale per head, and the quadrature grid is chosen per call from a tolerance.

Model (``phi`` a non-negative feature map, ``r_i`` in R^m, m = 1, 2, 3):

    z_i = sum_j f(r_i - r_j) (phi(q_i) . phi(k_j)) v_j / sum_j f(r_i - r_j) (phi(q_i) . phi(k_j))

Each column ``x`` of ``phi(k) (x) v`` (``m_f Dv`` columns) and of ``phi(k)`` (``m_f``) needs
``y_i = sum_j f(r_i - r_j) x_j``, a non-uniform convolution. ``method``:

* ``"direct"``: the exact O(Lq Lk) sum (the reference);
* ``"quadrature"``: ``f(D) = int f_hat(w) e^{2 pi i w . D} dw`` on the uniform grid
  ``w = h n``, ``|n_a| <= K`` (``Omega = K h``): ``y_i ~ sum_n h^m f_hat(h n)
  e^{2 pi i h n . r_i} X_n``, ``X_n = sum_j x_j e^{-2 pi i h n . r_j}``, dense O(G L);
* ``"nufft"``: the same sum through a type-1 / type-2 NUFFT pair fused on the fine grid
  (``relpos.nn.mixers.nufft``): O(L w^m + G log G) per column, matching the quadrature to its
  tolerance;
* ``"random"``: random Fourier features (FLT-style, linear cost, stochastic): ``w_k ~
  f_hat / f(0)``, ``f(r_i - r_j) ~ u(r_i) . u(r_j)`` with the ``2K`` real features
  ``u(r) = [cos 2 pi w_k . r, sin 2 pi w_k . r] / sqrt(K)`` -- a rank-2K fold: the
  kernel becomes ``(u(r_i) (x) phi(q_i)) . (u(r_j) (x) phi(k_j))``, plain linear attention
  on ``2K m_f`` features (their products can be negative: the denominator is an unbiased
  estimate, not a guaranteed positive one).

Build-time checks (``plan_grid``): the quadrature is periodic with period ``1/h`` on each
axis (Poisson summation: it sums ``f(D + n/h)`` over all n), so ``h`` must make
``f`` negligible at the nearest image of every pair (``aliasing``:
``sum_{n != 0} f(|max(|n_a|/h - span_a, 0)|)`` over the images of the positions' bounding box);
``Omega`` must leave the spectrum's tail mass outside ``[-Omega, Omega]^m`` negligible
(``truncation``). Both estimates are relative to ``f(0) = 1``: with them the quadrature error is at
most ``(aliasing + truncation) sum_j |x_j|``. Given ``h`` / ``Omega`` that break the tolerance raise
``ValueError`` (e.g. h = 0.6 on the unit-cube test case); omitted ones are chosen as the largest
``h`` and smallest ``Omega`` that meet it.

Modulations (per head scale ``s``, learnable): Gaussian ``f = exp(-|D|^2 / (2 s^2))``,
``f_hat(w) = (2 pi s^2)^(m/2) exp(-2 pi^2 s^2 |w|^2)``; Cauchy (the m-D Cauchy density,
integrable in every m) ``f = (1 + |D|^2 / s^2)^(-(m+1)/2)``, ``f_hat(w) = a^m Gamma(m/2) /
(2 pi^(m/2) Gamma(m)) e^{-a |w|}``, ``a = 2 pi s``.

Shapes: ``phi_q (B, H, Lq, m_f)``, ``phi_k (B, H, Lk, m_f)``, ``v (B, H, Lk, Dv)``,
positions ``(B|1, L, m)`` float; output ``(B, H, Lq, Dv)``.

The layer: ``RelFlexformerAttention``: linear attention over tokens at arbitrary m-D positions with
a learnable integrable modulation of relative positions (the functions above hold the math, the
NUFFT path and the build-time checks).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...attention.linear.feature_maps import FeatureMap, create_feature_map
from ...validation import check_bool, check_choice, check_float, check_int
from ..head_projections import ProjectedHeads
from .nufft import NUFFTGrid, nufft_convolve, spreading_matrix

__all__ = [
    "CauchyModulation",
    "GaussianModulation",
    "MODULATIONS",
    "Modulation",
    "SpectralGrid",
    "create_modulation",
    "direct_convolution",
    "plan_grid",
    "position_features",
    "quadrature_convolution",
    "nufft_convolution",
    "relflexformer_attention",
    "relflexformer_reference",
    "RelFlexformerAttention",
]


#: largest quadrature grid ``(2K + 1)^m`` a call may plan (the fine grid is ~8x that in 3-D)
MAX_GRID_NODES = 2**21
METHODS = ("nufft", "quadrature", "direct", "random")


class Modulation(nn.Module):
    """An integrable, non-negative modulation ``f_h(D)`` of relative positions, one scale
    ``s_h > 0`` per head (a parameter when ``learnable``), normalised to ``f(0) = 1``.

    ``spatial(d2)``: ``f`` from squared distances ``d2 (..., H, ...)`` broadcast on the head
    axis given; ``spectrum(w2)``: ``f_hat`` at squared frequencies ``w2 (N,)`` -> ``(H, N)``;
    ``bound(rho)`` / ``tail(omega)``: the largest ``f`` at radius ``rho`` and spectral mass
    outside ``[-omega, omega]^m`` over the heads (floats, for planning); ``draw(K,
    generator)``: base samples ``(K, m)`` that ``frequencies`` maps to ``w ~ f_hat / f(0)``
    per head (reparametrised: gradients reach the scales)."""

    name = ""

    def __init__(
        self,
        num_heads: int,
        dims: int = 3,
        scale: float | tuple[float, ...] | list[float] = 1.0,
        *,
        learnable: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = check_int(num_heads, "num_heads")
        self.dims = check_int(dims, "dims", maximum=3)
        if isinstance(scale, (list, tuple)):
            if len(scale) != num_heads:
                raise ValueError(
                    f"scale must be a positive number or one per head ({num_heads}), got "
                    f"{len(scale)} values"
                )
            values = [check_float(s, f"scale[{n}]", above=0.0) for n, s in enumerate(scale)]
        else:
            values = [check_float(scale, "scale", above=0.0)] * num_heads
        log_scale = torch.tensor(values, dtype=torch.float64).log()
        self.learnable = check_bool(learnable, "learnable")
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale.float())
        else:
            self.register_buffer("log_scale", log_scale.float())

    @property
    def scale(self) -> Tensor:
        """``(H,)`` the per-head scales ``s``."""
        return self.log_scale.exp()

    def _scales(self) -> list[float]:
        return [float(s) for s in self.scale.detach().double()]

    def spatial(self, d2: Tensor, head_dim: int = 1) -> Tensor:
        raise NotImplementedError

    def spectrum(self, w2: Tensor) -> Tensor:
        raise NotImplementedError

    def bound(self, rho: Tensor) -> Tensor:
        """``max_h f_h`` at radii ``rho`` (float64, no gradient)."""
        raise NotImplementedError

    def tail(self, omega: float) -> float:
        raise NotImplementedError

    def draw(self, num: int, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def frequencies(self, base: Tensor) -> Tensor:
        """``(H, K, m)`` frequencies from base samples ``(K, m)``: ``w = base / (2 pi s_h)``."""
        s = self.scale.to(base.dtype)
        return base[None] / (2 * math.pi * s[:, None, None])

    def extra_repr(self) -> str:
        scales = ", ".join(f"{s:.4g}" for s in self._scales())
        return f"num_heads={self.num_heads}, dims={self.dims}, scale=({scales})"


class GaussianModulation(Modulation):
    """``f(D) = exp(-|D|^2 / (2 s^2))``, ``f_hat(w) = (2 pi s^2)^(m/2) exp(-2 pi^2 s^2
    |w|^2)``; random frequencies ``w = g / (2 pi s)``, ``g ~ N(0, I)``."""

    name = "gaussian"

    def spatial(self, d2: Tensor, head_dim: int = 1) -> Tensor:
        s = _on_head_axis(self.scale.to(d2.dtype), d2.dim(), head_dim)
        return torch.exp(-d2 / (2 * s * s))

    def spectrum(self, w2: Tensor) -> Tensor:
        s = self.scale.to(w2.dtype)[:, None]
        m = self.dims
        return (2 * math.pi * s * s) ** (m / 2) * torch.exp(-2 * math.pi**2 * s * s * w2)

    def bound(self, rho: Tensor) -> Tensor:
        s = max(self._scales())
        return torch.exp(-(rho.double() ** 2) / (2 * s * s))

    def tail(self, omega: float) -> float:
        s = min(self._scales())
        inside = math.erf(math.sqrt(2) * math.pi * s * omega)
        return 1.0 - inside**self.dims

    def draw(self, num: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(num, self.dims, generator=generator, dtype=torch.float64)


class CauchyModulation(Modulation):
    """The m-D Cauchy density ``f(D) = (1 + |D|^2 / s^2)^(-(m+1)/2)`` (integrable in every
    m), ``f_hat(w) = a^m Gamma(m/2) / (2 pi^(m/2) Gamma(m)) e^{-a |w|}``, ``a = 2 pi s``;
    random frequencies ``w = rho u / (2 pi s)``, ``rho ~ Gamma(m, 1)``, ``u`` uniform on the
    sphere. Its polynomial tail needs a larger period (smaller ``h``) than a Gaussian."""

    name = "cauchy"

    def spatial(self, d2: Tensor, head_dim: int = 1) -> Tensor:
        s = _on_head_axis(self.scale.to(d2.dtype), d2.dim(), head_dim)
        return (1 + d2 / (s * s)) ** (-(self.dims + 1) / 2)

    def spectrum(self, w2: Tensor) -> Tensor:
        m = self.dims
        a = 2 * math.pi * self.scale.to(w2.dtype)[:, None]
        norm = math.gamma(m / 2) / (2 * math.pi ** (m / 2) * math.gamma(m))
        return norm * a**m * torch.exp(-a * w2.clamp(min=0).sqrt())

    def bound(self, rho: Tensor) -> Tensor:
        s = max(self._scales())
        return (1 + rho.double() ** 2 / (s * s)) ** (-(self.dims + 1) / 2)

    def tail(self, omega: float) -> float:
        # mass outside the ball of radius omega (the box contains it): Q(m, a omega)
        x = 2 * math.pi * min(self._scales()) * omega
        return math.exp(-x) * sum(x**k / math.factorial(k) for k in range(self.dims))

    def draw(self, num: int, generator: torch.Generator | None = None) -> Tensor:
        u = torch.randn(num, self.dims, generator=generator, dtype=torch.float64)
        u = u / u.norm(dim=-1, keepdim=True).clamp(min=1e-300)
        # Gamma(m, 1) radius as a sum of m unit exponentials
        e = torch.rand(num, self.dims, generator=generator, dtype=torch.float64)
        rho = -torch.log1p(-e).sum(-1, keepdim=True)
        return rho * u


MODULATIONS: dict[str, type[Modulation]] = {
    "gaussian": GaussianModulation,
    "cauchy": CauchyModulation,
}


def create_modulation(
    modulation: str | Modulation, num_heads: int, dims: int = 3, **options: object
) -> Modulation:
    """A ``Modulation`` by name (``"gaussian"``, ``"cauchy"``; ``options``: ``scale``,
    ``learnable``) or the instance itself (checked against ``num_heads`` and ``dims``)."""
    if isinstance(modulation, Modulation):
        if options:
            raise ValueError("modulation options apply to a modulation given by name only")
        if modulation.num_heads != num_heads or modulation.dims != dims:
            raise ValueError(
                f"modulation has num_heads={modulation.num_heads}, dims={modulation.dims}; "
                f"the call needs num_heads={num_heads}, dims={dims}"
            )
        return modulation
    if not isinstance(modulation, str):
        raise TypeError(
            f"modulation must be one of {sorted(MODULATIONS)} or a "
            f"relpos.nn.mixers.relflexformer.Modulation, got {type(modulation).__name__}"
        )
    check_choice(modulation, "modulation", tuple(MODULATIONS))
    return MODULATIONS[modulation](num_heads, dims, **options)  # type: ignore[arg-type]


def _on_head_axis(s: Tensor, ndim: int, head_dim: int) -> Tensor:
    shape = [1] * ndim
    shape[head_dim] = -1
    return s.view(shape)


# ------------------------------------------------------------------------- grid planning
@dataclass(frozen=True)
class SpectralGrid:
    """The quadrature grid ``w = h n``, ``|n_a| <= half_modes`` (``omega = half_modes h``),
    with the estimates it was checked against (relative to ``f(0) = 1``)."""

    h: float
    half_modes: int
    dims: int
    aliasing: float
    truncation: float
    tol: float

    @property
    def omega(self) -> float:
        return self.half_modes * self.h

    @property
    def nodes(self) -> int:
        return (2 * self.half_modes + 1) ** self.dims

    def frequencies(self, device: torch.device | None = None) -> Tensor:
        """``(nodes, m)`` float64 frequencies (mode ``-K`` first, last axis fastest)."""
        k = torch.arange(-self.half_modes, self.half_modes + 1, dtype=torch.float64) * self.h
        mesh = torch.meshgrid(*([k] * self.dims), indexing="ij")
        return torch.stack(mesh, -1).reshape(-1, self.dims).to(device)


@functools.lru_cache(maxsize=8)
def _images(dims: int, reach: int = 3) -> Tensor:
    """``|n|`` for the periodic images ``n != 0`` with ``|n_a| <= reach`` (cached: read only)."""
    n = [m for m in itertools.product(range(-reach, reach + 1), repeat=dims) if any(m)]
    return torch.tensor(n, dtype=torch.float64).abs()


@functools.lru_cache(maxsize=1)
def _image_radii(reach: int = 3) -> Tensor:
    """Radii beyond the box of images, for the far-image integral (cached: read only)."""
    return (reach + 0.5) * torch.logspace(0, 8, 801, dtype=torch.float64)


def aliasing_estimate(modulation: Modulation, span: Tensor, h: float) -> float:
    """``sum_{n != 0} max_h f(|max(|n_a| / h - span_a, 0)|)`` over the periodic images
    ``|n_a| <= 3``: how much of ``f``'s periodisation reaches pairs inside the positions'
    bounding box ``span (m,)``. 1 or more when ``1/h`` does not exceed the span."""
    reach = 3
    gap = (_images(modulation.dims, reach) / h - span.double()[None]).clamp(min=0)
    near = float(modulation.bound(gap.norm(dim=-1)).sum())
    # images beyond the box of reach 3 (matters for polynomial tails: Cauchy), as the
    # integral over image radii R > reach + 1/2 of S_{m-1} R^(m-1) f(R / h - |span|)
    m = modulation.dims
    radii = _image_radii(reach)
    rho = (radii / h - float(span.double().norm())).clamp(min=0)
    sphere = 2 * math.pi ** (m / 2) / math.gamma(m / 2)
    far = float(torch.trapezoid(sphere * radii ** (m - 1) * modulation.bound(rho), radii))
    return near + far


def plan_grid(
    modulation: Modulation,
    span: Tensor,
    tol: float,
    *,
    h: float | None = None,
    omega: float | None = None,
) -> SpectralGrid:
    """The quadrature grid for positions whose bounding box has sides ``span (m,)``: the
    largest ``h`` with ``aliasing_estimate <= tol / 3`` and the smallest ``omega`` with
    ``modulation.tail(omega) <= tol / 3`` unless given; given ones that break ``tol`` raise
    ``ValueError`` naming the condition. ``ValueError`` too when the grid would exceed
    ``MAX_GRID_NODES``."""
    tol = check_float(tol, "tol", above=0.0, below=1.0)
    span = span.detach().double().cpu().clamp(min=0)
    budget = tol / 3
    period = None
    if h is not None:
        h = check_float(h, "h", above=0.0)
        a = aliasing_estimate(modulation, span, h)
        if a > tol:
            widest = float(span.max())
            raise ValueError(
                f"h={h:g} aliases: the quadrature is periodic with period 1/h = {1 / h:.4g} per "
                f"axis, the positions span up to {widest:.4g}, and the modulation at the "
                f"nearest periodic images sums to {a:.3g} > tol={tol:g}; use a smaller h "
                f"(or h=None to choose it)"
            )
    else:
        low = float(span.max()) + 1e-12
        high = 2 * low + 1.0
        while aliasing_estimate(modulation, span, 1 / high) > budget:
            low, high = high, 2 * high
            if high > 1e12:
                raise ValueError("no quadrature period makes the aliasing small enough")
        for _ in range(40):
            mid = 0.5 * (low + high)
            if aliasing_estimate(modulation, span, 1 / mid) > budget:
                low = mid
            else:
                high = mid
        period = high
        h = 1 / period
    if omega is not None:
        omega = check_float(omega, "omega", above=0.0)
        t = modulation.tail(omega)
        if t > tol:
            raise ValueError(
                f"omega={omega:g} truncates the spectrum: its mass outside "
                f"[-omega, omega]^{modulation.dims} is {t:.3g} of f(0) > tol={tol:g}; use a "
                f"larger omega (or omega=None to choose it)"
            )
    else:
        low, high = 0.0, 1.0
        while modulation.tail(high) > budget:
            low, high = high, 2 * high
        for _ in range(60):
            mid = 0.5 * (low + high)
            if modulation.tail(mid) > budget:
                low = mid
            else:
                high = mid
        omega = high
    half = int(math.ceil(omega / h - 1e-9))
    grid = SpectralGrid(
        h=h,
        half_modes=half,
        dims=modulation.dims,
        aliasing=aliasing_estimate(modulation, span, h),
        truncation=modulation.tail(half * h),
        tol=tol,
    )
    if grid.nodes > MAX_GRID_NODES:
        raise ValueError(
            f"the quadrature grid would need {2 * half + 1}^{grid.dims} = {grid.nodes} nodes "
            f"(> {MAX_GRID_NODES}): the positions span {float(span.max()):.4g}, "
            f"{float(span.max()) / min(modulation._scales()):.3g} times the smallest "
            f"modulation scale; use a larger tol, method='random' or method='direct'"
        )
    return grid


# -------------------------------------------------------------------- the three sums
def _check_positions(pos: object, name: str, dims: int, length: int) -> Tensor:
    if not isinstance(pos, Tensor) or not pos.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of shape (B|1, L, {dims})")
    if pos.dim() == 2:
        pos = pos[None]
    if pos.dim() != 3 or pos.shape[-1] != dims or pos.shape[1] != length:
        raise ValueError(
            f"{name} must have shape (B|1, {length}, {dims}) (or ({length}, {dims})), got "
            f"{tuple(pos.shape)}"
        )
    if pos.numel() and not bool(torch.isfinite(pos).all()):
        raise ValueError(f"{name} must be finite")
    return pos


def direct_convolution(x: Tensor, q_pos: Tensor, k_pos: Tensor, modulation: Modulation) -> Tensor:
    """Exact ``y_i = sum_j f_h(r_i - r_j) x_j``: ``x (B, H, Lk, C)``, positions
    ``(B|1, L, m)`` -> ``(B, H, Lq, C)``. O(Lq Lk C)."""
    d2 = (q_pos.double()[:, :, None] - k_pos.double()[:, None]).pow(2).sum(-1)  # (B, Lq, Lk)
    F = modulation.spatial(d2[:, None], head_dim=1).to(x.dtype)  # (B, H, Lq, Lk)
    return F @ x


def _origin(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Positions relative to the batch's common minimum, float64, and the span ``(m,)``."""
    both = torch.cat(
        [
            q_pos.double().expand(max(q_pos.shape[0], k_pos.shape[0]), -1, -1),
            k_pos.double().expand(max(q_pos.shape[0], k_pos.shape[0]), -1, -1),
        ],
        1,
    )
    low = both.amin(1, keepdim=True)
    span = (both.amax(1) - both.amin(1)).amax(0)
    return q_pos.double() - low, k_pos.double() - low, span


def quadrature_convolution(
    x: Tensor, q_pos: Tensor, k_pos: Tensor, modulation: Modulation, grid: SpectralGrid
) -> Tensor:
    """The dense spectral quadrature of ``direct_convolution`` on ``grid``: O(G (Lq + Lk) C)
    with ``G = grid.nodes`` (a reference for the NUFFT)."""
    q_pos, k_pos, _ = _origin(q_pos, k_pos)
    w = grid.frequencies(x.device)  # (G, m)
    weights = grid.h**grid.dims * modulation.spectrum((w * w).sum(-1))  # (H, G)
    ctype = torch.complex128
    ek = _phases(k_pos, grid, -1.0)  # (B, Lk, G)
    eq = _phases(q_pos, grid, 1.0)  # (B, Lq, G)
    X = ek.transpose(-1, -2)[:, None] @ x.to(ctype)  # (B, H, G, C)
    y = eq[:, None] @ (weights[None, :, :, None].to(ctype) * X)
    return y.real.to(x.dtype)


def _phases(pos: Tensor, grid: SpectralGrid, sign: float) -> Tensor:
    """``exp(sign 2 pi i w_g . r)`` ``(B, L, G)`` complex128, as products of per-axis phases
    (``G`` in ``grid.frequencies`` order)."""
    k = torch.arange(-grid.half_modes, grid.half_modes + 1, dtype=torch.float64)
    k = k.to(pos.device) * grid.h
    out = None
    for a in range(grid.dims):
        e = torch.exp(sign * 2j * math.pi * pos[..., a, None] * k)  # (B, L, 2K+1)
        out = e if out is None else (out[..., None] * e[..., None, :]).flatten(-2)
    assert out is not None
    return out


def nufft_convolution(
    x: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    modulation: Modulation,
    grid: SpectralGrid,
    *,
    nufft_tol: float | None = None,
    nugrid: NUFFTGrid | None = None,
) -> Tensor:
    """The quadrature of ``quadrature_convolution`` by a fused type-1 / type-2 NUFFT
    (``relpos.nn.mixers.nufft``, tolerance ``nufft_tol``, default ``grid.tol / 3``; the
    cheaper upsampling for these sizes unless ``nugrid`` is given):
    ``x (B, H, Lk, C)`` -> ``(B, H, Lq, C)``."""
    B, H, Lk, C = x.shape
    if nugrid is None:
        nugrid = NUFFTGrid.cheapest(
            grid.half_modes, grid.dims, nufft_tol or grid.tol / 3, q_pos.shape[1] + Lk
        )
    q_pos, k_pos, _ = _origin(q_pos, k_pos)
    w = grid.frequencies(x.device)
    weights = grid.h**grid.dims * modulation.spectrum((w * w).sum(-1))  # (H, G)
    multiplier = weights.reshape(H, *([2 * grid.half_modes + 1] * grid.dims))
    outs = []
    same = q_pos is k_pos or (q_pos.shape == k_pos.shape and torch.equal(q_pos, k_pos))
    for b in range(B):
        kp = k_pos[min(b, k_pos.shape[0] - 1)] * (2 * math.pi * grid.h)
        qp = q_pos[min(b, q_pos.shape[0] - 1)] * (2 * math.pi * grid.h)
        spread = spreading_matrix(kp, nugrid, x.dtype)
        interp = spread if same else spreading_matrix(qp, nugrid, x.dtype)
        cols = x[b].permute(1, 0, 2).reshape(Lk, H * C)
        y = nufft_convolve(qp, kp, cols, multiplier, nugrid, spread=spread, interpolate=interp)
        outs.append(y.reshape(-1, H, C).permute(1, 0, 2))
    return torch.stack(outs)


# ------------------------------------------------------------------------ attention
def position_features(pos: Tensor, modulation: Modulation, base: Tensor) -> Tensor:
    """The rank-2K random fold of ``f``: ``u (B, H, L, 2K)`` with ``u(r_i) . u(r_j)`` an
    unbiased estimate of ``f_h(r_i - r_j)``; ``base (K, m)`` from ``modulation.draw``."""
    w = modulation.frequencies(base.to(pos.device))  # (H, K, m)
    ang = 2 * math.pi * torch.einsum("blm,hkm->bhlk", pos.double(), w.double())
    K = base.shape[0]
    return torch.cat([ang.cos(), ang.sin()], -1) / math.sqrt(K)


def relflexformer_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    modulation: Modulation,
    *,
    key_valid: Tensor | None = None,
) -> Tensor:
    """The O(Lq Lk) definition: ``A = (phi_q phi_k^T) * F``, ``z = A v / A 1`` (rows with a
    zero denominator give 0)."""
    d2 = (q_pos.double()[:, :, None] - k_pos.double()[:, None]).pow(2).sum(-1)
    F = modulation.spatial(d2[:, None], head_dim=1).to(phi_q.dtype)
    A = (phi_q @ phi_k.transpose(-1, -2)) * F
    if key_valid is not None:
        A = A * key_valid[:, None, None, :].to(A.dtype)
    num, den = A @ v.to(A.dtype), A.sum(-1, keepdim=True)
    return torch.where(den != 0, num / torch.where(den != 0, den, 1.0), 0.0)


def relflexformer_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    modulation: Modulation,
    *,
    method: str = "nufft",
    tol: float = 1e-6,
    h: float | None = None,
    omega: float | None = None,
    key_valid: Tensor | None = None,
    random_base: Tensor | None = None,
    chunk_features: int | None = None,
) -> Tensor:
    """RelFlexformer attention (module docstring): ``(B, H, Lq, Dv)``.

    Args:
        phi_q, phi_k: non-negative features ``(B, H, Lq|Lk, m_f)``; v ``(B, H, Lk, Dv)``.
        q_pos, k_pos: float positions ``(B|1, L, m)`` (m = ``modulation.dims``).
        modulation: a ``Modulation`` with ``H`` heads.
        method: ``"nufft"``, ``"quadrature"``, ``"direct"`` or ``"random"``.
        tol: quadrature tolerance (relative to ``f(0) sum_j |x_j|``) for the build-time
            checks and the NUFFT (``plan_grid``); h, omega: fix the grid (checked).
        key_valid: ``(B, Lk)`` bool, False for padded keys (zero features).
        random_base: ``(K, m)`` base samples for ``method="random"``
            (``modulation.draw``).
        chunk_features: NUFFT columns are processed this many features at a time
            (default: to keep the fine grid under ~2^26 values).

    Gradients reach the features, the values and the modulation's scales on every method;
    the positions on ``"direct"``, ``"quadrature"`` and ``"random"`` (``"nufft"`` refuses
    positions that require grad).
    """
    check_choice(method, "method", METHODS)
    if phi_q.dim() != 4 or phi_k.dim() != 4 or v.dim() != 4:
        raise ValueError("phi_q, phi_k and v must have shape (B, H, L, .)")
    B, H, Lq, m = phi_q.shape
    Lk = phi_k.shape[2]
    if phi_k.shape[:2] != (B, H) or phi_k.shape[-1] != m or v.shape[:3] != (B, H, Lk):
        raise ValueError(
            f"phi_k must be (B, H, Lk, m) = ({B}, {H}, Lk, {m}) and v (B, H, Lk, Dv), got "
            f"{tuple(phi_k.shape)} and {tuple(v.shape)}"
        )
    if modulation.num_heads != H:
        raise ValueError(f"modulation has {modulation.num_heads} heads, the call {H}")
    q_pos = _check_positions(q_pos, "q_pos", modulation.dims, Lq)
    k_pos = _check_positions(k_pos, "k_pos", modulation.dims, Lk)
    if key_valid is not None:
        if key_valid.shape != (B, Lk) or key_valid.dtype != torch.bool:
            raise ValueError(f"key_valid must be a bool tensor of shape ({B}, {Lk})")
        phi_k = phi_k * key_valid[:, None, :, None].to(phi_k.dtype)
    Dv = v.shape[-1]
    work = phi_q.dtype
    v = v.to(work)
    if Lq == 0 or Lk == 0:
        return phi_q.new_zeros(B, H, Lq, Dv)
    if method == "direct":
        return relflexformer_reference(phi_q, phi_k, v, q_pos, k_pos, modulation)
    if method == "random":
        if random_base is None:
            raise ValueError("method='random' needs random_base (modulation.draw(K))")
        uq = position_features(q_pos, modulation, random_base).to(work)
        uk = position_features(k_pos, modulation, random_base).to(work)
        fq = (uq[..., :, None] * phi_q[..., None, :]).flatten(-2)  # (B, H, Lq, 2K m)
        fk = (uk[..., :, None] * phi_k[..., None, :]).flatten(-2)
        num = fq @ (fk.transpose(-1, -2) @ v)
        den = (fq * fk.sum(-2, keepdim=True)).sum(-1, keepdim=True)
        return torch.where(den != 0, num / torch.where(den != 0, den, 1.0), 0.0)
    if (
        method == "nufft"
        and torch.is_grad_enabled()
        and (q_pos.requires_grad or k_pos.requires_grad)
    ):
        raise ValueError(
            "method='nufft' gives no gradient to the positions (its spreading kernel is "
            "evaluated as data); positions that require grad need method='direct', "
            "'quadrature' or 'random'"
        )
    _, _, span = _origin(q_pos, k_pos)
    with torch.no_grad():
        grid = plan_grid(modulation, span, tol, h=h, omega=omega)
    x = torch.cat([phi_k[..., None] * v[..., None, :], phi_k[..., None]], -1)  # (B,H,Lk,m,Dv+1)
    if method == "quadrature":
        y = quadrature_convolution(x.flatten(-2), q_pos, k_pos, modulation, grid)
        y = y.unflatten(-1, (m, Dv + 1))
    else:
        nugrid = NUFFTGrid.cheapest(grid.half_modes, grid.dims, tol / 3, Lq + Lk)
        if chunk_features is None:
            fine = nugrid.fine**grid.dims
            chunk_features = max(1, min(m, 2**26 // max(1, fine * H * (Dv + 1))))
        parts = [
            nufft_convolution(
                x[..., s : s + chunk_features, :].flatten(-2),
                q_pos,
                k_pos,
                modulation,
                grid,
                nugrid=nugrid,
            ).unflatten(-1, (-1, Dv + 1))
            for s in range(0, m, chunk_features)
        ]
        y = torch.cat(parts, -2)
    num = (phi_q[..., None] * y[..., :Dv]).sum(-2)
    den = (phi_q * y[..., Dv]).sum(-1, keepdim=True)
    # rows whose exact denominator is 0 (every key padded): den is rounding noise there
    alive = torch.ones(B, 1, 1, 1, dtype=torch.bool, device=phi_q.device)
    if key_valid is not None:
        alive = key_valid.any(-1).view(B, 1, 1, 1)
    ok = alive & (den != 0)
    return torch.where(ok, num / torch.where(ok, den, 1.0), 0.0)


class RelFlexformerAttention(ProjectedHeads, nn.Module):
    """Multi-head RelFlexformer attention (Kim et al. 2026, arXiv 2605.10706; a reconstruction).

    ``z_i = sum_j f_h(r_i - r_j) (phi(q_i) . phi(k_j)) v_j / sum_j f_h(r_i - r_j)
    (phi(q_i) . phi(k_j))`` per head, with ``q, k, v`` linear projections of ``x``, a
    non-negative feature map ``phi`` and a modulation ``f_h`` with a learnable scale per head.

    Args:
        dim, num_heads: model width and heads (``head_dim = dim // num_heads``).
        dims: position axes m (1, 2, 3).
        modulation: ``"gaussian"``, ``"cauchy"`` or a ``Modulation``; ``modulation_options``
            (``scale``: one number or one per head, in position units; ``learnable``).
        feature_map: ``"elu1"``, ``"relu"``, ``"prf"`` or a ``FeatureMap`` for ``head_dim``.
        method: ``"nufft"`` (default, O(L log L)), ``"quadrature"``, ``"direct"`` (exact
            O(L^2)) or ``"random"`` (``num_samples`` random Fourier features of the
            modulation, a rank-2K fold drawn at construction from ``seed``; ``redraw()``).
        tol: the quadrature / NUFFT tolerance (``relflexformer.plan_grid`` raises when the
            positions make it unreachable).

    ``forward(x (B, L, dim), pos (B|1, L, m) float, mask (B, L) bool = None) -> (B, L, dim)``;
    ``mask`` False marks padded tokens (they are never attended to).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        dims: int = 3,
        modulation: str | Modulation = "gaussian",
        modulation_options: dict[str, Any] | None = None,
        feature_map: str | FeatureMap = "elu1",
        method: str = "nufft",
        tol: float = 1e-6,
        num_samples: int = 64,
        seed: int = 0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        dim = check_int(dim, "dim")
        num_heads = check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.method = check_choice(method, "method", METHODS)
        self.tol = check_float(tol, "tol", above=0.0, below=1.0)
        self.modulation = create_modulation(
            modulation, num_heads, dims, **(modulation_options or {})
        )
        self.feature_map = create_feature_map(feature_map, self.head_dim)
        self._build_projections(bias)
        self.num_samples = check_int(num_samples, "num_samples")
        self.seed = check_int(seed, "seed", minimum=0)
        base = self.modulation.draw(self.num_samples, torch.Generator().manual_seed(self.seed))
        self.register_buffer("random_base", base)

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """New random frequencies for ``method="random"`` (in place)."""
        self.random_base.copy_(self.modulation.draw(self.num_samples, generator))

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self._project(x)
        scale = self.head_dim**-0.5
        phi_q, _ = self.feature_map(q, "q", scale)
        phi_k, _ = self.feature_map(k, "k", scale)  # a per-(b, h) key offset cancels
        out = relflexformer_attention(
            phi_q,
            phi_k,
            v,
            pos,
            pos,
            self.modulation,
            method=self.method,
            tol=self.tol,
            key_valid=mask,
            random_base=self.random_base,
        )
        return self._merge(out.to(x.dtype))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, method={self.method!r}, tol={self.tol:g}"
        )
