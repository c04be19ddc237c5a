"""Fixtures of the engine's tests (``relpos.attention``); helpers come from the conformance
suite's ``common.py``."""

from __future__ import annotations

import pytest

from conformance.common import ENCODINGS


@pytest.fixture(params=ENCODINGS)
def name(request) -> str:
    """Every registered encoding name."""
    return request.param
