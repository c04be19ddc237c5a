"""Conformance: empty and degenerate sizes, and the arguments SDPA would take silently.

* ``Lq = 0`` and/or ``Lk = 0`` work on every backend like SDPA: an empty output (or zeros
  when there is no key), and backward runs (zero gradients);
* zero heads or a zero head_dim are refused with a ``ValueError`` naming the argument;
* ``meta`` tensors run shape inference without an encoding and are refused by name with one;
* ``scale`` must be a finite number > 0 (SDPA gives NaN for inf and silently 0 for NaN);
* ``mask`` errors (dtype, shape, device) name ``mask``.
"""

from __future__ import annotations

import math

import pytest
import torch

from relpos.attention import supported_backends

from .common import B, D, H, attention, make_encoding

EMPTY = [(0, 5), (5, 0), (0, 0)]


@pytest.mark.parametrize("lq,lk", EMPTY, ids=[f"lq{a}-lk{b}" for a, b in EMPTY])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked", "flex", "auto"])
def test_empty_lengths_work_like_sdpa(name, backend, lq, lk):
    enc = make_encoding(name)
    if backend != "auto" and backend not in supported_backends(enc):
        pytest.skip(f"{backend} cannot run this encoding (needs_probabilities)")
    if lq > lk:
        pytest.skip("no key for a query: covered by lq0-lk0 and test_masked_rows")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, lq, D, generator=gen)
    k, v = torch.randn(2, B, H, lk, D, generator=gen)
    grad = backend != "flex"  # flex has no CPU backward (refused by name)
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    out = attention(q, k, v, enc, causal=True, backend=backend)
    assert out.shape == (B, H, lq, D)
    if grad:
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad is None or (t.grad == 0).all()


def test_no_key_gives_zeros_like_sdpa(name):
    """Lk = 0 with queries: SDPA gives zeros; so does every backend (non-causal, else the
    rows are dead and covered by test_masked_rows)."""
    enc = make_encoding(name)
    if enc.causal_only:
        pytest.skip("causal-only: Lq > Lk = 0 is a dead-row case (test_masked_rows)")
    q = torch.randn(B, H, 5, D, requires_grad=True)
    k = torch.randn(B, H, 0, D, requires_grad=True)
    pos = {"q_pos": torch.arange(5), "k_pos": torch.arange(0)}
    try:
        attention(q, k, k, enc, **pos)
    except ValueError as e:  # e.g. an encoding that reads each query's token among the keys
        pytest.skip(f"the encoding refuses Lq > Lk by name: {e}")
    for backend in supported_backends(enc):
        if backend == "flex":
            with torch.no_grad():
                out = attention(q, k, k, enc, backend=backend, **pos)
        else:
            out = attention(q, k, k, enc, backend=backend, **pos)
            (g,) = torch.autograd.grad(out.sum(), [q], allow_unused=True)
            assert g is None or (g == 0).all()
        assert out.shape == (B, H, 5, D) and (out == 0).all(), backend


@pytest.mark.parametrize("which", ["heads", "head_dim", "v_dim"])
def test_zero_heads_or_head_dim_are_refused_by_name(name, which):
    enc = make_encoding(name)
    q = torch.randn(B, H, 6, D)
    k = torch.randn(B, H, 6, D)
    v = torch.randn(B, H, 6, D)
    if which == "heads":
        q, k, v = q[:, :0], k[:, :0], v[:, :0]
    elif which == "head_dim":
        q, k = q[..., :0], k[..., :0]
    else:
        v = v[..., :0]
    with pytest.raises(ValueError, match=r"head"):
        attention(q, k, v, enc, causal=True)
    with pytest.raises(ValueError, match=r"head"):
        attention(q, k, v, None, causal=True)


def test_meta_tensors_are_refused_by_name(name):
    enc = make_encoding(name)
    q = torch.empty(B, H, 6, D, device="meta")
    with pytest.raises(ValueError, match="meta"):
        attention(q, q, q, enc, causal=True)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_meta_tensors_without_encoding_infer_shapes(backend):
    q = torch.empty(B, H, 6, D, device="meta")
    k = torch.empty(B, H, 9, D, device="meta")
    out = attention(q, k, k, None, backend=backend)
    assert out.device.type == "meta" and out.shape == (B, H, 6, D)


@pytest.mark.parametrize(
    "scale,error",
    [
        (math.inf, ValueError),
        (math.nan, ValueError),
        (-1.0, ValueError),
        (0.0, ValueError),
        (True, TypeError),
        ("0.1", TypeError),
        (torch.tensor(0.1), TypeError),
    ],
    ids=["inf", "nan", "negative", "zero", "bool", "str", "tensor"],
)
def test_scale_must_be_a_finite_positive_number(name, scale, error):
    enc = make_encoding(name)
    q = torch.randn(B, H, 6, D)
    with pytest.raises(error, match="scale"):
        attention(q, q, q, enc, causal=True, scale=scale)


def test_valid_scales_are_accepted(name):
    enc = make_encoding(name)
    q = torch.randn(B, H, 6, D)
    for scale in (1, 0.125, 1e-3):
        assert torch.isfinite(attention(q, q, q, enc, causal=True, scale=scale)).all()


def test_mask_errors_name_mask(name):
    enc = make_encoding(name)
    q = torch.randn(B, H, 6, D)
    bad = [
        (TypeError, torch.ones(6, 6, dtype=torch.int64)),  # dtype
        (TypeError, [[True] * 6] * 6),  # not a tensor
        (ValueError, torch.ones(5, 6, dtype=torch.bool)),  # shape
        (ValueError, torch.ones(1, 1, 1, 1, 6, 6, dtype=torch.bool)),  # too many dims
        (ValueError, torch.ones(6, 6, dtype=torch.bool, device="meta")),  # device
    ]
    for error, mask in bad:
        with pytest.raises(error, match="mask"):
            attention(q, q, q, enc, causal=True, mask=mask)
