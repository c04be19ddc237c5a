"""relpos DeBERTa against ``transformers``' DeBERTa-v2 (``modeling_deberta_v2``) as the oracle.

* ``make_log_bucket_position`` and ``build_relative_position`` over grids of bucket sizes,
  maximum positions and distances;
* the whole ``DisentangledSelfAttention`` module (``relative_attention=True``, c2p and/or p2c,
  ``position_buckets`` 256 and -1, ``share_att_key`` True and False) against
  ``relpos.attention`` with the module's projections and the relative table copied: outputs
  and input gradients equal to 1e-5, on every backend that runs the encoding.

The module is called with ``rel_embeddings`` the way ``DebertaV2Encoder`` passes them (its
``rel_embeddings.weight`` through its LayerNorm): here that LayerNorm is a separate module whose
parameters are copied into the encoding's ``rel_norm``.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DebertaV2Config  # noqa: E402
from transformers.models.deberta_v2.modeling_deberta_v2 import (  # noqa: E402
    DisentangledSelfAttention,
    build_relative_position,
    make_log_bucket_position,
)

import relpos  # noqa: E402
from relpos.attention import plan  # noqa: E402
from relpos.encodings.contextual.deberta import (  # noqa: E402
    deberta_log_bucket,
    deberta_relative_index,
)

BUCKET_GRID = [(256, 512), (256, 1024), (128, 512), (64, 256), (16, 64), (6, 20), (33, 100)]


@pytest.mark.parametrize("bucket_size,max_position", BUCKET_GRID)
def test_log_buckets_equal_transformers(bucket_size: int, max_position: int) -> None:
    delta = torch.arange(-3 * max_position, 3 * max_position + 1)
    hf = make_log_bucket_position(delta, bucket_size, max_position).to(torch.int64)
    # transformers does not clamp: equal everywhere with clamp=False ...
    assert torch.equal(deberta_log_bucket(delta, bucket_size, max_position, clamp=False), hf)
    # ... and, with the official clamp (the default), wherever |delta| < max_position
    inside = delta.abs() < max_position
    clamped = deberta_log_bucket(delta, bucket_size, max_position)
    assert torch.equal(clamped[inside], hf[inside])


@pytest.mark.parametrize("buckets,max_rel", [(256, 512), (16, 64), (-1, 24), (-1, 512)])
@pytest.mark.parametrize("length", [1, 40, 300])
def test_relative_index_equals_transformers_build_relative_position(
    buckets: int, max_rel: int, length: int
) -> None:
    x = torch.zeros(1, length, 4)
    rel = build_relative_position(x, x, bucket_size=buckets, max_position=max_rel)[0]
    span = buckets if buckets > 0 else max_rel
    hf_index = torch.clamp(rel + span, 0, 2 * span - 1)  # DeBERTa's c2p_pos
    pos = torch.arange(length)
    delta = pos[:, None] - pos[None, :]
    ours = deberta_relative_index(
        delta, position_buckets=buckets, max_relative_positions=max_rel, clamp_buckets=False
    )
    assert torch.equal(ours, hf_index)
    enc = relpos.create(
        "deberta",
        num_heads=2,
        head_dim=4,
        position_buckets=buckets,
        max_relative_positions=max_rel,
        clamp_buckets=False,
    )
    assert torch.equal(enc.table_row(delta), hf_index)


# ---------------------------------------------------------------------------- whole module
H, D = 4, 8
HIDDEN = H * D

MODULE_CASES = [
    # (position_buckets, max_relative_positions, length, pos_att_type, share_att_key)
    pytest.param(256, 512, 200, ["c2p", "p2c"], False, id="buckets256-L200"),
    pytest.param(256, 512, 200, ["c2p", "p2c"], True, id="buckets256-L200-shared"),
    pytest.param(-1, 24, 40, ["c2p", "p2c"], False, id="nobuckets-span24"),
    pytest.param(-1, 24, 40, ["c2p", "p2c"], True, id="nobuckets-span24-shared"),
    pytest.param(16, 64, 100, ["c2p"], False, id="buckets16-c2p-only"),
    pytest.param(16, 64, 100, ["p2c"], True, id="buckets16-p2c-only-shared"),
]


def make_pair(buckets, max_rel, pos_att_type, share, seed=0, clamp_buckets=True):
    """The transformers module (with its encoder's LayerNorm) and a relpos encoding holding
    copies of its position weights. The default (clamped) buckets equal transformers' for
    distances below ``max_rel``; ``clamp_buckets=False`` equals them everywhere."""
    torch.manual_seed(seed)
    config = DebertaV2Config(
        hidden_size=HIDDEN,
        num_attention_heads=H,
        intermediate_size=4 * HIDDEN,
        relative_attention=True,
        pos_att_type=pos_att_type,
        position_buckets=buckets,
        max_relative_positions=max_rel,
        max_position_embeddings=512,
        share_att_key=share,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-7,
    )
    hf = DisentangledSelfAttention(config).eval()
    with torch.no_grad():  # non-trivial biases (transformers initialises some to 0)
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, 0.2)
                module.bias.normal_(0, 0.2)
    enc = relpos.create(
        "deberta",
        num_heads=H,
        head_dim=D,
        position_buckets=buckets,
        max_relative_positions=max_rel,
        pos_att_type=pos_att_type,
        share_att_key=share,
        clamp_buckets=clamp_buckets,
    ).eval()
    norm = torch.nn.LayerNorm(HIDDEN, eps=1e-7)
    with torch.no_grad():
        enc.rel_embeddings.normal_(0, 1.0)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_(0, 0.1)
        enc.rel_norm.load_state_dict(norm.state_dict())
        sources = {"c2p": "key_proj", "p2c": "query_proj"}
        for term, name in sources.items():
            if term in pos_att_type:
                source = getattr(hf, name if share else f"pos_{name}")
                enc.projection(term).load_state_dict(source.state_dict())
    return hf, enc, norm


def heads(x: torch.Tensor) -> torch.Tensor:
    B, L, _ = x.shape
    return x.view(B, L, H, D).transpose(1, 2)


def relpos_forward(hf, enc, x, key_mask, backend):
    """The module's computation with relpos doing the attention: (B, L, hidden)."""
    q, k, v = (heads(getattr(hf, n)(x)) for n in ("query_proj", "key_proj", "value_proj"))
    out = relpos.attention(q, k, v, enc, mask=key_mask[:, None, None, :], backend=backend)
    return out.transpose(1, 2).reshape(x.shape)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
@pytest.mark.parametrize("buckets,max_rel,length,pos_att_type,share", MODULE_CASES)
def test_disentangled_self_attention_equals_transformers(
    buckets, max_rel, length, pos_att_type, share, backend
) -> None:
    # sequences longer than max_rel reach distances where only the unclamped buckets agree
    hf, enc, norm = make_pair(
        buckets, max_rel, pos_att_type, share, clamp_buckets=length <= max_rel
    )
    gen = torch.Generator().manual_seed(1)
    B = 2
    x = torch.randn(B, length, HIDDEN, generator=gen, requires_grad=True)
    key_mask = torch.rand(B, length, generator=gen) > 0.2
    key_mask[:, 0] = True
    hf_mask = key_mask[:, None, None, :].expand(B, 1, length, length)
    g = torch.randn(B, length, HIDDEN, generator=gen)

    want, _ = hf(x, hf_mask, rel_embeddings=norm(enc.rel_embeddings))
    (want_grad,) = torch.autograd.grad((want * g).sum(), x)
    got = relpos_forward(hf, enc, x, key_mask, backend)
    (got_grad,) = torch.autograd.grad((got * g).sum(), x)

    scale = float(want.detach().abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(
        got_grad, want_grad, rtol=1e-5, atol=1e-5 * float(want_grad.abs().max())
    )


def test_tied_projections_share_the_module_and_train_it() -> None:
    """``share_att_key=True`` + ``tie_projections``: the encoding uses the layer's own
    ``query_proj`` / ``key_proj`` modules (no copy), as DeBERTa-v3 does."""
    hf, enc, norm = make_pair(256, 512, ["c2p", "p2c"], True)
    enc.tie_projections(query_proj=hf.query_proj, key_proj=hf.key_proj)
    assert enc.key_proj is hf.key_proj and enc.query_proj is hf.query_proj
    with torch.no_grad():  # changing the layer changes the encoding
        hf.query_proj.weight.mul_(1.5)
        hf.key_proj.bias.add_(0.3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 150, HIDDEN, generator=gen)
    mask = torch.ones(2, 150, dtype=torch.bool)
    want, _ = hf(
        x, mask[:, None, None, :].expand(2, 1, 150, 150), rel_embeddings=norm(enc.rel_embeddings)
    )
    got = relpos_forward(hf, enc, x, mask, "auto")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))
    got.square().sum().backward()
    assert hf.query_proj.weight.grad is not None and hf.query_proj.weight.grad.abs().max() > 0
    with pytest.raises(ValueError, match="share_att_key"):
        make_pair(256, 512, ["c2p"], False)[1].tie_projections(key_proj=hf.key_proj)
    with pytest.raises(ValueError, match="query_proj"):
        enc.tie_projections(query_proj=torch.nn.Linear(HIDDEN, 2 * HIDDEN))


def test_default_buckets_differ_from_transformers_only_past_max_position() -> None:
    """Past ``max_relative_positions`` the official clamp (relpos' default) and transformers
    pick different rows for far keys after the query (documented in ``deberta_log_bucket``)."""
    hf, enc, norm = make_pair(16, 64, ["c2p", "p2c"], False)
    x = torch.randn(1, 100, HIDDEN, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(1, 100, dtype=torch.bool)
    with torch.no_grad():
        want, _ = hf(
            x,
            mask[:, None, None, :].expand(1, 1, 100, 100),
            rel_embeddings=norm(enc.rel_embeddings),
        )
        got = relpos_forward(hf, enc, x, mask, "eager")
    diff = (got - want).abs().amax(-1)[0]  # per query
    assert diff[36:].max() < 1e-5  # queries 36..99 have no key at distance i - j <= -64
    assert diff[:36].min() > 1e-4


FOLD_CASES = [
    # (position_buckets, max_relative_positions, length, pos_att_type, share_att_key): lengths
    # well past the saturation distance, so the folded outer regions hold most pairs
    pytest.param(16, 64, 150, ["c2p", "p2c"], False, id="buckets16-L150"),
    pytest.param(16, 64, 150, ["c2p", "p2c"], True, id="buckets16-L150-shared"),
    pytest.param(-1, 24, 80, ["c2p", "p2c"], False, id="nobuckets-span24-L80"),
    pytest.param(16, 64, 150, ["c2p"], False, id="buckets16-c2p-only"),
    pytest.param(16, 64, 150, ["p2c"], True, id="buckets16-p2c-only-shared"),
]


@pytest.mark.parametrize("buckets,max_rel,length,pos_att_type,share", FOLD_CASES)
def test_fold_deberta_equals_transformers(buckets, max_rel, length, pos_att_type, share) -> None:
    """``backend="fold"`` (path ``fold-band``: the outer regions folded into q/k channels,
    the band gathered) against the module over a full sequence (an all-ones mask, as the
    encoder passes it without padding): the output and the gradients of the input, of the
    relative table and (shared keys, tied projections) of the module's projections."""
    hf, enc, norm = make_pair(buckets, max_rel, pos_att_type, share, clamp_buckets=False)
    if share:
        enc.tie_projections(
            query_proj=hf.query_proj if "p2c" in pos_att_type else None,
            key_proj=hf.key_proj if "c2p" in pos_att_type else None,
        )
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, length, HIDDEN, generator=gen, requires_grad=True)
    g = torch.randn(1, length, HIDDEN, generator=gen)
    ones = torch.ones(1, 1, length, length, dtype=torch.bool)
    lo, hi = enc.saturation()
    assert length - 1 > 2 * max(hi, -lo)  # most pairs are folded
    wrt = [x, enc.rel_embeddings]
    if share:
        wrt += [hf.query_proj.weight, hf.key_proj.weight, hf.value_proj.weight]

    want, _ = hf(x, ones, rel_embeddings=norm(enc.rel_embeddings))
    want_g = torch.autograd.grad((want * g).sum(), wrt)
    q, k, v = (heads(getattr(hf, n)(x)) for n in ("query_proj", "key_proj", "value_proj"))
    assert plan(q, k, v, enc, backend="fold") == ("fold", "fold-band")
    got = relpos.attention(q, k, v, enc, backend="fold").transpose(1, 2).reshape(x.shape)
    got_g = torch.autograd.grad((got * g).sum(), wrt)

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))
    for n, (a, e) in enumerate(zip(got_g, want_g, strict=True)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5 * float(e.abs().max()), msg=str(n))
