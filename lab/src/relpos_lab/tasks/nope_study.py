"""The NoPE study's tasks (Kazemnejad et al. 2023, "The Impact of Positional Encoding on
Length Generalization in Transformers", NeurIPS, arXiv 2305.19466), in the text formats of
the official ``data_instance_processor/*`` (McGill-NLP/length-generalization @40f8a44):

=========  ==============================================  ===================================
task       prompt (``·`` a space; ``[SEP]·`` where used)     target
=========  ==============================================  ===================================
copy       ``Copy: w1 … wn·[SEP]·``                         ``w1 … wn``
reverse    ``Reverse: w1 … wn·[SEP]·``                      ``wn … w1``
addition   ``Compute 5 3 7 + 1 9 ?·``                       ``The answer is 5 5 6.``
sort       ``Sort the following list [ 3, 1, 2 ].·``        ``The sorted list is [ 1, 2, 3 ].``
scan       ``Solve: jump twice after walk[SEP]·``           ``Walk Jump Jump``
=========  ==============================================  ===================================

Lengths (the builders): copy, reverse and sort draw the sequence length uniformly from
``1..L`` in training and test at ``L+1..2L``; addition draws both operand lengths from
``1..L`` (numbers uniform with a non-zero leading digit, ``0..9`` for one digit) and tests
bins with at least one operand of ``L+1..2L`` digits, reported by the longer operand; SCAN
uses the grammar-generated length split (``relpos_lab.tasks.scan``). The official copy and
reverse words are the first 100 (sort: 50) strings that the t5-base tokenizer keeps as one
token each; relpos's word-level vocabulary uses 100 distinct symbols ``0-9 a-z A-Z`` and
``w62 .. w99`` (sort: the first 50, ordered by their index) — for a word-level model only
the number of distinct symbols matters. The official builders draw fixed datasets (100K
train examples); relpos draws every training batch afresh from the same distribution (an
infinite stream, seeded per step) and a fixed test set per length from the run's seed.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from relpos.validation import check_int

from .scan import ACTION_WORDS, scan_split
from .text import Example, words

__all__ = ["SYMBOLS", "TextTask", "NOPE_TASKS", "nope_task", "digit_words"]

SYMBOLS = tuple(string.digits + string.ascii_lowercase + string.ascii_uppercase) + tuple(
    f"w{i}" for i in range(62, 100)
)
SORT_SYMBOLS = SYMBOLS[:50]


def digit_words(number: int) -> str:
    """``537`` -> ``"5 3 7"`` (the official ``number_to_string``)."""
    return " ".join(str(number))


@dataclass(frozen=True)
class TextTask:
    """One decoder-only task: ``example(rng, length)`` draws one ``Example`` whose length
    category is ``length``; ``train_lengths`` / ``test_lengths`` are the categories for a
    train length ``L``."""

    name: str

    def vocabulary(self) -> list[str]:
        """Every word the task's examples can hold."""
        base = {
            "copy": ["Copy:", "[SEP]", *SYMBOLS],
            "reverse": ["Reverse:", "[SEP]", *SYMBOLS],
            "addition": [*"Compute + ? The answer is .".split(), *string.digits],
            "sort": [*words("Sort the following list [ , ]. The sorted list is"), *SORT_SYMBOLS],
        }
        if self.name == "scan":
            verbs = ["walk", "run", "jump", "look", "turn", "left", "right", "opposite"]
            verbs += ["around", "twice", "thrice", "and", "after"]
            return ["Solve:", "[SEP]", *verbs, *ACTION_WORDS.values()]
        return base[self.name]

    def train_lengths(self, train_len: int) -> list[int]:
        if self.name == "scan":
            return list(range(1, 26))
        return list(range(1, train_len + 1))

    def test_lengths(self, train_len: int) -> list[int]:
        if self.name == "scan":
            return list(range(26, 49))
        return list(range(train_len + 1, 2 * train_len + 1))

    def example(self, rng: np.random.Generator, length: int, train_len: int = 0) -> Example:
        """One example of length category ``length`` (addition, a test bin: the longer
        operand has ``length`` digits, the other ``1..length``, each side equally likely to
        be the long one)."""
        check_int(length, "length")
        if self.name in ("copy", "reverse"):
            items = [SYMBOLS[i] for i in rng.integers(0, len(SYMBOLS), size=length)]
            target = items if self.name == "copy" else items[::-1]
            head = "Copy:" if self.name == "copy" else "Reverse:"
            source = f"{head} {' '.join(items)} "
            return _example(source + "[SEP] ", " ".join(target), length, source)
        if self.name == "sort":
            ranks = rng.integers(0, len(SORT_SYMBOLS), size=length)
            src = ", ".join(SORT_SYMBOLS[i] for i in ranks)
            tgt = ", ".join(SORT_SYMBOLS[i] for i in np.sort(ranks))
            source = f"Sort the following list [ {src} ]. "
            return _example(source, f"The sorted list is [ {tgt} ].", length, source)
        if self.name == "addition":
            other = int(rng.integers(1, length + 1))
            a_len, b_len = (length, other) if rng.integers(0, 2) == 0 else (other, length)
            return self._addition(rng, a_len, b_len)
        raise ValueError(f"task {self.name!r} draws from a fixed split (use scan_examples)")

    def train_example(self, rng: np.random.Generator, train_len: int) -> Example:
        """One training example: the length uniform in ``1..train_len`` (addition: both
        operand lengths, independently; the category is the longer one)."""
        if self.name == "addition":
            a_len, b_len = (int(n) for n in rng.integers(1, train_len + 1, size=2))
            return self._addition(rng, a_len, b_len)
        return self.example(rng, int(rng.integers(1, train_len + 1)), train_len)

    def _addition(self, rng: np.random.Generator, a_len: int, b_len: int) -> Example:
        a, b = _number(rng, a_len), _number(rng, b_len)
        source = f"Compute {digit_words(a)} + {digit_words(b)} ? "
        target = f"The answer is {digit_words(a + b)}."
        return _example(source, target, max(a_len, b_len), source)

    def scan_examples(self, seed: int, split: str) -> list[Example]:
        """SCAN's fixed examples of ``split`` (``train``, ``valid`` or ``test``), length
        category = target length."""
        out = []
        for command, actions in scan_split(seed)[split]:
            source = f"Solve: {command}"
            target = " ".join(ACTION_WORDS[a] for a in actions)
            out.append(_example(source + "[SEP] ", target, len(actions), source))
        return out


def _number(rng: np.random.Generator, digits: int) -> int:
    """Uniform ``digits``-digit number (non-zero leading digit; ``0..9`` for one digit)."""
    if digits == 1:
        return int(rng.integers(0, 10))
    head = int(rng.integers(1, 10))
    tail = rng.integers(0, 10, size=digits - 1).tolist()
    return int(str(head) + "".join(map(str, tail)))


def _example(prompt: str, target: str, length: int, source: str) -> Example:
    return Example(tuple(words(prompt)), tuple(words(target)), length, source, target)


NOPE_TASKS: dict[str, TextTask] = {
    name: TextTask(name) for name in ("copy", "reverse", "addition", "sort", "scan")
}


def nope_task(name: str) -> TextTask:
    """The NoPE-study task ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return NOPE_TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown NoPE-study task {name!r}; known tasks: {', '.join(NOPE_TASKS)}"
        ) from None
