"""Each encoding option is declared once: in the annotation of its constructor parameter.

``Annotated[type, Spec]`` on a keyword parameter declares the option (name and default from
the signature, check and doc from the spec); ``Encoding.option_specs`` is derived from the
annotated parameters along the class hierarchy. The class attribute ``option_overrides`` only
narrows or refuses an inherited option the class does not take in its own signature. These
tests hold the rule over every registered encoding and every base class along their
hierarchies, and check the derived ``option_specs`` / ``option_defaults`` against an
independent walk of the signatures.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Annotated, Any

import pytest

import relpos
from relpos.encodings.base import Encoding
from relpos.encodings.options import Bool, Int, OptionSpec, Refused
from relpos.registry import encoding_class

SIZES = ("self", "num_heads", "head_dim")


def _encoding_classes() -> list[type[Encoding]]:
    """The registered encodings and every ``Encoding`` subclass along their hierarchies."""
    found: dict[str, type[Encoding]] = {}
    for name in relpos.available():
        for klass in encoding_class(name).__mro__:
            if isinstance(klass, type) and issubclass(klass, Encoding) and klass is not Encoding:
                found.setdefault(f"{klass.__module__}.{klass.__qualname__}", klass)
    return [found[key] for key in sorted(found)]


CLASSES = _encoding_classes()
IDS = [klass.__qualname__ for klass in CLASSES]


def own_keywords(klass: type) -> list[inspect.Parameter]:
    """The option parameters of ``klass``'s own constructor (not the sizes, not ``**``)."""
    init = klass.__dict__.get("__init__")
    if init is None:
        return []
    return [
        p
        for p in inspect.signature(inspect.unwrap(init)).parameters.values()
        if p.name not in SIZES and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def annotated_spec(klass: type, name: str) -> OptionSpec | None:
    """The ``OptionSpec`` in the ``Annotated`` annotation of ``klass.__init__``'s ``name``."""
    hint = typing.get_type_hints(inspect.unwrap(klass.__dict__["__init__"]), include_extras=True)
    hint = hint.get(name)
    if typing.get_origin(hint) is not Annotated:
        return None
    specs = [m for m in hint.__metadata__ if isinstance(m, OptionSpec)]
    return specs[0] if len(specs) == 1 else None


def reachable_keywords(cls: type) -> set[str]:
    return {p.name for klass in cls.__mro__ for p in own_keywords(klass)}


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_every_keyword_parameter_has_an_annotated_spec(cls):
    missing = [p.name for p in own_keywords(cls) if annotated_spec(cls, p.name) is None]
    assert not missing, (
        f"{cls.__qualname__}.__init__: parameters without an Annotated[type, Spec] "
        f"annotation: {missing}"
    )


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_no_option_is_both_overridden_and_taken_by_the_same_class(cls):
    overrides = set(cls.__dict__.get("option_overrides", {}))
    both = overrides & {p.name for p in own_keywords(cls)}
    assert not both, (
        f"{cls.__qualname__} declares {sorted(both)} twice: in option_overrides and in its "
        f"own signature (annotate the parameter instead)"
    )


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_overrides_only_narrow_options_the_hierarchy_takes(cls):
    overridden = {name for klass in cls.__mro__ for name in vars(klass).get("option_overrides", {})}
    orphans = overridden - reachable_keywords(cls)
    assert not orphans, f"{cls.__qualname__}: overrides of options no constructor takes: {orphans}"


def expected_spec(cls: type, name: str) -> OptionSpec | None:
    """The spec of ``name`` by a child-first walk: the first class along the MRO that
    overrides it or annotates it in its own signature."""
    for klass in cls.__mro__:
        overrides = vars(klass).get("option_overrides", {})
        if name in overrides:
            return overrides[name]
        if any(p.name == name for p in own_keywords(klass)):
            return annotated_spec(klass, name)
    return None


def spec_key(spec: OptionSpec | None) -> tuple:
    """A spec by value (an annotation evaluated twice gives two equal specs; a checker made
    by a factory is a new closure each time, compared by its qualified name)."""
    if spec is None:
        return (None,)
    fields = [
        (f.name, getattr(v, "__qualname__", None) if callable(v) else repr(v))
        for f in dataclasses.fields(spec)
        for v in [getattr(spec, f.name)]
    ]
    return (type(spec), *fields)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_option_specs_are_the_annotated_keywords_along_the_hierarchy(cls):
    assert set(cls.option_specs) == reachable_keywords(cls)
    for name, spec in cls.option_specs.items():
        assert spec_key(spec) == spec_key(expected_spec(cls, name)), f"{cls.__qualname__}.{name}"


def signature_defaults(cls: type) -> dict[str, Any]:
    """Each option's default: the first constructor along the MRO with a default for it."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        for p in own_keywords(klass):
            if p.default is not inspect.Parameter.empty:
                found.setdefault(p.name, p.default)
    return {name: found.get(name, inspect.Parameter.empty) for name in reachable_keywords(cls)}


@pytest.mark.parametrize("name", relpos.available())
def test_option_defaults_are_the_signature_defaults(name):
    cls = encoding_class(name)
    assert cls.option_defaults() == signature_defaults(cls)


@pytest.mark.parametrize("name", relpos.available())
def test_a_refused_option_accepts_its_own_default(name):
    # Refused(default=...) must agree with the signature, or passing the default raises
    cls = encoding_class(name)
    defaults = cls.option_defaults()
    for option, spec in cls.option_specs.items():
        if isinstance(spec, Refused):
            assert spec(defaults[option], option) == defaults[option], f"{name}.{option}"


# --------------------------------------------------------------- the machinery, in small

SHARED_FLAG = Bool(doc="a flag both toy encodings take")


class _ToyBase(Encoding):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        width: Annotated[int, Int(minimum=2, doc="a width")] = 4,
        flag: Annotated[bool, SHARED_FLAG] = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.width, self.flag = width, flag


class _ToyChild(_ToyBase):
    option_overrides = {"width": Refused("the child fixes the width", default=4)}

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        flag: Annotated[bool, SHARED_FLAG] = True,
        depth: Annotated[int | None, Int(optional=True)] = None,
        **options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, flag=flag, **options)
        self.depth = depth


def test_annotations_declare_the_options_and_the_constructor_checks_them():
    assert list(_ToyBase.option_specs) == ["width", "flag"]
    assert list(_ToyChild.option_specs) == ["width", "flag", "depth"]
    assert isinstance(_ToyChild.option_specs["width"], Refused)
    assert _ToyChild.option_defaults() == {"width": 4, "flag": True, "depth": None}
    with pytest.raises(ValueError, match="width must be an int >= 2"):
        _ToyBase(2, 8, width=1)
    with pytest.raises(TypeError, match="flag"):
        _ToyBase(2, 8, flag="yes")
    with pytest.raises(ValueError, match="width is not supported here: the child fixes"):
        _ToyChild(2, 8, width=8)
    toy = _ToyChild(2, 8, depth=3)
    assert (toy.width, toy.flag, toy.depth) == (4, True, 3)
    assert "depth=3" in repr(toy) and "flag" not in repr(toy)  # non-default options only


def test_a_spec_must_be_a_module_level_name():
    local_spec = Int(doc="defined in a function: annotations cannot see it")

    with pytest.raises(TypeError, match="names 'local_spec', which is not a module-level"):

        class _Broken(Encoding):
            def __init__(
                self, num_heads: int, head_dim: int, *, size: Annotated[int, local_spec] = 1
            ) -> None:
                super().__init__(num_heads, head_dim)

    assert local_spec.doc


def test_a_class_options_dict_is_refused_not_ignored():
    with pytest.raises(TypeError, match="declare each option in the annotation"):

        class _Legacy(Encoding):
            options = {"size": Int()}

            def __init__(self, num_heads: int, head_dim: int, *, size: int = 1) -> None:
                super().__init__(num_heads, head_dim)
