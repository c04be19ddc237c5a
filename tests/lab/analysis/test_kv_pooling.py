"""Needle retrieval through a pooled KV cache (the phase diagnostic on a model): the pooled
cache against the sanity kernel, the uncompressed cache against a full forward,
prompts at the requested phase, and the sweep on the untrained smoke-test model."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.nn.cache import KVCache, LayerCache
from relpos_lab.analysis.kv_pooling import needle_prompts, phase_retrieval, pool_cache
from relpos_lab.longctx.models import ByteTokenizer, random_tiny_model

ENCODE = ByteTokenizer().encode


@pytest.mark.parametrize(
    ("stride", "phase", "expected"),
    [
        (4, 0.0, [1, 0.966151, 0.884496, 0.799595]),
        (4, 1.5, [0.928733, 0.991193, 0.991193, 0.928733]),
        (8, 0.0, [1, 0.966151, 0.884496, 0.799595, 0.747949, 0.734499, 0.736231, 0.72701]),
    ],
)
def test_a_pooled_window_of_equal_keys_scores_the_spec_kernel(stride, phase, expected):
    # keys equal before RoPE: pooling then re-rotating at w + phi_r is the sanity kernel S(phi)
    enc = relpos.create("rope", num_heads=1, head_dim=64).double()
    x = torch.full((1, 1, stride, 64), 64**-0.5, dtype=torch.float64)
    pos = torch.arange(stride)[None]
    k, _, k_pos = pool_cache(x, x, enc, stride=stride, offset=0, pool="before",
                             reference_phase=phase)  # fmt: skip
    assert k.shape[2] == 1 and k_pos.tolist() == [[0]]
    q = enc.rotate(x, pos, "q")
    ratio = (q * k).sum(-1) / (q * enc.rotate(x, pos, "k")).sum(-1)
    torch.testing.assert_close(ratio[0, 0], torch.tensor(expected, dtype=torch.float64),
                               atol=1e-6, rtol=0)  # fmt: skip
    after, _, _ = pool_cache(x, x, enc, stride=stride, offset=0, pool="after")
    assert not torch.allclose(after, k)  # pooling rotated keys is another key


def test_windows_of_one_token_and_no_pooling_keep_the_cache():
    enc = relpos.create("rope", num_heads=2, head_dim=8)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 1, 2, 11, 8, generator=gen)
    rotated = enc.rotate(k, torch.arange(11)[None], "k")
    for pool in ("none", "before", "after"):
        kk, vv, pos = pool_cache(k, v, enc, stride=1, offset=3, pool=pool)
        torch.testing.assert_close(kk, rotated)
        torch.testing.assert_close(vv, v)
        assert pos.tolist() == [list(range(11))]


def test_pooling_keeps_the_offset_and_the_tail_and_averages_each_window():
    enc = relpos.create("rope", num_heads=1, head_dim=4)
    k = torch.randn(1, 1, 13, 4)
    v = torch.arange(13, dtype=torch.float32).view(1, 1, 13, 1).expand(1, 1, 13, 4)
    kk, vv, pos = pool_cache(k, v, enc, stride=4, offset=2, pool="after")
    # 2 kept | windows [2,6) [6,10) | tail 10, 11, 12
    assert pos.tolist() == [[0, 1, 2, 6, 10, 11, 12]]
    assert vv[0, 0, :, 0].tolist() == [0, 1, 3.5, 7.5, 10, 11, 12]
    rotated = enc.rotate(k, torch.arange(13)[None], "k")
    torch.testing.assert_close(kk[:, :, 2], rotated[:, :, 2:6].mean(2))
    with pytest.raises(ValueError, match="pool must be one of"):
        pool_cache(k, v, enc, stride=4, offset=2, pool="middle")


def test_the_uncompressed_cache_continues_like_a_full_forward():
    model, _ = random_tiny_model()
    tokens = torch.randint(0, 256, (2, 20))
    from relpos_lab.analysis.kv_pooling import _raw_kv

    kv = _raw_kv(model, tokens[:, :14])
    enc = model.encoding
    layers = []
    for k_raw, v in kv:
        k, vv, pos = pool_cache(k_raw, v, enc, stride=4, offset=0, pool="none")
        layers.append(LayerCache(k=k, v=vv, k_pos=pos, rotated=True))
    with torch.no_grad():
        step = model(tokens[:, 14:], pos=torch.arange(14, 20)[None], cache=KVCache(layers))
        full = model(tokens)[:, 14:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_needle_prompts_put_the_needle_at_the_phase_and_depth():
    for phase in range(4):
        cell = needle_prompts(ENCODE, context=320, stride=4, depth=0.5, phase=phase, prompts=3,
                              seed=1)  # fmt: skip
        assert cell.context.shape == (3, 320)
        assert all((n - cell.offset) % 4 == phase for n in cell.needle)
        text = bytes(cell.context[0, cell.needle[0] :].tolist()).decode()
        assert text.startswith("The pass key is ")
        key = bytes(cell.answer[0].tolist()).decode()
        assert len(key) == 6 and key[1:] in text and cell.digit == 1  # " 12345"
        filler = 320 - cell.offset - len("The pass key is 12345. Remember it. 12345 is the "
                                           "pass key.") - 2  # fmt: skip
        assert abs(cell.needle[0] - cell.offset - 0.5 * filler) <= 4
    with pytest.raises(ValueError, match="context must leave"):
        needle_prompts(ENCODE, context=160, stride=4, depth=0.5, phase=0, prompts=1, seed=0)


def test_the_sweep_reports_accuracy_margin_and_gap_per_pooling():
    model, _ = random_tiny_model()
    r = phase_retrieval(model, ENCODE, "tiny", stride=2, depths=[0.5], reference_phases=[0, 1],
                        prompts=3, context=320, batch=2)  # fmt: skip
    assert list(r.pools) == ["none", "before φr=0", "before φr=1", "after"]
    for cell in r.pools.values():
        assert len(cell["accuracy"]) == 1 and len(cell["accuracy"][0]) == 2
        assert all(0.0 <= a <= 1.0 for a in cell["accuracy"][0])
        assert 0.0 <= cell["phase_gap"] <= 1.0
        att = torch.tensor(cell["needle_attention"])  # [depth][phase][layer][head]
        assert att.shape == (1, 2, 2, 4) and bool(((att > 0) & (att < 1)).all())
    # an untrained model's margins differ between the uncompressed and the pooled caches
    assert r.pools["none"]["margin"] != r.pools["after"]["margin"]


def test_models_without_a_cached_rotary_encoding_are_refused():
    from relpos.nn import TransformerLM

    model = TransformerLM(256, 16, 1, 2, encoding="alibi")
    with pytest.raises(ValueError, match="needs one rotary encoding"):
        phase_retrieval(model, ENCODE, "alibi model", stride=4, prompts=1, context=320)
    tiny, _ = random_tiny_model()
    with pytest.raises(ValueError, match="reference_phases must lie"):
        phase_retrieval(tiny, ENCODE, "tiny", stride=4, reference_phases=[4], prompts=1)


def test_every_phase_of_a_depth_sees_the_same_keys(monkeypatch):
    import relpos_lab.analysis.kv_pooling as kv

    seen = []

    def recording(encode, **kwargs):
        seen.append((kwargs["depth"], kwargs["phase"], kwargs["seed"]))
        return needle_prompts(encode, **kwargs)

    monkeypatch.setattr(kv, "needle_prompts", recording)
    model, _ = random_tiny_model()
    phase_retrieval(model, ENCODE, "tiny", stride=2, depths=[0.2, 0.8], prompts=1, context=320)
    assert seen == [(0.2, 0, 0), (0.2, 1, 0), (0.8, 0, 1000), (0.8, 1, 1000)]
