"""``relpos.interop.hf`` imports without transformers and says what to install when called."""

from __future__ import annotations

import sys

import pytest
import torch


def test_the_integration_imports_without_transformers_and_names_it_when_called(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    from relpos.interop import hf

    with pytest.raises(ValueError, match="needs transformers .*pip install transformers"):
        hf.patch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="needs transformers"):
        hf.load_hf("hf:smollm2")
