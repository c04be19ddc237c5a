"""SeqPE (H. Li et al. 2025, arXiv 2506.13277; ghrua/seqpe): reference values from the official
code: digit sequences, the causal digit encoder with the CLS vector last, the channels path
equal to the bias path with the original scale (``d^-1/2`` of the head), contrastive labels, the
losses, position checks, m-D positions and decoding."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.bias.seqpe_encoder import (
    RandomShift,
    SequentialPositionEncoder,
    contrastive_labels,
    contrastive_loss,
    distillation_loss,
    position_digits,
)

SMALL = {"embed_dim": 16, "encoder_heads": 2, "layers": 2}


def test_digits_are_left_padded_with_zero_per_axis():
    assert position_digits(torch.tensor([[123]]), 5).tolist() == [[0, 0, 1, 2, 3]]
    assert position_digits(torch.tensor([[19999]]), 5).tolist() == [[1, 9, 9, 9, 9]]
    assert position_digits(torch.tensor([[12, 3]]), 5).tolist() == [[0, 0, 0, 1, 2, 0, 0, 0, 0, 3]]


def test_the_digit_encoder_is_causal_and_reads_every_digit_through_the_last_token():
    """The mask over 5 digits + CLS is lower-triangular: a digit's state does not depend on
    later digits, and the CLS vector (last) depends on all of them."""
    torch.manual_seed(0)
    enc = SequentialPositionEncoder(
        max_digits=5, data_dim=1, dim=16, heads=2, layers=2, out_dim=8
    ).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64, requires_grad=True)
    h = x
    for block in enc.blocks:
        h = block(h)
    for t in range(6):
        (grad,) = torch.autograd.grad(h[0, t].sum(), x, retain_graph=True)
        seen = grad[0].abs().sum(-1) > 0
        assert seen.tolist() == [s <= t for s in range(6)], t
    # every digit changes the output
    base = enc(torch.tensor([[12345]]))
    for digit in range(5):
        other = torch.tensor([[12345 + 10 ** (4 - digit) * (1 if digit else -1)]])
        assert not torch.allclose(enc(other), base)


def _pair(**options):
    torch.manual_seed(1)
    channels = relpos.create("seqpe", num_heads=2, head_dim=8, **SMALL, **options)
    bias = relpos.create("seqpe", num_heads=2, head_dim=8, path="bias", **SMALL, **options)
    bias.load_state_dict(channels.state_dict())
    return channels, bias


def test_channels_path_equals_the_bias_path_with_the_original_scale():
    channels, bias = _pair()
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 10, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    channels, bias = channels.double(), bias.double()
    pos = torch.tensor([3, 11, 250, 9, 10, 12, 99999, 0, 7, 8])
    pq, pk = channels.position_vectors(pos[None], pos[None])
    expected = (q @ k.transpose(-1, -2) + pq @ pk.transpose(-1, -2)) / 8**0.5
    for enc in (channels, bias):
        logits = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
        torch.testing.assert_close(logits, expected, atol=1e-12, rtol=0)
    out_c = relpos.attention(q, k, v, channels, q_pos=pos, k_pos=pos, causal=True)
    out_b = relpos.attention(q, k, v, bias, q_pos=pos, k_pos=pos, causal=True)
    torch.testing.assert_close(out_c, out_b, atol=1e-6, rtol=0)
    qf = q.float()
    plan = relpos.attention.plan(qf, qf, qf, channels.float(), q_pos=pos, k_pos=pos)
    assert plan == ("sdpa", "fused")  # no bias: the fused kernel with q/k widened


def test_contrastive_labels_match_the_spec_reference():
    pivot = torch.tensor([[10]])
    candidates = torch.tensor([[[3], [11], [250], [9]]])
    d2 = (candidates - pivot[:, None]).square().sum(-1)
    assert d2.tolist() == [[49, 1, 57600, 1]]
    assert contrastive_labels(pivot, candidates).tolist() == [1]  # the first on ties


def test_losses_train_the_encoder():
    enc, _ = _pair()
    pivots = torch.tensor([[10], [500]])
    candidates = torch.tensor([[[3], [11], [250], [9]], [[499], [0], [7000], [520]]])
    loss = contrastive_loss(enc.encoder, pivots, candidates)
    assert loss.ndim == 0 and loss > 0
    loss.backward()
    assert enc.encoder.digit.weight.grad.abs().sum() > 0
    block = torch.arange(8)[:, None]
    assert float(distillation_loss(enc.encoder, block, block).detach()) == pytest.approx(
        0, abs=1e-9
    )
    kd = distillation_loss(enc.encoder, block + 5000, block)
    assert kd > 0
    enc.encoder.zero_grad()
    kd.backward()
    assert enc.encoder.digit.weight.grad.abs().sum() > 0


def test_positions_outside_the_digits_are_refused_by_name():
    enc = relpos.create("seqpe", num_heads=2, head_dim=8, max_digits=3, **SMALL)
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"q_pos spans positions 998..1001.*max_digits=3"):
        relpos.attention(q, q, q, enc, q_pos=torch.arange(998, 1002), k_pos=torch.arange(998, 1002))
    with pytest.raises(ValueError, match="q_pos"):
        relpos.attention(q, q, q, enc, q_pos=torch.arange(-1, 3), k_pos=torch.arange(4))
    with pytest.raises(TypeError, match="pos"):
        relpos.attention(q, q, q, enc, q_pos=torch.arange(4.0), k_pos=torch.arange(4.0))


def test_two_dimensional_positions_use_both_axes():
    torch.manual_seed(3)
    enc = relpos.create("seqpe-2d", num_heads=2, head_dim=8, **SMALL)
    assert enc.dims == 2 and enc.encoder.axis is not None
    grid = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij"), -1)
    pos = grid.reshape(1, 12, 2)
    pq, pk = enc.position_vectors(pos, pos)
    assert pq.shape == (1, 2, 12, 8)
    swapped = pos.flip(-1)  # (r, c) -> (c, r): different positions, different vectors
    pq_swapped, _ = enc.position_vectors(swapped, swapped)
    assert not torch.allclose(pq[:, :, 1], pq_swapped[:, :, 1])
    torch.testing.assert_close(pq[:, :, 0], pq_swapped[:, :, 0])  # (0, 0) is symmetric


def test_decoding_with_cached_widened_keys_equals_the_full_forward():
    torch.manual_seed(4)
    model = relpos.nn.TransformerLM(
        13, dim=16, depth=2, num_heads=2, num_kv_heads=1, encoding="seqpe", encoding_options=SMALL
    ).eval()
    tokens = torch.randint(0, 13, (2, 9))
    full = model(tokens)
    cache = model.new_cache()
    parts = [model(tokens[:, :4], cache=cache)] + [
        model(tokens[:, t : t + 1], cache=cache) for t in range(4, 9)
    ]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_defaults_follow_the_released_config_for_a_gpt2_small_attention():
    enc = relpos.create("seqpe", num_heads=12, head_dim=64)
    assert enc.max_digits == 5 and len(enc.encoder.blocks) == 2
    assert enc.encoder.digit.weight.shape == (10, 768)
    assert enc.encoder.blocks[0].heads == 12 and enc.encoder.norm is not None
    assert enc.pe_q.weight.shape == (768, 768) and enc.pe_k.bias is None
    assert enc.keeps_own_init
    assert float(enc.encoder.digit.weight.std()) == pytest.approx(0.02, rel=0.05)


def test_random_shift_uses_shifted_windows_at_the_given_rate():
    gen = torch.Generator().manual_seed(0)
    shift = RandomShift(512, 20000, rate=0.1, downsample=320, generator=gen)
    assert len(shift.starts) == 320 and int(shift.starts.max()) <= 20000 - 512
    draws = [shift.next() for _ in range(2000)]
    moved = [d for d in draws if int(d[0]) != 0]
    assert all(torch.equal(d, torch.arange(512)) for d in draws if int(d[0]) == 0)
    assert 0.07 < len(moved) / len(draws) < 0.13
    assert all(torch.equal(d, torch.arange(int(d[0]), int(d[0]) + 512)) for d in moved)
    assert {int(d[0]) for d in moved} <= set(shift.starts.tolist())
    with pytest.raises(ValueError, match="rate"):
        RandomShift(4, 10, rate=1.5)
