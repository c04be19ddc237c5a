"""EndPrompt / terminal anchoring (clx1415926/EndPrompt ``fine_tune_suffix.py``,
``preprocess_fixed_split_pose``): a training-data transform for context extension.

A sequence of ``n`` tokens, trained for a target length ``T``, keeps positions
``0 .. n-c-1`` for its body and moves its last ``c`` tokens (the terminal segment) to the
end of the target window, ``T-c .. T-1``. The model thus sees distances up to ``T-1``
during short fine-tuning (combined in the repo with PI / NTK / YaRN scaling of factor
``ceil(T / L_orig)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_int


def endprompt_positions(
    length: int,
    target_length: int,
    *,
    tail_length: int = 20,
    device: torch.device | str | None = None,
) -> Tensor:
    """Positions ``(length,)`` int64: ``[0, .., n-c-1] ++ [F-c+1, .., F]`` with
    ``n = length``, ``c = tail_length`` (``chunk2_length``: 20 in the repo's script, 18 in
    its README) and ``F = target_length - 1``.

    As in the repo, ``c <= 0`` or ``c >= n`` falls back to ``0 .. n-1``.
    Example: ``n=30, c=5, T=65536`` -> ``[0..24, 65531..65535]``.
    """
    n = check_int(length, "length", minimum=0)
    check_int(target_length, "target_length", minimum=1)
    c = check_int(tail_length, "tail_length", minimum=None)
    if target_length < n:
        raise ValueError(
            f"target_length ({target_length}) must be >= length ({n}): the terminal segment "
            f"ends at position target_length - 1"
        )
    pos = torch.arange(n, device=device)
    if 0 < c < n:
        pos[n - c :] += target_length - n
    return pos


__all__ = ["endprompt_positions"]
