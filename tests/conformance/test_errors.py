"""Conformance 5: bad input raises ``ValueError``/``TypeError`` whose message names the argument,
never a silent broadcast or an ``IndexError`` from deep inside."""

from __future__ import annotations

import re

import pytest
import torch

import relpos

from .common import (
    ENCODINGS,
    B,
    D,
    H,
    attention,
    lift_positions,
    make_encoding,
    rotate_qk,
    scores,
)

L = 12
CALLS = ["attention", "scores"]


def _qkv(lq: int = L, lk: int = L, hq: int = H, hkv: int = H, dq: int = D, dk: int = D):
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(B, hq, lq, dq, generator=gen),
        torch.randn(B, hkv, lk, dk, generator=gen),
        torch.randn(B, hkv, lk, dk, generator=gen),
    )


def _call(which: str, enc, q, k, v, **kw):
    if which == "scores":
        kw.pop("mask", None)
        return scores(q, k, enc, **kw)
    kw.setdefault("causal", True)
    return attention(q, k, v, enc, **kw)


@pytest.fixture
def enc(name):
    return make_encoding(name)


@pytest.mark.parametrize("which", CALLS)
def test_wrong_rank_of_q(enc, which):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"\bq\b"):
        _call(which, enc, q[0], k, v)
    with pytest.raises(ValueError, match=r"\bk\b"):
        _call(which, enc, q, k[None], v)


@pytest.mark.parametrize("which", CALLS)
def test_mismatched_head_dim(enc, which):
    q, k, v = _qkv(dk=D // 2)
    with pytest.raises(ValueError, match="head_dim"):
        _call(which, enc, q, k, v)


@pytest.mark.parametrize("which", CALLS)
def test_head_count_must_match_encoding(enc, which):
    q, k, v = _qkv(hq=2 * H, hkv=2 * H)
    with pytest.raises(ValueError, match="num_heads"):
        _call(which, enc, q, k, v)


@pytest.mark.parametrize("which", CALLS)
def test_kv_heads_must_divide_q_heads(enc, which):
    q, k, v = _qkv(hkv=3)
    with pytest.raises(ValueError, match="head count"):
        _call(which, enc, q, k, v)


def test_k_and_v_must_agree(enc):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"\bv\b"):
        attention(q, k, v[:, :, :-1], enc, causal=True)


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
def test_positions_of_wrong_length(enc, which, arg):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=arg):
        _call(which, enc, q, k, v, **{arg: torch.arange(L + 1)})
    with pytest.raises(ValueError, match=arg):  # (B, L) with the wrong L
        _call(which, enc, q, k, v, **{arg: torch.arange(L - 1)[None].expand(B, -1)})


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
def test_positions_of_wrong_batch(enc, which, arg):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=arg):
        _call(which, enc, q, k, v, **{arg: torch.arange(L)[None].expand(B + 1, -1)})


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
def test_positions_of_wrong_rank(enc, which, arg):
    q, k, v = _qkv()
    bad = [
        torch.arange(L).reshape(1, 1, 1, L),  # 4-D
        torch.tensor(3),  # 0-D
        torch.arange(L)[None, :, None].expand(B, L, enc.dims + 1),  # too many position axes
    ]
    for pos in bad:
        with pytest.raises(ValueError, match=arg):
            _call(which, enc, q, k, v, **{arg: pos})


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
def test_positions_of_wrong_dtype(enc, which, arg):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=arg):
        _call(which, enc, q, k, v, **{arg: torch.ones(L, dtype=torch.bool)})
    with pytest.raises(TypeError, match=arg):
        _call(which, enc, q, k, v, **{arg: list(range(L))})
    if not enc.continuous:
        with pytest.raises(TypeError, match=rf"{arg}.*(integer|dtype)"):
            _call(which, enc, q, k, v, **{arg: torch.arange(L, dtype=torch.float32)})


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_infinite_positions_are_refused_by_name(enc, which, arg, bad):
    if not enc.continuous:
        pytest.skip("integer positions only: a float tensor is refused by dtype")
    q, k, v = _qkv()
    pos = torch.arange(L, dtype=torch.float32)
    pos[L // 2] = bad
    with pytest.raises(ValueError, match=rf"{arg} must be finite, got a position of"):
        _call(which, enc, q, k, v, **{arg: lift_positions(enc, pos)})


def test_mask_of_wrong_shape(enc):
    q, k, v = _qkv()
    for mask in (
        torch.ones(B, 1, 1, L + 1, dtype=torch.bool),
        torch.ones(B + 1, 1, 1, L, dtype=torch.bool),
        torch.ones(1, 1, 1, 1, L, dtype=torch.bool),
    ):
        with pytest.raises(ValueError, match="mask"):
            attention(q, k, v, enc, causal=True, mask=mask)
    with pytest.raises(TypeError, match="mask"):
        attention(q, k, v, enc, causal=True, mask=torch.ones(B, 1, 1, L, dtype=torch.int64))


def test_bad_qkv_types(enc):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"\bq\b"):
        attention(q.numpy(), k, v, enc, causal=True)
    with pytest.raises(TypeError, match=r"\bq\b"):
        attention(q.long(), k, v, enc, causal=True)
    with pytest.raises(TypeError, match="dtype"):
        attention(q.double(), k, v, enc, causal=True)
    with pytest.raises(TypeError, match="causal"):
        attention(q, k, v, enc, causal=1)
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, enc, causal=True, scale=-1.0)


def test_unknown_backend(enc):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="backend"):
        attention(q, k, v, enc, causal=True, backend="flash-attn-9")


def test_encoding_of_wrong_type():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="encoding"):
        attention(q, k, v, "rope", causal=True)


def test_unknown_encoding_name_says_what_was_meant():
    with pytest.raises(ValueError, match="no-such-encoding.*relpos.available") as err:
        relpos.create("no-such-encoding", num_heads=H, head_dim=D)
    assert "did you mean" not in str(err.value)  # nothing is close: no guess
    assert ENCODINGS[0] not in str(err.value).split(";", 1)[1]  # no list of all names
    for wrong, meant in [
        ("RoPE", "'rope'"),
        ("ALiBi", "'alibi'"),
        ("kerple_log", "'kerple-log'"),
        ("MViT2", "'mvitv2'"),  # an alias of a renamed encoding, in another case
        ("alibbi", "'alibi'"),
        ("yarn", 'create("rope", ..., scaling={"rope_type": "yarn"'),
        ("Llama3", '"rope_type": "llama3", "factor": ...'),
    ]:
        with pytest.raises(ValueError, match=f"did you mean .*{re.escape(meant)}"):
            relpos.create(wrong, num_heads=H, head_dim=D)
    with pytest.raises(TypeError):
        relpos.create(None, num_heads=H, head_dim=D)


def test_unknown_option_is_named(name):
    with pytest.raises(TypeError, match="not_an_option"):
        relpos.create(name, num_heads=H, head_dim=D, not_an_option=1)


@pytest.mark.parametrize("arg", ["num_heads", "head_dim"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True, None], ids=repr)
def test_bad_sizes(name, arg, bad):
    sizes = {"num_heads": H, "head_dim": D, arg: bad}
    with pytest.raises((ValueError, TypeError), match=arg):
        relpos.create(name, **sizes)


def test_rotary_needs_even_head_dim(name):
    enc = make_encoding(name)
    if not enc.has_rotary:
        pytest.skip("not rotary")
    x = torch.randn(1, H, 4, D, generator=torch.Generator().manual_seed(0))
    pos = lift_positions(enc, torch.arange(4))
    pos = pos[None] if enc.dims == 1 else pos
    qr, _ = rotate_qk(enc, x, x, pos, pos)  # (with the example inputs' rotation state)
    if qr.shape[-1] != D:
        pytest.skip("appends channels to q and k (SeqPE): no rotation pairs")
    if torch.equal(qr, rotate_qk(enc, 2 * x, x, pos, pos)[0]):
        pytest.skip("replaces q and k by position vectors (positional attention): no pairs")
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create(name, num_heads=H, head_dim=D + 1)


@pytest.mark.parametrize("which", CALLS)
@pytest.mark.parametrize("arg", ["q_pos", "k_pos"])
def test_positions_past_learned_table(enc, which, arg):
    if enc.max_positions is None:
        pytest.skip("no learned position table")
    q, k, v = _qkv()
    top = enc.max_positions
    pos = {"q_pos": torch.arange(L), "k_pos": torch.arange(L)}
    pos[arg] = torch.arange(top - L // 2, top + L - L // 2)  # crosses the end of the table
    with pytest.raises(ValueError, match="max_positions"):
        _call(which, enc, q, k, v, **pos)
    pos[arg] = torch.arange(-1, L - 1)  # negative positions
    with pytest.raises(ValueError, match="max_positions"):
        _call(which, enc, q, k, v, **pos)


def test_embed_past_learned_table(enc):
    if enc.max_positions is None or not enc.adds_to_input:
        pytest.skip("no learned input table")
    with pytest.raises(ValueError, match="max_positions"):
        enc.embed(torch.arange(enc.max_positions, enc.max_positions + 2)[None], H * D)


def test_model_past_learned_table(name):
    enc = make_encoding(name)
    if enc.max_positions is None:
        pytest.skip("no learned position table")
    options = type(enc).example_options()  # (the options that sized enc.max_positions)
    model = relpos.nn.TransformerLM(
        50, dim=H * D, depth=1, num_heads=H, encoding=name, encoding_options=options
    )
    toks = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="max_positions"):
        pos = torch.arange(enc.max_positions - 2, enc.max_positions + 2)[None]
        model(toks, pos=lift_positions(enc, pos))


def test_nan_positions_in_a_layer_are_refused_by_name():
    attn = relpos.nn.MultiHeadAttention(16, 2, encoding="rope")
    with pytest.raises(ValueError, match="must be finite, got a position of nan"):
        attn(torch.randn(1, 3, 16), pos=torch.tensor([0.0, float("nan"), 2.0]))
