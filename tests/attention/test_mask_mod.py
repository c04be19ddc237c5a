"""``relpos.attention(..., mask_mod=...)``: structured masks without an ``Lq x Lk`` tensor.

What ``mask_mod`` means is pinned here against dense bool masks built independently
(``anchor_mask``, ``cca_mask`` and a hand-written sliding window); that every backend agrees
with ``eager`` under a ``mask_mod`` is part of test_backends (the ``docs`` cases, every
encoding).
"""

from __future__ import annotations

import pytest
import torch

import relpos
from conformance.common import RTOL, assert_close_rel, make_encoding, random_documents
from relpos.attention import choose_backend, supported_backends
from relpos.attention.api import candidate_backends
from relpos.attention.call import prepare_call
from relpos.schedules import anchor_mask, anchor_mask_mod, cca_mask, cca_mask_mod, cca_positions

H, D = 4, 16


def qkv(lq: int, lk: int, batch: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, H, lq, D, generator=g),
        torch.randn(batch, H, lk, D, generator=g),
        torch.randn(batch, H, lk, D, generator=g),
    )


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
@pytest.mark.parametrize("name", ["rope", "alibi", "kerple-log", "shaw", "dca"])
def test_mask_mod_equals_the_dense_mask_it_describes(name, backend):
    enc = make_encoding(name)
    if backend not in supported_backends(enc):
        pytest.skip(f"{backend} cannot run {name}")
    L = 40
    docs = random_documents(2, L, torch.Generator().manual_seed(1))
    q, k, v = qkv(L, L)
    out = relpos.attention(
        q, k, v, enc, causal=True, mask_mod=anchor_mask_mod(docs, causal=False), backend=backend
    )
    dense = anchor_mask(docs)  # (B, 1, L, L), causal included
    ref = relpos.attention(q, k, v, enc, causal=True, mask=dense, backend="eager")
    assert_close_rel(out, ref)


def test_queries_are_passed_in_key_coordinates_so_decoding_reuses_the_sequence_mask():
    """With a KV cache the call has ``Lq < Lk``: ``q_idx`` is ``i + Lk - Lq``, so the
    mask_mod written for the whole sequence gives the last rows of the full call."""
    enc = make_encoding("alibi")
    L = 36
    docs = random_documents(2, L, torch.Generator().manual_seed(2))
    mod = anchor_mask_mod(docs)
    q, k, v = qkv(L, L)
    for backend in ("eager", "sdpa", "chunked"):
        full = relpos.attention(q, k, v, enc, mask_mod=mod, backend=backend)
        last = relpos.attention(q[:, :, -5:], k, v, enc, mask_mod=mod, backend=backend)
        assert_close_rel(last, full[:, :, -5:])
    rows = prepare_call(
        q[:, :, -5:],
        k,
        v,
        None,
        q_pos=None,
        k_pos=None,
        causal=False,
        mask=None,
        scale=None,
        mask_mod=mod,
    ).allowed_block(0, 5, L)
    assert torch.equal(rows.expand(2, 1, 5, L), anchor_mask(docs, num_queries=5))


def test_concentric_causal_attention_mask_mod_equals_its_dense_mask():
    pos = cca_positions(3, 5, 6, 4)  # text, a 5 x 6 image in rings, text
    L = pos.numel()
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    q, k, v = qkv(L, L, batch=1)
    kw = dict(q_pos=pos, k_pos=pos)
    ref = relpos.attention(q, k, v, enc, mask=cca_mask(pos), backend="eager", **kw)
    for backend in ("sdpa", "chunked"):
        out = relpos.attention(q, k, v, enc, mask_mod=cca_mask_mod(pos), backend=backend, **kw)
        assert_close_rel(out, ref)


def test_head_dependent_mask_mod_and_combination_with_mask_and_causal():
    """A sliding window whose width depends on the head, AND a padding mask, AND causal."""
    enc = make_encoding("t5")
    L = 30
    q, k, v = qkv(L, L)

    def window(b, h, i, j):
        return (i - j) < 3 + 4 * h

    pad = torch.rand(2, 1, 1, L, generator=torch.Generator().manual_seed(3)) > 0.3
    pad = pad | torch.eye(L, dtype=torch.bool)[None, None]  # every row keeps itself
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    dense = torch.stack([(i - j) < 3 + 4 * h for h in range(H)])[None] & pad & (j <= i)
    ref = relpos.attention(q, k, v, enc, mask=dense, backend="eager")
    for backend in ("eager", "sdpa", "chunked"):
        out = relpos.attention(
            q, k, v, enc, causal=True, mask=pad, mask_mod=window, backend=backend
        )
        assert_close_rel(out, ref, msg=backend)


def test_gradients_through_the_chunked_backend_match_eager():
    enc = make_encoding("kerple-log")
    L = 300
    docs = random_documents(1, L, torch.Generator().manual_seed(4))
    mod = anchor_mask_mod(docs, causal=False)
    grads = {}
    for backend in ("eager", "chunked"):
        q, k, v = (t.requires_grad_(True) for t in qkv(L, L, batch=1))
        out = relpos.attention(q, k, v, enc, causal=True, mask_mod=mod, backend=backend)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        grads[backend] = torch.autograd.grad((out * w).sum(), (q, k, v, *enc.parameters()))
    for got, ref in zip(grads["chunked"], grads["eager"], strict=True):
        assert_close_rel(got, ref, rtol=5 * RTOL)


def test_auto_keeps_large_mask_mods_off_dense_tensors(largest_allocation):
    """Above the dense limit ``auto`` evaluates the mask_mod per query block (chunked):
    no tensor of ``L x L`` elements, for a rotary encoding and for a bias."""
    L = 2048
    docs = random_documents(1, L, torch.Generator().manual_seed(6))
    mod = anchor_mask_mod(docs)
    q, k, v = qkv(L, L, batch=1)
    for name in ("rope", "alibi"):
        enc = relpos.create(name, num_heads=H, head_dim=D)
        call = prepare_call(
            q, k, v, enc, q_pos=None, k_pos=None, causal=True, mask=None, scale=None, mask_mod=mod
        )
        assert choose_backend(call) == "chunked"
        assert "sdpa" not in candidate_backends(call) and "eager" not in candidate_backends(call)
        small = prepare_call(
            q[..., :64, :],
            k[..., :64, :],
            v[..., :64, :],
            enc,
            q_pos=None,
            k_pos=None,
            causal=True,
            mask=None,
            scale=None,
            mask_mod=mod,
        )
        # below the limit the dense paths are candidates, and the measured table chooses
        assert {"sdpa", "eager"} <= set(candidate_backends(small))
        assert choose_backend(small) in candidate_backends(small)
        with torch.no_grad(), largest_allocation() as probe:
            out = relpos.attention(q, k, v, enc, causal=True, mask_mod=mod)
        assert probe.largest < L * L // 2, probe.op  # tiles: H x 2^18 elements
        rows = slice(L - 64, L)  # the last rows against the dense mask (eager)
        ref = relpos.attention(
            q[:, :, rows], k, v, enc, mask=anchor_mask(docs)[..., rows, :], backend="eager"
        )
        assert_close_rel(out[:, :, rows], ref)


def test_flex_builds_its_block_mask_from_the_mask_mod():
    enc = make_encoding("kerple-log")
    L = 128
    docs = random_documents(1, L, torch.Generator().manual_seed(7))
    q, k, v = qkv(L, L, batch=1)
    with torch.no_grad():
        out = relpos.attention(
            q, k, v, enc, causal=True, mask_mod=anchor_mask_mod(docs), backend="flex"
        )
    ref = relpos.attention(q, k, v, enc, mask=anchor_mask(docs), backend="eager")
    assert_close_rel(out, ref)


def test_bad_mask_mods_are_refused_with_the_expected_form():
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    q, k, v = qkv(8, 8)
    with pytest.raises(TypeError, match="mask_mod must be a callable"):
        relpos.attention(q, k, v, enc, mask_mod=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="must return a bool tensor"):
        relpos.attention(q, k, v, enc, mask_mod=lambda b, h, i, j: (i - j).float())
    with pytest.raises(ValueError, match="broadcastable to"):
        relpos.attention(q, k, v, enc, mask_mod=lambda b, h, i, j: torch.ones(3, 3).bool())


def test_multihead_attention_decodes_with_the_sequence_mask_mod():
    """``relpos.nn.MultiHeadAttention``: prefill + one-token steps with a KV cache under the
    same mask_mod equal one full forward."""
    from relpos.nn import MultiHeadAttention
    from relpos.nn.cache import LayerCache

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, "rope")
    L = 24
    docs = random_documents(1, L, torch.Generator().manual_seed(8))
    mod = anchor_mask_mod(docs)
    x = torch.randn(1, L, 32)
    with torch.no_grad():
        full = mha(x, mask_mod=mod)
        cache = LayerCache()
        steps = [mha(x[:, :10], cache=cache, mask_mod=mod)]
        steps += [mha(x[:, t : t + 1], cache=cache, mask_mod=mod) for t in range(10, L)]
        unmasked = mha(x)
    assert_close_rel(torch.cat(steps, 1), full)
    assert not torch.allclose(unmasked, full, atol=1e-3)  # the documents really were masked


def test_transformer_lm_trains_on_packed_documents_without_cross_document_attention():
    """``TransformerLM(..., mask_mod=anchor_mask_mod(doc_ids))``: the logits of a document do
    not change when another document's tokens change (only the anchor is shared)."""
    from relpos.schedules import pack_with_anchor

    torch.manual_seed(0)
    model = relpos.nn.TransformerLM(50, dim=32, depth=2, num_heads=4, encoding="alibi").eval()
    g = torch.Generator().manual_seed(9)
    docs = [torch.randint(3, 50, (n,), generator=g) for n in (7, 9, 6)]
    packed = pack_with_anchor(docs, anchor_token=1)
    changed = [docs[0], torch.randint(3, 50, (9,), generator=g), docs[2]]
    other = pack_with_anchor(changed, anchor_token=1)
    mod = anchor_mask_mod(packed.doc_ids)
    with torch.no_grad():
        a = model(packed.tokens[None], mask_mod=mod)
        b = model(other.tokens[None], mask_mod=mod)
        c = model(other.tokens[None])
    first, last = packed.doc_ids == 1, packed.doc_ids == 3
    torch.testing.assert_close(a[0, first], b[0, first])
    torch.testing.assert_close(a[0, last], b[0, last])  # document 3 never sees document 2
    assert not torch.allclose(a[0, last], c[0, last], atol=1e-4)  # without the mask it does
