"""``relpos.attention.frozen_cache``: per-distance tables and dense score masks are reused
across calls only while the encoding is unchanged and takes no gradient, and a reused
tensor gives the result of a fresh computation."""

from __future__ import annotations

import gc

import pytest
import torch

import relpos
from relpos.attention import frozen_cache
from relpos.attention.call import prepare_call

H, D = 4, 16


@pytest.fixture(autouse=True)
def empty_cache():
    frozen_cache.clear()
    yield
    frozen_cache.clear()


def qkv(length: int = 48, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, length, D, generator=g) for _ in range(3)]


def table(enc, q, k, v, causal: bool = True):
    call = prepare_call(q, k, v, enc, q_pos=None, k_pos=None, causal=causal, mask=None, scale=None)
    return call.distance_table(causal=causal)


def test_a_frozen_encoding_reuses_its_table():
    enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        first = table(enc, q, k, v)
        assert table(enc, q, k, v) is first
        assert table(enc, q, k, v, causal=False) is not first  # another key
        shorter = [t[:, :, :32] for t in (q, k, v)]
        assert table(enc, *shorter).shape[1] == 2 * 32 - 1


def test_an_in_place_update_is_seen():
    """An optimizer step writes the parameters in place: the next call recomputes, and its
    output is the one of a fresh encoding with the new values."""
    enc = relpos.create("t5", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        before = relpos.attention(q, k, v, enc, causal=True)
        stale = table(enc, q, k, v)
    opt = torch.optim.SGD(enc.parameters(), lr=10.0)
    relpos.attention(q, k, v, enc, causal=True, backend="chunked").square().sum().backward()
    opt.step()
    with torch.no_grad():
        assert table(enc, q, k, v) is not stale
        after = relpos.attention(q, k, v, enc, causal=True)
        fresh = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, fresh, rtol=1e-5, atol=1e-6)


def test_a_plain_attribute_change_is_seen():
    enc = relpos.create("fire", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        first = table(enc, q, k, v)
        enc.eps = 0.5
        second = table(enc, q, k, v)
    assert second is not first and not torch.equal(first, second)


def test_nothing_is_kept_while_the_bias_takes_gradients():
    enc = relpos.create("t5", num_heads=H, head_dim=D)
    q, k, v = qkv()
    t = table(enc, q, k, v)
    assert t.requires_grad and table(enc, q, k, v) is not t
    assert frozen_cache._held == 0
    fixed = relpos.create("alibi", num_heads=H, head_dim=D)  # no parameters: reused
    assert table(fixed, q, k, v) is table(fixed, q, k, v)


def test_entries_end_with_their_encoding():
    enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    with torch.no_grad():
        table(enc, *qkv())
    assert frozen_cache._held > 0
    del enc
    gc.collect()
    assert frozen_cache._held == 0 and not frozen_cache._entries


def test_the_cache_is_bounded(monkeypatch):
    enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    with torch.no_grad():
        one = table(enc, *qkv(64)).numel() * 4
        monkeypatch.setattr(frozen_cache, "CACHE_BYTES", 2 * one)
        for length in (64, 63, 62, 61):
            table(enc, *qkv(length))
    assert frozen_cache._held <= 2 * one and len(frozen_cache._entries) <= 2


def test_a_reused_score_mask_gives_the_fresh_result():
    """``sdpa`` with its dense mask from the cache equals the eager backend, call after call,
    causal or not, and with a mask the user passes (never cached)."""
    enc = relpos.create("alibi", num_heads=H, head_dim=D, bidirectional=True)
    q, k, v = qkv()
    mask = torch.rand(48, 48, generator=torch.Generator().manual_seed(1)) > 0.2
    mask |= torch.eye(48, dtype=torch.bool)
    with torch.no_grad():
        for kw in ({"causal": True}, {"causal": False}, {"mask": mask}):
            ref = relpos.attention(q, k, v, enc, backend="eager", **kw)
            for _ in range(2):
                out = relpos.attention(q, k, v, enc, backend="sdpa", **kw)
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
