"""Conformance 3: causal decoding with a KV cache equals the full forward.

At the model level (``relpos.nn.TransformerLM``: prefill, then token by token or in chunks)
and at the attention level (one query at position ``t`` against keys ``0..t`` is row ``t`` of
the full causal attention). ``generate`` runs and is greedy decoding of the full forward.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import supported_backends
from relpos.registry import encoding_class

from .common import (
    B,
    D,
    H,
    assert_close_rel,
    attention,
    in_table,
    increasing_positions,
    make_encoding,
    table_holds,
)

VOCAB, DIM, DEPTH, LENGTH = 50, 32, 2, 24


def make_lm(name: str, **kw) -> relpos.nn.TransformerLM:
    torch.manual_seed(0)
    options = encoding_class(name).example_options()  # short-test sizes (see common.py)
    return relpos.nn.TransformerLM(
        VOCAB, dim=DIM, depth=DEPTH, num_heads=4, encoding=name, encoding_options=options, **kw
    ).eval()


def tokens(length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, length), generator=torch.Generator().manual_seed(seed))


def decode(model, toks: torch.Tensor, prefill: int, step: int) -> torch.Tensor:
    cache = model.new_cache()
    parts = [model(toks[:, :prefill], cache=cache)]
    for t in range(prefill, toks.shape[1], step):
        parts.append(model(toks[:, t : t + step], cache=cache))
    assert cache.length == toks.shape[1]
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize(
    "prefill,step,options",
    [
        (1, 1, {}),
        pytest.param(13, 1, {}, marks=pytest.mark.slow),  # tok-by-tok after a longer prefill
        (5, 7, {}),  # several queries per call: bottom-right causal alignment with a cache
        (9, 3, {"num_kv_heads": 2, "share_encoding": False}),
        (9, 3, {"backend": "chunked"}),
        pytest.param(9, 4, {"backend": "eager"}, marks=pytest.mark.slow),  # (fast-suite time)
    ],
    ids=["tok-by-tok", "prefill13", "chunks7", "gqa-unshared", "chunked", "eager-chunks4"],
)
@torch.no_grad()
def test_kv_cache_decoding_equals_full_forward(name, prefill, step, options):
    if make_encoding(name).required_inputs or make_encoding(name).needs_inputs:
        pytest.skip("per-call inputs (graphs, boxes): not a decoder-LM encoding")
    if not table_holds(make_encoding(name), LENGTH):
        pytest.skip("the learned table holds fewer positions than the test sequence")
    if options.get("backend") not in (None, *supported_backends(make_encoding(name))):
        pytest.skip("backend cannot run this encoding")
    model = make_lm(name, **options)
    toks = tokens()
    full = model(toks)
    assert torch.isfinite(full).all()
    assert_close_rel(decode(model, toks, prefill, step), full)


@pytest.mark.parametrize("backend", ["auto", "eager", "sdpa", "chunked"])
@pytest.mark.parametrize("kind", ["arange", "batch"])
@torch.no_grad()
def test_single_query_equals_row_of_full_causal_attention(name, backend, kind):
    enc = make_encoding(name)
    if backend not in ("auto", *supported_backends(enc)):
        pytest.skip("backend cannot run this encoding")
    if enc.own_causal_mask:
        pytest.skip("its own causal mask lets a row read later keys (PINE's documents)")
    if enc.mixes_tokens:
        pytest.skip("its rotation reads the other tokens of the call (a graph transport): one "
                    "query alone is another call, and a KV cache is refused by name")  # fmt: skip
    if enc.reads_past_queries:
        pytest.skip("reads earlier tokens' queries: one query alone is another call (its cache "
                    "keeps them: the model-level test above)")  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, LENGTH, D, generator=gen)
    k = torch.randn(B, H // 2, LENGTH, D, generator=gen)
    v = torch.randn(B, H // 2, LENGTH, D, generator=gen)
    if kind == "arange":
        pos = torch.arange(LENGTH)[None].expand(B, LENGTH)
    else:
        limit = enc.max_positions if enc.max_positions is not None else 1 << 20
        pos = increasing_positions(B, LENGTH, gen, limit)
    pos = in_table(enc, pos)
    full = attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=True, backend="eager")
    for t in (0, 1, 17, LENGTH - 1):
        one = attention(
            q[:, :, t : t + 1],
            k[:, :, : t + 1],
            v[:, :, : t + 1],
            enc,
            q_pos=pos[:, t : t + 1],
            k_pos=pos[:, : t + 1],
            causal=True,
            backend=backend,
        )
        assert_close_rel(one, full[:, :, t : t + 1], msg=f"query {t}")
    # default positions: the single query is the last key's position
    t = LENGTH - 1
    if kind == "arange" and enc.dims == 1:  # (m-D defaults are the diagonal, not lifted)
        one = attention(q[:, :, t:], k, v, enc, causal=True, backend=backend)
        assert_close_rel(one, full[:, :, t:], msg="default q_pos for Lq=1")


@torch.no_grad()
def test_generate_runs_and_is_greedy(name):
    if make_encoding(name).required_inputs or make_encoding(name).needs_inputs:
        pytest.skip("per-call inputs (graphs, boxes): not a decoder-LM encoding")
    if not table_holds(make_encoding(name), 14):
        pytest.skip("the learned table holds fewer positions than the test sequence")
    model = make_lm(name)
    prompt = tokens(6, seed=1)
    out = model.generate(prompt, max_new_tokens=8)
    assert out.shape == (B, 14) and out.dtype == prompt.dtype
    assert torch.equal(out[:, :6], prompt)
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB
    # each new token is the argmax of the full forward over what precedes it
    logits = model(out)
    assert torch.equal(logits[:, 5:-1].argmax(-1), out[:, 6:])
