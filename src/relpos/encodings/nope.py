"""NoPE: no positional encoding (Kazemnejad et al. 2023, "The Impact of Positional Encoding
on Length Generalization in Transformers", arXiv 2305.19466).

The baseline every relative encoding is compared against: attention logits are ``q . k``
alone, ``(B, H, Lq, Lk)``; a causal mask alone leaks position. Family ``"none"``.
"""

from __future__ import annotations

from .base import Encoding
from .registry import register

__all__ = ["NoPE"]


@register("nope")
class NoPE(Encoding):
    """No positional encoding (NoPE; Kazemnejad et al. 2023, "The Impact of Positional
    Encoding on Length Generalization in Transformers"). A causal mask alone leaks position.
    Every hook is the base's identity; no options.
    """

    family = "none"
    paper = "Kazemnejad et al. 2023 (NoPE)"
    relative = True
    continuous = True
