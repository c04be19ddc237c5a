"""One position fact per call: ``Positions`` / ``CallPositions`` (spans, offset, reachable
distance range) built once by ``prepare_call`` and read by backends and encodings."""

from __future__ import annotations

import torch

import relpos
from relpos import positions as positions_module
from relpos.attention.api import supported_backends
from relpos.attention.call import prepare_call
from relpos.positions import CallPositions, Positions, Span

H, D = 4, 16


def qkv(batch: int, lq: int, lk: int):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(batch, H, lq, D, generator=g),
        torch.randn(batch, H, lk, D, generator=g),
        torch.randn(batch, H, lk, D, generator=g),
    )


def brute_range(qp: torch.Tensor, kp: torch.Tensor) -> tuple[int, int]:
    d = qp[:, :, None] - kp[:, None, :]
    return int(d.min()), int(d.max())


def test_defaulted_positions_know_their_span_without_looking(monkeypatch):
    """Default positions are ranges by construction: no ``as_span`` host sync, in the call
    and in the backends (the Toeplitz path, the dense bias, the piecewise kernel)."""

    def refuse(pos):
        raise AssertionError("as_span called on defaulted positions")

    monkeypatch.setattr(positions_module, "as_span", refuse)
    q, k, v = qkv(2, 24, 40)
    call = prepare_call(q, k, v, None, q_pos=None, k_pos=None, causal=True, mask=None, scale=None)
    assert call.positions.q.span == Span(16, 24) and call.positions.k.span == Span(0, 40)
    assert call.positions.q.offset == 16
    assert call.positions.distance_range == brute_range(call.q_pos, call.k_pos) == (-23, 39)
    for name, options in (("alibi", {}), ("dca", {"pretraining_length": 16})):
        enc = relpos.create(name, num_heads=H, head_dim=D, **options)
        for backend in ("sdpa", "chunked"):
            if backend in supported_backends(enc):
                relpos.attention(q, k, v, enc, causal=True, backend=backend)


def test_given_positions_are_inspected_once(monkeypatch):
    calls = []
    original = positions_module.as_span

    def counting(pos):
        calls.append(1)
        return original(pos)

    monkeypatch.setattr(positions_module, "as_span", counting)
    p = Positions(torch.arange(5, 45)[None])
    assert p.span == Span(5, 40) and p.span == Span(5, 40) and p.offset == 5
    assert len(calls) == 1
    assert Positions(torch.tensor([[0, 1, 3]])).span is None


def test_distance_range_equals_brute_force():
    g = torch.Generator().manual_seed(3)
    qp = torch.randint(0, 50, (3, 7), generator=g)
    kp = torch.randint(-20, 30, (3, 11), generator=g)
    facts = CallPositions(Positions(qp), Positions(kp))
    # per batch row: the smallest and largest q - k over that row's pairs
    rows = [brute_range(qp[b : b + 1], kp[b : b + 1]) for b in range(3)]
    assert facts.distance_range == (min(r[0] for r in rows), max(r[1] for r in rows))
    assert not facts.batch_shared
    shared = CallPositions(Positions(torch.arange(3, 10)[None]), Positions(torch.arange(9)[None]))
    assert shared.distance_range == (3 - 8, 9 - 0) and shared.batch_shared
    floats = CallPositions(Positions(torch.rand(1, 4)), Positions(torch.rand(1, 4)))
    assert floats.distance_range is None
    empty = CallPositions(Positions(torch.zeros(1, 0, dtype=torch.long)), Positions(kp))
    assert empty.distance_range is None


def test_encodings_read_the_distance_range_from_their_context():
    enc = relpos.create("t5", num_heads=H, head_dim=D)
    q, k, v = qkv(2, 8, 12)
    pos = torch.tensor([[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], [1] * 12])
    call = prepare_call(
        q, k, v, enc, q_pos=pos[:, 4:], k_pos=pos, causal=True, mask=None, scale=None
    )
    assert call.ctx.positions is call.positions
    assert call.ctx.distance_range == brute_range(pos[:, 4:], pos)
