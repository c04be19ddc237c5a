"""Conformance: every rotary encoding takes any activation dtype.

For each registered encoding with ``has_rotary``, ``rotate_qk`` on float16 / bfloat16 /
float32 / float64 queries and keys returns tensors of that dtype that agree with the float64
result to the dtype's precision, with the encoding's parameters in float32 (a model under
autocast or in half precision) and, for float64, also in float64 (``.double()``).
"""

from __future__ import annotations

import pytest
import torch

import relpos

from .common import D, H, lift_positions, make_encoding, rotate_qk

L = 12
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-5, torch.float64: 1e-5}


def _rotary(name: str) -> relpos.Encoding:
    enc = make_encoding(name)
    if not enc.has_rotary:
        pytest.skip("no rotation")
    return enc


def _rotate(enc, q, k):
    pos = lift_positions(enc, torch.arange(L)[None] if enc.dims == 1 else torch.arange(L))
    return rotate_qk(enc, q, k, pos, pos)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str
)
def test_rotate_qk_keeps_the_activation_dtype_and_its_precision(name, dtype):
    enc = _rotary(name)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, H, L, D, generator=gen, dtype=torch.float64) for _ in range(2))
    ref_q, ref_k = _rotate(enc, q.float(), k.float())
    out_q, out_k = _rotate(enc, q.to(dtype), k.to(dtype))
    assert out_q.dtype == dtype and out_k.dtype == dtype
    tol = TOLERANCE[dtype]
    for out, ref in ((out_q, ref_q), (out_k, ref_k)):
        assert torch.isfinite(out).all()
        scale = float(ref.detach().abs().max())
        torch.testing.assert_close(
            out.detach().double(), ref.detach().double(), rtol=tol, atol=tol * scale
        )


def test_rotate_qk_of_a_float64_encoding_takes_float64(name):
    enc = _rotary(name).double()
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, H, L, D, generator=gen, dtype=torch.float64) for _ in range(2))
    out_q, out_k = _rotate(enc, q, k)
    assert out_q.dtype == torch.float64 and out_k.dtype == torch.float64
