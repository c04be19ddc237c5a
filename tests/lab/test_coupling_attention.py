"""The coupled-addition attention diagnosis (``relpos_lab.tasks.coupling_attention``) on a
tiny trained model: one row per answer digit, weights that are fractions of one softmax, no
weight on unseen distances at the training lengths, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from relpos_lab.cli import main
from relpos_lab.tasks.coupling_attention import digit_attention
from relpos_lab.tasks.coupling_attention import main as diagnose

TINY = ("--dim", "16", "--depth", "2", "--heads", "2", "--batch", "4", "--steps", "3")
TINY += ("--train-len", "4", "--test-lengths", "6,9", "--eval-size", "8")
TINY += ("--jobs", "1", "--no-progress", "--seeds", "1")


@pytest.fixture(scope="module")
def coupled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("coupling") / "run"
    args = ["tasks", "--suite", "coupling", "--encodings", "learned+coupled", *TINY]
    assert main([*args, "--out", str(out)]) == 0
    return out


def test_one_row_per_answer_digit_with_weights_of_one_softmax(coupled):
    rows = digit_attention(coupled / "addition" / "learned+coupled" / "seed0", [3, 4, 6, 9])
    assert [(r["length"], r["digit"]) for r in rows] == [
        (n, d) for n in (3, 4, 6, 9) for d in range(n + 1)
    ]
    for r in rows:
        assert 0 <= r["accuracy"] <= 1
        assert 0 <= r["needed"] and 0 <= r["unseen"] and r["needed"] + r["unseen"] <= 1 + 1e-6
    # a training answer has at most train_len + 1 = 5 digits: no pair farther than that
    assert all(r["unseen"] == 0 for r in rows if r["length"] <= 4)
    # at 9 digits the lowest digit's query (id 1) sees operand ids up to 10, 9 away
    assert next(r for r in rows if r["length"] == 9 and r["digit"] == 0)["unseen"] > 0


def test_the_command_prints_a_line_per_length_and_refuses_other_models(coupled, tmp_path, capsys):
    seed0 = coupled / "addition" / "learned+coupled" / "seed0"
    assert diagnose([str(seed0), "--lengths", "4,6", "--eval-size", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count(" digits (answer digit") == 2
    assert diagnose([str(tmp_path)]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    other = coupled / "addition" / "nope" / "seed0"
    if not other.exists():
        args = ["tasks", "--suite", "coupling", "--encodings", "nope", *TINY]
        assert main([*args, "--out", str(tmp_path / "nope")]) == 0
        other = tmp_path / "nope" / "addition" / "nope" / "seed0"
    assert diagnose([str(other)]) == 2
    assert "a coupled-addition model is needed" in capsys.readouterr().err
    assert diagnose([str(seed0), "--lengths", "x"]) == 2
    assert "--lengths" in capsys.readouterr().err
