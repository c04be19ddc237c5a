"""SCAN from its grammar, the NoPE study's text formats, and coupled addition
(``relpos_lab.tasks.scan``, ``nope_study``, ``coupled_addition``, ``text``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relpos_lab.tasks.coupled_addition import (
    addition_example,
    coupled_batch_positions,
    coupling_vocab,
    random_start,
)
from relpos_lab.tasks.nope_study import NOPE_TASKS, nope_task
from relpos_lab.tasks.scan import (
    scan_commands,
    scan_meaning,
    scan_split,
    sentence_phrases,
    verb_phrases,
)
from relpos_lab.tasks.text import Vocab, decoder_batch, words


def test_scan_grammar_gives_the_spec_counts():
    assert len(verb_phrases()) == 34
    assert len(sentence_phrases()) == 102
    commands = scan_commands()
    assert len(commands) == 20_910
    assert len({c for c, _ in commands}) == 20_910
    lengths = [len(m) for _, m in commands]
    assert max(lengths) == 48
    assert sum(n <= 25 for n in lengths) == 17_774
    assert sum(26 <= n <= 48 for n in lengths) == 3_136


def test_scan_meanings_match_the_paper():
    assert scan_meaning("jump twice after walk") == ("I_WALK", "I_JUMP", "I_JUMP")
    assert scan_meaning("turn left") == ("I_TURN_LEFT",)
    assert scan_meaning("walk opposite right") == ("I_TURN_RIGHT", "I_TURN_RIGHT", "I_WALK")
    assert scan_meaning("look around left") == ("I_TURN_LEFT", "I_LOOK") * 4
    assert (
        scan_meaning("run thrice and turn around right") == ("I_RUN",) * 3 + ("I_TURN_RIGHT",) * 4
    )
    with pytest.raises(ValueError, match="not a SCAN command"):
        scan_meaning("turn")


def test_scan_length_split_is_the_nope_studys():
    split = scan_split(0)
    assert len(split["test"]) == 3_136
    assert len(split["valid"]) == 17_774 // 10
    assert len(split["train"]) == 17_774 - 17_774 // 10
    assert all(len(m) <= 25 for _, m in split["train"] + split["valid"])
    assert min(len(m) for _, m in split["test"]) == 26
    assert split["train"] == scan_split(0)["train"] and split["train"] != scan_split(1)["train"]


def test_scan_text_format():
    ex = next(e for e in nope_task("scan").scan_examples(0, "test") if e.length == 48)
    assert ex.source.startswith("Solve: ") and ex.prompt[-1] == "[SEP]"
    assert set(ex.target) <= {"Walk", "Run", "Jump", "Look", "Left", "Right"}
    assert len(ex.target) == 48


def test_nope_study_formats_match_the_official_processors():
    rng = np.random.default_rng(0)
    copy = nope_task("copy").example(rng, 3)
    assert copy.source == f"Copy: {copy.target_text} "
    assert copy.prompt == ("Copy:", *copy.target, "[SEP]")
    rev = nope_task("reverse").example(rng, 4)
    assert rev.prompt[1:-1] == rev.target[::-1] and rev.prompt[0] == "Reverse:"
    add = nope_task("addition").example(rng, 3)
    a, b = add.source.removeprefix("Compute ").removesuffix(" ? ").split(" + ")
    total = int(a.replace(" ", "")) + int(b.replace(" ", ""))
    assert add.target_text == f"The answer is {' '.join(str(total))}."
    assert max(len(a.split()), len(b.split())) == 3
    srt = nope_task("sort").example(rng, 5)
    assert srt.source.startswith("Sort the following list [ ") and srt.source.endswith(" ]. ")
    assert srt.target_text.startswith("The sorted list is [ ")
    assert words("Sort the following list [ 3, 1, 2 ]. ") == [
        "Sort", "the", "following", "list", "[", "3", ",", "1", ",", "2", "]", ".",
    ]  # fmt: skip


def test_every_nope_task_example_fits_its_vocabulary_and_length():
    rng = np.random.default_rng(1)
    for name, task in NOPE_TASKS.items():
        vocab = Vocab(task.vocabulary())
        if name == "scan":
            exs = task.scan_examples(0, "valid")[:50]
        else:
            exs = [task.example(rng, n) for n in task.test_lengths(10)]
            exs += [task.train_example(rng, 10) for _ in range(20)]
            assert all(1 <= e.length <= 10 for e in exs[-20:])
            if name in ("copy", "reverse", "sort"):
                symbols = [w for w in exs[0].prompt if w not in (",", "[", "]", ".")]
                assert len(symbols) - (4 if name == "sort" else 2) == exs[0].length
        batch = decoder_batch(exs, vocab)  # raises on a word outside the vocabulary
        assert batch.tokens.shape[0] == len(exs)


def test_decoder_batch_masks_target_and_eos_only():
    ex = nope_task("copy").example(np.random.default_rng(0), 2)
    vocab = Vocab(nope_task("copy").vocabulary())
    batch = decoder_batch([ex], vocab)
    p, t = len(ex.prompt), len(ex.target)
    assert batch.tokens.shape == (1, p + t + 1)
    assert batch.loss_mask[0].tolist() == [False] * (p - 1) + [True] * (t + 1) + [False]
    assert int(batch.tokens[0, -1]) == vocab.eos


def test_coupled_addition_reproduces_the_spec_ids():
    vocab = coupling_vocab()
    from relpos_lab.tasks.text import Example

    ex = Example(tuple("123+045="), tuple("8610"), 3)
    batch = decoder_batch([ex], vocab)
    pos = coupled_batch_positions(batch, vocab, max_position=40, train=False)
    assert pos[0].tolist() == [4, 3, 2, 1, 4, 3, 2, 1, 2, 3, 4, 5, 0]  # ... EOS 0


def test_coupled_addition_examples_and_training_starts():
    rng = np.random.default_rng(2)
    vocab = coupling_vocab()
    for _ in range(20):
        ex = addition_example(rng, 1, 6)
        a, b = ex.source[:-1].split("+")
        assert len(a) == len(b) == ex.length and len(ex.target) == ex.length + 1
        assert int("".join(ex.target)[::-1]) == int(a) + int(b)
    exs = [addition_example(rng, 1, 10) for _ in range(64)]
    batch = decoder_batch(exs, vocab)
    g = torch.Generator().manual_seed(0)
    pos = coupled_batch_positions(batch, vocab, max_position=40, train=True, generator=g)
    assert int(pos.max()) <= 40 and int(pos.min()) == 0
    assert len(set(pos[:, 0].tolist())) > 1  # starts differ per row
    test = [addition_example(rng, 1, 30, a_digits=30)]
    with pytest.raises(ValueError, match="exceeds max_position 20"):
        coupled_batch_positions(decoder_batch(test, vocab), vocab, max_position=20, train=False)


def test_random_start_offsets_training_positions_only():
    vocab = coupling_vocab()
    batch = decoder_batch([addition_example(np.random.default_rng(0), 3, 3)] * 8, vocab)
    g = torch.Generator().manual_seed(0)
    pos = random_start(batch, max_position=50, train=True, generator=g)
    T = batch.tokens.shape[1]
    assert ((pos - pos[:, :1]) == torch.arange(T)).all() and int(pos.max()) <= 50
    assert random_start(batch, max_position=50, train=False, generator=g)[0].tolist() == list(
        range(T)
    )
