"""Causal depth-wise convolutions of the projected queries, keys and values (RCMHA, MDHA).

Sugiharto, Aradea, Mubarok 2023 ("RCMHA: Relative Convolutional Multi-Head Attention for Natural
Language Modelling", arXiv 2308.03429; official code hermansh-id/rcmha ``rcmha/attention.py``
``SpatialDepthWiseConvolution``, read). After each projection, every channel ``c`` of a head is
convolved over the token axis with a kernel of ``K`` taps
(``nn.Conv1d(d_k, d_k, K, groups=d_k, padding=K-1)`` with its last ``K - 1`` outputs trimmed),
**shared by all heads**::

    y[t, c] = b_c + sum_{s=0}^{K-1} w[c, s] x[t - (K - 1) + s, c]        (x[t < 0] = 0)

For ``K = 3``: ``y_t = w0 x_{t-2} + w1 x_{t-1} + w2 x_t + b``. It is causal, so it serves
decoding: a ``LayerCache`` keeps the last ``K - 1`` inputs (``conv_tail``), and a call
continues from them instead of the zero padding, so prefill + token-by-token decoding equals
the full forward. The mixing happens outside attention (before any encoding sees q, k, v),
which is why RCMHA's convolution is a layer option (``MultiHeadAttention(qkv_conv=K)``) and
its relative scoring an encoding (``rcmha``).

Notes:
* The convolution runs over the tokens in sequence order, whatever positions the call gives;
  padded tokens of a batch (left padding) are mixed into the next ``K - 1`` real ones, as in
  the official code, which has no padding.
* The official (labml) layer is used with a Transformer-XL memory where queries are the new
  segment and keys the memory + segment: its query convolution starts from zeros at the
  segment, the key convolution runs over the memory. With relpos's KV cache all three continue
  over the whole sequence (a memory is the cache's past).
* Shapes: ``x (B, H, L, d)``; ``tail (B, H, K - 1, d)``. Weights ``conv.weight (d, 1, K)``,
  ``conv.bias (d,)``, PyTorch's default ``Conv1d`` initialisation (as the official).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..validation import check_int

__all__ = ["CausalDepthwiseConv"]


class CausalDepthwiseConv(nn.Module):
    """A causal depth-wise convolution over the token axis, one kernel for every head.

    Args:
        channels: the head dim ``d``.
        kernel_size: ``K >= 1`` taps (RCMHA: 3); ``K = 1`` is a per-channel affine map.

    ``forward(x (B, H, L, d), tail=None) -> (y (B, H, L, d), tail (B, H, K - 1, d))``: ``tail``
    holds the ``K - 1`` inputs before ``x`` (None: zeros, the start of a sequence); the
    returned tail continues the sequence after ``x``.
    """

    def __init__(self, channels: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.channels = check_int(channels, "channels")
        self.kernel_size = check_int(kernel_size, "kernel_size")
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels)

    def forward(self, x: Tensor, tail: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 4 or x.shape[-1] != self.channels:
            raise ValueError(f"x must have shape (B, H, L, {self.channels}), got {tuple(x.shape)}")
        B, Hx, L, d = x.shape
        k = self.kernel_size
        if tail is None:
            tail = x.new_zeros(B, Hx, k - 1, d)
        elif tail.shape != (B, Hx, k - 1, d):
            raise ValueError(
                f"tail must have shape {(B, Hx, k - 1, d)} (the last kernel_size - 1 inputs), "
                f"got {tuple(tail.shape)}"
            )
        full = torch.cat((tail.to(x.dtype), x), dim=2)  # (B, H, K - 1 + L, d)
        if L == 0:  # nothing to convolve (conv1d refuses inputs shorter than the kernel)
            return x + self.conv.bias.to(x.dtype), full
        seq = full.permute(0, 1, 3, 2).reshape(B * Hx, d, L + k - 1)
        w, b = self.conv.weight.to(x.dtype), self.conv.bias.to(x.dtype)
        y = F.conv1d(seq, w, b, groups=d).reshape(B, Hx, d, L).permute(0, 1, 3, 2)
        return y, full[:, :, full.shape[2] - (k - 1) :]

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}, causal=True"
