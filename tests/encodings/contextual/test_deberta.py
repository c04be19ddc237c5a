"""DeBERTa (``relpos.encodings.contextual.deberta``) against the official functions
(microsoft/DeBERTa ``make_log_bucket_position``): the pinned log buckets and c2p indices
(bucket_size 256, max_position 512); logits of the code form and of the paper form against dense
references written from the formulas (every (i, j) pair looked up explicitly, an (Lq, Lk, H, D)
tensor); option checks. The oracle against ``transformers`` is
tests/oracle/test_oracle_hf_deberta.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import relpos
from relpos.encodings.contextual.deberta import deberta_log_bucket, deberta_relative_index

B, H, D = 2, 4, 8

# reference buckets (bucket_size=256, max_pos=512), confirmed with the official
# make_log_bucket_position
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
    """transformers' buckets (no clamp) agree with the pinned values up to |delta| = 511; past it
    the index differs only on the negative side (row 0 instead of 1)."""
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
    """The bucket formula in float64 numpy (the official numpy version's arithmetic)."""
    delta = np.clip(delta, -(max_position - 1), max_position - 1)
    mid = bucket_size // 2
    a = np.where((delta < mid) & (delta > -mid), mid - 1, np.abs(delta))
    log_pos = np.ceil(np.log(a / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(a <= mid, delta, log_pos * np.sign(delta)).astype(np.int64)


def deberta_dense_logits(enc, q, k, q_pos, k_pos, paper: bool) -> torch.Tensor:
    """The formula pair by pair:
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
