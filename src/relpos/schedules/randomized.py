"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost
Length Generalization of Transformers", arXiv 2305.16843; google-deepmind/
randomized_positional_encodings, ``noisy_fixed_positional_encodings``).

Train on length ``T`` with positions drawn as an *ordered* random subset of a larger range
``[0, N)`` (``N = max_length``, 2048 in the example config), so that at test time longer
inputs use positions the model has already seen. The same sample serves queries and keys
(``relpos.attention(..., q_pos=pos, k_pos=pos)``) and any absolute or rotary encoding. The
official code draws a new sample on every forward pass, training and evaluation alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_generator, check_int


def randomized_positions(
    length: int,
    max_length: int,
    *,
    batch: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """``length`` distinct integers from ``[0, max_length)``, sampled without replacement and
    sorted: ``(length,)`` int64, or ``(batch, length)`` with an independent sample per row.

    Every subset of size ``length`` is equally likely. ``generator`` makes it reproducible
    (it must live on ``device``; default CPU).
    """
    check_int(length, "length", minimum=0)
    check_int(max_length, "max_length", minimum=1)
    if length > max_length:
        raise ValueError(
            f"length ({length}) must be <= max_length ({max_length}): positions are distinct"
        )
    if batch is not None:
        check_int(batch, "batch", minimum=1)
    check_generator(generator)
    rows = 1 if batch is None else batch
    # the indices of the `length` largest of `max_length` iid uniforms: a uniform subset
    keys = torch.rand(rows, max_length, generator=generator, device=device)
    pos = keys.topk(length, dim=-1, sorted=False).indices.sort(dim=-1).values
    return pos[0] if batch is None else pos


__all__ = ["randomized_positions"]
