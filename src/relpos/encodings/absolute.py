"""Absolute encodings added to the token embeddings: sinusoidal and learned tables.

These do not touch attention; ``relpos.nn.TransformerLM`` adds ``embed(pos (B|1, L), dim) ->
(B|1, L, dim)`` to its token embeddings. They exist so the lab can compare relative
encodings against them (NoPE, the other baseline, is ``nope.py``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ..functional import sinusoidal_table
from .base import Encoding
from .options import Float, Int
from .registry import register

__all__ = ["Sinusoidal", "LearnedAbsolute"]


@register("sinusoidal")
class Sinusoidal(Encoding):
    """Absolute sinusoidal embedding (Vaswani et al. 2017, "Attention Is All You Need").

    ``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))``, times
    ``scale``, added to the token embeddings. ``embed(pos (B|1, L), dim) -> (B|1, L, dim)``.

    ``scale`` defaults to ``dim ** -0.5`` (x-transformers' convention): the paper multiplies
    unit-variance token embeddings by ``sqrt(dim)`` instead; ``relpos.nn`` initialises token
    embeddings at ``N(0, 0.02^2)``, against which an unscaled PE (norm ``sqrt(dim / 2)``) would
    drown the token identity. ``base > 1``, ``scale > 0``.
    """

    family = "absolute"
    paper = "Vaswani et al. 2017"
    relative = False
    continuous = True
    adds_to_input = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: Annotated[
            float, Float(above=1.0, doc="wavelength base (10000 in the paper)")
        ] = 10000.0,
        scale: Annotated[
            float | None, Float(above=0.0, optional=True, doc="PE multiplier (None: dim ** -0.5)")
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.base = base
        self.scale = scale

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        scale = dim**-0.5 if self.scale is None else self.scale
        return sinusoidal_table(pos, dim, self.base) * scale


@register("learned")
class LearnedAbsolute(Encoding):
    """Learned absolute position embedding (GPT-2 / BERT style; Gehring et al. 2017).

    A table ``E (max_positions, dim)`` initialised ``N(0, 0.02^2)``; ``embed(pos (B|1, L),
    dim) = E[pos] (B|1, L, dim)``. Positions past the table raise ``ValueError``
    (``max_positions`` defaults to 1024); ``dim`` defaults to ``num_heads * head_dim``.
    """

    family = "absolute"
    paper = "Gehring et al. 2017; Radford et al. 2019 (GPT-2)"
    relative = False
    adds_to_input = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_positions: Annotated[
            int, Int(doc="rows of the table (positions 0 .. max_positions - 1)")
        ] = 1024,
        dim: Annotated[
            int | None, Int(optional=True, doc="embedding width (None: num_heads * head_dim)")
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.dim = dim if dim is not None else num_heads * head_dim
        self.max_positions = max_positions
        self.table = nn.Parameter(torch.randn(max_positions, self.dim) * 0.02)

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        if dim != self.dim:
            raise ValueError(f"dim must be {self.dim} (the table width), got {dim}")
        self.check_positions(pos, "pos")
        return self.table[pos]

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}"
