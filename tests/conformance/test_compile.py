"""Conformance 4c: ``torch.compile`` of a function that calls ``relpos.attention`` works and
matches the uncompiled result (small shapes: inductor is slow on CPU).

Every encoding compiles once, on the fused backend where it runs there (``sdpa``, else
``eager``) with a causal mask: what dynamo fails on lives in the encoding's own code
(``prepare``, ``pieces``, ``rotate``, ``bias``), which every backend calls. One representative
per family (the first name of the family, alphabetically) compiles on both backends, causal
and not, for the backends' own compiled paths. Every compile is minutes of CPU time in all,
so the full matrix for all encodings would not fit CI's budget."""

from __future__ import annotations

import pytest
import torch

from relpos.attention import supported_backends
from relpos.registry import encoding_class

from .common import ENCODINGS, B, D, H, assert_close_rel, attention, make_encoding


def _family_representatives() -> list[str]:
    first: dict[str, str] = {}
    for name in sorted(ENCODINGS):
        first.setdefault(encoding_class(name).family, name)
    return sorted(first.values())


REPRESENTATIVES = _family_representatives()


def _check_compile(name: str, backend: str, causal: bool) -> None:
    enc = make_encoding(name)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding")
    if backend not in supported_backends(enc):
        pytest.skip("backend cannot run this encoding")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 16, D, generator=gen)
    k = torch.randn(B, H, 16, D, generator=gen)
    v = torch.randn(B, H, 16, D, generator=gen)

    def fn(q, k, v):
        return attention(q, k, v, enc, causal=causal, backend=backend)

    # a fresh dynamo state: every case compiles (no silent eager fallback at the recompile limit)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = fn(q, k, v)
        out = torch.compile(fn)(q, k, v)
    assert_close_rel(out, ref)


@pytest.mark.slow  # inductor compiles per encoding: seconds to a minute each on 2 cores
def test_torch_compile_matches_eager(name):
    backend = "sdpa" if "sdpa" in supported_backends(make_encoding(name)) else "eager"
    _check_compile(name, backend, causal=True)


@pytest.mark.slow  # inductor compiles per case
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_torch_compile_of_each_family_on_both_backends(name, backend, causal):
    _check_compile(name, backend, causal)
