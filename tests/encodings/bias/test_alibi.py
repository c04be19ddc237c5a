"""ALiBi (Press et al. 2021) against the published slopes and bias rows.

Expected values were computed independently of relpos with the official ``get_slopes``
(ofirpress/attention_with_linear_biases); the construction rule is re-written here
independently of relpos.
"""

from __future__ import annotations

import math

import pytest
import torch
from dense_reference import assert_matches_reference, dense_attention, zero_scores

import relpos
from relpos.functional import alibi_slopes

# reference slopes (exact decimals, from the official get_slopes)
PUBLISHED_SLOPES: dict[int, list[float]] = {
    1: [0.00390625],
    2: [0.0625, 0.00390625],
    4: [0.25, 0.0625, 0.015625, 0.00390625],
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    8: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625],
    12: [
        0.5,
        0.25,
        0.125,
        0.0625,
        0.03125,
        0.015625,
        0.0078125,
        0.00390625,
        0.7071067812,
        0.3535533906,
        0.1767766953,
        0.08838834765,
    ],  # fmt: skip
    # "[2^-0.5, 2^-1, 2^-1.5, ..., 2^-8]"
    16: [2.0 ** (-k / 2) for k in range(1, 17)],
    # "the 16 values above, then 2^-0.25, 2^-0.75, 2^-1.25, 2^-1.75"
    20: [2.0 ** (-k / 2) for k in range(1, 17)]
    + [0.8408964153, 0.5946035575, 0.4204482076, 0.2973017788],
    # "2^(-k/4) for k=1..32 (first 0.8408964153, last 0.00390625)"
    32: [2.0 ** (-k / 4) for k in range(1, 33)],
}


def slopes_by_the_paper_rule(num_heads: int) -> list[float]:
    """The paper's rule, in float64.

    Power of two: ``m_h = 2^(-8 (h + 1) / H)``. Otherwise, with ``c = 2^floor(log2 H)``:
    ``[2^(-8k/c) for k = 1..c] ++ [2^(-8k/(2c)) for k = 1, 3, 5, ..., 2(H - c) - 1]``.
    """
    if num_heads & (num_heads - 1) == 0:
        return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]
    c = 1
    while c * 2 <= num_heads:
        c *= 2
    first = [2.0 ** (-8.0 * k / c) for k in range(1, c + 1)]
    extra = [2.0 ** (-8.0 * k / (2 * c)) for k in range(1, 2 * (num_heads - c), 2)]
    return first + extra


@pytest.mark.parametrize("num_heads", sorted(PUBLISHED_SLOPES))
def test_alibi_slopes_match_published_values(num_heads: int) -> None:
    got = alibi_slopes(num_heads)
    assert got.dtype == torch.float32
    assert got.shape == (num_heads,)
    expected = torch.tensor(PUBLISHED_SLOPES[num_heads], dtype=torch.float64)
    torch.testing.assert_close(got.double(), expected, rtol=1e-7, atol=0.0)


def test_alibi_slopes_for_power_of_two_heads_are_exact_powers_of_two() -> None:
    # H = 8: 2^-1 .. 2^-8 are exactly representable; nothing may be lost on the way.
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


@pytest.mark.parametrize("num_heads", range(1, 33))
def test_alibi_slopes_follow_construction_rule_for_every_head_count(num_heads: int) -> None:
    expected = torch.tensor(slopes_by_the_paper_rule(num_heads), dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(num_heads).double(), expected, rtol=1e-7, atol=0.0)


def test_alibi_slopes_match_paper_for_non_power_of_two_heads_and_are_not_sorted() -> None:
    # H = 6 and H = 12 are examples of unsorted slopes.
    for num_heads in (6, 12):
        slopes = alibi_slopes(num_heads).tolist()
        assert slopes != sorted(slopes, reverse=True)
        assert all(0.0 < m < 1.0 for m in slopes)
    assert alibi_slopes(6)[4].item() == 0.5


def test_alibi_slopes_reject_a_non_positive_head_count_by_name() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


def _zero_qk(num_heads: int, length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.zeros(1, num_heads, length, head_dim)
    return q, q.clone()


def test_alibi_bias_row_matches_spec_example_head0_query4() -> None:
    # H=8, head 0, query i=4, keys 0..4 -> [-2.0, -1.5, -1.0, -0.5, 0.0].
    enc = relpos.create("alibi", num_heads=8, head_dim=16)
    q, k = _zero_qk(8, 5, 16)
    s = relpos.scores(q, k, enc, q_pos=torch.arange(5), k_pos=torch.arange(5))
    assert s[0, 0, 4].tolist() == [-2.0, -1.5, -1.0, -0.5, 0.0]


def test_alibi_causal_bias_is_minus_slope_times_distance_below_the_diagonal() -> None:
    num_heads, length = 12, 9
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=8)
    q, k = _zero_qk(num_heads, length, 8)
    s = relpos.scores(q, k, enc, q_pos=torch.arange(length), k_pos=torch.arange(length))
    m = torch.tensor(slopes_by_the_paper_rule(num_heads))
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    expected = -m[:, None, None] * (i - j)
    lower = (j <= i).expand(num_heads, length, length)
    torch.testing.assert_close(s[0][lower], expected[lower].float(), rtol=1e-6, atol=0.0)


def test_alibi_bidirectional_bias_is_minus_slope_times_absolute_distance() -> None:
    num_heads, length = 6, 7
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=8, bidirectional=True)
    q, k = _zero_qk(num_heads, length, 8)
    s = relpos.scores(q, k, enc, q_pos=torch.arange(length), k_pos=torch.arange(length))
    m = torch.tensor(slopes_by_the_paper_rule(num_heads))
    dist = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).abs()
    expected = (-m[:, None, None] * dist).float()
    torch.testing.assert_close(s[0], expected, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(s[0], s[0].transpose(-1, -2), rtol=0.0, atol=0.0)


def test_alibi_bias_is_added_after_scaling_and_is_not_scaled() -> None:
    # logit = q k^T * scale + bias; the bias itself is independent of head_dim and scale.
    torch.manual_seed(0)
    num_heads, length, head_dim = 4, 6, 16
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=head_dim)
    q = torch.randn(2, num_heads, length, head_dim)
    k = torch.randn(2, num_heads, length, head_dim)
    pos = torch.arange(length)
    s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    bias = relpos.scores(torch.zeros_like(q), torch.zeros_like(k), enc, q_pos=pos, k_pos=pos)
    expected = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias
    torch.testing.assert_close(s, expected, rtol=1e-5, atol=1e-6)
    s_half = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, scale=0.5)
    torch.testing.assert_close(s_half, q @ k.transpose(-1, -2) * 0.5 + bias, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- variants
# encoder forms, tensor-parallel shards, learnable slopes

SHARDED = [(8, 2), (8, 4), (12, 3), (12, 4), (12, 6), (20, 5), (6, 2), (6, 3), (5, 1), (24, 8)]


@pytest.mark.parametrize(("total", "per_shard"), SHARDED)
@pytest.mark.parametrize("form", [False, "asymmetric"])
def test_alibi_shards_concatenate_to_the_full_models_slopes(total, per_shard, form):
    shards = [
        relpos.create(
            "alibi",
            num_heads=per_shard,
            head_dim=8,
            bidirectional=form,
            head_offset=r * per_shard,
            total_heads=total,
        )
        for r in range(total // per_shard)
    ]
    full = relpos.create("alibi", num_heads=total, head_dim=8, bidirectional=form)
    assert torch.equal(torch.cat([s.slopes for s in shards]), alibi_slopes(total))
    assert torch.equal(full.slopes, alibi_slopes(total))
    assert torch.equal(torch.cat([s.future_slopes for s in shards]), full.future_slopes)
    # and the biases: each shard's scores are its heads' slice of the full model's
    pos = torch.arange(7)
    full_scores = zero_scores(full, 7, 7, q_pos=pos, k_pos=pos)
    shard_scores = torch.cat([zero_scores(s, 7, 7, q_pos=pos, k_pos=pos) for s in shards])
    assert torch.equal(shard_scores, full_scores)


def test_alibi_shard_of_a_non_power_of_two_model_takes_the_interleaved_slopes():
    # total 12 (slopes [2^-1 .. 2^-8, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5]); last shard of 4 heads
    enc = relpos.create("alibi", num_heads=4, head_dim=8, head_offset=8, total_heads=12)
    expected = [0.7071067812, 0.3535533906, 0.1767766953, 0.08838834765]
    torch.testing.assert_close(enc.slopes.double(), torch.tensor(expected, dtype=torch.float64))


def test_alibi_shard_options_are_validated_by_name():
    for kw, arg in [
        ({"head_offset": 6, "total_heads": 8}, "head_offset"),
        ({"head_offset": -1}, "head_offset"),
        ({"total_heads": 0}, "total_heads"),
        ({"bidirectional": "both"}, "bidirectional"),
        ({"learnable_slopes": 1}, "learnable_slopes"),
    ]:
        with pytest.raises((ValueError, TypeError), match=arg):
            relpos.create("alibi", num_heads=4, head_dim=8, **kw)


def _bias_forms(num_heads: int, length: int, form):
    enc = relpos.create("alibi", num_heads=num_heads, head_dim=8, bidirectional=form)
    pos = torch.arange(length)
    d = (pos[:, None] - pos[None, :]).double()
    return enc, zero_scores(enc, length, length, q_pos=pos, k_pos=pos).double(), d


def test_alibi_symmetric_string_equals_bidirectional_true():
    _, a, _ = _bias_forms(6, 9, True)
    _, b, d = _bias_forms(6, 9, "symmetric")
    assert torch.equal(a, b)
    m = alibi_slopes(6).double()[:, None, None]
    torch.testing.assert_close(a, -m * d.abs())


def test_alibi_asymmetric_uses_a_second_slope_set_for_future_keys():
    enc, s, d = _bias_forms(8, 9, "asymmetric")
    m = torch.tensor([2.0**-k for k in range(1, 9)], dtype=torch.float64)
    future = m * 2**0.5  # the even slopes of a 16-head model: 2^-0.5, 2^-1.5, ..., 2^-7.5
    torch.testing.assert_close(enc.future_slopes.double(), future)
    expected = torch.where(d >= 0, -m[:, None, None] * d, -future[:, None, None] * d.abs())
    torch.testing.assert_close(s, expected)
    # the past side is plain (causal) ALiBi
    _, causal, _ = _bias_forms(8, 9, False)
    lower = (d >= 0).expand_as(s)
    assert torch.equal(s[lower], causal[lower])


def test_alibi_shifted_form_is_deepminds_encoder_alibi():
    # google-deepmind/randomized_positional_encodings: -m (|i - j| - 0.5 [j < i])
    _, s, d = _bias_forms(4, 7, "shifted")
    m = alibi_slopes(4).double()[:, None, None]
    torch.testing.assert_close(s, -m * (d.abs() - 0.5 * (d > 0).double()))


def test_alibi_learnable_slopes_start_at_the_standard_slopes_and_stay_positive():
    enc = relpos.create("alibi", num_heads=12, head_dim=8, learnable_slopes=True)
    assert enc.learnable and set(enc.state_dict()) == {"log_slopes"}
    torch.testing.assert_close(enc.slopes, alibi_slopes(12), rtol=1e-6, atol=0)
    with torch.no_grad():
        enc.log_slopes.sub_(20.0)  # far below 0 in log space: still positive slopes
    assert (enc.slopes > 0).all()
    asym = relpos.create(
        "alibi", num_heads=4, head_dim=8, learnable_slopes=True, bidirectional="asymmetric"
    )
    assert set(asym.state_dict()) == {"log_slopes", "log_future_slopes"}


@pytest.mark.parametrize(
    ("form", "lq", "lk", "backends"),
    [
        (False, 20, 33, ["eager", "sdpa", "chunked"]),
        ("shifted", 20, 33, ["eager", "sdpa", "chunked"]),
        ("asymmetric", 270, 300, ["eager", "chunked"]),  # several Toeplitz blocks
    ],
)
def test_alibi_learnable_slopes_gradients_agree_across_backends(form, lq, lk, backends):
    enc = relpos.create(
        "alibi", num_heads=4, head_dim=16, learnable_slopes=True, bidirectional=form
    )
    causal = form is False

    def reference(q, k, v):
        pos = torch.arange(k.shape[2])
        d = (pos[-q.shape[2] :, None] - pos[None, :]).float()
        m, mf = enc.slopes[:, None, None], enc.future_slopes[:, None, None]
        if form is False:
            bias = -m * d
        elif form == "asymmetric":
            bias = torch.where(d >= 0, -m * d, mf * d)
        else:
            bias = -m * (d.abs() - 0.5 * (d > 0).float())
        return dense_attention(q, k, v, bias, 16**-0.5, causal)

    assert_matches_reference(enc, reference, causal=causal, backends=backends, lq=lq, lk=lk)
