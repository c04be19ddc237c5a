"""The relative form of the Legendre PE: a learned distance bias in a Legendre basis (Y. Li
2025, "Positional encoding in transformers: a theory of expressiveness, generalisation and
extrapolation", arXiv 2506.06398, the ALiBi-style extension of its orthogonal-function PEs).

Only the abstract and introduction were available and no code is published: the formula is a
reconstruction, checked by tests/encodings/bias/test_legendre.py.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ..options import Bool, Int
from ..orthogonal_functions import legendre_series
from ..registry import register
from .distance import DistanceBias

__all__ = ["LegendreBias"]


@register("legendre-bias")
class LegendreBias(DistanceBias):
    """Legendre distance bias (Y. Li 2025, arXiv 2506.06398; a reconstruction from the
    abstract and introduction).

        x       = 2 n / max_length - 1,        n = q_pos - k_pos
        b_h(n)  = sum_{k < degree} c_hk P_k(x)

    ``c (H, degree)`` is learned, initialised to 0 (training starts without a bias). With
    ``clamp=True`` (default) ``n`` is clamped to ``[0, max_length]`` first, so keys after the
    query read the bias of distance 0 and distances beyond the window that of ``max_length``
    (the polynomials stay in ``[-1, 1]``); ``clamp=False`` evaluates the formula as it is
    (it grows like ``x^degree`` outside the window). The polynomials are formed in float64.
    """

    paper = "Y. Li 2025 (orthogonal-function PEs: Legendre distance bias)"
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        degree: Annotated[int, Int(doc="number of Legendre polynomials P_0 .. P_{degree-1}")] = 8,
        max_length: Annotated[int, Int(doc="distances 0 .. max_length map onto [-1, 1]")] = 2048,
        clamp: Annotated[bool, Bool(doc="clamp distances into [0, max_length]")] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.degree, self.max_length, self.clamp = degree, max_length, clamp
        self.coefficients = nn.Parameter(torch.zeros(num_heads, degree))

    @classmethod
    def example_options(cls) -> dict:
        return {"max_length": 40}  # test distances leave the window (the clamp)

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        n = distance.to(torch.float64)
        if self.clamp:
            n = n.clamp(0.0, float(self.max_length))
        c = self.coefficients[h].to(torch.float64)  # (..., degree)
        return legendre_series(2.0 * n / self.max_length - 1.0, c).to(self.coefficients.dtype)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, degree={self.degree}, max_length={self.max_length}, "
            f"clamp={self.clamp}"
        )
