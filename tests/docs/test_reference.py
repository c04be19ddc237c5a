"""What an encoding page states is read from the registry and the code
(``relpos_lab.docsite.reference``): citations, option tables, flags and backends."""

from __future__ import annotations

import inspect
import re

import pytest

import relpos
from relpos.attention import plan, supported_backends
from relpos.encodings.base import Encoding
from relpos.encodings.options import Choice, Float, Int, IntSequence, Refused
from relpos.registry import encoding_class
from relpos_lab.docsite import reference


class Cited(Encoding):
    """A made-up encoding (Doe et al. 2030, "A Title", arXiv 3001.00001; owner-1/Repo_x).

    Words and paths that are not repositories: keys and/or values, cos/sin, v2/v3, the
    2-D/3-D forms, W/Px, column/row, ``benchmarks/bench_walks`` and ``src/model.py``; again
    arXiv:3001.00002 and a nested path ``owner-1/Repo_x/file`` (not a second repository)."""

    paper = "Doe et al. 2030"


def test_paper_facts_read_arxiv_ids_and_repositories_from_the_docstrings():
    facts = reference.paper_facts(Cited)
    assert facts.citation == "Doe et al. 2030"
    assert facts.summary.startswith("A made-up encoding (Doe et al. 2030")
    assert facts.module_summary.startswith("What an encoding page states")
    assert facts.arxiv == ("3001.00001", "3001.00002")
    assert facts.code == ("owner-1/Repo_x",)


def test_paper_facts_of_registered_encodings():
    alibi = reference.paper_facts(encoding_class("alibi"))
    assert "2108.12409" in alibi.arxiv
    kerple = reference.paper_facts(encoding_class("kerple-log"))
    assert "chijames/KERPLE" in kerple.code
    for name in relpos.available():
        facts = reference.paper_facts(encoding_class(name))
        assert all(re.fullmatch(r"\d{4}\.\d{4,5}", a) for a in facts.arxiv), name
        assert all(re.fullmatch(r"[\w-]+/[\w.-]+", c) for c in facts.code), name


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (Int(minimum=0), "≥ 0"),
        (Int(minimum=1, maximum=8), "[1, 8]"),
        (Int(optional=True), "≥ 1, or `None`"),
        (Float(above=1.0), "> 1"),
        (Float(minimum=0.0, below=1.0), "[0, 1)"),
        (Float(), "any"),
        (Choice(choices=("half", "interleaved")), "`'half'`, `'interleaved'`"),
        (IntSequence(length=2, minimum=1), "2 values, each ≥ 1"),
        (Refused(reason="frequencies are learned"), "only `None`: frequencies are learned"),
    ],
)
def test_option_ranges_state_the_spec(spec, expected):
    assert reference._spec_range(spec) == expected


@pytest.mark.parametrize("name", relpos.available())
def test_option_rows_cover_every_declared_option_with_its_default(name):
    cls = encoding_class(name)
    rows = reference.option_rows(cls)
    assert [r["option"] for r in rows] == [f"`{o}`" for o in cls.option_specs]
    for row in rows:
        assert row["default"] == "required" or row["default"].startswith("`"), row
    init = inspect.signature(cls.__init__).parameters
    for row in rows:
        option = row["option"].strip("`")
        if option in init and init[option].default is not inspect.Parameter.empty:
            assert row["default"] == f"`{init[option].default!r}`"


def test_rope_option_rows():
    rows = {r["option"]: r for r in reference.option_rows(encoding_class("rope"))}
    assert rows["`base`"]["default"] == "`10000.0`"
    assert rows["`layout`"]["type"] == "choice"
    assert "'interleaved'" in rows["`layout`"]["range"]


def test_every_capability_flag_has_a_meaning_from_the_encoding_docstring():
    meanings = reference.flag_meanings()
    assert set(Encoding.FLAGS) <= set(meanings)
    assert meanings["relative"].startswith("logits depend on positions only through")
    for name in relpos.available():
        enc = relpos.create(name, num_heads=8, head_dim=64)
        rows = reference.capability_rows(enc)
        assert {r["flag"].strip("`") for r in rows} == set(enc.capabilities())
        assert all(r["meaning"] for r in rows)


@pytest.mark.parametrize(
    "name", ["alibi", "rope", "shaw", "dca", "prope", "layoutlmv2", "swin-2d", "aw-rope"]
)
def test_auto_picks_a_backend_that_runs_the_encoding(name):
    enc = relpos.create(name, num_heads=8, head_dim=64, **encoding_class(name).example_options())
    rows = reference.backend_rows(enc)
    assert [r["call"].split(" (")[0] for r in rows] == [c.label for c in reference.BACKEND_CALLS]
    for row in rows:
        assert row["backend"].strip("`") in supported_backends(enc), row


def test_backend_rows_are_what_plan_says():
    import torch

    alibi = relpos.create("alibi", num_heads=8, head_dim=64)
    rows = reference.backend_rows(alibi)
    q = torch.randn(1, 8, 128, 64)
    with torch.no_grad():
        backend, path = plan(q, q, q, alibi, causal=True)
    assert (rows[0]["backend"], rows[0]["path"]) == (f"`{backend}`", f"`{path}`")
    assert rows[0]["backend"] == "`sdpa`"  # a small call materialises the bias


def test_a_small_table_shortens_the_calls_and_says_so():
    aw = relpos.create("aw-rope", num_heads=8, head_dim=64, max_nodes=64, feature_dim=8)
    rows = reference.backend_rows(aw)
    assert all("64 tokens: the encoding holds 64 positions" in r["call"] for r in rows)
