"""FIRE: functional interpolation for relative positions (Li et al. 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", arXiv 2310.04418).

``b_h(i, j) = f_theta( psi(i - j) / (psi(max(L, i)) + eps) )_h`` with ``psi(x) = log(|c x| +
1)`` and a small MLP ``f_theta``: the normalised distance lies in ``[0, 1]`` for every past
key, so the MLP interpolates instead of extrapolating. No official repository was found: the
form follows the PyTorch snippet of the paper's appendix as reproduced in mcleish7/arithmetic
(``cramming/architectures/embeddings.py``, ``FIRE``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext, Encoding, RowAffineTables
from ..options import Float, Int
from ..registry import register
from .piecewise_linear import evaluate_pieces, relu_mlp_pieces

__all__ = ["FIRE"]


@register("fire")
class FIRE(Encoding):
    """FIRE, functional interpolation (Li et al. 2023, arXiv 2310.04418; paper appendix code).

    ``b_h(i, j) = f_theta( psi(i - j) / (psi(max(L, i)) + 1e-6) )_h``, ``psi(x) = log(|c x| + 1)``,
    ``f_theta = Linear(1, 32) -> ReLU -> Linear(32, H)``; learnable ``c`` (init 0.1) and threshold
    ``L = |L_multiplier * 512|`` (multiplier init 1). ``i`` is the absolute query position
    ("progressive interpolation"), so FIRE is not strictly relative. Follows the paper's
    ``max(L, i)`` (one public re-implementation uses ``min``).

    Options: ``mlp_width`` (hidden units, >= 1), ``init_c`` (> 0), ``init_L`` (the threshold,
    > 0) and ``eps`` (> 0, keeps the normaliser away from 0 at ``i = 0``).

    Fast exact evaluation: ``f_theta`` is a ReLU MLP of one scalar, i.e. piecewise linear
    with knots ``-b1_k / w1_k``; over a grid of pairs for all heads (the chunked tile path
    above the threshold, dense biases) it is read as ``alpha[h, a] + beta[h, a] u`` on the
    interval ``a`` of ``u`` (``piecewise_linear.relu_mlp_pieces``), the same function with
    gradients to the MLP through the tables: one interval search and one multiply-add per
    (pair, head) instead of ``mlp_width`` hidden units.
    Shapes: ``mlp_input(q_pos (..), k_pos (..)) -> (..)`` in ``[0, 1]`` for past keys;
    ``readout(u (..), h (..)) -> (..)``.
    """

    paper = "Li et al. 2023 (FIRE)"
    has_bias = True
    own_init_modules = ("mlp_in",)  # the scalar-input layer keeps PyTorch's init in models
    relative = False
    continuous = True
    row_affine = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        mlp_width: Annotated[int, Int(minimum=1, doc="hidden units of f_theta")] = 32,
        init_c: Annotated[
            float, Float(above=0.0, doc="initial c of psi(x) = log(|c x| + 1)")
        ] = 0.1,
        init_L: Annotated[float, Float(above=0.0, doc="initial threshold L (positions)")] = 512.0,
        eps: Annotated[
            float, Float(above=0.0, doc="added to the normaliser psi(max(L, i))")
        ] = 1e-6,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.mlp_in = nn.Linear(1, mlp_width)
        self.mlp_out = nn.Linear(mlp_width, num_heads)
        self.c = nn.Parameter(torch.tensor(init_c))
        self.register_buffer("init_L", torch.tensor(init_L))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.eps = eps

    def psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * x) + 1)

    def mlp_input(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``psi(i - j) / (psi(max(L, i)) + eps)``: in [0, 1] for every ``j <= i``."""
        i = q_pos.to(self.c.dtype)
        normaliser = self.psi(torch.maximum(self.threshold(), i)) + self.eps
        return self.psi(i - k_pos.to(self.c.dtype)) / normaliser

    def threshold(self) -> Tensor:
        """The learned threshold ``L = |L_multiplier * init_L|``."""
        return torch.abs(self.L_multiplier * self.init_L)

    def is_distance_only(self, ctx: BiasContext) -> bool:
        # Below the threshold the normaliser is psi(L) for every query: a function of i - j.
        if ctx.q_pos.numel() == 0 or ctx.q_pos.is_floating_point():
            return False
        return bool(ctx.q_pos.max() < self.threshold())

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        """FIRE for queries below the threshold (normaliser ``psi(L)``)."""
        u = self.psi(distance.to(self.c.dtype)) / (self.psi(self.threshold()) + self.eps)
        return self.readout(u, h)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return self.readout(self.mlp_input(ctx.q_pos[b, i], ctx.k_pos[b, j]), h)

    def row_affine_tables(
        self, ctx: BiasContext, rows: Tensor, distance: Tensor
    ) -> RowAffineTables:
        """``u = psi(d) r_i`` with ``r_i = 1 / (psi(max(L, i)) + eps)``: where the ``u`` of a
        group's rows at distance ``d`` all lie on one linear piece ``a`` of ``f_theta``,
        ``f_h(u) = alpha[h, a] + r_i (beta[h, a] psi(d))`` (``piecewise_linear``): exact, and
        affine in ``r_i``. ``psi(d) >= 0`` and ``r_i > 0``, so the group's ``u`` span
        ``[psi(d) min r, psi(d) max r]``: a distance is ``exact`` where both ends fall on
        one piece. ``rows (G, R)``, ``distance (G, N)`` -> tables ``(H, G, N)``."""
        dtype = self.c.dtype
        normaliser = self.psi(torch.maximum(self.threshold(), rows.to(dtype))) + self.eps
        psi_d = self.psi(distance.to(dtype))
        knots, alpha, beta = relu_mlp_pieces(
            self.mlp_in.weight[:, 0], self.mlp_in.bias, self.mlp_out.weight, self.mlp_out.bias
        )
        low = torch.bucketize(psi_d / normaliser.amax(-1, keepdim=True), knots, right=True)
        high = torch.bucketize(psi_d / normaliser.amin(-1, keepdim=True), knots, right=True)
        pieces = low.flatten()  # index_select: a few times faster than alpha[:, low]
        constant = alpha.index_select(1, pieces).view(-1, *low.shape)  # (H, G, N)
        slope = beta.index_select(1, pieces).view(-1, *low.shape) * psi_d
        return RowAffineTables(constant, slope, 1.0 / normaliser, low == high)

    def readout(self, u: Tensor, h: Tensor) -> Tensor:
        """``f_theta(u)`` for head(s) ``h`` (broadcast against ``u``)."""
        w_in, b_in = self.mlp_in.weight[:, 0], self.mlp_in.bias
        w_out, b_out = self.mlp_out.weight[h], self.mlp_out.bias[h]
        if h.dim() == 0:
            # One score at a time (FlexAttention's score_mod must be pointwise): unrolled sum.
            out = b_out
            for unit in range(w_in.shape[0]):
                out = out + torch.relu(u * w_in[unit] + b_in[unit]) * w_out[unit]
            return out
        every_head = torch.arange(self.num_heads, device=h.device).view(1, -1, 1, 1)
        if u.dim() == 4 and u.shape[1] == 1 and h.shape == every_head.shape:
            if torch.equal(h, every_head):
                # A (B, 1, T, S) grid for all heads: the MLP as its linear pieces, one
                # interval search and one multiply-add per (pair, head), exact
                pieces = relu_mlp_pieces(w_in, b_in, self.mlp_out.weight, self.mlp_out.bias)
                return evaluate_pieces(u[:, 0], *pieces).transpose(0, 1)
        hidden = torch.relu(u[..., None] * w_in + b_in)
        # Other index shapes: contract the hidden units with head h's output row.
        return torch.einsum("...k,...k->...", hidden, w_out) + b_out
