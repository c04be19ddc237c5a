"""GateLoop (arXiv 2311.01927): recurrent == chunked == surrogate attention, stable in log space,
decoding with a state, gradients; reference values computed independently in float64 from the
recurrence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relpos.nn.mixers.gateloop import gateloop_scan
from relpos.nn.mixers.recurrence import decayed_recurrence

MODES = ("recurrent", "chunked", "attention")


def spec_case():
    rng = np.random.default_rng(1)
    q, k, v = (torch.tensor(rng.standard_normal((5, 2))) for _ in range(3))
    amplitude = torch.sigmoid(torch.tensor(rng.standard_normal((5, 2))))
    phase = torch.relu(torch.tensor(rng.standard_normal((5, 2))))
    return tuple(t[None, None] for t in (q, k, v, amplitude, phase))


def naive(q, k, v, amplitude, phase, *, first=1):
    """y_i = Σ_{j≤i} Σ_d q_id k_jd Π_{l=j+first}^{i} a_ld v_j, by explicit products (complex128)."""
    a = (amplitude.double() * torch.exp(1j * phase.double())).to(torch.complex128)
    B, H, L, _ = q.shape
    y = torch.zeros(B, H, L, v.shape[-1], dtype=torch.complex128)
    for i in range(L):
        for j in range(i + 1):
            prod = torch.ones_like(a[:, :, 0])
            for l in range(j + first, i + 1):
                prod = prod * a[:, :, l]
            w = (q[:, :, i].double() * k[:, :, j].double() * prod).sum(-1)
            y[:, :, i] += w[..., None] * v[:, :, j].double()
    return y


def random_case(B=2, H=2, L=11, Dk=3, Dv=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(B, H, L, Dk, generator=g, dtype=dtype),
        torch.randn(B, H, L, Dk, generator=g, dtype=dtype),
    )
    v = torch.randn(B, H, L, Dv, generator=g, dtype=dtype)
    amplitude = torch.sigmoid(torch.randn(B, H, L, Dk, generator=g, dtype=dtype))
    phase = torch.relu(torch.randn(B, H, L, Dk, generator=g, dtype=dtype))
    return q, k, v, amplitude, phase


@pytest.mark.parametrize("mode", MODES)
def test_spec_reference_values_in_every_mode(mode):
    y = gateloop_scan(*spec_case(), mode=mode, chunk_size=2)
    expected = [0.003737, -0.126505, -0.04529, 0.1415, -0.168176, -0.210026]
    assert torch.allclose(y.flatten()[:6], torch.tensor(expected, dtype=y.dtype), atol=1e-6)


def test_log_space_surrogate_attention_equals_recurrence_to_rounding():
    case = spec_case()
    rec = gateloop_scan(*case, mode="recurrent", output="complex")
    att = gateloop_scan(*case, mode="attention", output="complex")
    assert (rec - att).abs().max() < 1e-15


def test_off_by_one_product_is_caught():
    case = spec_case()
    right, wrong = naive(*case), naive(*case, first=0)
    assert torch.allclose(
        gateloop_scan(*case, mode="chunked", chunk_size=3), right.real, atol=1e-14
    )
    assert (right.real - wrong.real).abs().max() > 0.18


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_every_mode_matches_the_naive_product(mode, chunk_size):
    case = random_case()
    y = gateloop_scan(*case, mode=mode, chunk_size=chunk_size, output="complex")
    assert torch.allclose(y, naive(*case), atol=1e-12)


def test_long_decay_is_stable_where_cumprod_underflows():
    L = 1100  # 0.5^1100 = 0 in float64: the notebook's cumprod form gives 0 * inf
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, L, 1, generator=g, dtype=torch.float64) for _ in range(3))
    amplitude = torch.full((1, 1, L, 1), 0.5, dtype=torch.float64)
    phase = torch.full((1, 1, L, 1), 0.3, dtype=torch.float64)
    a = amplitude * torch.exp(1j * phase)
    cum = torch.cumprod(a, dim=2)
    unstable = ((q * cum) @ (k / cum).transpose(-1, -2)).tril() @ v.to(cum.dtype)
    assert not torch.isfinite(unstable).all()
    ys = [gateloop_scan(q, k, v, amplitude, phase, mode=m, chunk_size=32) for m in MODES]
    assert all(torch.isfinite(y).all() for y in ys)
    assert torch.allclose(ys[0], ys[1], atol=1e-10) and torch.allclose(ys[0], ys[2], atol=1e-10)


def test_retnet_special_case_constant_real_decay():
    q, k, v, _, _ = random_case(L=9)
    gamma = 0.8
    y = gateloop_scan(q, k, v, torch.tensor(gamma, dtype=q.dtype), None)
    i = torch.arange(9)
    decay = torch.where(i[:, None] >= i[None], gamma ** (i[:, None] - i[None]).double(), 0.0)
    assert torch.allclose(y, ((q @ k.transpose(-1, -2)) * decay) @ v, atol=1e-12)


def test_unit_amplitude_constant_phase_is_a_relative_rotation():
    q, k, v, _, _ = random_case(L=8, Dk=2)
    omega = torch.tensor([0.7, 0.05], dtype=q.dtype)
    y = gateloop_scan(q, k, v, torch.ones(()), omega.expand(q.shape))
    i = torch.arange(8).double()
    dist = (i[:, None] - i[None])[..., None]  # (L, L, 1)
    w = (q[:, :, :, None] * k[:, :, None] * torch.cos(dist * omega)).sum(-1)
    assert torch.allclose(y, (w * (dist[..., 0] >= 0)) @ v, atol=1e-12)


def test_strong_gates_take_the_log_space_path_and_stay_exact():
    # chunks whose total decay exceeds the factoring limit (60 in float32) use pairwise
    # exponents; the others the factored matmul; both agree with float64
    q, k, v, amplitude, phase = random_case(L=40, dtype=torch.float64)
    amplitude[:, :, 8:16] = 1e-12  # log 1e-12 = -27.6 per token: chunks of 8 reach -221
    ref = gateloop_scan(q, k, v, amplitude, phase, mode="attention")
    args = (t.float() for t in (q, k, v, amplitude, phase))
    for chunk_size in (8, 64):
        y = gateloop_scan(*args, chunk_size=chunk_size)
        assert torch.allclose(y.double(), ref, atol=2e-5)
        args = (t.float() for t in (q, k, v, amplitude, phase))


def test_exact_zero_gate_gives_no_nan():
    q, k, v, amplitude, phase = random_case(L=10)
    amplitude[:, :, 3] = 0.0
    ys = [gateloop_scan(q, k, v, amplitude, phase, mode=m, chunk_size=4) for m in MODES]
    assert torch.allclose(ys[0], ys[1], atol=1e-12) and torch.allclose(ys[0], ys[2], atol=1e-12)


@pytest.mark.parametrize("mode", ["chunked", "attention"])
def test_decoding_one_token_at_a_time_equals_the_full_forward(mode):
    q, k, v, amplitude, phase = random_case(L=12)
    full = gateloop_scan(q, k, v, amplitude, phase, mode=mode, chunk_size=4)
    y, state = gateloop_scan(
        q[:, :, :5],
        k[:, :, :5],
        v[:, :, :5],
        amplitude[:, :, :5],
        phase[:, :, :5],
        mode=mode,
        chunk_size=4,
        return_state=True,
    )
    outs = [y]
    for t in range(5, 12):
        s = slice(t, t + 1)
        y, state = gateloop_scan(
            q[:, :, s],
            k[:, :, s],
            v[:, :, s],
            amplitude[:, :, s],
            phase[:, :, s],
            mode="recurrent",
            state=state,
            return_state=True,
        )
        outs.append(y)
    assert state.shape == (2, 2, 3, 2) and state.is_complex()
    assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-12)


def test_prefill_state_in_every_mode_is_the_same():
    case = random_case(L=7)
    states = [gateloop_scan(*case, mode=m, chunk_size=3, return_state=True)[1] for m in MODES]
    assert torch.allclose(states[0], states[1], atol=1e-12)
    assert torch.allclose(states[0], states[2], atol=1e-12)


def test_gradients_match_across_modes_and_gradcheck():
    case = [t.requires_grad_() for t in random_case(B=1, H=1, L=6, Dk=2, Dv=2)]
    torch.autograd.gradcheck(
        lambda *a: gateloop_scan(*a, mode="chunked", chunk_size=4), case, fast_mode=True
    )
    grads = []
    for mode in MODES:
        grads.append(torch.autograd.grad(gateloop_scan(*case, mode=mode).square().sum(), case))
    for other in grads[1:]:
        assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads[0], other, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_activation_dtypes(dtype):
    case = random_case(L=9, dtype=torch.float32)
    ref = gateloop_scan(*case)
    y = gateloop_scan(*(t.to(dtype) for t in case))
    assert y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 0.1
    assert torch.allclose(y.float(), ref, atol=tol)


def test_empty_sequence():
    q, k, v, amplitude, phase = random_case(L=0)
    y, state = gateloop_scan(q, k, v, amplitude, phase, return_state=True)
    assert y.shape == (2, 2, 0, 2) and not state.abs().any()


def test_bad_inputs_name_the_argument():
    q, k, v, amplitude, phase = random_case(L=4)
    with pytest.raises(ValueError, match="amplitude must lie in"):
        gateloop_scan(q, k, v, amplitude + 1, phase)
    with pytest.raises(ValueError, match="exactly one"):
        gateloop_scan(q, k, v, amplitude, phase, log_amplitude=amplitude.log())
    with pytest.raises(ValueError, match="mode must be"):
        gateloop_scan(q, k, v, amplitude, phase, mode="scan")
    with pytest.raises(ValueError, match="phase must be broadcastable"):
        gateloop_scan(q, k, v, amplitude, phase[..., :2])
    with pytest.raises(ValueError, match="state must have shape"):
        gateloop_scan(
            q, k, v, amplitude, phase, state=torch.zeros(2, 2, 3, 3, dtype=torch.complex128)
        )
    with pytest.raises(ValueError, match="chunk_size must be"):
        gateloop_scan(q, k, v, amplitude, phase, chunk_size=0)
    with pytest.raises(ValueError, match="real part"):
        decayed_recurrence(q, k, v, torch.ones_like(q))


def test_chunk_groups_carry_the_state(monkeypatch):
    from relpos.nn.mixers import recurrence

    case = random_case(L=19)
    whole = gateloop_scan(*case, chunk_size=4)
    monkeypatch.setattr(recurrence, "_GROUP_BUDGET", 1)  # one chunk per group
    assert torch.allclose(gateloop_scan(*case, chunk_size=4), whole, atol=1e-12)
    assert torch.allclose(whole, naive(*case).real, atol=1e-12)


@pytest.mark.slow  # torch.compile of the chunked scans (minutes on a loaded CPU)
def test_torch_compile_gives_the_eager_result():
    from relpos.nn.mixers.lightnet import lightnet_scan

    q, k, v, amplitude, phase = random_case(L=40, dtype=torch.float32)
    gl = torch.compile(lambda *a: gateloop_scan(*a, chunk_size=16))
    assert torch.allclose(
        gl(q, k, v, amplitude, phase), gateloop_scan(q, k, v, amplitude, phase, chunk_size=16)
    )
    ln = torch.compile(lambda *a: lightnet_scan(*a, chunk_size=16))
    assert torch.allclose(ln(q, k, v), lightnet_scan(q, k, v, chunk_size=16))
