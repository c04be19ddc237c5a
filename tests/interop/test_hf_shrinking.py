"""The walker's tiny configs keep the conventions of the full-size ones (``hf_families``):
a rotary width derived from the head stays its share of the shrunk head, per-layer sizes are
cut alike (DeepSeek-V4's rotation as the probe reads it: test_hf_deepseek_v4.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import hf_families  # noqa: E402


def _rotary_width(cfg, layer_type: str | None = None) -> int:
    params = cfg.rope_parameters if layer_type is None else cfg.rope_parameters[layer_type]
    return int(cfg.head_dim * params["partial_rotary_factor"])


def test_deepseek_v4_keeps_its_rotary_part_in_the_shrunk_head():
    """DeepSeek-V4 rotates int(head_dim * 64/512) channels: shrunk to a head of 16 that
    would be 2; the walker keeps the shrunk rotary part (qk_rope_head_dim 8) instead."""
    cfg = hf_families.tiny_config("deepseek_v4")
    assert (cfg.head_dim, cfg.qk_rope_head_dim) == (16, 8)
    for layer_type in ("main", "compress"):
        assert _rotary_width(cfg, layer_type) == 8


@pytest.mark.parametrize("model_type", ["dots3_note_text", "dots3_note"])
def test_dots3_per_layer_sizes_are_cut_alike(model_type):
    """dots3's sliding-window layers override heads, latent ranks and head sizes; the tiny
    config gives every layer the tiny sizes, its head the nope and rope parts (which dots3
    validates) and rotates the rope part in both layer types."""
    cfg = hf_families.tiny_config(model_type)
    assert cfg.head_dim == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim == 16
    assert {"sliding_attention", "indexed_attention"} <= set(cfg.layer_types)
    for layer_type in ("sliding_attention", "indexed_attention"):
        assert _rotary_width(cfg, layer_type) == cfg.qk_rope_head_dim
        assert cfg.per_layer_config[layer_type].num_attention_heads == 4


def test_the_gemma4_assistant_default_config_builds():
    cfg = hf_families.tiny_config("gemma4_assistant")
    assert cfg.text_config.hidden_size_per_layer_input == 0


@pytest.mark.parametrize("model_type", ["bart", "plbart", "whisper", "prophetnet"])
def test_an_encoder_decoder_config_cuts_its_decoder_stack_like_its_encoder_stack(model_type):
    """Their causal LM is the decoder stack, and num_hidden_layers / num_attention_heads alias
    the encoder's (ProphetNet's cannot be set): the decoder's depth, heads and widths are cut
    too, so its KV cache (as deep as num_hidden_layers) holds every decoder layer and the
    shrunk width divides into its heads (PLBart's 12, Whisper's 6 would not)."""
    cfg = hf_families.tiny_config(model_type)
    side = "num_{}_layers" if model_type == "prophetnet" else "{}_layers"
    heads = "num_{}_attention_heads" if model_type == "prophetnet" else "{}_attention_heads"
    assert getattr(cfg, side.format("decoder")) == getattr(cfg, side.format("encoder"))
    assert getattr(cfg, side.format("decoder")) == cfg.num_hidden_layers == 2
    assert getattr(cfg, heads.format("decoder")) == 4
    assert cfg.decoder_ffn_dim == hf_families.SIZES["intermediate_size"]


def test_hrm_text_keeps_one_cache_slot_per_stack_layer_and_cycle():
    """HRM-Text's num_hidden_layers counts the slots of its recurrence (layers per stack x
    H_cycles x (L_cycles + 1)), derived from the layers per stack when the config is built:
    the cut gives the stacks 2 layers and the slots follow."""
    cfg = hf_families.tiny_config("hrm_text")
    assert cfg.num_layers_per_stack == 2
    assert cfg.num_hidden_layers == 2 * cfg.H_cycles * (cfg.L_cycles + 1)


def test_dorys_sections_add_up_to_the_cut_depth():
    cfg = hf_families.tiny_config("dory")
    sections = (cfg.n_input_layers, cfg.n_recurrent_layers, cfg.n_output_layers)
    assert sum(sections) == cfg.num_hidden_layers and min(sections) >= 1
    cfg.validate_architecture()


def test_zamba_keeps_two_layers_that_share_its_attention_block():
    cfg = hf_families.tiny_config("zamba")
    assert cfg.layers_block_type.count("hybrid") == 2
    assert cfg.num_hidden_layers == len(cfg.layers_block_type)
    assert cfg.attention_hidden_size == 2 * cfg.hidden_size  # derived from the shrunk width


def test_blts_local_models_project_to_its_shrunk_global_width():
    cfg = hf_families.tiny_config("blt")
    width = cfg.global_config.hidden_size
    assert cfg.encoder_config.hidden_size_global == cfg.decoder_config.hidden_size_global == width
    cross = cfg.encoder_config.hidden_size * cfg.cross_attn_k
    assert cfg.global_config.encoder_cross_output_size == (cross if cross != width else None)
    assert cfg.encoder_config.sliding_window == cfg.local_attention_window_len == 8
    assert cfg.encoder_hash_byte_group_vocab == hf_families.SIZES["vocab_size"]
