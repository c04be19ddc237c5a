"""``relpos.interop.hf.patch`` on vision-language decoders with multi-axis (M-RoPE) positions,
and on decoders whose RoPE module is found by what it is rather than by its name.

Tiny random models, built from transformers' own classes (no downloads): Qwen2-VL (M-RoPE
sections), Qwen3-VL (interleaved sections), GLM-4V (interleaved pairs), Ernie 4.5 VL (pairs
that alternate height and width, then time). Their text decoders take position ids
``(3, B, L)`` (time, height, width); an image's tokens share a time and differ in height and
width. ``patch(model, "rope")`` must reproduce the model's logits on such ids, in the full
forward and in KV-cache decoding (whose cached keys include the image tokens), to float32
rounding; 1-D encodings refuse them by name.
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402

RTOL = 1e-4
STEPS = 3
TEXT_SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)
#: the text decoder's q and k weights are scaled by this, so that its attention is peaked
#: and its logits depend on the positions (at the random init they barely do)
QK_SCALE = 6.0
#: the special tokens of the tiny models (inside the vocabulary)
SPECIAL = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
#: model type -> (class, mrope_section for 8 rotated pairs, the pair axes the probe must find)
VL_MODELS = {
    # sections: pairs [0, 2) time, [2, 5) height, [5, 8) width
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", [2, 3, 3], (0, 0, 1, 1, 1, 2, 2, 2)),
    # Qwen3-VL's cycle: t, h, w, t, h, w, ...
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", [2, 3, 3], (0, 1, 2, 0, 1, 2, 0, 1)),
    # GLM-4V: Qwen2-VL's sections on interleaved pairs
    "glm4v": ("Glm4vForConditionalGeneration", [2, 3, 3], (0, 0, 1, 1, 1, 2, 2, 2)),
    # Ernie 4.5 VL's [h, w, t]: height and width alternate, then time
    "ernie4_5_vl_moe": (
        "Ernie4_5_VLMoeForConditionalGeneration",
        [3, 3, 2],
        (1, 2, 1, 2, 1, 2, 0, 0),
    ),
}


def vl_model(model_type: str):
    """The tiny vision-language model (float32, eval, seed 0): a 2-layer text decoder of 4
    query / 2 key-value heads of 16 channels (8 rotated pairs), a 1-block vision tower."""
    import transformers as tf

    class_name, sections, _ = VL_MODELS[model_type]
    cfg = tf.AutoConfig.for_model(model_type)
    text = cfg.text_config
    for key, value in TEXT_SIZES.items():
        setattr(text, key, value)
    for key, value in dict(num_experts=4, num_experts_per_tok=2).items():
        if getattr(text, key, None) is not None:
            setattr(text, key, value)
    text.rope_parameters = {**text.rope_parameters, "mrope_section": sections}
    vision = cfg.vision_config
    # Qwen2-VL's vision hidden_size is its merger's output (the text width); the others
    # name that out_hidden_size
    width = 64 if hasattr(vision, "embed_dim") else 32
    for key, value in dict(
        depth=1, num_hidden_layers=1, hidden_size=width, embed_dim=32, num_heads=2
    ).items():
        if hasattr(vision, key):
            setattr(vision, key, value)
    for key, value in dict(intermediate_size=32, out_hidden_size=64).items():
        if hasattr(vision, key):
            setattr(vision, key, value)
    for offset, key in enumerate(SPECIAL):
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, 120 + offset)
    torch.manual_seed(0)
    model = getattr(tf, class_name)(cfg).float().eval()
    model.generation_config.pad_token_id = 0
    with torch.no_grad():  # peaked attention: the logits depend on the positions
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")) and "visual" not in name:
                weight.mul_(QK_SCALE)
    return model


def image_positions(batch: int, length: int) -> torch.Tensor:
    """``(3, B, L)`` position ids as a vision-language processor gives them: 5 text tokens,
    a 3 x 4 image (time 5, rows 5..7, columns 5..8), then text from 9 on (every axis)."""
    t, h, w = list(range(5)), list(range(5)), list(range(5))
    for i in range(12):
        t.append(5)
        h.append(5 + i // 4)
        w.append(5 + i % 4)
    after = list(range(9, 9 + length - len(t)))
    row = torch.tensor([t + after, h + after, w + after])
    return row[:, None].expand(-1, batch, -1).contiguous()


def tokens(batch: int, length: int) -> torch.Tensor:
    return torch.randint(3, 110, (batch, length), generator=torch.Generator().manual_seed(1))


def forward_and_decode(model, ids, pos):
    """``(full, steps)``: the full forward's logits, and the last ``STEPS`` positions decoded
    one at a time with the KV cache after a prefill of the rest."""
    with torch.no_grad():
        full = model(input_ids=ids, position_ids=pos).logits
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        start = ids.shape[1] - STEPS
        model(input_ids=ids[:, :start], position_ids=pos[..., :start], cache=cache)
        steps = [
            model(
                input_ids=ids[:, t : t + 1], position_ids=pos[..., t : t + 1], cache=cache
            ).logits[:, -1]
            for t in range(start, ids.shape[1])
        ]
    return full, torch.stack(steps, 1)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


# ------------------------------------------------------------------------------ M-RoPE


@pytest.mark.parametrize("model_type", sorted(VL_MODELS))
def test_the_probe_reads_the_axis_of_every_rotated_pair(model_type):
    facts = inspect_model(vl_model(model_type), probe=True)
    assert facts.position_axes == 3 and facts.axes_refusal is None
    assert type(facts.decoder).__name__.endswith("TextModel")  # not the vision tower
    expected = VL_MODELS[model_type][2]
    assert [layer.axis_of_pair for layer in facts.layers] == [expected, expected]


@pytest.mark.parametrize("model_type", sorted(VL_MODELS))
def test_rope_on_image_positions_equals_the_unpatched_model_with_kv_cache_decoding(model_type):
    """Position ids that differ between axes (an image's grid), forward and cached decoding
    (the cached keys include the image tokens): relpos's m-rope with the probed pair axes
    gives the model's logits."""
    model = vl_model(model_type)
    ids, pos = tokens(2, 22), image_positions(2, 22)
    ref, ref_steps = forward_and_decode(model, ids, pos)
    with patch(model, "rope", backend="eager") as handle:
        assert handle.encoding(0).__class__.__name__ == "MRoPE"
        full, steps = forward_and_decode(model, ids, pos)
    assert relative(full, ref) <= RTOL
    assert relative(steps, ref_steps) <= RTOL
    # the check can fail: plain 1-D RoPE on the time axis is far from the model here
    with torch.no_grad():
        text_only = model(input_ids=ids, position_ids=pos[0]).logits
    assert relative(text_only, ref) > 10 * RTOL


def test_rope_with_an_image_through_the_vision_tower_and_generate_is_exact():
    """pixel_values through the vision tower (its attention runs as before the patch), the
    model's own M-RoPE index (``mm_token_type_ids``), then greedy generation."""
    model = vl_model("qwen2_vl")
    cfg = model.config
    vision = cfg.vision_config
    grid = torch.tensor([[1, 4, 4]])  # (time, height, width) patches
    patch_values = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(16, patch_values, generator=torch.Generator().manual_seed(2))
    image = [cfg.image_token_id] * (16 // vision.spatial_merge_size**2)
    ids = torch.tensor([[5, 6, cfg.vision_start_token_id, *image, cfg.vision_end_token_id, 7, 8]])
    inputs = dict(
        input_ids=ids,
        pixel_values=pixels,
        image_grid_thw=grid,
        mm_token_type_ids=(ids == cfg.image_token_id).int(),
    )
    generate = dict(max_new_tokens=4, do_sample=False)
    with torch.no_grad():
        ref = model(**inputs).logits
        ref_tokens = model.generate(**inputs, **generate)
        with patch(model, "rope", backend="eager"):
            assert relative(model(**inputs).logits, ref) <= RTOL
            assert torch.equal(model.generate(**inputs, **generate), ref_tokens)


@pytest.mark.parametrize("method", ["self-extend", "alibi"])
def test_one_dimensional_encodings_refuse_image_positions_by_name(method):
    model = vl_model("qwen2_vl")
    ids, pos = tokens(1, 22), image_positions(1, 22)
    options = dict(group_size=2, neighbor_window=4) if method == "self-extend" else {}
    with patch(model, method, **options), torch.no_grad():
        model(input_ids=ids[:, :5], position_ids=pos[:, :, :5])  # text: every axis agrees
        with pytest.raises(ValueError, match=r"multi-axis \(M-RoPE\) position_ids that differ"):
            model(input_ids=ids, position_ids=pos)


def test_a_cache_the_model_creates_itself_keeps_the_positions_too():
    """``use_cache=True`` without a cache: the forward creates one, and its tokens'
    positions are kept for the next call."""
    model = vl_model("qwen3_vl")
    ids, pos = tokens(1, 22), image_positions(1, 22)
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits[:, -1]
        with patch(model, "rope", backend="eager"):
            out = model(input_ids=ids[:, :-1], position_ids=pos[..., :-1], use_cache=True)
            cache = out.get("cache", out.get("past_key_values"))
            assert cache is not None
            step = model(input_ids=ids[:, -1:], position_ids=pos[..., -1:], cache=cache)
    assert relative(step.logits[:, -1], ref) <= RTOL


def test_a_cache_the_patch_did_not_fill_is_refused_for_multi_axis_positions():
    """The keys' positions come from the forwards that filled the cache; a cache filled
    elsewhere (here: before the patch) has positions the patch cannot know."""
    model = vl_model("qwen2_vl")
    ids, pos = tokens(1, 22), image_positions(1, 22)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.no_grad():
        model(input_ids=ids[:, :-1], position_ids=pos[..., :-1], cache=cache)
        with patch(model, "rope"):
            with pytest.raises(ValueError, match="positions of the cached keys are not known"):
                model(input_ids=ids[:, -1:], position_ids=pos[..., -1:], cache=cache)


# ------------------------------------------------------------------------------ discovery


def test_a_rotary_module_under_another_name_is_found_and_switched_off():
    """LFM2-MoE keeps its RoPE at ``pos_emb`` and ModernBERT's decoder answers
    ``get_decoder()`` with its LM head: both RoPE modules are found by what they are
    (they hold inverse frequencies), and relpos's rope reproduces the models."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_families import check_family

    for family, class_name in [
        ("lfm2_moe", "Lfm2MoeForCausalLM"),
        ("modernbert-decoder", "ModernBertDecoderForCausalLM"),
    ]:
        outcome = check_family(family, class_name)
        assert outcome.status == "exact", outcome


def test_a_decoder_without_rope_is_refused_with_the_reason():
    """Granite-MoE-hybrid's default config turns RoPE off (``position_embedding_type``
    None, ``rotary_emb`` None): baseline runs, rope names why there is nothing to replace."""
    import transformers as tf

    cfg = tf.GraniteMoeHybridConfig(
        **{k: v for k, v in TEXT_SIZES.items() if k != "head_dim"},
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["attention", "attention"],
    )
    torch.manual_seed(0)
    model = tf.GraniteMoeHybridForCausalLM(cfg).eval()
    ids = tokens(1, 12)
    with torch.no_grad():
        ref = model(ids).logits
        with patch(model, "baseline"):
            assert torch.equal(model(ids).logits, ref)
    with pytest.raises(ValueError, match=r"computes no RoPE.*position_embedding_type=None"):
        patch(model, "rope")


# ------------------------------------------------------------------------------ Qwen4-Exp


@functools.cache
def qwen4_exp_model(indexer_budget: int):
    """Tiny Qwen4-Exp (the walk's shrunk default config: two gated-delta-net linear-attention
    layers and one indexed-attention layer with M-RoPE; float32, eval) whose query-selected-
    attention indexer keeps ``indexer_budget`` keys per query (blocks of 4), with peaked
    attention (its q and k norms scaled, see ``QK_SCALE``). Built once per budget and shared:
    the tests leave it as they found it (every ``patch`` is undone)."""
    import sys
    from pathlib import Path

    import transformers as tf

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_families import tiny_config

    cfg = tiny_config("qwen4_exp_text")
    cfg.indexer_budget = indexer_budget
    torch.manual_seed(0)
    model = tf.Qwen4ExpForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                weight.mul_(QK_SCALE)
    return model


def test_qwen4_exp_rotary_module_turns_every_cached_token_and_rope_is_exact():
    """Qwen4-Exp's decoder hands its rotary module the positions of every token its cache
    holds followed by the new ones (its indexer rotates blocks of cached keys again; the
    model keeps those positions with the cache). The patch takes them as the cached keys'
    positions: with an image's grid of positions, ``rope`` equals the unpatched model in the
    full forward and in 3 KV-cache decoding steps while the indexer keeps every key
    (``indexer_budget`` 32 of 22 tokens); ``baseline`` is bit-identical."""
    model = qwen4_exp_model(indexer_budget=32)
    ids, pos = tokens(1, 22), image_positions(1, 22)
    ref, ref_steps = forward_and_decode(model, ids, pos)
    with patch(model, "baseline"):
        base, base_steps = forward_and_decode(model, ids, pos)
    assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    with patch(model, "rope", backend="eager") as handle:
        assert handle.encoding(2).__class__.__name__ == "MRoPE"
        full, steps = forward_and_decode(model, ids, pos)
    assert relative(full, ref) <= 1e-5
    assert relative(steps, ref_steps) <= 1e-5
    # the check can fail: the same tokens at text positions (no image grid) are far off
    with torch.no_grad():
        text_only = model(input_ids=ids, position_ids=pos[:1].expand(3, -1, -1)).logits
    assert relative(text_only, ref) > 1e-3


def test_qwen4_exp_one_dimensional_encoding_decodes_as_its_full_forward():
    """No position_ids reach Qwen4-Exp's attention: a 1-D encoding takes the query
    positions from the last of those its rotary module received (every cached token's and
    the new ones), and ``self-extend`` decoding equals its own full forward."""
    model = qwen4_exp_model(indexer_budget=32)
    ids, counting = tokens(1, 16), torch.arange(16).expand(3, 1, -1)
    with patch(model, "self-extend", group_size=4, neighbor_window=6):
        full, steps = forward_and_decode(model, ids, counting)
    assert relative(steps, full[:, -STEPS:]) <= 1e-5


def test_qwen4_exp_indexer_that_drops_keys_is_refused_by_name():
    """Once the indexer keeps fewer keys than the mask allows (``indexer_budget`` 8 of 22
    tokens), its selection, scored with the RoPE the patch switches off, would not be the
    model's: refused by name; ``baseline`` (the model's RoPE) stays bit-identical."""
    model = qwen4_exp_model(indexer_budget=8)
    ids, pos = tokens(1, 22), image_positions(1, 22)
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits
        with patch(model, "baseline"):
            assert torch.equal(model(input_ids=ids, position_ids=pos).logits, ref)
        with patch(model, "rope"):
            model(input_ids=ids[:, :8], position_ids=pos[..., :8])  # every key kept: runs
            refusal = r"Qwen4ExpTextAttention hands attention a mask other than"
            with pytest.raises(ValueError, match=refusal):
                model(input_ids=ids, position_ids=pos)
