"""PRISM (P. Lee 2025, arXiv 2506.00920): reference values of the reconstructed formulas, the
histogram filter's parallel scan against the token-by-token filter, counting = the distance
function, causality of the histograms, and the refusal of Lq > Lk."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.contextual.prism import difference_distribution, position_histograms


def test_difference_distribution_and_alibi_bias_match_the_spec_reference():
    pi_i = torch.tensor([0, 0.5, 0.5, 0, 0], dtype=torch.float64)
    pi_j = torch.tensor([0.8, 0.2, 0, 0, 0], dtype=torch.float64)
    p = difference_distribution(pi_i, pi_j)  # delta = -4 .. 4
    expected = torch.zeros(9, dtype=torch.float64)
    expected[4:7] = torch.tensor([0.1, 0.5, 0.4], dtype=torch.float64)
    torch.testing.assert_close(p, expected)
    delta = torch.arange(-4, 5, dtype=torch.float64)
    assert float((p * -0.5 * delta.abs()).sum()) == pytest.approx(-0.65)
    # the encoding's bilinear form pi_i^T F pi_j gives the same expectation
    enc = relpos.create("prism", num_heads=1, head_dim=2, bins=5)
    with torch.no_grad():
        enc.table.copy_(-0.5 * delta.abs()[None].float())
    f = enc.distance_matrix().double()[0]
    assert float(pi_i @ f @ pi_j) == pytest.approx(-0.65)


def test_one_hot_histograms_reproduce_the_distance_function_exactly():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 12, 8, generator=gen) for _ in range(2))
    prism = relpos.create("prism", num_heads=4, head_dim=8, kernel="counting", bins=32)
    alibi = relpos.create("alibi", num_heads=4, head_dim=8, bidirectional="symmetric")
    torch.testing.assert_close(relpos.scores(q, k, prism), relpos.scores(q, k, alibi))


def filter_token_by_token(kernels: torch.Tensor, bins: int) -> torch.Tensor:
    """``pi_t = pi_{t-1} * kappa_{t-1}``, one token at a time, mass kept in the last bin."""
    pi = torch.zeros(*kernels.shape[:-2], bins, dtype=torch.float64)
    pi[..., 0] = 1.0
    out = [pi]
    for t in range(1, kernels.shape[-2]):
        new = torch.zeros_like(pi)
        for s in range(kernels.shape[-1]):
            moved = torch.zeros_like(pi)
            for b in range(bins):
                moved[..., min(b + s, bins - 1)] += pi[..., b]
            new = new + kernels[..., t - 1, s, None] * moved
        pi = new
        out.append(pi)
    return torch.stack(out, dim=-2)


@pytest.mark.parametrize("bins,shifts", [(16, 3), (4, 6)])
def test_parallel_scan_equals_the_token_by_token_filter(bins, shifts):
    kernels = torch.softmax(torch.randn(2, 3, 21, shifts, dtype=torch.float64), dim=-1)
    scan = position_histograms(kernels, bins)
    torch.testing.assert_close(scan, filter_token_by_token(kernels, bins))
    torch.testing.assert_close(scan.sum(-1), torch.ones(2, 3, 21, dtype=torch.float64))


def test_histograms_are_causal_so_cached_steps_equal_the_full_forward():
    enc = relpos.create("prism", num_heads=2, head_dim=4, bins=16).double()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        enc.kernel_weight.normal_(generator=gen)
    q, k, v = (torch.randn(1, 2, 10, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    full = relpos.attention(q, k, v, enc, causal=True)
    k2 = k.clone()
    k2[:, :, 6:] += 3.0  # later keys change later histograms only
    torch.testing.assert_close(
        relpos.attention(q, k2, v, enc, causal=True)[:, :, :6], full[:, :, :6]
    )
    step = relpos.attention(q[:, :, -1:], k, v, enc, causal=True)
    torch.testing.assert_close(step, full[:, :, -1:])


def test_learned_parts_train_and_counts_saturate_in_the_last_bin():
    enc = relpos.create("prism", num_heads=2, head_dim=4, bins=6, distance="learned")
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=gen) for _ in range(3))
    out = relpos.attention(q, k, v, enc, causal=True)
    grads = torch.autograd.grad(out.square().sum(), [enc.kernel_weight, enc.kernel_bias, enc.table])
    assert all(g.abs().sum() > 0 for g in grads)
    counting = relpos.create("prism", num_heads=1, head_dim=4, bins=6, kernel="counting")
    bias = relpos.scores(torch.zeros(1, 1, 9, 4), torch.zeros(1, 1, 9, 4), counting)[0, 0, -1]
    # the last query (token 8) and tokens 5 .. 8 all sit in the last bin (5): the counted
    # distance from the last query is 5 - min(j, 5)
    counted = torch.tensor([5 - min(j, 5) for j in range(9)])
    expected = counting.table[0, counted + 6 - 1]
    torch.testing.assert_close(bias, expected)


def test_more_queries_than_keys_are_refused_by_name():
    enc = relpos.create("prism", num_heads=2, head_dim=4, bins=8)
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="Lq <= Lk"):
        relpos.attention(q, k, k, enc)


def test_the_correction_step_matches_a_hand_computed_filter():
    from relpos.encodings.contextual.prism import corrected_histograms

    kernels = torch.tensor([[0.5, 0.5]] * 3, dtype=torch.float64)  # shift 0 or 1
    ell = torch.tensor([[0.9, 0.05, 0.05], [0.2, 0.6, 0.2], [1, 1, 1]], dtype=torch.float64)
    pi = corrected_histograms(kernels, ell / ell.sum(-1, keepdim=True))
    # pi_0 = delta_0; predict [.5 .5 0], correct by [.2 .6 .2]: [.25 .75 0]; predict
    # [.125 .5 .375] (the last bin keeps what would move past it), l uniform
    expected = [[1, 0, 0], [0.25, 0.75, 0], [0.125, 0.5, 0.375]]
    torch.testing.assert_close(pi, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("bins,shifts", [(16, 3), (4, 6)])
def test_a_uniform_likelihood_is_the_filter_without_correction(bins, shifts):
    from relpos.encodings.contextual.prism import corrected_histograms

    kernels = torch.softmax(torch.randn(2, 3, 21, shifts, dtype=torch.float64), dim=-1)
    uniform = torch.full((2, 3, 21, bins), 1.0 / bins, dtype=torch.float64)
    torch.testing.assert_close(
        corrected_histograms(kernels, uniform), position_histograms(kernels, bins)
    )


def test_the_learned_correction_starts_as_the_registered_method_and_then_differs():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=gen) for _ in range(3))
    plain = relpos.create("prism", num_heads=2, head_dim=4, bins=16)
    corrected = relpos.create("prism", num_heads=2, head_dim=4, bins=16, correction="learned")
    corrected.load_state_dict(plain.state_dict(), strict=False)
    assert plain.correction == "none" and not hasattr(plain, "correction_weight")
    torch.testing.assert_close(relpos.scores(q, k, corrected), relpos.scores(q, k, plain))
    with torch.no_grad():
        corrected.correction_weight.normal_(generator=gen)
    ell = corrected.likelihoods(k)
    torch.testing.assert_close(ell.sum(-1), torch.ones(1, 2, 12, dtype=torch.float64))
    assert not torch.allclose(relpos.scores(q, k, corrected), relpos.scores(q, k, plain))
    # the correction trains, and its histograms stay causal (a cached step = the full call)
    relpos.scores(q, k, corrected).sum().backward()
    assert corrected.correction_weight.grad is not None
    full = relpos.attention(q, k, v, corrected, causal=True)
    step = relpos.attention(q[:, :, -1:], k, v, corrected, causal=True)
    torch.testing.assert_close(step, full[:, :, -1:], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="correction must be one of"):
        relpos.create("prism", num_heads=1, head_dim=4, correction="bayes")
