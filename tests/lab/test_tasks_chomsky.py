"""The Chomsky-suite generators (``relpos_lab.tasks.chomsky``): worked examples recomputed from the
official code (google-deepmind/neural_networks_chomsky_hierarchy), the output-length rule, the
masks, the official quirks, determinism from the generator."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_lab.tasks.chomsky import (
    BRACKET_IDS,
    CHOMSKY_TASKS,
    EQUATION_IDS,
    binary_addition_output,
    binary_expression,
    binary_multiplication_output,
    chomsky_task,
    compute_sqrt_output,
    cycle_navigation_output,
    evaluate_modular,
    odds_first_output,
    stack_manipulation_output,
    termination_mask,
)

#: the official T_out rule of every task for an input length T
T_OUT = {
    "even_pairs": lambda t: 1,
    "modular_arithmetic": lambda t: 1,
    "parity_check": lambda t: 1,
    "cycle_navigation": lambda t: 1,
    "stack_manipulation": lambda t: t + 1,
    "reverse_string": lambda t: t,
    "modular_arithmetic_brackets": lambda t: 1,
    "solve_equation": lambda t: 1,
    "duplicate_string": lambda t: 2 * t,
    "missing_duplicate_string": lambda t: 1,
    "odds_first": lambda t: t,
    "binary_addition": lambda t: t + 1,
    "binary_multiplication": lambda t: t,
    "compute_sqrt": lambda t: -(-t // 2),
    "bucket_sort": lambda t: t,
}
VOCAB = {  # (V_in, V_out) of every official task
    "even_pairs": (2, 2),
    "modular_arithmetic": (9, 5),
    "parity_check": (2, 2),
    "cycle_navigation": (3, 5),
    "stack_manipulation": (5, 3),
    "reverse_string": (2, 2),
    "modular_arithmetic_brackets": (11, 5),
    "solve_equation": (11, 5),
    "duplicate_string": (2, 2),
    "missing_duplicate_string": (4, 2),
    "odds_first": (2, 2),
    "binary_addition": (3, 3),
    "binary_multiplication": (3, 3),
    "compute_sqrt": (2, 2),
    "bucket_sort": (5, 5),
}


def test_the_suite_has_the_papers_15_tasks_with_their_vocabularies():
    assert list(CHOMSKY_TASKS) == list(T_OUT)
    for name, (v_in, v_out) in VOCAB.items():
        task = CHOMSKY_TASKS[name]
        assert (task.input_size, task.output_size) == (v_in, v_out), name


@pytest.mark.parametrize("name", list(T_OUT))
def test_output_shapes_follow_the_rule_for_short_and_long_inputs(name):
    task = chomsky_task(name)
    rng = np.random.default_rng(0)
    for T in (1, 2, 3, 40, 41):
        batch = task.sample(rng, 5, T)
        t_in = T - 1 if name == "modular_arithmetic" and T % 2 == 0 else T
        assert batch.inputs.shape == (5, t_in)
        assert batch.targets.shape == (5, T_OUT[name](t_in))
        assert batch.mask.shape == batch.targets.shape
        assert int(batch.inputs.min()) >= 0 and int(batch.inputs.max()) < task.input_size
        assert int(batch.targets.min()) >= 0 and int(batch.targets.max()) < task.output_size
        if not task.masked:
            assert bool(batch.mask.all())


def test_stack_manipulation_worked_example():
    # 0 1 1 0 PUSH1 POP POP, stack length 4
    assert stack_manipulation_output([0, 1, 1, 0, 4, 2, 2], 4) == [1, 1, 0, 2, 0, 0, 0, 0]
    # docstring's second example: 1 1 0 POP POP POP -> empty stack
    assert stack_manipulation_output([1, 1, 0, 2, 2, 2], 3) == [2, 0, 0, 0, 0, 0, 0]


def test_odds_first_puts_zero_based_odd_indices_first_as_the_code_does():
    s = np.array([int(c) for c in "00110101"])
    assert "".join(map(str, odds_first_output(s))) == "01110100"  # not the docstring's 0100 0111


def test_binary_addition_and_multiplication_worked_examples():
    x = binary_expression(4, 3, 22, 5)  # a = 001 (4), b = 01101 (22)
    assert x == [0, 0, 1, 2, 0, 1, 1, 0, 1]
    assert binary_addition_output(26, len(x)) == [0, 1, 0, 1, 1, 2, 0, 0, 0, 0]  # T + 1
    assert binary_multiplication_output(88, len(x)) == [0, 0, 0, 1, 1, 0, 1, 2, 0]  # T


def test_compute_sqrt_cycle_and_modular_worked_examples():
    assert compute_sqrt_output(37, 6) == [1, 1, 0]
    assert int(cycle_navigation_output(np.array([2, 0, 1, 0, 0]))) == 3
    plus, minus, times = 5, 6, 7
    assert evaluate_modular([1, minus, 1, minus, 1]) == 4
    assert evaluate_modular([0, times, 1, plus, 4, times, 3, minus, 2]) == 0
    assert evaluate_modular([1, plus, 2, times, 3]) == 2


def test_termination_mask_ends_at_the_first_largest_id():
    mask = termination_mask(np.array([[1, 1, 0, 2, 0, 0], [2, 0, 0, 0, 0, 0]]))
    assert mask.tolist() == [[True] * 4 + [False] * 2, [True] + [False] * 5]


def test_masked_tasks_mask_exactly_through_the_termination_token():
    rng = np.random.default_rng(3)
    for name in ("stack_manipulation", "binary_addition", "binary_multiplication"):
        batch = chomsky_task(name).sample(rng, 16, 12)
        for row, mask in zip(batch.targets.tolist(), batch.mask.tolist(), strict=True):
            end = row.index(2)
            assert mask == [i <= end for i in range(len(row))], name


def test_modular_arithmetic_inputs_are_always_odd_and_use_three_operators():
    rng = np.random.default_rng(1)
    batch = chomsky_task("modular_arithmetic").sample(rng, 64, 10)
    assert batch.inputs.shape[1] == 9
    ops = batch.inputs[:, 1::2]
    assert set(ops.unique().tolist()) == {5, 6, 7}  # "_" (8) never sampled
    for row, y in zip(batch.inputs.tolist(), batch.targets[:, 0].tolist(), strict=True):
        text = "".join(str(t) if t < 5 else "+-*"[t - 5] for t in row)
        assert eval(text) % 5 == y  # Python's precedence is the task's


def _text(row: list[int], ids: dict[str, int]) -> str:
    inverse = {v: k for k, v in ids.items()}
    return "".join(str(t) if t < 5 else inverse[t] for t in row)


def test_bracket_expressions_evaluate_to_their_label():
    rng = np.random.default_rng(2)
    for T in (1, 2, 3, 4, 5, 9, 17):
        batch = chomsky_task("modular_arithmetic_brackets").sample(rng, 16, T)
        assert batch.inputs.shape[1] == T
        for row, y in zip(batch.inputs.tolist(), batch.targets[:, 0].tolist(), strict=True):
            assert eval(_text(row, BRACKET_IDS)) % 5 == y


def test_solve_equation_answer_satisfies_the_equation():
    rng = np.random.default_rng(4)
    batch = chomsky_task("solve_equation").sample(rng, 32, 11)
    for row, x in zip(batch.inputs.tolist(), batch.targets[:, 0].tolist(), strict=True):
        text = _text(row, EQUATION_IDS)
        lhs, rhs = text.split("=")
        assert text.count("x") == 1 and "*" not in lhs
        assert eval(lhs.replace("x", str(x))) % 5 == int(rhs)
    dummy = chomsky_task("solve_equation").sample(rng, 3, 2)  # T < 3: all-zero dummy
    assert int(dummy.inputs.abs().sum()) == 0 and int(dummy.targets.abs().sum()) == 0


def test_missing_duplicate_hides_one_bit_of_a_doubled_string():
    rng = np.random.default_rng(5)
    batch = chomsky_task("missing_duplicate_string").sample(rng, 32, 9)
    for row, y in zip(batch.inputs.tolist(), batch.targets[:, 0].tolist(), strict=True):
        assert row[-1] == 3 and row.count(2) == 1  # odd length: padded with 3
        body = row[:-1]
        hole = body.index(2)
        half = len(body) // 2
        assert body[(hole + half) % len(body)] == y
    one = chomsky_task("missing_duplicate_string").sample(rng, 2, 1)
    assert one.inputs.tolist() == [[1], [1]] and one.targets.tolist() == [[1], [1]]


def test_regular_and_string_tasks_compute_their_labels():
    rng = np.random.default_rng(6)
    even = chomsky_task("even_pairs").sample(rng, 64, 13)
    assert (even.targets[:, 0] == (even.inputs[:, 0] != even.inputs[:, -1]).long()).all()
    parity = chomsky_task("parity_check").sample(rng, 64, 13)
    assert (parity.targets[:, 0] == parity.inputs.sum(1) % 2).all()
    rev = chomsky_task("reverse_string").sample(rng, 8, 7)
    assert (rev.targets == rev.inputs.flip(1)).all()
    dup = chomsky_task("duplicate_string").sample(rng, 8, 7)
    assert (dup.targets[:, :7] == dup.inputs).all() and (dup.targets[:, 7:] == dup.inputs).all()
    srt = chomsky_task("bucket_sort").sample(rng, 8, 7)
    assert (srt.targets == srt.inputs.sort(1).values).all()


def test_binary_tasks_round_trip_through_the_numbers():
    rng = np.random.default_rng(7)
    batch = chomsky_task("binary_addition").sample(rng, 32, 14)
    for row, out in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        sep = row.index(2)
        a = int("".join(map(str, row[:sep]))[::-1], 2)
        b = int("".join(map(str, row[sep + 1 :]))[::-1], 2)
        assert a > 0 and b > 0
        end = out.index(2)
        assert int("".join(map(str, out[:end]))[::-1], 2) == a + b
    sq = chomsky_task("compute_sqrt").sample(rng, 16, 70)  # beyond numpy's int64
    for row, out in zip(sq.inputs.tolist(), sq.targets.tolist(), strict=True):
        n = int("".join(map(str, row)), 2)
        r = int("".join(map(str, out)), 2)
        assert r * r <= n < (r + 1) ** 2


def test_batches_are_deterministic_from_the_generator():
    for name in CHOMSKY_TASKS:
        a = chomsky_task(name).sample(np.random.default_rng(11), 4, 9)
        b = chomsky_task(name).sample(np.random.default_rng(11), 4, 9)
        assert a.inputs.equal(b.inputs) and a.targets.equal(b.targets), name


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown Chomsky task 'parity'.*parity_check"):
        chomsky_task("parity")
