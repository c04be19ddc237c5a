"""Baselines: no positional encoding, and absolute encodings added to the token embeddings.

These do not touch attention; ``relpos.nn.TransformerLM`` adds ``embed(pos, dim)`` to its
token embeddings. They exist so the lab can compare relative encodings against them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import sinusoidal_table
from ..registry import register
from .base import Encoding
from .options import Int


@register("nope")
class NoPE(Encoding):
    """No positional encoding (NoPE; Kazemnejad et al. 2023, "The Impact of Positional
    Encoding on Length Generalization in Transformers"). A causal mask alone leaks position.
    """

    family = "none"
    paper = "Kazemnejad et al. 2023 (NoPE)"
    relative = True
    continuous = True


@register("sinusoidal")
class Sinusoidal(Encoding):
    """Absolute sinusoidal embedding (Vaswani et al. 2017, "Attention Is All You Need").

    ``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))``, times
    ``scale``, added to the token embeddings. ``embed(pos (B|1, L), dim) -> (B|1, L, dim)``.

    ``scale`` defaults to ``dim ** -0.5`` (x-transformers' convention): the paper multiplies
    unit-variance token embeddings by ``sqrt(dim)`` instead; ``relpos.nn`` initialises token
    embeddings at ``N(0, 0.02^2)``, against which an unscaled PE (norm ``sqrt(dim / 2)``) would
    drown the token identity.
    """

    family = "absolute"
    paper = "Vaswani et al. 2017"
    relative = False
    continuous = True
    adds_to_input = True

    def __init__(
        self, num_heads: int, head_dim: int, *, base: float = 10000.0, scale: float | None = None
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.base = float(base)
        self.scale = None if scale is None else float(scale)

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        scale = dim**-0.5 if self.scale is None else self.scale
        return sinusoidal_table(pos, dim, self.base) * scale


@register("learned")
class LearnedAbsolute(Encoding):
    """Learned absolute position embedding (GPT-2 / BERT style; Gehring et al. 2017).

    A table ``E (max_positions, dim)`` initialised ``N(0, 0.02^2)``; ``embed(pos) = E[pos]``.
    Positions past the table raise ``ValueError`` (``max_positions`` defaults to 1024).
    """

    family = "absolute"
    paper = "Gehring et al. 2017; Radford et al. 2019 (GPT-2)"
    relative = False
    adds_to_input = True
    options = {
        "max_positions": Int(minimum=1, doc="table rows: positions in [0, max_positions)"),
        "dim": Int(minimum=1, optional=True, doc="table width (default num_heads * head_dim)"),
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_positions: int = 1024,
        dim: int | None = None,
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


__all__ = ["NoPE", "Sinusoidal", "LearnedAbsolute"]
