"""Fixtures shared by every test directory."""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one xdist worker per core: one intra-op thread each, so the workers do
    # not oversubscribe the cores (two threads per worker on 2 cores cost the suite time)
    torch.set_num_threads(1)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage (in elements) any aten op returns: ``with
    LargestAllocation() as probe: ...`` then ``probe.largest`` and the op ``probe.op``."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                if size > self.largest:
                    self.largest, self.op = size, str(func)
        return out


@pytest.fixture
def largest_allocation() -> type[LargestAllocation]:
    """The ``LargestAllocation`` probe class (a dispatch mode: use it as a context manager)."""
    return LargestAllocation
