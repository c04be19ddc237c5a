"""Phase sensitivity of chunked KV compression (the sanity kernel of ``kv_phase``)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos_lab.analysis.kv_phase import phase_scores, phase_sensitivity

ROPE = relpos.create("rope", num_heads=1, head_dim=64)


@pytest.mark.parametrize(
    ("stride", "phase", "expected"),
    [
        (4, 0.0, [1, 0.966151, 0.884496, 0.799595]),
        (4, 1.5, [0.928733, 0.991193, 0.991193, 0.928733]),
        (8, 0.0, [1, 0.966151, 0.884496, 0.799595, 0.747949, 0.734499, 0.736231, 0.72701]),
    ],
)
def test_spec_reference_kernel(stride, phase, expected):
    s = phase_scores(ROPE, stride, phase)[0]
    assert torch.allclose(s, torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_closed_form_and_pooling_after_rope_is_flat():
    theta = 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    phi = torch.arange(4, dtype=torch.float64)
    closed = torch.cos((phi[:, None] - 0.7) * theta).mean(-1)
    assert torch.allclose(phase_scores(ROPE, 4, 0.7)[0], closed, atol=1e-12)
    assert torch.equal(
        phase_scores(ROPE, 4, 0.7, pool="after")[0], torch.ones(4, dtype=torch.float64)
    )


def test_gap_and_refusals():
    r = phase_sensitivity(ROPE, 4, 0.0)
    assert r.phase_gap[0] == pytest.approx(1 - 0.799595, abs=1e-6)
    with pytest.raises(ValueError, match="'alibi' is not one"):
        phase_scores(relpos.create("alibi", num_heads=1, head_dim=8), 4)
    with pytest.raises(ValueError, match="pool must be"):
        phase_scores(ROPE, 4, pool="during")
