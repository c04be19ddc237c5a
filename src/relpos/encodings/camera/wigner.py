"""Real Wigner-D matrices: the irreducible orthogonal representations of SO(3) (GTA's SO(3)
section; the standard construction, not GTA's own ``wigner_d.py``).

Real spherical harmonics of degree ``l`` (orthonormal on the sphere, order ``m = -l .. l``):

    Y_l0 = N_l0 P~_l^0(z),   Y_lm = sqrt 2 N_lm P~_l^m(z) Re (x + i y)^m,
    Y_l,-m = sqrt 2 N_lm P~_l^m(z) Im (x + i y)^m,   N_lm = sqrt((2l+1)/(4 pi) (l-m)!/(l+m)!)

with ``P~_l^m = d^m P_l / dz^m`` (Legendre; no Condon-Shortley phase: a sign per function,
which keeps the basis orthonormal). ``D^l(R)`` is the matrix with ``Y_l(R x) = D^l(R)
Y_l(x)`` for every unit ``x``: a homomorphism (``D(R1 R2) = D(R1) D(R2)``), orthogonal, and
``D^1(R) = Pi R Pi^T`` with ``Pi`` the coordinate order ``(y, z, x)``. It is computed
exactly (to rounding) from ``2 (2l + 1)`` fixed points on the sphere: ``D(R) = Y(R X)
Y(X)^+``, in float64.

Shapes: ``R (..., 3, 3)`` -> ``(..., 2l+1, 2l+1)``; points ``(..., 3)`` -> ``(..., 2l+1)``.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from torch import Tensor

from ...validation import check_int

__all__ = ["real_spherical_harmonics", "wigner_d"]


@cache
def _legendre_derivative(l: int, m: int) -> tuple[float, ...]:
    """Power-series coefficients (low to high) of ``d^m P_l / dz^m``."""
    poly = np.polynomial.legendre.Legendre.basis(l).deriv(m).convert(kind=np.polynomial.Polynomial)
    return tuple(float(c) for c in poly.coef)


def real_spherical_harmonics(points: Tensor, l: int) -> Tensor:
    """Orthonormal real spherical harmonics of degree ``l`` at unit ``points (..., 3)``:
    ``(..., 2l+1)``, ordered ``m = -l .. l`` (module docstring)."""
    l = check_int(l, "l", minimum=0)
    x, y, z = points[..., 0], points[..., 1], points[..., 2]
    out = [torch.zeros_like(x)] * (2 * l + 1)
    re, im = torch.ones_like(x), torch.zeros_like(x)  # (x + i y)^m, real arithmetic
    for m in range(l + 1):
        coef = _legendre_derivative(l, m)
        legendre = sum(c * z**k for k, c in enumerate(coef)) if coef else torch.zeros_like(z)
        norm = math.sqrt(
            (2 * l + 1) / (4 * math.pi) * math.factorial(l - m) / math.factorial(l + m)
        )
        if m == 0:
            out[l] = norm * legendre
        else:
            scale = math.sqrt(2.0) * norm * legendre
            out[l + m] = scale * re
            out[l - m] = scale * im
        re, im = re * x - im * y, re * y + im * x
    return torch.stack(out, -1)


@cache
def _sample_points(l: int) -> tuple[Tensor, Tensor]:
    """``2 (2l + 1)`` Fibonacci points on the sphere ``(N, 3)`` and ``Y(X)^+ (N, 2l+1)``."""
    n = 2 * (2 * l + 1)
    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / n
    phi = math.pi * (1 + math.sqrt(5.0)) * i
    r = torch.sqrt(1 - z * z)
    X = torch.stack((r * phi.cos(), r * phi.sin(), z), -1)
    Y = real_spherical_harmonics(X, l).T  # (2l+1, N)
    return X, torch.linalg.pinv(Y)


def wigner_d(R: Tensor, l: int) -> Tensor:
    """The real Wigner-D matrix ``D^l(R)`` of rotations ``R (..., 3, 3)``: ``(..., 2l+1,
    2l+1)`` float64, with ``Y_l(R x) = D^l(R) Y_l(x)`` (module docstring)."""
    l = check_int(l, "l", minimum=0)
    X, Y_pinv = _sample_points(l)
    X, Y_pinv = X.to(R.device), Y_pinv.to(R.device)
    RX = (R.to(torch.float64)[..., None, :, :] @ X[:, :, None])[..., 0]  # (..., N, 3)
    return real_spherical_harmonics(RX, l).transpose(-1, -2) @ Y_pinv
