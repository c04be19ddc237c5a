"""Non-uniform FFT (NUFFT) in torch: type 1 (points -> modes), type 2 (modes -> points) and
the two fused around a diagonal spectral multiplier (``nufft_convolve``).

Method: "exponential of semicircle" (ES) spreading kernel of FINUFFT (Barnett, Magland,
af Klinteberg, "A parallel non-uniform fast Fourier transform library based on an
'exponential of semicircle' kernel", SIAM J. Sci. Comput. 2019), written here from the paper's
formulas (no code taken). For a requested relative tolerance ``eps`` and upsampling 2
(1.25: ``w = ceil(ln(1/eps) / (pi sqrt(1 - 1/sigma)))``, ``beta = 0.97 pi (1 - 1/(2 sigma))
w``; ``NUFFTGrid.cheapest`` picks the cheaper of the two for a call):

    kernel width  w = ceil(log10(1 / eps)) + 1 fine-grid points,  beta = 2.30 w,
    phi(z) = exp(beta (sqrt(1 - z^2) - 1)) on |z| <= 1,  psi(t) = phi(t / alpha),
    alpha = w pi / n_f  (half the kernel support, ``n_f`` fine-grid points per axis).

Per axis, points ``theta_j`` in [0, 2 pi) (any real value: taken modulo 2 pi), modes
``k = -K .. K``:

* type 1: ``X_k = sum_j x_j e^{-i k . theta_j}`` ~ ``(2 pi / n_f)^d / psi_hat(k) *
  FFT(spread)[k]``, where ``spread_g = sum_j x_j psi(g 2 pi / n_f - theta_j)`` (periodic);
* type 2: ``y_i = sum_k c_k e^{i k . theta_i}`` ~ ``(2 pi / n_f)^d sum_g u_g psi(theta_i -
  g 2 pi / n_f)``, ``u = n_f^d IFFT(c / psi_hat)`` (zero outside the kept modes);

``psi_hat(k) = alpha int_{-1}^{1} phi(z) cos(k alpha z) dz`` by Gauss-Legendre quadrature
(float64), and ``d``-D kernels are products over the axes. Spreading and interpolation are
one sparse matrix ``S (n_f^d, L)`` with ``w^d`` entries per point (``torch.sparse.mm``,
differentiable in the values it multiplies), so a call costs
``O(L w^d C + n_f^d log n_f C)`` for ``C`` columns.

Shapes: ``points (L, d)`` angles; columns ``x (L, C)``; ``d`` = 1, 2 or 3. The relative
error of ``nufft_convolve`` against its dense sum is below ``eps sum_j |x_j| sum_k |W_k|`` (type 1's
error carried by each mode; ``sum_k W_k ~ f(0)`` for a quadrature of a spectrum), measured in
tests/efficient/test_nufft.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...validation import check_float, check_int

__all__ = [
    "NUFFTGrid",
    "kernel_width",
    "nufft_convolve",
    "nufft_type1",
    "nufft_type2",
    "spreading_matrix",
]

UPSAMPLING = 2.0
MIN_TOLERANCE = 1e-14


def kernel_width(tol: float, upsampling: float = UPSAMPLING) -> int:
    """ES kernel width ``w`` (fine-grid points) for relative tolerance ``tol`` (FINUFFT's
    rules: ``ceil(log10(1/tol)) + 1`` at upsampling 2, ``ceil(ln(1/tol) / (pi sqrt(1 -
    1/sigma)))`` otherwise), between 2 and 16."""
    tol = check_float(tol, "tol", above=0.0)
    upsampling = check_float(upsampling, "upsampling", minimum=1.25, maximum=2.0)
    tol = max(tol, MIN_TOLERANCE)
    if upsampling == 2.0:
        w = math.ceil(math.log10(1.0 / tol)) + 1
    else:
        w = math.ceil(math.log(1.0 / tol) / (math.pi * math.sqrt(1 - 1 / upsampling)))
    return int(min(16, max(2, w)))


def _beta(width: int, upsampling: float) -> float:
    """The ES shape parameter: ``2.30 w`` at upsampling 2, ``0.97 pi (1 - 1/(2 sigma)) w``
    otherwise (FINUFFT)."""
    if upsampling == 2.0:
        return 2.30 * width
    return 0.97 * math.pi * (1 - 1 / (2 * upsampling)) * width


def _fine_size(modes: int, width: int, upsampling: float = UPSAMPLING) -> int:
    """Fine-grid points per axis: ``>= sigma * modes`` and ``>= 2 w``, even, 2-3-5-smooth."""
    n = max(int(math.ceil(upsampling * modes)), 2 * width)
    while True:
        if n % 2 == 0:
            m = n
            for p in (2, 3, 5):
                while m % p == 0:
                    m //= p
            if m == 1:
                return n
        n += 1


@functools.lru_cache(maxsize=64)
def _legendre(order: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(order)


def _kernel_transform(half_modes: int, width: int, beta: float, alpha: float) -> Tensor:
    """``psi_hat(k) = alpha int_{-1}^{1} phi(z) cos(k alpha z) dz`` for ``k = -K..K``
    (Gauss-Legendre, float64)."""
    z, wq = _legendre(4 * width + 40)
    phi = np.exp(beta * (np.sqrt(1.0 - z * z) - 1.0))
    k = np.arange(-half_modes, half_modes + 1, dtype=np.float64)
    return torch.from_numpy(alpha * (wq * phi * np.cos(np.outer(k, alpha * z))).sum(-1))


@dataclass(frozen=True)
class NUFFTGrid:
    """Modes ``-K .. K`` per axis (``K = half_modes``) on ``dims`` axes, for tolerance
    ``tol`` and upsampling ``sigma`` (2, or down to 1.25: a fine grid ``sigma^d`` times the
    modes, with a wider kernel): the kernel width ``w``, ``beta``, the fine grid ``n_f`` per
    axis and the deconvolution ``psi_hat`` at the kept modes ``(2K + 1,)`` (float64)."""

    half_modes: int
    dims: int
    tol: float
    width: int
    beta: float
    fine: int
    psi_hat: Tensor
    upsampling: float = UPSAMPLING

    @classmethod
    def create(
        cls, half_modes: int, dims: int, tol: float, upsampling: float = UPSAMPLING
    ) -> NUFFTGrid:
        half_modes = check_int(half_modes, "half_modes", minimum=0)
        dims = check_int(dims, "dims", minimum=1)
        if dims > 3:
            raise ValueError(f"dims must be 1, 2 or 3 for the NUFFT, got {dims}")
        w = kernel_width(tol, upsampling)
        beta = _beta(w, upsampling)
        fine = _fine_size(2 * half_modes + 1, w, upsampling)
        alpha = math.pi * w / fine
        psi_hat = _kernel_transform(half_modes, w, beta, alpha)
        return cls(half_modes, dims, float(tol), w, beta, fine, psi_hat, upsampling)

    @classmethod
    def cheapest(cls, half_modes: int, dims: int, tol: float, points: int) -> NUFFTGrid:
        """The grid of upsampling 2 or 1.25 with the smaller estimated cost per column,
        ``points w^d + n_f^d log2 n_f`` (spreading + FFT): 1.25 wins when the fine grid
        dominates (few points, many modes)."""

        def cost(g: NUFFTGrid) -> float:
            return points * g.width**dims + g.fine**dims * math.log2(max(g.fine, 2)) * 2

        return min((cls.create(half_modes, dims, tol, s) for s in (2.0, 1.25)), key=cost)

    @property
    def modes(self) -> int:
        return 2 * self.half_modes + 1


def spreading_matrix(points: Tensor, grid: NUFFTGrid, dtype: torch.dtype) -> Tensor:
    """``S (n_f^d, L)`` sparse (COO, coalesced): ``S[g, j] = prod_a psi(g_a 2 pi / n_f -
    theta_ja)`` over the ``w^d`` fine-grid points ``g`` nearest each point (periodic).
    ``points (L, d)`` angles (float64 advised). Spreading is ``S @ x``, interpolation
    ``S^T @ u``."""
    L, d = points.shape
    if d != grid.dims:
        raise ValueError(f"points have {d} axes but the grid was planned for {grid.dims}")
    n, w = grid.fine, grid.width
    h = 2 * math.pi / n
    alpha = w * h / 2
    t = torch.remainder(points.to(torch.float64), 2 * math.pi) / h  # in grid units
    first = torch.ceil(t - w / 2)  # (L, d)
    offsets = torch.arange(w, device=points.device, dtype=torch.float64)
    g = first[..., None] + offsets  # (L, d, w)
    z = ((g - t[..., None]) * h / alpha).clamp(-1.0, 1.0)
    vals = torch.exp(grid.beta * (torch.sqrt(1.0 - z * z) - 1.0))  # (L, d, w)
    idx = torch.remainder(g.long(), n)
    flat = idx[:, 0]
    val = vals[:, 0]
    for a in range(1, d):
        flat = (flat[..., None] * n + idx[:, a].view(L, 1, w)).reshape(L, -1)
        val = (val[..., None] * vals[:, a].view(L, 1, w)).reshape(L, -1)
    flat = flat.reshape(L, -1)
    val = val.reshape(L, -1)
    cols = torch.arange(L, device=points.device)[:, None].expand_as(flat)
    index = torch.stack([flat.reshape(-1), cols.reshape(-1)])
    S = torch.sparse_coo_tensor(index, val.reshape(-1).to(dtype), (n**d, L), check_invariants=False)
    return S.coalesce()


def _deconvolution(grid: NUFFTGrid, device: torch.device) -> Tensor:
    """``prod_a psi_hat(k_a)`` on the kept modes: ``(2K+1,) * d``, float64."""
    p = grid.psi_hat.to(device)
    out = p
    for _ in range(1, grid.dims):
        out = out[..., None] * p
    return out


def _modes_to_fine(c: Tensor, grid: NUFFTGrid) -> Tensor:
    """Kept modes ``(..., 2K+1, ...)`` (k = -K..K per axis, last ``d`` dims) placed in FFT
    order on the fine grid ``(..., n_f, ...)``, zeros elsewhere."""
    K, n, d = grid.half_modes, grid.fine, grid.dims
    out = c.new_zeros(*c.shape[:-d], *([n] * d))
    k = torch.arange(-K, K + 1, device=c.device) % n
    index: list[object] = [Ellipsis]
    for a in range(d):
        shape = [1] * d
        shape[a] = -1
        index.append(k.view(shape))
    out[tuple(index)] = c
    return out


def _fine_to_modes(f: Tensor, grid: NUFFTGrid) -> Tensor:
    K, n, d = grid.half_modes, grid.fine, grid.dims
    k = torch.arange(-K, K + 1, device=f.device) % n
    index: list[object] = [Ellipsis]
    for a in range(d):
        shape = [1] * d
        shape[a] = -1
        index.append(k.view(shape))
    return f[tuple(index)]


def nufft_type1(points: Tensor, x: Tensor, grid: NUFFTGrid) -> Tensor:
    """``X_k = sum_j x_j e^{-i k . theta_j}`` for ``points (L, d)``, ``x (L, C)`` real or
    complex: ``(C, 2K+1, ..., 2K+1)`` complex (mode ``-K`` first on every axis)."""
    L, C = x.shape
    real = torch.float64 if x.dtype in (torch.float64, torch.complex128) else torch.float32
    S = spreading_matrix(points, grid, real)
    if x.is_complex():
        b = torch.complex(
            torch.sparse.mm(S, x.real.contiguous()), torch.sparse.mm(S, x.imag.contiguous())
        )
    else:
        b = torch.sparse.mm(S, x.to(real))
    n, d = grid.fine, grid.dims
    b = b.T.reshape(C, *([n] * d))
    B = torch.fft.fftn(b, dim=tuple(range(-d, 0)))
    scale = (2 * math.pi / n) ** d / _deconvolution(grid, x.device)
    return _fine_to_modes(B, grid) * scale.to(B.dtype)


def nufft_type2(points: Tensor, c: Tensor, grid: NUFFTGrid) -> Tensor:
    """``y_i = sum_k c_k e^{i k . theta_i}`` for ``points (L, d)``, ``c (C, 2K+1, ...)``
    complex: ``(L, C)`` complex."""
    n, d = grid.fine, grid.dims
    C = c.shape[0]
    complex_dtype = torch.complex128 if c.dtype == torch.complex128 else torch.complex64
    real = torch.float64 if complex_dtype == torch.complex128 else torch.float32
    scaled = c.to(complex_dtype) / _deconvolution(grid, c.device).to(complex_dtype)
    u = torch.fft.ifftn(_modes_to_fine(scaled, grid), dim=tuple(range(-d, 0))) * n**d
    u = u.reshape(C, -1).T  # (n^d, C)
    St = spreading_matrix(points, grid, real).t()
    y = torch.complex(
        torch.sparse.mm(St, u.real.contiguous()), torch.sparse.mm(St, u.imag.contiguous())
    )
    return y * (2 * math.pi / n) ** d


def nufft_convolve(
    out_points: Tensor,
    in_points: Tensor,
    x: Tensor,
    multiplier: Tensor,
    grid: NUFFTGrid,
    *,
    spread: Tensor | None = None,
    interpolate: Tensor | None = None,
) -> Tensor:
    """``y_i = sum_k W_k e^{i k . theta_i} sum_j x_j e^{-i k . theta_j}`` for a real,
    even multiplier ``W`` (``(G, 2K+1, ..., 2K+1)``: one per group of columns, ``G``
    dividing ``C``), real ``x (L_in, C)``: ``(L_out, C)`` real. Type 1, the multiplier and
    type 2 fused on the fine grid: spread, ``rfftn``, multiply by ``W / psi_hat^2`` (zero
    outside the kept modes), ``irfftn``, interpolate. ``spread`` / ``interpolate``: the
    sparse matrices of ``in_points`` / ``out_points`` when the caller reuses them.
    Differentiable in ``x`` and ``multiplier``."""
    n, d = grid.fine, grid.dims
    L_in, C = x.shape
    G = multiplier.shape[0]
    if C % G:
        raise ValueError(f"multiplier has {G} groups, which must divide the {C} columns of x")
    real = x.dtype
    if spread is None:
        spread = spreading_matrix(in_points, grid, real)
    if interpolate is None:
        interpolate = (
            spread if out_points is in_points else spreading_matrix(out_points, grid, real)
        )
    b = torch.sparse.mm(spread, x)  # (n^d, C)
    b = b.T.reshape(G, C // G, *([n] * d))
    dims = tuple(range(-d, 0))
    spectrum = torch.fft.rfftn(b, dim=dims)
    weight = multiplier.to(torch.float64) / _deconvolution(grid, x.device) ** 2
    weight = weight * (2 * math.pi / n) ** (2 * d) * n**d
    full = _modes_to_fine(weight, grid)[..., : n // 2 + 1]  # (G, n, .., n//2+1)
    spectrum = spectrum * full[:, None].to(real)
    u = torch.fft.irfftn(spectrum, s=[n] * d, dim=dims)  # (G, C/G, n, ...)
    u = u.reshape(C, -1).T
    return torch.sparse.mm(interpolate.t(), u.contiguous())
