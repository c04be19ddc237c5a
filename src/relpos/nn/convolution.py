"""Multi-head self-attention that computes a given convolution through its relative encoding.

S. Li, Chen, Zhang, Tan, Xu, Lin 2021 ("Can Vision Transformers Perform Convolution?",
arXiv 2111.01353): one multi-head self-attention layer with a relative positional
encoding can express any ``K x K`` convolution, and both the heads and the relative encoding
are essential. The construction is Cordonnier, Loukas & Jaggi's (2020, arXiv 1911.03584,
``epfml/attention-cnn``, read through copies; Li et al.'s lower bound on the number of heads
was not read and is not claimed here).

Construction, for a kernel ``W (C_out, C_in, K, ..., K)`` over ``m`` axes (odd ``K``):

* ``K^m`` heads, head ``h`` with the shift ``Delta_h`` of kernel tap ``h`` (row-major, the
  order of ``W.flatten(2)``: ``relpos.encodings.spatial.gaussian_shift.convolution_shifts``);
* no content logits (``W_Q = W_K = 0``) and the ``gaussian-shift`` relative bias
  ``b_h(i, j) = -alpha ||(p_j - p_i) - Delta_h||^2``: as ``alpha`` grows, head ``h`` reads the
  token at ``p_i + Delta_h`` (its softmax is one-hot);
* values the tokens themselves (``W_V^h = I``), and outputs ``W_O^h = W[:, :, Delta_h]``:

      y_i = sum_h W_O^h  sum_j softmax_j(b_h(i, j)) x_j  ->  sum_Delta W_Delta x_{i + Delta} + b

  the cross-correlation ``F.conv{m}d`` computes, exact in float32 at ``alpha = 30`` (the
  second-nearest key has relative weight ``e^{-alpha}``).

Borders: the softmax picks the nearest existing key, and the nearest grid point to an outside
target is its per-axis clamp (the squared distance is a sum over axes), so the borders equal
**replicate** padding (``F.pad(mode="replicate")``), not zero padding; interior outputs equal
any padding's.

Shapes: ``x (B, C_in, S_1, .., S_m)`` -> ``(B, C_out, S_1, .., S_m)``; attention runs over the
``L = prod(S)`` grid tokens at their integer coordinates.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..attention import attention
from ..encodings.spatial.gaussian_shift import GaussianShiftBias, convolution_shifts
from ..validation import check_float

__all__ = ["ConvolutionAttention"]


class ConvolutionAttention(nn.Module):
    """MHSA whose relative encoding and heads make it the convolution ``weight`` (see module).

    Args:
        weight: the kernel ``(C_out, C_in, K, ..., K)`` (``m = weight.dim() - 2`` axes, 1 to
            3; ``K`` odd), as ``nn.Conv{m}d.weight``.
        bias: ``(C_out,)`` or None.
        alpha: the concentration of every head (30: exact in float32).
        learnable: learn the output maps, the bias and the heads' shifts and concentrations
            (it then starts as the convolution).
        backend: the attention backend (``relpos.attention``).

    ``heads``: ``K^m``; ``encoding``: the ``gaussian-shift`` encoding of the heads.
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        *,
        alpha: float = 30.0,
        learnable: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            raise TypeError("weight must be a floating-point tensor (C_out, C_in, K, ..., K)")
        dims = weight.dim() - 2
        if dims not in (1, 2, 3):
            raise ValueError(
                f"weight must have shape (C_out, C_in, K, ..., K) over 1 to 3 axes, got "
                f"{tuple(weight.shape)}"
            )
        size = weight.shape[2]
        if size % 2 == 0 or any(s != size for s in weight.shape[2:]):
            raise ValueError(
                f"weight must have one odd kernel size K on every axis (centred taps), got "
                f"{tuple(weight.shape[2:])}"
            )
        if bias is not None and (not isinstance(bias, Tensor) or bias.shape != weight.shape[:1]):
            raise ValueError(f"bias must be a tensor of shape ({weight.shape[0]},) or None")
        check_float(alpha, "alpha", above=0.0)
        self.dims, self.kernel_size = dims, size
        self.out_channels, self.in_channels = weight.shape[:2]
        self.heads = size**dims
        self.backend = backend
        self.encoding = GaussianShiftBias(
            self.heads, self.in_channels, dims=dims, alpha=alpha, learnable=learnable
        )
        self.encoding.set_shifts(convolution_shifts(size, dims), alpha)
        # W_O^h = W[:, :, Delta_h]: (H, C_out, C_in), taps in row-major order
        out_maps = weight.detach().flatten(2).permute(2, 0, 1).clone()
        b = torch.zeros(self.out_channels, dtype=weight.dtype) if bias is None else bias.detach()
        self.out_maps = nn.Parameter(out_maps, requires_grad=learnable)
        self.bias = nn.Parameter(b.clone(), requires_grad=learnable)

    def grid(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """Integer coordinates ``(L, m)`` of the grid tokens, row-major (``x.flatten(2)``)."""
        axes = torch.meshgrid(
            *(torch.arange(n, dtype=torch.float32, device=device) for n in shape), indexing="ij"
        )
        return torch.stack([a.reshape(-1) for a in axes], dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != self.dims + 2 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"x must have shape (B, {self.in_channels}, " + ", ".join(["S"] * self.dims)
                + f"), got {tuple(x.shape)}"
            )  # fmt: skip
        B, spatial = x.shape[0], tuple(x.shape[2:])
        L = math.prod(spatial)
        tokens = x.flatten(2).transpose(1, 2)  # (B, L, C_in)
        v = tokens[:, None].expand(B, self.heads, L, self.in_channels)
        qk = x.new_zeros(B, self.heads, L, 1)  # no content logits: W_Q = W_K = 0
        pos = self.grid(spatial, x.device)
        if self.dims == 1:
            pos = pos[:, 0]  # (L,): 1-D positions
        read = attention(
            qk, qk, v, self.encoding, q_pos=pos, k_pos=pos, causal=False, backend=self.backend
        )  # (B, H, L, C_in): head h reads the token at p_i + Delta_h
        y = torch.einsum("bhlc,hoc->blo", read, self.out_maps.to(read.dtype)) + self.bias
        return y.transpose(1, 2).reshape(B, self.out_channels, *spatial)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"kernel_size={self.kernel_size}, dims={self.dims}, heads={self.heads}"
        )
