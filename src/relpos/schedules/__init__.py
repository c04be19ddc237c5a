"""Position schedules: pure functions that build position ids (and masks) for training- and
inference-time recipes. The inference-time RoPE schedules that change the attention logits
themselves (Dual Chunk Attention, LM-Infinite, Self-Extend) are encodings:
``relpos.create("dca" | "lm-infinite" | "self-extend", ...)``.

* ``randomized_positions`` — ordered random subset of ``[0, N)`` (Ruoss et al. 2023);
* ``coupled_positions`` / ``coupling_start`` — digit-aligned ids (position coupling, Cho
  et al. 2024);
* ``bilevel_positions`` — BiPE's intra-segment and segment positions (He et al. 2024);
* ``endprompt_positions`` — terminal segment moved to the target length (EndPrompt);
* ``pack_with_anchor`` / ``anchor_mask_mod`` / ``anchor_mask`` — AnchorAttention (Wang et
  al. 2024);
* ``concentric_rings`` / ``cca_positions`` / ``cca_mask_mod`` / ``cca_mask`` — Concentric
  Causal Attention for image tokens (Xing et al. 2024).
"""

from .anchor import AnchorPacking, anchor_mask, anchor_mask_mod, pack_with_anchor
from .bilevel import bilevel_positions
from .concentric import cca_mask, cca_mask_mod, cca_positions, concentric_rings
from .coupling import coupled_positions, coupling_start
from .endprompt import endprompt_positions
from .randomized import randomized_positions

__all__ = [
    "randomized_positions",
    "coupled_positions",
    "coupling_start",
    "bilevel_positions",
    "endprompt_positions",
    "AnchorPacking",
    "pack_with_anchor",
    "anchor_mask_mod",
    "anchor_mask",
    "concentric_rings",
    "cca_positions",
    "cca_mask_mod",
    "cca_mask",
]
