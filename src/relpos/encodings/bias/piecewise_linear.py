"""A ReLU MLP of one scalar as the piecewise-linear function it is (FIRE's ``f_theta``).

``f_h(u) = b2_h + sum_k W2[h, k] relu(w1_k u + b1_k)`` is linear between its knots
``t_k = -b1_k / w1_k``: on the interval ``a`` between consecutive sorted knots the set of
active units ``A_a`` is fixed, so ``f_h(u) = alpha[h, a] + beta[h, a] u`` with

    alpha[h, a] = b2_h + sum_{k in A_a} W2[h, k] b1_k,   beta[h, a] = sum_{k in A_a} W2[h, k] w1_k

(``relu_mlp_pieces``). Evaluating it (``evaluate_pieces``) is one interval search and one
multiply-add per (pair, head) instead of ``K`` hidden units, and it is *exact*: the same
function, with gradients to the MLP through ``alpha`` and ``beta`` (autograd; the active sets
are piecewise constant) and to ``u`` through ``beta``. At a knot itself the value is the same
on both sides (relu is continuous); the gradient takes the right-hand piece there, where the
per-unit MLP takes ``relu'(0) = 0`` (a measure-zero set of inputs).

Shapes: ``w1, b1 (K,)``, ``W2 (H, K)``, ``b2 (H,)``; ``knots (K',)`` sorted (units with
``w1 = 0`` are constants and have no knot); ``alpha, beta (H, K' + 1)``; ``u (...)`` ->
``(H, ...)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["relu_mlp_pieces", "evaluate_pieces"]


def relu_mlp_pieces(
    w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``(knots (K',), alpha (H, K'+1), beta (H, K'+1))`` of ``u -> W2 relu(w1 u + b1) + b2``
    (module docstring). Differentiable in ``w1, b1, w2, b2``."""
    with torch.no_grad():
        has_knot = w1 != 0
        knots = torch.sort(-b1[has_knot] / w1[has_knot]).values
        if knots.numel():
            gaps = (knots[1:] + knots[:-1]) / 2
            probes = torch.cat([knots[:1] - 1, gaps, knots[-1:] + 1])
        else:
            probes = torch.zeros(1, dtype=w1.dtype, device=w1.device)
        # which units are active on each interval (probed strictly inside it)
        active = (probes[:, None] * w1 + b1 > 0).to(w1.dtype)  # (A, K)
    beta = (active * w1) @ w2.t()  # (A, H)
    alpha = (active * b1) @ w2.t() + b2
    return knots, alpha.t().contiguous(), beta.t().contiguous()


def evaluate_pieces(u: Tensor, knots: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """``f_h(u)`` for every head: ``(H, *u.shape)``. ``u`` in the dtype of the tables."""
    piece = torch.bucketize(u.detach(), knots, right=True).flatten()
    H = alpha.shape[0]
    flat = u.reshape(1, -1)
    out = torch.addcmul(alpha.index_select(1, piece), beta.index_select(1, piece), flat)
    return out.view(H, *u.shape)
