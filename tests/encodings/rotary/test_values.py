"""RoVE (``relpos.encodings.rotary.values``): outputs are the attentive convolution with kernel
``R(n - m)`` (the paper's formula, arXiv 2606.11275), and equal RoPE with values and outputs
rotated by hand."""

from __future__ import annotations

import math

import pytest
import torch

import relpos

from .formulas import randn, rope_fp64, theta_fp64


def test_rove_equals_rope_with_values_and_outputs_rotated_by_hand():
    rove = relpos.create("rove", num_heads=2, head_dim=8)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    q, k, v = randn(2, 2, 5, 8, seed=1), randn(2, 2, 9, 8, seed=2), randn(2, 2, 9, 8, seed=3)
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 5, 6, 9, 12, 13, 20, 21, 22]])
    qp = kp[:, 4:]
    v_rot = rope.rotate(v, kp, "q")  # R(n) v_n
    out = relpos.attention(q, k, v_rot, rope, q_pos=qp, k_pos=kp, causal=True)
    back = rope.rotate(out, -qp, "q")  # R(-m) = R(m)^T
    got = relpos.attention(q, k, v, rove, q_pos=qp, k_pos=kp, causal=True)
    torch.testing.assert_close(got, back)
    with pytest.raises(ValueError, match="value head_dim"):
        relpos.attention(q, k, v[..., :6], rove, q_pos=qp, k_pos=kp, causal=True)


def test_rove_output_is_attentive_convolution_with_kernel_r_n_minus_m():
    enc = relpos.create("rove", num_heads=1, head_dim=8)
    q, k, v = randn(1, 1, 5, 8, seed=1), randn(1, 1, 5, 8, seed=2), randn(1, 1, 5, 8, seed=3)
    pos = torch.tensor([3, 4, 6, 9, 10])
    theta = theta_fp64(8)
    logits = rope_fp64(q, pos, theta, "half") @ rope_fp64(k, pos, theta, "half").mT / math.sqrt(8)
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    a = logits.softmax(-1)[0, 0]
    ref = torch.zeros(5, 8, dtype=torch.float64)
    for m in range(5):
        for n in range(m + 1):  # R(n - m) v_n
            ref[m] += (
                a[m, n] * rope_fp64(v[0, 0, n : n + 1], pos[n : n + 1] - pos[m], theta, "half")[0]
            )
    got = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(got[0, 0].double(), ref, rtol=1e-5, atol=1e-5)
