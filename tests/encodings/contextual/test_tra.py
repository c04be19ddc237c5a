"""TRA (Opper et al. 2025, threshold relative attention) against the authors' notebook (the
MOSS workshop submission ``TRA_FFL.ipynb``, class ``TRA``): logits and outputs against a float64
re-statement of their formula (ReLU threshold, inclusive flip-cumsum count, a forget gate read
from the layer input, empty rows zeroed), the layer input filled by ``relpos.nn``, KV-cache
decoding; then the options beyond it (per-head gates, the own-key rule, the gate relaxations)
on hand-computed rows, and the backends."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.attention import chunked
from relpos.nn import MultiHeadAttention, TransformerLM


def authors_tra(q, k, v, x, weight, bias, scale):
    """The authors' attention, restated (float64, causal): ``S = relu(q k^T * scale)`` with
    future keys removed, kept = ``S > 0``, ``D_ij = delta_i * #kept keys t >= j`` with ``delta =
    log sigmoid(x W^T + b)``, logits ``S + D`` on kept keys, softmax, rows without a kept key
    0. Returns ``(logits, out)``; removed pairs have logit ``-inf``."""
    L = q.shape[2]
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(future, -1e11)
    kept = F.relu(s) > 0
    delta = F.logsigmoid(x @ weight.t() + bias).transpose(1, 2)[..., None]  # (B, H, L, 1)
    count = kept.double().flip(-1).cumsum(-1).flip(-1)
    logits = torch.where(kept, s + delta * count, -math.inf)
    dead = ~kept.any(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return logits, weights @ v


def _authors_problem(seed: int = 0, L: int = 9, H: int = 2, D: int = 4):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, L, D, generator=gen, dtype=torch.float64) for _ in range(3))
    x = torch.randn(2, L, H * D, generator=gen, dtype=torch.float64)
    torch.manual_seed(seed)
    enc = relpos.create("tra", num_heads=H, head_dim=D).double()
    return enc, q, k, v, x


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_outputs_and_logits_equal_the_authors_formula(backend, monkeypatch):
    monkeypatch.setattr(chunked, "FORWARD_BLOCK", 4)  # the chunked ladder walks key blocks
    enc, q, k, v, x = _authors_problem()
    w, b = enc.forget_proj.weight, enc.forget_proj.bias
    logits, want = authors_tra(q, k, v, x, w, b, 0.5)
    inputs = {"layer_input": x}
    out = relpos.attention(q, k, v, enc, causal=True, backend=backend, inputs=inputs)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    # the last query sees every key: its logits are the authors' logits, not only its weights
    got = relpos.scores(q, k, enc, inputs=inputs)[:, :, -1]
    torch.testing.assert_close(got, logits[:, :, -1], rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    params = [enc.forget_proj.weight, enc.forget_proj.bias]
    for a, r in zip(
        torch.autograd.grad((out * g).sum(), params),
        torch.autograd.grad((want * g).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def test_rows_without_a_kept_key_give_zero_with_zero_gradients():
    enc, q, k, v, x = _authors_problem(seed=1)
    k = -q.clone()  # every own score is negative; the first query has only its own key
    q.requires_grad_(True)
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend,
                               inputs={"layer_input": x})  # fmt: skip
        assert (out[:, :, 0] == 0).all()
        (grad,) = torch.autograd.grad(out[:, :, 0].sum(), q)
        assert (grad == 0).all()


def test_the_layer_fills_its_own_input_and_decoding_equals_the_full_forward():
    torch.manual_seed(2)
    layer = MultiHeadAttention(8, 2, "tra", backend="eager").double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    B, L = 2, 6
    q = layer.q_proj(x).view(B, L, 2, 4).transpose(1, 2)
    k, v = layer.kv_proj(x).chunk(2, dim=-1)
    k, v = (t.view(B, L, 2, 4).transpose(1, 2) for t in (k, v))
    want = relpos.attention(q, k, v, layer.encoding, causal=True, inputs={"layer_input": x})
    want = layer.out_proj(want.transpose(1, 2).reshape(B, L, 8))
    torch.testing.assert_close(layer(x), want)
    model = TransformerLM(40, dim=16, depth=2, num_heads=2, encoding="tra").double()
    tokens = torch.randint(0, 40, (2, 8))
    full = model(tokens)
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache=cache)]
    steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_the_layer_input_is_checked_by_name():
    enc = relpos.create("tra", num_heads=2, head_dim=4)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="layer_input"):
        relpos.scores(q, q, enc)
    with pytest.raises(ValueError, match=r"inputs\['layer_input'\].*\(B, 3, 8\)"):
        relpos.scores(q, q, enc, inputs={"layer_input": torch.randn(1, 3, 7)})
    with pytest.raises(TypeError, match="layer_input"):
        relpos.scores(q, q, enc, inputs={"layer_input": torch.ones(1, 3, 8, dtype=torch.long)})
    with pytest.raises(ValueError, match="forget"):
        enc.decay()


# ------------------------------------------------------------- options beyond the authors
def last_row(scores_row: list[float], **options) -> tuple[torch.Tensor, float]:
    """Logits of the last query of a one-head call whose content logits on that row are
    ``scores_row`` (``q = 1``, ``k_j = s_j``, scale 1), and the head's decay lambda."""
    n = len(scores_row)
    options = {"forget": "head", **options}
    enc = relpos.create("tra", num_heads=1, head_dim=1, **options).double()
    q = torch.ones(1, 1, n, 1, dtype=torch.float64)
    k = torch.tensor(scores_row, dtype=torch.float64).view(1, 1, n, 1)
    return relpos.scores(q, k, enc, scale=1.0)[0, 0, -1].detach(), float(enc.decay().detach()[0])


def test_thresholded_keys_leave_and_the_distance_counts_kept_keys_only():
    row, lam = last_row([2.0, -1.0, 3.0, 0.5])
    # kept [1, 0, 1, 1]; kept keys from j to the query: c = [3, 2, 2, 1]
    expected = torch.tensor([2 - 3 * lam, -math.inf, 3 - 2 * lam, 0.5 - lam], dtype=torch.float64)
    torch.testing.assert_close(row, expected)
    row, lam = last_row([2.0, -1.0, 3.0, 0.5], threshold=2.5)
    # kept [0, 0, 1, 0]: only key 2, c = 1
    expected = torch.tensor([-math.inf, -math.inf, 3 - lam, -math.inf], dtype=torch.float64)
    torch.testing.assert_close(row, expected)
    row, lam = last_row([2.0, -1.0, 3.0, 0.5], threshold=2.5, keep_own=True)
    # kept [0, 0, 1, own]: c = [2, 2, 2, 1]
    expected = torch.tensor([-math.inf, -math.inf, 3 - 2 * lam, 0.5 - lam], dtype=torch.float64)
    torch.testing.assert_close(row, expected)


def test_forget_gate_starts_at_the_alibi_slopes():
    enc = relpos.create("tra", num_heads=8, head_dim=4, forget="head")
    slopes = torch.tensor([2.0 ** (-(h + 1)) for h in range(8)])
    torch.testing.assert_close(enc.decay(), slopes)
    torch.testing.assert_close(-F.logsigmoid(enc.forget), slopes)


def test_weights_decay_with_the_number_of_kept_keys_between():
    """``p_ij / p_ik = exp(s_ij - s_ik) * sigmoid(f) ** (c_ij - c_ik)`` for kept keys."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 10, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    enc = relpos.create("tra", num_heads=1, head_dim=4, forget="head").double()
    with torch.no_grad():
        enc.forget.fill_(0.3)
    s = (q @ k.transpose(-1, -2) / 2.0)[0, 0, -1]
    kept = s > 0
    count = kept.flip(0).cumsum(0).flip(0)
    logits = torch.where(kept, s + count * math.log(torch.sigmoid(torch.tensor(0.3))), -math.inf)
    weights = torch.softmax(logits, 0)
    out = relpos.attention(q, k, v, enc, causal=True)[0, 0, -1]
    torch.testing.assert_close(out, weights @ v[0, 0])


def test_the_own_key_is_always_kept():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 7, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 4, generator=gen, dtype=torch.float64)
    enc = relpos.create(
        "tra", num_heads=2, head_dim=4, threshold=1e9, keep_own=True, forget="head"
    ).double()
    # no score passes the threshold: each query attends to its own key only
    out = relpos.attention(q, q, v, enc, causal=True)
    torch.testing.assert_close(out, v)
    # a row whose own key is masked has no key left: 0, like any dead row
    mask = ~torch.eye(7, dtype=torch.bool)
    out = relpos.attention(q, q, v, enc, mask=mask)
    assert (out == 0).all()


def _problem(seed=0, dtype=torch.float64, **options):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, 12, 4, generator=gen, dtype=dtype) for _ in range(3))
    options = {"forget": "head", **options}
    return relpos.create("tra", num_heads=2, head_dim=4, **options).to(dtype), q, k, v


def _grads(enc, q, k, v, backend="eager", causal=True):
    q, k = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    out = relpos.attention(q, k, v, enc, causal=causal, backend=backend)
    return out, torch.autograd.grad(out.square().sum(), (q, k, enc.forget))


def test_straight_through_has_the_hard_forward_and_a_count_gradient():
    hard, q, k, v = _problem()
    st, *_ = _problem(gate="straight-through")
    out_hard, g_hard = _grads(hard, q, k, v)
    out_st, g_st = _grads(st, q, k, v)
    torch.testing.assert_close(out_st, out_hard)
    torch.testing.assert_close(g_st[2], g_hard[2])  # the decay's gradient is the same
    assert not torch.allclose(g_st[0], g_hard[0])  # q also learns through the count


def test_soft_gates_are_the_sigmoid_relaxation():
    enc, q, k, v = _problem(gate="soft", threshold=0.2, temperature=0.5)
    s = q @ k.transpose(-1, -2) / 2.0
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    g = torch.sigmoid((s - 0.2) / 0.5) * causal
    count = g.flip(-1).cumsum(-1).flip(-1)
    lam = enc.decay().detach()[None, :, None, None]
    log_g = F.logsigmoid((s - 0.2) / 0.5)
    logits = (s + log_g - lam * count).masked_fill(~causal, -math.inf)
    expected = torch.softmax(logits, -1) @ v
    torch.testing.assert_close(relpos.attention(q, k, v, enc, causal=True), expected)


@pytest.mark.parametrize("gate", ["hard", "straight-through", "soft"])
def test_chunked_key_blocks_match_eager_forward_and_backward(gate, monkeypatch):
    monkeypatch.setattr(chunked, "FORWARD_BLOCK", 5)
    enc, q, k, v = _problem(seed=3, gate=gate)
    for causal in (True, False):
        out, grads = _grads(enc, q, k, v, "eager", causal)
        out_c, grads_c = _grads(enc, q, k, v, "chunked", causal)
        torch.testing.assert_close(out_c, out)
        for a, b in zip(grads_c, grads, strict=True):
            torch.testing.assert_close(a, b)


def test_keep_decisions_are_taken_on_float64_scores():
    """With a threshold between a float32 score and its float64 value, the float64 value
    decides (so backends whose float32 matmuls round differently keep the same keys)."""
    enc, q, k, v = _problem(dtype=torch.float32)
    s32 = (q @ k.transpose(-1, -2) * 0.5)[0, 0]
    s64 = (q.double() @ k.double().transpose(-1, -2) * 0.5)[0, 0]
    differ = (s32.double() != s64).nonzero()
    i, j = (int(t) for t in differ[differ[:, 0] > differ[:, 1]][0])  # a visible, non-own key
    enc.threshold = (float(s32[i, j]) + float(s64[i, j])) / 2
    logits = relpos.scores(q, k, enc)[0, 0, i, j]
    assert bool(torch.isinf(logits)) == (float(s64[i, j]) <= enc.threshold)


def test_options_are_checked_by_name():
    with pytest.raises(ValueError, match="gate"):
        relpos.create("tra", num_heads=2, head_dim=4, gate="sometimes")
    with pytest.raises(ValueError, match="temperature"):
        relpos.create("tra", num_heads=2, head_dim=4, temperature=0.0)
    with pytest.raises(ValueError, match="forget"):
        relpos.create("tra", num_heads=2, head_dim=4, forget="query")


def test_the_task_models_run_tra_with_their_own_layer_input():
    from relpos_lab.tasks.models import TaskEncoder, check_encoding_for_tasks

    check_encoding_for_tasks("tra", "random", causal=False)  # the layer input is not "per-call"
    torch.manual_seed(0)
    model = TaskEncoder(2, 2, dim=16, depth=1, num_heads=2, encoding="tra", dropout=0.0)
    out = model(torch.randint(0, 2, (3, 6)), 6)
    assert out.shape == (3, 6, 2) and bool(torch.isfinite(out).all())
