"""Hard-ALiBi (Jelassi, Brandfonbrener, Kakade & Malach 2024, "Repeat After Me: Transformers
are Better than State Space Models at Copying", arXiv 2402.01032): per-head hard windows.

Head ``h`` sees the last ``m_h`` keys and nothing else; heads without a window (``m_h = inf``)
have no positional term at all (NoPE heads):

``b_h(d) = 0`` for ``0 <= d < m_h``, ``-inf`` otherwise, with ``d = q_pos - k_pos``.

Official code read: sjelassi/transformers_ssm_copy, ``synthetic_exps/models/
hard_alibi_model.py`` (``GPTHardAlibiAttention._attn``, the ``#masking`` loop) and
``synthetic_exps/main.py`` (``--num_masked_heads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
from torch import Tensor

from ...validation import check_int
from ..options import Custom, Int
from ..registry import register
from .distance import DistanceBias

__all__ = ["HardALiBi"]


def check_windows(value: object, name: str) -> tuple[int | None, ...]:
    """``windows``: a list/tuple with, per head, a window ``m_h >= 1`` (an int: the head
    sees its last ``m_h`` keys) or None (no window: a NoPE head). ``TypeError`` for another
    container or entry type, ``ValueError`` for an empty sequence or a window below 1."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list or tuple of window sizes (int >= 1) or None per head, "
            f"got {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"{name} must name one window (int >= 1) or None per head, got []")
    return tuple(None if m is None else check_int(m, f"{name}[{n}]") for n, m in enumerate(value))


def official_windows(num_heads: int, windowed_heads: int) -> tuple[int | None, ...]:
    """The official code's heads: head ``h < windowed_heads`` has window ``h + 1`` (head 0 sees
    only its own token), the others none."""
    return tuple(h + 1 if h < windowed_heads else None for h in range(num_heads))


WINDOWED_HEADS = Int(
    minimum=0,
    optional=True,
    doc="heads 0..n-1 get windows 1..n, the rest are NoPE (None: num_heads // 2)",
)
WINDOWS = Custom(
    checker=check_windows,
    invalid=[("8", TypeError), ([0], ValueError), ([2.5], TypeError), ([], ValueError)],
    optional=True,
    doc="per-head window m_h (int >= 1) or None for a NoPE head",
)


@register("hard-alibi")
class HardALiBi(DistanceBias):
    """Hard-ALiBi (Jelassi et al. 2024, "Repeat After Me", arXiv 2402.01032).

    ``b_h(d) = 0`` for ``0 <= d < m_h`` and ``-inf`` otherwise (``d = q_pos - k_pos``): head
    ``h`` attends to its own token and the ``m_h - 1`` keys before it, a sliding window.
    Heads with ``m_h = inf`` (``None`` here) add nothing: they are NoPE heads, whose attention
    is limited by the causal mask only.

    Windows, as the official code sets them (sjelassi/transformers_ssm_copy,
    ``synthetic_exps/models/hard_alibi_model.py``, ``GPTHardAlibiAttention._attn``): for head
    ``i < num_masked_heads`` it adds 0 on the diagonals ``j = 0 .. i`` below the main one
    (``for j in range(i+1)``) and ``finfo.min`` everywhere else, so ``m_i = i + 1``; the other
    heads are NoPE. ``windowed_heads`` is that ``num_masked_heads``; its default is half the
    heads (``num_heads // 2``), the official default of 8 windowed heads out of 16
    (``synthetic_exps/main.py``: ``--heads 16``, ``--num_masked_heads 8``). ``windows`` gives
    any other per-head choice of ``m_h`` (``None`` = no window).

    Causal only: the official code builds it into causal GPT-NeoX decoders, and its window heads
    add ``-inf`` to future keys (``d < 0``) too. It adds ``finfo(dtype).min`` where relpos adds
    ``-inf``: the same weights wherever a row keeps a key. A window head's row always keeps its
    own token (``d = 0``) under the causal mask; a row whose window keys are all masked (by
    padding) sees no key and gives 0, as every dead row does in relpos (``docs/numerics.md``).
    No parameters; the bias is no linear function of ``d`` (no ``linear_pieces``).

    Shapes: ``windows`` ``(H,)`` entries; ``bias_at_distance(h, distance)`` broadcasts its
    index tensors and returns float32 zeros and ``-inf``.
    """

    paper = "Jelassi et al. 2024 (Hard-ALiBi, Repeat After Me)"
    causal_only = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        windowed_heads: Annotated[int | None, WINDOWED_HEADS] = None,
        windows: Annotated[Sequence[int | None] | None, WINDOWS] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if windows is not None and windowed_heads is not None:
            raise ValueError(
                "give windowed_heads (the official schedule) or windows (one per head), not both"
            )
        if windows is None:
            count = num_heads // 2 if windowed_heads is None else windowed_heads
            if count > num_heads:
                raise ValueError(
                    f"windowed_heads must be <= num_heads={num_heads}, got {windowed_heads}"
                )
            windows = official_windows(num_heads, count)
        elif len(windows) != num_heads:
            raise ValueError(
                f"windows must have one entry per head (num_heads={num_heads}), got {len(windows)}"
            )
        self.windows: tuple[int | None, ...] = tuple(windows)
        # integer buffers: the window test stays exact whatever dtype the module is cast to
        self.register_buffer(
            "_windowed", torch.tensor([m is not None for m in self.windows]), persistent=False
        )
        self.register_buffer(
            "_window", torch.tensor([m or 0 for m in self.windows]), persistent=False
        )

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        inside = (distance >= 0) & (distance < self._window[h])
        keep = inside | ~self._windowed[h]
        return torch.where(keep, 0.0, float("-inf"))
