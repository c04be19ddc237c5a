"""Declared encoding options: each keyword of an encoding's constructor has a spec.

Each option is declared once, in the annotation of its constructor parameter: the type and
the spec together, ``typing.Annotated[type, Spec]``::

    def __init__(self, num_heads: int, head_dim: int, *,
                 head_offset: Annotated[int, Int(minimum=0, doc="first head")] = 0): ...

The signature gives the name and the default, the spec the check and the doc. A spec too long
to read inline, or shared by several signatures, gets a module-level name
(``ROPE_SCALING = scaling_option()``, then ``Annotated[dict | None, ROPE_SCALING]``);
annotations are strings (``from __future__ import annotations``) resolved with
``typing.get_type_hints`` in the constructor's module when the class is defined, so every name
a spec uses must be a module-level name defined before the class.

``Encoding.option_specs`` is the merged view along the class hierarchy (child entries win):
a subclass that passes an option on through ``**options`` inherits its parent's spec, so the
common RoPE options are declared once, in ``RoPE``'s signature, and every rotary variant
accepts and checks them. A subclass that re-takes an inherited option in its own signature
(to change its default) annotates it again, with the parent's named spec or a narrower one.
The one other place a spec may appear is the class attribute ``option_overrides``: for an
inherited option the subclass narrows or refuses *without* taking it in its own signature
(``Refused(reason)`` where a method cannot honour it; a grid size fixed to the subclass's
number of axes). A name is never both in a class's ``option_overrides`` and in its own
signature (``tests/encodings/test_options_declared_once.py`` checks every encoding).

``Encoding.__init_subclass__`` wraps each constructor so the keyword arguments named in
``option_specs`` are checked (and normalised: ints to floats for ``Float``) before the body
runs; the body then only stores them. Checks follow ``relpos.validation``'s policy:
``TypeError`` for a wrong type, ``ValueError`` for a wrong value, the message names the
option and its form. Defaults are read from the signatures (``Encoding.option_defaults``).

Each spec also yields ``invalid_examples()``: values of a wrong type, NaN and out-of-range
values with the exception they must raise. The conformance suite feeds them to every
registered encoding, so option validation is tested from the declarations, not from a
hand-kept list.

A method that cannot honour an inherited option refuses it by name: ``Refused("reason")``
(e.g. a scaling dict where the frequencies are learned).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..validation import (
    check_bool,
    check_choice,
    check_float,
    check_float_sequence,
    check_int,
    check_int_sequence,
    check_str,
)

__all__ = [
    "OptionSpec",
    "Int",
    "Float",
    "Bool",
    "Choice",
    "Str",
    "IntSequence",
    "FloatSequence",
    "Custom",
    "Refused",
    "check_options",
]


class OptionSpec:
    """Base of the option specs: ``check(value, name) -> normalised value``."""

    #: whether ``None`` is a valid value (the option is optional)
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, value: Any, name: str) -> Any:
        if value is None and self.optional:
            return None
        if value is None:
            raise TypeError(f"{name} must not be None ({self.form})")
        return self.check(value, name)

    @property
    def form(self) -> str:
        return ""

    def invalid_examples(self) -> list[tuple[Any, type[Exception]]]:
        """Values this option must refuse, with the exception class expected."""
        return []


@dataclass(frozen=True)
class Int(OptionSpec):
    """An int (never a bool) in ``[minimum, maximum]``."""

    minimum: int | None = 1
    maximum: int | None = None
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> int:
        return check_int(value, name, minimum=self.minimum, maximum=self.maximum)

    def invalid_examples(self):
        out: list[tuple[Any, type[Exception]]] = [("3", TypeError), (2.5, TypeError)]
        out.append((True, TypeError))
        if self.minimum is not None:
            out.append((self.minimum - 1, ValueError))
        if self.maximum is not None:
            out.append((self.maximum + 1, ValueError))
        return out


@dataclass(frozen=True)
class Float(OptionSpec):
    """A finite number (int or float, never a bool or str) within the given bounds
    (``minimum``/``maximum`` inclusive, ``above``/``below`` exclusive)."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    finite: bool = True
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> float:
        return check_float(
            value,
            name,
            minimum=self.minimum,
            maximum=self.maximum,
            above=self.above,
            below=self.below,
            finite=self.finite,
        )

    def invalid_examples(self):
        out: list[tuple[Any, type[Exception]]] = [
            ("1.5", TypeError),
            (True, TypeError),
            (math.nan, ValueError),
        ]
        if self.finite:
            out.append((math.inf, ValueError))
        low = self.minimum if self.minimum is not None else self.above
        if low is not None:
            out.append((low - 1.0 if self.minimum is not None else low, ValueError))
        high = self.maximum if self.maximum is not None else self.below
        if high is not None:
            out.append((high + 1.0 if self.maximum is not None else high, ValueError))
        return out


@dataclass(frozen=True)
class Bool(OptionSpec):
    """A bool (``"no"``, 0, 1 are refused: ``TypeError``)."""

    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> bool:
        return check_bool(value, name)

    def invalid_examples(self):
        return [("no", TypeError), (1, TypeError)]


@dataclass(frozen=True)
class Choice(OptionSpec):
    """One of ``choices``."""

    choices: tuple = ()
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> Any:
        return check_choice(value, name, self.choices)

    def invalid_examples(self):
        out: list[tuple[Any, type[Exception]]] = [(object(), TypeError)]
        if all(isinstance(c, str) for c in self.choices):
            out.append(("not-a-choice", ValueError))
        return out


@dataclass(frozen=True)
class Str(OptionSpec):
    """A str."""

    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> str:
        return check_str(value, name)

    def invalid_examples(self):
        return [(3, TypeError)]


@dataclass(frozen=True)
class IntSequence(OptionSpec):
    """A list/tuple of ints (each in ``[minimum, maximum]``), normalised to a tuple."""

    length: int | None = None
    minimum: int | None = 1
    maximum: int | None = None
    nonempty: bool = True
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> tuple[int, ...]:
        return check_int_sequence(
            value,
            name,
            length=self.length,
            minimum=self.minimum,
            maximum=self.maximum,
            nonempty=self.nonempty,
        )

    def invalid_examples(self):
        n = self.length or 1
        out: list[tuple[Any, type[Exception]]] = [("12", TypeError), ([2.5] * n, TypeError)]
        if self.minimum is not None:
            out.append(([self.minimum - 1] * n, ValueError))
        return out


@dataclass(frozen=True)
class FloatSequence(OptionSpec):
    """A list/tuple of finite numbers, normalised to a tuple of floats."""

    length: int | None = None
    minimum: float | None = None
    above: float | None = None
    nonempty: bool = True
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> tuple[float, ...]:
        return check_float_sequence(
            value,
            name,
            length=self.length,
            minimum=self.minimum,
            above=self.above,
            nonempty=self.nonempty,
        )

    def invalid_examples(self):
        n = self.length or 1
        return [("1.0", TypeError), ([math.nan] * n, ValueError)]


@dataclass(frozen=True)
class Custom(OptionSpec):
    """An option with its own check ``check(value, name) -> value`` (e.g. HF scaling dicts,
    tensors of slopes) and its own list of invalid examples."""

    checker: Callable[[Any, str], Any] = field(default=lambda v, n: v)
    invalid: Sequence[tuple[Any, type[Exception]]] = ()
    optional: bool = False
    doc: str = ""

    def check(self, value: Any, name: str) -> Any:
        return self.checker(value, name)

    def invalid_examples(self):
        return list(self.invalid)


@dataclass(frozen=True)
class Refused(OptionSpec):
    """An inherited option this method cannot honour: any value but ``default`` raises
    ``ValueError`` with the reason (e.g. ``scaling`` where the frequencies are learned)."""

    reason: str = ""
    default: Any = None
    doc: str = ""

    def __call__(self, value: Any, name: str) -> Any:
        if value is self.default or value == self.default:
            return value
        raise ValueError(f"{name} is not supported here: {self.reason}")

    def invalid_examples(self):
        return []


def check_options(
    specs: dict[str, OptionSpec], kwargs: dict[str, Any], owner: str = ""
) -> dict[str, Any]:
    """Check and normalise the entries of ``kwargs`` that ``specs`` declares; others pass
    through unchanged (the constructor then rejects unknown ones by name)."""
    out = dict(kwargs)
    for key, value in kwargs.items():
        spec = specs.get(key)
        if spec is not None:
            out[key] = spec(value, key)
    return out
