"""RoPE (Su et al. 2021) and partial rotary against reference values, and the validation of the
common RoPE options.

Expected values are HF ``transformers`` 5.24.0's float32 frequencies and rotations
(``modeling_rope_utils.py``, ``apply_rotary_pos_emb``), computed independently of relpos; fp64
references are re-derived here from the formulas, never from relpos.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.functional import apply_rotary, rope_angles, rope_frequencies

# HF default frequencies, b = 1e4, d = 64.
R1_INV_FREQ = [
    1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939, 0.133352146,
    0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786, 0.0237137359,
    0.0177827943, 0.0133352149, 0.00999999978, 0.00749894232, 0.00562341325, 0.00421696482,
    0.00316227786, 0.00237137382, 0.00177827943, 0.00133352145, 0.00100000005, 0.000749894185,
    0.000562341302, 0.000421696488, 0.000316227786, 0.000237137385, 0.00017782794, 0.00013335215,
]  # fmt: skip

# rotation example: d = 8, b = 1e4, p = 3, q = [1..8], fp32.
R8_COS = [-0.989992499, 0.955336511, 0.999550045, 0.99999553]
R8_SIN = [0.141120002, 0.295520216, 0.0299954992, 0.00299999560]
R8_HALF = [
    -1.69559252, 0.137551665, 2.78868151, 3.97598219, -4.80884266, 6.32305956, 7.08683681,
    8.01196384,
]  # fmt: skip
R8_INTERLEAVED = [
    -1.27223253, -1.83886504, 1.68392873, 4.70790672, 4.81777716, 6.14727783, 6.97596884,
    8.02096462,
]  # fmt: skip
R8_K_ONES_HALF = [
    -1.13111246, 0.659816265, 0.969554543, 0.996995509, -0.848872483, 1.25085676, 1.02954555,
    1.00299549,
]  # fmt: skip


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------------------- frequencies


def test_rope_frequencies_default_base_head_dim_64_match_r1() -> None:
    inv_freq, attention_factor = rope_frequencies(64)
    assert inv_freq.dtype == torch.float32
    assert inv_freq.shape == (32,)
    torch.testing.assert_close(inv_freq, _t(R1_INV_FREQ), rtol=1e-6, atol=0.0)
    assert attention_factor == 1.0


def test_rope_frequencies_default_scaling_dict_is_the_same_as_none() -> None:
    inv_freq, attention_factor = rope_frequencies(64, scaling={"rope_type": "default"})
    torch.testing.assert_close(inv_freq, _t(R1_INV_FREQ), rtol=1e-6, atol=0.0)
    assert attention_factor == 1.0


# ----------------------------------------------------------------------- the rotation example


def _r8_cos_sin() -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, _ = rope_frequencies(8)
    ang = rope_angles(torch.tensor([3]), inv_freq)  # (1, 4)
    return ang.cos(), ang.sin()


def test_rope_angles_at_position_3_give_r8_cos_and_sin() -> None:
    cos, sin = _r8_cos_sin()
    torch.testing.assert_close(cos[0], _t(R8_COS), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sin[0], _t(R8_SIN), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("layout", "expected"), [("half", R8_HALF), ("interleaved", R8_INTERLEAVED)]
)
def test_apply_rotary_rotates_q_1_to_8_at_position_3_as_r8(layout: str, expected: list) -> None:
    cos, sin = _r8_cos_sin()
    q = torch.arange(1.0, 9.0)[None]  # (L=1, D=8)
    got = apply_rotary(q, cos, sin, layout)
    torch.testing.assert_close(got[0], _t(expected), rtol=1e-6, atol=1e-6)


def test_apply_rotary_rotates_k_ones_at_position_3_as_r8_half_layout() -> None:
    cos, sin = _r8_cos_sin()
    got = apply_rotary(torch.ones(1, 8), cos, sin, "half")
    torch.testing.assert_close(got[0], _t(R8_K_ONES_HALF), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("layout", "expected"), [("half", R8_HALF), ("interleaved", R8_INTERLEAVED)]
)
def test_rope_encoding_rotate_reproduces_r8(layout: str, expected: list) -> None:
    enc = relpos.create("rope", num_heads=1, head_dim=8, layout=layout)
    q = torch.arange(1.0, 9.0).reshape(1, 1, 1, 8)
    got = enc.rotate(q, torch.tensor([[3]]), "q")
    torch.testing.assert_close(got[0, 0, 0], _t(expected), rtol=1e-6, atol=1e-6)
    # Values are not rotated by RoPE.
    assert torch.equal(enc.rotate(q, torch.tensor([[3]]), "v"), q)


# ---------------------------------------------------------------------------- partial rotary


def test_partial_rotary_spreads_frequencies_over_the_rotated_channels_only() -> None:
    enc = relpos.create("rope", num_heads=1, head_dim=64, partial_rotary_factor=0.25)
    expected = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    assert enc.rotary_dim == 16
    torch.testing.assert_close(enc.inv_freq.double(), expected, rtol=1e-6, atol=0.0)
    inv_freq, _ = rope_frequencies(64, partial_rotary_factor=0.25)
    torch.testing.assert_close(inv_freq.double(), expected, rtol=1e-6, atol=0.0)


def test_partial_rotary_rotates_first_16_channels_and_passes_the_rest_unchanged() -> None:
    torch.manual_seed(0)
    enc = relpos.create("rope", num_heads=2, head_dim=64, partial_rotary_factor=0.25)
    x = torch.randn(1, 2, 10, 64)
    pos = torch.arange(100, 110)
    got = enc.rotate(x, pos[None], "q")
    assert torch.equal(got[..., 16:], x[..., 16:])
    # Half layout over the 16 rotated channels: pairs (c, c + 8), angle p * base^(-2c/16).
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ang = pos.double()[:, None] * theta  # (L, 8)
    a, b = x[..., :8].double(), x[..., 8:16].double()
    expected = torch.cat((a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()), dim=-1)
    torch.testing.assert_close(got[..., :16].double(), expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------- layouts


def _perm(d: int) -> torch.Tensor:
    return torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))


@pytest.mark.parametrize("head_dim", [8, 64])
def test_half_layout_of_permuted_channels_equals_permuted_interleaved_layout(
    head_dim: int,
) -> None:
    # half(x[perm]) == interleaved(x)[perm] with perm = [0, 2, ..., d-2, 1, 3, ..., d-1].
    torch.manual_seed(0)
    perm = _perm(head_dim)
    half = relpos.create("rope", num_heads=2, head_dim=head_dim, layout="half")
    inter = relpos.create("rope", num_heads=2, head_dim=head_dim, layout="interleaved")
    x = torch.randn(2, 2, 12, head_dim)
    pos = torch.arange(5, 17)[None]
    torch.testing.assert_close(
        half.rotate(x[..., perm], pos, "q"), inter.rotate(x, pos, "q")[..., perm]
    )


@pytest.mark.parametrize("head_dim", [8, 64])
def test_rope_scores_are_layout_invariant_under_the_channel_permutation(head_dim: int) -> None:
    torch.manual_seed(1)
    perm = _perm(head_dim)
    half = relpos.create("rope", num_heads=3, head_dim=head_dim, layout="half")
    inter = relpos.create("rope", num_heads=3, head_dim=head_dim, layout="interleaved")
    q = torch.randn(2, 3, 9, head_dim)
    k = torch.randn(2, 3, 13, head_dim)
    s_half = relpos.scores(q[..., perm], k[..., perm], half)
    s_inter = relpos.scores(q, k, inter)
    torch.testing.assert_close(s_half, s_inter, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- bad inputs


def test_rope_rejects_odd_head_dim_naming_head_dim() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        rope_frequencies(7)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("rope", num_heads=1, head_dim=7)


@pytest.mark.parametrize(
    "scaling",
    [{"rope_type": "no-such-type"}, {"type": "no-such-type"}, {"rope_type": "default", "x": 1}],
)
def test_rope_rejects_unknown_scaling_with_value_error(scaling: dict) -> None:
    with pytest.raises(ValueError):
        rope_frequencies(64, scaling=scaling)
    with pytest.raises(ValueError):
        relpos.create("rope", num_heads=1, head_dim=64, scaling=scaling)


@pytest.mark.parametrize(
    ("options", "exc"),
    [
        ({"base": "1e4"}, TypeError),
        ({"base": float("nan")}, ValueError),
        ({"scaling": "yarn"}, TypeError),
        ({"scaling": {"rope_type": "no-such-type"}}, ValueError),
        ({"scaling": {"rope_type": "linear"}}, ValueError),
        ({"scaling": {"rope_type": "yarn", "factor": 0.5}}, ValueError),
    ],
    ids=repr,
)
def test_rope_options_are_refused_with_a_message_that_names_them(options, exc) -> None:
    (option,) = options
    with pytest.raises(exc, match=f"^{option}"):
        relpos.create("rope", num_heads=1, head_dim=8, **options)


def test_yarn_dict_without_original_length_takes_max_position_embeddings() -> None:
    yarn = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="max_position_embeddings"):
        relpos.create("rope", num_heads=1, head_dim=8, scaling=yarn)
    enc = relpos.create("rope", num_heads=1, head_dim=8, scaling=yarn, max_position_embeddings=64)
    expected, factor = rope_frequencies(8, scaling={**yarn, "original_max_position_embeddings": 64})
    assert torch.equal(enc.inv_freq, expected) and enc.attention_factor == factor


@pytest.mark.parametrize(
    ("bad", "message"),
    [(float("nan"), "must be finite"), (-3.0, "must be >= 0"), (-3, "must be >= 0")],
    ids=repr,
)
@pytest.mark.parametrize("which", ["q_pos", "k_pos"])
def test_dynamic_rope_names_the_positions_that_are_not_a_length(which, bad, message) -> None:
    enc = relpos.create(
        "rope",
        num_heads=1,
        head_dim=8,
        scaling={"rope_type": "dynamic", "factor": 2.0},
        max_position_embeddings=16,
    )
    float_pos = isinstance(bad, float)
    pos = {
        n: torch.arange(4, dtype=torch.float32 if float_pos else torch.int64)
        for n in ("q_pos", "k_pos")
    }
    pos[which][1] = bad
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=f"{which} {message}"):
        relpos.scores(q, q, enc, **pos)


def test_dynamic_rope_rotates_queries_and_keys_with_one_base_per_call() -> None:
    """Queries below the reference length and keys past it share the keys' base."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    enc = relpos.create("rope", num_heads=1, head_dim=8, scaling=scaling, max_position_embeddings=8)
    q, k = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 30, 8)
    q_pos, k_pos = torch.tensor([[3, 4]]), torch.arange(30)[None]
    qr, kr = enc.rotate_qk(q, k, q_pos, k_pos)
    inv_freq, _ = rope_frequencies(8, scaling=scaling, seq_len=30, max_position_embeddings=8)
    ang_q, ang_k = rope_angles(q_pos, inv_freq)[:, None], rope_angles(k_pos, inv_freq)[:, None]
    torch.testing.assert_close(qr, apply_rotary(q, ang_q.cos(), ang_q.sin()))
    torch.testing.assert_close(kr, apply_rotary(k, ang_k.cos(), ang_k.sin()))


# ---------------------------------------------------------------------------- relative property


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rope_score_at_10_3_equals_score_at_1007_1000(dtype: torch.dtype) -> None:
    # With fp64 angles the two agree to ~1e-13. relpos (like HF) forms integer-position angles
    # in fp32 even for fp64 q/k, so the agreement is at fp32 angle precision: measured 2.2e-6
    # (fp64 q/k) and 3.8e-6 (fp32) for a score of size ~2; pinned at 1e-5.
    torch.manual_seed(0)
    enc = relpos.create("rope", num_heads=1, head_dim=64)
    q = torch.randn(1, 1, 1, 64, dtype=dtype)
    k = torch.randn(1, 1, 1, 64, dtype=dtype)
    near = relpos.scores(q, k, enc, q_pos=torch.tensor([10]), k_pos=torch.tensor([3]))
    far = relpos.scores(q, k, enc, q_pos=torch.tensor([1007]), k_pos=torch.tensor([1000]))
    assert near.dtype == dtype and far.dtype == dtype
    torch.testing.assert_close(near, far, rtol=0.0, atol=1e-5)


def test_rope_scores_of_fp64_inputs_match_an_fp64_reference_to_fp32_angle_precision() -> None:
    torch.manual_seed(0)
    enc = relpos.create("rope", num_heads=1, head_dim=16)
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    got = relpos.scores(q, k, enc, q_pos=torch.tensor([10]), k_pos=torch.tensor([3]))
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    a = (3 - 10) * theta  # <R(m) q, R(n) k> = <q, R(n - m) k>
    k1, k2 = k[0, 0, 0, :8], k[0, 0, 0, 8:]
    rk = torch.cat((k1 * a.cos() - k2 * a.sin(), k1 * a.sin() + k2 * a.cos()))
    expected = (q[0, 0, 0] * rk).sum() / 4.0
    torch.testing.assert_close(got[0, 0, 0, 0], expected, rtol=0.0, atol=1e-6)


# ---------------------------------------------------------------------------- long positions


def _angle_errors(pos: torch.Tensor, head_dim: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """|cos - cos_ref|, |sin - sin_ref| and the exact fp64 angle, with the reference formed in
    fp64 from the same (fp32) inv_freq the model uses."""
    inv_freq, _ = rope_frequencies(head_dim)
    ang = rope_angles(pos, inv_freq)
    assert ang.dtype == torch.float32
    ref = pos.double()[:, None] * inv_freq.double()
    err = torch.maximum(
        (ang.cos().double() - ref.cos()).abs(), (ang.sin().double() - ref.sin()).abs()
    )
    return err, ref


@pytest.mark.parametrize("p_max", [4096, 10**6, 2**24])
def test_rope_angles_up_to_2_pow_24_are_the_fp32_product_of_position_and_frequency(
    p_max: int,
) -> None:
    # As HF: angles for integer positions <= 2^24 are formed as an fp32 product, so the
    # error is the fp32 rounding of the angle, |err| <= 2^-24 |p theta| (+ cos/sin rounding).
    # Measured max error: 1.2e-4 at p ~ 4096, 3.1e-2 at p ~ 1e6, 0.49 at p ~ 2^24 -- about half
    # this bound. NOT below 1e-6: that holds only above 2^24, where relpos switches to fp64.
    g = torch.Generator().manual_seed(0)
    pos = torch.cat(
        (torch.arange(p_max - 1000, p_max + 1), torch.randint(0, p_max, (3000,), generator=g))
    )
    err, ref = _angle_errors(pos)
    bound = ref.abs() * 2.0**-24 + 2e-7
    assert (err <= bound).all(), (err - bound).max()


@pytest.mark.parametrize("p_max", [2**24 + 1000, 3 * 10**7])
def test_rope_angles_above_2_pow_24_are_accurate_to_1e_6(p_max: int) -> None:
    # Above 2^24 the product is formed in fp64 and reduced mod 2 pi before the cast to fp32.
    # Measured: 2.4e-7.
    g = torch.Generator().manual_seed(0)
    pos = torch.cat(
        (torch.arange(p_max - 1000, p_max + 1), torch.randint(2**24, p_max, (3000,), generator=g))
    )
    err, _ = _angle_errors(pos)
    assert err.max().item() < 1e-6


# ---------------------------------------------------------------------------- xPos (section 10)
