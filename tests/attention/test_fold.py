"""Folded biases (FlashBias, arXiv 2505.12044): the exact ALiBi folds against the
materialised bias, the bf16 digit split, the log-sum-exp merge with its row correction,
gradients, auto's rounding rule, and the low-rank folds with their weight error."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.attention import fold as fold_module
from relpos.attention import plan
from relpos.attention.api import facts
from relpos.attention.fold import folded_attention, low_rank_fold, position_digits


def alibi(slopes, form=False, dtype=torch.float32):
    enc = relpos.create("alibi", num_heads=len(slopes), head_dim=8, bidirectional=form)
    enc._slopes.copy_(torch.tensor(slopes))
    return enc.to(dtype)


def dense(q, k, v, bias, causal):
    """SDPA with the bias materialised (``-inf`` above the diagonal when causal)."""
    L = q.shape[2]
    if causal:
        bias = bias.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))


def qkv(L, H, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, L, D, generator=g).to(dtype) for _ in range(3)]


def test_causal_alibi_fold_equals_the_materialised_bias_and_the_flipped_sign_does_not():
    """Spec check (1): L = 257 (odd, not a block multiple), fp32: below 1e-5. FlashBias'
    example folds +m (i - j) (q_bias [m, m i], k_bias [-j, 1]): it must fail."""
    slopes = [0.5, 1 / 16]
    q, k, v = qkv(257, 2)
    i = torch.arange(257)
    d = (i[:, None] - i[None, :]).float()
    m = torch.tensor(slopes)[:, None, None]
    ref = dense(q, k, v, -m * d, causal=True)
    out = relpos.attention(q, k, v, alibi(slopes), causal=True, backend="fold")
    assert (out - ref).abs().max() < 1e-5
    flipped = dense(q, k, v, m * d, causal=True)
    assert (flipped - ref).abs().max() > 0.1


def test_symmetric_alibi_two_passes_equal_dense_and_need_the_row_correction(monkeypatch):
    """Spec check (3): two passes merged by log-sum-exp == dense within 1e-5 (fp32),
    including the last row, whose anticausal pass is empty; dropping the row correction
    is far off."""
    monkeypatch.setattr(fold_module, "FOLD_BLOCK_ROWS", 64)  # several blocks
    slopes = [0.25, 1 / 64]
    q, k, v = qkv(257, 2, seed=1)
    i = torch.arange(257)
    d = (i[:, None] - i[None, :]).float()
    ref = dense(q, k, v, -torch.tensor(slopes)[:, None, None] * d.abs(), causal=False)
    enc = alibi(slopes, form=True)
    assert plan(q, k, v, enc, backend="fold") == ("fold", "fold-passes")
    out = relpos.attention(q, k, v, enc, backend="fold")
    assert (out - ref).abs().max() < 1e-5
    assert (out[:, :, -1] - ref[:, :, -1]).abs().max() < 1e-5
    original = fold_module._fold_passes

    def without_correction(call):
        passes, k_t, v_t, dv = original(call)
        for p in passes:
            p.corr = torch.zeros_like(p.corr)
        return passes, k_t, v_t, dv

    monkeypatch.setattr(fold_module, "_fold_passes", without_correction)
    wrong = relpos.attention(q, k, v, enc, backend="fold")
    assert (wrong - ref).abs().max() > 0.1


def test_bf16_fold_splits_positions_into_digits():
    """Spec check (2) at a shorter length (L = 1024 > 256, where bf16 no longer holds j):
    the digit split errs like SDPA with a bf16 materialised bias; one bf16 position channel
    errs many times more (3.7 at L = 4096: the slow test)."""
    L, slopes = 1024, [0.5, 1 / 64]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 64) for _ in range(3))
    enc = alibi(slopes)
    with torch.no_grad():
        ref = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
        low = [t.bfloat16() for t in (q, k, v)]
        split = relpos.attention(*low, enc, causal=True, backend="fold").float()
        bias_bf16 = relpos.attention(*low, enc, causal=True, backend="sdpa").float()
        c = (enc.slopes * 8).bfloat16()[None, :, None, None].expand(1, 2, L, 1)
        j = torch.arange(L).bfloat16()[None, None, :, None].expand(1, 2, L, 1)
        naive = F.scaled_dot_product_attention(
            torch.cat([low[0], c], -1), torch.cat([low[1], j], -1),
            F.pad(low[2], (0, 1)), is_causal=True, scale=1 / 8,
        )[..., :64].float()  # fmt: skip
    err_split = (split - ref).abs().max()
    err_dense = (bias_bf16 - ref).abs().max()
    assert err_split <= 1.5 * err_dense
    assert (naive - ref).abs().max() > 10 * err_split


@pytest.mark.slow
def test_bf16_spec_values_at_4096():
    """Reference check: L = 4096, d = 64, H = 2, m = 1/2, 1/64, seed 0, q, k, v ~ N(0, 1) in
    that order: split fold 0.014 / 0.008, equal to bf16 SDPA with a materialised bias."""
    L = 4096
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 64) for _ in range(3))
    enc = alibi([0.5, 1 / 64])
    with torch.no_grad():
        ref = relpos.attention(q, k, v, enc, causal=True, backend="chunked")
        split = relpos.attention(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), enc, causal=True, backend="fold"
        )
    err = (split.float() - ref).abs().amax((0, 2, 3))
    torch.testing.assert_close(err, torch.tensor([0.014, 0.0083]), rtol=0.05, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_position_digits_reconstruct_the_index_exactly(dtype):
    j = torch.arange(0, 300_000, 7)
    channels, weights = position_digits(j, dtype)
    assert channels.dtype == dtype
    if dtype == torch.float32:
        assert channels.shape[1] == 1  # exact below 2^24
    else:
        assert channels.shape[1] == 4  # 64^3 < 300,000 < 64^4
    back = (channels.double() * weights).sum(-1)  # the query side multiplies by weights
    assert torch.equal(back, j.double())


@pytest.mark.parametrize("form", ["symmetric", "shifted"])
def test_multi_pass_fold_gradcheck_in_float64(form, monkeypatch):
    """The merged passes' backward (flash backward per pass with the merged log-sum-exp,
    row terms through their own gradient) against finite differences, learnable slopes
    included."""
    monkeypatch.setattr(fold_module, "FOLD_BLOCK_ROWS", 3)
    enc = relpos.create("alibi", num_heads=2, head_dim=2, bidirectional=form,
                        learnable_slopes=True).double()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 2, generator=g, dtype=torch.float64) for _ in range(3))
    params = [t.requires_grad_() for t in (q, k, v)]
    slopes = list(enc.parameters())
    out = relpos.attention(*params, enc, backend="fold")
    ref = relpos.attention(*params, enc, backend="eager")
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda q, k, v: relpos.attention(q, k, v, enc, backend="fold"), params, fast_mode=True
    )
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    ge = torch.autograd.grad((ref * w).sum(), slopes)
    gf = torch.autograd.grad((relpos.attention(*params, enc, backend="fold") * w).sum(), slopes)
    for a, b in zip(gf, ge, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_auto_keeps_long_steep_folds_off_by_their_rounding_bound():
    """The folded logit carries the dropped row term: in fp32 its rounding grows like
    max slope * L / 2. The fold is a candidate of auto while that is within
    FOLD_LOGIT_TOLERANCE (1e-4 nats)."""
    enc = relpos.create("alibi", num_heads=8, head_dim=2)  # steepest slope 1/2
    short = torch.zeros(1, 8, 4096, 2, requires_grad=True)
    long = torch.zeros(1, 8, 8192, 2, requires_grad=True)
    assert "fold" in facts(short, short, short, enc, causal=True).candidates
    assert "fold" not in facts(long, long, long, enc, causal=True).candidates
    assert plan(long, long, long, enc, causal=True) == ("chunked", "toeplitz")
    wide = long.detach().double().requires_grad_()
    assert "fold" in facts(wide, wide, wide, enc, causal=True).candidates


def test_low_rank_fold_reports_the_weight_error_that_the_bias_error_hides():
    """A steep ALiBi head without a causal mask: a small bias error (relative Frobenius)
    hides a large error in the attention weights (reference: 0.84 at L = 1024, rank 8;
    here L = 128). Smooth heads fold well; more rank helps."""
    enc = alibi([0.5, 1 / 256], form=True)
    f8 = low_rank_fold(enc, 128, rank=8)
    f16 = low_rank_fold(enc, 128, rank=16)
    assert f8.rank == 8 and f8.u.shape == (2, 128, 8) and f8.w.shape == (2, 128, 8)
    steep, smooth = f8.weight_error
    assert steep > 0.3 and f8.bias_error[0] < 0.1  # the bias error hides it
    assert smooth < 0.01
    assert (f16.weight_error <= f8.weight_error + 1e-6).all()
    assert "weight_error" in repr(f8)


def test_low_rank_folded_attention_errs_within_its_weight_error():
    """With zero content logits the output error is bounded by 2 TV max|v| per row."""
    enc = relpos.create("t5", num_heads=2, head_dim=8).requires_grad_(False)
    with torch.no_grad():
        enc.table.copy_(torch.randn_like(enc.table))
    L = 96
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 2, L, 8)
    v = torch.randn(1, 2, L, 8, generator=g)
    fold = low_rank_fold(enc, L, rank=12)
    out = folded_attention(q, q, v, enc, rank=12)
    ref = relpos.attention(q, q, v, enc, backend="eager")
    bound = 2 * fold.weight_error.max() * v.abs().max()
    assert (out - ref).abs().max() <= bound + 1e-5


def test_fourier_fold_of_a_causal_kerple_head():
    """A mass-weighted Fourier fit suits causal smooth heads (KERPLE-log 1, 1 at
    L = 1024: TV 0.26 / 0.14 / 0.04 for rank 7 / 15 / 31); more frequencies, less error."""
    enc = relpos.create("kerple-log", num_heads=1, head_dim=8)
    e = [float(low_rank_fold(enc, 256, rank=r, method="fourier", causal=True).weight_error[0])
         for r in (8, 32)]  # fmt: skip
    assert e[1] < e[0] < 1


def test_folded_attention_refuses_inexact_folds_unless_rank_is_given():
    enc = relpos.create("t5", num_heads=2, head_dim=8)
    q = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match="rank=r"):
        folded_attention(q, q, q, enc)
    with pytest.raises(ValueError, match="torch.no_grad"):  # its table would get no gradient
        folded_attention(q, q, q, enc, rank=4)
    with torch.no_grad():
        assert folded_attention(q, q, q, enc, rank=4).shape == (1, 2, 10, 8)
    exact = folded_attention(q, q, q, relpos.create("alibi", num_heads=2, head_dim=8))
    ref = relpos.attention(q, q, q, relpos.create("alibi", num_heads=2, head_dim=8))
    torch.testing.assert_close(exact, ref)
    with pytest.raises(ValueError, match="rank"):
        low_rank_fold(enc, 10, rank=0)
    with pytest.raises(ValueError, match="method"):
        low_rank_fold(enc, 10, rank=2, method="wavelet")


@pytest.mark.slow
def test_low_rank_svd_weight_errors_match_the_spec_table():
    """Reference table (computed independently in float64; L = 1024, non-causal ALiBi, SVD):
    m = 1/2: 0.84 / 0.68 / 0.50, m = 1/16: 0.30 / 0.18 / 0.09, m = 1/256: 0.013 / 0.005 / 0.002
    at rank 8 / 16 / 32."""
    enc = alibi([0.5, 1 / 16, 1 / 256], form=True)
    expected = {8: [0.84, 0.30, 0.013], 16: [0.68, 0.18, 0.005], 32: [0.50, 0.09, 0.002]}
    for rank, values in expected.items():
        got = low_rank_fold(enc, 1024, rank=rank).weight_error
        torch.testing.assert_close(got, torch.tensor(values), rtol=0.1, atol=0.0005)
