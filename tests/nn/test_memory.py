"""``relpos.nn.SegmentRecurrence``: Transformer-XL's segment-level recurrence over a KV cache.

* with a memory at least as long as the stream, segment-by-segment evaluation equals the full
  causal forward (any encoding, uneven segments);
* with a shorter memory, a one-layer model's segment output equals a fresh forward over the
  window ``[start - M, end)`` (the memory really is the last M tokens);
* gradients stop at the memory: a segment's gradients equal those of a run whose earlier
  segments were computed without autograd, and differ from an attached cache's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.nn import SegmentRecurrence

VOCAB, DIM, HEADS = 50, 32, 4


def make_lm(encoding: str, depth: int = 2, **kw) -> relpos.nn.TransformerLM:
    torch.manual_seed(0)
    return relpos.nn.TransformerLM(
        VOCAB, dim=DIM, depth=depth, num_heads=HEADS, encoding=encoding, **kw
    )


def tokens(length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.detach().abs().max()))


@pytest.mark.parametrize("encoding", ["transformer-xl", "deberta", "rope", "alibi"])
@pytest.mark.parametrize("segment", [7, 40])
@torch.no_grad()
def test_full_memory_segments_equal_the_full_causal_forward(encoding: str, segment: int) -> None:
    model = make_lm(encoding).eval()
    toks = tokens(40)
    rec = SegmentRecurrence(model, memory_length=40)
    close(rec.run(toks, segment), model(toks))
    assert rec.memory_size == 40 and rec.position == 40


@pytest.mark.parametrize("encoding", ["transformer-xl", "rope"])
@torch.no_grad()
def test_short_memory_attends_to_the_last_m_tokens(encoding: str) -> None:
    model = make_lm(encoding, depth=1).eval()  # one layer: keys depend on the tokens only
    toks = tokens(40)
    memory, segment = 9, 6
    rec = SegmentRecurrence(model, memory_length=memory)
    for start in range(0, 40, segment):
        end = min(start + segment, 40)
        got = rec.step(toks[:, start:end])
        first = max(0, start - memory)
        window = model(toks[:, first:end], pos=torch.arange(first, end)[None])
        close(got, window[:, start - first :])
        assert rec.memory_size == min(memory, end)
    # the window really is shorter than the stream: the full forward differs at the end
    assert (model(toks)[:, -got.shape[1] :] - got).abs().max() > 1e-4


@torch.no_grad()
def test_zero_memory_makes_segments_independent() -> None:
    model = make_lm("transformer-xl").eval()
    toks = tokens(20)
    rec = SegmentRecurrence(model, memory_length=0)
    out = rec.run(toks, 8)
    for start in (0, 8, 16):
        close(out[:, start : start + 8], model(toks[:, start : start + 8]))
    assert rec.memory_size == 0


def _loss(logits: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), toks[:, 1:].reshape(-1))


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_gradients_do_not_flow_into_the_memory() -> None:
    model = make_lm("transformer-xl")
    toks = tokens(24)
    first, second = toks[:, :12], toks[:, 12:]

    rec = SegmentRecurrence(model, memory_length=12)
    rec.step(first)  # with autograd on: its graph must not be reachable from the memory
    for layer in rec.cache.layers:
        assert not layer.k.requires_grad and not layer.v.requires_grad
        assert layer.k.grad_fn is None and layer.v.grad_fn is None
    model.zero_grad()
    _loss(rec.step(second), second).backward()
    detached = _grads(model)

    ref = SegmentRecurrence(model, memory_length=12)
    with torch.no_grad():
        ref.step(first)
    model.zero_grad()
    _loss(ref.step(second), second).backward()
    for a, b in zip(detached, _grads(model), strict=True):
        close(a, b)

    # without the stop-gradient (a plain attached cache) the gradients differ
    cache = model.new_cache()
    model(first, torch.arange(12)[None], cache)
    model.zero_grad()
    _loss(model(second, torch.arange(12, 24)[None], cache), second).backward()
    attached = _grads(model)
    assert max(float((a - b).abs().max()) for a, b in zip(detached, attached, strict=True)) > 1e-6


def test_reset_restarts_positions_and_memory() -> None:
    model = make_lm("rope").eval()
    rec = SegmentRecurrence(model, memory_length=5)
    with torch.no_grad():
        a = rec.step(tokens(6))
        rec.reset()
        assert rec.position == 0 and rec.memory_size == 0
        close(rec.step(tokens(6)), a)


def test_bad_arguments_are_named() -> None:
    model = make_lm("rope")
    with pytest.raises(ValueError, match="memory_length"):
        SegmentRecurrence(model, memory_length=-1)
    with pytest.raises(TypeError, match="memory_length"):
        SegmentRecurrence(model, memory_length=2.5)
    with pytest.raises(TypeError, match="new_cache"):
        SegmentRecurrence(torch.nn.Linear(2, 2), memory_length=4)
    rec = SegmentRecurrence(model, memory_length=4)
    with pytest.raises(ValueError, match="segment_length"):
        rec.run(tokens(8), 0)
    with pytest.raises(ValueError, match="tokens"):
        rec.step(tokens(8)[0])
