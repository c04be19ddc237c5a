"""SeqPE's contrastive candidate sampler (``relpos.encodings.bias.seqpe_sampler``) against the
official ``SeqPeContrstiveDataSampler`` (ghrua/seqpe, read):
determinism from a seed, the candidate rules (distinct, never the pivot, the nearest one the
label, hard negatives farther than every surviving uniform candidate, windows), the pivots of an
epoch, 2-D positions, and the loss fed with sampled batches.
"""

from __future__ import annotations

import random

import pytest
import torch

import relpos
from relpos.encodings.bias.seqpe_encoder import contrastive_labels, contrastive_loss
from relpos.encodings.bias.seqpe_sampler import ContrastiveSampler, hard_negatives


def _equal(a, b) -> bool:
    return all(
        torch.equal(getattr(a, f), getattr(b, f)) for f in ("pivots", "candidates", "labels")
    )


def test_batches_are_deterministic_from_the_seed() -> None:
    a = ContrastiveSampler(20000, 5, seed=7)
    b = ContrastiveSampler(20000, 5, seed=7)
    c = ContrastiveSampler(20000, 5, seed=8)
    first_a, first_b = a.next(), b.next()
    assert _equal(first_a, first_b) and _equal(a.next(), b.next())
    assert not _equal(first_a, c.next())


def test_candidates_follow_the_official_rules() -> None:
    sampler = ContrastiveSampler(20000, 5, candidates=32, batch_size=16, seed=0)
    for _ in range(4):
        batch = sampler.next()
        assert batch.pivots.shape == (16, 1) and batch.candidates.shape == (16, 32, 1)
        assert torch.equal(batch.labels, contrastive_labels(batch.pivots, batch.candidates))
        for pivot, row in zip(batch.pivots[:, 0].tolist(), batch.candidates[..., 0], strict=True):
            values = row.tolist()
            assert len(set(values)) == 32 and pivot not in values  # distinct, never the pivot
            assert all(0 <= v < 20000 for v in values)


def test_the_distributional_window_and_the_mixture_of_branches() -> None:
    sampler = ContrastiveSampler(20000, 5, candidates=32, sample_range=256, seed=1)
    window = [p[0] for p in sampler.distributional(32)]
    assert len(set(window)) == 32 and max(window) - min(window) < 256  # w = max(256, 5 * 32)
    # windowed rows hold 32 candidates within one window before the uniform top-up: count
    # the rows whose first 32 candidates span less than the window (p = 0.6 in the official)
    hits = 0
    for _ in range(10):
        batch = sampler.next()
        spans = batch.candidates[..., 0].amax(1) - batch.candidates[..., 0].amin(1)
        hits += int((spans < 256).sum())
    assert 0.4 < hits / 160 < 0.8


def test_hard_negatives_are_digit_edits_farther_than_the_surviving_uniform_candidates() -> None:
    rng = random.Random(0)
    negatives = hard_negatives(rng, (2819,), 200, 5, 20000, min_square_dist=100.0)
    assert negatives and all(n != (2819,) and 0 <= n[0] < 20000 for n in negatives)
    assert all((n[0] - 2819) ** 2 > 100.0 for n in negatives)
    # at most three edits of four characters: the length moves by at most 3 digits
    assert all(abs(len(str(n[0])) - 4) <= 3 for n in negatives)
    assert {len(str(n[0])) for n in negatives} >= {3, 4, 5}  # deletions, edits, insertions
    two_d = hard_negatives(rng, (28, 19), 50, 3, 141)
    assert two_d and all(len(n) == 2 and all(0 <= v < 1000 for v in n) for n in two_d)


def test_an_epoch_visits_every_position_once_plus_a_top_up() -> None:
    sampler = ContrastiveSampler(40, 2, candidates=8, batch_size=16, seed=3)
    pivots = torch.cat([sampler.next().pivots[:, 0] for _ in range(3)])  # 48 = 40 + 8
    assert sampler.epoch == 0 and set(pivots.tolist()) == set(range(40))
    sampler.next()
    assert sampler.epoch == 1


def test_two_dimensional_positions() -> None:
    sampler = ContrastiveSampler(30, 2, candidates=16, batch_size=4, sample_range=6, data_dim=2)
    batch = sampler.next()
    assert batch.pivots.shape == (4, 2) and batch.candidates.shape == (4, 16, 2)
    assert int(batch.candidates.min()) >= 0 and int(batch.candidates.max()) < 100
    assert torch.equal(batch.labels, contrastive_labels(batch.pivots, batch.candidates))


def test_sampled_batches_train_the_encoder_through_the_loss() -> None:
    torch.manual_seed(0)
    enc = relpos.create("seqpe", num_heads=2, head_dim=8, embed_dim=16, encoder_heads=2, layers=1)
    batch = ContrastiveSampler(20000, 5, candidates=8, batch_size=4, seed=5).next()
    loss = contrastive_loss(enc.encoder, batch.pivots, batch.candidates, batch.labels)
    assert loss == contrastive_loss(enc.encoder, batch.pivots, batch.candidates)
    loss.backward()
    assert enc.encoder.digit.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="labels"):
        contrastive_loss(enc.encoder, batch.pivots, batch.candidates, batch.labels[:2])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_position": 20000, "max_digits": 4}, "max_position"),
        ({"max_position": 1}, "max_position"),
        ({"max_position": 100, "candidates": 0}, "candidates"),
        ({"max_position": 10, "candidates": 9}, "candidates"),
        ({"max_position": 100, "data_dim": 3}, "data_dim"),
        ({"max_position": 100, "batch_size": 0}, "batch_size"),
        ({"max_position": 100, "seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, name: str) -> None:
    with pytest.raises((TypeError, ValueError), match=name):
        ContrastiveSampler(**kwargs)
