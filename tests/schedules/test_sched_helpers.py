"""``relpos.schedules``: position helpers against reference values (EndPrompt's positions, BiPE's
``get_bilevel_ids``, the CCA ring map, the position-coupling examples) and hand-checked cases; bad
input raises errors that name the argument."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import schedules as S


# ----------------------------------------------------------------------------- randomized
def test_randomized_positions_are_sorted_distinct_and_in_range():
    gen = torch.Generator().manual_seed(0)
    pos = S.randomized_positions(50, 2048, batch=4, generator=gen)
    assert pos.shape == (4, 50) and pos.dtype == torch.int64
    assert (pos[:, 1:] > pos[:, :-1]).all()  # sorted and distinct
    assert int(pos.min()) >= 0 and int(pos.max()) < 2048
    assert not torch.equal(pos[0], pos[1])  # independent rows
    assert S.randomized_positions(50, 2048).shape == (50,)
    assert torch.equal(S.randomized_positions(8, 8), torch.arange(8))  # the whole range


def test_randomized_positions_are_reproducible_and_uniform():
    a = S.randomized_positions(5, 30, generator=torch.Generator().manual_seed(7))
    b = S.randomized_positions(5, 30, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    # every position is drawn with probability T / N: 3 of 10 over 4000 rows -> 1200 each
    pos = S.randomized_positions(3, 10, batch=4000, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(pos.flatten(), minlength=10)
    assert ((counts - 1200).abs() < 150).all(), counts
    # and the smallest of the sample is 0 with probability 3/10
    assert abs(float((pos[:, 0] == 0).float().mean()) - 0.3) < 0.04


def test_randomized_positions_feed_rope():
    pos = S.randomized_positions(16, 1024, batch=2, generator=torch.Generator().manual_seed(0))
    q, k, v = torch.randn(3, 2, 2, 16, 8).unbind(0)
    enc = relpos.create("rope", num_heads=2, head_dim=8)
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True)
    assert out.shape == (2, 2, 16, 8) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((10, 5), {}, ValueError, "max_length"),
        ((-1, 5), {}, ValueError, "length"),
        ((3, 0), {}, ValueError, "max_length"),
        ((3.0, 5), {}, TypeError, "length"),
        ((3, 5), {"batch": 0}, ValueError, "batch"),
        ((3, 5), {"generator": 1}, TypeError, "generator"),
    ],
)
def test_randomized_positions_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        S.randomized_positions(*args, **kwargs)


# ----------------------------------------------------------------------------- coupling
def test_coupled_positions_match_spec_examples():
    # HanseulJo/position-coupling's example: 653+049=0702, start 1
    assert S.coupled_positions("653+049=0702").tolist() == [4, 3, 2, 1, 4, 3, 2, 6, 5, 4, 3, 2]
    # 123+045= with the answer reversed (8610), start 1
    out = S.coupled_positions("123+045=8610", reverse_answer=True).tolist()
    assert out == [4, 3, 2, 1, 4, 3, 2, 1, 2, 3, 4, 5]


def test_coupled_positions_align_digits_of_equal_significance():
    s = "9876+0123+4444=14443"
    pos = S.coupled_positions(s, start=5)
    units = [s.index("+") - 1, s.index("+", 5) - 1, s.index("=") - 1, len(s) - 1]
    assert pos[units].tolist() == [6, 6, 6, 6]  # units digit: start + 1
    assert pos[s.index("+")] == 5 and pos[s.index("=")] == 5 + 5 + 1
    assert pos[s.index("=") + 1] == 10  # the leading answer digit (significance 4)


def test_coupled_positions_on_token_ids_with_bos_eos_and_batch():
    vocab = {c: i for i, c in enumerate("0123456789+=")} | {"<s>": 12, "</s>": 13}
    rows = [["<s>", *"653+049=0702", "</s>"], ["<s>", *"123+045=0168", "</s>"]]
    ids = torch.tensor([[vocab[t] for t in row] for row in rows])
    pos = S.coupled_positions(
        ids, digit_ids=range(10), equals_id=vocab["="], start=torch.tensor([1, 3])
    )
    assert pos.shape == ids.shape
    assert pos[0].tolist() == [0, 4, 3, 2, 1, 4, 3, 2, 6, 5, 4, 3, 2, 0]
    assert pos[1].tolist() == [0, 6, 5, 4, 3, 6, 5, 4, 8, 7, 6, 5, 4, 0]


def test_coupling_start_keeps_ids_within_max_position():
    gen = torch.Generator().manual_seed(0)
    starts = S.coupling_start(22, 6, batch=2000, generator=gen)
    assert int(starts.min()) == 1 and int(starts.max()) == 22 - 6 - 1
    top = S.coupled_positions("99999+00001=100000", start=int(starts.max()))
    assert int(top.max()) == 22
    rev = S.coupling_start(22, 6, reverse_answer=True, batch=2000, generator=gen)
    assert int(rev.max()) == 22 - 6
    assert S.coupling_start(22, 6).shape == ()


@pytest.mark.parametrize(
    "tokens,kwargs,error,match",
    [
        ("12+34", {}, ValueError, "'='"),
        ("12+34=4=6", {}, ValueError, "'='"),
        ("=46", {}, ValueError, "operand"),
        ("12+34=", {}, ValueError, "answer"),
        ("12+34 =46", {}, ValueError, "non-digit"),
        ("12+34=46", {"start": 0}, ValueError, "start"),
        ("12+34=46", {"reverse_answer": 1}, TypeError, "reverse_answer"),
        ("12+34=46", {"digit_ids": range(10)}, ValueError, "digit_ids"),
        (torch.tensor([1, 2]), {}, ValueError, "digit_ids"),
        (torch.tensor([1.0, 2.0]), {"digit_ids": [1], "equals_id": 2}, TypeError, "tokens"),
        (torch.tensor([1, 2]), {"digit_ids": [1, 2], "equals_id": 2}, ValueError, "equals_id"),
        (
            torch.tensor([[1, 3, 2, 1], [1, 3, 2, 1]]),
            {"digit_ids": [1], "equals_id": 2, "start": torch.tensor([1, 2, 3])},
            ValueError,
            "start",
        ),
    ],
)
def test_coupled_positions_bad_input(tokens, kwargs, error, match):
    with pytest.raises(error, match=match):
        S.coupled_positions(tokens, **kwargs)


def test_coupling_start_bad_input():
    with pytest.raises(ValueError, match="max_position"):
        S.coupling_start(5, 4)
    with pytest.raises(ValueError, match="answer_length"):
        S.coupling_start(20, 0)


# ----------------------------------------------------------------------------- BiPE
def test_bilevel_positions_match_spec_r16():
    intra, segment = S.bilevel_positions(torch.tensor([5, 6, 869, 7, 8, 9, 13, 10]), (869, 13))
    assert intra.tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert segment.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]


def test_bilevel_positions_batch_clip_and_edges():
    ids = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 1]])
    intra, segment = S.bilevel_positions(ids, [0], max_intra=3)
    assert intra.tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 0]]
    assert segment.tolist() == [[0, 0, 0, 0, 0, 0], [0, 1, 2, 2, 2, 3]]
    empty = S.bilevel_positions(torch.zeros(2, 0, dtype=torch.long), [0])
    assert [t.shape for t in empty] == [(2, 0), (2, 0)]


def test_bilevel_positions_drive_rope_and_a_learned_table():
    """BiPE-RoPE = rope on the segment index + learned absolute table on the intra offset."""
    toks = torch.tensor([[5, 6, 869, 7, 8, 9, 13, 10]])
    intra, segment = S.bilevel_positions(toks, (869, 13), max_intra=1023)
    table = relpos.create("learned", num_heads=2, head_dim=8, max_positions=1024)
    assert table.embed(intra, 16).shape == (1, 8, 16)
    q, k, v = torch.randn(3, 1, 2, 8, 8).unbind(0)
    rope = relpos.create("rope", num_heads=2, head_dim=8)
    out = relpos.attention(q, k, v, rope, q_pos=segment, k_pos=segment, causal=True)
    assert torch.isfinite(out).all()


def test_bilevel_positions_bad_input():
    with pytest.raises(ValueError, match="separators"):
        S.bilevel_positions(torch.tensor([1, 2]), [])
    with pytest.raises(TypeError, match="tokens"):
        S.bilevel_positions(torch.tensor([1.0]), [1])
    with pytest.raises(ValueError, match="tokens"):
        S.bilevel_positions(torch.zeros(1, 1, 1, dtype=torch.long), [1])
    with pytest.raises(ValueError, match="max_intra"):
        S.bilevel_positions(torch.tensor([1]), [1], max_intra=-1)


# ----------------------------------------------------------------------------- EndPrompt
def test_endprompt_positions_match_spec_r14():
    pos = S.endprompt_positions(30, 65536, tail_length=5)
    assert pos.tolist() == [*range(25), *range(65531, 65536)]


def test_endprompt_positions_fall_back_to_arange():
    assert S.endprompt_positions(10, 100, tail_length=0).tolist() == list(range(10))
    assert S.endprompt_positions(10, 100, tail_length=10).tolist() == list(range(10))
    assert S.endprompt_positions(10, 100, tail_length=-3).tolist() == list(range(10))
    assert S.endprompt_positions(40, 8192)[-20:].tolist() == list(range(8172, 8192))


def test_endprompt_positions_bad_input():
    with pytest.raises(ValueError, match="target_length"):
        S.endprompt_positions(30, 20)
    with pytest.raises(TypeError, match="tail_length"):
        S.endprompt_positions(30, 100, tail_length=2.5)


# ----------------------------------------------------------------------------- AnchorAttention
def test_pack_with_anchor_flex_form():
    docs = [torch.tensor([7, 8, 9]), torch.tensor([4, 5])]
    tok, doc, pos = S.pack_with_anchor(docs, anchor_token=1)
    assert tok.tolist() == [1, 7, 8, 9, 4, 5]
    assert doc.tolist() == [0, 1, 1, 1, 2, 2]
    assert pos.tolist() == [0, 1, 2, 3, 4, 5]  # not reset per document


def test_pack_with_anchor_flash_form():
    docs = [torch.tensor([7, 8, 9]), torch.tensor([4, 5])]
    tok, doc, pos = S.pack_with_anchor(docs, anchor_token=1, per_document=True)
    assert tok.tolist() == [1, 7, 8, 9, 1, 4, 5]
    assert doc.tolist() == [1, 1, 1, 1, 2, 2, 2]
    assert pos.tolist() == [0, 1, 2, 3, 0, 5, 6]


def test_anchor_mask_is_causal_documents_plus_anchor():
    doc = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    L = doc.numel()
    expected = torch.tensor(
        [[j <= i and (doc[i] == doc[j] or doc[j] == 0) for j in range(L)] for i in range(L)]
    )
    mask = S.anchor_mask(doc)
    assert mask.shape == (1, 1, L, L) and torch.equal(mask[0, 0], expected)
    assert torch.equal(S.anchor_mask(doc, num_queries=2)[0, 0], expected[-2:])
    # the mask function evaluates any tile (FlexAttention mask_mod form), batched ids too
    fn = S.anchor_mask_mod(torch.stack([doc, torch.zeros_like(doc)]))
    b = torch.tensor([0, 1])[:, None, None, None]
    tile = fn(b, torch.zeros_like(b), torch.arange(3, 6)[:, None], torch.arange(2, 7)[None, :])
    assert torch.equal(tile[0, 0], expected[3:6, 2:7])
    assert torch.equal(tile[1, 0], torch.ones(7, 7, dtype=torch.bool).tril()[3:6, 2:7])


def test_anchor_attention_equals_each_document_with_its_anchor():
    """With the anchor mask, a document's tokens attend exactly as if the sequence were only
    the anchor followed by that document (global RoPE positions kept)."""
    docs = [torch.arange(10, 15), torch.arange(20, 24), torch.arange(30, 36)]
    tok, doc, pos = S.pack_with_anchor(docs, anchor_token=1)
    emb = torch.randn(40, 3, 2, 8, generator=torch.Generator().manual_seed(0))
    q, k, v = (emb[tok, n].transpose(0, 1)[None] for n in range(3))  # (1, 2, L, 8)
    enc = relpos.create("rope", num_heads=2, head_dim=8)
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True, mask=S.anchor_mask(doc))
    for d in (1, 2, 3):
        keep = (doc == 0) | (doc == d)
        sub = relpos.attention(
            q[:, :, keep], k[:, :, keep], v[:, :, keep], enc,
            q_pos=pos[keep], k_pos=pos[keep], causal=True,
        )  # fmt: skip
        torch.testing.assert_close(out[:, :, doc == d], sub[:, :, 1:], rtol=1e-5, atol=1e-6)


def test_anchor_bad_input():
    with pytest.raises(ValueError, match="documents"):
        S.pack_with_anchor([], 1)
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        S.pack_with_anchor([torch.tensor([1]), torch.tensor([[1]])], 1)
    with pytest.raises(TypeError, match="anchor_token"):
        S.pack_with_anchor([torch.tensor([1])], 1.0)
    with pytest.raises(TypeError, match="doc_ids"):
        S.anchor_mask([0, 1, 1])
    with pytest.raises(ValueError, match="num_queries"):
        S.anchor_mask(torch.tensor([0, 1]), num_queries=3)


# ----------------------------------------------------------------------------- CCA
def test_concentric_rings_match_spec_6x6():
    expected = [
        [0, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 0],
        [0, 1, 2, 2, 1, 0],
        [0, 1, 2, 2, 1, 0],
        [0, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    assert S.concentric_rings(6, 6).tolist() == expected


def test_concentric_rings_equal_ring_filling_on_24x24():
    """The repo fills rings from the border inwards; peel the grid the same way."""
    n = 24
    grid = torch.full((n, n), -1)
    for ring in range(n // 2):
        lo, hi = ring, n - 1 - ring
        grid[lo, lo : hi + 1] = grid[hi, lo : hi + 1] = ring
        grid[lo : hi + 1, lo] = grid[lo : hi + 1, hi] = ring
    assert torch.equal(S.concentric_rings(n, n), grid)
    assert int(grid.max()) == 11


def test_cca_positions_for_llava():
    p = 35
    pos = S.cca_positions(p, 24, 24, 10)
    assert pos.shape == (p + 576 + 10,)
    assert pos[:p].tolist() == list(range(p))
    assert torch.equal(pos[p : p + 576], p + S.concentric_rings(24, 24).flatten())
    assert pos[p + 576 :].tolist() == list(range(p + 12, p + 22))  # text continues at p + 12
    t = p + 576 + 3  # a decoding step at sequence index t: position t - 576 + 12
    assert int(pos[t]) == t - 576 + 12


def test_cca_mask_is_ring_order_in_the_image_and_causal_for_text():
    p, h, w, s = 2, 4, 5, 3
    pos = S.cca_positions(p, h, w, s)
    rings = S.concentric_rings(h, w).flatten()
    L = pos.numel()

    def allowed(i: int, j: int) -> bool:
        img_i, img_j = p <= i < p + h * w, p <= j < p + h * w
        if img_i and img_j:
            return bool(rings[j - p] <= rings[i - p])  # ring <= own ring, both directions
        if img_i:  # image query: text before only
            return j < p
        return j <= i  # text: causal

    expected = torch.tensor([[allowed(i, j) for j in range(L)] for i in range(L)])
    assert torch.equal(S.cca_mask(pos)[0, 0], expected)
    fn = S.cca_mask_mod(pos)
    z = torch.zeros((), dtype=torch.long)
    tile = fn(z, z, torch.arange(L)[:, None], torch.arange(L)[None, :])
    assert torch.equal(tile, expected)


def test_cca_bad_input():
    with pytest.raises(ValueError, match="height"):
        S.concentric_rings(0, 4)
    with pytest.raises(ValueError, match="prefix_length"):
        S.cca_positions(-1, 4, 4)
    with pytest.raises(TypeError, match="positions"):
        S.cca_mask(torch.arange(4.0))


def test_mask_mods_run_under_flex_attention_vmap():
    """FlexAttention evaluates a mask_mod on 0-d index tensors under vmap (``create_mask``,
    ``create_block_mask``): the closures must give the dense masks there too."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    packed = S.pack_with_anchor([torch.arange(10, 30), torch.arange(30, 45)], anchor_token=1)
    L = packed.tokens.numel()
    dense = flex.create_mask(S.anchor_mask_mod(packed.doc_ids), 1, 1, L, L, device="cpu")
    assert torch.equal(dense, S.anchor_mask(packed.doc_ids))
    pos = S.cca_positions(3, 5, 6, 4)
    L = pos.numel()
    dense = flex.create_mask(S.cca_mask_mod(pos), 1, 1, L, L, device="cpu")
    assert torch.equal(dense, S.cca_mask(pos))
