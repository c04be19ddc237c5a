"""Orthogonal-function position embeddings: Legendre polynomials and Haar wavelets (Y. Li
2025, "Positional encoding in transformers: a theory of expressiveness, generalisation and
extrapolation", arXiv 2506.06398).

Absolute embeddings added to the token embeddings, like ``sinusoidal``: channel ``k`` of
position ``p`` is the ``k``-th function of an orthogonal basis on the training window
``[0, max_length)``. Only the abstract and the introduction were read and no code is
published: the formulas below are a reconstruction, checked by
tests/encodings/test_orthogonal_functions.py; what the paper does beyond the window
(clamping or normalisation) is unknown, so it is an option.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ..validation import check_int
from .base import Encoding
from .options import Bool, Float, Int
from .registry import register

__all__ = [
    "OrthogonalFunctionPE",
    "LegendrePE",
    "HaarWaveletPE",
    "legendre",
    "legendre_series",
    "haar_wavelets",
]


def legendre(x: Tensor, count: int) -> Tensor:
    """Legendre polynomials ``P_0 .. P_{count-1}`` at ``x``: ``(..., count)`` (dtype of x).

    Bonnet's recurrence ``(k + 1) P_{k+1} = (2k + 1) x P_k - k P_{k-1}``, ``P_0 = 1``,
    ``P_1 = x``; orthogonal on ``[-1, 1]`` with ``int P_k^2 = 2 / (2k + 1)``."""
    check_int(count, "count")
    out = [torch.ones_like(x), x]
    for k in range(1, count - 1):
        out.append(((2 * k + 1) * x * out[k] - k * out[k - 1]) / (k + 1))
    return torch.stack(out[:count], dim=-1)


def legendre_series(x: Tensor, coefficients: Tensor) -> Tensor:
    """``sum_k coefficients[..., k] P_k(x)`` by Bonnet's recurrence, accumulated term by term
    (no ``(..., count)`` stack: FlexAttention's score_mod lowering cannot take one)."""
    count = coefficients.shape[-1]
    p_prev, p = torch.ones_like(x), x
    total = coefficients[..., 0] * p_prev
    if count > 1:
        total = total + coefficients[..., 1] * p
    for k in range(1, count - 1):
        p_prev, p = p, ((2 * k + 1) * x * p - k * p_prev) / (k + 1)
        total = total + coefficients[..., k + 1] * p
    return total


def haar_wavelets(t: Tensor, count: int) -> Tensor:
    """The first ``count`` functions of the Haar basis of ``[0, 1)`` at ``t``: ``(..., count)``.

    Channel 0 is the scaling function ``phi = 1[0 <= t < 1]``; then level ``j = 0, 1, ...``
    and shift ``k = 0 .. 2^j - 1`` in order, ``2^(j/2) psi(2^j t - k)`` with ``psi = 1`` on
    ``[0, 1/2)``, ``-1`` on ``[1/2, 1)``, 0 elsewhere. Orthonormal in ``L2[0, 1)``."""
    check_int(count, "count")
    channels = [((t >= 0) & (t < 1)).to(t.dtype)]
    level = 0
    while len(channels) < count:
        shifts = torch.arange(2**level, dtype=t.dtype, device=t.device)
        u = (2.0**level) * t[..., None] - shifts  # (..., 2^j)
        psi = ((u >= 0) & (u < 0.5)).to(t.dtype) - ((u >= 0.5) & (u < 1)).to(t.dtype)
        channels.extend(((2.0 ** (level / 2)) * psi).unbind(-1))
        level += 1
    return torch.stack(channels[:count], dim=-1)


class OrthogonalFunctionPE(Encoding):
    """Base of the orthogonal-function embeddings: ``embed(pos (B|1, L), dim) = scale *
    basis(pos)`` ``(B|1, L, dim)``, float32, formed in float64.

    ``max_length`` is the window on which the basis is orthogonal (the training length);
    ``clamp=True`` (default) gives positions beyond it the embedding of the window's last
    position ``max_length - 1`` (and negative ones that of 0), so every position has a
    bounded embedding; ``clamp=False`` evaluates the formula as it is (Legendre polynomials
    grow like ``x^k`` outside ``[-1, 1]``, Haar functions vanish outside ``[0, 1)``).
    ``scale`` defaults to ``dim ** -0.5`` (the convention of ``sinusoidal``)."""

    family = "absolute"
    relative = False
    continuous = True
    adds_to_input = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_length: Annotated[
            int, Int(minimum=2, doc="window [0, max_length) of the orthogonal basis")
        ] = 2048,
        clamp: Annotated[
            bool, Bool(doc="positions outside the window take its boundary embedding")
        ] = True,
        scale: Annotated[
            float | None, Float(above=0.0, optional=True, doc="PE multiplier (None: dim ** -0.5)")
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.max_length, self.clamp, self.scale = max_length, clamp, scale

    @classmethod
    def example_options(cls) -> dict:
        return {"max_length": 32}  # test lengths reach beyond the window (the clamp)

    def basis(self, pos: Tensor, dim: int) -> Tensor:
        """The basis functions at float64 positions ``pos``: ``(..., dim)`` float64."""
        raise NotImplementedError

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        dim = check_int(dim, "dim")
        p = pos.to(torch.float64)
        if self.clamp:
            p = p.clamp(0.0, float(self.max_length - 1))
        scale = dim**-0.5 if self.scale is None else self.scale
        return (self.basis(p, dim) * scale).to(torch.float32)

    def extra_repr(self) -> str:
        return f"max_length={self.max_length}, clamp={self.clamp}, scale={self.scale}"


@register("legendre")
class LegendrePE(OrthogonalFunctionPE):
    """Legendre-polynomial position embedding (Y. Li 2025, arXiv 2506.06398; a
    reconstruction from the abstract).

        x = 2 p / (max_length - 1) - 1          (the window [0, max_length - 1] -> [-1, 1])
        PE[p, k] = scale * P_k(x),   k = 0 .. dim - 1

    The continuous polynomials are orthogonal on ``[-1, 1]`` but not on the integer grid
    (for 8 positions, ``P_0 . P_2 = 1.1429``). ``discrete=True`` orthogonalises them on the
    grid ``0 .. max_length - 1`` (Gram-Schmidt in degree order, as a QR factorisation
    ``Phi = Q R``): ``PE(p) = sqrt(max_length) Phi(x_p) R^-1``, so ``PE^T PE = max_length I``
    over the grid and every channel ``k`` is still a polynomial of degree ``k`` (defined at
    any position); it needs ``dim <= max_length``.
    """

    paper = "Y. Li 2025 (orthogonal-function PEs: Legendre)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        discrete: Annotated[
            bool, Bool(doc="orthogonalise the polynomials on the integer grid")
        ] = False,
        **options,
    ) -> None:
        super().__init__(num_heads, head_dim, **options)
        self.discrete = discrete
        self._inverse_r: dict[int, Tensor] = {}

    def _x(self, p: Tensor) -> Tensor:
        return 2.0 * p / (self.max_length - 1) - 1.0

    def grid_factor(self, dim: int) -> Tensor:
        """``sqrt(max_length) R^-1 (dim, dim)`` of the grid's Gram-Schmidt (``discrete``)."""
        if dim > self.max_length:
            raise ValueError(
                f"dim must be <= max_length={self.max_length} for discrete=True (an orthogonal "
                f"basis of {self.max_length} grid positions has at most that many channels), "
                f"got dim={dim}"
            )
        if dim not in self._inverse_r:
            grid = self._x(torch.arange(self.max_length, dtype=torch.float64))
            _, r = torch.linalg.qr(legendre(grid, dim))
            r = r * torch.sign(torch.diagonal(r))[:, None]  # Gram-Schmidt: positive diagonal
            eye = torch.eye(dim, dtype=torch.float64)
            inverse = torch.linalg.solve_triangular(r, eye, upper=True)
            self._inverse_r[dim] = inverse * math.sqrt(self.max_length)
        return self._inverse_r[dim]

    def basis(self, pos: Tensor, dim: int) -> Tensor:
        phi = legendre(self._x(pos), dim)
        if not self.discrete:
            return phi
        return phi @ self.grid_factor(dim).to(phi.device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, discrete={self.discrete}"


@register("wavelet-haar")
class HaarWaveletPE(OrthogonalFunctionPE):
    """Haar-wavelet position embedding (Y. Li 2025, arXiv 2506.06398; a reconstruction: the
    abstract names wavelets, the Haar family is relpos's choice).

        t = p / max_length
        PE[p, 0] = scale * 1[0 <= t < 1]                                   (scaling function)
        PE[p, c] = scale * 2^(j/2) psi(2^j t - k)     c = 2^j + k, k = 0 .. 2^j - 1

    with ``psi = 1`` on ``[0, 1/2)`` and ``-1`` on ``[1/2, 1)``. ``dim`` channels reach level
    ``J = floor(log2 dim) - 1``, so positions within one block of ``max_length / 2^(J+1)``
    share an embedding: ``dim >= max_length`` resolves every position (levels with ``2^j >
    max_length`` resolve less than one position: at integer positions some of their channels
    are 0). Over a window whose length is a power of two the channels are orthogonal on the
    integer grid as well.
    """

    paper = "Y. Li 2025 (orthogonal-function PEs: Haar wavelets)"

    def basis(self, pos: Tensor, dim: int) -> Tensor:
        return haar_wavelets(pos / self.max_length, dim)
