"""Conformance: capability flags tell the truth, checked against behaviour.

Flags are instance attributes (options can change them). Each test below derives what the
flag claims from what the encoding *does* through the public API (``relpos.scores``,
``relpos.attention``, ``rotate_qk``, ``embed``), so a flag that lies fails here: the README
table (``relpos list``) and the backends read the same flags.
"""

from __future__ import annotations

import functools

import pytest
import torch

import relpos
from relpos.attention import supported_backends

from .common import (
    B,
    D,
    H,
    attention,
    in_table,
    lift_positions,
    make_encoding,
    merge_groups,
    rotary_state,
    rotate,
    rotate_qk,
    rotation_groups,
    scores,
)

LQ = LK = 20


def _qkv(seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=gen, dtype=dtype) for n in (LQ, LK, LK))


def _enc(name):
    """The conformance instance in float64, every learnable parameter moved off its
    initial value (an identity-initialised multiplier would hide its own flag)."""
    enc = make_encoding(name).double()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in enc.parameters():
            if p.requires_grad and p.is_floating_point():
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return enc


def test_not_relative_means_some_shift_changes_the_scores(name):
    enc = _enc(name)
    if enc.relative:
        pytest.skip("relative: covered by test_shift")
    q, k, _ = _qkv()
    base = torch.arange(LK)
    if enc.adds_to_input:  # absolute: the positions act through the input embedding
        moved = in_table(enc, base + 7)
        assert not torch.allclose(enc.embed(base[None], H * D), enc.embed(moved[None], H * D))
        return
    changed = False
    ran = False
    for shift in (1, 7, 37, 1000, 100_000):
        pos = base + shift
        if enc.max_positions is not None and int(pos.max()) >= enc.max_positions:
            pos = in_table(enc, pos)
        try:
            ref = scores(q, k, enc, q_pos=base, k_pos=base)
            moved = scores(q, k, enc, q_pos=pos, k_pos=pos)
        except (ValueError, IndexError):
            continue  # positions that index a per-call structure (graph node ids)
        ran = True
        finite = torch.isfinite(ref) & torch.isfinite(moved)
        if (ref.isinf() != moved.isinf()).any() or not torch.allclose(
            ref[finite], moved[finite], rtol=1e-9, atol=1e-9
        ):
            changed = True
            break
    if not ran:
        pytest.skip("positions cannot be shifted (they index per-call inputs)")
    assert changed, f"{name} says relative=False, but no shift changed its scores"


def test_no_rotary_means_rotate_is_the_identity(name):
    enc = _enc(name)
    q, k, _ = _qkv()
    qp = lift_positions(enc, in_table(enc, torch.arange(LQ)))[None] if enc.dims == 1 else None
    kp = qp
    if enc.dims != 1:
        qp = kp = lift_positions(enc, in_table(enc, torch.arange(LK)))
    qr, kr = rotate_qk(enc, q, k, qp, kp)
    same = torch.equal(qr, q) and torch.equal(kr, k)
    assert same != enc.has_rotary, f"{name}: has_rotary={enc.has_rotary} but rotate_qk " + (
        "is the identity" if same else "changes q or k"
    )


def test_needs_probabilities_matches_what_sdpa_and_flex_accept(name):
    enc = make_encoding(name)
    allowed = supported_backends(enc)
    assert ("sdpa" in allowed) == (not enc.needs_probabilities)
    assert ("flex" in allowed) == (not enc.needs_probabilities)
    if enc.needs_probabilities:
        q, k, v = _qkv(dtype=torch.float32)
        with pytest.raises(ValueError, match="sdpa"):
            attention(q, k, v, enc, backend="sdpa")


def test_value_term_and_multiplier_flags_match_the_output(name):
    """Without a value term or multiplied weights the output is ``softmax(scores) @ v``."""
    enc = _enc(name)
    q, k, v = _qkv()
    causal = enc.causal_only
    pos = lift_positions(enc, in_table(enc, torch.arange(LK)))
    pos = pos[None] if enc.dims == 1 else pos
    # explicit positions: the rotations of v and o below must read the scores' positions
    # (m-D defaults are the diagonal, not the lifted ones)
    # v: selections that read it (LongHeads)
    logits = scores(q, k, enc, q_pos=pos[:, LK - LQ :], k_pos=pos, v=v)
    if causal and not enc.own_causal_mask:  # an own causal mask is in the scores already
        logits = logits.masked_fill(torch.ones(LQ, LK, dtype=torch.bool).triu(1), -torch.inf)
    # rotations of values and outputs (RoVE, camera frames) are part of the rotary hook, not
    # a value term
    weights = torch.softmax(logits, dim=-1)
    plain = merge_groups(
        [
            (rows, rotate(enc, weights @ rotate(enc, v, pos, "v", st), pos[:, LK - LQ :], "o", st))
            for rows, st in rotation_groups(enc, pos[:, LK - LQ :], pos, B, LQ, LK)
        ]
    )
    out = attention(
        q, k, v, enc, q_pos=pos[:, LK - LQ :], k_pos=pos, backend="eager", causal=causal
    )
    changes = enc.has_value_term or enc.multiplies_probs
    same = torch.allclose(out, plain, rtol=1e-9, atol=1e-9)
    assert same != changes, (
        f"{name}: has_value_term={enc.has_value_term}, multiplies_probs="
        f"{enc.multiplies_probs}, but the output "
        + ("is" if same else "is not")
        + " softmax(scores) @ v"
    )


def test_no_bias_means_the_logits_are_the_rotated_dot_products(name):
    enc = _enc(name)
    if enc.piecewise:
        pytest.skip("piecewise logits (checked by the schedules' own references)")
    q, k, _ = _qkv()
    kp = lift_positions(enc, in_table(enc, torch.arange(LK)))
    qp = kp[..., LK - LQ :, :] if enc.dims != 1 else kp[LK - LQ :]
    if enc.dims == 1:
        qp, kp = qp[None], kp[None]
    logits = scores(q, k, enc, q_pos=qp, k_pos=kp)
    parts = []
    for rows, st in rotation_groups(enc, qp, kp, B, LQ, LK):
        qr, kr = enc.rotate_qk(q, k, qp, kp) if st is None else enc.rotate_qk(q, k, qp, kp, st)
        parts.append((rows, qr @ kr.transpose(-1, -2) * enc.default_scale(D)))
    plain = merge_groups(parts)
    same = torch.allclose(logits, plain, rtol=1e-9, atol=1e-9)
    assert same != enc.has_bias, (
        f"{name}: has_bias={enc.has_bias} but the logits "
        + ("are" if same else "are not")
        + " the rotated dot products"
    )


def test_distance_only_bias_is_its_distance_table(name):
    enc = _enc(name)
    if not enc.distance_only:
        pytest.skip("not distance-only")
    assert enc.relative, "a distance-only bias is relative"
    gen = torch.Generator().manual_seed(1)
    pos = torch.randint(0, 50, (B, LK), generator=gen).sort(dim=1).values
    pos = in_table(enc, pos)
    zeros = torch.zeros(B, H, LK, D, dtype=torch.float64)
    bias = scores(zeros, zeros, enc, q_pos=pos, k_pos=pos)
    dist = pos[:, :, None] - pos[:, None, :]
    lo, hi = int(dist.min()), int(dist.max())
    table = enc.distance_table(lo, hi, torch.device("cpu")).double()
    expected = table[:, dist - lo].permute(1, 0, 2, 3)
    torch.testing.assert_close(bias, expected, rtol=1e-6, atol=1e-6)


def test_cached_rotated_keys_do_not_depend_on_the_other_positions(name):
    enc = _enc(name)
    if not enc.has_rotary or not enc.cache_rotated_keys:
        pytest.skip("keys are not cached after rotation")
    q, k, _ = _qkv()
    kp = lift_positions(enc, in_table(enc, torch.arange(LK)))
    if enc.dims == 1:
        kp = kp[None]
    n = LK // 2
    _, full = rotate_qk(enc, q, k, kp, kp)
    _, prefix = rotate_qk(enc, q[:, :, :n], k[:, :, :n], kp[:, :n], kp[:, :n])
    torch.testing.assert_close(full[:, :, :n], prefix, rtol=1e-12, atol=1e-12)


def test_mixes_tokens_matches_whether_a_rotation_reads_later_tokens(name):
    """``mixes_tokens``: changing the last token's q and k changes the rotation of earlier
    tokens (a graph transport); without the flag earlier tokens keep their rotation (so a
    KV cache and single-query calls are exact)."""
    enc = _enc(name)
    if not enc.has_rotary or enc.piecewise:
        pytest.skip("no rotation (or piecewise: rotated per piece)")
    q, k, _ = _qkv()
    pos = lift_positions(enc, in_table(enc, torch.arange(LK)))
    pos = pos[None] if enc.dims == 1 else pos
    q2, k2 = q.clone(), k.clone()
    q2[:, :, -1] += 1.0
    k2[:, :, -1] += 1.0
    qa, ka = rotate_qk(enc, q, k, pos, pos)
    qb, kb = rotate_qk(enc, q2, k2, pos, pos)
    same = torch.equal(qa[:, :, :-1], qb[:, :, :-1]) and torch.equal(ka[:, :, :-1], kb[:, :, :-1])
    assert same != enc.mixes_tokens, f"{name}: mixes_tokens={enc.mixes_tokens} but earlier " + (
        "tokens keep their rotation" if same else "tokens' rotations change"
    )


def test_mixes_tokens_refuses_a_kv_cache_by_name(name):
    enc = make_encoding(name)
    if not enc.mixes_tokens:
        pytest.skip("rotations read their own token (KV cache: test_kv_cache)")
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="cache"):
        attention(q, k, v, enc, cache=relpos.nn.LayerCache())


def test_rotates_values_matches_whether_values_and_outputs_change(name):
    """``rotates_values``: ``rotate`` changes values ("v") and outputs ("o")."""
    enc = _enc(name)
    _, _, v = _qkv()
    pos = lift_positions(enc, in_table(enc, torch.arange(LK)))
    pos = pos[None] if enc.dims == 1 else pos
    state = rotary_state(enc, pos, pos, B, LK, LK)
    same_v = torch.equal(rotate(enc, v, pos, "v", state), v)
    same_o = torch.equal(rotate(enc, v, pos, "o", state), v)
    assert same_v == same_o, f"{name}: rotates values but not outputs (or the reverse)"
    assert same_v != enc.rotates_values, (
        f"{name}: rotates_values={enc.rotates_values} but rotate(v) "
        + ("is the identity" if same_v else "changes v")
    )


def test_continuous_flag_matches_whether_float_positions_are_accepted(name):
    enc = make_encoding(name)
    q, k, v = _qkv(dtype=torch.float32)
    pos = torch.arange(LK, dtype=torch.float32) * 0.75
    if enc.continuous:
        out = attention(q, k, v, enc, q_pos=pos, k_pos=pos, causal=enc.causal_only)
        assert torch.isfinite(out).all()
    else:
        with pytest.raises((TypeError, ValueError), match="pos"):
            attention(q, k, v, enc, q_pos=pos, k_pos=pos)


def test_adds_to_input_matches_embed(name):
    enc = make_encoding(name)
    pos = in_table(enc, torch.arange(LK))[None]
    if enc.adds_to_input:
        assert enc.embed(pos, H * D).shape[-1] == H * D
    else:
        with pytest.raises(RuntimeError):
            enc.embed(pos, H * D)


@functools.cache
def _listing_rows() -> tuple[dict, ...]:
    """``relpos list``'s rows, built once per worker (they build every encoding)."""
    from relpos_lab.cli import encoding_rows

    return tuple(encoding_rows())


def test_relpos_list_reports_instance_flags(name):
    """``relpos list`` (and so the README table) shows the flags of a default instance."""
    from relpos_lab.cli import LIST_HEAD_DIM, LIST_HEADS

    enc = relpos.create(name, num_heads=LIST_HEADS, head_dim=LIST_HEAD_DIM)
    (row,) = [r for r in _listing_rows() if r["name"] == name]
    assert row["family"] == enc.family
    assert row["relative"] == ("yes" if enc.relative else "no")
    hooks = row["hooks"].split(", ")
    assert ("value" in hooks) == enc.has_value_term
    assert ("rotate" in hooks) == enc.has_rotary
    assert ("bias" in hooks) == enc.has_bias
