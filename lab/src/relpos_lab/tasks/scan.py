"""SCAN (Lake & Baroni 2018, "Generalization without Systematicity", arXiv 1711.00350), every
command generated from its grammar, with the length split of the NoPE study (Kazemnejad et
al. 2023, arXiv 2305.19466; McGill-NLP/length-generalization
``scripts/dataset_builders/make_scan_dataset.py``: all SCAN commands pooled, target length
<= 25 -> train (90 %) / validation (10 %), > 25 -> test).

Grammar (the paper's Fig. 6 / Table 1)::

    C -> S and S | S after S | S          S -> V twice | V thrice | V
    V -> D opposite {left,right} | D around {left,right} | D {left,right} | D
    D -> walk | run | jump | look | turn

with ``turn`` alone allowed only before a direction. Meanings: ``walk`` -> ``I_WALK`` (run,
jump, look likewise; ``turn`` -> nothing); ``x left`` -> ``I_TURN_LEFT x``; ``x opposite
left`` -> ``I_TURN_LEFT I_TURN_LEFT x``; ``x around left`` -> ``(I_TURN_LEFT x) x 4``;
``twice`` / ``thrice`` repeat; ``a and b`` -> ``a b``; ``a after b`` -> ``b a``.
That gives 34 V-phrases, 102 S-phrases and 20,910 commands, the longest target 48 actions;
17,774 have targets of <= 25 actions and 3,136 of 26-48 (check numbers).

The NoPE study's text form (``scan_bos`` processor): source ``Solve: <command>``, separator
``[SEP]``, target the actions renamed ``I_WALK`` -> ``Walk``, ..., ``I_TURN_LEFT`` ->
``Left``. The official builder shuffles with Python's unseeded ``random``; relpos shuffles
with the run's seed (the split by length is the same).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = [
    "ACTION_WORDS",
    "scan_commands",
    "scan_meaning",
    "scan_split",
    "verb_phrases",
    "sentence_phrases",
]

PRIMITIVES = {"walk": "I_WALK", "run": "I_RUN", "jump": "I_JUMP", "look": "I_LOOK"}
TURNS = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}
#: the NoPE study's renaming of the actions
ACTION_WORDS = {
    "I_WALK": "Walk",
    "I_RUN": "Run",
    "I_JUMP": "Jump",
    "I_LOOK": "Look",
    "I_TURN_LEFT": "Left",
    "I_TURN_RIGHT": "Right",
}


@functools.cache
def verb_phrases() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The 34 V-phrases with their meanings (action tuples)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for verb, action in PRIMITIVES.items():
        out.append((verb, (action,)))
    for verb in [*PRIMITIVES, "turn"]:
        act = (PRIMITIVES[verb],) if verb in PRIMITIVES else ()
        for direction, turn in TURNS.items():
            out.append((f"{verb} {direction}", (turn, *act)))
            out.append((f"{verb} opposite {direction}", (turn, turn, *act)))
            out.append((f"{verb} around {direction}", (turn, *act) * 4))
    return tuple(out)


@functools.cache
def sentence_phrases() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The 102 S-phrases: every V-phrase alone, ``twice`` and ``thrice``."""
    out = []
    for text, meaning in verb_phrases():
        out.append((text, meaning))
        out.append((f"{text} twice", meaning * 2))
        out.append((f"{text} thrice", meaning * 3))
    return tuple(out)


@functools.cache
def scan_commands() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """All 20,910 SCAN commands with their action sequences, in grammar order."""
    phrases = sentence_phrases()
    out = list(phrases)
    for a, ma in phrases:
        for b, mb in phrases:
            out.append((f"{a} and {b}", ma + mb))
            out.append((f"{a} after {b}", mb + ma))
    return tuple(out)


def scan_meaning(command: str) -> tuple[str, ...]:
    """The action sequence of one command, parsed by the grammar (``ValueError`` if it is not
    a SCAN command)."""
    for conj in (" and ", " after "):
        if conj in command:
            left, right = command.split(conj, 1)
            a, b = scan_meaning(left), scan_meaning(right)
            return a + b if conj == " and " else b + a
    table = dict(sentence_phrases())
    if command not in table:
        raise ValueError(f"{command!r} is not a SCAN command")
    return table[command]


def scan_split(
    seed: int, *, max_train_target: int = 25, valid_fraction: float = 0.1
) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """The NoPE study's length split: commands with targets of at most ``max_train_target``
    actions, shuffled with ``seed``, the first ``valid_fraction`` as ``valid`` and the rest
    as ``train``; longer targets as ``test`` (grammar order)."""
    short = [c for c in scan_commands() if len(c[1]) <= max_train_target]
    test = [c for c in scan_commands() if len(c[1]) > max_train_target]
    order = np.random.default_rng(seed).permutation(len(short))
    short = [short[i] for i in order]
    n_valid = int(len(short) * valid_fraction)
    return {"train": short[n_valid:], "valid": short[:n_valid], "test": test}
