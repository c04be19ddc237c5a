"""Convert q/k projection weights between the two RoPE pair layouts.

* *interleaved* pairs channels ``(2i, 2i+1)`` (RoFormer, GPT-J, Meta Llama, GGUF files);
* *half* pairs channels ``(i, i + r/2)`` (GPT-NeoX, Hugging Face Llama).

Within each head, ``perm = [0, 2, 4, ..., r-2, 1, 3, ..., r-1]`` over the ``r`` rotated
channels satisfies ``half(x[perm]) == interleaved(x)[perm]``: permuting the output rows of
``W_q`` and ``W_k`` (and their biases) by ``perm`` turns a model written for interleaved RoPE
into the same model for half-split RoPE. Attention scores are unchanged, since q and k are
permuted alike. Channels ``r..head_dim`` (partial rotary) keep their place. This is the row
permutation of Hugging Face's Llama weight converter, and for the full head the "un-permute"
of llama.cpp's GGUF converter (``convert_hf_to_gguf.py``):
``w.reshape(H, D/2, 2, in).swapaxes(1, 2).reshape(H*D, in)``.

Shapes: ``weight (num_heads * head_dim, in_features)`` (``nn.Linear`` layout) or a bias
``(num_heads * head_dim,)``. For grouped-query attention convert ``W_k`` with the number of
key/value heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_int

__all__ = ["interleaved_to_half", "half_to_interleaved", "interleaved_to_half_permutation"]


def _rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
    check_int(head_dim, "head_dim")
    if rotary_dim is not None:
        check_int(rotary_dim, "rotary_dim")
    r = head_dim if rotary_dim is None else rotary_dim
    if r > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim ({head_dim}), got {r}")
    if r % 2:
        what = "head_dim" if rotary_dim is None else "rotary_dim"
        raise ValueError(f"{what} must be even (channels rotate in pairs), got {r}")
    return r


def interleaved_to_half_permutation(head_dim: int, rotary_dim: int | None = None) -> Tensor:
    """Channel order of one head: ``half = interleaved[perm]``, int64 ``(head_dim,)``.

    ``perm = [0, 2, ..., r-2, 1, 3, ..., r-1, r, r+1, ..., head_dim-1]`` with ``r =
    rotary_dim`` (default ``head_dim``); its inverse converts back.
    """
    r = _rotary_dim(head_dim, rotary_dim)
    rotated = torch.arange(r).reshape(r // 2, 2).T.reshape(r)
    return torch.cat((rotated, torch.arange(r, head_dim)))


def _permute_rows(
    weight: Tensor, num_heads: int, head_dim: int, rotary_dim: int | None, inverse: bool
) -> Tensor:
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    check_int(num_heads, "num_heads")
    perm = interleaved_to_half_permutation(head_dim, rotary_dim)
    if weight.dim() not in (1, 2):
        raise ValueError(
            f"weight must be a projection weight (num_heads * head_dim, in_features) or a bias "
            f"(num_heads * head_dim,), got shape {tuple(weight.shape)}"
        )
    rows = num_heads * head_dim
    if weight.shape[0] != rows:
        raise ValueError(
            f"weight has {weight.shape[0]} rows but num_heads * head_dim = {num_heads} * "
            f"{head_dim} = {rows}; expected shape ({rows}, in_features) or ({rows},)"
        )
    if inverse:
        perm = torch.argsort(perm)
    per_head = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return per_head[:, perm.to(weight.device)].reshape(weight.shape)


def interleaved_to_half(
    weight: Tensor, num_heads: int, head_dim: int, rotary_dim: int | None = None
) -> Tensor:
    """Rows of ``weight`` (or a bias) reordered so that half-split RoPE reproduces the scores
    interleaved RoPE gives with the original. Returns a new tensor; gradients flow."""
    return _permute_rows(weight, num_heads, head_dim, rotary_dim, inverse=False)


def half_to_interleaved(
    weight: Tensor, num_heads: int, head_dim: int, rotary_dim: int | None = None
) -> Tensor:
    """The inverse of ``interleaved_to_half`` (e.g. HF Llama weights to Meta's layout)."""
    return _permute_rows(weight, num_heads, head_dim, rotary_dim, inverse=True)
