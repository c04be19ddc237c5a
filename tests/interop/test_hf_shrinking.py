"""The walker's tiny configs keep the conventions of the full-size ones (``hf_families``):
a rotary width derived from the head stays its share of the shrunk head, per-layer sizes are
cut alike, and the probe reads DeepSeek-V4's rotation of the last channels from the model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402

from relpos.interop.hf import inspect_model  # noqa: E402


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


def _deepseek_v4(same_base: bool, layer_types: list[str] | None = None):
    cfg = hf_families.tiny_config("deepseek_v4")
    if layer_types is not None:
        cfg.layer_types = layer_types
    if same_base:  # one base for both rope labels: what the config read cannot tell apart
        cfg.rope_parameters["compress"]["rope_theta"] = cfg.rope_parameters["main"]["rope_theta"]
        cfg.compress_rope_theta = cfg.rope_theta
    import transformers

    torch.manual_seed(0)
    return transformers.DeepseekV4ForCausalLM(cfg).eval()


@pytest.mark.slow
def test_the_probe_reads_deepseek_v4s_last_channel_pairs():
    """Interleaved pairs in the last 8 of 16 channels: read from the model as relpos's
    half layout over the permuted head (pairs (8, 9), (10, 11), ... first), the first 8
    channels passing through. Heavily compressed layers only (one compressed key per 128
    tokens: none in the probe's rows); a compressed-sparse layer (one per 4) appends
    compressed keys, which the probe refuses by name."""
    hca = ["heavily_compressed_attention"] * 4
    layers = inspect_model(_deepseek_v4(same_base=True, layer_types=hca), probe=True).layers
    for layer in layers:
        assert (layer.layout, layer.rotary_dim) == ("half", 8)
        assert layer.permutation == (8, 10, 12, 14, 9, 11, 13, 15, *range(8))
    with pytest.raises(ValueError, match="layer 2: attends with .* not one per token"):
        inspect_model(_deepseek_v4(same_base=True), probe=True)


@pytest.mark.slow
def test_deepseek_v4s_compressed_layer_rope_is_refused_with_the_measured_turns():
    """The config's rope_parameters are keyed by rope labels ("main", "compress"), not by
    layer types; the compressed layers turn at compress_rope_theta (160000), which the
    refusal shows next to what relpos read (10000)."""
    with pytest.raises(ValueError, match=r"turns its pairs by \[1, 0\.05, 0\.0025"):
        inspect_model(_deepseek_v4(same_base=False), probe=True)
