"""The generated part of the documentation site: one page per registered encoding, the
encodings index and the atlas page, with their figures.

``generate`` returns ``{path under docs/: str | bytes}``; the mkdocs hook
(``relpos_lab.docsite.mkdocs_hooks``) adds them to the build without writing them to disk.
Nothing is skipped silently: an encoding whose figure cannot be computed fails the build with
its name; parts an encoding cannot show by construction (lengths beyond a learned table) are
stated on its page.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import relpos
from relpos.registry import encoding_class

from ..listing import LIST_HEAD_DIM, LIST_HEADS, encoding_rows
from . import atlas, figures, reference

__all__ = [
    "ATLAS_PAGE",
    "ENCODINGS_DIR",
    "FIGURES_DIR",
    "EncodingFigures",
    "atlas_page",
    "encoding_figures",
    "encoding_page",
    "encodings_index",
    "figure_path",
    "generate",
]

log = logging.getLogger(__name__)

ENCODINGS_DIR = "encodings"
FIGURES_DIR = "atlas"
ATLAS_PAGE = "atlas.md"

_CAPTIONS = {
    "profile": (
        "Per head ({heads} heads of {dim} channels), the logit the encoding adds for a "
        "*similar key* at relative distance d = q_pos − k_pos: every query and key is one "
        "random vector u per head (|u|² = D, mean of {draws} draws), and the content term "
        "scale · |u|² is subtracted, so a bias encoding shows its bias b_h(d) and a rotary "
        "one its rotary score. The query sits at position N in the middle of keys 0..2N. "
        "Gaps are pairs the encoding itself masks."
    ),
    "embedding": (
        "The encoding adds a position embedding e(p) to the input (dim {width}) and leaves "
        "the attention logits alone: the curve is the cosine similarity of e(p_i) and e(p_j) "
        "against d = p_i − p_j."
    ),
    "grid": (
        "The similar-key logit (as in the distance profiles: q = k = u, content term "
        "subtracted) from the centre query (cross) to every cell of a grid, for the first "
        "heads. Positions are row-major grid coordinates on axes 0 and 1 (2-D encodings); "
        "for 3 or more axes, axes 1 and 2 form the grid, axis 0 takes the values of the "
        "columns and further axes stay 0."
    ),
    "patterns": (
        "Attention weights of head 0 (rows: queries, columns: keys; each row divided by its "
        "largest weight, so long rows stay visible). Top row: every query and "
        "key is the same random vector u, so all structure comes from the encoding; bottom "
        "row: independent random q, k ~ N(0, I). 1-D encodings under a causal mask; m-D "
        "encodings over grids in row-major token order, without a mask."
    ),
}
_VIEW_TITLES = {
    "profile": "Logit against relative distance",
    "embedding": "Position-embedding similarity",
    "grid": "Logit over a grid",
    "patterns": "Attention patterns",
}


@dataclass
class EncodingFigures:
    """The figures of one encoding (``{view: png bytes}``) and the atlas instance."""

    item: atlas.AtlasEncoding
    images: dict[str, bytes] = field(default_factory=dict)


def encoding_figures(name: str) -> EncodingFigures:
    """Compute and draw every atlas view of ``name`` (``atlas.views``); errors propagate."""
    item = atlas.atlas_encoding(name)
    out = EncodingFigures(item)
    for view in atlas.views(item.encoding):
        if view == "profile":
            out.images[view] = figures.profile_png(name, atlas.distance_profile(item))
        elif view == "embedding":
            out.images[view] = figures.profile_png(name, atlas.embedding_profile(item))
        elif view == "grid":
            out.images[view] = figures.grid_png(name, atlas.grid_map(item))
        else:
            out.images[view] = figures.patterns_png(name, atlas.attention_patterns(item))
    return out


def figure_path(name: str, view: str) -> str:
    """The figure's path under docs/ (``atlas/<name>-<view>.png``)."""
    return f"{FIGURES_DIR}/{name}-{view}.png"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(rows: list[dict[str, str]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _caption(view: str) -> str:
    return _CAPTIONS[view].format(
        heads=atlas.ATLAS_HEADS,
        dim=atlas.ATLAS_HEAD_DIM,
        width=atlas.ATLAS_HEADS * atlas.ATLAS_HEAD_DIM,
        draws=atlas.DRAWS,
    )


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def _paper_section(cls: type[relpos.Encoding]) -> list[str]:
    facts = reference.paper_facts(cls)
    rows = [
        {"field": "cited as", "value": facts.citation or "-"},
        {"field": "class docstring", "value": facts.summary or "-"},
        {"field": "module docstring", "value": facts.module_summary or "-"},
        {
            "field": "arXiv",
            "value": ", ".join(f"[{a}](https://arxiv.org/abs/{a})" for a in facts.arxiv) or "-",
        },
        {
            "field": "code cited",
            "value": ", ".join(f"[{c}](https://github.com/{c})" for c in facts.code) or "-",
        },
    ]
    return [
        "## Paper",
        "",
        _table(rows, ["field", "value"]),
        "",
        "The citation is the class's `paper` attribute, the docstring rows are the first "
        "paragraphs of the class and module docstrings, and the arXiv ids and repositories "
        "are the ones those docstrings cite (the full docstrings are under Definition).",
        "",
    ]


def _atlas_section(name: str, figs: EncodingFigures) -> list[str]:
    item = figs.item
    enc = item.encoding
    lines = ["## Atlas", ""]
    options = ", ".join(f"`{k}={v!r}`" for k, v in item.options.items())
    lines.append(
        f"Drawn from the code at {atlas.ATLAS_HEADS} heads of {atlas.ATLAS_HEAD_DIM} channels"
        + (f", with the encoding's example options {options}" if options else "")
        + ", learned parameters at their initialisation (seed 0)."
    )
    if item.filled:
        filled = ", ".join(f"`{p}`" for p in item.filled)
        lines.append(
            f"Parameters initialised to exactly zero were drawn N(0, 0.1²) so their shape "
            f"shows: {filled}."
        )
    if enc.required_inputs or enc.needs_inputs:
        doc = inspect.getdoc(type(enc).example_inputs) or ""
        lines.append(
            "The encoding reads per-call inputs; the figures use "
            f"`example_inputs`: {_first_paragraph(doc)}"
        )
    lines.append("")
    for note in item.notes:
        lines += [f"- {note}"]
    if item.notes:
        lines.append("")
    for view in figs.images:
        lines += [
            f"### {_VIEW_TITLES[view]}",
            "",
            f"![{name}: {_VIEW_TITLES[view].lower()}](../{figure_path(name, view)})",
            "",
            _caption(view),
            "",
        ]
    return lines


def _backend_section(name: str, options: dict) -> list[str]:
    enc = relpos.create(name, num_heads=LIST_HEADS, head_dim=LIST_HEAD_DIM, **options)
    backends = ", ".join(f"`{b}`" for b in reference.supported(enc))
    with_options = ", ".join(f"`{k}={v!r}`" for k, v in options.items())
    return [
        "## Backends",
        "",
        f"Backends that compute it exactly (`relpos.attention.supported_backends`): {backends}.",
        "",
        f'What `backend="auto"` picks (`relpos.attention.plan`) on the CPU at {LIST_HEADS} '
        f"heads of {LIST_HEAD_DIM} channels"
        + (f", with the example options {with_options}" if with_options else "")
        + ", batch 1, random q, k, v (1-D: causal; m-D: a grid of positions, no mask)"
        + (
            ", and the encoding's `example_inputs`"
            if enc.required_inputs or enc.needs_inputs
            else ""
        )
        + ":",
        "",
        _table(reference.backend_rows(enc), ["call", "backend", "path"]),
        "",
    ]


def encoding_page(name: str, figs: EncodingFigures) -> str:
    """The markdown of ``encodings/<name>.md``."""
    cls = encoding_class(name)
    enc = relpos.create(name, num_heads=LIST_HEADS, head_dim=LIST_HEAD_DIM)
    options = reference.option_rows(cls)
    lines = [
        f"# `{name}`",
        "",
        f"**{_cell(cls.paper or name)}** · family `{enc.family}` · "
        f"[compare in the atlas](../{ATLAS_PAGE}#{enc.family})",
        "",
        "```python",
        "import relpos",
        "",
        reference.usage(name, {}),
        "```",
        "",
    ]
    lines += _paper_section(cls)
    lines += ["## Options", ""]
    if options:
        lines += [
            "Declared in `option_specs`; `relpos.create` checks them (defaults from the "
            "constructor).",
            "",
            _table(options, ["option", "type", "default", "range", "doc"]),
            "",
        ]
    else:
        lines += ["The encoding takes no options besides `num_heads` and `head_dim`.", ""]
    lines += [
        "## Capabilities",
        "",
        f"`Encoding.capabilities()` of the instance with default options ({LIST_HEADS} heads "
        f"of {LIST_HEAD_DIM} channels).",
        "",
        _table(reference.capability_rows(enc), ["flag", "value", "meaning"]),
        "",
    ]
    lines += _backend_section(name, figs.item.options)
    lines += _atlas_section(name, figs)
    lines += [
        "## Definition",
        "",
        "The class and module docstrings, as the code states the formula.",
        "",
        f"::: {cls.__module__}.{cls.__qualname__}",
        "    options:",
        "      members: false",
        "",
        f"### Module `{cls.__module__}`",
        "",
        f"::: {cls.__module__}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
        "",
    ]
    return "\n".join(lines)


def encodings_index(names: Iterable[str]) -> str:
    """``encodings/index.md``: one row per encoding of ``names`` (as ``relpos list``)."""
    rows = []
    wanted = set(names)
    for row in encoding_rows():
        name = row["name"]
        if name not in wanted:
            continue
        enc = relpos.create(name, num_heads=LIST_HEADS, head_dim=LIST_HEAD_DIM)
        rows.append(
            {
                "name": f"[`{name}`]({name}.md)",
                "family": row["family"],
                "axes": str(enc.dims),
                "relative": row["relative"],
                "hooks": row["hooks"],
                "paper": row["paper"],
            }
        )
    return "\n".join(
        [
            "# Encodings",
            "",
            f"The {len(rows)} encodings of the registry (`relpos.available()`), with the flags "
            "`relpos list` reads from an instance with default options. Each page holds the "
            "paper, the options, the capability flags, the backends and the atlas figures.",
            "",
            _table(rows, ["name", "family", "axes", "relative", "hooks", "paper"]),
            "",
        ]
    )


ATLAS_COLUMNS = 3


def _gallery(names: list[str], view: str, link_prefix: str) -> list[str]:
    """A table of ``ATLAS_COLUMNS`` figures a row, each under its encoding's name."""
    cells = [
        f"[`{name}`]({link_prefix}{name}.md)<br>"
        f"![{name}: {_VIEW_TITLES[view].lower()}]({figure_path(name, view)})"
        "{ loading=lazy width=360 }"
        for name in names
    ]
    cells += [""] * (-len(cells) % ATLAS_COLUMNS)
    lines = ["| " + " | ".join([" "] * ATLAS_COLUMNS) + " |", "|" + "---|" * ATLAS_COLUMNS]
    for row in range(0, len(cells), ATLAS_COLUMNS):
        lines.append("| " + " | ".join(cells[row : row + ATLAS_COLUMNS]) + " |")
    return lines


def atlas_page(drawn: dict[str, EncodingFigures]) -> str:
    """``atlas.md``: the encodings' figures side by side, by family and kind of figure."""
    families: dict[str, list[str]] = {}
    for name, figs in drawn.items():
        families.setdefault(figs.item.encoding.family, []).append(name)
    lines = [
        "---",
        "hide:",
        "  - navigation",
        "  - toc",
        "---",
        "",
        "# Atlas",
        "",
        "What each encoding does to attention, drawn at build time from its code "
        f"(`relpos_lab.docsite.atlas`) at {atlas.ATLAS_HEADS} heads of "
        f"{atlas.ATLAS_HEAD_DIM} channels, side by side within each family. Each encoding's "
        "page explains its figures and the options and inputs they were drawn with.",
        "",
    ]
    views = ("profile", "embedding", "grid", "patterns")
    for view in views:
        lines += [f"- **{_VIEW_TITLES[view]}**: {_caption(view)}"]
    lines += ["", "Families: " + ", ".join(f"[{f}](#{f})" for f in sorted(families)), ""]
    for family in sorted(families):
        lines += [f"## {family}", ""]
        for view in views:
            names = [n for n in families[family] if view in drawn[n].images]
            if names:
                lines += [f"### {family}: {_VIEW_TITLES[view].lower()}", ""]
                lines += _gallery(names, view, f"{ENCODINGS_DIR}/") + [""]
    return "\n".join(lines)


def generate(
    names: Iterable[str] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, str | bytes]:
    """Every generated file of the site, ``{path under docs/: content}``: the encodings
    index, one page and its figures per encoding (default: ``relpos.available()``) and the
    atlas page. ``progress(name, seconds)`` is called after each encoding."""
    names = list(relpos.available() if names is None else names)
    files: dict[str, str | bytes] = {}
    drawn: dict[str, EncodingFigures] = {}
    for name in names:
        start = time.perf_counter()
        try:
            figs = encoding_figures(name)
            files[f"{ENCODINGS_DIR}/{name}.md"] = encoding_page(name, figs)
        except Exception as err:
            raise RuntimeError(f"the docs site cannot draw encoding {name!r}: {err}") from err
        for view, png in figs.images.items():
            files[figure_path(name, view)] = png
        drawn[name] = figs
        if progress is not None:
            progress(name, time.perf_counter() - start)
    files[f"{ENCODINGS_DIR}/index.md"] = encodings_index(names)
    files[ATLAS_PAGE] = atlas_page(drawn)
    return files
