"""T5 relative-position buckets (Raffel et al. 2020) against the published bucket table.

Expected values: the bucket table of HF's port of Mesh-TensorFlow's function
(huggingface/transformers ``models/t5/modeling_t5.py``), computed independently of relpos
(``rp = key - query``, num_buckets=32, max_distance=128).
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.functional import t5_bucket

# reference buckets, computed from the official function
RP = [
    -1000, -200, -128, -127, -100, -91, -90, -64, -63, -50, -45, -32, -31, -23, -22, -16, -15,
    -12, -11, -8, -7, -5, -1, 0, 1, 5, 7, 8, 11, 12, 15, 16, 22, 23, 31, 32, 45, 50, 63, 64, 90,
    91, 100, 127, 128, 200,
]  # fmt: skip
BIDIRECTIONAL = [
    15, 15, 15, 15, 15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 5, 1, 0, 17,
    21, 23, 24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31, 31, 31, 31,
]  # fmt: skip
CAUSAL = [
    31, 31, 31, 31, 30, 29, 29, 26, 26, 24, 23, 21, 21, 18, 18, 16, 15, 12, 11, 8, 7, 5, 1, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
]  # fmt: skip

# "Bucket ranges, with n = |rp| (computed for n = 0..399)": (first n, last n, bucket).
BIDIRECTIONAL_RANGES = [(n, n, n) for n in range(8)] + [
    (8, 11, 8), (12, 15, 9), (16, 22, 10), (23, 31, 11), (32, 45, 12), (46, 63, 13),
    (64, 90, 14), (91, 399, 15),
]  # fmt: skip
CAUSAL_RANGES = [(n, n, n) for n in range(16)] + [
    (16, 18, 16), (19, 20, 17), (21, 23, 18), (24, 26, 19), (27, 30, 20), (31, 34, 21),
    (35, 39, 22), (40, 45, 23), (46, 51, 24), (52, 58, 25), (59, 66, 26), (67, 76, 27),
    (77, 86, 28), (87, 98, 29), (99, 112, 30), (113, 399, 31),
]  # fmt: skip


def _expand(ranges: list[tuple[int, int, int]]) -> list[int]:
    out: list[int] = []
    for first, last, bucket in ranges:
        out += [bucket] * (last - first + 1)
    assert len(out) == 400
    return out


def test_t5_bucket_table_bidirectional_matches_spec() -> None:
    got = t5_bucket(torch.tensor(RP), bidirectional=True, num_buckets=32, max_distance=128)
    assert got.dtype == torch.int64
    assert got.tolist() == BIDIRECTIONAL


def test_t5_bucket_table_causal_matches_spec() -> None:
    got = t5_bucket(torch.tensor(RP), bidirectional=False, num_buckets=32, max_distance=128)
    assert got.tolist() == CAUSAL


def test_t5_bucket_defaults_are_bidirectional_32_buckets_max_distance_128() -> None:
    assert t5_bucket(torch.tensor(RP)).tolist() == BIDIRECTIONAL


def test_t5_bucket_ranges_past_side_bidirectional_for_n_0_to_399() -> None:
    n = torch.arange(400)
    assert t5_bucket(-n, bidirectional=True).tolist() == _expand(BIDIRECTIONAL_RANGES)


def test_t5_bucket_ranges_future_side_bidirectional_are_past_ranges_plus_16() -> None:
    n = torch.arange(1, 400)
    expected = [b + 16 for b in _expand(BIDIRECTIONAL_RANGES)[1:]]
    assert t5_bucket(n, bidirectional=True).tolist() == expected


def test_t5_bucket_ranges_causal_for_n_0_to_399_and_future_keys_in_bucket_0() -> None:
    n = torch.arange(400)
    assert t5_bucket(-n, bidirectional=False).tolist() == _expand(CAUSAL_RANGES)
    assert t5_bucket(n[1:], bidirectional=False).tolist() == [0] * 399


def test_t5_bucket_keeps_shape_of_a_2d_relative_position_grid() -> None:
    rp = torch.arange(-20, 20).reshape(4, 10)
    got = t5_bucket(rp)
    assert got.shape == (4, 10)
    assert got.flatten().tolist() == t5_bucket(rp.flatten()).tolist()


def test_t5_bucket_rejects_float_relative_positions() -> None:
    with pytest.raises(TypeError, match="relative_position"):
        t5_bucket(torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_encoding_reads_table_at_bucket_of_key_minus_query(bidirectional: bool) -> None:
    # Fill the table so that its value reveals (bucket, head): B[b, h] = b + 100 h. With zero q/k
    # the scores are the bias, so they must show the official bucket of rp = j - i for each head.
    num_heads, length = 3, 300
    enc = relpos.create("t5", num_heads=num_heads, head_dim=8, bidirectional=bidirectional)
    with torch.no_grad():
        enc.table.copy_(torch.arange(32)[:, None] + 100.0 * torch.arange(num_heads)[None, :])
    q = torch.zeros(1, num_heads, length, 8)
    pos = torch.arange(length)
    s = relpos.scores(q, q.clone(), enc, q_pos=pos, k_pos=pos)
    table = BIDIRECTIONAL if bidirectional else CAUSAL
    query = 250
    for rp, bucket in zip(RP, table, strict=True):
        key = query + rp
        if not 0 <= key < length:
            continue
        for h in range(num_heads):
            assert s[0, h, query, key].item() == bucket + 100 * h, (rp, h)


def test_t5_bidirectional_must_be_a_bool_not_a_truthy_string() -> None:
    # regression: "no" used to become bidirectional=True
    with pytest.raises(TypeError, match="bidirectional"):
        relpos.create("t5", num_heads=2, head_dim=8, bidirectional="no")
    with pytest.raises(TypeError, match="bidirectional"):
        t5_bucket(torch.tensor([1, 2]), bidirectional="no")


@pytest.mark.parametrize(
    ("options", "arg"),
    [
        ({"bidirectional": True, "num_buckets": 2}, "num_buckets"),  # no exact bucket per side
        ({"bidirectional": True, "num_buckets": 32, "max_distance": 8}, "max_distance"),
        ({"bidirectional": False, "num_buckets": 32, "max_distance": 16}, "max_distance"),
    ],
)
def test_t5_bucket_geometry_without_a_log_range_is_refused_by_name(options, arg) -> None:
    # these used to fail inside math.log (ZeroDivisionError) or give buckets out of order
    with pytest.raises(ValueError, match=arg):
        relpos.create("t5", num_heads=2, head_dim=8, **options)


def test_t5_smallest_valid_geometries_give_buckets_in_range() -> None:
    rp = torch.arange(-50, 51)
    for bidirectional, num_buckets, max_distance in [(True, 4, 2), (False, 2, 2)]:
        got = t5_bucket(
            rp, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        assert 0 <= int(got.min()) and int(got.max()) < num_buckets
