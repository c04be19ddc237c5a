"""LeRoPE, HoPE and p-RoPE (``relpos.encodings.rotary.frequencies``): reference values (HF
``transformers`` 5.24.0's float32 frequencies for the default and ``proportional`` types, or
re-derived in float64 from the formulas) and defining
properties: HoPE has no low frequencies and no long-term decay; p-RoPE is HF's
"proportional"; LeRoPE learns its frequencies."""

from __future__ import annotations

import math

import pytest
import torch

import relpos

from .formulas import ones_scores, randn, theta_fp64


def test_hope_has_no_low_frequencies():
    enc = relpos.create("hope", num_heads=1, head_dim=64, train_length=4096)
    r = enc.rotated_pairs
    wavelengths = 2 * math.pi / enc.inv_freq[:r].double()
    assert bool((wavelengths <= 4096).all())  # every kept pair turns at least once in L_train
    assert bool((enc.inv_freq[r:] == 0).all())  # the rest do not turn at all
    rope = relpos.create("rope", num_heads=1, head_dim=64)
    assert float(2 * math.pi / rope.inv_freq[r]) > 4096  # and those were RoPE's low ones


def test_hope_has_no_long_term_decay_unlike_rope():
    length, d = 4096, 64
    quarter = length // 4
    hope = ones_scores(relpos.create("hope", num_heads=1, head_dim=d), length, d)
    rope = ones_scores(relpos.create("rope", num_heads=1, head_dim=d), length, d)
    assert float(rope[:quarter].mean() - rope[-quarter:].mean()) > 10  # RoPE decays
    means = hope.reshape(4, quarter).mean(1)
    assert float((means[0] - means[-1]).abs()) < 1
    nope_pairs = d // 2 - relpos.create("hope", num_heads=1, head_dim=d).rotated_pairs
    assert float((means - 2 * nope_pairs).abs().max()) < 3  # oscillates around the NoPE part


def test_hope_bad_options_name_the_argument():
    with pytest.raises(ValueError, match="train_length or rotated_pairs"):
        relpos.create("hope", num_heads=1, head_dim=16, train_length=10, rotated_pairs=2)
    with pytest.raises(ValueError, match="rotated_pairs"):
        relpos.create("hope", num_heads=1, head_dim=16, rotated_pairs=9)
    with pytest.raises(ValueError, match="train_length"):
        relpos.create("hope", num_heads=1, head_dim=16, train_length=-1)


@pytest.mark.parametrize("head_dim", [16, 80, 256])
@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("base", [1e4, 1e6])
def test_p_rope_equals_hf_proportional_frequencies(head_dim, p, base):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=8192,
        rope_parameters={
            "rope_type": "proportional",
            "rope_theta": base,
            "partial_rotary_factor": p,
        },
    )
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["proportional"](config, device=None)
    enc = relpos.create("p-rope", num_heads=2, head_dim=head_dim, p=p, base=base)
    assert torch.equal(enc.inv_freq, hf_inv_freq.float())
    assert enc.attention_factor == hf_factor


def test_p_rope_extremes_are_rope_and_nope():
    q, k = randn(1, 2, 6, 16, seed=1), randn(1, 2, 6, 16, seed=2)
    pos = torch.arange(20, 26)
    full = relpos.create("p-rope", num_heads=2, head_dim=16, p=1.0)
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    torch.testing.assert_close(
        relpos.scores(q, k, full, q_pos=pos, k_pos=pos),
        relpos.scores(q, k, rope, q_pos=pos, k_pos=pos),
    )
    none = relpos.create("p-rope", num_heads=2, head_dim=16, p=0.0)
    torch.testing.assert_close(relpos.scores(q, k, none, q_pos=pos, k_pos=pos), q @ k.mT / 4)
    with pytest.raises(ValueError, match=r"\bp\b"):
        relpos.create("p-rope", num_heads=2, head_dim=16, p=1.5)


def test_lerope_learns_its_frequencies():
    enc = relpos.create("lerope", num_heads=2, head_dim=16)
    q, k = randn(1, 2, 8, 16, seed=1), randn(1, 2, 8, 16, seed=2)
    relpos.scores(q, k, enc).sum().backward()
    assert enc.log_scale.grad is not None and float(enc.log_scale.grad.abs().max()) > 0
    rope = relpos.create("rope", num_heads=2, head_dim=16)
    with torch.no_grad():
        torch.testing.assert_close(relpos.scores(q, k, enc), relpos.scores(q, k, rope))


# HF default frequencies, b = 1e4, d = 64.
R1 = [
    1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362, 0.177827939, 0.133352146,
    0.100000001, 0.0749894157, 0.0562341288, 0.0421696492, 0.0316227786, 0.0237137359,
    0.0177827943, 0.0133352149, 0.00999999978, 0.00749894232, 0.00562341325, 0.00421696482,
    0.00316227786, 0.00237137382, 0.00177827943, 0.00133352145, 0.00100000005, 0.000749894185,
    0.000562341302, 0.000421696488, 0.000316227786, 0.000237137385, 0.00017782794, 0.00013335215,
]  # fmt: skip

# HF proportional (p-RoPE as in Gemma 4), head_dim 16, p = 0.25, b = 1e6.
R9 = [1, 0.177827939, 0, 0, 0, 0, 0, 0]


def test_p_rope_frequencies_match_r9():
    enc = relpos.create("p-rope", num_heads=1, head_dim=16, p=0.25, base=1e6)
    torch.testing.assert_close(enc.inv_freq, torch.tensor(R9), rtol=1e-6, atol=0)
    assert enc.rotary_dim == 16  # cos/sin span the whole head (HF proportional)


def test_p_rope_zero_frequency_pairs_pass_through():
    enc = relpos.create("p-rope", num_heads=1, head_dim=16, p=0.25, base=1e6)
    x = randn(1, 1, 5, 16)
    out = enc.rotate(x, torch.arange(100, 105)[None], "q")
    kept = [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]  # half layout: pairs (i, i + 8), i >= 2
    torch.testing.assert_close(out[..., kept], x[..., kept], rtol=0, atol=0)


def test_hope_keeps_the_pairs_whose_wavelength_fits_the_training_length():
    # lambda_i = 2 pi 1e4^(2i/64) <= 4096  <=>  i <= 32 log10(4096 / 2 pi) / 4 = 22.5
    cutoff = math.floor(32 * math.log10(4096 / (2 * math.pi)) / 4) + 1
    assert cutoff == 23
    enc = relpos.create("hope", num_heads=1, head_dim=64, train_length=4096)
    assert enc.rotated_pairs == cutoff
    expected = torch.tensor(R1[:cutoff] + [0.0] * (32 - cutoff))
    torch.testing.assert_close(enc.inv_freq, expected, rtol=1e-6, atol=0)


def test_hope_with_explicit_pairs_is_p_rope():
    hope = relpos.create("hope", num_heads=1, head_dim=16, rotated_pairs=2, base=1e6)
    torch.testing.assert_close(hope.inv_freq, torch.tensor(R9), rtol=1e-6, atol=0)


def test_lerope_is_rope_at_init_and_rescales_frequencies_in_log_space():
    enc = relpos.create("lerope", num_heads=1, head_dim=64)
    torch.testing.assert_close(enc.learned_inv_freq, torch.tensor(R1), rtol=1e-6, atol=0)
    # u_i = -(2i/d) ln 4 turns base 1e4 into base 4e4
    with torch.no_grad():
        enc.log_scale.copy_(-torch.arange(0, 64, 2) / 64 * math.log(4.0))
    torch.testing.assert_close(enc.learned_inv_freq, theta_fp64(64, 4e4).float(), rtol=1e-6, atol=0)
