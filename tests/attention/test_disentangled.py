"""``fold-band`` (``relpos.attention.disentangled``): DeBERTa's bias folded into two q/k
channels outside the band where its table rows change, the band gathered, merged by
log-sum-exp.

Specification: the saturation distances are where ``deberta_relative_index`` stops changing
(checked by brute force over the bucket function, and pinned for the default 256 / 512
configuration: bucket 255 is reached at |d| = 506, the reference buckets of
tests/encodings/contextual/test_deberta.py have bucket(510) = 255); the folded regions only hold
pairs whose rows are the folds' constant rows; forward and gradients equal the eager backend (the
materialised formula) in float64 to
rounding, for every option that changes the bias (c2p / p2c subsets, paper p2c, no buckets,
unclamped buckets), causal and not, Lq != Lk, dead rows, grouped keys, one-row and several-row
query blocks. transformers' ``DisentangledSelfAttention`` is the oracle in
tests/oracle/test_oracle_hf_deberta.py.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import disentangled, plan
from relpos.attention.api import facts
from relpos.attention.call import prepare_call
from relpos.attention.disentangled import _regions, disentangled_fold_pays
from relpos.encodings.contextual.deberta import deberta_relative_index, table_saturation

H, D = 2, 4

SATURATION_CASES = [(256, 512, True), (256, 512, False), (16, 64, True), (16, 64, False)]
SATURATION_CASES += [(6, 20, True), (33, 100, False), (4, 8, True), (-1, 24, True), (-1, 1, True)]


@pytest.mark.parametrize("buckets,max_rel,clamp", SATURATION_CASES)
def test_saturation_is_where_the_table_row_stops_changing(buckets, max_rel, clamp):
    lo, hi = table_saturation(buckets, max_rel, clamp)
    far = 4 * max(max_rel, abs(buckets)) + 10
    d = torch.arange(-far, far + 1)
    rows = deberta_relative_index(
        d, position_buckets=buckets, max_relative_positions=max_rel, clamp_buckets=clamp
    )
    assert bool((rows[1:] >= rows[:-1]).all()), "rows are monotone in the distance"
    at = {int(x): int(r) for x, r in zip(d, rows, strict=True)}
    assert lo <= 0 <= hi
    assert all(at[x] == at[hi] for x in range(hi, far + 1))
    assert all(at[x] == at[lo] for x in range(-far, lo + 1))
    if hi > 0:
        assert at[hi - 1] != at[hi]
    if lo < 0:
        assert at[lo + 1] != at[lo]


def test_saturation_of_the_default_buckets_is_pinned():
    """256 buckets over 512 positions: ``ceil(log(|d| / 128) / log(511 / 128) * 127) = 127``
    from |d| = 506 (128 * (511/128)^(126/127) = 505.5), so rows 511 / 1 from there; without
    the clamp the negative side keeps falling to row 0 at d = -512."""
    assert table_saturation(256, 512, True) == (-506, 506)
    assert table_saturation(256, 512, False) == (-512, 506)
    assert table_saturation(-1, 24, True) == (-24, 23)  # clamp(d + 24, 0, 47)
    enc = relpos.create("deberta", num_heads=H, head_dim=D, paper_p2c=True, clamp_buckets=False)
    assert enc.saturation() == (-512, 512)  # p2c reads idx(-d): both signs must saturate


def _enc(**options):
    options = {"position_buckets": 8, "max_relative_positions": 16, **options}
    enc = relpos.create("deberta", num_heads=H, head_dim=D, **options).double()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return enc


def _qkv(lq, lk, hkv=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((1, H, lq, D), (1, hkv, lk, D), (1, hkv, lk, D + 1))
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def _run(enc, q, k, v, backend, **kw):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = relpos.attention(q, k, v, enc, backend=backend, **kw)
    wrt = [q, k, v, *(p for p in enc.parameters() if p.requires_grad)]
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
    return out, [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True)]


OPTION_CASES = [
    pytest.param({}, id="buckets8"),
    pytest.param({"pos_att_type": "c2p"}, id="c2p-only"),
    pytest.param({"pos_att_type": "p2c"}, id="p2c-only"),
    pytest.param({"paper_p2c": True}, id="paper-p2c"),
    pytest.param({"clamp_buckets": False}, id="unclamped"),
    pytest.param({"position_buckets": -1, "max_relative_positions": 6}, id="no-buckets"),
]
# (Lq, Lk, kv heads, causal, explicit positions)
SHAPE_CASES = [
    (40, 40, H, False, None),
    (40, 40, H, True, None),
    (9, 45, H, False, None),
    (9, 45, H, True, None),
    (45, 20, H, True, "lq>lk"),  # the first queries see no key: dead rows
    (30, 37, 1, False, None),  # grouped keys
    (25, 30, H, False, "shifted"),  # positions offset: q 100.., k 3..
]


@pytest.mark.parametrize("options", OPTION_CASES)
@pytest.mark.parametrize("rows", [3, 7, 256])
def test_fold_deberta_equals_eager_in_float64(options, rows, monkeypatch):
    monkeypatch.setattr(disentangled, "BLOCK_ROWS", rows)
    enc = _enc(**options)
    for lq, lk, hkv, causal, pos in SHAPE_CASES:
        q, k, v = _qkv(lq, lk, hkv)
        kw: dict = {"causal": causal}
        if pos == "lq>lk":
            kw.update(q_pos=torch.arange(lq), k_pos=torch.arange(lk) + (lq - lk))
        elif pos == "shifted":
            kw.update(q_pos=torch.arange(lq) + 100, k_pos=torch.arange(lk) + 3)
        assert plan(q, k, v, enc, backend="fold", **kw) == ("fold", "fold-band")
        ref, ref_g = _run(enc, q, k, v, "eager", **kw)
        out, out_g = _run(enc, q, k, v, "fold", **kw)
        label = f"{options} {lq}x{lk} hkv={hkv} causal={causal} {pos}"
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12, msg=label)
        for n, (a, e) in enumerate(zip(out_g, ref_g, strict=True)):
            torch.testing.assert_close(a, e, rtol=1e-11, atol=1e-11, msg=f"{label} grad {n}")
        if pos == "lq>lk":
            assert (out[:, :, : lq - lk] == 0).all() and (out_g[0][:, :, : lq - lk] == 0).all()


def test_fold_deberta_regions_hold_only_saturated_pairs():
    """Every pair a fold computes has the fold's rows on both terms; the three parts of each
    block partition its visible keys."""
    enc = _enc(paper_p2c=True)
    for lq, lk, causal, q0 in ((40, 40, False, 0), (9, 45, True, 36), (30, 37, False, 50)):
        q, k, v = _qkv(lq, lk)
        q_pos = torch.arange(lq) + q0
        call = prepare_call(
            q, k, v, enc, q_pos=q_pos, k_pos=torch.arange(lk), causal=causal, mask=None, scale=None
        )
        regions = _regions(call, 6)
        lo, hi = enc.saturation()
        folded = 0
        for s, e, a, b, c in regions.blocks():
            assert 0 <= a <= b <= c <= lk
            d = q_pos[s:e, None] - torch.arange(lk)[None, :]
            assert bool((d[:, :a] >= hi).all()) and bool((d[:, b:c] <= lo).all())
            if causal:  # every folded key is visible to every row; the rest are in the band
                assert c == b and a <= max(0, s + call.causal_offset + 1)
            else:
                assert c == lk
            folded += (e - s) * (a + c - b)
        assert folded == regions.folded_pairs()


def test_fold_deberta_gradcheck():
    enc = _enc()
    q, k, v = (t.requires_grad_(True) for t in _qkv(20, 22, seed=3))

    def f(q, k, v):
        return relpos.attention(q, k, v, enc, backend="fold", causal=False)

    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


def test_auto_may_fold_deberta_wherever_the_fold_applies():
    """The band fold is a candidate of ``auto`` (kind ``band``) wherever it applies; the
    policy table's measurement decides whether it runs. A user mask: no fold, the tile
    path."""
    enc = relpos.create("deberta", num_heads=H, head_dim=D)  # 256 buckets, saturation 506
    x = torch.zeros(1, H, 2048, D)
    f = facts(x, x, x, enc)
    assert f.kind == "band" and "fold" in f.candidates
    short = torch.zeros(1, H, 600, D)
    assert "fold" in facts(short, short, short, enc).candidates
    call = prepare_call(
        short, short, short, enc, q_pos=None, k_pos=None, causal=False, mask=None, scale=None
    )
    assert disentangled_fold_pays(call, 0.0) and not disentangled_fold_pays(call)
    mask = torch.ones(2048, 2048, dtype=torch.bool)
    masked = facts(x, x, x, enc, mask=mask)
    assert masked.kind == "tile" and "fold" not in masked.candidates
    assert plan(x, x, x, enc, mask=mask)[1] == "tile"


def test_fold_deberta_refuses_masks_and_other_positions_by_name():
    enc = _enc()
    q, k, v = _qkv(12, 12)
    with pytest.raises(ValueError, match="fold.*mask"):
        relpos.attention(q, k, v, enc, backend="fold", mask=torch.ones(12, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match="fold.*mask"):
        relpos.attention(q, k, v, enc, backend="fold", mask_mod=lambda b, h, i, j: i >= j)
    spread = torch.arange(12) * 2  # integer positions, but not a range
    with pytest.raises(ValueError, match="fold.*range"):
        relpos.attention(q, k, v, enc, backend="fold", q_pos=spread, k_pos=spread)


def test_fold_deberta_empty_and_half_types():
    enc = _enc().float()
    q = torch.randn(1, H, 5, D)
    empty = torch.randn(1, H, 0, D)
    out = relpos.attention(
        q, empty, empty, enc, backend="fold", q_pos=torch.arange(5), k_pos=torch.arange(0)
    )
    assert out.shape == (1, H, 5, D) and (out == 0).all()
    q, k, v = (t.float() for t in _qkv(40, 60, seed=2))
    ref = relpos.attention(q, k, v, enc, backend="eager")
    for dtype in (torch.bfloat16, torch.float16):
        low = [t.to(dtype) for t in (q, k, v)]
        out = relpos.attention(*low, enc, backend="fold").float()
        dense = relpos.attention(*low, enc, backend="sdpa").float()
        assert out.dtype == torch.float32
        assert (out - ref).abs().max() <= 2 * (dense - ref).abs().max() + 1e-3
