"""``piecewise_sdpa_attention``: the fused evaluation of the RoPE schedules equals the engine's
probability path (``eager``), forward and backward, on all three of its layouts (per-pair
slots, segment slots, log-sum-exp merge), and each encoding's ``key_segments`` agree with its
``piece_index``."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import piecewise
from relpos.attention.call import prepare_call
from relpos.attention.eager import eager_attention
from relpos.encodings.base import BiasContext
from relpos.encodings.rotary import schedules as rs

OPTIONS = {
    "dca": {"pretraining_length": 16},
    "lm-infinite": {"local_branch": 8, "global_branch": 3, "limit_distance": 6},
    "lm-infinite-limit<local": {"local_branch": 8, "global_branch": 3, "limit_distance": 5},
    "self-extend": {"group_size": 4, "neighbor_window": 6},
}


def make(key: str, **extra):
    name = key.split("-limit")[0]
    return relpos.create(name, num_heads=4, head_dim=16, **OPTIONS[key], **extra)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(piecewise, "PIECEWISE_MIN_ROWS", 7)  # several blocks, not chunk-aligned
    monkeypatch.setattr(piecewise, "PIECEWISE_BLOCK_ELEMENTS", 7 * 48)


CASES = {
    "arange": dict(lq=48, hkv=4),
    "gqa-lq<lk": dict(lq=20, hkv=2),
    "offset": dict(lq=30, hkv=2, pos=torch.arange(400, 448)),
    "negative": dict(lq=48, hkv=1, pos=torch.arange(-9, 39)),
    "batchpos": dict(lq=48, hkv=2, pos="batch"),
    "mask": dict(lq=48, hkv=2, mask=True),
    "decode-noncausal": dict(lq=1, hkv=2, causal=False),
}


def inputs(case: dict, grad: bool):
    gen = torch.Generator().manual_seed(0)
    lq, hkv = case["lq"], case["hkv"]
    q = torch.randn(2, 4, lq, 16, generator=gen).requires_grad_(grad)
    k = torch.randn(2, hkv, 48, 16, generator=gen).requires_grad_(grad)
    v = torch.randn(2, hkv, 48, 16, generator=gen).requires_grad_(grad)
    kw = dict(q_pos=None, k_pos=None, mask=None, causal=case.get("causal", True))
    pos = case.get("pos")
    if isinstance(pos, str):
        pos = torch.randint(1, 3, (2, 48), generator=gen).cumsum(1)
    if pos is not None:
        kw["k_pos"], kw["q_pos"] = pos, pos[..., 48 - lq :]
    if case.get("mask"):
        m = torch.rand(2, 1, 1, 48, generator=gen) > 0.3
        m[..., 0] = True
        kw["mask"] = m
    return q, k, v, kw


GRAD_CASES = ("arange", "gqa-lq<lk", "batchpos", "mask")  # one per layout, with gradients


@pytest.mark.parametrize(
    "case,grad",
    [(c, False) for c in CASES] + [(c, True) for c in GRAD_CASES],
    ids=[c for c in CASES] + [f"{c}-grad" for c in GRAD_CASES],
)
@pytest.mark.parametrize("key", list(OPTIONS))
def test_fast_path_equals_eager(key, case, grad):
    enc = make(key)
    q, k, v, kw = inputs(CASES[case], grad)
    results = []
    for fn in (eager_attention, piecewise.piecewise_sdpa_attention):
        with torch.set_grad_enabled(grad):
            out = fn(prepare_call(q, k, v, enc, scale=None, **kw))
        grads = ()
        if grad:
            weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        results.append((out.detach(), grads))
    (ref, ref_grads), (out, grads) = results
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", list(OPTIONS))
def test_key_segments_agree_with_piece_index(key):
    enc = make(key)
    keys = torch.arange(-5, 60)
    for first, last in [
        (0, 0),
        (3, 9),
        (10, 19),
        (20, 29),
        (31, 38),
        (17, 40),
        (41, 59),
        (-5, 2),
        (-10, -3),
    ]:
        q = torch.arange(first, last + 1)
        ctx = BiasContext(q[None], keys[None])
        z = torch.zeros(1, 1, 1, 1, dtype=torch.long)
        i = torch.arange(q.numel())[None, None, :, None]
        j = torch.arange(keys.numel())[None, None, None, :]
        expected = enc.piece_index(ctx, z, z, i, j)[0, 0]
        got = torch.full_like(expected, -1)
        d = keys[None, :] - q[:, None]
        if isinstance(enc, rs.DualChunkAttention) and enc.next_break(first) <= last:
            continue  # DCA blocks never cross a chunk boundary
        for seg in enc.key_segments(first, last):
            inside = torch.ones_like(d, dtype=torch.bool)
            if seg.lo is not None:
                inside &= keys[None, :] >= seg.lo
            if seg.hi is not None:
                inside &= keys[None, :] < seg.hi
            if seg.d_min is not None:
                inside &= d >= seg.d_min
            if seg.d_max is not None:
                inside &= d <= seg.d_max
            assert not (inside & (got >= 0)).any(), "segments overlap"
            got = torch.where(inside, seg.piece, got)
        assert torch.equal(got, expected), (first, last)


def test_dca_blocks_end_at_chunk_boundaries():
    enc = make("dca")  # chunk length 10
    assert [enc.next_break(p) for p in (0, 9, 10, 25, -1)] == [10, 10, 20, 30, 0]


def test_fast_path_refuses_other_hooks():
    enc = make("dca")
    q = torch.randn(1, 4, 8, 16)
    call = prepare_call(q, q, q, enc, q_pos=None, k_pos=None, causal=True, mask=None, scale=None)
    out = piecewise.piecewise_sdpa_attention(call)
    assert out.shape == (1, 4, 8, 16)
    bias_enc = relpos.create("alibi", num_heads=4, head_dim=16)
    call2 = prepare_call(
        q, q, q, bias_enc, q_pos=None, k_pos=None, causal=True, mask=None, scale=None
    )
    call2.pieces = call.pieces
    with pytest.raises(ValueError, match="piecewise logits only"):
        piecewise.piecewise_sdpa_attention(call2)


@pytest.mark.parametrize(
    "name", [n for n in relpos.available() if relpos.encoding_class(n).piecewise]
)
def test_values_of_another_head_size_run_on_the_piecewise_kernel(name):
    """The CPU flash kernel of the log-sum-exp merge takes one head size for q, k and v; values
    of another width (the atlas's identity values) take the slot path and stay exact."""
    cls = relpos.encoding_class(name)
    options = cls.example_options()
    enc = relpos.create(name, num_heads=2, head_dim=16, **options)
    if enc.selects:
        pytest.skip("selecting schedules run on the probability path")
    length = 40
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, length, 16, generator=gen) for _ in range(2))
    v = torch.eye(length).expand(1, 2, length, length).contiguous()
    with torch.no_grad():
        out = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
        ref = relpos.attention(q, k, v, enc, causal=True, backend="eager")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
