"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", arXiv 2305.16300).

A random key hides inside repeated filler text; the model must repeat it at the end. The
prompt is the Landmark format that Position Interpolation, LongLoRA and YaRN re-use
(epfml/landmark-attention ``llama/run_test.py``, read through copies)::

    task_description \\n garbage[:n_prefix] \\n information_line \\n garbage[:n_suffix] \\n
    final_question

with ``garbage`` = the filler sentence repeated and joined by spaces, ``n_garbage`` counted in
**characters** (``n_prefix + n_suffix = n_garbage``), the key an integer in ``[1, 50000]`` and
``information_line = "The pass key is {key}. Remember it. {key} is the pass key."``.

Here the key's depth is chosen (``n_prefix = round(depth * n_garbage)``) rather than drawn, so
every method sees the same prompts, and ``n_garbage`` is calibrated so that the prompt has
about ``target_tokens`` tokens in the model's own tokenizer (``passkey_prompt``). Scoring as in
the paper: greedy decoding, the first integer in the generated text must equal the key.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from relpos.validation import check_float, check_int

TASK_DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
GARBAGE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
GARBAGE_REPEATS = 2000  # the Landmark code's " ".join([garbage] * 2000)
FINAL_QUESTION = "What is the pass key? The pass key is"
KEY_RANGE = (1, 50000)  # random.randint(1, 50000) in the Landmark code
MAX_NEW_TOKENS = 12  # a 5-digit key is 6 tokens for digit-wise tokenizers (" ", 5 digits)


def information_line(key: int) -> str:
    """The sentence that carries the key."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def garbage(n_chars: int) -> str:
    """The first ``n_chars`` characters of the filler (repeated beyond the Landmark code's
    2000 copies when a prompt needs more)."""
    check_int(n_chars, "n_chars", minimum=0)
    repeats = max(GARBAGE_REPEATS, n_chars // (len(GARBAGE) + 1) + 1)
    return " ".join([GARBAGE] * repeats)[:n_chars]


def landmark_prompt(n_garbage: int, key: int, depth: float) -> str:
    """The Landmark prompt with ``n_garbage`` filler characters, ``round(depth * n_garbage)``
    of them before the information line."""
    check_float(depth, "depth", minimum=0.0, maximum=1.0)
    check_int(key, "key", minimum=0)
    prefix = round(depth * n_garbage)
    return "\n".join(
        [
            TASK_DESCRIPTION,
            garbage(prefix),
            information_line(key),
            garbage(n_garbage - prefix),
            FINAL_QUESTION,
        ]
    )


Encode = Callable[[str], list[int]]


def as_encoder(tokenizer: Any) -> Encode:
    """``str -> list[int]`` from a ``tokenizers.Tokenizer`` (``.encode(text).ids``), an object
    whose ``encode`` returns a list or tensor of ids, or such a callable itself."""
    if callable(getattr(tokenizer, "encode", None)):

        def encode(text: str) -> list[int]:
            out = tokenizer.encode(text)
            out = getattr(out, "ids", out)
            return out.tolist() if isinstance(out, torch.Tensor) else list(out)

        return encode
    if callable(tokenizer):
        return lambda text: list(tokenizer(text))
    raise TypeError(
        f"tokenizer must have an encode(text) method or be a callable, got "
        f"{type(tokenizer).__name__}"
    )


@dataclass(frozen=True)
class PasskeyPrompt:
    """One passkey prompt: its text, token ids, the key and where it hides."""

    text: str
    ids: list[int]
    key: int
    depth: float
    n_garbage: int
    target_tokens: int

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


def random_key(rng: random.Random) -> int:
    """A key as the Landmark code draws it: ``randint(1, 50000)``."""
    return rng.randint(*KEY_RANGE)


def passkey_prompt(tokenizer: Any, target_tokens: int, *, key: int, depth: float) -> PasskeyPrompt:
    """The Landmark prompt whose token count is closest to ``target_tokens``.

    ``n_garbage`` starts from the filler's tokens-per-character rate and is corrected by a few
    secant steps on the real token count (the split at ``depth`` can shift it by a token or
    two). Raises ``ValueError`` when even ``n_garbage = 0`` exceeds ``target_tokens``.
    """
    check_int(target_tokens, "target_tokens")
    encode = as_encoder(tokenizer)

    def count(n: int) -> int:
        return len(encode(landmark_prompt(n, key, depth)))

    base = count(0)
    if base > target_tokens:
        raise ValueError(
            f"target_tokens={target_tokens} is shorter than the prompt without filler "
            f"({base} tokens)"
        )
    sample = garbage(20 * (len(GARBAGE) + 1))
    rate = len(encode(sample)) / len(sample)  # tokens per filler character
    n = max(0, round((target_tokens - base) / rate))
    best_n, best_err = 0, target_tokens - base
    for _ in range(6):
        err = target_tokens - count(n)
        if abs(err) < abs(best_err):
            best_n, best_err = n, err
        if err == 0:
            break
        n = max(0, n + round(err / rate))
    text = landmark_prompt(best_n, key, depth)
    return PasskeyPrompt(
        text=text,
        ids=encode(text),
        key=key,
        depth=float(depth),
        n_garbage=best_n,
        target_tokens=target_tokens,
    )


def passkey_segments(tokenizer: Any, prompt: PasskeyPrompt, documents: int = 8) -> list[int]:
    """PINE's segment ids of a passkey prompt (``relpos.encodings.rotary.pine``): ``-1`` for
    the task description (the prefix), the filler and information line cut into ``documents``
    contiguous documents of (nearly) equal token counts ``0 .. n-1``, ``n`` for the final
    question (the suffix). Boundaries are the token counts of the text before them."""
    check_int(documents, "documents")
    encode = as_encoder(tokenizer)
    text, total = prompt.text, prompt.n_tokens
    first = min(len(encode(text.split("\n", 1)[0])), total)
    cut = text.rindex("\n" + FINAL_QUESTION)
    last = min(max(len(encode(text[:cut])), first), total - 1)  # the suffix keeps a token
    middle = last - first
    n = min(documents, middle)
    ids = [-1] * first
    for d in range(n):
        ids += [d] * ((d + 1) * middle // n - d * middle // n)
    return ids + [n] * (total - last)


_INTEGER = re.compile(r"\d+")


def first_integer(text: str) -> int | None:
    """The first integer in ``text`` (the paper's metric), or None."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


def _integer_finished(text: str) -> bool:
    """True once ``text`` holds a complete integer (digits followed by a non-digit)."""
    return re.search(r"\d+\D", text) is not None


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """Text of ``ids`` with ``tokenizer.decode``."""
    return str(tokenizer.decode(ids))


@torch.no_grad()
def run_passkey(
    model: Any,
    tokenizer: Any,
    prompt: PasskeyPrompt,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    inputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Greedy-decode an answer to ``prompt``; ``correct`` when its first integer is the key.

    ``model.generate(tokens (1, L), max_new_tokens, stop=...)`` must decode greedily (as
    ``relpos.nn.LlamaLM``); decoding stops once a complete integer has been produced.
    Returns ``dict(correct, answer, key, generated, prompt_tokens, depth, seconds)``.
    """
    device = next(iter(model.parameters())).device
    tokens = torch.tensor([prompt.ids], dtype=torch.int64, device=device)

    def stop(new: torch.Tensor) -> bool:
        return _integer_finished(decode_text(tokenizer, new[0].tolist()))

    t0 = time.perf_counter()
    extra = {} if inputs is None else {"inputs": inputs}  # the encoding's per-call tensors
    out = model.generate(tokens, max_new_tokens, stop=stop, **extra)
    seconds = time.perf_counter() - t0
    generated = decode_text(tokenizer, out[0, tokens.shape[1] :].tolist())
    answer = first_integer(generated)
    return {
        "correct": answer == prompt.key,
        "answer": answer,
        "key": prompt.key,
        "generated": generated,
        "prompt_tokens": prompt.n_tokens,
        "depth": prompt.depth,
        "seconds": seconds,
    }


__all__ = [
    "TASK_DESCRIPTION",
    "passkey_segments",
    "GARBAGE",
    "FINAL_QUESTION",
    "information_line",
    "garbage",
    "landmark_prompt",
    "passkey_prompt",
    "PasskeyPrompt",
    "random_key",
    "first_integer",
    "run_passkey",
    "as_encoder",
]
