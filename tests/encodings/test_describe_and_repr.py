"""Finding an encoding's options: ``relpos.describe`` (``relpos list NAME``), ``help`` on
``relpos.create``, and a ``repr`` that states every option given a non-default value."""

from __future__ import annotations

import inspect

import pytest

import relpos
from relpos.encodings.registry import option_defaults

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}


@pytest.mark.parametrize("name", relpos.available())
def test_describe_lists_every_declared_option(name):
    card = relpos.describe(name)
    cls = relpos.encoding_class(name)
    assert card.startswith(f"{name}: ")
    for option in cls.option_specs:
        assert f"\n  {option} " in card + " ", option


def test_describe_shows_defaults_and_docs():
    card = relpos.describe("alibi")
    line = next(s for s in card.splitlines() if s.strip().startswith("bidirectional"))
    assert "False" in line and "symmetric" in line  # default and doc
    assert option_defaults(relpos.encoding_class("rope"))["base"] == 10000.0


def test_help_on_create_says_where_the_options_are():
    doc = inspect.getdoc(relpos.create)
    assert "relpos.describe(name)" in doc and "relpos list NAME" in doc
    assert '"rope_type": "yarn"' in doc


def test_repr_shows_the_scaling_and_other_non_default_options():
    rope = relpos.create("rope", num_heads=8, head_dim=64, scaling=YARN)
    assert "scaling={'rope_type': 'yarn', 'factor': 4.0" in repr(rope)
    plain = repr(relpos.create("rope", num_heads=8, head_dim=64))
    assert "scaling" not in plain  # the default is not repeated
    t5 = repr(relpos.create("t5", num_heads=8, head_dim=64, num_buckets=16))
    assert t5.count("num_buckets=16") == 1
    alibi = repr(relpos.create("alibi", num_heads=8, head_dim=64, bidirectional="symmetric"))
    assert alibi.count("bidirectional=") == 1  # the class's own repr already shows it


@pytest.mark.parametrize("name", relpos.available())
def test_every_encoding_has_a_repr(name):
    from tests.conformance.common import make_encoding

    assert repr(make_encoding(name)).startswith(type(make_encoding(name)).__name__)
