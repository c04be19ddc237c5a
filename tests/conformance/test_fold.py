"""Conformance: the ``fold`` backend (biases folded exactly into q/k channels) agrees with
``eager`` wherever it applies, and refuses by name where it does not.

``fold`` applies to encodings whose bias is exactly piecewise linear in ``q_pos - k_pos``
(``"fold" in supported_backends(enc)``, from ``DistanceBias.linear_pieces``); for them every
case below must equal eager in forward and gradients (q, k, v and the encoding's parameters),
dead rows give zeros with zero gradients, and half types match eager run in float32 as closely
as SDPA with a materialised bias does. Every other encoding must be refused by name, and
``auto`` must never pick ``fold`` for it.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import fold as fold_module
from relpos.attention import plan, supported_backends

from .common import B, D, H, assert_close_rel, attention, encoding_params, make_encoding

# (id, Lq, Lk, kv heads, causal): square, decoding-like Lq < Lk, dead rows Lq > Lk, GQA
CASES = [
    ("square", 12, 12, H, False),
    ("square-causal", 12, 12, H, True),
    ("lq<lk", 5, 13, H, False),
    ("lq<lk-causal", 5, 13, H, True),
    ("lq>lk-causal", 13, 5, H, True),
    ("gqa", 9, 11, 2, False),
    ("gqa-causal", 9, 11, 2, True),
    ("decode", 1, 9, H, True),
]


def _folds(name: str):
    enc = make_encoding(name)
    if "fold" not in supported_backends(enc):
        pytest.skip("no exact fold (refusal: test_fold_refuses_other_encodings_by_name)")
    return enc


def _run(enc, q, k, v, backend, **kw):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = attention(q, k, v, enc, backend=backend, **kw)
    wrt = [q, k, v, *(p for _, p in encoding_params(enc))]
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
    return out.detach(), [
        torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)
    ]


def _qkv(lq, lk, hkv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, lk, D, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, lk, D, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("blocks", ["one-block", "small-blocks"])
def test_fold_equals_eager_forward_and_gradients(name, blocks, monkeypatch):
    enc = _folds(name)
    if blocks == "small-blocks":  # many query blocks, band edges cut through tiles
        monkeypatch.setattr(fold_module, "FOLD_BLOCK_ROWS", 4)
    for case in CASES:
        if enc.causal_only and not case[-1]:
            continue
        _check_case(enc, case)


def _check_case(enc, case) -> None:
    label, lq, lk, hkv, causal = case
    q, k, v = _qkv(lq, lk, hkv)
    kw = {"causal": causal}
    if lq > lk:  # explicit positions: the defaults would start below 0
        kw.update(q_pos=torch.arange(lq), k_pos=torch.arange(lk) + (lq - lk))
    ref, ref_g = _run(enc, q, k, v, "eager", **kw)
    out, out_g = _run(enc, q, k, v, "fold", **kw)
    assert_close_rel(out, ref, msg=f"{label}: output")
    for n, (a, e) in enumerate(zip(out_g, ref_g, strict=True)):
        assert_close_rel(a, e, rtol=2e-5, msg=f"{label}: gradient {n}")
    if lq > lk:  # dead rows: zeros, and zero gradients there come from the eager agreement
        dead = torch.arange(lq) + (lk - lq) < 0
        assert (out[:, :, dead] == 0).all()


def test_fold_float64_matches_eager_to_rounding(name):
    enc = _folds(name).double()
    q, k, v = _qkv(7, 10, H, torch.float64)
    for causal in (False, True):
        if enc.causal_only and not causal:
            continue
        ref = attention(q, k, v, enc, causal=causal, backend="eager")
        out = attention(q, k, v, enc, causal=causal, backend="fold")
        assert_close_rel(out, ref, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fold_half_types_match_float32_like_a_materialised_bias(name, dtype):
    """Half-type folds split the key index into base-64 digits: their error against the
    float32 result is that of SDPA with the bias materialised in the same dtype."""
    enc = _folds(name)
    q, k, v = _qkv(40, 300, H, seed=1)
    causal = True
    with torch.no_grad():
        ref = attention(q, k, v, enc, causal=causal, backend="eager")
        low = [t.to(dtype) for t in (q, k, v)]
        out = attention(*low, enc, causal=causal, backend="fold").float()
        dense = attention(*low, enc, causal=causal, backend="sdpa").float()
    assert out.dtype == torch.float32
    assert (out - ref).abs().max() <= 2 * (dense - ref).abs().max() + 1e-3


def test_fold_refuses_masks_and_other_positions_by_name(name):
    enc = _folds(name)
    q, k, v = _qkv(6, 6, H)
    with pytest.raises(ValueError, match="fold.*mask"):
        attention(q, k, v, enc, backend="fold", mask=torch.ones(6, 6, dtype=torch.bool))
    batch = torch.stack([torch.arange(6), torch.arange(6) * 2])
    with pytest.raises(ValueError, match="fold.*range"):
        attention(q, k, v, enc, backend="fold", q_pos=batch, k_pos=batch)


def test_fold_refuses_other_encodings_by_name(name):
    enc = make_encoding(name)
    if "fold" in supported_backends(enc):
        pytest.skip("folds exactly")
    q, k, v = _qkv(6, 6, H)
    with pytest.raises(ValueError, match="backend 'fold' cannot run"):  # before any input check
        relpos.attention(q, k, v, enc, backend="fold", causal=True)


def test_auto_picks_fold_only_for_exact_folds(name):
    enc = make_encoding(name)
    if not enc.has_bias:
        pytest.skip("fold folds biases only")
    q, k, v = _qkv(12, 12, H)
    causal = True
    try:
        backend, _ = plan(q, k, v, enc, **_kw(enc, causal))
    except ValueError as e:  # needs inputs the suite adds; covered elsewhere
        pytest.skip(str(e))
    if backend == "fold":
        assert "fold" in supported_backends(enc)


def _kw(enc, causal):
    from .common import _adapt

    return _adapt(enc, torch.zeros(B, H, 12, D), torch.zeros(B, H, 12, D), {"causal": causal})
