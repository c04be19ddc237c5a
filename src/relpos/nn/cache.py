"""Key/value cache for incremental decoding with ``relpos.nn.MultiHeadAttention``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..attention.linear.state import LinearState


@dataclass
class LayerCache:
    """Cached keys ``(B, Hkv, L, D)``, values ``(B, Hkv, L, Dv)``, key positions ``(B|1, L[, m])``.

    ``rotated`` records whether the keys were stored after the encoding's rotation (RoPE) or
    raw (encodings whose key rotation depends on the whole call, e.g. xPos); the engine sets
    it (``relpos.attention(..., cache=layer_cache)``, which also rotates and appends).
    """

    k: Tensor | None = None
    v: Tensor | None = None
    k_pos: Tensor | None = None
    rotated: bool = True
    #: raw queries ``(B, H, L, D)``, kept only for encodings that read earlier tokens'
    #: queries (``Encoding.reads_past_queries``: LongHeads' chunk features)
    q: Tensor | None = None
    #: the last ``K - 1`` projected (pre-convolution) queries, keys and values, kept by
    #: ``MultiHeadAttention(qkv_conv=K)`` so decoding continues its causal convolutions
    conv_tail: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append_queries(self, q: Tensor) -> Tensor | None:
        """Store the raw queries of the new tokens; returns those of the earlier tokens
        (None before the first call). Called by the engine before ``append``."""
        past = self.q
        self.q = q if past is None else torch.cat((past, q), dim=2)
        return past

    def append(self, k: Tensor, v: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.k is None:
            self.k, self.v, self.k_pos = k, v, k_pos
        else:
            assert self.v is not None and self.k_pos is not None
            if k_pos.shape[0] != self.k_pos.shape[0]:
                batch = max(k_pos.shape[0], self.k_pos.shape[0])
                self.k_pos = self.k_pos.expand(batch, *self.k_pos.shape[1:])
                k_pos = k_pos.expand(batch, *k_pos.shape[1:])
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
            self.k_pos = torch.cat((self.k_pos, k_pos), dim=1)
        return self.k, self.v, self.k_pos


@dataclass
class KVCache:
    """One cache per layer of a ``TransformerLM``: a ``LayerCache``, or for kernelized
    attention with a recurrent form a ``relpos.attention.linear.state.LinearState``
    (``MultiHeadAttention.new_cache``).

    ``position_state``: what an encoding that derives positions from token ids needs to
    continue them on the next call (BiPE: the next token's intra offset and segment index);
    None when nothing was derived.
    """

    layers: list[LayerCache | LinearState] = field(default_factory=list)
    position_state: Tensor | None = None

    @classmethod
    def empty(cls, num_layers: int) -> KVCache:
        return cls([LayerCache() for _ in range(num_layers)])

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0
