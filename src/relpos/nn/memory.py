"""Segment-level recurrence (Transformer-XL, Dai et al. 2019, §3.2) over a model with a KV cache.

A long sequence is processed in consecutive segments. After each segment every layer keeps the
keys and values of its last ``memory_length`` tokens, *detached* (stop-gradient), and the next
segment attends to them as to a prefix: ``(memory keys, segment keys)`` with the segment's
queries at the following positions (bottom-right causal alignment). Positions are the absolute
token indices of the whole stream, passed explicitly, so any relative encoding sees the right
distances (and keys cached after a rotation, RoPE, stay consistent).

Difference from the official Transformer-XL: it caches each layer's *input hidden states* and
recomputes their keys/values with the current weights, so ``W_k, W_v`` also receive gradient
through the memory tokens. Caching keys/values (as here) gives the same forward values for
fixed weights and is cheaper, but the memory keys/values are constants: no gradient reaches
anything through them. Encodings with a learned position table (``max_positions``) need the
whole stream to fit in the table, since positions keep growing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..encodings.base import Encoding
from ..validation import check_int
from .cache import KVCache, LayerCache

__all__ = ["SegmentRecurrence"]


class SegmentRecurrence:
    """Run a model over consecutive segments with a detached memory of ``memory_length`` tokens.

    The model is any ``nn.Module`` called as ``model(tokens, pos, cache)`` with a ``KVCache``
    from ``model.new_cache()`` (``relpos.nn.TransformerLM``, ``relpos.nn.LlamaLM``).

    Example::

        rec = SegmentRecurrence(model, memory_length=128)
        for segment in stream.split(64, dim=1):   # (B, 64) token ids each
            logits = rec.step(segment)            # attends to up to 128 earlier tokens
            loss = ...; loss.backward()           # gradients stay inside the segment

    ``run(tokens, segment_length)`` does the loop and concatenates the outputs. ``reset()``
    forgets the memory and restarts positions at 0.
    """

    def __init__(self, model: nn.Module, memory_length: int) -> None:
        if not callable(getattr(model, "new_cache", None)):
            raise TypeError(
                f"model must provide new_cache() -> KVCache and accept (tokens, pos, cache) "
                f"(e.g. relpos.nn.TransformerLM), got {type(model).__name__}"
            )
        check_int(memory_length, "memory_length", minimum=0)
        self.model = model
        self.memory_length = memory_length
        dims = [m.dims for m in model.modules() if isinstance(m, Encoding)]
        self.dims = max(dims, default=1)
        self.reset()

    def reset(self) -> None:
        """Empty memory; the next token gets position 0."""
        self.cache: KVCache = self.model.new_cache()
        self.position = 0

    @property
    def memory_size(self) -> int:
        """Number of tokens currently held in the memory (the same for every layer)."""
        return self.cache.length

    def step(self, tokens: Tensor) -> Tensor:
        """The model's output for one segment ``tokens (B, L)``, attending to the memory; then
        the memory keeps the last ``memory_length`` tokens' keys/values, detached."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, L) tensor of token ids, got {shape}")
        L = tokens.shape[1]
        pos = torch.arange(self.position, self.position + L, device=tokens.device)[None]
        if self.dims > 1:
            pos = pos[..., None].expand(1, L, self.dims)
        out = self.model(tokens, pos, self.cache)
        self.position += L
        for layer in self.cache.layers:
            _keep_last(layer, self.memory_length)
        return out

    def run(self, tokens: Tensor, segment_length: int) -> Tensor:
        """``step`` over ``tokens (B, N)`` split into segments of ``segment_length`` (the last
        may be shorter); the outputs concatenated along the sequence."""
        check_int(segment_length, "segment_length")
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            raise ValueError("tokens must be a (B, N) tensor of token ids")
        outs = [self.step(seg) for seg in tokens.split(segment_length, dim=1)]
        return torch.cat(outs, dim=1)


def _keep_last(layer: LayerCache, keep: int) -> None:
    """Truncate a layer cache to its last ``keep`` tokens and cut them from the graph."""
    if layer.k is None:
        return
    assert layer.v is not None and layer.k_pos is not None
    if keep == 0:
        layer.k = layer.v = layer.k_pos = None
        return
    layer.k = layer.k[:, :, -keep:].detach().clone()  # (no view on the whole old cache)
    layer.v = layer.v[:, :, -keep:].detach().clone()
    layer.k_pos = layer.k_pos[:, -keep:]
    if layer.conv_tail is not None:  # MultiHeadAttention(qkv_conv=K): its last K - 1 inputs
        layer.conv_tail = tuple(t.detach() for t in layer.conv_tail)  # type: ignore[assignment]
