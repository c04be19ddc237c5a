"""Fixtures of the conformance suite; helpers live in ``common.py``."""

from __future__ import annotations

import pytest

from .common import ENCODINGS


@pytest.fixture(params=ENCODINGS)
def name(request) -> str:
    """Every registered encoding name."""
    return request.param
