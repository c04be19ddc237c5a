"""The Chomsky-hierarchy suite: 15 algorithmic tasks (Delétang et al. 2023, "Neural Networks
and the Chomsky Hierarchy", ICLR, arXiv 2207.02098; reused unchanged by Ruoss et al. 2023,
"Randomized Positional Encodings Boost Length Generalization of Transformers", arXiv
2305.16843). Re-implemented from the official generators
(google-deepmind/neural_networks_chomsky_hierarchy ``tasks/**``, read at 2b8eb4b).

Each task maps ``sample(rng, batch, length) -> TaskBatch``: ``inputs (B, T_in)`` ids in
``[0, input_size)``, ``targets (B, T_out)`` ids in ``[0, output_size)`` with
``T_out = output_length(length)``, and the accuracy ``mask (B, T_out)`` (all True, except for
the three tasks with a termination token, where it ends at the first position holding the
largest class id: the official ``argmax(argmax(target))``). The official code feeds one-hot
vectors; ids are the same information (a bias-free linear layer on one-hot vectors is an
embedding lookup).

Determinism: every draw comes from the ``numpy.random.Generator`` passed in, so a batch is a
function of the generator's state. The official code mixes the JAX key with Python's
``random`` and ``numpy``'s global state (binary tasks, compute_sqrt, the bracket tasks,
stack_manipulation), so it is not reproducible from its key; relpos draws the same
distributions from one generator, not the same numbers.

Quirks of the official code reproduced here: ``modular_arithmetic`` turns an
even length into ``length - 1`` (inputs are always odd); ``odds_first`` puts the 0-based odd
indices first (``s[1::2] ++ s[0::2]``, the code, not its docstring); ``binary_addition``
outputs ``T + 1`` tokens (the docstring shows ``T``); for ``length <= 2`` the binary tasks
sample ``randint(0, 2**T - 1)`` (exclusive upper end: ``T = 1`` is always 0) without a
separator; ``solve_equation`` with ``T < 3`` and ``missing_duplicate_string`` with ``T = 1``
return all-zero (resp. all-one) dummy batches; ``solve_equation``'s search for a digit
wraps at ``T - 2``; the bracket tasks split the length as ``U{1..T-4}`` for the left part.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from relpos.validation import check_int

__all__ = ["TaskBatch", "ChomskyTask", "CHOMSKY_TASKS", "chomsky_task", "termination_mask"]


@dataclass
class TaskBatch:
    """One batch of a classification-style task: ``inputs (B, T_in)`` and ``targets
    (B, T_out)`` int64 ids, ``mask (B, T_out)`` bool (which outputs the accuracy counts)."""

    inputs: Tensor
    targets: Tensor
    mask: Tensor


def termination_mask(targets: np.ndarray) -> np.ndarray:
    """The official ``accuracy_mask``: True up to and including the first position holding the
    largest id of its row (``argmax(argmax(one_hot))``)."""
    end = targets.argmax(axis=-1)[:, None]
    return np.arange(targets.shape[1])[None, :] <= end


Sampler = Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ChomskyTask:
    """One task of the suite: its name, level (R, DCF, CS), vocabularies, output-length rule
    and generator. ``chance`` is the accuracy of a uniform guess of the output class."""

    name: str
    level: str
    input_size: int
    output_size: int
    output_length: Callable[[int], int]
    sampler: Sampler
    masked: bool = False

    @property
    def chance(self) -> float:
        return 1.0 / self.output_size

    def input_length(self, length: int) -> int:
        """The input length the generator produces for ``length`` (modular_arithmetic forces
        it odd)."""
        if self.name == "modular_arithmetic" and length % 2 == 0:
            return length - 1
        return length

    def sample(self, rng: np.random.Generator, batch: int, length: int) -> TaskBatch:
        """``batch`` sequences of input length ``length`` (see the module docstring)."""
        check_int(batch, "batch")
        check_int(length, "length")
        inputs, targets = self.sampler(rng, batch, length)
        inputs = np.ascontiguousarray(np.asarray(inputs, dtype=np.int64).reshape(batch, -1))
        targets = np.ascontiguousarray(np.asarray(targets, dtype=np.int64).reshape(batch, -1))
        t_out = self.output_length(self.input_length(length))
        assert targets.shape[1] == t_out, (self.name, length, targets.shape)
        if self.masked:
            mask = termination_mask(targets)
        else:
            mask = np.ones(targets.shape, dtype=bool)
        return TaskBatch(
            torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(mask)
        )


def _one(length: int) -> int:
    return 1


def _same(length: int) -> int:
    return length


# ------------------------------------------------------------------------------ regular


def _even_pairs(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 2, size=(batch, length))
    y = np.logical_xor(s[:, :-1], s[:, 1:]).sum(-1) % 2
    return s, y


def _parity_check(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 2, size=(batch, length))
    return s, s.sum(-1) % 2


def cycle_navigation_output(actions: np.ndarray) -> np.ndarray:
    """Final position on a cycle of 5: token ``a`` moves ``a - 1`` (-1, 0, +1)."""
    return (np.asarray(actions) - 1).sum(-1) % 5


def _cycle_navigation(rng: np.random.Generator, batch: int, length: int):
    a = rng.integers(0, 3, size=(batch, length))
    return a, cycle_navigation_output(a)


MODULUS = 5
ARITH_OPS = (MODULUS, MODULUS + 1, MODULUS + 2)  # + - *; "_" (id 8) is never sampled


def evaluate_modular(tokens: list[int], modulus: int = MODULUS) -> int:
    """Value of ``d op d op ... d`` (ids: digits ``0..m-1``, ``m`` = +, ``m+1`` = -, ``m+2``
    = *) with the usual precedence (* before + and -, left to right), mod ``modulus``."""
    terms: list[int] = []  # signed products
    sign, product = 1, tokens[0]
    for op, digit in zip(tokens[1::2], tokens[2::2], strict=True):
        symbol = {modulus: "+", modulus + 1: "-", modulus + 2: "*"}[op]
        if symbol == "*":
            product *= digit
        else:
            terms.append(sign * product)
            sign, product = (1 if symbol == "+" else -1), digit
    terms.append(sign * product)
    return sum(terms) % modulus


def _modular_arithmetic(rng: np.random.Generator, batch: int, length: int):
    if length % 2 == 0:
        length -= 1
    x = np.empty((batch, length), dtype=np.int64)
    x[:, ::2] = rng.integers(0, MODULUS, size=(batch, length // 2 + 1))
    x[:, 1::2] = rng.choice(np.array(ARITH_OPS), size=(batch, length // 2))
    y = np.array([evaluate_modular(row) for row in x.tolist()])
    return x, y


# ------------------------------------------------------------------------------ DCF


def stack_manipulation_output(tokens: list[int], stack_length: int) -> list[int]:
    """The target of ``tokens`` = initial stack (bottom to top, ``stack_length`` bits) then
    actions (2 POP, 3 PUSH 0, 4 PUSH 1; POP on an empty stack is ignored): the final stack top
    to bottom, the termination token 2, zeros up to ``len(tokens) + 1``."""
    stack = list(tokens[:stack_length])
    for a in tokens[stack_length:]:
        if a == 2:
            if stack:
                stack.pop()
        else:
            stack.append(a - 3)
    y = stack[::-1] + [2]
    return y + [0] * (len(tokens) + 1 - len(y))


def _stack_manipulation(rng: np.random.Generator, batch: int, length: int):
    xs, ys = [], []
    for _ in range(batch):
        if length == 1:
            x, n = [int(rng.integers(0, 2))], 1
        else:
            n = int(rng.integers(1, length))
            x = rng.integers(0, 2, size=n).tolist() + rng.integers(2, 5, size=length - n).tolist()
        xs.append(x)
        ys.append(stack_manipulation_output(x, n))
    return np.array(xs), np.array(ys)


def _reverse_string(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 2, size=(batch, length))
    return s, s[:, ::-1]


#: bracket-task symbols (``modular_arithmetic_brackets``: + - * ( ) after the digits)
BRACKET_IDS = {"+": 5, "-": 6, "*": 7, "(": 8, ")": 9, "x": 10, "=": 11}
#: ``solve_equation``'s alphabet (no ``*``)
EQUATION_IDS = {"+": 5, "-": 6, "(": 7, ")": 8, "x": 9, "=": 10}


def bracket_expression(
    rng: np.random.Generator, length: int, mult: bool, modulus: int = MODULUS
) -> tuple[str, int]:
    """The official recursive generator: ``d``, ``-d``, ``(d)``, ``(-d)`` for lengths 1-4,
    else ``(L op R)`` with ``len(L) ~ U{1..T-4}``; returns the string and its value mod
    ``modulus``."""
    if length < 1:
        raise ValueError(f"length must be >= 1 for a bracket expression, got {length}")
    if length <= 4:
        d = int(rng.integers(0, modulus))
        text = {1: f"{d}", 2: f"-{d}", 3: f"({d})", 4: f"(-{d})"}[length]
        return text, (-d if length in (2, 4) else d) % modulus
    left_len = int(rng.integers(1, length - 3))
    left, lv = bracket_expression(rng, left_len, mult, modulus)
    right, rv = bracket_expression(rng, length - left_len - 3, mult, modulus)
    op = int(rng.integers(0, 3 if mult else 2))
    symbol = "+-*"[op]
    value = (lv + rv, lv - rv, lv * rv)[op] % modulus
    return f"({left}{symbol}{right})", value


def _encode(text: str, ids: dict[str, int]) -> list[int]:
    return [int(c) if c.isdigit() else ids[c] for c in text]


def _modular_arithmetic_brackets(rng: np.random.Generator, batch: int, length: int):
    xs, ys = [], []
    for _ in range(batch):
        text, value = bracket_expression(rng, length, mult=True)
        xs.append(_encode(text, BRACKET_IDS))
        ys.append(value)
    return np.array(xs), np.array(ys)


def solve_equation_example(rng: np.random.Generator, length: int) -> tuple[str, int]:
    """``expr = value`` with one digit of ``expr`` (length ``T - 2``, no ``*``) replaced by
    ``x``: the first digit at or after a uniform index (wrapping at ``T - 2``); the answer is
    that digit."""
    expr, value = bracket_expression(rng, length - 2, mult=False)
    idx = int(rng.integers(0, len(expr)))
    while not expr[idx].isdigit():
        idx = (idx + 1) % (length - 2)
    return f"{expr[:idx]}x{expr[idx + 1 :]}={value}", int(expr[idx])


def _solve_equation(rng: np.random.Generator, batch: int, length: int):
    if length < 3:
        return np.zeros((batch, length)), np.zeros((batch,))
    xs, ys = [], []
    for _ in range(batch):
        text, answer = solve_equation_example(rng, length)
        xs.append(_encode(text, EQUATION_IDS))
        ys.append(answer)
    return np.array(xs), np.array(ys)


# ------------------------------------------------------------------------------ CS


def _duplicate_string(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 2, size=(batch, length))
    return s, np.concatenate([s, s], axis=1)


def _missing_duplicate_string(rng: np.random.Generator, batch: int, length: int):
    if length == 1:
        return np.ones((batch, 1)), np.ones((batch,))
    half = rng.integers(0, 2, size=(batch, length // 2))
    doubled = np.concatenate([half, half], axis=1)
    idx = rng.integers(0, doubled.shape[1], size=batch)
    y = doubled[np.arange(batch), idx]
    doubled[np.arange(batch), idx] = 2
    pad = np.full((batch, length % 2), 3)
    return np.concatenate([doubled, pad], axis=1), y


def odds_first_output(s: np.ndarray) -> np.ndarray:
    """The official code's order: the 0-based odd indices first, ``s[1::2] ++ s[0::2]``."""
    return np.concatenate([s[..., 1::2], s[..., 0::2]], axis=-1)


def _odds_first(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 2, size=(batch, length))
    return s, odds_first_output(s)


def binary_digits(number: int, width: int, little_endian: bool = True) -> list[int]:
    """``number`` in binary, zero-filled to ``width`` (no effect when it is longer), least
    significant digit first when ``little_endian``. ``width = 0`` gives the plain digits
    (``0`` -> ``[0]``)."""
    text = f"{number:b}".zfill(width)
    return [int(c) for c in (text[::-1] if little_endian else text)]


def binary_expression(a: int, len_a: int, b: int, len_b: int) -> list[int]:
    """``a`` and ``b`` little-endian, zero-filled to ``len_a`` / ``len_b``, separated by 2."""
    return binary_digits(a, len_a) + [2] + binary_digits(b, len_b)


def binary_addition_output(total: int, length: int) -> list[int]:
    """``total`` little-endian without trailing zeros, 2, zeros up to ``length + 1``."""
    result = binary_digits(total, 0)
    return result + [2] + [0] * (length - len(result))


def binary_multiplication_output(product: int, length: int) -> list[int]:
    """``product`` little-endian without trailing zeros, 2, zeros up to ``length``."""
    result = binary_digits(product, 0)
    return result + [2] + [0] * (length - 1 - len(result))


def _binary_operands(rng: np.random.Generator, length: int) -> tuple[int, int, int, int]:
    len_a = int(rng.integers(1, length - 1))
    len_b = length - 1 - len_a
    return _uniform_bits(rng, len_a), len_a, _uniform_bits(rng, len_b), len_b


def _uniform_bits(rng: np.random.Generator, bits: int) -> int:
    """Uniform in ``[1, 2**bits - 1]`` for any ``bits`` (Python ints; numpy stops at 63)."""
    if bits < 63:
        return int(rng.integers(1, 2**bits))
    while True:
        words = rng.integers(0, 2**32, size=math.ceil(bits / 32), dtype=np.uint64).tolist()
        value = 0
        for w in words:
            value = (value << 32) | int(w)
        value &= (1 << bits) - 1
        if value:
            return value


def _binary_addition(rng: np.random.Generator, batch: int, length: int):
    xs, ys = [], []
    for _ in range(batch):
        if length <= 2:  # the official special case: one number, no separator
            n = int(rng.integers(0, 2**length - 1))
            xs.append(binary_digits(n, length))
            ys.append(binary_addition_output(n, length))
            continue
        a, len_a, b, len_b = _binary_operands(rng, length)
        xs.append(binary_expression(a, len_a, b, len_b))
        ys.append(binary_addition_output(a + b, length))
    return np.array(xs), np.array(ys)


def _binary_multiplication(rng: np.random.Generator, batch: int, length: int):
    xs, ys = [], []
    for _ in range(batch):
        if length <= 2:  # the official special case: zeros, then the termination token
            n = int(rng.integers(0, 2**length - 1))
            xs.append(binary_digits(n, length))
            ys.append([0] * (length - 1) + [2])
            continue
        a, len_a, b, len_b = _binary_operands(rng, length)
        xs.append(binary_expression(a, len_a, b, len_b))
        ys.append(binary_multiplication_output(a * b, length))
    return np.array(xs), np.array(ys)


def _sqrt_length(length: int) -> int:
    return math.ceil(length / 2)


def compute_sqrt_output(n: int, length: int) -> list[int]:
    """``isqrt(n)`` big-endian, zero-filled to ``ceil(length / 2)``."""
    return binary_digits(math.isqrt(n), _sqrt_length(length), little_endian=False)


def _compute_sqrt(rng: np.random.Generator, batch: int, length: int):
    xs, ys = [], []
    for _ in range(batch):
        n = _uniform_bits(rng, length)
        xs.append(binary_digits(n, length, little_endian=False))
        ys.append(compute_sqrt_output(n, length))
    return np.array(xs), np.array(ys)


def _bucket_sort(rng: np.random.Generator, batch: int, length: int):
    s = rng.integers(0, 5, size=(batch, length))
    return s, np.sort(s, axis=-1)


_TASKS = (
    ChomskyTask("even_pairs", "R", 2, 2, _one, _even_pairs),
    ChomskyTask("modular_arithmetic", "R", MODULUS + 4, MODULUS, _one, _modular_arithmetic),
    ChomskyTask("parity_check", "R", 2, 2, _one, _parity_check),
    ChomskyTask("cycle_navigation", "R", 3, 5, _one, _cycle_navigation),
    ChomskyTask(
        "stack_manipulation", "DCF", 5, 3, lambda t: t + 1, _stack_manipulation, masked=True
    ),
    ChomskyTask("reverse_string", "DCF", 2, 2, _same, _reverse_string),
    ChomskyTask(
        "modular_arithmetic_brackets",
        "DCF",
        MODULUS + 6,
        MODULUS,
        _one,
        _modular_arithmetic_brackets,
    ),
    ChomskyTask("solve_equation", "DCF", MODULUS + 6, MODULUS, _one, _solve_equation),
    ChomskyTask("duplicate_string", "CS", 2, 2, lambda t: 2 * t, _duplicate_string),
    ChomskyTask("missing_duplicate_string", "CS", 4, 2, _one, _missing_duplicate_string),
    ChomskyTask("odds_first", "CS", 2, 2, _same, _odds_first),
    ChomskyTask("binary_addition", "CS", 3, 3, lambda t: t + 1, _binary_addition, masked=True),
    ChomskyTask("binary_multiplication", "CS", 3, 3, _same, _binary_multiplication, masked=True),
    ChomskyTask("compute_sqrt", "CS", 2, 2, _sqrt_length, _compute_sqrt),
    ChomskyTask("bucket_sort", "CS", 5, 5, _same, _bucket_sort),
)

#: the 15 tasks by their ``TASK_BUILDERS`` name, in the paper's order
CHOMSKY_TASKS: dict[str, ChomskyTask] = {t.name: t for t in _TASKS}


def chomsky_task(name: str) -> ChomskyTask:
    """The task called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return CHOMSKY_TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown Chomsky task {name!r}; known tasks: {', '.join(CHOMSKY_TASKS)}"
        ) from None
