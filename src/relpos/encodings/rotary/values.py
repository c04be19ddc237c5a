"""RoVE, rotary value embeddings: values rotated with their keys, outputs rotated back."""

from __future__ import annotations

from torch import Tensor

from ..registry import register
from .rope import ROPE_SCALING, RoPE, refuse_length_dependent, scaling_option

__all__ = ["RoVE"]


@register("rove")
class RoVE(RoPE):
    """RoVE, rotary value embeddings (García-Castellanos et al. 2026, arXiv 2606.11275;
    from the paper's text, no code published).

    Scores are RoPE's. Values are rotated with their key's rotation and the aggregated output
    is rotated back by the query's:

        o_m = R(m)^T sum_n a_mn R(n) v_n = sum_n a_mn R(n - m) v_n

    so the value path is an "attentive convolution" with kernel ``R(n - m)`` and stays
    relative. Parameter-free. ``relpos.attention`` calls ``rotate(v, k_pos, "v")`` before and
    ``rotate(out, q_pos, "o")`` after the backend, so every backend (fused SDPA included)
    and the KV cache (which stores ``R(n) v_n``) work unchanged. Values need the head dim of
    q and k (same pairs and frequencies). Not HF RoFormer's ``rotary_value``, which never
    rotates the output back.

    Options as for ``rope`` (default layout ``half``); a static ``scaling`` (linear, YaRN,
    Llama 3, ...) scales q, k, v and o alike. Length-dependent scalings (dynamic NTK,
    LongRoPE) are refused: values are rotated once with the keys' length and cached
    rotated, so a value and the output it reaches could carry two bases.

    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "García-Castellanos et al. 2026 (RoVE)"
    rotates_values = True
    option_overrides = {
        "scaling": scaling_option(
            refuse_length_dependent(
                "rove caches rotated values and rotates the output back with the queries' "
                "positions; one base per call cannot be kept"
            ),
            doc=ROPE_SCALING.doc + " (static types only)",
            refused=({"rope_type": "dynamic", "factor": 2.0},),
        )
    }

    def __init__(self, num_heads: int, head_dim: int, **rope_options) -> None:
        super().__init__(num_heads, head_dim, **rope_options)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role in ("q", "k"):
            return super().rotate(x, pos, role)
        if role not in ("v", "o"):
            return x
        self._check_head_dim(x, "v" if role == "v" else "the output", "value head_dim")
        return self._rotate_at(x, pos, inverse=role == "o")
