"""Location / bi-relative cross-attention (Ray Chowdhury & Caragea 2023, arXiv 2305.20019):
reference values worked out from the official code (JRC1995/MonotonicLocationAttention) and
the mixing rules."""

from __future__ import annotations

import math

import pytest
import torch

from relpos.nn import DirectionMix, LocationAttention, reverse_align
from relpos.nn.location import step_size


def test_spec_reverse_align_flips_within_the_length_and_zeroes_the_padding():
    a, b, c = 1.0, 2.0, 3.0
    states = torch.tensor([[[a], [b], [c], [9.0], [9.0]]])
    out = reverse_align(states, torch.tensor([3]))
    assert out[0, :, 0].tolist() == [c, b, a, 0.0, 0.0]


def test_direction_mix_gate_interpolates_between_the_states_and_their_reverse():
    mix = DirectionMix(4)
    states = torch.randn(2, 5, 3)
    lengths = torch.tensor([5, 3])
    with torch.no_grad():
        mix.gate.weight.zero_()
        mix.gate.bias.fill_(10.0)  # g = sigmoid(50) = 1
    torch.testing.assert_close(mix(states, lengths, torch.randn(2, 4)), states)
    with torch.no_grad():
        mix.gate.bias.fill_(-10.0)  # g = 0
    torch.testing.assert_close(
        mix(states, lengths, torch.randn(2, 4)), reverse_align(states, lengths)
    )


def _fixed(step="onestep", rho=0.2, mix=False):
    """A layer whose q^pos . w_rho = rho and q^pos . w_sigma = 0 for any h."""
    layer = LocationAttention(3, 2, step=step, mix=mix)
    with torch.no_grad():
        layer.query.weight.zero_()
        layer.query.bias.copy_(torch.tensor([1.0, 1.0]))
        layer.w_rho.copy_(torch.tensor([rho, 0.0]))
        layer.w_sigma.copy_(torch.tensor([-1.0, 0.0]))  # relu(-1) = 0: sigma = 0.27 / len
    return layer


def test_spec_onestep_values():
    """len 5, rho 0.2: step 0.731059, mu 0.182765, sigma 0.054, p_loc [0.007017, 0.992983, 0..]."""
    layer = _fixed()
    p, mu = layer(torch.zeros(1, 3), torch.tensor([5]), size=5)
    assert math.isclose(float(step_size(torch.tensor(0.2), "onestep")), 0.731059, abs_tol=1e-6)
    torch.testing.assert_close(
        p[0], torch.tensor([0.007017, 0.992983, 0.0, 0.0, 0.0]), atol=1e-6, rtol=0
    )
    # the carried centre is the weights' mean location (not mu_t itself)
    assert math.isclose(float(mu.detach()), 0.992983 * 0.25, rel_tol=1e-5)


def test_spec_softstair_values():
    steps = step_size(torch.tensor([1.3, 1.6]), "softstair")
    torch.testing.assert_close(steps, torch.tensor([1.017986, 1.880797]), atol=1e-6, rtol=0)


def test_monotonic_step_starts_as_relu():
    rho = torch.tensor([-0.5, 0.3, 2.0])
    out = step_size(rho, "monotonic", torch.tensor(20.0))
    torch.testing.assert_close(out, torch.relu(rho), atol=1e-8, rtol=0)


def test_mix_combines_location_and_content_and_masks_padding():
    layer = _fixed(mix=True)
    with torch.no_grad():
        layer.gate.weight.zero_()
        layer.gate.bias.zero_()  # m = 1/2
    content = torch.randn(1, 6)
    p, _ = layer(torch.zeros(1, 3), torch.tensor([5]), content=content)
    loc, _ = _fixed()(torch.zeros(1, 3), torch.tensor([5]), size=6)
    soft = torch.cat([torch.softmax(content[:, :5], -1), torch.zeros(1, 1)], 1)
    torch.testing.assert_close(p, 0.5 * loc + 0.5 * soft)
    assert float(p[0, 5]) == 0.0 and math.isclose(float(p.detach().sum()), 1.0, rel_tol=1e-6)


def test_centres_move_monotonically_over_steps():
    layer = _fixed(rho=0.5, mix=False)
    mu, centres = None, []
    for _ in range(4):
        p, mu = layer(torch.zeros(1, 3), torch.tensor([9]), mu, size=9)
        centres.append(float((p[0].detach() * torch.arange(9)).sum()))
    assert centres == sorted(centres) and centres[-1] > centres[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [({"step": "jump"}, "step must be one of"), ({"carry": "both"}, "carry must be")],
)
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocationAttention(3, 2, **kwargs)


def test_bad_lengths_are_refused_by_name():
    with pytest.raises(ValueError, match="lengths must be integers"):
        reverse_align(torch.randn(1, 3, 2), torch.tensor([4]))
