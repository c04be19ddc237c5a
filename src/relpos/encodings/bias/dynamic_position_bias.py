"""Dynamic position bias: a continuous MLP over (log-)distances (CrossFormer, Wang et al.
2021, "CrossFormer: A Versatile Vision Transformer Hinging on Cross-scale Attention", arXiv
2108.00154, ``DynamicPosBias``; 1-D as lucidrains/x-transformers ``DynamicPositionBias``).

``b_h(i, j) = MLP(x)_h`` with ``x = i - j`` or ``sign(x) log(|x| + 1)``; evaluated once per
distinct distance of a call (``TabulatedDistanceBias``). The form follows the x-transformers
module (read); CrossFormer's own code was not.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ..options import Bool, Choice, Int
from ..registry import register
from .tabulated import TabulatedDistanceBias

__all__ = ["DynamicPositionBias"]

ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU}


@register("dynamic-position-bias")
class DynamicPositionBias(TabulatedDistanceBias):
    """Dynamic position bias: a continuous MLP over (log-)distances (CrossFormer, Wang et al.
    2021, arXiv 2108.00154, ``DynamicPosBias``; 1-D as lucidrains/x-transformers
    ``DynamicPositionBias``, whose code was read).

    ``b_h(i, j) = MLP(x)_h`` with ``x = i - j`` (signed), or ``sign(x) log(|x| + 1)`` with
    ``log_distance=True``. ``MLP = [Linear(1, w), (LayerNorm), act] + (depth - 1) x
    [Linear(w, w), (LayerNorm), act] + Linear(w, H)``; ``act`` SiLU (x-transformers) or ReLU
    (CrossFormer), ``norm`` adds the LayerNorms (CrossFormer has them). Defaults are
    x-transformers': ``depth = 2``, ``width = num_heads * head_dim // 4`` (its ``dim // 4``),
    no norm, no log. PyTorch's default Linear init. Integer positions only (as both sources);
    each call evaluates the MLP once per distinct distance (``TabulatedDistanceBias``), O(L).
    Positions so sparse that a call spans more than ``table_limit`` distances are evaluated
    pair by pair instead: eager, sdpa and chunked handle that, FlexAttention cannot compile
    an MLP inside its ``score_mod`` (use ``chunked`` for such calls).

    Shapes: ``table_at(distance (n,)) -> (H, n)``; ``bias_at_distance(h (..), distance (..))
    -> (..)``.
    """

    paper = "Wang et al. 2021 (CrossFormer dynamic position bias)"
    ACTIVATIONS = ACTIVATIONS
    own_init_modules = ("mlp.0",)  # the scalar-input layer keeps PyTorch's init in models

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        width: Annotated[
            int | None, Int(optional=True, doc="hidden units (None: num_heads * head_dim // 4)")
        ] = None,
        depth: Annotated[int, Int(minimum=1, doc="hidden layers")] = 2,
        log_distance: Annotated[bool, Bool(doc="feed sign(x) log(|x| + 1) instead of x")] = False,
        norm: Annotated[bool, Bool(doc="LayerNorm after each hidden Linear (CrossFormer)")] = False,
        activation: Annotated[str, Choice(tuple(ACTIVATIONS), doc="hidden activation")] = "silu",
    ) -> None:
        super().__init__(num_heads, head_dim)
        width = max(num_heads * head_dim // 4, 1) if width is None else width
        layers: list[nn.Module] = []
        for n_in in [1] + [width] * (depth - 1):
            layers.append(nn.Linear(n_in, width))
            if norm:
                layers.append(nn.LayerNorm(width))
            layers.append(self.ACTIVATIONS[activation]())
        layers.append(nn.Linear(width, num_heads))
        self.mlp = nn.Sequential(*layers)
        self.log_distance = log_distance
        self.width, self.depth, self.norm, self.activation = width, depth, norm, activation

    def mlp_input(self, distance: Tensor) -> Tensor:
        """``x = i - j`` or ``sign(x) log(|x| + 1)``, as a float tensor of the same shape."""
        x = distance.to(self.mlp[0].weight.dtype)
        return torch.sign(x) * torch.log1p(x.abs()) if self.log_distance else x

    def table_at(self, distance: Tensor) -> Tensor:
        return self.mlp(self.mlp_input(distance)[:, None]).t()

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        # Element-wise fallback (sparse positions): every head at every distance, then pick h.
        every = self.mlp(self.mlp_input(distance)[..., None])  # (..., H)
        h = h.expand(torch.broadcast_shapes(h.shape, distance.shape))
        every = every.expand(*h.shape, self.num_heads)
        return torch.gather(every, -1, h[..., None]).squeeze(-1)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, width={self.width}, depth={self.depth}, "
            f"log_distance={self.log_distance}, norm={self.norm}, activation={self.activation!r}"
        )
