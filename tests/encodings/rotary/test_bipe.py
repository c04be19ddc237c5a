"""BiPE-RoPE (``bipe-rope``): reference positions, the encoding, and ``TransformerLM`` driving it
from token ids.

Reference (the official repo zhenyuhe00/BiPE, its own ``get_bilevel_ids``, Llama
separators ``.`` = 869 and newline = 13): ids ``[5, 6, 869, 7, 8, 9, 13, 10]`` -> intra
``[0, 1, 2, 0, 1, 2, 3, 0]``, segment ``[0, 0, 0, 1, 1, 1, 1, 2]``, checked through the
encoding's hook and through the positions a ``TransformerLM`` actually uses (input embedding,
cached key positions).

A hand-written dense model (plain ``rope`` on segment indices + an ``nn.Embedding`` of clipped
intra offsets, positions from a Python loop) is the reference for the model forward; KV-cache
decoding must equal the full forward; the backends must agree.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.attention import chunked
from relpos.nn import TransformerLM
from relpos.registry import encoding_class

SEPS = (3, 7, 11)
VOCAB, DIM, HEADS, DEPTH = 30, 32, 4, 2
HEAD_DIM = DIM // HEADS


def make_model(max_intra: int = 5, **kw) -> TransformerLM:
    torch.manual_seed(0)
    options = {"separators": list(SEPS), "max_intra": max_intra}
    model = TransformerLM(
        VOCAB, DIM, DEPTH, HEADS, encoding="bipe-rope", encoding_options=options, **kw
    )
    with torch.no_grad():  # sharp attention and a visible intra term: positions matter
        for block in model.blocks:
            block.attn.q_proj.weight.normal_(std=0.3)
            block.attn.kv_proj.weight.normal_(std=0.3)
        model.input_encoding.intra.table.normal_()
    return model.eval()


def tokens(batch: int = 2, length: int = 37, seed: int = 0) -> torch.Tensor:
    """Random ids with separators about every 4th token, and one long separator-free run (so
    offsets pass ``max_intra``)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=gen)
    sep = torch.tensor(SEPS)[torch.randint(0, len(SEPS), (batch, length), generator=gen)]
    ids = torch.where(torch.rand(batch, length, generator=gen) < 0.25, sep, ids)
    ids[:, 10:20] = 1  # a segment longer than the table: clipped offsets
    return ids


def loop_positions(ids: torch.Tensor, seps=SEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Intra offsets and segment indices by walking the tokens (independent of relpos)."""
    intra, segment = [], []
    for row in ids.tolist():
        o = s = 0
        ri, rs = [], []
        for t in row:
            ri.append(o)
            rs.append(s)
            o, s = (0, s + 1) if t in seps else (o + 1, s)
        intra.append(ri)
        segment.append(rs)
    return torch.tensor(intra), torch.tensor(segment)


def dense_reference(model: TransformerLM, ids: torch.Tensor, max_intra: int) -> torch.Tensor:
    """The model's forward written out: token embedding + intra table row (clipped offset),
    pre-norm blocks with plain ``rope`` rotated by segment index, dense causal softmax, the
    model's output layer (or its tied embedding)."""
    intra, segment = loop_positions(ids)
    table = model.input_encoding.intra.table
    x = F.embedding(ids, model.embed.weight) + F.embedding(intra.clamp(max=max_intra - 1), table)
    rope = relpos.create("rope", num_heads=HEADS, head_dim=HEAD_DIM)
    B, L = ids.shape
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for block in model.blocks:
        attn = block.attn
        h = F.layer_norm(x, (DIM,), block.norm1.weight, block.norm1.bias)
        q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias)
        k, v = F.linear(h, attn.kv_proj.weight, attn.kv_proj.bias).chunk(2, dim=-1)
        q, k, v = (t.view(B, L, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        q, k = rope.rotate(q, segment, "q"), rope.rotate(k, segment, "k")
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        p = logits.masked_fill(~causal, float("-inf")).softmax(-1)
        out = (p @ v).transpose(1, 2).reshape(B, L, DIM)
        x = x + F.linear(out, attn.out_proj.weight, attn.out_proj.bias)
        h = F.layer_norm(x, (DIM,), block.norm2.weight, block.norm2.bias)
        x = x + block.mlp.fc_out(F.gelu(block.mlp.fc_in(h)))
    x = F.layer_norm(x, (DIM,), model.norm.weight, model.norm.bias)
    if model.head is not None:  # the default: an output layer of its own
        return F.linear(x, model.head.weight)
    return x @ model.embed.weight.t() * model.logit_scale


# ----------------------------------------------------------------------- the encoding
def test_is_rope_on_segments_plus_learned_intra_table():
    enc = relpos.create("bipe-rope", num_heads=HEADS, head_dim=HEAD_DIM, separators=SEPS)
    assert isinstance(enc, encoding_class("rope"))
    assert enc.adds_to_input and enc.has_rotary and enc.relative
    assert enc.max_intra == 1024 and enc.intra.table.shape == (1024, DIM)
    assert enc.max_positions is None  # segment indices are unbounded RoPE positions
    # the attention part is exactly `rope` with the same options
    rope = relpos.create("rope", num_heads=HEADS, head_dim=HEAD_DIM, base=500.0)
    enc = relpos.create("bipe-rope", num_heads=HEADS, head_dim=HEAD_DIM, base=500.0)
    q, k, v = torch.randn(3, 2, HEADS, 9, HEAD_DIM).unbind(0)
    seg = torch.tensor([[0, 0, 1, 1, 1, 2, 3, 3, 3], [0, 1, 1, 1, 1, 1, 2, 2, 4]])
    got = relpos.attention(q, k, v, enc, q_pos=seg, k_pos=seg, causal=True)
    ref = relpos.attention(q, k, v, rope, q_pos=seg, k_pos=seg, causal=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_embed_clips_offsets_and_trains_the_last_row():
    """relpos does not reproduce the reference's frozen zero row 1023 (a pitfall of the official
    code): the
    last row is an ordinary trained row that clipped offsets read."""
    enc = relpos.create("bipe-rope", num_heads=2, head_dim=4, max_intra=4)
    pos = torch.tensor([[0, 1, 2, 3, 4, 9, 1000]])
    out = enc.embed(pos, 8)
    torch.testing.assert_close(out, enc.intra.table[torch.tensor([[0, 1, 2, 3, 3, 3, 3]])])
    assert enc.intra.table[3].abs().sum() > 0
    out.sum().backward()
    assert enc.intra.table.grad[3].abs().sum() > 0


def test_positions_from_tokens_continue_from_a_state():
    enc = relpos.create("bipe-rope", num_heads=2, head_dim=4, separators=SEPS)
    ids = tokens(3, 30)
    whole = enc.positions_from_tokens(ids)
    intra, segment = loop_positions(ids)
    assert torch.equal(whole.input, intra) and torch.equal(whole.attention, segment)
    for cut in (1, 5, 11, 29):
        a = enc.positions_from_tokens(ids[:, :cut])
        b = enc.positions_from_tokens(ids[:, cut:], a.state)
        assert torch.equal(torch.cat((a.input, b.input), 1), whole.input), cut
        assert torch.equal(torch.cat((a.attention, b.attention), 1), whole.attention), cut
        assert torch.equal(b.state, whole.state)
    empty = enc.positions_from_tokens(ids[:, :0], whole.state)
    assert empty.input.shape == (3, 0) and torch.equal(empty.state, whole.state)


# ----------------------------------------------------------------------- the model
@pytest.mark.parametrize("max_intra", [5, 1024], ids=["clipped", "unclipped"])
def test_model_equals_dense_reference(max_intra):
    model = make_model(max_intra)
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids), dense_reference(model, ids, max_intra), rtol=1e-5, atol=1e-5
        )


def test_reference_would_notice_wrong_positions():
    """The dense reference is sensitive to both position sets (the test above can fail)."""
    model = make_model()
    ids = tokens()
    intra, segment = loop_positions(ids)
    with torch.no_grad():
        ref = dense_reference(model, ids, 5)
        wrong_seg = model(ids, pos=(intra, torch.arange(ids.shape[1]).expand_as(ids)))
        wrong_intra = model(ids, pos=(torch.zeros_like(intra), segment))
        right = model(ids, pos=(intra, segment))
    torch.testing.assert_close(right, ref, rtol=1e-5, atol=1e-5)
    assert (wrong_seg - ref).abs().max() > 1e-2  # 1000x the tolerance above
    assert (wrong_intra - ref).abs().max() > 1e-2


@torch.no_grad()
def test_logits_depend_on_segment_differences_only():
    model = make_model()
    ids = tokens()
    intra, segment = loop_positions(ids)
    full = model(ids)
    scale = float(full.abs().max())  # float32 rounding of angles at 5000, relative to logits
    for shift in (1, 17, 5000):
        shifted_out = model(ids, pos=(intra, segment + shift))
        torch.testing.assert_close(shifted_out, full, rtol=0, atol=1e-5 * scale)
    # per batch row shifts too (each row is its own sequence)
    shifted = segment + torch.tensor([[3], [250]])
    torch.testing.assert_close(model(ids, pos=(intra, shifted)), full)
    # inside one segment there is no rotation at all: logits are the plain dot products
    enc = model.input_encoding
    q, k = torch.randn(2, 1, HEADS, 6, HEAD_DIM).unbind(0)
    same = torch.full((1, 6), 4)
    torch.testing.assert_close(
        relpos.scores(q, k, enc, q_pos=same, k_pos=same),
        (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM),
    )


def test_share_encoding_false_keeps_one_module():
    shared, per_layer = make_model(), make_model(share_encoding=False)
    encodings = {id(m) for m in per_layer.modules() if isinstance(m, relpos.Encoding)}
    # the BiPE module (and its intra table, an inner `learned`) exist once
    assert len(encodings) == 2
    assert all(b.attn.encoding is per_layer.input_encoding for b in per_layer.blocks)
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(per_layer(ids), shared(ids), rtol=0, atol=0)


# ----------------------------------------------------------------------- KV cache
def _decode(model, ids, prefill, step):
    cache = model.new_cache()
    parts = [model(ids[:, :prefill], cache=cache)]
    for t in range(prefill, ids.shape[1], step):
        parts.append(model(ids[:, t : t + step], cache=cache))
    return torch.cat(parts, dim=1), cache


@pytest.mark.parametrize("prefill,step", [(1, 1), (6, 1), (4, 5), (9, 3)])
@pytest.mark.parametrize("backend", ["auto", "eager", "chunked"])
@torch.no_grad()
def test_kv_cache_decoding_equals_full_forward(prefill, step, backend):
    model = make_model(backend=backend)
    ids = tokens()
    ids[:, prefill - 1] = SEPS[0]  # the prefill ends a segment: the next token starts one
    full = model(ids)
    out, cache = _decode(model, ids, prefill, step)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    _, segment = loop_positions(ids)
    assert torch.equal(cache.layers[0].k_pos, segment)  # keys cached at segment positions
    ended = torch.isin(ids[:, -1], torch.tensor(SEPS)).long()
    assert torch.equal(cache.position_state[:, 1], segment[:, -1] + ended)


@torch.no_grad()
def test_generate_is_greedy_decoding_of_the_full_forward():
    model = make_model()
    prompt = tokens(2, 7, seed=3)
    out = model.generate(prompt, max_new_tokens=10)
    logits = model(out)
    assert torch.equal(out[:, :7], prompt)
    assert torch.equal(logits[:, 6:-1].argmax(-1), out[:, 7:])


@torch.no_grad()
def test_cache_with_explicit_positions_cannot_continue_from_tokens():
    model = make_model()
    ids = tokens()
    intra, segment = loop_positions(ids)
    cache = model.new_cache()
    model(ids[:, :8], pos=(intra[:, :8], segment[:, :8]), cache=cache)
    with pytest.raises(ValueError, match="explicit positions"):
        model(ids[:, 8:9], cache=cache)
    # explicit positions for every call work, and equal the full forward
    out = model(ids[:, 8:], pos=(intra[:, 8:], segment[:, 8:]), cache=cache)
    torch.testing.assert_close(out, model(ids)[:, 8:], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------- backends
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "auto"])
def test_backends_agree_forward_and_backward(backend, monkeypatch):
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 16 * 37)  # chunked: 3 query blocks
    ids = tokens()
    grads = {}
    outs = {}
    for name in ("eager", backend):
        model = make_model(backend=name).train()
        logits = model(ids)
        F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
        outs[name] = logits.detach()
        grads[name] = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(outs[backend], outs["eager"], rtol=1e-5, atol=1e-5)
    for n, g in grads["eager"].items():
        torch.testing.assert_close(grads[backend][n], g, rtol=1e-4, atol=1e-6, msg=n)
    assert grads["eager"]["input_encoding.intra.table"].abs().sum() > 0


# ----------------------------------------------------------------------- bad input
def test_missing_separators_named_when_positions_come_from_tokens():
    torch.manual_seed(0)
    model = TransformerLM(VOCAB, dim=DIM, depth=1, num_heads=HEADS, encoding="bipe-rope")
    ids = tokens()
    with pytest.raises(ValueError, match="separators"):
        model(ids)
    with pytest.raises(ValueError, match="separators"):
        model.generate(ids[:, :3], 2)
    intra, segment = loop_positions(ids)  # explicit positions need no separators
    assert model(ids, pos=(intra, segment)).shape == (2, ids.shape[1], VOCAB)


# policy (relpos.validation): TypeError for a wrong type, ValueError for a wrong value
@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        (0, ValueError),
        (-3, ValueError),
        (2.5, TypeError),
        ("8", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],  # fmt: skip
    ids=repr,
)
def test_bad_max_intra(bad, exc):
    with pytest.raises(exc, match="max_intra"):
        relpos.create("bipe-rope", num_heads=2, head_dim=4, max_intra=bad)


@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        ([], ValueError),
        (".", TypeError),
        ([1.5], TypeError),
        ([True], TypeError),
        (["."], TypeError),
        ([-1], ValueError),
        (13, TypeError),
        ([torch.tensor([1, 2])], TypeError),
    ],  # fmt: skip
    ids=repr,
)
def test_bad_separators(bad, exc):
    with pytest.raises(exc, match="separators"):
        relpos.create("bipe-rope", num_heads=2, head_dim=4, separators=bad)


def test_separators_are_a_declared_option():
    """The lab fills ``separators`` from its tokenizer because BiPE declares the option (no
    signature sniffing): the declared option is the constructor keyword."""
    cls = relpos.registry.encoding_class("bipe-rope")
    assert "separators" in cls.option_specs


def test_separators_accept_integer_like_ids():
    ids = [torch.tensor(13), 869, *range(1, 3)]
    enc = relpos.create("bipe-rope", num_heads=2, head_dim=4, separators=ids)
    assert enc.separators == (13, 869, 1, 2)


def test_bad_positions_for_the_model_and_embed():
    model = make_model()
    ids = tokens()
    intra, _ = loop_positions(ids)
    with pytest.raises(ValueError, match="pos"):
        model(ids, pos=intra)  # one tensor cannot serve both position sets
    enc = model.input_encoding
    with pytest.raises(TypeError, match="pos"):
        enc.embed(intra.float(), DIM)
    with pytest.raises(ValueError, match="pos"):
        enc.embed(intra - 1, DIM)
    with pytest.raises(ValueError, match="dim"):
        enc.embed(intra, DIM + 1)
    with pytest.raises(ValueError, match="dim"):
        relpos.create("bipe-rope", num_heads=2, head_dim=4, dim=0)
    with pytest.raises(TypeError, match="tokens"):
        enc.positions_from_tokens(ids.float())
    with pytest.raises(ValueError, match="state"):
        enc.positions_from_tokens(ids, torch.zeros(2, 3, dtype=torch.long))


# ----------------------------------------------------------------------- the lab
def test_lab_gives_bipe_the_corpus_separators_and_runs(tmp_path):
    """``relpos extrapolate --encodings bipe-rope``: the lab passes the ids of '.' and newline
    (byte tokens) as separators; a tiny run trains and evaluates."""
    from dataclasses import replace
    from pathlib import Path

    from relpos_lab import extrapolate as ex
    from relpos_lab.training.data import load_corpus
    from relpos_lab.training.profiles import PROFILES

    corpus = load_corpus(Path(__file__).parents[2] / "data" / "sonnets.txt")
    assert ex.segment_separators(corpus) == sorted([ord("."), ord("\n")])
    tiny = replace(
        PROFILES["quick"],
        dim=16,
        depth=1,
        num_heads=2,
        batch_size=4,
        steps=2,
        warmup=1,
        eval_tokens={"nonoverlapping": 64, "sliding": 32},
    )
    assert ex.encoding_options(tiny, "bipe-rope", corpus, 16, 32) == {"separators": [10, 46]}
    assert ex.encoding_options(tiny, "rope", corpus, 16, 32) == {}
    rows = ex.run_extrapolation(
        ["bipe-rope"],
        corpus=corpus,
        out_dir=tmp_path / "run",
        train_len=16,
        eval_mults="1,2",
        profile=tiny,
        progress=False,
        log=lambda s: None,
    )
    assert len(rows) == 4 and all(math.isfinite(r["ppl"]) for r in rows)


# ------------------------------------------------------------ reference positions (get_bilevel_ids)
R16_IDS = [5, 6, 869, 7, 8, 9, 13, 10]
R16_INTRA = [0, 1, 2, 0, 1, 2, 3, 0]
R16_SEGMENT = [0, 0, 0, 1, 1, 1, 1, 2]
LLAMA_SEPARATORS = [869, 13]  # '.' and newline in the Llama tokenizer
TRAIN_SCALE = 1024  # config/bipe_rope.json


def r16_model() -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(
        1000,
        dim=32,
        depth=2,
        num_heads=4,
        encoding="bipe-rope",
        encoding_options={"separators": LLAMA_SEPARATORS},
    )
    with torch.no_grad():  # sharp attention: the rotary positions change the output
        for block in model.blocks:
            block.attn.q_proj.weight.normal_(std=0.3)
            block.attn.kv_proj.weight.normal_(std=0.3)
    return model.eval()


def test_r16_positions_from_the_hook():
    enc = relpos.create("bipe-rope", num_heads=4, head_dim=8, separators=LLAMA_SEPARATORS)
    got = enc.positions_from_tokens(torch.tensor([R16_IDS]))
    assert got.input.tolist() == [R16_INTRA]
    assert got.attention.tolist() == [R16_SEGMENT]
    # the next token would continue segment 2 at offset 1 (10 is not a separator)
    assert got.state.tolist() == [[1, 2]]


def test_r16_defaults_match_the_reference_config():
    enc = relpos.create("bipe-rope", num_heads=12, head_dim=64, separators=LLAMA_SEPARATORS)
    assert enc.max_intra == TRAIN_SCALE and enc.intra.table.shape == (TRAIN_SCALE, 768)
    assert enc.base == 10000.0 and enc.layout == "half"  # HF Llama rotate_half
    # offsets clip at train_scale - 1 = 1023 ...
    rows = enc.embed(torch.tensor([[1022, 1023, 1024, 5000]]), 768)
    torch.testing.assert_close(rows[0, 2:], enc.intra.table[1023].expand(2, 768))
    # ... and, unlike the reference (padding_idx = -1 zeroes and freezes row 1023), relpos keeps
    # row 1023 an ordinary learned row (the documented decision, unlike the official code)
    assert enc.intra.table[1023].abs().sum() > 0 and enc.intra.table.requires_grad


@torch.no_grad()
def test_r16_through_the_model_forward():
    """The model's input is token embedding + intra row R16_INTRA, and its attention uses the
    R16_SEGMENT positions: equal to passing them explicitly, unlike plain arange positions."""
    model = r16_model()
    ids = torch.tensor([R16_IDS])
    seen = {}

    def keep_input(module, args) -> None:
        seen["x"] = args[0]

    hook = model.blocks[0].register_forward_pre_hook(keep_input)
    logits = model(ids)
    hook.remove()
    table = model.input_encoding.intra.table
    expected = model.embed.weight[ids] + table[torch.tensor([R16_INTRA])]
    torch.testing.assert_close(seen["x"], expected, rtol=0, atol=0)
    explicit = model(ids, pos=(torch.tensor([R16_INTRA]), torch.tensor([R16_SEGMENT])))
    torch.testing.assert_close(logits, explicit, rtol=0, atol=0)
    arange = torch.arange(8)[None]
    wrong = model(ids, pos=(torch.tensor([R16_INTRA]), arange))
    assert (wrong - logits).abs().max() > 1e-3


@torch.no_grad()
def test_r16_through_kv_cache_decoding():
    """Token by token, the cache ends up with keys at the reference segment positions and the
    logits equal the full forward (the reference code forbids a cache; relpos continues the
    positions from the cached prefix)."""
    model = r16_model()
    ids = torch.tensor([R16_IDS])
    cache = model.new_cache()
    steps = [model(ids[:, t : t + 1], cache=cache) for t in range(len(R16_IDS))]
    assert cache.layers[0].k_pos.tolist() == [R16_SEGMENT]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids), rtol=1e-5, atol=1e-5)
