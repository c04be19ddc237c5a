"""Command-line values: the text of a flag parsed, then checked by ``relpos.validation``.

The commands (``relpos extrapolate``, ``longctx``, ``analyze``) parse numbers themselves
rather than through argparse ``type=`` functions, so a bad value is one line
``relpos: error: --train-len must be a positive int, got 0`` (exit 2) that names the *flag*.
Every check is the one of ``relpos.validation`` (same policy, same wording); only the parsing
of the text lives here. A text that is not a number at all is a ``ValueError`` (the type of a
flag's value is always ``str``)."""

from __future__ import annotations

from collections.abc import Sequence

from relpos.validation import check_float, check_int, describe_float, describe_int

__all__ = [
    "parse_int",
    "parse_float",
    "parse_int_list",
    "parse_float_list",
    "parse_names",
    "optional_int",
]


def parse_int(text: str, flag: str, *, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``text`` as an int in ``[minimum, maximum]`` (``check_int``), the message naming
    ``flag``."""
    try:
        number = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{flag} must be {describe_int(minimum, maximum)}, got {text!r}") from None
    return check_int(number, flag, minimum=minimum, maximum=maximum)


def optional_int(text: str | None, flag: str, *, minimum: int | None = 1) -> int | None:
    """``parse_int`` for a flag without a default (None stays None)."""
    return None if text is None else parse_int(text, flag, minimum=minimum)


def parse_float(text: str, flag: str, **bounds: float) -> float:
    """``text`` as a finite float within ``bounds`` (``check_float``'s ``minimum``,
    ``maximum``, ``above``, ``below``), the message naming ``flag``."""
    try:
        number = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{flag} must be {describe_float(**bounds)}, got {text!r}") from None
    return check_float(number, flag, **bounds)


def parse_int_list(text: str, flag: str, *, minimum: int | None = 1) -> list[int]:
    """Comma-separated ints (``"1024,2048"``), each as ``parse_int``; empty items refused."""
    items = [v.strip() for v in str(text).split(",")]
    if not str(text).strip() or any(not v for v in items):
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}")
    return [parse_int(v, flag, minimum=minimum) for v in items]


def parse_float_list(
    value: str | Sequence[float],
    flag: str,
    *,
    expected: str = "comma-separated numbers",
    **bounds: float,
) -> list[float]:
    """Comma-separated numbers (``"1,2,4"``) or a sequence of numbers, each finite and within
    ``bounds`` (``check_float``'s ``minimum``, ``maximum``, ``above``, ``below``).

    Empty items are skipped (``"1,,2"``), an empty result is refused. Every failure is one
    ``ValueError`` "``flag`` must be ``expected``, got ..." naming the offending item, so a
    flag can say what its numbers mean (``expected="positive numbers"``)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    numbers: list[float] = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if text == "":
            continue
        try:
            number = float(text)
            check_float(number, flag, **bounds)
        except (TypeError, ValueError):
            raise ValueError(f"{flag} must be {expected}, got {item!r}") from None
        numbers.append(number)
    if not numbers:
        raise ValueError(f"{flag} is empty; give {expected}")
    return numbers


def parse_names(text: str, flag: str) -> list[str]:
    """Comma-separated names (``"rope, alibi"``), stripped, duplicates dropped (first kept).
    A comma inside brackets belongs to its name (``"prope:image_size=(32, 32),rope"`` is
    two names).

    An empty value (``--encodings ""``) or an empty item (``"rope,,alibi"``) is a
    ``ValueError``: an empty flag never means "the defaults"."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(str(text)):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append(str(text)[start:i].strip())
            start = i + 1
    items.append(str(text)[start:].strip())
    if not str(text).strip():
        raise ValueError(f"{flag} is empty; give comma-separated names")
    if any(not v for v in items):
        raise ValueError(f"{flag} has an empty name: {text!r}")
    return list(dict.fromkeys(items))
