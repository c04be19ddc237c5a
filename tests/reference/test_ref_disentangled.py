"""Transformer-XL and DeBERTa against the spec (../shared/spec/formulas-bias.md §10, §11).

* DeBERTa: the pinned log buckets and c2p indices (bucket_size 256, max_position 512);
  logits of the code form and of the paper form against dense references written from the
  formulas (every (i, j) pair looked up explicitly, an (Lq, Lk, H, D) tensor).
* Transformer-XL: the sinusoid ``R_t = [sin(t w), cos(t w)]``; logits, outputs and gradients
  against a dense reference written from the paper formula, on the eager and chunked backends,
  and outputs against the official computation (``_rel_shift`` over ``klen - 1 .. 0`` with a
  memory), whose shift is first checked on the spec's example.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import relpos
from relpos.attention import chunked
from relpos.encodings.contextual.deberta import deberta_log_bucket, deberta_relative_index

B, H, D = 2, 4, 8

# formulas-bias.md §11, "Reference (bucket_size=256, max_pos=512; confirmed with the official
# function)".
DELTA = [
    0, 1, -1, 64, 127, -127, 128, -128, 129, -129, 130, 200, -200, 300, 400, 510, 511, -511, 600,
    1000,
]  # fmt: skip
BUCKET = [
    0, 1, -1, 64, 127, -127, 128, -128, 129, -129, 130, 169, -169, 207, 233, 255, 255, -255, 255,
    255,
]  # fmt: skip
C2P_IDX = [
    256, 257, 255, 320, 383, 129, 384, 128, 385, 127, 386, 425, 87, 463, 489, 511, 511, 1, 511,
    511,
]  # fmt: skip


# ---------------------------------------------------------------------------- DeBERTa
def test_deberta_log_buckets_match_spec() -> None:
    got = deberta_log_bucket(torch.tensor(DELTA), 256, 512)
    assert got.dtype == torch.int64
    assert got.tolist() == BUCKET


def test_deberta_c2p_index_matches_spec() -> None:
    got = deberta_relative_index(
        torch.tensor(DELTA), position_buckets=256, max_relative_positions=512
    )
    assert got.tolist() == C2P_IDX
    enc = relpos.create("deberta", num_heads=H, head_dim=D)  # defaults: 256 buckets, 512
    assert enc.table_row(torch.tensor(DELTA)).tolist() == C2P_IDX


def test_deberta_unclamped_buckets_differ_only_beyond_max_position() -> None:
    """transformers' buckets (no clamp) agree with the spec up to |delta| = 511; past it the
    index differs only on the negative side (row 0 instead of 1)."""
    d = torch.arange(-2000, 2001)
    clamped = deberta_log_bucket(d, 256, 512)
    free = deberta_log_bucket(d, 256, 512, clamp=False)
    inside = d.abs() <= 511
    assert torch.equal(clamped[inside], free[inside])
    assert not torch.equal(clamped, free)
    idx = deberta_relative_index(d, position_buckets=256, max_relative_positions=512)
    idx_free = deberta_relative_index(
        d, position_buckets=256, max_relative_positions=512, clamp_buckets=False
    )
    differs = d[idx != idx_free]
    assert int(differs.max()) <= -512
    assert set(idx_free[d <= -512].tolist()) == {0} and set(idx[d <= -512].tolist()) == {1}


def test_deberta_without_buckets_clips_at_the_span() -> None:
    d = torch.tensor([-100, -8, -7, 0, 7, 8, 100])
    got = deberta_relative_index(d, position_buckets=-1, max_relative_positions=8)
    assert got.tolist() == [0, 0, 1, 8, 15, 15, 15]  # clamp(d + 8, 0, 15)


def numpy_bucket(delta: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """The formula of spec §11 in float64 numpy (the official numpy version's arithmetic)."""
    delta = np.clip(delta, -(max_position - 1), max_position - 1)
    mid = bucket_size // 2
    a = np.where((delta < mid) & (delta > -mid), mid - 1, np.abs(delta))
    log_pos = np.ceil(np.log(a / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(a <= mid, delta, log_pos * np.sign(delta)).astype(np.int64)


def deberta_dense_logits(enc, q, k, q_pos, k_pos, paper: bool) -> torch.Tensor:
    """Spec §11 pair by pair:
    ``(q.k + q.K^r[idx(i,j)] + k.Q^r[idx(i,j)]) / sqrt(3d)``, ``idx(j,i)`` in p2c for the paper."""
    span = enc.span

    def idx(delta: torch.Tensor) -> torch.Tensor:
        bucket = numpy_bucket(delta.numpy(), enc.position_buckets, enc.max_relative_positions)
        return torch.from_numpy(np.clip(bucket + span, 0, 2 * span - 1))

    delta = q_pos[:, None] - k_pos[None, :]  # (Lq, Lk)
    table = torch.nn.functional.layer_norm(
        enc.rel_embeddings, (enc.hidden_size,), enc.rel_norm.weight, enc.rel_norm.bias, 1e-7
    )
    key_r = enc.pos_key_proj(table).view(-1, H, D)  # (2 span, H, D)
    query_r = enc.pos_query_proj(table).view(-1, H, D)
    c2p_rows = key_r[idx(delta)]  # (Lq, Lk, H, D)
    p2c_rows = query_r[idx(-delta) if paper else idx(delta)]
    content = torch.einsum("bhid,bhjd->bhij", q, k)
    c2p = torch.einsum("bhid,ijhd->bhij", q, c2p_rows)
    p2c = torch.einsum("bhjd,ijhd->bhij", k, p2c_rows)
    return (content + c2p + p2c) / math.sqrt(3 * D)


@pytest.mark.parametrize("paper", [False, True], ids=["code", "paper"])
def test_deberta_logits_match_dense_formula(paper: bool) -> None:
    torch.manual_seed(0)
    enc = relpos.create(
        "deberta",
        num_heads=H,
        head_dim=D,
        position_buckets=16,
        max_relative_positions=40,
        paper_p2c=paper,
    )
    with torch.no_grad():  # a non-trivial LayerNorm
        enc.rel_norm.weight.uniform_(0.5, 1.5)
        enc.rel_norm.bias.normal_(0, 0.1)
        enc.pos_key_proj.bias.normal_(0, 0.1)
        enc.pos_query_proj.bias.normal_(0, 0.1)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, 50, D, generator=gen)
    k = torch.randn(B, H, 70, D, generator=gen)
    k_pos = torch.arange(70) * 2 - 30  # distances up to ±~200: every bucket regime, clamped too
    q_pos = k_pos[20:]
    with torch.no_grad():
        got = relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos)
        want = deberta_dense_logits(enc, q, k, q_pos, k_pos, paper)
        other = deberta_dense_logits(enc, q, k, q_pos, k_pos, not paper)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert (other - want).abs().max() > 1e-2  # the two forms really differ


def test_deberta_default_scale_counts_position_terms() -> None:
    both = relpos.create("deberta", num_heads=H, head_dim=D)
    one = relpos.create("deberta", num_heads=H, head_dim=D, pos_att_type=["c2p"])
    assert both.default_scale(D) == pytest.approx(1 / math.sqrt(3 * D))
    assert one.default_scale(D) == pytest.approx(1 / math.sqrt(2 * D))


@pytest.mark.parametrize(
    "options,match,exc",
    [
        ({"pos_att_type": "p2p"}, "p2p", ValueError),
        ({"pos_att_type": []}, "pos_att_type", ValueError),
        (
            {"position_buckets": 256, "max_relative_positions": 100},
            "max_relative_positions",
            ValueError,
        ),
        ({"max_relative_positions": 0}, "max_relative_positions", ValueError),
        ({"dropout": 1.5}, "dropout", ValueError),
        ({"share_att_key": "yes"}, "share_att_key", TypeError),  # a wrong type: TypeError
        ({"pos_att_type": 3}, "pos_att_type", TypeError),
    ],
)
def test_deberta_rejects_bad_options(options: dict, match: str, exc: type) -> None:
    with pytest.raises(exc, match=match):
        relpos.create("deberta", num_heads=H, head_dim=D, **options)


def test_deberta_c2p_projection_bias_is_frozen_and_cancels() -> None:
    """``q_i . b`` is constant along a softmax row: the output does not depend on it."""
    torch.manual_seed(0)
    enc = relpos.create("deberta", num_heads=H, head_dim=D)
    assert not enc.pos_key_proj.bias.requires_grad
    q, k, v = torch.randn(3, B, H, 12, D).unbind(0)
    before = relpos.attention(q, k, v, enc)
    with torch.no_grad():
        enc.pos_key_proj.bias.normal_(0, 1.0)
    torch.testing.assert_close(relpos.attention(q, k, v, enc), before, rtol=1e-5, atol=1e-6)
    assert (relpos.scores(q, k, enc) - relpos.scores(q, k, enc).detach()).abs().max() == 0


# ---------------------------------------------------------------------------- Transformer-XL
def test_transformer_xl_sinusoid_is_concatenated_sin_cos() -> None:
    enc = relpos.create("transformer-xl", num_heads=H, head_dim=D, d_model=8)
    got = enc.table_rows(-3, 5, torch.device("cpu"))
    t = torch.arange(-3, 6, dtype=torch.float64)[:, None]
    w = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    want = torch.cat(((t * w).sin(), (t * w).cos()), dim=-1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def txl_dense_attention(enc, q, k, v, q_pos, k_pos, causal: bool):
    """Paper formula, pair by pair: ``[(q_i + u).k_j + (q_i + v).W_R R_{i-j}] / sqrt(d)``."""
    delta = q_pos[:, None] - k_pos[None, :]
    if enc.clamp_len is not None:
        delta = delta.clamp(-enc.clamp_len, enc.clamp_len)
    dm = enc.d_model
    w = 1.0 / 10000 ** (torch.arange(0, dm, 2, dtype=torch.float64) / dm)
    ang = delta[..., None].double() * w
    r = torch.cat((ang.sin(), ang.cos()), dim=-1).float()  # (Lq, Lk, d_model)
    wr = (r @ enc.r_net.weight.t()).view(*delta.shape, H, D)
    ac = torch.einsum("bhid,bhjd->bhij", q + enc.r_w_bias[:, None], k)
    bd = torch.einsum("bhid,ijhd->bhij", q + enc.r_r_bias[:, None], wr)
    logits = (ac + bd) / math.sqrt(D)
    if causal:
        logits = logits.masked_fill(delta < 0, float("-inf"))
    return logits, torch.softmax(logits, -1) @ v


def _txl(clamp_len=None, seed=0):
    torch.manual_seed(seed)
    enc = relpos.create("transformer-xl", num_heads=H, head_dim=D, clamp_len=clamp_len)
    with torch.no_grad():  # larger position terms than the 0.02 init, so errors would show
        enc.r_net.weight.normal_(0, 0.3)
        enc.r_w_bias.normal_(0, 0.5)
        enc.r_r_bias.normal_(0, 0.5)
    return enc


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize(
    "causal,clamp_len", [(True, None), (False, None), (True, 7)], ids=["causal", "full", "clamp7"]
)
def test_transformer_xl_matches_dense_formula_forward_and_backward(
    backend, causal, clamp_len, monkeypatch
) -> None:
    enc = _txl(clamp_len)
    if backend == "chunked":
        monkeypatch.setattr(chunked, "TILE_ELEMENTS", 16 * 64)  # several query tiles
    gen = torch.Generator().manual_seed(1)
    lq, lk = 40, 64  # a memory of 24 keys before the segment
    q = torch.randn(B, H, lq, D, generator=gen, requires_grad=True)
    k = torch.randn(B, H, lk, D, generator=gen, requires_grad=True)
    v = torch.randn(B, H, lk, D, generator=gen, requires_grad=True)
    k_pos = torch.arange(lk) + 5
    q_pos = k_pos[lk - lq :]
    g = torch.randn(B, H, lq, D, generator=gen)
    params = [enc.r_w_bias, enc.r_r_bias, enc.r_net.weight]

    logits, want = txl_dense_attention(enc, q, k, v, q_pos, k_pos, causal)
    want_grads = torch.autograd.grad((want * g).sum(), [q, k, v, *params])
    got = relpos.attention(q, k, v, enc, q_pos=q_pos, k_pos=k_pos, causal=causal, backend=backend)
    got_grads = torch.autograd.grad((got * g).sum(), [q, k, v, *params])
    names = ["q", "k", "v", "u", "v_bias", "W_R"]

    got_logits = relpos.scores(q, k, enc, q_pos=q_pos, k_pos=k_pos)
    finite = torch.isfinite(logits)
    scale = float(logits.detach()[finite].abs().max())
    torch.testing.assert_close(got_logits[finite], logits[finite], rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))
    for name, a, b in zip(names, got_grads, want_grads, strict=True):
        torch.testing.assert_close(
            a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()), msg=lambda m, n=name: f"{n}: {m}"
        )


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's ``_rel_shift`` (spec §10) on ``x (qlen, klen, ...)``: prepend a zero
    column, view as ``(klen + 1, qlen)``, drop the first row, view back."""
    zero = torch.zeros((x.shape[0], 1, *x.shape[2:]), dtype=x.dtype)
    padded = torch.cat((zero, x), dim=1).view(x.shape[1] + 1, x.shape[0], *x.shape[2:])
    return padded[1:].view_as(x)


def test_rel_shift_of_the_reference_matches_spec_example() -> None:
    got = rel_shift(torch.arange(9.0).view(3, 3))
    lower = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    assert got[lower].tolist() == [2, 4, 5, 6, 7, 8]


def txl_official_attention(enc, q, k, v, mlen: int) -> torch.Tensor:
    """Official ``RelPartialLearnableMultiHeadAttn`` order of work (spec §10) for q of the
    segment and k, v of memory + segment: ``R`` over ``klen - 1 .. 0`` (clamped to
    ``clamp_len``), ``AC`` + ``_rel_shift(BD)``, causal mask ``triu(1 + mlen)``."""
    qlen, klen = q.shape[2], k.shape[2]
    pos_seq = torch.arange(klen - 1, -1, -1.0)
    if enc.clamp_len is not None:
        pos_seq = pos_seq.clamp(max=enc.clamp_len)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, enc.d_model, 2.0) / enc.d_model))
    ang = torch.outer(pos_seq, inv_freq)
    pos_emb = torch.cat((ang.sin(), ang.cos()), dim=-1)  # (klen, d_model)
    r_head_k = enc.r_net(pos_emb).view(klen, H, D)
    qi = q.permute(2, 0, 1, 3)  # (qlen, B, H, D)
    kj = k.permute(2, 0, 1, 3)
    ac = torch.einsum("ibnd,jbnd->ijbn", qi + enc.r_w_bias, kj)
    bd = rel_shift(torch.einsum("ibnd,jnd->ijbn", qi + enc.r_r_bias, r_head_k))
    score = (ac + bd) / math.sqrt(D)
    mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool), 1 + mlen)
    score = score.masked_fill(mask[:, :, None, None], float("-inf"))
    prob = torch.softmax(score, dim=1)
    return torch.einsum("ijbn,jbnd->ibnd", prob, v.permute(2, 0, 1, 3)).permute(1, 2, 0, 3)


@pytest.mark.parametrize("clamp_len", [None, 9])
@pytest.mark.parametrize("mlen", [0, 17])
def test_transformer_xl_matches_official_rel_shift_computation(mlen: int, clamp_len) -> None:
    enc = _txl(clamp_len)
    gen = torch.Generator().manual_seed(2)
    qlen = 23
    q = torch.randn(B, H, qlen, D, generator=gen)
    k, v = torch.randn(2, B, H, mlen + qlen, D, generator=gen).unbind(0)
    with torch.no_grad():
        want = txl_official_attention(enc, q, k, v, mlen)
        got = relpos.attention(q, k, v, enc, causal=True)  # queries = the last qlen positions
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_transformer_xl_precomputes_only_the_distances_of_the_call() -> None:
    """``prepare`` holds (B, H, Lq, R) with R = the distances the call reaches, never (L, L, D)."""
    enc = _txl()
    q, k = torch.randn(B, H, 10, D), torch.randn(B, H, 30, D)
    ctx = enc.prepare(q, k, torch.arange(20, 30)[None], torch.arange(30)[None])
    assert ctx.data.query.compute().shape == (B, H, 10, 39)  # distances -9 .. 29
    assert ctx.data.uk.shape == (B, H, 30)
    clamped = _txl(clamp_len=4).prepare(q, k, torch.arange(20, 30)[None], torch.arange(30)[None])
    assert clamped.data.query.compute().shape == (B, H, 10, 9)  # distances clamped to -4 .. 4
