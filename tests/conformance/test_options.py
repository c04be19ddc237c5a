"""Conformance: every encoding declares its options, and refuses bad values by name.

Each keyword of an encoding's constructor (along its class hierarchy) has a spec in
``option_specs``, declared in the parameter's ``Annotated[type, Spec]`` annotation
(``relpos.encodings.options``; the rule: ``tests/encodings/test_options_declared_once.py``).
From each spec come values it must refuse (a wrong type, NaN, out of range), with the
exception class of the policy in ``relpos.validation``: ``TypeError`` for a wrong type,
``ValueError`` for a wrong value. The message names the option.
"""

from __future__ import annotations

import inspect

import pytest

import relpos
from relpos.encodings.base import Encoding
from relpos.registry import encoding_class

from .common import D, H

SIZES = ("self", "num_heads", "head_dim")


def constructor_keywords(cls: type[Encoding]) -> set[str]:
    """Named keyword parameters of the constructors along the MRO (up to ``Encoding``)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, Encoding)) or klass is Encoding:
            continue
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.name in SIZES:
                continue
            names.add(p.name)
    return names


def test_every_constructor_keyword_is_declared(name):
    cls = encoding_class(name)
    missing = constructor_keywords(cls) - set(cls.option_specs)
    assert not missing, f"{name}: options without an Annotated spec: {sorted(missing)}"


def test_declared_options_are_accepted_by_the_constructor(name):
    cls = encoding_class(name)
    unknown = set(cls.option_specs) - constructor_keywords(cls)
    assert not unknown, f"{name}: declared options the constructor does not take: {unknown}"


def test_defaults_and_example_options_pass_their_own_checks(name):
    cls = encoding_class(name)
    relpos.create(name, num_heads=H, head_dim=D, **cls.example_options())


def _label(value) -> str:
    """A test id that is the same in every process (xdist workers compare them)."""
    simple = (type(None), bool, int, float, str, list, tuple, dict)
    return repr(value) if isinstance(value, simple) else f"<{type(value).__name__}>"


def _cases():
    for name in relpos.available():
        cls = encoding_class(name)
        for option, spec in cls.option_specs.items():
            for value, exc in spec.invalid_examples():
                yield pytest.param(name, option, value, exc, id=f"{name}-{option}-{_label(value)}")


@pytest.mark.parametrize(("enc_name", "option", "value", "exc"), list(_cases()))
def test_invalid_option_values_are_refused_by_name(enc_name, option, value, exc):
    options = {**encoding_class(enc_name).example_options(), option: value}
    with pytest.raises(exc, match=option):
        relpos.create(enc_name, num_heads=H, head_dim=D, **options)


@pytest.mark.parametrize("arg", ["num_heads", "head_dim"])
@pytest.mark.parametrize(
    ("bad", "exc"),
    [(0, ValueError), (-1, ValueError), (2.5, TypeError), ("4", TypeError), (True, TypeError)],
    ids=repr,
)
def test_sizes_follow_the_policy(name, arg, bad, exc):
    sizes = {"num_heads": H, "head_dim": D, arg: bad}
    with pytest.raises(exc, match=arg):
        relpos.create(name, **sizes)
