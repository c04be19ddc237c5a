"""What an encoding's reference page states, read from the registry and the code.

* ``paper_facts``: the class's ``paper`` citation, the first paragraph of its docstring, and
  the arXiv ids and GitHub repositories its class and module docstrings cite;
* ``option_rows``: one row per declared option (``Encoding.option_specs``): type, default
  (from the constructor's signature), accepted range and doc;
* ``capability_rows``: the instance's capability flags (``Encoding.capabilities``) with their
  meaning, parsed from the ``Encoding`` docstring;
* ``backend_rows``: the backends that compute it (``supported_backends``) and what ``auto``
  picks (``relpos.attention.plan``) for a few representative calls.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from dataclasses import dataclass
from typing import Any

import torch

from relpos.attention import plan, supported_backends
from relpos.encodings.base import Encoding
from relpos.encodings.options import (
    Bool,
    Choice,
    Custom,
    Float,
    FloatSequence,
    Int,
    IntSequence,
    OptionSpec,
    Refused,
    Str,
)
from relpos.positions_nd import grid_positions

from .atlas import eager_rotations

__all__ = [
    "PaperFacts",
    "BackendCall",
    "BACKEND_CALLS",
    "paper_facts",
    "option_rows",
    "flag_meanings",
    "capability_rows",
    "backend_rows",
    "supported",
    "usage",
]

_ARXIV = re.compile(r"arXiv[: ]*(\d{4}\.\d{4,5})")
# ``owner/name`` as GitHub spells them (owners: letters, digits, hyphens), not part of a
# longer path and not a file
_REPOSITORY = re.compile(
    r"(?<![\w/.-])([A-Za-z0-9][A-Za-z0-9-]{0,38})/([A-Za-z0-9][A-Za-z0-9_.-]{0,99})(?![\w/.-])"
)
_FILE_SUFFIX = re.compile(r"\.(py|md|json|txt|ya?ml|cpp|cc|cu|h|ipynb)$")
# slash pairs in the docstrings that are words, symbols or paths, not repositories: two parts of
# at most three characters ("and/or", "cos/sin", "v2/v3", "2-D/3-D") or one of one or two
# ("W/Px") rule a pair out, so do paths in this repository's own folders, and these words
_NOT_REPOSITORIES = frozenset({"column/row"})
_OWN_FOLDERS = frozenset({"benchmarks", "docs", "lab", "src", "tests"})


@dataclass(frozen=True)
class PaperFacts:
    """The citation of an encoding as its code states it."""

    citation: str
    summary: str
    module_summary: str
    arxiv: tuple[str, ...]
    code: tuple[str, ...]


def _docstrings(cls: type[Encoding]) -> str:
    module = sys.modules[cls.__module__]
    return (inspect.getdoc(cls) or "") + "\n\n" + (inspect.getdoc(module) or "")


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def _is_repository(owner: str, name: str) -> bool:
    pair = f"{owner}/{name}"
    if pair in _NOT_REPOSITORIES or owner in _OWN_FOLDERS or _FILE_SUFFIX.search(name):
        return False
    shortest, longest = sorted((len(owner), len(name)))
    return shortest > 2 and longest > 3


def paper_facts(cls: type[Encoding]) -> PaperFacts:
    """The ``paper`` attribute, the first paragraphs of the class and module docstrings, and
    the arXiv ids and ``owner/repository`` names cited in them (in order)."""
    text = _docstrings(cls)
    summary = _first_paragraph(inspect.getdoc(cls) or "")
    module_summary = _first_paragraph(inspect.getdoc(sys.modules[cls.__module__]) or "")
    arxiv = tuple(dict.fromkeys(_ARXIV.findall(text)))
    code = tuple(
        dict.fromkeys(
            f"{owner}/{name}"
            for owner, name in _REPOSITORY.findall(text)
            if _is_repository(owner, name)
        )
    )
    return PaperFacts(
        citation=cls.paper or "",
        summary=summary,
        module_summary=module_summary,
        arxiv=arxiv,
        code=code,
    )


def _default(cls: type[Encoding], option: str) -> str:
    """The constructor default of ``option``, from the first class along the MRO whose
    ``__init__`` names it (``"required"`` without a default)."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        param = inspect.signature(init).parameters.get(option)
        if param is not None:
            if param.default is inspect.Parameter.empty:
                return "required"
            return f"`{param.default!r}`"
    return "-"


def _bound(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _interval(lo: Any, hi: Any, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is None and hi is None:
        return "any"
    if hi is None:
        return f"{'>' if lo_open else '≥'} {_bound(lo)}"
    if lo is None:
        return f"{'<' if hi_open else '≤'} {_bound(hi)}"
    return f"{'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}"


def _spec_type(spec: OptionSpec) -> str:
    names = {
        Int: "int",
        Float: "float",
        Bool: "bool",
        Choice: "choice",
        Str: "str",
        IntSequence: "sequence of int",
        FloatSequence: "sequence of float",
        Custom: "custom",
        Refused: "refused",
    }
    return names.get(type(spec), type(spec).__name__)


def _spec_range(spec: OptionSpec) -> str:
    if isinstance(spec, Int):
        out = _interval(spec.minimum, spec.maximum)
    elif isinstance(spec, Float):
        lo_open = spec.minimum is None and spec.above is not None
        hi_open = spec.maximum is None and spec.below is not None
        out = _interval(
            spec.minimum if spec.minimum is not None else spec.above,
            spec.maximum if spec.maximum is not None else spec.below,
            lo_open,
            hi_open,
        )
        out = out if spec.finite else out + ", inf allowed"
    elif isinstance(spec, Choice):
        out = ", ".join(f"`{c!r}`" for c in spec.choices)
    elif isinstance(spec, IntSequence):
        each = _interval(spec.minimum, spec.maximum)
        out = (f"{spec.length} values" if spec.length else "values") + f", each {each}"
    elif isinstance(spec, FloatSequence):
        lo = spec.minimum if spec.minimum is not None else spec.above
        each = _interval(lo, None, spec.minimum is None and spec.above is not None)
        out = (f"{spec.length} values" if spec.length else "values") + f", each {each}"
    elif isinstance(spec, Refused):
        return f"only `{spec.default!r}`: {spec.reason}"
    elif isinstance(spec, Custom):
        out = "checked by the encoding (see doc)"
    else:
        out = "any"
    return out + (", or `None`" if spec.optional else "")


def option_rows(cls: type[Encoding]) -> list[dict[str, str]]:
    """One row per declared option of ``cls``: option, type, default, range, doc."""
    return [
        {
            "option": f"`{name}`",
            "type": _spec_type(spec),
            "default": _default(cls, name),
            "range": _spec_range(spec),
            "doc": spec.doc or "-",
        }
        for name, spec in cls.option_specs.items()
    ]


def flag_meanings() -> dict[str, str]:
    """``{flag: meaning}`` from the "Capability flags" section of the ``Encoding``
    docstring (entries such as ``has_rotary / has_bias: ...`` give every flag named)."""
    doc = inspect.getdoc(Encoding) or ""
    section = doc.split("Capability flags", 1)[1]
    meanings: dict[str, str] = {}
    current: list[str] = []
    for line in section.splitlines()[1:]:
        entry = re.match(r"^    ([\w /]+): (.*)$", line)
        if entry:
            current = [name.strip() for name in entry.group(1).split("/")]
            for name in current:
                meanings[name] = entry.group(2).strip()
        elif line.startswith("        ") and current:
            for name in current:
                meanings[name] += " " + line.strip()
        elif line.strip() and not line.startswith("    "):
            break
    return meanings


def capability_rows(enc: Encoding) -> list[dict[str, str]]:
    """The instance's capability flags (``Encoding.capabilities``) with their meanings;
    ``KeyError`` for a flag the ``Encoding`` docstring does not describe."""
    meanings = flag_meanings()
    extra = {
        "required_inputs": "per-call tensors the encoding must be given (`inputs=`), by name",
        "needs_inputs": "the encoding cannot run without per-call inputs",
        "learnable": "the encoding has trainable parameters",
        "needs_probabilities": (
            "it changes the attention weights beyond an additive score term: only the "
            "`eager` and `chunked` backends run it"
        ),
    }
    rows = []
    for flag, value in enc.capabilities().items():
        meaning = extra[flag] if flag in extra else meanings[flag]
        if isinstance(value, dict):
            shown = ", ".join(f"`{k}`: {v}" for k, v in value.items()) or "none"
        else:
            shown = f"`{value}`"
        rows.append({"flag": f"`{flag}`", "value": shown, "meaning": meaning})
    return rows


@dataclass(frozen=True)
class BackendCall:
    """A representative call: ``length`` tokens (a grid of about that many for m-D
    encodings), batch 1, gradients on or off."""

    label: str
    length: int
    training: bool


BACKEND_CALLS = (
    BackendCall("inference, L = 128", 128, False),
    BackendCall("inference, L = 1024", 1024, False),
    BackendCall("training step, L = 1024", 1024, True),
)


def _call_positions(enc: Encoding, length: int) -> torch.Tensor:
    """Positions of a call of about ``length`` tokens: 1-D ``0..L-1`` (at most a learned
    table's ``max_positions``); m-D a grid (2-D ``a x b``; 3-D ``2 x a x b``), reduced into a
    window table per axis (windowed encodings accept repeated coordinates)."""
    if enc.dims == 1:
        if enc.max_positions is not None:
            length = min(length, enc.max_positions)
        return torch.arange(length)
    plane = length if enc.dims == 2 else length // 2
    side = 2 ** (int(math.log2(plane)) // 2)
    shape = [side, plane // side] if enc.dims == 2 else [2, side, plane // side]
    grid = grid_positions(*shape)
    pos = torch.zeros(grid.shape[0], enc.dims, dtype=grid.dtype)
    pos[:, : grid.shape[1]] = grid
    if enc.max_positions is not None:
        pos = pos % enc.max_positions
    return pos


def backend_rows(enc: Encoding) -> list[dict[str, str]]:
    """What ``backend="auto"`` picks (``relpos.attention.plan``) for each ``BACKEND_CALLS``
    entry: 1-D encodings causal, m-D without a mask, with the encoding's example inputs."""
    h, d = enc.num_heads, enc.head_dim
    rows = []
    for call in BACKEND_CALLS:
        pos = _call_positions(enc, call.length)
        length = pos.shape[0]
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, length, d, generator=gen) for _ in range(3))
        inputs = None
        if enc.required_inputs or enc.needs_inputs:
            inputs = enc.example_inputs(1, length, length, torch.Generator().manual_seed(0))
        kw: dict[str, Any] = {"q_pos": pos, "k_pos": pos, "causal": enc.dims == 1}
        with eager_rotations():
            if call.training:
                with torch.enable_grad():
                    for t in (q, k, v):
                        t.requires_grad_(True)
                    backend, path = plan(q, k, v, enc, inputs=inputs, **kw)
            else:
                backend, path = plan(q, k, v, enc, inputs=inputs, **kw)
        label = call.label
        if length != call.length:
            label += f" ({length} tokens" + (
                f": the encoding holds {enc.max_positions} positions)" if enc.dims == 1 else ")"
            )
        rows.append({"call": label, "backend": f"`{backend}`", "path": f"`{path}`"})
    return rows


def supported(enc: Encoding) -> list[str]:
    """``relpos.attention.supported_backends`` of the instance."""
    return supported_backends(enc)


def usage(name: str, options: dict[str, Any]) -> str:
    """A ``relpos.create`` line for the page (the options the atlas used, if any)."""
    args = "".join(f", {key}={value!r}" for key, value in options.items())
    return f'enc = relpos.create("{name}", num_heads=8, head_dim=64{args})'
