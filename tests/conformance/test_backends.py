"""Conformance 2: every backend agrees with ``eager`` (fp32, 1e-5 relative), forward and backward.

Cases cover grouped-query attention, ``Lq != Lk`` (bottom-right causal alignment), a user
bool padding mask, batch-specific positions, float positions (continuous encodings) and
a ``mask_mod`` (packed documents behind an anchor key), and
lengths above 256 so that the chunked backend runs more than one query block on both of its
paths (Toeplitz for distance-only biases with arange positions, tiles for the rest). The
``chunked-small`` variant shrinks the chunked block sizes so the long cases run many blocks on
both paths whatever the production sizes are (the tile path sizes its tiles from an element
budget, one tile at L = 300). FlexAttention runs forward only (no CPU backward in torch 2.13).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relpos.attention import chunked, piecewise, supported_backends
from relpos.attention.call import prepare_call

from .common import (
    ENCODINGS,
    RTOL,
    Case,
    assert_close_rel,
    attention,
    build_inputs,
    encoding_params,
    make_encoding,
)

CASES = [
    Case("short", 48, 48),
    Case("gqa", 48, 48, hkv=2),
    Case("lq<lk", 20, 48),
    Case("mask", 48, 48, mask=True),
    Case("batchpos", 48, 48, pos="batch"),
    Case("floatpos", 40, 48, pos="float"),
    Case("long", 300, 300),  # > 256 queries, arange positions: Toeplitz path
    Case("long-lq<lk", 270, 300, hkv=2, pos="offset"),  # explicit positions 400..699
    Case("long-batchpos-gqa", 300, 300, hkv=2, pos="batch"),  # tile path
    Case("long-mask-lq<lk", 280, 300, mask=True),  # tile path (user mask)
    Case("docs-lq<lk", 20, 48, hkv=2, docs=True),  # mask_mod (packed documents)
    Case("long-docs", 300, 300, pos="batch", docs=True),  # mask_mod per tile
]


def run_backend(enc, inputs: dict, causal: bool, backend: str, need_grad: bool = True):
    """Output and gradients (q, k, v, encoding parameters) of a weighted-sum loss."""
    q, k, v = (inputs[n].detach().clone().requires_grad_(need_grad) for n in ("q", "k", "v"))
    kw = {n: inputs[n] for n in ("q_pos", "k_pos", "mask", "mask_mod", "inputs") if n in inputs}
    out = attention(q, k, v, enc, causal=causal, backend=backend, **kw)
    if not need_grad:
        return out.detach(), None
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(123))
    wrt = [q, k, v, *(p for _, p in encoding_params(enc))]
    grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)]
    return out.detach(), grads


def compare(enc, out, grads, ref_out, ref_grads, what: str) -> None:
    assert out.shape == ref_out.shape, what
    assert torch.isfinite(ref_out).all(), f"{what}: eager output not finite"
    assert_close_rel(out, ref_out, msg=f"{what}: forward")
    if grads is None:
        return
    for i, family in enumerate(("q", "k", "v")):
        assert_close_rel(grads[i], ref_grads[i], msg=f"{what}: grad {family}")
    names = [n for n, _ in encoding_params(enc)]
    if names:
        # one tolerance for the encoding's parameters, relative to their largest gradient:
        # some are ~0 in exact arithmetic (a per-head constant under softmax). Table entries
        # (buckets) sum dS over up to L^2 pairs, in another order per backend: 5 x RTOL.
        scale = max(float(g.abs().max()) for g in ref_grads[3:])
        for n, g, r in zip(names, grads[3:], ref_grads[3:], strict=True):
            assert_close_rel(g, r, rtol=5 * RTOL, scale=scale, msg=f"{what}: grad of parameter {n}")


# "chunked-small": the chunked backend with its block sizes shrunk (monkeypatched), so that
# every long case runs many query blocks on both paths whatever the production sizes are. The
# fast suite runs the long cases at half their lengths (``half_length``) with blocks of 32
# rows: the same number of blocks (4-5) on the same paths at a quarter of the cost; the
# full lengths run at production block sizes in the slow suite.
SMALL_BLOCKS = {
    "FORWARD_BLOCK": 32,  # Toeplitz path
    "BACKWARD_BLOCK": 32,
    "TILE_BLOCK": 32,  # tile path (rows per tile) ...
    "TILE_ELEMENTS": 32 * 150,  # ... or rows x keys per tile (32 rows at Lk = 150)
}


def shrink_chunked_blocks(monkeypatch) -> list[int]:
    """Apply SMALL_BLOCKS; return a list that records the query rows of each SDPA call the
    tile path makes (one per tile, plus recomputation in backward)."""
    found = [a for a in SMALL_BLOCKS if hasattr(chunked, a)]
    assert found, "relpos.attention.chunked renamed its block sizes: update SMALL_BLOCKS"
    for attr in found:
        monkeypatch.setattr(chunked, attr, SMALL_BLOCKS[attr])
    # the piecewise-RoPE kernel (DCA, Self-Extend, LM-Infinite) sizes its own query blocks
    assert hasattr(piecewise, "PIECEWISE_MIN_ROWS"), "update shrink_chunked_blocks"
    monkeypatch.setattr(piecewise, "PIECEWISE_MIN_ROWS", SMALL_BLOCKS["FORWARD_BLOCK"])
    rows: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        rows.append(q.shape[-2])
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(chunked.F, "scaled_dot_product_attention", spy)
    return rows


def check_backends_match_eager(name, case, causal, backends, monkeypatch) -> None:
    """Every backend of ``backends`` that can run the encoding gives eager's output and
    gradients on ``case`` (one eager reference for all of them)."""
    enc = make_encoding(name)
    if enc.causal_only and not causal:
        pytest.skip("causal-only encoding (non-causal calls must raise: tested below)")
    if reason := case.needs(enc):
        pytest.skip(reason)
    runnable = [b for b in backends if b.removesuffix("-small") in supported_backends(enc)]
    if not runnable:
        pytest.skip(f"{backends} cannot run this encoding (needs_probabilities): tested below")
    inputs = build_inputs(case, enc)
    ref_out, ref_grads = run_backend(enc, inputs, causal, "eager")
    for backend in runnable:
        with monkeypatch.context() as patched:
            tiles = shrink_chunked_blocks(patched) if backend == "chunked-small" else None
            out, grads = run_backend(enc, inputs, causal, backend.removesuffix("-small"))
        if tiles:  # the tile path ran: it must have split the queries
            assert max(tiles) < case.lq, f"one tile of {max(tiles)} rows for {case.lq} queries"
        compare(enc, out, grads, ref_out, ref_grads, f"{name} {backend} {case.id} causal={causal}")


def is_long(case: Case) -> bool:
    """A case above 256 queries (more than one production query block)."""
    return case.lq > 256


def half_length(case: Case) -> Case:
    """The fast suite's version of a long case: half the query and key lengths (still
    several shrunk blocks), everything else the same."""
    return dataclasses.replace(case, lq=case.lq // 2, lk=case.lk // 2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_backends_match_eager(name, case, causal, monkeypatch):
    """Short cases: sdpa and chunked (one block). Long cases: chunked with shrunk blocks at
    half length, so every path runs many query blocks; the full lengths at production block
    sizes run in the slow suite (below)."""
    if is_long(case):
        check_backends_match_eager(name, half_length(case), causal, ["chunked-small"], monkeypatch)
    else:
        check_backends_match_eager(name, case, causal, ["sdpa", "chunked"], monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", [c for c in CASES if is_long(c)], ids=lambda c: c.id)
def test_backends_match_eager_on_long_cases_at_production_sizes(name, case, causal, monkeypatch):
    check_backends_match_eager(name, case, causal, ["sdpa", "chunked"], monkeypatch)


# FlexAttention compiles per encoding (seconds on CPU): one causal and one non-causal case each.
FLEX_CASES = [
    ("causal", Case("flex-gqa-batchpos", 128, 128, hkv=2, pos="batch")),
    ("full", Case("flex-mask-lq<lk", 64, 128, mask=True)),
]


@pytest.fixture
def flex_eager_fallbacks(monkeypatch):
    """Records each call of ``flex_attention`` that ran *uncompiled* (the unfused path that
    materialises the scores), e.g. after dynamo gave up recompiling."""
    import torch.nn.attention.flex_attention as fa

    seen: list[str] = []
    original = fa._warn_once

    def spy(warning_id, *args, **kwargs):
        if warning_id == "flex_attention_performance":
            seen.append(warning_id)
        return original(warning_id, *args, **kwargs)

    monkeypatch.setattr(fa, "_warn_once", spy)
    return seen


@pytest.mark.parametrize("mode,case", FLEX_CASES, ids=[m for m, _ in FLEX_CASES])
@pytest.mark.slow  # compiles flex per encoding and case (make test-slow)
def test_flex_forward_matches_eager(name, mode, case, flex_eager_fallbacks):
    enc = make_encoding(name)
    if "flex" not in supported_backends(enc):
        pytest.skip("flex cannot run this encoding (needs_probabilities)")
    causal = mode == "causal" or enc.causal_only  # causal-only: the second case runs causal
    inputs = build_inputs(case, enc)
    # A fresh dynamo state: each case really runs compiled flex, whatever ran before in this
    # worker (the recompile limit is tested on its own below).
    torch._dynamo.reset()
    with torch.no_grad():
        ref_out, _ = run_backend(enc, inputs, causal, "eager", need_grad=False)
        out, _ = run_backend(enc, inputs, causal, "flex", need_grad=False)
    compare(enc, out, None, ref_out, None, f"{name} flex {case.id} causal={causal}")
    assert not flex_eager_fallbacks, "backend='flex' ran flex_attention uncompiled"


@pytest.mark.slow  # ten compiles
def test_flex_stays_compiled_across_lengths(flex_eager_fallbacks):
    """Decoding-style use: one encoding, many sequence lengths. backend='flex' must keep
    running the compiled kernel (O(L) memory), not fall back to the unfused path once dynamo
    hits its recompile limit (8) because every new length recompiles."""
    biased = [n for n in ENCODINGS if make_encoding(n).has_bias]
    enc = make_encoding((biased or ENCODINGS)[0])
    torch._dynamo.reset()
    with torch.no_grad():
        for length in range(16, 16 * 11, 16):
            q = torch.randn(1, enc.num_heads, length, enc.head_dim)
            attention(q, q, q, enc, causal=True, backend="flex")
            assert not flex_eager_fallbacks, f"flex ran uncompiled at length {length}"


@pytest.mark.parametrize("name", ENCODINGS)
def test_flex_without_cpu_backward_points_to_chunked(name):
    enc = make_encoding(name)
    if "flex" not in supported_backends(enc):
        pytest.skip("flex cannot run this encoding (needs_probabilities)")
    inputs = build_inputs(Case("s", 16, 16), enc)
    q = inputs["q"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="chunked"):
        attention(q, inputs["k"], inputs["v"], enc, causal=True, backend="flex")


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_refuse_encodings_they_cannot_run(name, backend):
    """SDPA and FlexAttention only add a score term: an encoding with value terms, multiplied
    weights or piecewise logits must be refused with a clear error, never run wrongly."""
    enc = make_encoding(name)
    if backend in supported_backends(enc):
        pytest.skip("supported")
    inputs = build_inputs(Case("s", 16, 16), enc)
    with pytest.raises(ValueError, match=f"backend '{backend}' cannot run encoding"):
        attention(inputs["q"], inputs["k"], inputs["v"], enc, causal=True, backend=backend)


@pytest.mark.parametrize("backend", ["auto", "eager", "sdpa", "chunked", "flex"])
def test_causal_only_rejects_non_causal(name, backend):
    enc = make_encoding(name)
    if not enc.causal_only:
        pytest.skip("not a causal-only encoding")
    if backend not in ("auto", *supported_backends(enc)):
        pytest.skip("backend cannot run this encoding")
    inputs = build_inputs(Case("s", 16, 16), enc)
    with pytest.raises(ValueError, match="causal"):
        attention(inputs["q"], inputs["k"], inputs["v"], enc, causal=False, backend=backend)
    if backend == "flex":
        return  # (compiling flex for the single-query call below costs seconds)
    # a single query (decoding) has no future keys: allowed
    one = attention(inputs["q"][:, :, -1:], inputs["k"], inputs["v"], enc, backend=backend)
    ref = attention(inputs["q"], inputs["k"], inputs["v"], enc, causal=True)[:, :, -1:]
    assert_close_rel(one, ref)


def test_chunked_cases_cover_both_paths(name):
    """The long cases above reach the Toeplitz path (a bias that is a function of the
    distance for the call, arange positions) and the tile path (batch positions, a user mask)
    of the chunked backend, each with more than one query block."""
    enc = make_encoding(name)
    if not enc.has_bias:
        pytest.skip("no additive bias: chunked has a single (tile) path")
    paths = {}
    for case in CASES:
        if case.lq <= chunked.FORWARD_BLOCK or case.needs(enc):
            continue
        inp = build_inputs(case, enc)
        call = prepare_call(
            inp["q"],
            inp["k"],
            inp["v"],
            enc,
            q_pos=inp.get("q_pos"),
            k_pos=inp.get("k_pos"),
            causal=True,
            mask=inp.get("mask"),
            scale=None,
            inputs=inp.get("inputs"),
        )
        # the call has a per-distance table (the Toeplitz path, unless weights are changed)
        toeplitz = not call.has_user_mask and call.distance_delta() is not None
        paths[case.id] = toeplitz
        if case.mask or case.pos == "batch":
            assert not toeplitz, f"{case.id} should take the tile path"
        else:
            assert toeplitz == enc.is_distance_only(call.ctx), case.id
    if enc.distance_only:
        assert paths["long"] and paths["long-lq<lk"], paths
