"""Kernelized attention with a Toeplitz RPE by FFT (Luo et al. 2021, arXiv 2106.12566).

The FFT path is exact for the kernelized model: it is compared with the O(L^2) kernelized
reference (``A = (phi_q phi_k^T) * C``), never with softmax attention.
"""

from __future__ import annotations

import pytest
import torch

from relpos.attention.linear import kernelized
from relpos.attention.linear.kernelized import (
    choose_fft_dtype,
    geometric_halves,
    kernelized_attention,
    kernelized_reference,
    row_gaps,
    toeplitz_matvec,
)

# the reference case: b_t = -0.1|t| + 0.05 t with t = j - i (key minus query);
# the table is indexed by the index distance d = i - j = -t
DIST = torch.arange(-3, 4, dtype=torch.float64)
ASYM = -0.1 * DIST.abs() - 0.05 * DIST
PHI_Q = torch.tensor([[1, 0.5], [0.2, 1], [0.7, 0.3], [0.4, 0.9]], dtype=torch.float64)
PHI_K = torch.tensor([[0.3, 1], [1, 0.1], [0.5, 0.5], [0.8, 0.2]], dtype=torch.float64)
V = torch.tensor([1.0, 2, 3, 4], dtype=torch.float64)


def causal_table(table: torch.Tensor, lq: int) -> torch.Tensor:
    """``-inf`` at future index distances (entries ``t < Lq - 1``)."""
    return table.masked_fill(torch.arange(table.shape[-1]) < lq - 1, float("-inf"))


def run(table, causal, method="auto"):
    out, _ = kernelized_attention(
        PHI_Q[None, None],
        PHI_K[None, None],
        V[None, None, :, None],
        table=table,
        causal=causal,
        method=method,
    )
    return out.flatten()


def test_toeplitz_matvec_matches_the_spec_values_and_catches_the_transposed_bug():
    x = torch.tensor([1.0, 2, 3, 4], dtype=torch.float64)[:, None]
    y = toeplitz_matvec(torch.exp(ASYM), x).flatten()
    expected = torch.tensor([9.059803, 9.333746, 9.267152, 8.701389], dtype=torch.float64)
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=0)
    wrong = toeplitz_matvec(torch.exp(ASYM.flip(0)), x).flatten()  # c_{i-j}: the plausible bug
    torch.testing.assert_close(
        wrong,
        torch.tensor([7.494383, 8.496626, 9.250128, 9.524071], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    symmetric = toeplitz_matvec(torch.exp(-0.1 * DIST.abs()), x).flatten()
    expected = torch.tensor([8.22914, 8.894273, 9.247755, 9.092792], dtype=torch.float64)
    torch.testing.assert_close(symmetric, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["auto", "fft"])
def test_kernelized_attention_matches_the_spec_values(method):
    """The reference tables decay geometrically on both sides: ``auto`` runs the decayed scan,
    ``fft`` the FFT; both give the reference values."""
    assert geometric_halves(ASYM[None], 4, 4, causal=False) is not None
    bidirectional = torch.tensor([2.439077, 2.146939, 2.621074, 2.438567], dtype=torch.float64)
    causal = torch.tensor([1.0, 1.247453, 2.081123, 2.438567], dtype=torch.float64)
    torch.testing.assert_close(run(ASYM[None], False, method), bidirectional, atol=1e-6, rtol=0)
    got = run(causal_table(ASYM[None], 4), True, method)
    torch.testing.assert_close(got, causal, atol=1e-6, rtol=0)
    sym = causal_table((-0.1 * DIST.abs())[None], 4)
    expected = torch.tensor([1.0, 1.23826, 2.052245, 2.370835], dtype=torch.float64)
    torch.testing.assert_close(run(sym, True, method), expected, atol=1e-6, rtol=0)


def _random(B, H, lq, lk, m, dv, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pq = torch.rand(B, H, lq, m, generator=gen, dtype=dtype)
    pk = torch.rand(B, H, lk, m, generator=gen, dtype=dtype)
    v = torch.randn(B, H, lk, dv, generator=gen, dtype=dtype)
    table = -0.3 * torch.rand(H, lq + lk - 1, generator=gen, dtype=torch.float64).cumsum(-1)
    table = (table - table[:, lk - 1 : lk]).abs().neg() + 0.2 * torch.randn(
        H, lq + lk - 1, generator=gen, dtype=torch.float64
    )
    return pq, pk, v, table.to(dtype)


@pytest.mark.parametrize("n", [1, 7, 64, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_fft_path_equals_the_dense_kernelized_reference(n, causal):
    pq, pk, v, table = _random(1, 2, n, n, 4, 3)
    if causal:
        table = causal_table(table, n)
    out, _ = kernelized_attention(pq, pk, v, table=table, causal=causal)
    ref = kernelized_reference(pq.double(), pk.double(), v.double(), table=table, causal=causal)
    torch.testing.assert_close(out.double(), ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("lq,lk", [(3, 11), (11, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_fft_path_with_fewer_or_more_queries_than_keys(lq, lk, causal):
    """Bottom-right causal alignment; with Lq > Lk causal the first rows see no key: 0."""
    pq, pk, v, table = _random(2, 2, lq, lk, 3, 2, dtype=torch.float64)
    if causal:
        table = causal_table(table, lq)
    out, _ = kernelized_attention(pq, pk, v, table=table, causal=causal)
    ref = kernelized_reference(pq, pk, v, table=table, causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    if causal and lq > lk:
        assert (out[:, :, : lq - lk] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_scan_and_sum_paths_without_a_table_equal_the_reference(causal):
    for lq, lk in ((9, 9), (4, 9), (9, 4), (300, 300)):
        pq, pk, v, _ = _random(2, 2, lq, lk, 5, 3, dtype=torch.float64)
        out, _ = kernelized_attention(pq, pk, v, causal=causal)
        ref = kernelized_reference(pq, pk, v, causal=causal)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_reference_in_float64(table, causal):
    pq, pk, v, t = _random(1, 2, 6, 6, 3, 2, dtype=torch.float64)
    t = causal_table(t, 6) if causal else t
    args = [x.clone().requires_grad_() for x in (pq, pk, v, t)]
    ref_args = [x.clone().requires_grad_() for x in (pq, pk, v, t)]

    def loss(fn, a):
        kw = {"table": a[3]} if table else {}
        out = fn(a[0], a[1], a[2], causal=causal, **kw)
        out = out[0] if isinstance(out, tuple) else out
        return (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()

    grads = torch.autograd.grad(loss(kernelized_attention, args), args, allow_unused=True)
    ref = torch.autograd.grad(loss(kernelized_reference, ref_args), ref_args, allow_unused=True)
    for g, r in zip(grads, ref, strict=True):
        if r is None:
            assert g is None or (g == 0).all()
            continue
        torch.testing.assert_close(
            torch.nan_to_num(g, posinf=0, neginf=0),
            torch.nan_to_num(r, posinf=0, neginf=0),
            atol=1e-10,
            rtol=1e-8,
        )


def test_feature_chunks_give_the_same_result(monkeypatch):
    """The numerator is formed in feature chunks (bounded memory): any chunking agrees."""
    pq, pk, v, table = _random(1, 2, 40, 40, 6, 3, dtype=torch.float64)
    whole, _ = kernelized_attention(pq, pk, v, table=table)
    monkeypatch.setattr(kernelized, "CHUNK_ELEMENTS", 1)
    one_feature, _ = kernelized_attention(pq, pk, v, table=table)
    torch.testing.assert_close(one_feature, whole, atol=1e-13, rtol=0)


def test_key_padding_zeroes_the_features_of_padded_keys():
    pq, pk, v, table = _random(2, 2, 10, 10, 3, 2, dtype=torch.float64)
    valid = torch.ones(2, 1, 10, dtype=torch.bool)
    valid[0, 0, 6:] = False
    valid[1, 0, :3] = False  # causal rows 0..2 of batch 1 see no valid key: 0
    for t, causal in ((table, False), (causal_table(table, 10), True), (None, True), (None, False)):
        out, _ = kernelized_attention(pq, pk, v, table=t, causal=causal, key_valid=valid)
        ref = kernelized_reference(pq, pk, v, table=t, causal=causal, key_valid=valid)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
        if causal:
            assert (out[1, :, :3] == 0).all()


def test_rows_without_a_key_give_zero_with_zero_gradients():
    pq, pk, v, table = _random(1, 1, 6, 2, 3, 2)
    pq.requires_grad_()
    out, _ = kernelized_attention(pq, pk, v, table=causal_table(table, 6), causal=True)
    (g,) = torch.autograd.grad(out[:, :, :4].sum(), [pq])
    assert (out[:, :, :4] == 0).all() and (g == 0).all()


def test_large_biases_do_not_overflow():
    """``c = exp(b)``: the table's maximum is subtracted (z is invariant to it)."""
    pq, pk, v, table = _random(1, 2, 20, 20, 3, 2, dtype=torch.float64)
    out, _ = kernelized_attention(pq, pk, v, table=table + 1000.0)
    ref, _ = kernelized_attention(pq, pk, v, table=table)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_fft_dtype_follows_the_rounding_bound_of_each_row():
    flat = torch.zeros(2, 63)
    assert choose_fft_dtype(flat, 32, torch.float32) == torch.float32
    assert choose_fft_dtype(flat, 32, torch.float64) == torch.float64
    assert choose_fft_dtype(torch.zeros(1, 2 * 9000 - 1), 9000, torch.float32) == torch.float64
    # ALiBi-like decay: the maximum (distance 0) is seen by every row, whatever the span
    d = torch.arange(-31, 32, dtype=torch.float64)
    assert row_gaps(-0.5 * d.abs()[None], 32).abs().max() == 0
    assert choose_fft_dtype(-0.5 * d.abs()[None], 32, torch.float32) == torch.float32
    # a bias that grows toward distances only the last rows see: early rows are far below
    grows = torch.where(d > 20, 30.0 + d, torch.zeros_like(d))[None]
    assert float(row_gaps(grows, 32).max()) > 40
    with pytest.raises(ValueError, match="cannot be computed by FFT"):
        choose_fft_dtype(grows, 32, torch.float32)
    moderate = torch.where(d > 20, torch.full_like(d, 5.0), torch.zeros_like(d))[None]
    assert choose_fft_dtype(moderate, 32, torch.float32) == torch.float64


def test_float32_fft_is_accurate_at_a_thousand_tokens_with_alibi():
    n = 1000
    d = torch.arange(-(n - 1), n, dtype=torch.float64)
    table = causal_table((-0.25 * d.abs())[None].expand(2, -1), n)
    pq, pk, v, _ = _random(1, 2, n, n, 4, 3)
    out, _ = kernelized_attention(pq, pk, v, table=table.float(), causal=True, method="fft")
    ref = kernelized_reference(pq.double(), pk.double(), v.double(), table=table, causal=True)
    torch.testing.assert_close(out.double(), ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


def _alibi_like(lq, lk, slopes, behind=None, causal=True):
    """``-s d`` at or before the query, ``b(-1) - s' (|d| - 1)`` after it (``d`` in key
    coordinates), ``-inf`` after it when causal."""
    d = torch.arange(lq + lk - 1, dtype=torch.float64) - (lq - 1)
    s = torch.tensor(slopes, dtype=torch.float64)[:, None]
    s2 = s if behind is None else torch.tensor(behind, dtype=torch.float64)[:, None]
    table = torch.where(d >= 0, -s * d, -0.7 - s2 * (d.abs() - 1))
    return table.masked_fill(d < 0, float("-inf")) if causal else table


def test_geometric_tables_are_recognised_and_others_are_not():
    assert geometric_halves(_alibi_like(9, 9, [0.5, 0.0]), 9, 9, causal=True) is not None
    both = geometric_halves(_alibi_like(9, 9, [0.5, 0.1], [0.2, 0.3], causal=False), 9, 9, False)
    assert both is not None
    torch.testing.assert_close(both[0], torch.tensor([-0.5, -0.1], dtype=torch.float64))
    torch.testing.assert_close(both[1], torch.tensor([-0.2, -0.3], dtype=torch.float64))
    torch.testing.assert_close(both[2], torch.full((2,), -0.7, dtype=torch.float64))
    d = torch.arange(17, dtype=torch.float64) - 8
    kerple = -torch.log1p(d.abs())[None]  # not affine in d
    assert geometric_halves(kerple, 9, 9, causal=False) is None
    growing = (0.1 * d)[None]  # grows with the distance: no decay
    assert geometric_halves(growing, 9, 9, causal=False) is None
    assert geometric_halves(_alibi_like(9, 4, [0.5]), 9, 4, causal=True) is None  # Lq > Lk


@pytest.mark.parametrize("lq,lk,causal", [(30, 30, True), (30, 30, False), (7, 30, True)])
def test_decayed_scan_equals_the_reference(lq, lk, causal):
    pq, pk, v, _ = _random(2, 2, lq, lk, 4, 3, dtype=torch.float64)
    table = _alibi_like(lq, lk, [0.5, 0.03], [0.2, 0.0], causal=causal)
    out, _ = kernelized_attention(pq, pk, v, table=table, causal=causal)
    ref = kernelized_reference(pq, pk, v, table=table, causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-13, rtol=1e-11)


def test_decayed_scan_does_not_underflow_or_overflow_for_steep_slopes_in_float32():
    """``g^(i-j)`` is formed inside chunks and carried across them; ``g^(-j)`` never is."""
    n = 1200  # 0.5 * n = 600 nats: g^n underflows float32 (below e^-104)
    table = _alibi_like(n, n, [0.5, 2.0**-8]).float()
    pq, pk, v, _ = _random(1, 2, n, n, 3, 2)
    out, _ = kernelized_attention(pq, pk, v, table=table, causal=True)
    assert torch.isfinite(out).all()
    rows = slice(n - 40, n)  # the last rows against the dense reference
    ref = kernelized_reference(
        pq.double(), pk.double(), v.double(), table=table.double(), causal=True
    )
    torch.testing.assert_close(out[:, :, rows].double(), ref[:, :, rows], atol=1e-5, rtol=1e-5)
