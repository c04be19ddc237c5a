"""Sequence-to-sequence examples as words, their vocabulary, and decoder-only batches.

The NoPE study and position coupling train a decoder-only model on ``prompt [sep] target
EOS`` with the loss on the target and EOS only (``decoder_only_mask_inputs``). An
``Example`` holds the prompt and target as words; ``Vocab`` maps words to ids (``PAD`` 0,
``EOS`` 1); ``DecoderBatch`` is a padded batch with the loss mask and the id of the example
each row came from.

Exact match under greedy decoding equals "every target token (and EOS) is the argmax under
teacher forcing": greedy decoding reproduces the target exactly when, at each step, the
argmax given the correct prefix is the next target token, and that is the same condition.
The lab therefore scores exact match with one forward pass per batch (``exact_match`` in
``relpos_lab.tasks.metrics``), which ``tests/lab/tasks`` checks against
``TransformerLM.generate``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Example", "Vocab", "DecoderBatch", "words", "decoder_batch", "PAD", "EOS"]

PAD, EOS = "<pad>", "<eos>"
_WORD = re.compile(r"\[SEP\]|[^\s\[\],.?]+|[\[\],.?]")


def words(text: str) -> list[str]:
    """A text split into words: whitespace separates, and ``[ ] , . ?`` are words of their
    own (``"[ 1, 2 ]."`` -> ``[, 1, ",", 2, ], .``); ``[SEP]`` is one word."""
    return _WORD.findall(text)


@dataclass(frozen=True)
class Example:
    """One example: ``prompt`` (with its separator) and ``target`` words, the text forms the
    paper's code builds (``source``, ``target_text``), and its length category."""

    prompt: tuple[str, ...]
    target: tuple[str, ...]
    length: int
    source: str = ""
    target_text: str = ""


class Vocab:
    """Words to ids: ``<pad>`` 0, ``<eos>`` 1, then ``words`` in order (duplicates dropped)."""

    def __init__(self, vocabulary: Iterable[str]) -> None:
        self.words = list(dict.fromkeys([PAD, EOS, *vocabulary]))
        self.ids = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @property
    def pad(self) -> int:
        return 0

    @property
    def eos(self) -> int:
        return 1

    def encode(self, items: Sequence[str]) -> list[int]:
        try:
            return [self.ids[w] for w in items]
        except KeyError as err:
            raise ValueError(f"word {err.args[0]!r} is not in the task's vocabulary") from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.words[i] for i in ids]


@dataclass
class DecoderBatch:
    """``tokens (B, T)`` padded with 0; ``loss_mask (B, T)``: True where position ``t``
    predicts a target word or EOS (the token at ``t + 1``); ``lengths (B,)``: each example's
    length category; ``pos (B, T)`` or None: position ids when the task defines them
    (position coupling)."""

    tokens: Tensor
    loss_mask: Tensor
    lengths: Tensor
    prompt_lengths: Tensor
    pos: Tensor | None = None


def decoder_batch(examples: Sequence[Example], vocab: Vocab) -> DecoderBatch:
    """Encode and right-pad ``examples`` into a ``DecoderBatch``: ``prompt target EOS``."""
    rows, prompt_lens = [], []
    for ex in examples:
        rows.append(vocab.encode(ex.prompt) + vocab.encode(ex.target) + [vocab.eos])
        prompt_lens.append(len(ex.prompt))
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.int64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, (row, p) in enumerate(zip(rows, prompt_lens, strict=True)):
        tokens[b, : len(row)] = torch.tensor(row)
        mask[b, p - 1 : len(row) - 1] = True  # predicts target[0] .. EOS
    return DecoderBatch(
        tokens,
        mask,
        torch.tensor([ex.length for ex in examples]),
        torch.tensor(prompt_lens),
    )
