"""DeepSeek Sparse Attention (DeepSeek-V3.2): its ``DynamicIndexedLayer`` cache is a
``DynamicLayer`` (attention keys in token order) plus the lightning indexer's own keys, so the
patch is exact while the indexer keeps every key (``index_topk`` >= the keys); once the
indexer drops keys (top-k selection), every method is refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402

from relpos.interop.hf import patch  # noqa: E402

LENGTH, PREFILL = 12, 9


def _deepseek_v32(index_topk: int):
    import transformers

    if not hasattr(transformers, "DeepseekV32ForCausalLM"):
        pytest.skip("transformers has no DeepSeek-V3.2")
    cfg = hf_families.tiny_config("deepseek_v32")
    cfg.index_topk = index_topk
    torch.manual_seed(0)
    return transformers.DeepseekV32ForCausalLM(cfg).eval()


def _ids():
    return torch.randint(3, 128, (1, LENGTH), generator=torch.Generator().manual_seed(1))


def _forward_and_decode(model, ids):
    """The full forward's logits and those of the tokens after ``PREFILL`` decoded one at a
    time with the model's own cache (a ``DynamicCache`` of ``DynamicIndexedLayer``)."""
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :PREFILL], use_cache=True)
        cache, steps = out.past_key_values, []
        for t in range(PREFILL, LENGTH):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits[:, -1])
    return full, torch.stack(steps, 1), cache


@pytest.mark.slow
def test_the_indexed_cache_holds_the_attention_keys_in_order_and_the_patch_is_exact():
    from transformers.cache_utils import DynamicIndexedLayer

    model = _deepseek_v32(index_topk=LENGTH)  # the indexer keeps every key
    ids = _ids()
    ref, ref_steps, cache = _forward_and_decode(model, ids)
    assert all(isinstance(layer, DynamicIndexedLayer) for layer in cache.layers)
    with patch(model, "baseline"):
        base, base_steps, _ = _forward_and_decode(model, ids)
    assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    with patch(model, "rope", backend="eager"):
        rope, rope_steps, _ = _forward_and_decode(model, ids)
    torch.testing.assert_close(rope, ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(rope_steps, ref_steps, atol=1e-4, rtol=0)
    with patch(model, "self-extend", group_size=2, neighbor_window=4):
        full, steps, _ = _forward_and_decode(model, ids)
    torch.testing.assert_close(steps, full[:, PREFILL:], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "method", ["baseline", *(pytest.param(m, marks=pytest.mark.slow) for m in ("rope", "alibi"))]
)
def test_an_indexer_that_drops_keys_is_refused_by_name(method):
    model = _deepseek_v32(index_topk=4)  # 4 of 12 keys per query
    with patch(model, method), torch.no_grad():
        with pytest.raises(ValueError, match=r"sparse attention selects 4 of its 12 keys"):
            model(_ids())
