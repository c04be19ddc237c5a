"""``relpos.interop.hf`` imports without transformers and says what to install when called."""

from __future__ import annotations

import sys

import pytest
import torch

from relpos.optional import OptionalDependencyError


def test_the_integration_imports_without_transformers_and_names_it_when_called(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    from relpos.interop import hf

    with pytest.raises(
        OptionalDependencyError, match=r"needs transformers .*pip install 'relpos\[hf\]'"
    ):
        hf.patch(torch.nn.Linear(2, 2))
    with pytest.raises(ImportError, match="needs transformers"):
        hf.load_hf("hf:smollm2")


def test_the_error_is_an_import_error_that_names_the_extra(monkeypatch):
    """Code that catches ``ImportError`` catches it; ``install`` names the exact extra."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    from relpos.interop import hf

    with pytest.raises(ImportError) as info:
        hf.patch(torch.nn.Linear(2, 2))
    assert isinstance(info.value, OptionalDependencyError)
    assert info.value.missing == ("transformers",) and info.value.install == ("relpos[hf]",)
