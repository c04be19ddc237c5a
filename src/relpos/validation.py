"""Argument checks with one policy, shared by the whole package.

The policy (every public entry point follows it):

* a value of the wrong **type** raises ``TypeError``;
* a value of the right type but the wrong **value** (out of range, NaN, not one of the
  choices) raises ``ValueError``;
* the message names the argument and the expected form: ``"base must be a finite number
  > 1, got nan"``.

``bool`` is never accepted where an int or a number is expected (``True`` is an ``int`` in
Python, but ``num_heads=True`` is a bug). Strings are never coerced to numbers. Each check
returns the value in its normal form (a float for numbers), so callers write
``self.base = check_float(base, "base", above=1.0)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "check_int",
    "check_float",
    "check_bool",
    "check_choice",
    "check_str",
    "check_int_sequence",
    "check_float_sequence",
    "check_finite_tensor",
    "check_int_tensor",
    "check_generator",
    "describe_int",
    "describe_float",
    "check_token_ids",
]


def _got(value: object) -> str:
    return f"got {value!r}" if not isinstance(value, Tensor) else f"got a tensor {value.shape}"


def describe_int(minimum: int | None = 1, maximum: int | None = None) -> str:
    """The expected form of an int in a message: "a positive int", "an int >= 0", ..."""
    if minimum == 1 and maximum is None:
        return "a positive int"
    if minimum is None and maximum is None:
        return "an int"
    if maximum is None:
        return f"an int >= {minimum}"
    if minimum is None:
        return f"an int <= {maximum}"
    return f"an int in [{minimum}, {maximum}]"


def check_int(
    value: object, name: str, *, minimum: int | None = 1, maximum: int | None = None
) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (default: positive). ``minimum=None``:
    no lower bound. ``TypeError`` for a non-int (bools included), ``ValueError`` outside."""
    form = describe_int(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {form}, {_got(value)}")
    return int(value)


def describe_float(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    finite: bool = True,
) -> str:
    """The expected form of a number in a message ("a finite number > 0", ...)."""
    parts = []
    if above is not None:
        parts.append(f"> {above:g}")
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if below is not None:
        parts.append(f"< {below:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    head = "a finite number" if finite else "a number (not NaN)"
    return head + (" " + " and ".join(parts) if parts else "")


def check_float(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    finite: bool = True,
) -> float:
    """``value`` (an int or a float, never a bool or a str) as a float.

    ``minimum``/``maximum`` are inclusive bounds, ``above``/``below`` exclusive ones. NaN is
    always a ``ValueError``; infinities too unless ``finite=False``.
    """
    form = describe_float(minimum=minimum, maximum=maximum, above=above, below=below, finite=finite)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    x = float(value)
    bad = (
        math.isnan(x)
        or (finite and math.isinf(x))
        or (minimum is not None and x < minimum)
        or (maximum is not None and x > maximum)
        or (above is not None and x <= above)
        or (below is not None and x >= below)
    )
    if bad:
        raise ValueError(f"{name} must be {form}, {_got(value)}")
    return x


def check_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool (``"no"``, 0 and 1 are refused), else ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), {_got(value)}")
    return value


def check_str(value: object, name: str) -> str:
    """``value`` if it is a str, else ``TypeError``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, {_got(value)}")
    return value


def check_choice(value: object, name: str, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``; ``TypeError`` when its type matches none of
    them, ``ValueError`` listing the choices otherwise."""
    choices = tuple(choices)
    form = "one of " + ", ".join(repr(c) for c in choices)
    types = {type(c) for c in choices}
    if isinstance(value, bool) and bool not in types:
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    if not any(isinstance(value, t) for t in types):
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be {form}, {_got(value)}")
    return value


def check_int_sequence(
    value: object,
    name: str,
    *,
    length: int | None = None,
    minimum: int | None = 1,
    maximum: int | None = None,
    nonempty: bool = True,
) -> tuple[int, ...]:
    """A list or tuple of ints (each checked as ``check_int``), as a tuple."""
    count = f"{length} " if length is not None else ""
    form = f"a sequence of {count}ints ({describe_int(minimum, maximum)} each)"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    if (length is not None and len(value) != length) or (nonempty and len(value) == 0):
        raise ValueError(f"{name} must be {form}, {_got(value)}")
    return tuple(
        check_int(v, f"{name}[{n}]", minimum=minimum, maximum=maximum) for n, v in enumerate(value)
    )


def check_float_sequence(
    value: object,
    name: str,
    *,
    length: int | None = None,
    minimum: float | None = None,
    above: float | None = None,
    nonempty: bool = True,
) -> tuple[float, ...]:
    """A list or tuple of finite numbers (each checked as ``check_float``), as a tuple."""
    count = f"{length} " if length is not None else ""
    form = f"a sequence of {count}finite numbers"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {form}, {_got(value)}")
    if (length is not None and len(value) != length) or (nonempty and len(value) == 0):
        raise ValueError(f"{name} must be {form}, {_got(value)}")
    return tuple(
        check_float(v, f"{name}[{n}]", minimum=minimum, above=above) for n, v in enumerate(value)
    )


def check_finite_tensor(value: object, name: str, *, floating: bool | None = None) -> Tensor:
    """A tensor without NaN or infinities (``floating``: True requires a floating dtype,
    False an integer one). Syncs with the device once for floating tensors."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a tensor, {_got(value)}")
    if floating is True and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if floating is False and (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.is_floating_point() and value.numel() and value.device.type != "meta":
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} must be finite (no NaN or inf)")
    return value


def check_token_ids(tokens: object, vocab_size: int, name: str = "tokens") -> Tensor:
    """Token ids: an int64/int32 tensor ``(B, L)`` with every id in ``[0, vocab_size)``
    (``TypeError`` for a non-tensor or a non-integer dtype, ``ValueError`` for the shape or an
    id out of range; one host sync for the range, skipped on ``meta`` tensors)."""
    form = f"an int64/int32 tensor of shape (B, L) with ids in [0, {vocab_size})"
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name} must be {form}, {_got(tokens)}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be {form}, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must be {form}, got shape {tuple(tokens.shape)}")
    if tokens.numel() and tokens.device.type != "meta":
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must be {form}, got ids {low}..{high}")
    return tokens


def check_int_tensor(value: object, name: str, *, dims: tuple[int, ...] = (1, 2)) -> Tensor:
    """An integer tensor (bool refused) with ``dim()`` in ``dims``; ``(L,)`` is the usual
    unbatched form, ``(B, L)`` the batched one."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() not in dims:
        forms = " or ".join({1: "(L,)", 2: "(B, L)"}.get(d, f"{d}-D") for d in dims)
        raise ValueError(f"{name} must have shape {forms}, got {tuple(value.shape)}")
    return value


def check_generator(value: object, name: str = "generator") -> torch.Generator | None:
    """``value`` if it is a ``torch.Generator`` or None, else ``TypeError``."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(value).__name__}")
    return value
