"""Conformance 1: relative encodings do not see absolute positions.

``relpos.scores`` (and the attention output) must not change when every query and key
position moves by the same constant: integers (+37, +1000) for all relative encodings, and a
fractional constant for those that accept continuous positions. fp32 tolerance: 1e-5 relative
to the largest logit, or the float32 resolution of the largest position (``eps * |p|``) when
that is coarser, since RoPE-like encodings form ``p * theta`` in float32 and cannot be more
shift invariant than the positions' own rounding.
"""

from __future__ import annotations

import pytest
import torch

from .common import (
    RTOL,
    B,
    D,
    H,
    assert_close_rel,
    attention,
    increasing_positions,
    make_encoding,
    scores,
)

LQ, LK = 24, 40


def _tolerance(*positions: torch.Tensor) -> float:
    top = max(float(p.abs().max()) for p in positions)
    return max(RTOL, torch.finfo(torch.float32).eps * top)


def _positions(kind: str, enc, gen: torch.Generator):
    if kind == "arange":
        kp = torch.arange(LK)
    elif kind == "floatgrid":  # integer-valued float positions, to be moved off the grid
        kp = torch.arange(LK, dtype=torch.float32)
    elif kind == "batch":
        kp = increasing_positions(B, LK, gen, limit=1 << 20)
    else:  # "float": irregular fractional positions
        kp = (0.25 + torch.rand(B, LK, generator=gen, dtype=torch.float64)).cumsum(1).float()
    return kp[..., LK - LQ :], kp


def _check_shift(enc, kind: str, shift, via: str) -> None:
    if not enc.relative:
        pytest.skip("not a relative encoding")
    if kind.startswith("float") and not enc.continuous:
        pytest.skip("no continuous positions")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, LQ, D, generator=gen)
    k = torch.randn(B, H, LK, D, generator=gen)
    v = torch.randn(B, H, LK, D, generator=gen)
    qp, kp = _positions(kind, enc, gen)
    if enc.max_positions is not None and float(kp.max()) + shift >= enc.max_positions:
        pytest.skip("the shift leaves the learned table (max_positions)")

    def run(qpos, kpos):
        if via == "scores":
            return scores(q, k, enc, q_pos=qpos, k_pos=kpos)
        return attention(q, k, v, enc, q_pos=qpos, k_pos=kpos, causal=True)

    ref = run(qp, kp)
    moved = run(qp + shift, kp + shift)
    # pairs an encoding removes from the softmax (-inf: TRA's thresholded keys) are removed
    # at the same places; everything else is finite and compared
    removed = ref == float("-inf")
    assert torch.isfinite(ref[~removed]).all()
    assert torch.equal(moved == float("-inf"), removed), f"shift {shift} moves removed pairs"
    tol = _tolerance(qp + shift, kp + shift)
    assert_close_rel(moved[~removed], ref[~removed], rtol=tol, msg=f"shift {shift}")


@pytest.mark.parametrize("shift", [37, 1000])
@pytest.mark.parametrize("kind", ["arange", "batch"])
def test_scores_invariant_under_integer_shift(name, kind, shift):
    _check_shift(make_encoding(name), kind, shift, "scores")


@pytest.mark.parametrize("shift", [0.5, 37.5])
@pytest.mark.parametrize("kind", ["floatgrid", "float"])
def test_scores_invariant_under_fractional_shift(name, kind, shift):
    enc = make_encoding(name)
    if not enc.continuous:
        pytest.skip("no continuous positions")
    _check_shift(enc, kind, shift, "scores")


@pytest.mark.parametrize("shift", [37, 1000])
def test_causal_attention_invariant_under_integer_shift(name, shift):
    """The same property through ``relpos.attention`` (causal, backend auto): also covers
    causal-only encodings."""
    _check_shift(make_encoding(name), "batch", shift, "attention")
