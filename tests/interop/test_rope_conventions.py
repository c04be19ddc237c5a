"""docs/rope_conventions.md is generated from ``CONVENTIONS`` and covers every scaling type
relpos registers and every ``rope_type`` of the installed transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from relpos.interop.rope_conventions import CONVENTIONS, render_markdown
from relpos.rope_scaling import ROPE_SCALING

DOC = Path(__file__).resolve().parents[2] / "docs" / "rope_conventions.md"


def test_the_doc_is_up_to_date() -> None:
    assert DOC.read_text() == render_markdown(), (
        "regenerate: python -m relpos.interop.rope_conventions > docs/rope_conventions.md"
    )


def test_every_registered_scaling_type_has_a_row() -> None:
    covered = {c.scaling for c in CONVENTIONS if c.scaling}
    assert covered == set(ROPE_SCALING)


def test_every_transformers_rope_type_has_a_row() -> None:
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rows = {c.scaling for c in CONVENTIONS if c.stack == "transformers"}
    assert set(ROPE_INIT_FUNCTIONS) | {"default"} <= rows


def test_unsupported_rows_give_a_reason() -> None:
    for c in CONVENTIONS:
        if not c.supported:
            assert c.relpos == "-" and len(c.how) > 20, c
