"""Conformance of the ``linear`` backend (kernelized attention) over the registry.

``relpos.attention(..., feature_map=...)`` computes the kernelized model, not softmax
attention, so it is compared with its own O(L^2) definition, assembled here from the public
pieces of each encoding: features ``phi = elu + 1``, the encoding's rotation applied to the
features (``rotate_qk``: RoFormer's linear form), and its bias read as logits of zero queries
and keys (``relpos.scores``), ``c = exp(bias)`` on the kernel:

    z_i = sum_j c_ij (R phi(q_i) . R phi(k_j)) v_j / sum_j c_ij (phi(q_i) . phi(k_j))

Encodings run or are refused by name, by capability: weights changed beyond a score term
(``needs_probabilities``) are refused; a bias that is not a function of ``q_pos - k_pos`` for
the call is refused; every encoding without a bias runs. Then: forward and gradients equal
the reference (float64), shift invariance for relative encodings, causal decoding (the
recurrent ``LinearState`` where it applies, else a KV cache) equals the full forward, and
``torch.compile`` (slow).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.attention.linear.state import LinearState
from relpos.nn import LayerCache

from .common import B, D, H, _adapt, attention, make_encoding, scores

L = 10


def _qkv(lq: int = L, lk: int = L, dtype=torch.float64, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=gen, dtype=dtype) for n in (lq, lk, lk))


def _encoding(name: str) -> relpos.Encoding:
    return make_encoding(name).double()


def _runs(enc: relpos.Encoding, causal: bool = True) -> bool:
    """Whether the linear backend runs this encoding (else it must refuse by name)."""
    key = (enc.name, causal)
    if key not in _RUNS:
        _RUNS[key] = _try(enc, causal)
    return _RUNS[key]


_RUNS: dict[tuple[str, bool], bool] = {}
_REFUSALS: dict[tuple[str, bool], str] = {}  # the refusal's message, by (name, causal)


def _try(enc: relpos.Encoding, causal: bool) -> bool:
    q, k, v = _qkv()
    try:
        attention(q, k, v, enc, causal=causal, feature_map="elu1")
    except ValueError as e:
        msg = str(e)
        _REFUSALS[(enc.name, causal)] = msg
        if enc.needs_probabilities:
            assert "backend 'linear' cannot run encoding" in msg, msg
        elif type(enc).prepare_rotary is not relpos.Encoding.prepare_rotary:
            assert "reads per-call inputs" in msg, msg  # camera frames
        elif "changes the width of q and k" in msg:  # SeqPE's appended channels
            assert enc.has_rotary, msg
        else:
            assert enc.has_bias and "needs a Toeplitz bias" in msg, msg
        return False
    return True


def _reference(enc, q, k, v, causal, **kw):
    """The dense kernelized model of ``enc`` (see the module docstring)."""
    kw = _adapt(enc, q, k, dict(kw))
    Lq, Lk = q.shape[2], k.shape[2]
    qp = kw.get("q_pos")
    kp = kw.get("k_pos")
    if kp is None:  # the engine's default: 0..Lk-1 on every axis
        kp = torch.arange(Lk) if enc.dims == 1 else torch.arange(Lk)[:, None].expand(Lk, enc.dims)
    if qp is None:
        qp = kp[..., Lk - Lq :, :] if enc.dims > 1 else kp[..., Lk - Lq :]
    qp = qp if qp.dim() == (2 if enc.dims == 1 else 3) else qp[None]
    kp = kp if kp.dim() == (2 if enc.dims == 1 else 3) else kp[None]
    pq, pk = F.elu(q) + 1, F.elu(k) + 1
    aq, ak = (pq, pk)
    if enc.has_rotary:
        aq, ak = enc.rotate_qk(pq, pk, qp, kp)
        v = enc.rotate(v, kp, "v")
    c = torch.ones(1, 1, Lq, Lk, dtype=q.dtype)
    if enc.has_bias:
        zq, zk = torch.zeros_like(q), torch.zeros_like(k)
        c = torch.exp(scores(zq, zk, enc, q_pos=kw.get("q_pos"), k_pos=kw.get("k_pos")))
    if causal:
        c = c * torch.ones(Lq, Lk, dtype=q.dtype).tril(Lk - Lq)
    num = ((aq @ ak.transpose(-1, -2)) * c) @ v
    den = ((pq @ pk.transpose(-1, -2)) * c).sum(-1, keepdim=True)
    out = num / den
    return enc.rotate(out, qp, "o") if enc.has_rotary else out


def test_linear_runs_or_refuses_by_name(name):
    enc = _encoding(name)
    runs = _runs(enc, causal=True)
    rotation_refused = _REFUSALS.get((enc.name, True), "") and any(
        reason in _REFUSALS[(enc.name, True)]
        for reason in ("reads per-call inputs", "changes the width of q and k")
    )
    if not enc.needs_probabilities and not enc.has_bias and not rotation_refused:
        assert runs, "an encoding without a bias always runs on the linear backend"
    if enc.distance_only and not enc.needs_probabilities:
        assert runs, "a distance-only bias always has a per-distance table for 0..L-1"


@pytest.mark.parametrize("causal", [True, False])
def test_linear_equals_the_kernelized_reference_forward_and_gradients(name, causal):
    enc = _encoding(name)
    if not causal and enc.causal_only:
        pytest.skip("causal-only encoding")
    if not _runs(enc, causal):
        pytest.skip("refused by name (test_linear_runs_or_refuses_by_name)")
    q, k, v = (x.requires_grad_() for x in _qkv(7, L))
    out = attention(q, k, v, enc, causal=causal, feature_map="elu1")
    ref = _reference(enc, q, k, v, causal)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    params = [p for p in enc.parameters() if p.requires_grad]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    wrt = [q, k, v, *params]
    got = torch.autograd.grad((out * w).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((ref * w).sum(), wrt, allow_unused=True)
    for g, r in zip(got, want, strict=True):
        if r is None:
            assert g is None or not g.abs().any()
            continue
        assert g is not None
        torch.testing.assert_close(g, r, atol=1e-6 * (1 + float(r.abs().max())), rtol=1e-6)


def test_linear_shift_invariance(name):
    enc = _encoding(name)
    if not enc.relative or enc.max_positions is not None or not _runs(enc):
        pytest.skip("not relative, a learned table, or refused by name")
    q, k, v = _qkv()
    pos = torch.arange(L)
    out = attention(q, k, v, enc, causal=True, feature_map="elu1", q_pos=pos, k_pos=pos)
    moved = attention(q, k, v, enc, causal=True, feature_map="elu1", q_pos=pos + 7, k_pos=pos + 7)
    torch.testing.assert_close(moved, out, atol=1e-5, rtol=1e-5)  # cos/sin in float32


def test_linear_decoding_equals_the_full_forward(name):
    """Token by token after a prefill of 3: with the recurrent ``LinearState`` when the call
    has no bias or a geometric one (ALiBi) and the keys' rotation is call-independent, else
    with a KV cache."""
    enc = _encoding(name)
    if enc.required_inputs or enc.needs_inputs or not _runs(enc):
        pytest.skip("per-call inputs, or refused by name")
    q, k, v = _qkv()
    full = attention(q, k, v, enc, causal=True, feature_map="elu1")
    path = relpos.attention.plan(q, k, v, enc, causal=True, feature_map="elu1")[1]
    recurrent = path in ("linear-scan", "linear-decay") and (
        not enc.has_rotary or enc.cache_rotated_keys
    )
    cache = LinearState() if recurrent else LayerCache()
    parts = []
    for s, e in [(0, 3)] + [(t, t + 1) for t in range(3, L)]:
        sl = slice(s, e)  # default positions continue the cache
        parts.append(
            relpos.attention(
                q[:, :, sl],
                k[:, :, sl],
                v[:, :, sl],
                enc,
                causal=True,
                feature_map="elu1",
                cache=cache,
            )
        )
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=1e-6, rtol=1e-6)
    assert cache.length == L


@pytest.mark.slow
def test_linear_compiles(name):
    enc = make_encoding(name)
    if not _runs(enc.double()):
        pytest.skip("refused by name")
    enc = enc.float()
    q, k, v = _qkv(dtype=torch.float32)

    def fn(q, k, v):
        return attention(q, k, v, enc, causal=True, feature_map="elu1")

    compiled = torch.compile(fn, fullgraph=False)
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), atol=1e-5, rtol=1e-5)
