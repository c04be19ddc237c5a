"""Precision of RoPE in bfloat16 / float16 at long positions.

Every result is compared with a float64 reference computed here: float64 angles ``p * theta_i``
and a float64 rotation of the (exactly representable) low-precision inputs. The frequencies
are HF's float32 values (``1 / base ** (arange(0, d, 2).float() / d)``): they
define the model, so the reference uses them as given.

Error model, per output channel of a pair ``(a, b)`` rotated by ``phi = p * theta_i``:

* the rotation itself, run in the activation dtype as HF does (cos/sin cast to the dtype,
  two products, one sum, each rounded with unit roundoff ``u = eps / 2``), is off by at most
  ``3 u (|a| + |b|) = 1.5 eps (|a| + |b|)``; with float32 cos/sin of a float32 angle
  (``2^-21``) this gives the **dtype bound** ``(2 eps + 2^-21) (|a| + |b|)``;
* forming ``phi`` in float32 (HF; relpos for integer positions <= 2^24) adds up to
  ``2^-24 |phi|`` radians, hence the **float32-angle bound**
  ``(2 eps + 2^-21 + 2^-24 |phi|) (|a| + |b|)``.

relpos meets the dtype bound at every position: integer positions up to 2^16 get HF's
float32 angles (exact enough there), everything else is formed in float64 and reduced mod
2 pi before the cast (``functional.rope_angles``). Between 2^17 and 2^24 HF-style float32
angles would cost more than the dtype's own rounding (2.5 eps in bf16 and 16 eps in fp16 at
p = 10^6, 48 eps / 386 eps at p = 2^24 - 1, where the angle is off by 0.44 rad): those
positions are tested explicitly. Angles formed in bfloat16 (a known pitfall) break even
the float32-angle bound, which shows the bounds can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.functional import apply_rotary, rope_angles, rope_frequencies

D = 128
BASE = 10000.0
DTYPES = [torch.bfloat16, torch.float16]
LAYOUTS = ["half", "interleaved"]

# Positions where float32 angles are accurate to well below the dtype's rounding (or exact,
# like 2^24 * theta), and positions above 2^24 (float64 angles).
ACCURATE = {
    torch.bfloat16: [0, 1, 257, 4095, 16383, 65535, 2**24, 2**24 + 1, 2**24 + 3, 2**25 + 1, 10**9],
    torch.float16: [0, 1, 257, 4095, 2**24, 2**24 + 1, 2**24 + 3, 2**25 + 1, 10**9],
}
# HF-style float32 angles would lose more than the dtype's rounding here (2^-24 * p * theta).
FLOAT32_ANGLE_LOSS = [999_999, 1_000_000, 2**24 - 1]
ALL_POSITIONS = sorted(set(ACCURATE[torch.bfloat16]) | set(FLOAT32_ANGLE_LOSS) | {131_071})


def hf_inv_freq() -> torch.Tensor:
    """Spec section 1 (HF, exact): ``1.0 / (b ** (arange(0, d, 2).float() / d))``."""
    return 1.0 / (BASE ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))


def pair_index(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Channels ``(a_i, b_i)`` of pair i: half ``(i, i + d/2)``, interleaved ``(2i, 2i+1)``."""
    i = torch.arange(D // 2)
    return (i, i + D // 2) if layout == "half" else (2 * i, 2 * i + 1)


def reference(x: torch.Tensor, pos: torch.Tensor, layout: str):
    """float64 rotation of ``x (..., L, D)`` at integer/float ``pos (L,)``.

    Returns ``(out, magnitude, angle)``, each ``(..., L, D)``: the rotated x, ``|a| + |b|`` of
    the channel's pair and ``|p * theta_i|`` of the channel's pair."""
    x = x.to(torch.float64)
    a_idx, b_idx = pair_index(layout)
    phi = pos.to(torch.float64)[:, None] * hf_inv_freq().to(torch.float64)  # (L, D/2)
    a, b = x[..., a_idx], x[..., b_idx]
    out = torch.empty_like(x)
    out[..., a_idx] = a * phi.cos() - b * phi.sin()
    out[..., b_idx] = a * phi.sin() + b * phi.cos()
    mag = torch.empty_like(x)
    mag[..., a_idx] = mag[..., b_idx] = a.abs() + b.abs()
    ang = torch.empty_like(x)
    ang[..., a_idx] = ang[..., b_idx] = phi.abs().expand_as(a)
    return out, mag, ang


def dtype_bound(dtype: torch.dtype, mag: torch.Tensor) -> torch.Tensor:
    return (2 * torch.finfo(dtype).eps + 2.0**-21) * mag


def float32_angle_bound(dtype: torch.dtype, mag: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    return dtype_bound(dtype, mag) + 2.0**-24 * ang * mag


def sample(dtype: torch.dtype, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, length, D, generator=gen).to(dtype)


def rope_rotate(x: torch.Tensor, p: int, layout: str) -> torch.Tensor:
    """``rope.rotate`` of every token of x at position p, in a call of its own."""
    enc = relpos.create("rope", num_heads=2, head_dim=D, layout=layout)
    return enc.rotate(x, torch.full((1, x.shape[2]), p, dtype=torch.long), "q")


def functional_rotate(x: torch.Tensor, p: int, layout: str) -> torch.Tensor:
    """The functional path: ``rope_angles`` -> cos/sin -> ``apply_rotary``."""
    inv_freq, _ = rope_frequencies(D, BASE)
    ang = rope_angles(torch.full((x.shape[2],), p, dtype=torch.long), inv_freq)
    return apply_rotary(x, ang.cos(), ang.sin(), layout)


PATHS = {"rope": rope_rotate, "functional": functional_rotate}


def check(out: torch.Tensor, x: torch.Tensor, p: int, layout: str, bound: str) -> None:
    assert out.dtype == x.dtype
    ref, mag, ang = reference(x, torch.full((x.shape[2],), p), layout)
    err = (out.to(torch.float64) - ref).abs()
    limit = (
        dtype_bound(x.dtype, mag) if bound == "dtype" else float32_angle_bound(x.dtype, mag, ang)
    )
    worst = (err / limit).max().item()
    assert worst <= 1.0, (
        f"p={p}, {x.dtype}, {layout}: error {err.max().item():.3g} is {worst:.2f} x the {bound} "
        "bound"
    )


def test_frequencies_are_hfs_float32_values():
    inv_freq, factor = rope_frequencies(D, BASE)
    assert torch.equal(inv_freq, hf_inv_freq()) and factor == 1.0
    enc = relpos.create("rope", num_heads=1, head_dim=D)
    assert torch.equal(enc.inv_freq, hf_inv_freq())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_float32_angle_bound_at_every_position(dtype, layout, path):
    for n, p in enumerate(ALL_POSITIONS):
        x = sample(dtype, 4, seed=n)
        check(PATHS[path](x, p, layout), x, p, layout, "float32-angle")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_dtype_bound_where_angles_are_accurate(dtype, layout, path):
    for n, p in enumerate(ACCURATE[dtype]):
        x = sample(dtype, 4, seed=n)
        check(PATHS[path](x, p, layout), x, p, layout, "dtype")


@pytest.mark.parametrize("p", FLOAT32_ANGLE_LOSS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_dtype_bound_between_2_17_and_2_24(dtype, layout, p):
    x = sample(dtype, 4, seed=p % 1000)
    check(rope_rotate(x, p, layout), x, p, layout, "dtype")


@pytest.mark.parametrize("p", [1_000_000, 2**24 - 1])
def test_rotation_of_a_token_does_not_depend_on_the_other_positions_of_the_call(p):
    # The precision path is chosen per element: a position > 2^24 elsewhere in the call must
    # not change how this token is rotated (the KV cache and the full forward agree).
    enc = relpos.create("rope", num_heads=1, head_dim=D)
    x = torch.randn(1, 1, 2, D, generator=torch.Generator().manual_seed(0))
    alone = enc.rotate(x[:, :, :1], torch.tensor([[p]]), "q")
    together = enc.rotate(x, torch.tensor([[p, 2**24 + 1]]), "q")[:, :, :1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)


def _circular(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a - b|`` modulo 2 pi, in [0, pi]."""
    return torch.remainder(a - b + math.pi, 2 * math.pi).sub(math.pi).abs()


@pytest.mark.parametrize("p", ALL_POSITIONS)
def test_rope_angles_error(p):
    inv_freq = hf_inv_freq()
    got = rope_angles(torch.tensor([p]), inv_freq)[0].to(torch.float64)
    exact = p * inv_freq.to(torch.float64)
    err = _circular(got, exact)
    if p <= 2**24:  # float32 product: one rounding of p * theta
        limit = 2.0**-24 * exact + 2.0**-22
    else:  # float64 product reduced mod 2 pi, then cast: about one float32 ulp of 2 pi
        limit = torch.full_like(exact, 2.0**-21)
    assert (err <= limit).all(), f"p={p}: angle error {err.max().item():.3g} rad"


def test_rope_angles_fractional_positions_use_float64():
    inv_freq = hf_inv_freq()
    pos = torch.tensor([0.5, 1000.25, 999_999.5, 2.0**24 + 0.5], dtype=torch.float64)
    got = rope_angles(pos, inv_freq).to(torch.float64)
    exact = pos[:, None] * inv_freq.to(torch.float64)
    assert (_circular(got, exact) <= 2.0**-21).all()


def test_position_2_24_plus_1_is_not_rounded_to_2_24():
    # float32 cannot hold 2^24 + 1; a float32 position would make both angles equal.
    inv_freq = hf_inv_freq()
    ang = rope_angles(torch.tensor([2**24, 2**24 + 1]), inv_freq).to(torch.float64)
    step = _circular(ang[1], ang[0] + inv_freq.to(torch.float64))
    assert (step <= 2.0**-20).all()
    naive = torch.tensor([2**24, 2**24 + 1]).float()[:, None] * inv_freq
    assert torch.equal(naive[0], naive[1])


# ---------------------------------------------------------------- the naive approach fails


def naive_bf16_angles(p: int) -> torch.Tensor:
    """The pitfall: position and theta in bfloat16, product in bfloat16."""
    return torch.tensor([p]).to(torch.bfloat16)[:, None] * hf_inv_freq().to(torch.bfloat16)


@pytest.mark.parametrize(
    "p,rounded,max_error",
    [(257, 256, 1.0), (4095, 4096, 5.9), (16383, 16384, 20.9), (65535, 65536, 81.0)],
)
def test_naive_bf16_angles_have_the_errors_of_spec_p2(p, rounded, max_error):
    assert float(torch.tensor(float(p)).to(torch.bfloat16)) == rounded
    err = (naive_bf16_angles(p)[0].to(torch.float64) - p * hf_inv_freq().to(torch.float64)).abs()
    assert err.max().item() == pytest.approx(max_error, abs=0.05)


@pytest.mark.parametrize("p", [257, 4095, 65535, 1_000_000])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_with_bf16_angles_fails_the_bound(p, layout):
    x = sample(torch.bfloat16, 4, seed=1)
    ang = naive_bf16_angles(p).expand(4, -1)
    out = apply_rotary(x, ang.cos(), ang.sin(), layout)
    ref, mag, phi = reference(x, torch.full((4,), p), layout)
    err = (out.to(torch.float64) - ref).abs()
    assert (err > float32_angle_bound(torch.bfloat16, mag, phi)).any()
