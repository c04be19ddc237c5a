"""Conformance: a query row that sees no key gives output 0 and gradient 0, on every backend.

A row is *dead* when every key is hidden from it: a fully masked row of a user mask, left
padding under a causal mask (the first queries of a left-padded sequence), or causal
attention with ``Lq > Lk`` (bottom-right aligned: query ``i`` sees keys ``j <= i + Lk - Lq``).
SDPA and the flash kernels return 0 there; relpos returns 0 on every backend and every path
(the explicit-softmax path of value terms, URPE and pieces, the piecewise fused path, the
chunked Toeplitz and tile paths), with zero gradients, so a padded training batch never
poisons parameters (docs/numerics.md). Checked over the whole registry, forward and
backward, for every backend an encoding supports (flex: forward, in the slow suite).
"""

from __future__ import annotations

import pytest
import torch

from relpos.attention import chunked, supported_backends

from .common import (
    B,
    D,
    H,
    assert_close_rel,
    attention,
    encoding_params,
    in_table,
    make_encoding,
    scores,
)


def _problem(case: str, enc, gen: torch.Generator) -> dict:
    """q, k, v, keyword arguments and the expected dead rows ``(B, 1|H, Lq)`` of a case."""
    lq, lk = {"lq>lk": (20, 8), "long-lq>lk": (300, 40)}.get(case, (24, 24))
    q = torch.randn(B, H, lq, D, generator=gen)
    k = torch.randn(B, H, lk, D, generator=gen)
    v = torch.randn(B, H, lk, D, generator=gen)
    kw: dict = {"causal": True}
    visible = torch.ones(B, 1, lq, lk, dtype=torch.bool)
    if case == "left-pad":  # batch row 1 is left-padded by 6 tokens
        mask = torch.ones(B, 1, 1, lk, dtype=torch.bool)
        mask[1, ..., :6] = False
        kw["mask"] = mask
        visible = visible & mask
    elif case == "masked-rows":  # a few query rows with every key masked (not causal if allowed)
        mask = torch.rand(B, 1, lq, lk, generator=gen) > 0.3
        mask[..., torch.arange(lq), torch.arange(lq)] = True  # the other rows keep a key
        mask[0, :, [3, 10]] = False
        mask[1, :, 0] = False
        kw["mask"] = mask
        kw["causal"] = enc.causal_only
        visible = visible & mask
    else:  # lq > lk: explicit positions (the default ones would start at Lk - Lq < 0)
        kw["q_pos"] = in_table(enc, torch.arange(lq))
        kw["k_pos"] = in_table(enc, torch.arange(lk) + (lq - lk))
    if kw["causal"] and enc.own_causal_mask:  # the schedule's own mask is its causal one
        inputs = {k_: kw[k_] for k_ in ("q_pos", "k_pos") if k_ in kw}
        own = torch.isfinite(scores(q, k, enc, v=v, **inputs))  # (B, H, Lq, Lk)
        visible = visible & own
    elif kw["causal"]:
        i = torch.arange(lq)[:, None] + (lk - lq)
        visible = visible & (torch.arange(lk)[None, :] <= i)
    dead = ~visible.any(-1)
    assert dead.any() and not dead.all()
    return dict(q=q, k=k, v=v, kw=kw, dead=dead)


def _run(enc, prob: dict, backend: str, weight: torch.Tensor):
    q, k, v = (prob[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
    out = attention(q, k, v, enc, backend=backend, **prob["kw"])
    wrt = [q, k, v, *(p for _, p in encoding_params(enc))]
    grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)]
    return out.detach(), grads


CASES = ["left-pad", "masked-rows", "lq>lk", "long-lq>lk"]
BACKENDS = ["eager", "sdpa", "chunked", "chunked-small", "auto"]
# the long case is for the chunked query blocks: production sizes (a whole dead block) in
# the fast suite; shrunk blocks (19 of them) in the slow one. `auto` runs a backend the other
# combos test (its choice is tested in tests/attention/test_auto_backend.py): slow suite.
COMBOS = [
    pytest.param(
        backend,
        case,
        id=f"{backend}-{case}",
        marks=[pytest.mark.slow]
        if backend == "auto" or (case == "long-lq>lk" and backend != "chunked")
        else [],
    )
    for case in CASES
    for backend in BACKENDS
]


@pytest.mark.parametrize(("backend", "case"), COMBOS)
def test_dead_rows_give_zero_output_and_zero_gradient(name, backend, case, monkeypatch):
    enc = make_encoding(name)
    base = backend.removesuffix("-small")
    if case == "long-lq>lk" and base not in ("chunked", "auto"):
        pytest.skip("the long case is for the query blocks of chunked (auto picks it too)")
    if base != "auto" and base not in supported_backends(enc):
        pytest.skip(f"{base} cannot run this encoding (needs_probabilities)")
    if backend == "chunked-small":  # many query blocks: some see no key at all
        monkeypatch.setattr(chunked, "FORWARD_BLOCK", 16)
        monkeypatch.setattr(chunked, "BACKWARD_BLOCK", 16)
        monkeypatch.setattr(chunked, "TILE_ELEMENTS", 16 * 40)
    prob = _problem(case, enc, torch.Generator().manual_seed(0))
    dead = prob["dead"]
    out_shape = (B, H, prob["q"].shape[2], D)
    weight = torch.randn(out_shape, generator=torch.Generator().manual_seed(1))
    try:
        out, grads = _run(enc, prob, base, weight)
    except ValueError as e:  # e.g. CABLE reads each query's token among the keys
        if "lq>lk" not in case:
            raise
        pytest.skip(f"the encoding refuses Lq > Lk by name: {e}")
    what = f"{name} {backend} {case}"
    assert torch.isfinite(out).all(), f"{what}: output not finite"
    rows = dead[:, :, :, None].expand(out_shape)
    assert (out[rows] == 0).all(), f"{what}: a row that sees no key is not 0"
    for g in grads:
        assert torch.isfinite(g).all(), f"{what}: gradient not finite (a padded batch poisons)"
    if not enc.mixes_tokens:  # (a transport over the call's tokens carries a dead row's q
        # into the live rows' rotated queries: its gradient is theirs, not the dead row's)
        assert (grads[0][rows] == 0).all(), f"{what}: dead query rows get a gradient"
    # the dead rows contribute nothing: the same gradients with their output weights zeroed
    _, live_grads = _run(enc, prob, base, weight.masked_fill(rows, 0.0))
    scale = max(float(r.abs().max()) for r in live_grads if r.numel())  # some are ~0 exactly
    for g, r in zip(grads, live_grads, strict=True):
        assert_close_rel(g, r, scale=scale, msg=f"{what}: dead rows change the gradients")
    if base != "eager":  # and the live rows agree with eager
        ref, _ = _run(enc, prob, "eager", weight)
        assert_close_rel(out, ref, msg=f"{what}: differs from eager")


@pytest.mark.slow  # compiles flex per encoding
@pytest.mark.parametrize("case", ["left-pad", "lq>lk"])
def test_dead_rows_on_flex_are_zero(name, case):
    enc = make_encoding(name)
    if "flex" not in supported_backends(enc):
        pytest.skip("flex cannot run this encoding (needs_probabilities)")
    prob = _problem(case, enc, torch.Generator().manual_seed(0))
    with torch.no_grad():
        try:
            ref = attention(prob["q"], prob["k"], prob["v"], enc, backend="eager", **prob["kw"])
        except ValueError as e:
            if case != "lq>lk":
                raise
            pytest.skip(f"the encoding refuses Lq > Lk by name: {e}")
        out = attention(prob["q"], prob["k"], prob["v"], enc, backend="flex", **prob["kw"])
    rows = prob["dead"][:, :, :, None].expand(out.shape)
    assert torch.isfinite(out).all() and (out[rows] == 0).all()
    assert_close_rel(out, ref)
