"""BiPE, bilevel positional encoding (He et al. 2024, "Two Stones Hit One Bird: Bilevel
Positional Encoding for Better Length Extrapolation", arXiv 2401.16421; zhenyuhe00/BiPE
``my_modeling_llama_bipe_rope.py``, ``get_bilevel_ids``).

Text is cut into segments that end at separator tokens (in the Llama tokenizer ``.`` = 869
and newline = 13); a separator belongs to the segment it ends. Each token gets two
positions:

* intra-segment: its offset inside its segment, for an absolute embedding added to the token
  embeddings (BiPE-RoPE: a learned ``nn.Embedding(1024, d_model)`` indexed by the offset
  clipped at 1023 — relpos ``learned`` with ``max_positions=1024``);
* inter-segment: the segment index (the number of separators strictly before the token),
  used as the RoPE position ids (relpos ``rope`` with ``q_pos = k_pos = segment``).

So BiPE-RoPE is not a new attention encoding: it is ``rope`` and ``learned`` fed these two
position sets. The repo's config has ``pad_token_id = -1``, which makes row 1023 of the
intra table a frozen zero (clipped long segments get no intra embedding); relpos does not
reproduce that quirk. The repo asserts there is no KV cache.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from ..validation import check_int, check_int_tensor


def bilevel_positions(
    tokens: Tensor,
    separators: Collection[int],
    *,
    max_intra: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(intra, segment)`` positions for token ids ``(L,)`` or ``(B, L)``, int64, same shape.

    ``separators``: the ids that end a segment (BiPE's Llama setting: ``(869, 13)``).
    ``max_intra``: clip the intra offsets at this value (BiPE: 1023 for its 1024-row table).

    Example (BiPE's ``get_bilevel_ids``): ids ``[5, 6, 869, 7, 8, 9, 13, 10]`` -> intra
    ``[0, 1, 2, 0, 1, 2, 3, 0]``, segment ``[0, 0, 0, 1, 1, 1, 1, 2]``.
    """
    ids = check_int_tensor(tokens, "tokens")
    seps = [check_int(s, "separators[...]", minimum=None) for s in separators]
    if not seps:
        raise ValueError("separators must name at least one separator token id")
    if max_intra is not None:
        check_int(max_intra, "max_intra", minimum=0)
    is_sep = torch.isin(ids, torch.tensor(seps, dtype=ids.dtype, device=ids.device))
    ends = is_sep.to(torch.int64)
    segment = ends.cumsum(-1) - ends  # separators strictly before each token
    index = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    starts = torch.zeros_like(is_sep)
    starts[..., 1:] = is_sep[..., :-1]
    starts[..., :1] = True
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    intra = index - first
    if max_intra is not None:
        intra = intra.clamp(max=max_intra)
    return intra, segment


__all__ = ["bilevel_positions"]
