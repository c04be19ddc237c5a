"""mkdocs hooks (``hooks:`` in mkdocs.yml): the generated pages enter the build in memory.

* ``on_config`` expands the nav entry ``Encodings: encodings/index.md`` into the index and one
  page per registered encoding, grouped by family;
* ``on_files`` adds the pages and figures of ``relpos_lab.docsite.pages.generate`` as
  generated files (nothing is written under docs/).

``RELPOS_DOCS_ENCODINGS=alibi,rope`` limits the build to those encodings (a quick local
preview); ``make docs`` and CI build all of them. Only mkdocs imports this module.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import relpos
from relpos.registry import encoding_class
from relpos_lab.docsite import pages

log = logging.getLogger("mkdocs.plugins.relpos_docsite")

ENV_ENCODINGS = "RELPOS_DOCS_ENCODINGS"
NAV_TITLE = "Encodings"


def selected_encodings() -> list[str]:
    """``relpos.available()``, or the names in ``RELPOS_DOCS_ENCODINGS`` (each checked)."""
    value = os.environ.get(ENV_ENCODINGS, "").strip()
    if not value:
        return relpos.available()
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        encoding_class(name)  # ValueError naming the known encodings
    return names


def encodings_nav(names: list[str]) -> list[Any]:
    """The nav of the encodings section: the index, then one page per encoding by family."""
    families: dict[str, list[dict[str, str]]] = {}
    for name in names:
        family = encoding_class(name).family
        families.setdefault(family, []).append({name: f"{pages.ENCODINGS_DIR}/{name}.md"})
    return [f"{pages.ENCODINGS_DIR}/index.md"] + [
        {family: families[family]} for family in sorted(families)
    ]


def on_config(config: Any) -> Any:
    nav = config["nav"]
    for n, entry in enumerate(nav or []):
        if isinstance(entry, dict) and entry.get(NAV_TITLE) == f"{pages.ENCODINGS_DIR}/index.md":
            nav[n] = {NAV_TITLE: encodings_nav(selected_encodings())}
            return config
    raise ValueError(
        f"mkdocs.yml: the nav needs the entry `- {NAV_TITLE}: {pages.ENCODINGS_DIR}/index.md`, "
        "which the relpos hook expands into one page per encoding"
    )


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    names = selected_encodings()
    start = time.perf_counter()

    def progress(name: str, seconds: float) -> None:
        log.debug("atlas: %s drawn in %.1f s", name, seconds)

    generated = pages.generate(names, progress=progress)
    for path, content in generated.items():
        if files.get_file_from_path(path) is not None:
            raise ValueError(f"docs/{path} exists, but the relpos hook generates it: remove it")
        files.append(File.generated(config, path, content=content))
    figures = sum(1 for path in generated if path.endswith(".png"))
    log.info(
        "relpos: %d encoding pages and %d atlas figures generated in %.0f s",
        len(names),
        figures,
        time.perf_counter() - start,
    )
    return files
