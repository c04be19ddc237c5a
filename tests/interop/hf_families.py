"""Every causal-LM family of the installed transformers through ``relpos.interop.hf.patch``.

``walk()`` builds each ``*ForCausalLM`` class of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` from a
tiny random config (its default config, shrunk: 4 heads of 16 channels, 2 key-value heads,
vocabulary 128, one layer per distinct per-layer setting, sliding windows and attention chunks
of 8; the decoder stack of an encoder-decoder config is cut like its encoder stack; a
composite config gives the text sub-config its class takes, MoE counts a default
leaves None are set, latent-attention head sizes stay consistent, a ``partial_rotary_factor``
derived from the head (``qk_rope_head_dim / head_dim``) follows the shrunk sizes, sizes set per
layer (``per_layer_config``) are cut alike, nested configs shrink too, and
``DEFAULT_ARGUMENTS`` / ``DEFAULT_OVERRIDES`` / ``SHRUNK_OVERRIDES`` fix, each with its reason,
the few default configs that cannot build a model as they are) and checks it
(``check_family``) on a left-padded batch with KV-cache decoding (in the model's own cache
class where it refuses or drops others, MiniMax's and BLT's); drafters of speculative decoding
(``STANDALONE_REFUSALS``) are built and recorded as not runnable on their own:

* ``baseline``: the patched model's logits equal the unpatched model's bit for bit;
* ``rope`` (backend ``eager``): relpos recomputes the model's own RoPE from the probed facts;
  logits equal the unpatched model's to float32 rounding (relative error <= ``RTOL``), in the
  full forward and in every decoding step;
* ``self-extend``: cached decoding equals the full forward of the same patched model;

or ``patch`` refuses by name (a ``ValueError``). The outcome of a family is ``exact``,
``refused`` (with the reason), ``not buildable`` (with why), ``no rope`` (the built model has
no rotary module: out of scope, not run) or ``FAILED`` (a silent difference or a raw
exception).

``python -m hf_families`` (from ``tests/interop``, ``PYTHONPATH=src``) or
``python tests/interop/hf_families.py`` writes ``docs/hf_families.md`` from the results.
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)
#: set only where the default config has the key (not None)
OPTIONAL_SIZES = dict(
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    n_group=1,
    topk_group=1,
    sliding_window=8,
    attention_chunk_size=8,
    rotary_dim=8,
    qk_head_dim=None,  # placeholder: derived below from the nope and rope parts
    # Mamba-2 blocks of hybrids: heads x head size = expand x hidden size
    mamba_n_heads=2,
    mamba_d_head=64,
    mamba_d_ssm=128,
    mamba_d_state=16,
    mamba_chunk_size=8,
    # the two stacks of encoder-decoder configs (BART's decoder_attention_heads; their causal
    # LM is the decoder stack, which num_attention_heads, an alias of the encoder's, misses)
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    num_encoder_attention_heads=4,
    num_decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    local_attention_window_len=8,  # BLT's local encoder window
)
#: the depth of each stack of an encoder-decoder config, set where the config has it, to the
#: cut depth (BART's num_hidden_layers is an alias of encoder_layers, and the decoder's KV
#: cache has that many layers; ProphetNet's num_hidden_layers cannot be set)
STACK_DEPTHS = ("encoder_layers", "decoder_layers", "num_encoder_layers", "num_decoder_layers")
SPECIAL_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
MAX_LAYERS = 4
RTOL = 1e-4
SELF_EXTEND = dict(group_size=4, neighbor_window=6)
PAD = 3
LENGTH = 20
STEPS = 3
BUILD_SECONDS = 120
#: one family per RoPE convention or attention feature, for the fast tier
REPRESENTATIVES = (
    "llama",  # half-split pairs
    "cohere",  # interleaved pairs
    "glm",  # interleaved pairs in the first half of the head (partial rotary)
    "nanochat",  # half-split pairs rotated the other way (a channel permutation)
    "phi3",  # half-split partial rotary
    "gemma3_text",  # per-layer-type RoPE, sliding window
    "llama4_text",  # NoPE layers, chunked attention, complex rotation
    "ministral3",  # YaRN with Llama-4's attention temperature
    "persimmon",  # no position_ids reach attention
    "deepseek_v3",  # rotated channels at the end of the head (MLA)
    "gemma2",  # attention-logit softcapping
    "gpt_oss",  # attention sinks (s_aux)
    "falcon",  # _supports_attention_backend False, yet its attention calls the interface
    "gpt_neox_japanese",  # computes attention itself: refused, naming the layer
    "roformer",  # a sin | cos table per head, attention computed without the interface: refused
    "cohere_compass_text",  # interleaved M-RoPE sections per layer type, text positions
    "dory",  # a recurrent section run twice per forward, one KV cache per loop
    "hrm_text",  # two stacks called in several cycles per forward, a cache slot per call
)


@dataclass(frozen=True)
class Outcome:
    family: str
    model_class: str
    status: str  # exact | refused | not buildable | no rope | FAILED
    detail: str = ""


def families() -> list[tuple[str, str]]:
    """``(model_type, class name)`` of every ``*ForCausalLM`` class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(
        (model_type, name)
        for model_type, name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
        if isinstance(name, str) and name.endswith("ForCausalLM")
    )


#: MoE counts a MoE default config may leave None (the model picks them from checkpoints):
#: set where the config has the attribute and is a mixture of experts
MOE_COUNTS = dict(
    num_experts_per_tok=2,
    n_routed_experts=4,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
)
#: keys whose presence (not None) makes a config a mixture of experts
MOE_MARKERS = ("moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts")


def _override_dbrx(cfg) -> None:
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not declare
    # (checkpoints carry it in their attn_config); the rotary module reads rope_parameters
    cfg.attn_config.rope_theta = cfg.rope_parameters["rope_theta"]
    # clip_qkv None makes its forward call clamp(None, None), which torch rejects; the DBRX
    # checkpoints clip at 8
    cfg.attn_config.clip_qkv = 8.0


def _override_cohere_compass_text(cfg) -> None:
    # CohereCompassTextConfig() has no rope_parameters, and its rotary module reads one entry
    # per layer type (with M-RoPE sections, which text positions make one ordinary RoPE)
    half = cfg.head_dim // 2
    sections = [half - 2 * (half // 4), half // 4, half // 4]
    cfg.rope_parameters = {
        t: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
        for t in set(cfg.layer_types)
    }


def _override_lfm2_moe(cfg) -> None:
    # Lfm2MoeConfig() leaves layer_types None, which its decoder layers index; checkpoints
    # list short-convolution and attention layers
    cfg.layer_types = ["conv", "full_attention"] * (cfg.num_hidden_layers // 2)


def _override_all_mamba(cfg) -> None:
    # the default config has Mamba layers only (checkpoints place attention layers among
    # them): make the second of the two layers attention, the RoPE under test
    if hasattr(cfg, "attn_layer_indices"):
        cfg.attn_layer_indices = [1]
    else:
        cfg.layer_types = ["linear_attention", "full_attention"]


def _override_qwen4_exp(cfg) -> None:
    # the query-selected-attention indexer sizes default to None, which its layers divide;
    # checkpoints set them (one key head, a budget that is a multiple of the compression)
    cfg.indexer_n_heads, cfg.indexer_kv_heads, cfg.indexer_head_dim = 2, 1, 16
    cfg.indexer_budget, cfg.indexer_compress_ratio = 8, 4


def _rederived(cfg):
    """``cfg`` built again from its values, so that sizes its ``__post_init__`` derives
    (Zamba2's Mamba head size and hybrid layer ids; HRM-Text's layers per stack, from which
    it sets num_hidden_layers to one KV-cache slot per stack layer and recurrence cycle)
    follow the shrunk ones."""
    values = cfg.to_dict()
    derived = ("hybrid_layer_ids", "mamba_headdim", "attention_head_dim", "attention_hidden_size")
    for key in (*derived, "num_layers_per_stack"):
        values.pop(key, None)
    return type(cfg)(**values)


def _override_zamba(cfg):
    # one attention block whose weights all hybrid layers share (tied from the first to the
    # others): the model is built only with two hybrid layers or more, and the cut keeps one
    cfg.layers_block_type = [*cfg.layers_block_type, "hybrid"]
    cfg.num_hidden_layers = len(cfg.layers_block_type)
    cfg.mamba_dt_rank = "auto"  # the default: derived from the (shrunk) hidden size
    # its attention width (twice the hidden size: the input concatenated with the Mamba
    # stream's) and head size are derived from the hidden size as well
    return _rederived(cfg)


def _override_dory(cfg) -> None:
    # its layers are three sections, input, recurrent (run n_recurrent_loops times, with a KV
    # cache per loop) and output, whose sizes must add up to the depth (8 + 20 + 8 of 36 by
    # default, which the cut depth no longer holds): one input and one recurrent layer, the
    # rest output
    cfg.n_input_layers, cfg.n_recurrent_layers = 1, 1
    cfg.n_output_layers = cfg.num_hidden_layers - 2


def _override_blt(cfg):
    # the local encoder and decoder project to and from the global transformer's width
    # (hidden_size_global), which the walker shrinks in the global config only
    for local in (cfg.encoder_config, cfg.decoder_config):
        local.hidden_size_global = cfg.global_config.hidden_size
    # six hash n-gram embedding tables of 500002 rows each: as many rows as the vocabulary
    cfg.encoder_hash_byte_group_vocab = SIZES["vocab_size"]
    # its four transformers are sub-configs with their own depths (patcher 14, local encoder
    # 1, global 25, local decoder 9): cut to at most 2 each. BltConfig declares no depth of
    # its own, yet its KV caches are DynamicCache(config=...) of it, which reads one: the
    # local encoder's self-attention cache and the local decoder's (named cross-attention)
    # take as many layers as the deeper of the two
    for sub in (cfg.patcher_config, cfg.encoder_config, cfg.global_config, cfg.decoder_config):
        sub.num_hidden_layers = min(sub.num_hidden_layers, 2)
    cfg.num_hidden_layers = max(
        cfg.encoder_config.num_hidden_layers, cfg.decoder_config.num_hidden_layers
    )
    # built again: its __post_init__ derives the global transformer's input projection from
    # the encoder's width times cross_attn_k, and the encoder's window from
    # local_attention_window_len
    return _rederived(cfg)


def _override_gemma3n_text(cfg) -> None:
    # its last num_kv_shared_layers layers reuse the caches of earlier layers of their type;
    # counted in layers of the full depth, that no longer fits the cut one
    cfg.num_kv_shared_layers = 0


#: model type -> a fix of its default config, applied before shrinking (reason in each fix)
DEFAULT_OVERRIDES = {
    "dbrx": _override_dbrx,
    "cohere_compass_text": _override_cohere_compass_text,
    "lfm2_moe": _override_lfm2_moe,
    "qwen4_exp": _override_qwen4_exp,
    "qwen4_exp_text": _override_qwen4_exp,
    "gemma3n_text": _override_gemma3n_text,
}
#: Gemma-4's speculative-decoding assistant validates that its text config has no per-layer
#: inputs, MoE block or double-wide MLP, which the default Gemma-4 text config has
_GEMMA4_ASSISTANT_TEXT = dict(
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=0,
    enable_moe_block=False,
    use_double_wide_mlp=False,
)
#: model type -> keyword arguments its default config cannot be built without (reason above)
DEFAULT_ARGUMENTS = {"gemma4_assistant": dict(text_config=_GEMMA4_ASSISTANT_TEXT)}
#: model type -> why its tiny model cannot run the walk's check on its own: drafters of
#: speculative decoding attend only to the key-value states of a target model
#: (``shared_kv_states``, every layer kv-shared), which a standalone tiny model has none of
STANDALONE_REFUSALS = {
    t: (
        "a speculative-decoding assistant: its forward needs a target model's "
        "shared_kv_states (every layer reads the target's keys), no decoding of its own"
    )
    for t in ("gemma4_assistant", "gemma4_unified_assistant")
}


def _own_cache(model):
    """The KV cache the walk decodes with: the model's own cache class where it refuses
    others (MiniMax's ``MiniMaxCache``) or would lose part of it (BLT wraps any other cache
    in an ``EncoderDecoderCache`` with a new second cache, its local decoder's, on every
    call), else a ``DynamicCache`` of its config."""
    from transformers import DynamicCache, EncoderDecoderCache

    if model.config.model_type == "minimax":
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()
    if model.config.model_type == "blt":
        return EncoderDecoderCache(
            DynamicCache(config=model.config), DynamicCache(config=model.config)
        )
    return DynamicCache(config=model.config)


#: model type -> applied to the shrunk config (returns the config to use, or None: the same)
SHRUNK_OVERRIDES = {
    "zamba2": _rederived,
    "hrm_text": _rederived,
    "zamba": _override_zamba,
    "dory": _override_dory,
    "blt": _override_blt,
    "bamba": _override_all_mamba,
    "granitemoehybrid": _override_all_mamba,
}


def default_config(model_type: str):
    """The default config of ``model_type`` as its ``*ForCausalLM`` class takes it: the text
    sub-config where the class is built from one (``AutoModelForCausalLM.from_config`` does the
    same with ``get_text_config``)."""
    import transformers
    from transformers import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[model_type](**DEFAULT_ARGUMENTS.get(model_type, {}))
    cls = getattr(transformers, dict(families()).get(model_type, ""), None)
    wanted = getattr(cls, "config_class", None)
    if wanted is not None and not isinstance(cfg, wanted):
        for key, sub_class in getattr(cfg, "sub_configs", {}).items():
            if sub_class is wanted and isinstance(getattr(cfg, key, None), wanted):
                return getattr(cfg, key)
    return cfg


def _has(cfg, key: str) -> bool:
    """Whether ``cfg`` has ``key`` set (not None); per-layer attributes of heterogeneous
    configs raise on access and count as absent."""
    try:
        return getattr(cfg, key, None) is not None
    except Exception:  # noqa: BLE001 - transformers' per-layer attribute guard
        return False


def _per_layer_guard(cfg, key: str) -> bool:
    """Whether reading ``key`` raises transformers' per-layer attribute guard."""
    try:
        getattr(cfg, key, None)
    except AttributeError:
        return False
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError
        return True
    return False


def _shrink(cfg, sizes: dict, optional: dict) -> None:
    for key, value in {**sizes, **optional}.items():
        if value is not None and (key in sizes or _has(cfg, key)):
            current = getattr(cfg, key, None) if _has(cfg, key) else None
            if isinstance(current, list) and all(isinstance(v, int) for v in current):
                value = [value] * len(current)  # a size per layer (Gemma-3n's MLP widths)
            with contextlib.suppress(Exception):
                setattr(cfg, key, value)


def partial_rotary_factors(cfg) -> list[float]:
    """Every ``partial_rotary_factor`` of the config: its own and those of its
    ``rope_parameters`` (one dict, or one per layer type)."""
    found = [getattr(cfg, "partial_rotary_factor", None)]
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict):
        nested = [v for v in rope.values() if isinstance(v, dict)]
        for params in nested or [rope]:
            found.append(params.get("partial_rotary_factor"))
    return [float(f) for f in found if isinstance(f, (int, float)) and 0 < f < 1]


def _rotary_share(cfg) -> float | None:
    """``qk_rope_head_dim / head_dim`` where the config has both (None otherwise): a
    ``partial_rotary_factor`` equal to it is derived from the two sizes (DeepSeek-V4: 64 of
    512, dots3: 64 of 256), and must follow them when they shrink."""
    if _has(cfg, "qk_rope_head_dim") and _has(cfg, "head_dim"):
        return cfg.qk_rope_head_dim / cfg.head_dim
    return None


def _rescale_derived_factors(cfg, share: float | None) -> None:
    """Every ``partial_rotary_factor`` of the config (its own and those of its
    ``rope_parameters``) that was the default's ``share`` set to the shrunk config's, so the
    shrunk rotary part ``int(head_dim * p)`` stays ``qk_rope_head_dim`` (else 16 * 64/512
    rotates 2 channels, or 1)."""
    new = _rotary_share(cfg)
    if share is None or new is None:
        return
    if _has(cfg, "partial_rotary_factor") and math.isclose(cfg.partial_rotary_factor, share):
        cfg.partial_rotary_factor = new
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict):
        for params in [v for v in rope.values() if isinstance(v, dict)] or [rope]:
            factor = params.get("partial_rotary_factor")
            if isinstance(factor, (int, float)) and math.isclose(factor, share):
                params["partial_rotary_factor"] = new


def _explicit_per_layer(cfg) -> dict[int, dict]:
    """The per-layer overrides of a heterogeneous config (transformers' ``per_layer_config``),
    every attribute of each overridden layer, by layer index."""
    from transformers.integrations.heterogeneity.configuration_utils import (
        _get_explicit_per_layer_overrides,
    )

    return {int(i): dict(v) for i, v in _get_explicit_per_layer_overrides(cfg).items()}


def homogeneous(cfg):
    """A heterogeneous config (sizes set per layer through ``per_layer_config``: dots3's
    sliding-window layers have other head counts, latent ranks and head sizes) built again
    from its global values with the per-layer overrides of the sizes the walker shrinks
    dropped: shrinking gives every layer the same tiny sizes, so those overrides would only
    repeat them. Other per-layer overrides stay. Where an overridden layer's head is its
    nope and rope parts (``head_dim = qk_nope_head_dim + qk_rope_head_dim``, which dots3
    validates for its sliding layers), the config is marked so that the shrunk head keeps
    that relation (``_HEAD_IS_NOPE_PLUS_ROPE``)."""
    sized = set(SIZES) | set(OPTIONAL_SIZES) | {"head_dim", "num_hidden_layers"}
    layers = _explicit_per_layer(cfg)
    split_head = any(
        {"head_dim", "qk_nope_head_dim", "qk_rope_head_dim"} <= set(o)
        and o["head_dim"] == o["qk_nope_head_dim"] + o["qk_rope_head_dim"]
        for o in layers.values()
    )
    kept = {i: {k: v for k, v in o.items() if k not in sized} for i, o in layers.items()}
    kept = {i: o for i, o in kept.items() if o}
    values = cfg.to_dict()
    values.pop("per_layer_config", None)
    # the global sizes shrunk before the config is built again: its validation holds every
    # layer, the formerly overridden ones included, to the relations of the tiny sizes
    for key, value in {**SIZES, **OPTIONAL_SIZES}.items():
        if value is not None and (key in SIZES or values.get(key) is not None):
            values[key] = value
    if split_head:
        values["head_dim"] = values["qk_nope_head_dim"] + values["qk_rope_head_dim"]
    if values.get("kv_lora_rank") is not None:
        values["num_key_value_heads"] = values["num_attention_heads"]  # latent keys
    rebuilt = type(cfg)(**values, per_layer_config=kept)
    if split_head:
        rebuilt.__dict__[_HEAD_IS_NOPE_PLUS_ROPE] = True
    return rebuilt


#: marks a config whose shrunk head must be its nope plus rope parts (``homogeneous``)
_HEAD_IS_NOPE_PLUS_ROPE = "_walker_head_is_nope_plus_rope"


def even_rotary_head_dim(head_dim: int, factors: list[float]) -> int:
    """The smallest head size from ``head_dim`` up (in steps of 16) whose rotary part
    ``int(head_dim * f)`` is even and at least 2 for every factor. A shrunk head of 16 with
    MiMo's 0.334 rotates ``int(5.3) = 5`` channels, an odd width the full-size model (192 ->
    64) never has: the tiny model would test a convention of the walker's making."""
    size = head_dim
    while size < 256 and any(int(size * f) % 2 or int(size * f) < 2 for f in factors):
        size += 16
    return size if size < 256 else head_dim


def tiny_config(model_type: str):
    """The default config of ``model_type``, shrunk (module docstring)."""
    cfg = default_config(model_type)
    if model_type in DEFAULT_OVERRIDES:
        DEFAULT_OVERRIDES[model_type](cfg)
    if any(_per_layer_guard(cfg, k) for k in OPTIONAL_SIZES):
        cfg = homogeneous(cfg)  # sizes set per layer: cut them all alike
    depth = getattr(cfg, "num_hidden_layers", None)
    share = _rotary_share(cfg)
    split_head = cfg.__dict__.get(_HEAD_IS_NOPE_PLUS_ROPE, False) or (
        _has(cfg, "qk_nope_head_dim")
        and _has(cfg, "qk_rope_head_dim")
        and _has(cfg, "head_dim")
        and cfg.head_dim == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    )
    _shrink(cfg, SIZES, OPTIONAL_SIZES)
    if any(_has(cfg, key) for key in MOE_MARKERS):
        _shrink(cfg, {}, {k: v for k, v in MOE_COUNTS.items() if k in vars(cfg)})
        for key, value in MOE_COUNTS.items():
            if key in vars(cfg) and vars(cfg)[key] is None:
                setattr(cfg, key, value)
    for sub_config in vars(cfg).values():  # nested configs (DBRX's FFN): the same sizes
        if hasattr(sub_config, "to_dict") and hasattr(sub_config, "hidden_size"):
            _shrink(sub_config, {}, SIZES)
    if _has(cfg, "qk_rope_head_dim") and _has(cfg, "qk_nope_head_dim"):
        # multi-head latent attention: the head is the rotary part (DeepSeek-V3), or the
        # nope and rope parts where the default's head is their sum (dots3)
        rope_part = cfg.qk_rope_head_dim
        cfg.head_dim = cfg.qk_nope_head_dim + rope_part if split_head else rope_part
        if "qk_head_dim" in vars(cfg):
            cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    # a rotary width derived from the head (DeepSeek-V4 rotates int(head_dim * 64/512)):
    # the factor that keeps the shrunk rotary part in the shrunk head
    _rescale_derived_factors(cfg, share)
    if _has(cfg, "kv_lora_rank"):
        cfg.num_key_value_heads = cfg.num_attention_heads  # latent keys: one per query head
    elif _has(cfg, "head_dim"):
        head_dim = even_rotary_head_dim(cfg.head_dim, partial_rotary_factors(cfg))
        if head_dim != cfg.head_dim:  # (Falcon's head_dim is a read-only property)
            cfg.head_dim = head_dim
    for key, value in SPECIAL_TOKENS.items():
        current = getattr(cfg, key, None)
        if current is None or isinstance(current, list) or current >= SIZES["vocab_size"]:
            with contextlib.suppress(Exception):
                setattr(cfg, key, value)
    per_layer = {
        k: v for k, v in vars(cfg).items() if isinstance(v, list) and depth and len(v) == depth
    }
    # one layer per distinct per-layer setting (layer types, NoPE flags, ...), at least 2
    keep: list[int] = []
    seen: set = set()
    for i in range(depth or 0):
        row = tuple(repr(v[i]) for v in per_layer.values())
        if row not in seen:
            seen.add(row)
            keep.append(i)
    keep = sorted(set(keep[:MAX_LAYERS]) | {0, 1})[:MAX_LAYERS]
    derived_types = getattr(cfg, "layer_types", None) if "layer_types" not in vars(cfg) else None
    if not per_layer and isinstance(derived_types, list) and len(derived_types) == depth:
        # layer types computed from a period (Jamba, RecurrentGemma): the shortest prefix
        # that has every type
        first = {t: derived_types.index(t) for t in derived_types}
        keep = list(range(max(2, max(first.values()) + 1)))
    for key in STACK_DEPTHS:
        if _has(cfg, key):
            setattr(cfg, key, len(keep))
    if getattr(cfg, "num_hidden_layers", None) != len(keep):
        cfg.num_hidden_layers = len(keep)
    for key, values in per_layer.items():
        setattr(cfg, key, [values[i] for i in keep])
    if model_type in SHRUNK_OVERRIDES:
        cfg = SHRUNK_OVERRIDES[model_type](cfg) or cfg
    return cfg


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout(f"took over {BUILD_SECONDS} s")


def build(model_type: str, class_name: str):
    """The tiny model (float32, eval, seed 0); raises what building raised."""
    import transformers

    cls = getattr(transformers, class_name)
    cfg = tiny_config(model_type)
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    model.generation_config.pad_token_id = 0
    if model_type in STANDALONE_REFUSALS:
        raise NotImplementedError(STANDALONE_REFUSALS[model_type])
    return model


def _inputs(length: int = LENGTH):
    """A left-padded batch of ``length`` tokens (``hf_tiny.left_padded``, ``PAD`` pads)."""
    from hf_tiny import left_padded

    gen = torch.Generator().manual_seed(1)
    return left_padded(torch.randint(3, SIZES["vocab_size"], (1, length), generator=gen), PAD)


def _forward_and_decode(model, batch, mask, pos):
    """``(full, steps)``: logits of the full forward, and of the last ``STEPS`` positions
    decoded one at a time with the KV cache after a prefill of the rest."""
    length = batch.shape[1]
    with torch.no_grad():
        full = model(batch, attention_mask=mask, position_ids=pos).logits
        cache = _own_cache(model)
        start = length - STEPS
        model(
            batch[:, :start],
            attention_mask=mask[:, :start],
            position_ids=pos[:, :start],
            cache=cache,
            use_cache=True,
        )
        steps = []
        for t in range(start, length):
            out = model(
                batch[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            steps.append(out.logits[:, -1])
    return full, torch.stack(steps, 1)


def _real(x: torch.Tensor) -> torch.Tensor:
    """The logits of real (not pad) tokens: row 0 whole, row 1 after its pads."""
    return torch.cat([x[0].flatten(), x[1, PAD:].flatten()])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = _real(a), _real(b)
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _computes_rope(model) -> bool:
    """Whether ``model`` has a rotary module: one named ``rotary_emb`` (where the patch looks)
    or any ``*RotaryEmbedding`` (LFM2-MoE's ``pos_emb``), which the patch must then refuse."""
    from relpos.interop.hf.probe import rotary_modules

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    return (
        bool(rotary_modules(model))
        or hasattr(decoder, "rotary_emb")
        or any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules())
    )


def check_family(model_type: str, class_name: str) -> Outcome:
    """The outcome of one family (module docstring)."""
    from relpos.interop.hf import patch

    def outcome(status: str, detail: str = "") -> Outcome:
        return Outcome(model_type, class_name, status, detail.replace("\n", " ").strip())

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(BUILD_SECONDS)
    try:
        model = build(model_type, class_name)
        # judged on the built model: a family without RoPE is out of scope whether or not
        # it decodes as the walk does (CPM-Ant takes the whole sequence at every step)
        if not _computes_rope(model):
            return outcome("no rope", "no rotary embedding module")
        batch, mask, pos = _inputs()
        ref, ref_steps = _forward_and_decode(model, batch, mask, pos)
    except Exception as err:  # noqa: BLE001 - recorded as the reason it cannot be built
        return outcome("not buildable", f"{type(err).__name__}: {str(err)[:160]}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    try:
        with patch(model, "baseline"):
            base, base_steps = _forward_and_decode(model, batch, mask, pos)
        if not (torch.equal(base, ref) and torch.equal(base_steps, ref_steps)):
            return outcome("FAILED", "baseline differs from the unpatched model")
        with patch(model, "rope", backend="eager"):
            rope, rope_steps = _forward_and_decode(model, batch, mask, pos)
        err = max(_relative(rope, ref), _relative(rope_steps, ref_steps))
        if not err <= RTOL:
            return outcome("FAILED", f"rope differs from the unpatched model by {err:.2e}")
        own = _relative(ref_steps, ref[:, LENGTH - STEPS :])
        with patch(model, "self-extend", **SELF_EXTEND):
            full, steps = _forward_and_decode(model, batch, mask, pos)
        se_err = _relative(steps, full[:, LENGTH - STEPS :])
        if not own <= RTOL:
            # the unpatched model's own decoding differs from its forward (Moshi's sliding
            # window applies in its cache only): self-extend cannot be held to more
            return outcome(
                "exact",
                f"rope {err:.1e}; the unpatched model's own decoding differs from its forward "
                f"by {own:.1e}, so self-extend decoding (off by {se_err:.1e}) is not checked",
            )
        if not se_err <= RTOL:
            return outcome("FAILED", f"self-extend decoding differs from its forward: {se_err:.2e}")
    except ValueError as err:
        return outcome("refused", str(err))
    except Exception as err:  # noqa: BLE001 - a raw exception is a failure of the patch
        return outcome("FAILED", f"{type(err).__name__}: {str(err)[:200]}")
    return outcome("exact", f"rope {err:.1e}, self-extend decode {se_err:.1e}")


def walk(selected: tuple[str, ...] | None = None, progress: bool = False) -> list[Outcome]:
    """The outcome of every family (or of the ``selected`` model types)."""
    import transformers

    transformers.logging.set_verbosity_error()
    results = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        for model_type, class_name in families():
            if selected is not None and model_type not in selected:
                continue
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                results.append(check_family(model_type, class_name))
            if progress:
                r = results[-1]
                print(f"{r.family:28s} {r.status:14s} {r.detail[:110]}", flush=True)
    finally:
        torch.set_num_threads(threads)
    return results


def table(results: list[Outcome]) -> str:
    """``docs/hf_families.md``: the counts and one row per family."""
    import transformers

    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    order = ("exact", "refused", "FAILED", "not buildable", "no rope")
    lines = [
        "# transformers causal-LM families under `relpos.interop.hf.patch`",
        "",
        f"Generated by `tests/interop/hf_families.py` (transformers {transformers.__version__}, "
        f"torch {torch.__version__}); do not edit by hand. Each `*ForCausalLM` class is built "
        "from its default config shrunk to a tiny random model and checked on a left-padded "
        "batch with KV-cache decoding: `baseline` bit-identical to the unpatched model, `rope` "
        "(relpos recomputing the model's own RoPE from the probed facts, eager backend) equal "
        f"to it within relative error {RTOL:g}, `self-extend` decoding equal to its full "
        "forward; or a refusal by name. See hf_interop.md for how the probe works and why "
        "the refused families are refused.",
        "",
        "| outcome | families |",
        "|---|---|",
        *(f"| {s} | {counts[s]} |" for s in order if s in counts),
        "",
        "| family | class | outcome | detail |",
        "|---|---|---|---|",
    ]
    for status in order:
        for r in results:
            if r.status == status:
                detail = r.detail.replace("|", "\\|")
                lines.append(f"| {r.family} | {r.model_class} | {r.status} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    selected = tuple(argv) or None
    results = walk(selected, progress=True)
    if selected is None:
        out = Path(__file__).resolve().parents[2] / "docs" / "hf_families.md"
        out.write_text(table(results), encoding="utf-8")
        print(f"wrote {out}")
    return 1 if any(r.status == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
