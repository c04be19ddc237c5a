"""Models for the task suites, with any registered 1-D encoding, and the position schemes.

* ``TaskEncoder`` — the Chomsky-suite Transformer encoder (Delétang et al. 2023,
  ``models/transformer.py``): the input ids followed by ``T_out`` "empty" tokens (id
  ``input_size``), embedded and scaled by ``sqrt(d)``, an absolute encoding (``adds_to_input``)
  added, post-LN blocks ``LN(h + Drop(MHA(h)))``, ``LN(h + Drop(FFN(h)))`` (GELU, width
  ``4d``, bias-free attention projections), non-causal attention through
  ``relpos.nn.MultiHeadAttention``; logits read from the last ``T_out`` positions.
  ``(B, T_in) ints -> (B, T_out, output_size)``.
* the NoPE study and position coupling use ``relpos.nn.TransformerLM`` (pre-norm decoder),
  positions passed explicitly when the scheme defines them.

Position schemes (``POSITION_SCHEMES``), training options for every encoding that takes
positions (``takes_positions``: rotary, bias, value terms or an absolute embedding):

* ``default``: ``0..T-1``;
* ``random`` — randomized positional encodings (Ruoss et al. 2023): one sorted sample of
  ``T`` distinct positions from ``[0, max_length)`` (``relpos.schedules.randomized_positions``)
  per forward pass, shared across the batch, drawn at test time too (the official code,
  maintainer in issue #1);
* ``random-start`` — ``s + 0..T-1`` with a random ``s`` per sequence in training, ``s = 0``
  at test (Cho et al.'s random-start APE baseline);
* ``coupled`` — position coupling (Cho et al. 2024; coupled addition only).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from relpos import registry
from relpos.encodings.base import Encoding
from relpos.nn.attention import LAYER_INPUT, MultiHeadAttention, build_encoding

__all__ = ["POSITION_SCHEMES", "TaskEncoder", "takes_positions", "check_encoding_for_tasks"]

POSITION_SCHEMES = ("default", "random", "random-start", "coupled")


def takes_positions(encoding: Encoding) -> bool:
    """Whether the encoding reads positions at all (NoPE does not)."""
    return bool(
        encoding.has_rotary
        or encoding.has_bias
        or encoding.adds_to_input
        or encoding.needs_probabilities
    )


def check_encoding_for_tasks(name: str, scheme: str, *, causal: bool) -> None:
    """``ValueError`` when encoding ``name`` cannot run the 1-D task models with ``scheme``:
    m-D or per-call-input encodings, causal-only ones in the (non-causal) encoder, and a
    position scheme on an encoding that reads no positions."""
    enc = registry.create(name, num_heads=2, head_dim=8)
    if enc.dims != 1:
        raise ValueError(f"--encodings: {name!r} has {enc.dims} position axes; tasks are 1-D")
    # the layer input (TRA's forget gate) is filled by the relpos.nn layers themselves
    needed = {n: f for n, f in enc.required_inputs.items() if n != LAYER_INPUT}
    if needed or enc.needs_inputs:
        inputs = ", ".join(needed or enc.optional_inputs)
        raise ValueError(
            f"--encodings: {name!r} needs per-call inputs ({inputs}), which sequence tasks "
            "do not have"
        )
    if enc.causal_only and not causal:
        raise ValueError(
            f"--encodings: {name!r} is for causal attention only; the Chomsky suite's encoder "
            "is non-causal"
        )
    if scheme != "default" and not takes_positions(enc):
        raise ValueError(
            f"--encodings: {name}+{scheme}: {name!r} reads no positions, so a position scheme "
            "changes nothing"
        )


class _PostLNBlock(nn.Module):
    def __init__(self, dim: int, attn: MultiHeadAttention, dropout: float) -> None:
        super().__init__()
        self.attn = attn
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: Tensor, pos: Tensor | None) -> Tensor:
        h = self.norm1(h + self.drop(self.attn(h, pos=pos, causal=False)))
        return self.norm2(h + self.drop(self.ffn(h)))


class TaskEncoder(nn.Module):
    """The Chomsky-suite encoder (see the module docstring).

    Args:
        input_size, output_size: the task's vocabularies (the empty token is added).
        dim, depth, num_heads: sizes (paper: 64, 5, 8).
        encoding: registry name; ``encoding_options`` its options.
        dropout: 0.1 in the paper.

    ``forward(inputs (B, T_in), output_length, pos=None) -> (B, T_out, output_size)``;
    ``pos`` ``(T,)`` or ``(B, T)`` with ``T = T_in + T_out`` (default ``0..T-1``).
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        dim: int = 64,
        depth: int = 5,
        num_heads: int = 8,
        encoding: str = "sinusoidal",
        encoding_options: dict[str, Any] | None = None,
        dropout: float = 0.1,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.input_size, self.output_size, self.dim = input_size, output_size, dim
        enc = build_encoding(encoding, num_heads, dim // num_heads, dict(encoding_options or {}))
        assert enc is not None
        self.input_encoding = enc if enc.adds_to_input else None
        in_attention = enc.has_rotary or enc.has_bias or enc.needs_probabilities
        attn_enc = enc if in_attention or not enc.adds_to_input else None
        self.embed = nn.Embedding(input_size + 1, dim)  # + the empty token
        nn.init.trunc_normal_(self.embed.weight, std=0.02, a=-0.04, b=0.04)
        self.blocks = nn.ModuleList(
            _PostLNBlock(
                dim,
                MultiHeadAttention(dim, num_heads, attn_enc, backend=backend, bias=False),
                dropout,
            )
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, output_size)

    def forward(self, inputs: Tensor, output_length: int, pos: Tensor | None = None) -> Tensor:
        B, T_in = inputs.shape
        empty = inputs.new_full((B, output_length), self.input_size)
        tokens = torch.cat([inputs, empty], dim=1)
        h = self.embed(tokens) * math.sqrt(self.dim)
        if self.input_encoding is not None:
            p = torch.arange(tokens.shape[1], device=tokens.device)[None] if pos is None else pos
            if p.dim() == 1:
                p = p[None]
            h = h + self.input_encoding.embed(p, self.dim).to(h.dtype)
        for block in self.blocks:
            h = block(h, pos)
        return self.head(h[:, T_in:])
