"""PINE (Wang et al. 2024, arXiv 2407.01100; official code wzq016/PINE) against a float64
reference written from the official ``LlamaAttentionWithPS.forward`` (per document query
group and per suffix token: rank the documents by raw attention, shift their positions,
rotate, attend with ``position(key) <= position(query)``), never from relpos; worked
layout values; and the defining property: permuting the documents permutes nothing else."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.rotary.pine import document_shifts, pine_layout

from .formulas import randn, rope_fp64, theta_fp64

SEG = [-1, -1, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3]  # P = 2, lengths [3, 2, 4], suffix of 2


def test_spec_layout_right_aligns_documents_and_starts_the_suffix_after_them():
    layout = pine_layout(torch.tensor([SEG]), len(SEG) + 1)  # one generated token
    assert layout.positions[0].tolist() == [0, 1, 8, 9, 10, 9, 10, 7, 8, 9, 10, 11, 12, 13]
    assert layout.lengths[0].tolist() == [3, 2, 4] and int(layout.documents[0]) == 3


def test_spec_shifts_of_a_ranking():
    shift = document_shifts(torch.tensor([2, 0, 1]), torch.tensor([3, 2, 4]))
    assert shift.tolist() == [4, 7, 0]
    # the documents then sit at [4, 5, 6], [2, 3], [7 .. 10]
    base = {0: [8, 9, 10], 1: [9, 10], 2: [7, 8, 9, 10]}
    placed = {d: [p - int(shift[d]) for p in base[d]] for d in base}
    assert placed == {0: [4, 5, 6], 1: [2, 3], 2: [7, 8, 9, 10]}


def reference(q, k, v, seg):
    """Official PINE attention of one head, q, k, v (L, D) float64, seg a list."""
    L, D = q.shape
    theta = theta_fp64(D)
    seg = torch.tensor(seg)
    n = int(seg[-1])
    lengths = torch.tensor([int((seg == d).sum()) for d in range(n)])
    pos = pine_positions(seg)
    region = (seg >= 0) & (seg < n)
    out = torch.zeros(L, v.shape[1], dtype=torch.float64)

    def attend(rows, positions):  # positions (L,) of the keys as these rows see them
        for i in rows:
            qi = rope_fp64(q[i : i + 1], pos[i : i + 1], theta, "half")
            ks = rope_fp64(k, positions, theta, "half")
            logit = (qi @ ks.T)[0] / D**0.5
            logit = logit.masked_fill(positions > pos[i], -torch.inf)
            out[i] = torch.softmax(logit, -1) @ v

    def doc_weights(i, mask_own):
        logit = (q[i] @ k.T) / D**0.5
        allowed = region & ~((seg == seg[i]) if mask_own else torch.zeros_like(region))
        p = torch.softmax(logit.masked_fill(~allowed, -torch.inf), -1)
        return torch.stack([p[seg == d].sum() / lengths[d] for d in range(n)])

    def shifted(order):
        shift = document_shifts(order, lengths)
        positions = pos.clone()
        for d in range(n):
            positions[seg == d] -= shift[d]
        return positions

    attend([i for i in range(L) if seg[i] == -1], pos)  # prefix: plain RoPE
    for e in range(n):
        rows = [i for i in range(L) if seg[i] == e]
        w = sum(doc_weights(i, True) for i in rows)
        w[e] = torch.finfo(w.dtype).max
        attend(rows, shifted(torch.argsort(w, descending=True, stable=True)))
    for i in range(L):
        if seg[i] == n:
            w = doc_weights(i, False)
            attend([i], shifted(torch.argsort(w, descending=True, stable=True)))
    return out


def pine_positions(seg):
    P, n = int((seg == -1).sum()), int(seg[-1])
    T = int(((seg >= 0) & (seg < n)).sum())
    pos = torch.arange(len(seg))
    for d in range(n):
        idx = (seg == d).nonzero().flatten()
        pos[idx] = P + T - len(idx) + torch.arange(len(idx))
    return pos


def make():
    return relpos.create("pine", num_heads=2, head_dim=8)


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_matches_the_official_forward(backend):
    L = len(SEG)
    q, k, v = (randn(1, 2, L, 8, seed=s) for s in (1, 2, 3))
    out = relpos.attention(q, k, v, make(), causal=True, backend=backend,
                           inputs={"segments": torch.tensor([SEG])})  # fmt: skip
    for h in range(2):
        ref = reference(q[0, h].double(), k[0, h].double(), v[0, h].double(), SEG)
        torch.testing.assert_close(out[0, h].double(), ref, rtol=1e-5, atol=1e-5)


def test_gqa_batch_rows_with_different_layouts_match_the_reference():
    segs = [SEG, [-1, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3]]
    L = len(SEG)
    q, k, v = randn(2, 4, L, 8, seed=4), randn(2, 2, L, 8, seed=5), randn(2, 2, L, 8, seed=6)
    enc = relpos.create("pine", num_heads=4, head_dim=8)
    out = relpos.attention(q, k, v, enc, causal=True, inputs={"segments": torch.tensor(segs)})
    for b in range(2):
        for h in range(4):
            kh, vh = k[b, h // 2].double(), v[b, h // 2].double()
            ref = reference(q[b, h].double(), kh, vh, segs[b])
            torch.testing.assert_close(out[b, h].double(), ref, rtol=1e-5, atol=1e-5)


def test_permuting_the_documents_leaves_the_suffix_unchanged():
    """The defining property: outputs do not depend on the documents' order."""
    torch.manual_seed(0)
    dim, heads = 16, 2
    proj = [torch.randn(dim, heads * 8) for _ in range(3)]
    prefix, suffix = torch.randn(2, dim), torch.randn(3, dim)
    docs = [torch.randn(n, dim) for n in (3, 2, 4)]
    pine = make()

    def run(order, enc=pine):
        x = torch.cat([prefix, *(docs[d] for d in order), suffix])
        seg = [-1] * 2 + sum(([r] * len(docs[d]) for r, d in enumerate(order)), []) + [3] * 3
        q, k, v = ((x @ p).view(1, -1, heads, 8).transpose(1, 2) for p in proj)
        inputs = {"segments": torch.tensor([seg])} if enc is pine else None
        out = relpos.attention(q, k, v, enc, causal=True, inputs=inputs)
        out = out[0].transpose(0, 1)  # (L, H, 8)
        starts = torch.tensor([0, *torch.cumsum(torch.tensor([len(docs[d]) for d in order]), 0)])
        per_doc = {d: out[2 + int(starts[r]) : 2 + int(starts[r + 1])] for r, d in enumerate(order)}
        return out[:2], per_doc, out[-3:]

    p0, d0, s0 = run([0, 1, 2])
    for order in ([2, 0, 1], [1, 2, 0]):
        p1, d1, s1 = run(order)
        torch.testing.assert_close(s1, s0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p1, p0)
        for d in range(3):
            torch.testing.assert_close(d1[d], d0[d], rtol=1e-5, atol=1e-6)
    # the same inputs without PINE (plain causal RoPE) depend on the order
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    assert not torch.allclose(run([2, 0, 1], rope)[2], run([0, 1, 2], rope)[2], atol=1e-4)


def test_decoding_with_the_prompts_segments_equals_the_full_forward():
    L = len(SEG) + 3  # three generated tokens: suffix
    q, k, v = (randn(1, 2, L, 8, seed=s) for s in (7, 8, 9))
    enc, inputs = make(), {"segments": torch.tensor([SEG])}
    full = relpos.attention(q, k, v, enc, causal=True, inputs=inputs)
    cache = relpos.nn.LayerCache()
    n = len(SEG)
    parts = [relpos.attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], enc, causal=True,
                              inputs=inputs, cache=cache)]  # fmt: skip
    for t in range(n, L):
        parts.append(relpos.attention(q[:, :, t : t + 1], k[:, :, t : t + 1],
                                      v[:, :, t : t + 1], enc, causal=True, inputs=inputs,
                                      cache=cache))  # fmt: skip
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=1e-5, atol=1e-6)


def test_documents_see_later_documents_under_causal_true():
    L = len(SEG)
    q, k, v = (randn(1, 2, L, 8, seed=s) for s in (10, 11, 12))
    inputs = {"segments": torch.tensor([SEG])}
    logits = relpos.scores(q, k, make(), inputs=inputs)
    out = relpos.attention(q, k, v, make(), causal=True, inputs=inputs)
    v2 = v.clone()
    v2[:, :, 8] += 1.0  # a key of the last document
    changed = relpos.attention(q, k, v2, make(), causal=True, inputs=inputs)
    assert not torch.allclose(changed[:, :, 2], out[:, :, 2])  # the first document sees it
    torch.testing.assert_close(changed[:, :, :2], out[:, :, :2])  # the prefix does not
    assert torch.isinf(logits[0, :, 2, 11:]).all()  # documents never see the suffix


@pytest.mark.parametrize(
    "segments, message",
    [
        (torch.tensor([[0, 2, 2]]), "rising by 0 or 1"),
        (torch.tensor([[-1, 0, 1, 0]]), "rising by 0 or 1"),
        (torch.tensor([[-1, -1]]), "end in the suffix"),
        (torch.tensor([[0.0, 1.0]]), "integer ids"),
        (torch.zeros(1, 30, dtype=torch.long), "cover 1 .. Lk"),
    ],
)
def test_bad_segments_are_refused_by_name(segments, message):
    q = randn(1, 2, 12, 8)
    with pytest.raises(ValueError, match=message):
        relpos.attention(q, q, q, make(), causal=True, inputs={"segments": segments})
