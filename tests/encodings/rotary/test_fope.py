"""FoPE (Hua et al., arXiv 2412.17739) as vLLM's ``FourierRotaryEmbedding`` computes it
(``vllm/model_executor/layers/rotary_embedding/fope.py``).

The reference here is a float64 restatement of the formula, written from it (not from relpos):
per coefficient set ``s`` and position ``p``, ``C_d = sum_j cos(p w_j) cos_coef[s, j, d]``,
``S_d = sum_j sin(p w_j) sin_coef[s, j, d]`` for the ``F`` kept frequencies, ``C = 1`` and
``S = 1`` (official code, vLLM 0.34.0) or ``S = 0`` (vLLM's main branch) on the clipped pairs
up to ``D/2``, and pair ``(x_d, x_{d + D/2})`` -> ``(a C - b S, b C + a S)``. vLLM's own
cache and GQA view are restated in tests/rope_scaling/test_vllm_types.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos

from .formulas import randn, rope_fp64


def fope_fp64(x, pos, inv_freq, cos_coef, sin_coef, set_of_head, clipped_sin=1.0):
    """The formula in float64: ``x (B, H, L, D)``, ``pos (L,)``, ``inv_freq (F,)``,
    coefficients ``(S, F, F)``, ``set_of_head[h]`` the set head ``h`` uses, ``clipped_sin``
    the sin of the clipped pairs (their cos is 1)."""
    x = x.double()
    d = x.shape[-1]
    ang = pos.double()[:, None] * inv_freq.double()[None]  # (L, F)
    out = torch.empty_like(x)
    for h, s in enumerate(set_of_head):
        c = ang.cos() @ cos_coef[s].double()
        si = ang.sin() @ sin_coef[s].double()
        pad = d // 2 - c.shape[-1]
        c = torch.cat((c, torch.ones(c.shape[0], pad, dtype=c.dtype)), -1)
        si = torch.cat((si, torch.full((si.shape[0], pad), clipped_sin, dtype=si.dtype)), -1)
        a, b = x[:, h, :, : d // 2], x[:, h, :, d // 2 :]
        out[:, h] = torch.cat((a * c - b * si, b * c + a * si), -1)
    return out


def _random_coefficients(enc, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (enc.cos_coef, enc.sin_coef):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))


# ----------------------------------------------------------------------------- pinned values


def test_pinned_values_of_a_tiny_case() -> None:
    """D = 4, base 100: frequencies (1, 0.1); at p = 1 with cos_coef [[1, .5], [0, 1]] and
    sin_coef [[1, 0], [.25, 1]]: C = (cos 1, .5 cos 1 + cos .1), S = (sin 1 + .25 sin .1,
    sin .1); q = (1, 2, 3, 4) pairs (1, 3) and (2, 4)."""
    enc = relpos.create("fope", num_heads=1, head_dim=4, base=100.0).double()
    with torch.no_grad():
        enc.cos_coef.copy_(torch.tensor([[[1.0, 0.5], [0.0, 1.0]]]))
        enc.sin_coef.copy_(torch.tensor([[[1.0, 0.0], [0.25, 1.0]]]))
    q = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(1, 1, 1, 4)
    out = enc.rotate(q, torch.tensor([[1]]), "q").detach()
    expected = [-2.0589857110406706, 2.130976969836879, 2.487336256574023, 5.260288106142039]
    torch.testing.assert_close(
        out.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-8
    )


def test_clipped_pairs_take_a_constant_phase_or_pass_through() -> None:
    """2 pi / 10 = 0.63: of (1, 0.1) only 1 is kept. The clipped pair (a, b) = (x_1, x_3)
    becomes (a - b, b + a) at every position (cos = sin = 1, the default), or passes through
    with ``clipped_pairs="identity"``."""
    q = randn(1, 1, 6, 4)
    pos = torch.arange(6)[None]
    for clipped, expected in (
        ("constant-phase", torch.stack((q[..., 1] - q[..., 3], q[..., 3] + q[..., 1]), -1)),
        ("identity", q[..., [1, 3]]),
    ):
        enc = relpos.create(
            "fope",
            num_heads=1,
            head_dim=4,
            base=100.0,
            max_position_embeddings=10,
            clipped_pairs=clipped,
        )
        assert enc.inv_freq.tolist() == [1.0]
        assert enc.cos_coef.shape == enc.sin_coef.shape == (1, 1, 1)
        _random_coefficients(enc)
        out = enc.rotate(q, pos, "q").detach()
        assert torch.equal(out[..., [1, 3]], expected), clipped
        assert not torch.allclose(out[..., [0, 2]], q[..., [0, 2]])


def test_the_floor_is_vllms_two_pi_over_the_trained_length() -> None:
    """head_dim 128, base 5e5, 4096 positions: the kept frequencies are those above
    2 pi / 4096, in order (float64 restatement of RoPE's frequencies)."""
    enc = relpos.create("fope", num_heads=1, head_dim=128, base=5e5, max_position_embeddings=4096)
    theta = 5e5 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    expected = theta[theta > 2 * math.pi / 4096]
    assert 0 < expected.numel() < 64
    torch.testing.assert_close(enc.inv_freq.double(), expected, rtol=2e-7, atol=0)
    assert enc.cos_coef.shape == (1, expected.numel(), expected.numel())


# ----------------------------------------------------------------------------- the formula


@pytest.mark.parametrize(
    ("options", "kv"),
    [
        ({"max_position_embeddings": 64}, 4),
        ({"num_inv_freq": 5, "kv_heads": 2}, 2),
        ({"partial_rotary_factor": 0.5, "kv_heads": 1}, 1),
        ({"separate_heads": False, "kv_heads": 2, "base": 500.0}, 2),
        ({"max_position_embeddings": 64, "kv_heads": 2, "clipped_pairs": "identity"}, 2),
    ],
)
def test_rotate_qk_is_the_formula(options: dict, kv: int) -> None:
    heads, d, length = 4, 16, 11
    enc = relpos.create("fope", num_heads=heads, head_dim=d, **options).double()
    _random_coefficients(enc)
    q, k = randn(2, heads, length, d, seed=2).double(), randn(2, kv, length, d, seed=3).double()
    pos = torch.arange(length) * 3 + 5
    with torch.no_grad():
        q_out, k_out = enc.rotate_qk(q, k, pos[None], pos[None])
    sets = enc.cos_coef.shape[0]
    group = heads // kv
    q_sets = [h // group if sets > 1 else 0 for h in range(heads)]
    k_sets = [h if sets > 1 else 0 for h in range(kv)]
    coefficients = (enc.inv_freq, enc.cos_coef.detach(), enc.sin_coef.detach())
    clipped_sin = 0.0 if options.get("clipped_pairs") == "identity" else 1.0
    q_ref = fope_fp64(q, pos, *coefficients, q_sets, clipped_sin)
    k_ref = fope_fp64(k, pos, *coefficients, k_sets, clipped_sin)
    torch.testing.assert_close(q_out, q_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-12, atol=1e-12)


def test_identity_coefficients_without_clipping_are_rope() -> None:
    enc = relpos.create("fope", num_heads=2, head_dim=16, init_factor=0.0).double()
    assert torch.equal(enc.cos_coef.detach(), torch.eye(8).expand(2, 8, 8).double())
    q = randn(1, 2, 9, 16).double()
    pos = torch.arange(9)
    theta = 1e4 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    out = enc.rotate(q, pos[None], "q").detach()
    torch.testing.assert_close(out, rope_fp64(q, pos, theta, "half"), rtol=0, atol=1e-6)


def test_learned_coefficients_make_the_scores_depend_on_both_positions() -> None:
    enc = relpos.create("fope", num_heads=1, head_dim=16).double()
    assert enc.relative is False
    q, k = randn(1, 1, 8, 16, seed=4).double(), randn(1, 1, 8, 16, seed=5).double()
    pos = torch.arange(8)
    base = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    shifted = relpos.scores(q, k, enc, q_pos=pos + 50, k_pos=pos + 50)
    assert not torch.allclose(base, shifted, atol=1e-6)


# ----------------------------------------------------------------------------- GQA


def _set_encoding(enc, s: int):
    """A one-head encoding with set ``s`` of ``enc``."""
    one = relpos.create(
        "fope", num_heads=1, head_dim=enc.head_dim, max_position_embeddings=64
    ).double()
    with torch.no_grad():
        one.cos_coef.copy_(enc.cos_coef[s : s + 1])
        one.sin_coef.copy_(enc.sin_coef[s : s + 1])
    return one


def test_each_key_heads_set_serves_its_contiguous_group_of_query_heads() -> None:
    enc = relpos.create(
        "fope", num_heads=4, head_dim=16, kv_heads=2, max_position_embeddings=64
    ).double()
    _random_coefficients(enc)
    q, k = randn(1, 4, 7, 16, seed=6).double(), randn(1, 2, 7, 16, seed=7).double()
    pos = torch.arange(7)[None]
    with torch.no_grad():
        q_out, k_out = enc.rotate_qk(q, k, pos, pos)
        for h in range(4):
            one = _set_encoding(enc, h // 2)
            torch.testing.assert_close(q_out[:, h : h + 1], one.rotate(q[:, h : h + 1], pos, "q"))
        for g in range(2):
            one = _set_encoding(enc, g)
            torch.testing.assert_close(k_out[:, g : g + 1], one.rotate(k[:, g : g + 1], pos, "k"))
        # keys expanded to the query heads repeat the sets
        _, k_wide = enc.rotate_qk(q, k.repeat_interleave(2, dim=1), pos, pos)
        torch.testing.assert_close(k_wide, k_out.repeat_interleave(2, dim=1))


def test_more_sets_than_key_heads_average_each_groups_sets() -> None:
    enc = relpos.create("fope", num_heads=4, head_dim=16, max_position_embeddings=64).double()
    _random_coefficients(enc)
    grouped = relpos.create(
        "fope", num_heads=4, head_dim=16, kv_heads=2, max_position_embeddings=64
    ).double()
    with torch.no_grad():
        grouped.cos_coef.copy_(enc.cos_coef.view(2, 2, 3, 3).mean(1))
        grouped.sin_coef.copy_(enc.sin_coef.view(2, 2, 3, 3).mean(1))
    q, k = randn(1, 4, 5, 16, seed=8).double(), randn(1, 2, 5, 16, seed=9).double()
    pos = torch.arange(5)[None]
    with torch.no_grad():
        for a, b in zip(
            enc.rotate_qk(q, k, pos, pos), grouped.rotate_qk(q, k, pos, pos), strict=True
        ):
            torch.testing.assert_close(a, b)


def test_attention_runs_with_grouped_keys_and_gradients_reach_the_coefficients() -> None:
    enc = relpos.create("fope", num_heads=4, head_dim=16, kv_heads=2)
    q, k, v = randn(2, 4, 6, 16, seed=1), randn(2, 2, 6, 16, seed=2), randn(2, 2, 6, 16, seed=3)
    out = relpos.attention(q, k, v, enc, causal=True)
    out.square().sum().backward()
    for p in (enc.cos_coef, enc.sin_coef):
        assert p.grad is not None and p.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- dtypes


def test_bfloat16_activations_keep_their_dtype_and_the_formula() -> None:
    enc = relpos.create("fope", num_heads=2, head_dim=16)
    _random_coefficients(enc)
    q = randn(1, 2, 10, 16, seed=11)
    pos = torch.arange(10)
    with torch.no_grad():
        out, _ = enc.rotate_qk(q.bfloat16(), q.bfloat16(), pos[None], pos[None])
    assert out.dtype == torch.bfloat16
    ref = fope_fp64(
        q.bfloat16(), pos, enc.inv_freq, enc.cos_coef.detach(), enc.sin_coef.detach(), [0, 1]
    )
    scale = float(ref.abs().max())
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2 * scale)


def test_angles_are_float64_products_at_large_positions() -> None:
    """2^24 + 1 is not a float32 number: a float32 product would turn the angle of frequency
    1 by a whole radian; float64 products keep float32 activations at float32 rounding."""
    enc = relpos.create("fope", num_heads=1, head_dim=8)
    _random_coefficients(enc)
    q = randn(1, 1, 3, 8, seed=12)
    pos = torch.tensor([2**24 + 1, 2**24 + 3, 3 * 2**25 + 7])
    with torch.no_grad():
        out = enc.rotate(q, pos[None], "q")
    ref = fope_fp64(q, pos, enc.inv_freq, enc.cos_coef.detach(), enc.sin_coef.detach(), [0])
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


def test_float64_activations_compute_in_float64() -> None:
    enc = relpos.create("fope", num_heads=1, head_dim=8)  # float32 coefficients
    _random_coefficients(enc)
    q = randn(1, 1, 5, 8, seed=13).double()
    pos = torch.arange(5) * 1000
    with torch.no_grad():
        out = enc.rotate(q, pos[None], "q")
    assert out.dtype == torch.float64
    ref = fope_fp64(q, pos, enc.inv_freq, enc.cos_coef.detach(), enc.sin_coef.detach(), [0])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- init, state


def test_initialisation_is_identity_plus_xavier_normal_noise() -> None:
    torch.manual_seed(0)
    enc = relpos.create("fope", num_heads=8, head_dim=256, kv_heads=4, init_factor=0.3)
    count = 128
    assert enc.cos_coef.shape == enc.sin_coef.shape == (4, count, count)
    for p in (enc.cos_coef, enc.sin_coef):
        noise = p.detach() - torch.eye(count)
        assert noise.std().item() == pytest.approx(0.3 / math.sqrt(count), rel=0.03)
        assert abs(noise.mean().item()) < 1e-3
    assert not torch.equal(enc.cos_coef, enc.sin_coef)
    shared = relpos.create("fope", num_heads=8, head_dim=16, kv_heads=4, separate_heads=False)
    assert shared.cos_coef.shape == (1, 8, 8)


def test_state_dict_holds_the_coefficients_under_vllms_names() -> None:
    enc = relpos.create("fope", num_heads=4, head_dim=16, kv_heads=2, max_position_embeddings=64)
    state = enc.state_dict()
    assert sorted(state) == ["cos_coef", "sin_coef"]  # inv_freq is not persistent
    assert state["cos_coef"].shape == (2, 3, 3)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"kv_heads": 3}, ValueError, "kv_heads"),
        ({"kv_heads": 0}, ValueError, "kv_heads"),
        ({"num_inv_freq": 9}, ValueError, "num_inv_freq"),
        ({"num_inv_freq": 0}, ValueError, "num_inv_freq"),
        ({"max_position_embeddings": 4}, ValueError, "max_position_embeddings"),
        ({"layout": "interleaved"}, ValueError, "layout"),
        ({"scaling": {"rope_type": "linear", "factor": 2.0}}, ValueError, "scaling"),
        ({"init_factor": -0.1}, ValueError, "init_factor"),
        ({"separate_heads": "yes"}, TypeError, "separate_heads"),
        ({"clipped_pairs": "zero"}, ValueError, "clipped_pairs"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        relpos.create("fope", num_heads=4, head_dim=16, **options)


def test_bad_tensors_are_refused_by_name() -> None:
    enc = relpos.create("fope", num_heads=4, head_dim=16, kv_heads=2)
    pos = torch.arange(3)[None]
    with pytest.raises(ValueError, match="q has head_dim 8"):
        enc.rotate_qk(randn(1, 4, 3, 8), randn(1, 2, 3, 16), pos, pos)
    with pytest.raises(ValueError, match="k has 3 heads"):
        enc.rotate(randn(1, 3, 3, 16), pos, "k")
