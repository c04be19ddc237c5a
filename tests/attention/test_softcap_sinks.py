"""Attention-logit softcapping (``softcap``: Gemma-2) and attention sinks (``sinks``: gpt-oss).

The specification: logits ``s = q k^T * scale + score terms`` become ``c * tanh(s / c)``
before the mask; the head's sink logit joins every row's softmax and its weight is dropped.
Checked against a float64 reference written here from that statement (softmax over
``[logits, sink]``, ``c * tanh``) and pinned values, on every backend that computes them
(``eager``, ``chunked`` on each of its paths, ``sdpa`` for sinks, ``flex`` forward), with
masked rows, empty sequences, half dtypes and gradients; the others refuse by name.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from conformance.common import make_encoding
from relpos.attention import chunked, plan
from relpos.attention.api import candidate_backends
from relpos.attention.call import prepare_call
from relpos.attention.flex import flex_compiles

H, HKV, D = 4, 2, 16  # conformance.common: H = 4, D = 16


def _qkv(lq: int, lk: int, dtype=torch.float64, seed: int = 0, batch: int = 2):
    gen = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(batch, H, lq, D, generator=gen, dtype=torch.float64)
    k = 2 * torch.randn(batch, HKV, lk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, HKV, lk, D, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _sinks(dtype=torch.float64) -> torch.Tensor:
    return torch.tensor([-1.0, 0.5, 2.0, 0.0], dtype=dtype)


def reference(q, k, v, logits, *, softcap=None, sinks=None, visible=None):
    """The statement, in float64: ``logits (B, H, Lq, Lk)`` (the encoding's, unmasked) capped,
    masked where not ``visible``, softmax over ``[row, sink]``, the sink dropped."""
    s = logits.double()
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        dead = (s == -math.inf).all(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    vv = v.double().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return p @ vv


def _causal(lq: int, lk: int) -> torch.Tensor:
    return torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)


FEATURES = {
    "softcap": dict(softcap=3.0),
    "sinks": dict(sinks="sinks"),
    "both": dict(softcap=3.0, sinks="sinks"),
}


def _features(which: str, dtype=torch.float64) -> dict:
    out = dict(FEATURES[which])
    if "sinks" in out:
        out["sinks"] = _sinks(dtype)
    return out


# ------------------------------------------------------------------------------ pinned values
def test_pinned_values_of_one_row():
    """``q = 1``, keys ``1, -1``, values ``1, 0``, scale 1, cap 2, sink 0: weights of
    ``[2 tanh(1/2), -2 tanh(1/2), 0]`` (math.tanh / math.exp by hand)."""
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    k = torch.tensor([1.0, -1.0], dtype=torch.float64).view(1, 1, 2, 1)
    v = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 1, 2, 1)
    a = 2 * math.tanh(0.5)  # 0.92423431...
    cases = {
        (None, None): math.exp(1) / (math.exp(1) + math.exp(-1)),
        (2.0, None): math.exp(a) / (math.exp(a) + math.exp(-a)),
        (None, 0.0): math.exp(1) / (math.exp(1) + math.exp(-1) + 1),
        (2.0, 0.0): math.exp(a) / (math.exp(a) + math.exp(-a) + 1),
    }
    assert cases[(2.0, 0.0)] == pytest.approx(0.6433709, abs=1e-7)
    for (cap, sink), expected in cases.items():
        sinks = None if sink is None else torch.tensor([sink], dtype=torch.float64)
        for backend in ("eager", "chunked") + (("sdpa",) if cap is None else ()):
            out = relpos.attention(q, k, v, scale=1.0, softcap=cap, sinks=sinks, backend=backend)
            assert float(out) == pytest.approx(expected, rel=1e-14), (cap, sink, backend)


# ------------------------------------------------------------------------------ vs the statement
@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize("name", [None, "rope", "alibi", "t5"])
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa", "auto"])
def test_every_backend_computes_the_statement(name, which, backend):
    """GQA, causal with ``Lq < Lk`` and a padding mask; float64, 1e-12 of the reference."""
    features = _features(which)
    if backend == "sdpa" and "softcap" in features:
        pytest.skip("sdpa refuses softcap (test_backends_that_cannot_refuse_by_name)")
    enc = None if name is None else make_encoding(name)
    q, k, v = _qkv(12, 20)
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    mask[1, ..., :5] = False  # left padding of batch row 1
    out = relpos.attention(q, k, v, enc, causal=True, mask=mask, backend=backend, **features)
    logits = relpos.scores(q, k, enc)
    visible = _causal(12, 20) & mask
    expected = reference(q, k, v, logits, visible=visible, **features)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


ENGINE_CASES = [
    ("rope", {}),
    ("alibi", {}),  # Toeplitz without the features
    ("t5", {}),
    ("cope", {}),  # row-suffix path
    ("self-extend", dict(group_size=4, neighbor_window=6)),  # piecewise logits
    ("urpe", {}),  # multiplied weights (probabilities path)
    ("shaw", {}),  # value terms
]


@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize(("name", "options"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_chunked_paths_agree_with_eager_forward_and_backward(name, options, which, monkeypatch):
    """Every chunked path that takes the features (probabilities, row-suffix), several query
    and key blocks, against eager: outputs and gradients of q, k, v, the sinks and the
    encoding's parameters, float64."""
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 64)  # 16-row tiles: several per call
    monkeypatch.setattr(chunked, "FORWARD_BLOCK", 8)  # several key blocks (row-suffix)
    enc = make_encoding(name, **options).double()
    q0, k0, v0 = _qkv(40, 48)
    features = _features(which)
    results = {}
    for backend in ("eager", "chunked"):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        kw = dict(features)
        if "sinks" in kw:
            kw["sinks"] = kw["sinks"].clone().requires_grad_(True)
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend, **kw)
        wrt = [q, k, v, *([kw["sinks"]] if "sinks" in kw else []), *enc.parameters()]
        wrt = [t for t in wrt if t.requires_grad]
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).double()
        grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
        results[backend] = (
            out,
            [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)],
        )
    path = plan(q0, k0, v0, enc, causal=True, backend="chunked", **features)[1]
    assert path in ("probabilities", "row-suffix")
    (o_e, g_e), (o_c, g_c) = results["eager"], results["chunked"]
    torch.testing.assert_close(o_c, o_e, rtol=1e-11, atol=1e-11)
    for ge, gc in zip(g_e, g_c, strict=True):
        torch.testing.assert_close(gc, ge, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_gradcheck(backend, which):
    """``torch.autograd.gradcheck`` through q, k, v and the sinks (float64, small)."""
    q, k, v = (t.requires_grad_(True) for t in _qkv(3, 5, batch=1))
    features = _features(which)
    sinks = features.pop("sinks", None)
    args = (q, k, v) + ((sinks.requires_grad_(True),) if sinks is not None else ())

    def fn(q, k, v, s=None):
        return relpos.attention(q, k, v, causal=True, backend=backend, sinks=s, **features)

    assert torch.autograd.gradcheck(fn, args)


# ------------------------------------------------------------------------------ dead rows, empty
@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa"])
def test_dead_rows_give_zero_output_and_finite_gradients(backend, which):
    """A fully masked row and causal ``Lq > Lk`` rows: output 0 (with sinks the sink takes
    the row), gradients finite, on every backend that runs the call."""
    features = _features(which)
    if backend == "sdpa" and "softcap" in features:
        pytest.skip("sdpa refuses softcap")
    q, k, v = (t.requires_grad_(True) for t in _qkv(10, 6))
    mask = torch.ones(2, 1, 10, 6, dtype=torch.bool)
    mask[0, :, 7] = False  # a fully masked row
    out = relpos.attention(q, k, v, causal=True, mask=mask, backend=backend, **features)
    dead = ~(_causal(10, 6) & mask).any(-1)  # (2, 1, 10)
    assert dead[:, 0, :4].all() and dead[0, 0, 7]
    assert torch.equal(out.masked_select(dead[..., None]), torch.zeros(int(dead.sum()) * H * D))
    out.sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
    assert float(q.grad[0, :, 7].abs().max()) == 0.0


@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa", "auto"])
def test_empty_calls(backend, which):
    """``Lk = 0``: zeros (no key; the sink has no value); ``Lq = 0``: an empty output."""
    features = _features(which)
    if backend == "sdpa" and "softcap" in features:
        pytest.skip("sdpa refuses softcap")
    q, k, v = _qkv(4, 0)
    out = relpos.attention(q, k, v, causal=False, backend=backend, **features)
    assert out.shape == (2, H, 4, D) and not out.any()
    q, k, v = _qkv(0, 5)
    assert relpos.attention(q, k, v, backend=backend, **features).shape == (2, H, 0, D)


# ------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("which", list(FEATURES))
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa"])
def test_dtypes(backend, which, dtype):
    """Any float dtype of q and of the sinks (cast to the scores' dtype): within the dtype's
    rounding of the float64 statement; the output keeps q's dtype."""
    features = _features(which, dtype=torch.float32)
    if backend == "sdpa" and "softcap" in features:
        pytest.skip("sdpa refuses softcap")
    q, k, v = _qkv(9, 9, dtype=dtype)
    out = relpos.attention(q, k, v, causal=True, backend=backend, **features)
    assert out.dtype == dtype
    logits = relpos.scores(q.double(), k.double())
    ref_features = {n: (t.to(dtype) if torch.is_tensor(t) else t) for n, t in features.items()}
    expected = reference(q, k, v, logits, visible=_causal(9, 9), **ref_features)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


# ------------------------------------------------------------------------------ flex
@pytest.mark.slow
@pytest.mark.skipif(not flex_compiles("cpu"), reason="no C++ compiler for FlexAttention")
@pytest.mark.parametrize("which", list(FEATURES))
def test_flex_agrees_with_eager(which):
    """FlexAttention (forward: no CPU backward in this torch): the cap in its score_mod, the
    sink an appended key; with a bias, GQA, a padding mask and dead rows, float32."""
    enc = make_encoding("alibi")
    q, k, v = _qkv(10, 6, dtype=torch.float32)
    mask = torch.ones(2, 1, 10, 6, dtype=torch.bool)
    mask[1, ..., :2] = False
    features = _features(which, dtype=torch.float32)
    with torch.no_grad():
        ref = relpos.attention(q, k, v, enc, causal=True, mask=mask, backend="eager", **features)
        out = relpos.attention(q, k, v, enc, causal=True, mask=mask, backend="flex", **features)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ auto, refusals
def _call(**features):
    q, k, v = _qkv(64, 64, dtype=torch.float32)
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    return prepare_call(
        q, k, v, enc, q_pos=None, k_pos=None, causal=True, mask=None, scale=None, **features
    )


def test_auto_chooses_only_backends_that_compute_the_features():
    with torch.no_grad():
        plain = candidate_backends(_call())
        capped = candidate_backends(_call(softcap=5.0))
        sunk = candidate_backends(_call(sinks=_sinks(torch.float32)))
    assert {"sdpa", "fold"} <= set(plain)
    assert "sdpa" not in capped and "fold" not in capped and "chunked" in capped
    assert "sdpa" in sunk and "fold" not in sunk


@pytest.mark.parametrize(
    ("backend", "features", "words"),
    [
        ("sdpa", dict(softcap=5.0), "backend 'sdpa' cannot apply softcap"),
        ("fold", dict(softcap=5.0), "backend 'fold' cannot apply softcap"),
        ("fold", dict(sinks=True), "backend 'fold' cannot apply sinks"),
        ("fold", dict(softcap=5.0, sinks=True), "backend 'fold' cannot apply sinks and softcap"),
    ],
)
def test_backends_that_cannot_refuse_by_name(backend, features, words):
    if features.get("sinks") is True:
        features["sinks"] = _sinks()
    q, k, v = _qkv(8, 8)
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    for fn in (relpos.attention, plan):
        with pytest.raises(ValueError, match=words):
            fn(q, k, v, enc, causal=True, backend=backend, **features)


def test_kernelized_attention_refuses_the_features():
    q, k, v = _qkv(8, 8)
    with pytest.raises(ValueError, match="backend 'linear' cannot apply sinks"):
        relpos.attention(q, k, v, causal=True, feature_map="elu1", sinks=_sinks())
    with pytest.raises(ValueError, match="backend 'linear' cannot apply softcap"):
        relpos.attention(q, k, v, causal=True, feature_map="relu", softcap=2.0)


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        (dict(softcap=0.0), ValueError, "softcap"),
        (dict(softcap=-1.0), ValueError, "softcap"),
        (dict(softcap=math.inf), ValueError, "softcap"),
        (dict(softcap=math.nan), ValueError, "softcap"),
        (dict(softcap="50"), TypeError, "softcap"),
        (dict(softcap=True), TypeError, "softcap"),
        (dict(sinks=[0.0] * H), TypeError, r"sinks must be a float tensor of shape \(H,\)"),
        (dict(sinks=torch.zeros(H, dtype=torch.long)), TypeError, "sinks .* dtype"),
        (dict(sinks=torch.zeros(H + 1)), ValueError, r"\(H,\) = \(4,\).*got shape \(5,\)"),
        (dict(sinks=torch.zeros(1, H)), ValueError, "sinks .* got shape"),
        (dict(sinks=torch.tensor([0.0, math.inf, 0.0, 0.0])), ValueError, "sinks must be finite"),
        (dict(sinks=torch.tensor([0.0, math.nan, 0.0, 0.0])), ValueError, "sinks must be finite"),
        (dict(sinks=torch.zeros(H, device="meta")), ValueError, "sinks must be on the device"),
    ],
)
def test_bad_arguments_are_named(kw, error, words):
    q, k, v = _qkv(4, 4)
    with pytest.raises(error, match=words):
        relpos.attention(q, k, v, **kw)
