"""The single map from encoding names to classes: ``create`` and ``available``.

Adding an encoding = one class in its family's module + one ``@register`` line; the
conformance suite (tests/conformance) then covers it without new test code.

Naming rule for registry names: ``<method>[-<variant>][-<m>d]``, lower case, words joined by
``-``: the method as its paper names it (``rope``, ``alibi``, ``kerple``, ``mvitv2``), then a
variant when one paper defines several (``kerple-log``, ``irpe-qkv``, ``rope-axial``), then
the number of position axes when it is not 1 (``swin-3d``, ``liere-2d``). Renamed encodings
keep their old names as aliases (``register(name, aliases=(...))``): ``create`` accepts
them, ``available`` lists canonical names only.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from ..rope_scaling import ROPE_SCALING
from .base import Encoding

_REGISTRY: dict[str, type[Encoding]] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str, *, aliases: tuple[str, ...] = ()
) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator: make ``cls`` available as ``relpos.create(name, ...)`` (and under
    each of ``aliases``, its former names)."""

    def deco(cls: type[Encoding]) -> type[Encoding]:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"encoding name {key!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return deco


def available() -> list[str]:
    """Registered encoding names (canonical, without aliases), sorted."""
    return sorted(_REGISTRY)


def aliases() -> dict[str, str]:
    """Former names still accepted by ``create``: ``{alias: canonical name}``."""
    return dict(sorted(_ALIASES.items()))


def suggestion(name: str) -> str | None:
    """What the user probably meant by an unknown encoding ``name``: the registered name that
    differs only in case or separators (``'RoPE'``, ``'kerple_log'``), a RoPE frequency
    scaling given as a name (``'yarn'`` -> ``create("rope", scaling={...})``), or the closest
    names by spelling; None when nothing is close."""
    known = {**{n: n for n in _REGISTRY}, **_ALIASES}
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in known:
        return f"{known[key]!r}"
    scaling = key.replace("-", "_")
    if scaling not in ROPE_SCALING:
        near = difflib.get_close_matches(scaling, list(ROPE_SCALING), n=1, cutoff=0.8)
        close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
        if close:
            return " or ".join(repr(known[c]) for c in dict.fromkeys(close))
        if not near:
            return None
        scaling = near[0]
    record = ROPE_SCALING[scaling]
    needed = sorted(record.required)
    if record.needs_original:
        needed.append("original_max_position_embeddings")
    keys = ", ".join(f'"{k}": ...' for k in needed)
    body = f'"rope_type": "{scaling}"' + (f", {keys}" if keys else "")
    return f'create("rope", ..., scaling={{{body}}}) (a RoPE frequency scaling)'


def encoding_class(name: str) -> type[Encoding]:
    """The class registered under ``name``; ``ValueError`` with a "did you mean" otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[_ALIASES.get(name, name)]
    except KeyError:
        hint = suggestion(name)
        hint = f"did you mean {hint}? " if hint else ""
        raise ValueError(
            f"unknown encoding {name!r}; {hint}relpos.available() lists the "
            f"{len(_REGISTRY)} encodings (`relpos list` in a shell)"
        ) from None


def option_defaults(cls: type[Encoding]) -> dict[str, Any]:
    """``cls.option_defaults()``: the default of each declared option of ``cls``."""
    return cls.option_defaults()


def describe(name: str) -> str:
    """A plain-text card for encoding ``name``: its paper, family and every option (form,
    default, doc), as ``relpos list NAME`` prints it."""
    cls = encoding_class(name)
    doc = inspect.getdoc(cls) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ")
    lines = [f"{cls.name}: {first}", f"family: {cls.family}"]
    if cls.paper:
        lines.append(f"paper: {cls.paper}")
    lines.append(f'create("{cls.name}", num_heads=..., head_dim=..., **options); options:')
    defaults = option_defaults(cls)
    rows = []
    for option, spec in cls.option_specs.items():
        default = defaults[option]
        shown = "(required)" if default is inspect.Parameter.empty else repr(default)
        rows.append((option, spec.form or type(spec).__name__, shown, spec.doc))
    if not rows:
        lines.append("  (none)")
    width = [max(len(r[c]) for r in rows) for c in range(3)] if rows else []
    for row in rows:
        cells = [row[c].ljust(width[c]) for c in range(3)]
        lines.append("  " + "  ".join(cells) + (f"  {row[3]}" if row[3] else ""))
    return "\n".join(line.rstrip() for line in lines)


def create(name: str, *, num_heads: int, head_dim: int, **options: Any) -> Encoding:
    """Instantiate encoding ``name`` for ``num_heads`` heads of ``head_dim`` channels.

    ``options`` are the encoding's own keyword arguments: ``print(relpos.describe(name))``
    (or ``relpos list NAME`` in a shell) shows each with its form, default and meaning, and
    ``help(relpos.encoding_class(name))`` the paper and formula. An unknown option raises
    ``TypeError`` naming it; an unknown name ``ValueError`` with a "did you mean". RoPE
    scalings are an option of ``rope``, not names: ``create("rope", num_heads=8,
    head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 2048})``.
    """
    cls = encoding_class(name)
    try:
        return cls(num_heads=num_heads, head_dim=head_dim, **options)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            raise TypeError(f"encoding {name!r}: {err}") from None
        raise
