"""iRPE (Wu et al. 2021; microsoft/Cream iRPE) against values of the official
``piecewise_index`` and against a dense O(L^2 D) reference written here from the official code.

* pinned values: ``g`` at ratio 1.9 on -20..20 and at ratio 20 (euc), the bucket
  counts of the released DeiT configurations, a product bucket matrix worked out by hand;
* the official bucket construction (``piecewise_index`` with its boolean masks, ``_rp_2d_*``,
  the ``+ beta`` shift, ``get_bucket_ids_2d``'s extra-token rows) transcribed here equals
  ``irpe_bucket_ids_2d`` and the encoding's tabulated ``g``;
* every method x mode x place (q, k, v): logits and outputs equal the dense reference
  (``RPEAttention.forward``: ``q *= scale``, ``attn += rpe_k(q)``,
  ``attn += rpe_q(k * scale)^T``, ``out += rpe_v(attn)``, with the tables gathered into
  ``(L, L, D)`` tensors) on ``eager`` and ``chunked`` (production and small blocks), forward
  and backward; ``sdpa`` and (slow) ``flex`` for the score-only configurations.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.attention import chunked, supported_backends
from relpos.encodings.contextual.irpe import (
    IRPEData,
    irpe_bucket,
    irpe_bucket_ids_2d,
    irpe_num_buckets,
    irpe_positions,
    piecewise_index,
)

B, H, D = 2, 4, 8


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, msg: str = "") -> None:
    """Relative to the largest magnitude of ``expected`` (as the conformance suite)."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=rtol * scale + 1e-30, msg=(lambda m: f"{msg}\n{m}")
    )


# ------------------------------------------------------------------------------ the official code
def official_piecewise_index(rp: torch.Tensor, alpha, beta, gamma) -> torch.Tensor:
    """microsoft/Cream iRPE ``piecewise_index``, step by step: the far entries are selected
    by a boolean mask, computed, and written back into a copy of the input."""
    rp_abs = rp.abs()
    not_mask = ~(rp_abs <= alpha)
    rp_out, rp_abs_out = rp[not_mask], rp_abs[not_mask]
    y_out = (
        torch.sign(rp_out)
        * (alpha + torch.log(rp_abs_out / alpha) / math.log(gamma / alpha) * (beta - alpha))
        .round()
        .clip(max=beta)
    ).to(torch.long)
    idx = rp.clone()
    if idx.is_floating_point():
        idx = idx.round().to(torch.long)
    idx[not_mask] = y_out
    return idx


def official_bucket(diff: torch.Tensor, method: str, ratio: float) -> torch.Tensor:
    """``_rp_2d_<method>(diff)`` plus the ``+ beta_int`` shift of non-product methods
    (``get_bucket_ids_2d_without_skip``). ``diff (..., 2)`` = position of the row token minus
    position of the column token."""
    kw = dict(alpha=1 * ratio, beta=2 * ratio, gamma=8 * ratio)
    beta_int = int(kw["beta"])
    if method == "euc":
        out = official_piecewise_index(diff.square().sum(-1).float().sqrt().round(), **kw)
    elif method == "quant":
        out = official_piecewise_index(diff.square().sum(-1), **kw)
    elif method == "product":
        r = official_piecewise_index(diff[..., 0], **kw) + beta_int
        c = official_piecewise_index(diff[..., 1], **kw) + beta_int
        return r * (2 * beta_int + 1) + c
    elif method == "cross_rows":
        out = official_piecewise_index(diff[..., 0], **kw)
    else:
        out = official_piecewise_index(diff[..., 1], **kw)
    return out + beta_int


def official_bucket_ids_2d(method: str, height: int, width: int, skip: int, ratio: float):
    """``get_bucket_ids_2d``: row-major positions (``get_absolute_positions``), all pairs,
    extra-token rows and columns filled with the extra id ``num_buckets``."""
    rows = torch.arange(height).view(height, 1).repeat(1, width)
    cols = torch.arange(width).view(1, width).repeat(height, 1)
    pos = torch.stack([rows, cols], 2).view(-1, 2)
    ids = official_bucket(pos.view(-1, 1, 2) - pos.view(1, -1, 2), method, ratio)
    beta_int = int(2 * ratio)
    n = (2 * beta_int + 1) ** 2 if method == "product" else 2 * beta_int + 1
    if skip == 0:
        return ids, n
    L = height * width
    new = ids.new_empty(skip + L, skip + L)
    new[:skip] = n
    new[:, :skip] = n
    new[skip:, skip:] = ids
    return new, n + 1


# ------------------------------------------------------------------------------ pinned values
def test_piecewise_index_matches_spec_at_ratio_1_9() -> None:
    # official piecewise_index: x = -20..20 maps to [-3]*17 + [-2,-2,-1,0,1,2,2] + [3]*17
    expected = [-3] * 17 + [-2, -2, -1, 0, 1, 2, 2] + [3] * 17
    x = torch.arange(-20, 21)
    assert piecewise_index(x, 1.9, 3.8, 15.2).tolist() == expected
    assert piecewise_index(x.float(), 1.9, 3.8, 15.2).tolist() == expected
    enc = relpos.create("irpe", num_heads=1, head_dim=4, ratio=1.9)
    assert enc.index(x).tolist() == expected


def test_euclidean_index_matches_spec_at_ratio_20() -> None:
    # with ratio 20 (euc), d = 0,5,14,20,21,30,50,100,160,200 gives 0,5,14,20,20,24,29,35,40,40
    d = torch.tensor([0, 5, 14, 20, 21, 30, 50, 100, 160, 200])
    expected = [0, 5, 14, 20, 20, 24, 29, 35, 40, 40]
    assert piecewise_index(d.float(), 20, 40, 160).tolist() == expected
    # the euc method measures sqrt(dr^2 + dc^2) and shifts by beta_int = 40
    delta = torch.stack([d, torch.zeros_like(d)], -1)
    assert (irpe_bucket(delta, "euc", ratio=20) - 40).tolist() == expected
    assert (irpe_bucket(delta.flip(-1), "euc", ratio=20) - 40).tolist() == expected


def test_bucket_counts_of_the_released_configurations() -> None:
    # DeiT-Ti product ratio 1.9 with skip=1 -> 49 + 1 = 50; euc ratio 20 -> 81
    assert irpe_num_buckets("product", 1.9) == 49
    assert irpe_num_buckets("product", 1.9, skip=1) == 50
    assert irpe_num_buckets("euc", 20) == 81
    assert irpe_num_buckets("cross", 20) == 81  # per table: 2 * 40 + 1
    assert irpe_num_buckets("quant", 33, skip=1) == 2 * 66 + 2
    deit_ti = relpos.create("irpe", num_heads=3, head_dim=64, skip=1)
    assert deit_ti.rpe_k.lookup_table_weight.shape == (1, 64, 50)  # shared head, (1, D, nb)
    ids, n = irpe_bucket_ids_2d("product", 14, 14, skip=1)
    assert n == 50 and ids.shape == (197, 197) and int(ids.max()) == 49


def test_product_bucket_matrix_of_a_2x2_grid() -> None:
    # by hand: (g(dr) + 3) * 7 + (g(dc) + 3), g = identity for |x| <= 1.9;
    # tokens (0,0), (0,1), (1,0), (1,1)
    expected = torch.tensor(
        [[24, 23, 17, 16], [25, 24, 18, 17], [31, 30, 24, 23], [32, 31, 25, 24]]
    )
    ids, n = irpe_bucket_ids_2d("product", 2, 2)
    assert n == 49 and torch.equal(ids, expected)
    with_cls, n = irpe_bucket_ids_2d("product", 2, 2, skip=1)
    assert n == 50 and torch.equal(with_cls[1:, 1:], expected)
    assert (with_cls[0] == 49).all() and (with_cls[:, 0] == 49).all()


@pytest.mark.parametrize("ratio", [1.9, 2.5, 20, 33])
@pytest.mark.parametrize(
    ("method", "height", "width", "skip"),
    [
        ("euc", 14, 14, 1),
        ("quant", 9, 11, 0),
        ("product", 14, 14, 1),
        ("cross_rows", 7, 5, 2),
        ("cross_cols", 7, 5, 2),
    ],
)
def test_bucket_ids_equal_the_official_construction(method, height, width, skip, ratio) -> None:
    got, n = irpe_bucket_ids_2d(method, height, width, ratio=ratio, skip=skip)
    expected, n_expected = official_bucket_ids_2d(method, height, width, skip, ratio)
    assert n == n_expected
    assert torch.equal(got, expected)


@pytest.mark.parametrize("ratio", [0.3, 0.5, 1, 1.5, 1.75, 1.9, 2.5, 3.3, 7.7, 20, 33, 100])
def test_tabulated_g_equals_the_formula_for_every_integer(ratio) -> None:
    """The encoding reads g from a table up to ceil(gamma) + 1 and saturates beyond."""
    enc = relpos.create("irpe", num_heads=1, head_dim=4, ratio=ratio)
    x = torch.cat([torch.arange(-5000, 5001), torch.tensor([-(10**9), 10**7, 10**12])])
    kw = dict(alpha=ratio, beta=2 * ratio, gamma=8 * ratio)
    assert torch.equal(enc.index(x), official_piecewise_index(x, **kw))


def test_default_options_follow_the_official_config() -> None:
    # get_rpe_config(): ratio 1.9, product, contextual, shared_head, skip 0, rpe_on 'k';
    # every table zero-initialised
    enc = relpos.create("irpe", num_heads=4, head_dim=16)
    assert (enc.method, enc.mode, enc.rpe_on, enc.ratio, enc.skip) == (
        "product",
        "contextual",
        "k",
        1.9,
        0,
    )
    assert [n for n, _ in enc.named_parameters()] == ["rpe_k.lookup_table_weight"]
    assert enc.rpe_k.lookup_table_weight.shape == (1, 16, 49)
    assert not enc.rpe_k.lookup_table_weight.detach().any()
    assert enc.has_bias and not enc.needs_probabilities
    bias = relpos.create("irpe-bias", num_heads=4, head_dim=16)
    assert bias.rpe_k.lookup_table_bias.shape == (4, 49)  # per head by default here
    qkv = relpos.create("irpe-qkv", num_heads=4, head_dim=16)
    assert [n for n, _ in qkv.named_parameters()] == [
        "rpe_q.lookup_table_weight",
        "rpe_k.lookup_table_weight",
        "rpe_v.lookup_table_weight",
    ]
    assert qkv.rpe_v.lookup_table_weight.shape == (1, 49, 16)  # values: (H|1, nb, D)
    assert supported_backends(qkv) == ["eager", "chunked"]
    cross = relpos.create("irpe", num_heads=4, head_dim=16, method="cross", ratio=20, skip=1)
    assert [n for n, _ in cross.named_parameters()] == [
        "rpe_k.rp_rows.lookup_table_weight",
        "rpe_k.rp_cols.lookup_table_weight",
    ]
    assert cross.rpe_k.rp_rows.lookup_table_weight.shape == (1, 16, 82)
    values_only = relpos.create("irpe", num_heads=4, head_dim=16, rpe_on="v")
    assert not values_only.has_bias and values_only.has_value_term
    random = relpos.create("irpe", num_heads=4, head_dim=16, init_std=0.5)
    assert 0.4 < float(random.rpe_k.lookup_table_weight.detach().std()) < 0.6


def test_bad_options_name_the_argument() -> None:
    bad = [
        ({"method": "euclid"}, "method"),
        ({"mode": "scalar"}, "mode"),
        ({"rpe_on": "x"}, "rpe_on"),
        ({"rpe_on": ""}, "rpe_on"),
        ({"rpe_on": "kk"}, "rpe_on"),
        ({"mode": "bias", "rpe_on": "kv"}, "rpe_on"),
        ({"ratio": 0}, "ratio"),
        ({"skip": -1}, "skip"),
        ({"init_std": -1.0}, "init_std"),
    ]
    for options, name in bad:
        with pytest.raises(ValueError, match=name):
            relpos.create("irpe", num_heads=2, head_dim=4, **options)
    with pytest.raises(TypeError, match="ratio"):  # a bool is the wrong type (the policy)
        relpos.create("irpe", num_heads=2, head_dim=4, ratio=True)
    with pytest.raises(TypeError, match="shared_head"):
        relpos.create("irpe", num_heads=2, head_dim=4, shared_head=1)
    with pytest.raises(ValueError, match="cross_rows"):
        irpe_bucket(torch.zeros(3, 2, dtype=torch.long), "cross")
    with pytest.raises(ValueError, match="delta"):
        irpe_bucket(torch.zeros(3, 3, dtype=torch.long), "euc")
    with pytest.raises(TypeError, match="delta"):
        irpe_bucket(torch.zeros(3, 2), "euc")


# ------------------------------------------------------------------------------ dense reference
def _pair_ids(enc, q_pos, k_pos, method: str, transposed: bool) -> torch.Tensor:
    """Official bucket of every pair ``(B, Lq, Lk)``: ``p_i - p_j`` (``p_j - p_i`` for the
    transposed query term); extra-token pairs read the extra id."""
    diff = q_pos[:, :, None, :] - k_pos[:, None, :, :]
    ids = official_bucket(-diff if transposed else diff, method, enc.ratio)
    if enc.skip:
        lq, lk = q_pos.shape[1], k_pos.shape[1]
        token_i = torch.arange(lq)[:, None] + (lk - lq)  # queries are the last Lq tokens
        token_j = torch.arange(lk)[None, :]
        extra = (token_i < enc.skip) | (token_j < enc.skip)
        ids = torch.where(extra, enc.num_buckets - 1, ids)
    return ids


def _tables(enc, role: str) -> list[tuple[str, torch.Tensor]]:
    module = getattr(enc, f"rpe_{role}")
    if module is None:
        return []
    if enc.method == "cross":
        return [("cross_rows", module.rp_rows), ("cross_cols", module.rp_cols)]
    return [(enc.method, module)]


def dense_reference(enc, q, k, v, q_pos, k_pos, causal: bool):
    """``RPEAttention.forward`` with every table gathered per pair. Returns (logits, out)."""
    scale = D**-0.5
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    q_pos = q_pos.expand(q.shape[0], -1, -1)
    k_pos = k_pos.expand(q.shape[0], -1, -1)
    qs = q * scale
    attn = qs @ k.transpose(-1, -2)
    for role in ("k", "q"):
        for method, module in _tables(enc, role):
            ids = _pair_ids(enc, q_pos, k_pos, method, transposed=role == "q")  # (B, Lq, Lk)
            if enc.mode == "bias":
                attn = attn + module.lookup_table_bias[:, ids].transpose(0, 1)  # (B, H|1, ..)
                continue
            W = module.lookup_table_weight  # (H|1, D, nb)
            R = W[:, :, ids].permute(2, 0, 3, 4, 1)  # (B, H|1, Lq, Lk, D)
            if role == "k":  # rpe_k(q): (q * scale) . W[bucket(p_i - p_j)]
                attn = attn + torch.einsum("bhid,bhijd->bhij", qs, R)
            else:  # rpe_q(k * scale)^T: (k_j * scale) . W[bucket(p_j - p_i)]
                attn = attn + torch.einsum("bhjd,bhijd->bhij", k * scale, R)
    logits = attn
    if causal:
        i = torch.arange(q.shape[2])[:, None] + (k.shape[2] - q.shape[2])
        attn = attn.masked_fill(torch.arange(k.shape[2])[None, :] > i, float("-inf"))
    p = attn.softmax(-1)
    out = p @ v
    for method, module in _tables(enc, "v"):  # rpe_v(attn): sum_j p_ij W_v[bucket(p_i - p_j)]
        ids = _pair_ids(enc, q_pos, k_pos, method, transposed=False)
        Wv = module.lookup_table_weight[:, ids].transpose(0, 1)  # (B, H|1, Lq, Lk, D)
        out = out + torch.einsum("bhij,bhijd->bhid", p, Wv)
    return logits, out


CONFIGS = [  # every method x mode, every place; shared and per-head tables; extra tokens
    dict(method="euc", mode="bias", rpe_on="qk", ratio=2.5, shared_head=False, skip=1),
    dict(method="quant", mode="bias", rpe_on="k", ratio=1.9, shared_head=True),
    dict(method="cross", mode="bias", rpe_on="qk", ratio=1.9, shared_head=False, skip=1),
    dict(method="product", mode="bias", rpe_on="q", ratio=1.9, shared_head=False),
    dict(method="euc", mode="contextual", rpe_on="qkv", ratio=2.5, shared_head=True, skip=1),
    dict(method="quant", mode="contextual", rpe_on="qk", ratio=1.9, shared_head=False),
    dict(method="cross", mode="contextual", rpe_on="qkv", ratio=1.5, shared_head=False, skip=2),
    dict(method="product", mode="contextual", rpe_on="qkv", ratio=1.9, skip=1),
    dict(method="product", mode="contextual", rpe_on="v", ratio=1.9, shared_head=False, skip=1),
    dict(method="euc", mode="contextual", rpe_on="k", ratio=20, shared_head=False),
]
IDS = ["-".join(str(v) for v in c.values()) for c in CONFIGS]


def _make(options: dict):
    torch.manual_seed(0)
    return relpos.create("irpe", num_heads=H, head_dim=D, init_std=0.5, **options)


def _problem(case: str, skip: int, seed: int = 0):
    """``"grid"``: the official layout (extra tokens, then a 4x5 map in row-major order),
    Lq = Lk, all heads; ``"batch"``: per-batch random integer positions in [-6, 6]^2 (pairs
    beyond gamma, repeated positions), Lq = Lk - 1 (the last queries), 2 key/value heads."""
    gen = torch.Generator().manual_seed(seed)
    if case == "grid":
        kp = irpe_positions(4, 5, skip=skip)[None]
        lq, hkv = kp.shape[1], H
    else:
        kp = torch.randint(-6, 7, (B, 24, 2), generator=gen)
        lq, hkv = 23, 2
    lk = kp.shape[1]
    q = torch.randn(B, H, lq, D, generator=gen)
    k, v = (torch.randn(B, hkv, lk, D, generator=gen) for _ in range(2))
    return q, k, v, kp[:, lk - lq :], kp


CASES = [("grid", False), ("batch", True)]


@pytest.mark.parametrize(("case", "causal"), CASES)
@pytest.mark.parametrize("options", CONFIGS, ids=IDS)
def test_logits_equal_dense_reference(options, case, causal) -> None:
    enc = _make(options)
    q, k, _, qp, kp = _problem(case, enc.skip)
    expected, _ = dense_reference(enc, q, k, k, qp, kp, causal)
    got = relpos.scores(q, k, enc, q_pos=qp, k_pos=kp)
    close(got, expected.detach())
    content = q @ k.repeat_interleave(H // k.shape[1], 1).transpose(-1, -2) * D**-0.5
    assert not enc.has_bias or (expected - content).abs().max() > 0.1  # the terms matter


def _run(enc, q, k, v, q_pos, k_pos, causal: bool, backend: str):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    leaves = [q, k, v, *enc.parameters()]
    if backend == "dense":
        _, out = dense_reference(enc, q, k, v, q_pos, k_pos, causal)
    else:
        out = relpos.attention(
            q, k, v, enc, q_pos=q_pos, k_pos=k_pos, causal=causal, backend=backend
        )
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("backend", ["eager", "chunked", "chunked-small", "sdpa"])
@pytest.mark.parametrize(("case", "causal"), CASES)
@pytest.mark.parametrize("options", CONFIGS, ids=IDS)
def test_attention_and_gradients_equal_dense_reference(
    options, case, causal, backend, monkeypatch
) -> None:
    enc = _make(options)
    if backend.removesuffix("-small") not in supported_backends(enc):
        assert enc.has_value_term  # sdpa refuses exactly the value term
        pytest.skip("value term: eager and chunked only")
    problem = _problem(case, enc.skip)
    if backend == "chunked-small":  # several query blocks on the probability and tile paths
        monkeypatch.setattr(chunked, "TILE_ELEMENTS", 4 * problem[1].shape[2])
    ref_out, ref_grads = _run(enc, *problem, causal, "dense")
    out, grads = _run(enc, *problem, causal, backend.removesuffix("-small"))
    close(out, ref_out, msg="output")
    names = ["q", "k", "v", *(n for n, _ in enc.named_parameters())]
    for n, g, r in zip(names, grads, ref_grads, strict=True):
        close(g, r, msg=f"grad {n}")


@pytest.mark.slow  # compiles FlexAttention twice
def test_flex_forward_equals_dense_reference() -> None:
    for options in (CONFIGS[2], dict(method="product", mode="contextual", rpe_on="qk", skip=1)):
        enc = _make(options)
        q, k, v, qp, kp = _problem("batch", enc.skip)
        with torch.no_grad():
            _, expected = dense_reference(enc, q, k, v, qp, kp, causal=True)
            got = relpos.attention(q, k, v, enc, q_pos=qp, k_pos=kp, causal=True, backend="flex")
        close(got, expected, msg=str(options))


def test_decoding_rows_equal_the_full_forward_with_extra_tokens() -> None:
    """Queries are the last Lq tokens: a decoding step sees the same extra-token pairs as
    the corresponding rows of the full call."""
    enc = _make(dict(method="product", mode="contextual", rpe_on="qkv", skip=2))
    q, k, v, _, kp = _problem("grid", 2)
    full = relpos.attention(q, k, v, enc, q_pos=kp, k_pos=kp, causal=True)
    for lq in (1, 3, 20):
        part = relpos.attention(q[:, :, -lq:], k, v, enc, q_pos=kp[:, -lq:], k_pos=kp, causal=True)
        close(part, full[:, :, -lq:])


def test_extra_token_positions_are_ignored_and_grid_is_shift_invariant() -> None:
    enc = _make(dict(method="cross", mode="contextual", rpe_on="qkv", skip=1))
    q, k, v, _, kp = _problem("grid", 1)
    ref = relpos.attention(q, k, v, enc, q_pos=kp, k_pos=kp)
    moved = kp.clone()
    moved[:, 0] = torch.tensor([17, -40])  # the CLS token's position is not used
    shifted = moved + torch.tensor([5, -3])
    for pos in (moved, shifted):
        close(relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos), ref)


def test_prepare_is_linear_in_length_and_buckets() -> None:
    """Contextual terms keep ``(B, H|Hkv, L, nb)`` products, never ``(L, L, D)``."""
    enc = _make(dict(method="cross", mode="contextual", rpe_on="qkv", skip=1, shared_head=False))
    q, k, _, qp, kp = _problem("batch", 1)
    ctx = enc.prepare(q, k, qp, kp)
    assert isinstance(ctx.data, IRPEData)  # typed per-call data, no string keys
    nb = enc.num_buckets
    assert [tuple(t.compute().shape) for t in ctx.data.on_keys] == [(B, H, 23, nb)] * 2
    # per-head tables: every query head reads its own table with its group's keys
    assert [tuple(t.compute().shape) for t in ctx.data.on_queries] == [(B, H, 24, nb)] * 2
    # a block of queries forms its own products only: (B, H, T, nb)
    block = enc.block_context(ctx, torch.arange(5, 12), torch.arange(24))
    assert [tuple(t.products.shape) for t in block.data.on_keys] == [(B, H, 7, nb)] * 2
    assert block.data.on_queries is ctx.data.on_queries or all(
        a is b for a, b in zip(block.data.on_queries, ctx.data.on_queries, strict=True)
    )


def test_parameter_names_are_the_official_ones_and_the_family_is_the_folder() -> None:
    """State dicts keep the official ``iRPE`` names (released checkpoints load)."""
    enc = relpos.create("irpe", num_heads=4, head_dim=8)
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {
        "rpe_k.lookup_table_weight": (1, 8, 49)
    }
    cross = relpos.create("irpe", num_heads=4, head_dim=6, method="cross", rpe_on="qkv", skip=1)
    # (1, D, nb) on queries and keys, (1, nb, D) on values; nb = 2 * 3 + 1 + 1 (skip)
    assert {k: tuple(v.shape) for k, v in cross.state_dict().items()} == {
        f"rpe_{r}.rp_{a}.lookup_table_weight": (1, 8, 6) if r == "v" else (1, 6, 8)
        for r in "qkv"
        for a in ("rows", "cols")
    }
    bias = relpos.create("irpe-bias", num_heads=4, head_dim=8)
    assert {k: tuple(v.shape) for k, v in bias.state_dict().items()} == {
        "rpe_k.lookup_table_bias": (4, 49)
    }
    assert {e.family for e in (enc, cross, bias)} == {"contextual"}
