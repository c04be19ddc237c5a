"""``relpos.attention.plan``: which backend and which path a call takes, with the arguments of
``relpos.attention``; the rules ``auto`` applies by capability (no encoding names)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import BACKENDS, api, plan
from relpos.nn import LayerCache

H, D = 4, 32


def qkv(batch: int, length: int, grad: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, H, length, D, generator=g).requires_grad_(grad) for _ in range(3)
    )


def test_plan_is_public_under_relpos_attention():
    assert relpos.attention.plan is plan


def test_auto_trains_fire_on_chunked_at_the_lab_training_size():
    """The lab's training size (batch 16 x L 128 x 4 heads, gradients on): FIRE's bias is a
    per-distance table while its queries lie below the threshold, and its parameters train,
    so ``auto`` takes the chunked Toeplitz path (the lab no longer names FIRE)."""
    enc = relpos.create("fire", num_heads=H, head_dim=D)
    q, k, v = qkv(16, 128, grad=True)
    assert plan(q, k, v, enc, causal=True) == ("chunked", "toeplitz")
    with torch.no_grad():  # evaluation: the dense bias is fastest at this size
        assert plan(q, k, v, enc, causal=True) == ("sdpa", "dense-bias")


def test_auto_rule_is_a_capability_not_a_name():
    q, k, v = qkv(16, 128, grad=True)
    learned = relpos.create("t5", num_heads=H, head_dim=D)
    assert plan(q, k, v, learned, causal=True) == ("chunked", "toeplitz")
    fixed = relpos.create("kerple-log", num_heads=H, head_dim=D).requires_grad_(False)
    assert plan(q, k, v, fixed, causal=True) == ("sdpa", "dense-bias")  # nothing to train
    alibi = relpos.create("alibi", num_heads=H, head_dim=D)  # folds exactly: any size
    assert plan(q, k, v, alibi, causal=True) == ("fold", "fold-sdpa")
    frozen = relpos.create("fire", num_heads=H, head_dim=D).requires_grad_(False)
    assert plan(q, k, v, frozen, causal=True) == ("sdpa", "dense-bias")
    # no per-distance table for batch positions: the dense bias stays
    pos = torch.arange(128).repeat(16, 1)
    pos[1] += 3
    assert plan(q, k, v, learned, q_pos=pos, k_pos=pos, causal=True) == ("sdpa", "dense-bias")


@pytest.mark.parametrize(
    ("name", "options", "length", "expected"),
    [
        ("rope", {}, 64, ("sdpa", "fused")),
        ("alibi", {}, 64, ("sdpa", "dense-bias")),  # the bias is smaller than the fold's copies
        ("alibi", {}, 1100, ("chunked", "toeplitz")),  # inference on CPU: Toeplitz tiles
        ("kerple-log", {}, 64, ("sdpa", "dense-bias")),
        ("kerple-log", {}, 1100, ("chunked", "toeplitz")),
        ("shaw", {}, 64, ("eager", "dense")),
        ("shaw", {}, 1100, ("chunked", "probabilities")),
        ("dca", {"pretraining_length": 16}, 1100, ("chunked", "piecewise-sdpa")),
        ("cope", {}, 64, ("eager", "dense")),
        ("cope", {}, 1100, ("chunked", "row-suffix")),
    ],
)
def test_plan_names_the_path(name, options, length, expected):
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    q, k, v = qkv(1, length)
    with torch.no_grad():
        assert plan(q, k, v, enc, causal=True) == expected


@pytest.mark.parametrize("options", [{}, {"bidirectional": True}])
def test_auto_folds_alibi_for_a_training_step_on_cpu(options):
    """The fold wins a training step on CPU and loses the forward alone (docs/benchmarks.md):
    ``auto`` folds when gradients flow into q, k or v, and keeps the Toeplitz tiles otherwise."""
    enc = relpos.create("alibi", num_heads=H, head_dim=D, **options)
    q, k, v = qkv(1, 1100, grad=True)
    assert plan(q, k, v, enc, causal=True) == ("fold", "fold-sdpa")  # causal: one line
    with torch.no_grad():
        assert plan(q, k, v, enc, causal=True) == ("chunked", "toeplitz")
    frozen = [t.detach() for t in (q, k, v)]
    assert plan(*frozen, enc, causal=True) == ("chunked", "toeplitz")


def test_plan_with_an_explicit_backend_and_a_mask():
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    q, k, v = qkv(1, 64)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    assert plan(q, k, v, enc, backend="chunked") == ("chunked", "toeplitz")
    assert plan(q, k, v, enc, mask=mask, backend="chunked") == ("chunked", "tile")
    assert plan(q, k, v, enc, backend="flex") == ("flex", "score-mod")
    assert plan(q, k, v, enc, backend="eager") == ("eager", "dense")
    with pytest.raises(ValueError, match="backend"):
        plan(q, k, v, enc, backend="fast")
    with pytest.raises(ValueError, match="cannot run encoding"):
        plan(q, k, v, relpos.create("shaw", num_heads=H, head_dim=D), backend="sdpa")


def test_plan_is_what_attention_runs(monkeypatch):
    ran: list[str] = []
    for backend, fn in list(BACKENDS.items()):

        def record(call, backend=backend, fn=fn):
            ran.append(backend)
            return fn(call)

        monkeypatch.setitem(api.BACKENDS, backend, record)
    q, k, v = qkv(16, 128, grad=True)
    for name in ("fire", "alibi", "rope", "shaw"):
        enc = relpos.create(name, num_heads=H, head_dim=D)
        expected, _ = plan(q, k, v, enc, causal=True)
        relpos.attention(q, k, v, enc, causal=True)
        assert ran[-1] == expected, name


def test_plan_leaves_a_kv_cache_unchanged():
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    q, k, v = qkv(1, 8)
    cache = LayerCache()
    relpos.attention(q, k, v, enc, causal=True, cache=cache)
    before = (cache.k.clone(), cache.length)
    assert plan(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc, causal=True, cache=cache)[0] == "sdpa"
    assert cache.length == before[1] and torch.equal(cache.k, before[0])
