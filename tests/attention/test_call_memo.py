"""``relpos.attention.call_memo``: a repeated call of one shape reuses its preparation only
when nothing it depends on changed, and gives the result of a fresh preparation."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import api, call_memo, policy
from relpos.attention.policy import PolicyTable, Segment

H, D = 4, 16


@pytest.fixture(autouse=True)
def empty_memo():
    call_memo.clear()
    yield
    call_memo.clear()


def qkv(length: int = 48, grad: bool = False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, H, length, D, generator=g).requires_grad_(grad) for _ in range(3)]


def test_a_repeated_call_is_prepared_once_and_computes_the_same():
    enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        first = relpos.attention(q, k, v, enc, causal=True)
        assert len(call_memo._memo) == 1
        q2, k2, v2 = (t + 1 for t in (q, k, v))  # new tensors of the same shape
        again = relpos.attention(q2, k2, v2, enc, causal=True)
        assert len(call_memo._memo) == 1
        call_memo.clear()
        fresh = relpos.attention(q2, k2, v2, enc, causal=True)
    torch.testing.assert_close(again, fresh, rtol=0, atol=0)
    assert not torch.equal(first, again)


def test_what_the_call_depends_on_is_part_of_the_key():
    enc = relpos.create("t5", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        relpos.attention(q, k, v, enc, causal=True)
        relpos.attention(q, k, v, enc, causal=False)
        relpos.attention(q[:, :, :40], k, v, enc, causal=True)
        relpos.attention(q, k, v, enc, causal=True, backend="chunked")
        relpos.attention(*(t.double() for t in (q, k, v)), enc.double(), causal=True)
    assert len(call_memo._memo) == 5
    with torch.no_grad():
        enc.float()
        next(enc.parameters()).add_(1.0)  # a new state: prepared again
        relpos.attention(q, k, v, enc, causal=True)
    assert len(call_memo._memo) == 6


def test_no_memo_while_the_bias_takes_gradients_or_with_per_call_arguments():
    enc = relpos.create("t5", num_heads=H, head_dim=D)
    q, k, v = qkv(grad=True)
    relpos.attention(q, k, v, enc, causal=True).sum().backward()
    assert not call_memo._memo
    with torch.no_grad():
        relpos.attention(q, k, v, enc, q_pos=torch.arange(48), causal=True)
        relpos.attention(q, k, v, enc, mask=torch.ones(48, 48, dtype=torch.bool))
        relpos.attention(q, k, v, relpos.create("rope", num_heads=H, head_dim=D), causal=True)
        relpos.attention(q, k, v, relpos.create("shaw", num_heads=H, head_dim=D), causal=True)
    assert not call_memo._memo


def test_a_new_policy_table_is_read_by_the_next_call(monkeypatch):
    enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    q, k, v = qkv()
    with torch.no_grad():
        f = api.facts(q, k, v, enc, causal=True)
        for first in ("eager", "chunked", "sdpa"):
            table = PolicyTable({f.key: (Segment(None, (first,)),)}, first)
            monkeypatch.setattr(policy, "active_table", lambda table=table: table)
            assert relpos.attention.plan(q, k, v, enc, causal=True)[0] == first
            assert relpos.attention.plan(q, k, v, enc, causal=True)[0] == first  # memo hit
