"""relpos.interop.rope_layout: q/k rows between interleaved and half-split RoPE.

The reference permutations are written out here (the pair permutation ``perm`` and the
un-permute of llama.cpp's GGUF converter, ``convert_hf_to_gguf.py``), never taken from relpos.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.interop.rope_layout import (
    half_to_interleaved,
    interleaved_to_half,
    interleaved_to_half_permutation,
)


def _gguf_unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's un-permute: ``w.reshape(n_head, d_head//2, 2, d_in).swapaxes(1, 2)``."""
    d_head = w.shape[0] // n_head
    tail = w.shape[1:]
    return w.reshape(n_head, d_head // 2, 2, *tail).swapaxes(1, 2).reshape(w.shape)


def test_permutation_is_the_spec_p1_perm():
    assert interleaved_to_half_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert interleaved_to_half_permutation(8, rotary_dim=4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]


def test_spec_p1_identity_half_of_permuted_equals_permuted_interleaved():
    # half(x[perm]) == interleaved(x)[perm]
    x = torch.randn(1, 1, 5, 8)
    pos = torch.arange(3, 8)[None]
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])
    half = relpos.create("rope", num_heads=1, head_dim=8, layout="half")
    inter = relpos.create("rope", num_heads=1, head_dim=8, layout="interleaved")
    torch.testing.assert_close(
        half.rotate(x[..., perm], pos, "q"), inter.rotate(x, pos, "q")[..., perm]
    )


@pytest.mark.parametrize("n_head,d_head,d_in", [(9, 64, 576), (3, 64, 576), (2, 8, 5)])
def test_matches_gguf_unpermute_formula(n_head, d_head, d_in):
    w = torch.randn(n_head * d_head, d_in)
    torch.testing.assert_close(interleaved_to_half(w, n_head, d_head), _gguf_unpermute(w, n_head))
    b = torch.randn(n_head * d_head)
    torch.testing.assert_close(interleaved_to_half(b, n_head, d_head), _gguf_unpermute(b, n_head))


@pytest.mark.parametrize("rotary_dim", [None, 8, 16])
def test_round_trip_is_identity(rotary_dim):
    w = torch.randn(3 * 16, 7)
    b = torch.randn(3 * 16)
    for t in (w, b):
        there = interleaved_to_half(t, 3, 16, rotary_dim)
        assert not torch.equal(there, t)
        assert torch.equal(half_to_interleaved(there, 3, 16, rotary_dim), t)
        assert torch.equal(
            interleaved_to_half(half_to_interleaved(t, 3, 16, rotary_dim), 3, 16, rotary_dim), t
        )


def _project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, heads: int, d: int) -> torch.Tensor:
    """``x (B, L, in) @ w.T + b`` as ``(B, H, L, d)``."""
    y = x @ w.T + b
    return y.reshape(x.shape[0], x.shape[1], heads, d).transpose(1, 2)


@pytest.mark.parametrize(
    "heads,kv_heads,d,partial",
    [(4, 4, 16, 1.0), (4, 2, 16, 1.0), (2, 2, 32, 0.5), (3, 1, 24, 0.25)],
)
def test_scores_of_interleaved_rope_equal_half_rope_with_converted_weights(
    heads, kv_heads, d, partial
):
    torch.manual_seed(0)
    d_in, length = 20, 11
    x = torch.randn(2, length, d_in, dtype=torch.float64)
    wq = torch.randn(heads * d, d_in, dtype=torch.float64)
    wk = torch.randn(kv_heads * d, d_in, dtype=torch.float64)
    bq = torch.randn(heads * d, dtype=torch.float64)
    bk = torch.randn(kv_heads * d, dtype=torch.float64)
    r = int(d * partial)
    rotary_dim = None if partial == 1.0 else r
    inter = relpos.create(
        "rope", num_heads=heads, head_dim=d, layout="interleaved", partial_rotary_factor=partial
    )
    half = relpos.create(
        "rope", num_heads=heads, head_dim=d, layout="half", partial_rotary_factor=partial
    )
    assert inter.rotary_dim == half.rotary_dim == r
    pos = torch.arange(100, 100 + length)

    def scores(enc, wq, bq, wk, bk):
        q, k = _project(x, wq, bq, heads, d), _project(x, wk, bk, kv_heads, d)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        return relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)

    reference = scores(inter, wq, bq, wk, bk)
    converted = scores(
        half,
        interleaved_to_half(wq, heads, d, rotary_dim),
        interleaved_to_half(bq, heads, d, rotary_dim),
        interleaved_to_half(wk, kv_heads, d, rotary_dim),
        interleaved_to_half(bk, kv_heads, d, rotary_dim),
    )
    torch.testing.assert_close(converted, reference, rtol=1e-5, atol=1e-4)
    # Without conversion the layouts disagree: the test can fail.
    assert not torch.allclose(scores(half, wq, bq, wk, bk), reference, rtol=1e-3, atol=1e-2)


def test_keeps_dtype_device_and_gradient():
    w = torch.randn(16, 3, dtype=torch.bfloat16, requires_grad=True)
    out = interleaved_to_half(w, 2, 8)
    assert out.dtype == torch.bfloat16 and out.shape == w.shape
    out.sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.ones_like(w))


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.randn(14, 3), 2, 7), "head_dim must be even"),
        ((torch.randn(16, 3), 2, 8, 3), "rotary_dim must be even"),
        ((torch.randn(16, 3), 2, 8, 10), r"rotary_dim must be <= head_dim \(8\)"),
        ((torch.randn(15, 3), 2, 8), r"weight has 15 rows but num_heads \* head_dim = 2 \* 8 = 16"),
        ((torch.randn(2, 8, 3), 2, 8), "weight must be a projection weight"),
        ((torch.randn(16, 3), 0, 8), "num_heads must be a positive int"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        interleaved_to_half(*args)
    with pytest.raises(ValueError, match=match):
        half_to_interleaved(*args)


def test_a_size_of_the_wrong_type_is_a_type_error():
    """Policy (relpos.validation): a float size is a TypeError naming it."""
    for convert in (interleaved_to_half, half_to_interleaved):
        with pytest.raises(TypeError, match="head_dim must be a positive int"):
            convert(torch.randn(16, 3), 2, 8.0)
        with pytest.raises(TypeError, match="num_heads must be a positive int"):
            convert(torch.randn(16, 3), True, 8)


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        interleaved_to_half([[1.0] * 3] * 16, 2, 8)
