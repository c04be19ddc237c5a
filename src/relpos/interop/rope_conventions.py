"""Every production RoPE convention relpos knows: who defines it, relpos's name for it, and
how the match was checked. ``render_markdown()`` writes ``docs/rope_conventions.md``
(``python -m relpos.interop.rope_conventions > docs/rope_conventions.md``); a test keeps the
file, ``ROPE_SCALING`` and transformers' ``ROPE_INIT_FUNCTIONS`` in step with this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONVENTIONS", "Convention", "render_markdown"]


@dataclass(frozen=True)
class Convention:
    """One row: ``stack`` defines ``name``; relpos computes it as ``relpos`` (a scaling type
    ``scaling=...`` or an encoding with options), or not (``supported=False``, ``how`` gives
    the reason); ``how`` says how the match is checked."""

    stack: str
    name: str
    relpos: str
    how: str
    supported: bool = True
    scaling: str | None = None  # the ROPE_SCALING type this row covers, if any


_HF_ORACLE = "bit-identical to `ROPE_INIT_FUNCTIONS` (tests/oracle/test_oracle_hf_rope_scaling.py)"
_ENGINE = "float64 evaluation of the published formula (tests/rope_scaling/test_engine_types.py)"
_VLLM = "float64 restatement of the vLLM module (tests/rope_scaling/test_vllm_types.py)"
_GGML = "numpy restatement of ggml's CPU rope (tests/interop/test_llama_cpp_rope.py)"
_GGUF = (
    "float64 restatement of llama-context's scaling and ggml's `rope_yarn` on metadata and "
    "GGUFWriter files (tests/interop/test_gguf_scaling.py)"
)

_MROPE_LAYOUTS = (
    "float64 restatement of the vLLM module, read in vllm-project/vllm's repository "
    "(tests/encodings/rotary/test_mrope_layouts.py)"
)

CONVENTIONS: tuple[Convention, ...] = (
    # ----------------------------------------------------------------- transformers
    Convention(
        "transformers",
        "default",
        "`rope`",
        "tests/oracle/test_oracle_hf_rope.py",
        scaling="default",
    ),
    *(
        Convention("transformers", t, f'`scaling={{"rope_type": "{t}"}}`', _HF_ORACLE, scaling=t)
        for t in ("linear", "dynamic", "yarn", "llama3", "longrope", "proportional")
    ),
    Convention(
        "transformers (Hunyuan)",
        '`"dynamic"` with `alpha` (`ntk_alpha`)',
        '`scaling={"rope_type": "ntk_alpha"}` (a `"dynamic"` dict with `alpha` resolves to it)',
        "bit-identical to `compute_ntk_alpha_rope_parameters` "
        "(tests/rope_scaling/test_engine_types.py)",
        scaling="ntk_alpha",
    ),
    Convention(
        "transformers (Qwen2-VL)",
        "M-RoPE `mrope_section`",
        "`m-rope`",
        "transformers' rotary and `apply_multimodal_rotary_pos_emb` "
        "(tests/encodings/rotary/test_nd.py)",
    ),
    Convention(
        "transformers (Qwen3-VL)",
        "interleaved M-RoPE",
        "`m-rope`, `interleaved_sections=True`",
        "tests/encodings/rotary/test_nd.py",
    ),
    Convention(
        "transformers (GLM)",
        "interleaved pairs on half the head",
        '`rope`, `layout="interleaved"`, `partial_rotary_factor=0.5`',
        "the model's `apply_rotary_pos_emb` (tests/oracle/test_oracle_hf_interleaved_rope.py)",
    ),
    Convention(
        "transformers (Cohere)",
        "interleaved pairs",
        '`rope`, `layout="interleaved"`',
        "the model's `apply_rotary_pos_emb` (tests/oracle/test_oracle_hf_interleaved_rope.py)",
    ),
    Convention(
        "transformers (Gemma 4, LFM-3)",
        '`"proportional"` in a layer type of `rope_parameters`: half-split pairs over the '
        "whole head, trailing frequencies 0",
        '`rope`, `scaling={"rope_type": "proportional"}`, `partial_rotary_factor=p` (read by '
        "`relpos.interop.hf`'s probe)",
        "the family walk (docs/hf_families.md; tests/interop/test_hf_rope_types.py)",
    ),
    Convention(
        "transformers (Beam, Ergo, LFM-3)",
        "a layer type whose `rope_parameters` entry is None or absent",
        "no encoding in those layers (NoPE), read by the probe",
        "the family walk (docs/hf_families.md; tests/interop/test_hf_rope_types.py)",
    ),
    Convention(
        "transformers (HunYuanVL)",
        "`mrope_section` / `xdrope_section`: the sections split the doubled `cat(freqs, "
        "freqs)` per channel (bands of `2 * section`), so the two channels of a pair can take "
        "different position axes (not a rotation; not relative on image tokens)",
        '`m-rope`, `section_split="channels"`, `mrope_section=...` (3 or 4 axes), '
        '`scaling={"rope_type": "ntk_alpha", "alpha": alpha}` (the checkpoints\' `"dynamic"` '
        "dict with `alpha` resolves to it)",
        "transformers' `HunYuanVLRotaryEmbedding` and `apply_rotary_pos_emb` on text and image "
        "positions, 3 and 4 axes (tests/encodings/rotary/test_mrope_channel_sections.py); "
        "through `relpos.interop.hf.patch`: text positions exact, image positions refused "
        "(the model normalizes q and k after RoPE), exact without that norm "
        "(tests/interop/test_hf_hunyuan_vl.py); vLLM's XD-RoPE splits per pair (below)",
    ),
    Convention(
        "transformers (Ministral 3)",
        "`llama_4_scaling_beta` attention temperature (`rope_parameters`: queries times "
        "`1 + beta ln(1 + floor(p / original_max_position_embeddings))` after RoPE, every layer)",
        "the model's own step under the patch (`RopeFacts.model_applied`); `LlamaLM` with "
        "`LlamaConfig.query_temperature_beta=beta`, `query_temperature_length="
        "original_max_position_embeddings` (read by `from_hf`)",
        "transformers' Ministral 3, full forward and cached decode at positions across the "
        "temperature's steps (tests/interop/test_hf_from_hf_families.py); the patch: the family "
        "walk (docs/hf_families.md)",
    ),
    Convention(
        "transformers (Llama 4)",
        "`attn_temperature_tuning` (`attn_scale`, `floor_scale` in the text config): queries "
        "times `1 + attn_scale ln(1 + floor((p + 1) / floor_scale))` in the NoPE layers only, "
        "p counted from the cache length",
        "the model's own step under the patch (the NoPE layers get no encoding); `from_hf` "
        "refuses Llama 4 by name (layers without RoPE)",
        "the family walk (docs/hf_families.md)",
    ),
    # ----------------------------------------------------------------- vLLM
    # read in vLLM 0.34.0 (PyPI sdist), vllm/model_executor/layers/rotary_embedding/ unless a
    # row names another file; "earlier vLLM" rows were read in files 0.34.0 no longer has
    Convention(
        "vLLM",
        '`"default"` (`base.py`) with `partial_rotary_factor` p (or `rope_dim` r) and '
        "`is_neox_style`",
        '`rope`, `partial_rotary_factor=p` (`r / head_size`), `layout="half"` for NeoX, '
        '`"interleaved"` for GPT-J pairs (`is_neox_style=False`)',
        _VLLM,
    ),
    Convention(
        "vLLM",
        '`"linear"` (`linear_scaling_rope.py`)',
        '`scaling={"rope_type": "linear"}`',
        "same formula as transformers' type (positions / factor = frequencies / factor); "
        "the list of LoRA factors is one cache per factor, `get_rope` passes one",
    ),
    Convention(
        "vLLM",
        '`"llama3"` (`llama3_rope.py`)',
        '`scaling={"rope_type": "llama3"}`',
        "same formula as transformers' type (get_rope reads the same keys)",
    ),
    Convention(
        "vLLM",
        '`"yarn"` (`yarn_scaling_rope.py`: `beta_fast`, `beta_slow`, `mscale` with '
        "`mscale_all_dim`, `attention_factor`, `truncate`)",
        '`scaling={"rope_type": "yarn"}`',
        _VLLM + "; the same precedence of `attention_factor` over the mscale ratio as transformers",
    ),
    Convention(
        "vLLM",
        '`"telechat3-yarn"` (`transformers_utils/config.py` rewrites it; earlier vLLM: '
        "`telechat3_scaling_rope.py`)",
        '`scaling={"rope_type": "yarn", "attention_factor": 0.07 ln(factor) + 1}`',
        _VLLM,
    ),
    Convention(
        "vLLM",
        'earlier vLLM\'s `"yarn"` keys `extrapolation_factor`, `attn_factor`, `apply_yarn_scaling`'
        " (`YaRNScalingRotaryEmbedding` before 0.34.0)",
        '`scaling={"rope_type": "yarn", "extrapolation_factor": e, "attn_factor": a, '
        '"apply_yarn_scaling": ...}`: kept weight `(1 - ramp_i) e`, magnitude `(0.1 ln s + 1) a` '
        "(`a` without YaRN's factor); not together with `attention_factor` / `mscale` / "
        "`mscale_all_dim` (refused: no stack reads both families; 0.34.0's `get_rope` drops the "
        "earlier keys silently)",
        _VLLM + " of the earlier class",
    ),
    Convention(
        "vLLM",
        '`"dynamic"` with `factor` f (`dynamic_ntk_scaling_rope.py`, `max_trained_positions` L_t)',
        '`scaling={"rope_type": "ntk_alpha", "alpha": f L / L_t - (f - 1)}` with L = '
        "`get_rope`'s `max_position` (alpha 1, i.e. `rope`, without `max_trained_positions`; "
        "refused below 1, L < L_t)",
        _VLLM + "; the base is fixed at init, unlike relpos's `dynamic` (transformers', per call)",
    ),
    Convention(
        "vLLM",
        '`"dynamic"` with `alpha` (`dynamic_ntk_alpha_rope.py`)',
        '`scaling={"rope_type": "ntk_alpha"}`',
        _ENGINE,
    ),
    Convention(
        "vLLM",
        '`"ntk"` (fixed / mixed NTK, `mixed_b`; `ntk_scaling_rope.py`)',
        '`scaling={"rope_type": "ntk_mixed"}`',
        _ENGINE + "; not relpos's `ntk` (bloc97's base)",
        scaling="ntk_mixed",
    ),
    Convention(
        "relpos / bloc97",
        "NTK-aware base `b s^(d/(d-2))`",
        '`scaling={"rope_type": "ntk"}`',
        "tests/rope_scaling/test_methods.py (not vLLM's `ntk`)",
        scaling="ntk",
    ),
    Convention(
        "vLLM",
        '`"deepseek_yarn"` / `"deepseek_llama_scaling"` (`deepseek_scaling_rope.py`)',
        '`scaling={"rope_type": "deepseek_yarn"}` (either name)',
        _ENGINE + "; relpos also reads earlier vLLM's `extrapolation_factor` / `attn_factor`, "
        "which 0.34.0's `get_rope` no longer passes (leave them out)",
        scaling="deepseek_yarn",
    ),
    Convention(
        "vLLM",
        "`deepseek_llama_scaling`",
        "alias of `deepseek_yarn`",
        _ENGINE,
        scaling="deepseek_llama_scaling",
    ),
    Convention(
        "vLLM",
        '`"deepseek_yarn"` with `is_deepseek_v4` (`DeepseekV4ScalingRotaryEmbedding`)',
        '`rope`, `layout="interleaved"`, `rotary_channels="last"`, '
        "`partial_rotary_factor=rotary_dim / head_size`, "
        '`scaling={"rope_type": "deepseek_yarn", ...}`; '
        '`forward(..., inverse=True)` is `rove`\'s output rotation `rotate(x, pos, "o")` (the '
        "model's values are its rotated keys, its output is rotated back)",
        _VLLM + "; transformers' `deepseek_v4` `apply_rotary_pos_emb` and its shared key-value "
        "attention (tests/oracle/test_oracle_hf_deepseek_v4_rope.py)",
    ),
    Convention(
        "vLLM",
        '`"longrope"` / legacy `"su"` (`phi3_long_rope_scaled_rope.py`, Phi-3, Phi-4-mm)',
        '`scaling={"rope_type": "freq_factors", "freq_factors": long or short, '
        '"attention_factor": m}`: long when `max_model_len > original_max_position_embeddings`'
        ", for every position; m = `long_mscale` / `short_mscale` or `sqrt(1 + ln(L / L0) / "
        "ln L0)`, L = `max_position`. relpos's `longrope` equals it on calls on the same side "
        "of L0 when the dict has no `factor` / `attention_factor` (vLLM ignores both)",
        _VLLM + "; relpos's `longrope` picks per call (tests/interop/test_rope_cache_crossing.py)",
    ),
    Convention(
        "vLLM",
        '`"proportional"` (Gemma 4 full attention; `gemma4_rope.py`)',
        '`rope`, `scaling={"rope_type": "proportional"}`, `partial_rotary_factor=p`',
        _VLLM,
    ),
    Convention(
        "vLLM",
        '`"mllama4"` (Llama-4 vision 2-D RoPE; `llama4_vision_rope.py`)',
        '`rope-axial`, `dims=2`, `sections=[head_dim / 4] * 2`, `layout="interleaved"`, '
        "positions `(x + 1, y + 1)` per patch and `(0, 0)` for the class token",
        _VLLM,
    ),
    Convention(
        "vLLM",
        '`"default"` with `mrope_section` (and `mrope_interleaved`; legacy `"mrope"`), '
        "any `is_neox_style` and partial rotary (`mrope.py`)",
        "`m-rope`, `mrope_section`, `interleaved_sections=mrope_interleaved`, `layout`, "
        "`partial_rotary_factor`",
        _VLLM + "; transformers' Qwen2-VL / Qwen3-VL layouts (tests/encodings/rotary/test_nd.py)",
    ),
    Convention(
        "vLLM",
        '`"yarn"` with `mrope_section` (`mrope.py`)',
        '`m-rope` with `scaling={"rope_type": "yarn", "original_max_position_embeddings": '
        "k L0, ...}`, k = `get_rope`'s `mrope_positions_factor` (default 4)",
        _VLLM + ": YaRN's correction range reads the enlarged cache length k L0",
    ),
    Convention(
        "vLLM",
        '`"bailing_mrope"` (Ling / Bailing-MoE-V3; `bailing_mrope.py`)',
        '`m-rope`, `axis_of_pair=bailing_axes(mrope_section)`, `layout="interleaved"` '
        "(`relpos.encodings.rotary.mrope_layouts`; `[t, h, w]`, h = w: pairs below h + w "
        "alternate height (even) and width (odd), the rest take time; GPT-J pairs over the "
        "MLA rope channels, as `bailing_moe_v3.py` builds it)",
        _MROPE_LAYOUTS,
    ),
    Convention(
        "vLLM",
        "Ernie 4.5 VL 3-D RoPE (`ernie45_vl_rope.py`, `mrope_section=[h, w, t]`)",
        '`m-rope`, `axis_of_pair=ernie45_vl_axes(mrope_section)`, `layout="interleaved"` '
        "(Ernie's `[h, w, t]` order, h = w, t >= 1: the same alternation with a time tail)",
        _MROPE_LAYOUTS + "; transformers' `Ernie4_5_VLMoeTextRotaryEmbedding` and "
        "`apply_rotary_pos_emb` (`ernie4_5_vl_moe`)",
    ),
    Convention(
        "vLLM",
        '`"openpangu"` (`mrope_interleaved.py`; earlier vLLM: `openpangu_rope.py`)',
        '`m-rope`, `axis_of_pair=openpangu_axes(mrope_section)`, `layout="half"` '
        "(`[t, h, w]`, t >= 1: `get_mrope_interleaved_id_list`'s greedy order, rarest axis "
        "first, no immediate repeat, one time pair last, e.g. `0121201212...` for "
        "[16, 24, 24]; the two-section `[h, w]` form is refused by name)",
        _MROPE_LAYOUTS,
    ),
    Convention(
        "vLLM",
        'earlier vLLM\'s `"xdrope"` (XD-RoPE, `alpha`, `xdrope_section`; `xdrope.py`)',
        '`scaling={"rope_type": "xdrope", ...}` with `rope-hierarchical`, '
        "`levels=len(xdrope_section)`, `sections=xdrope_section`",
        _ENGINE + "; contiguous per-pair sections over one spectrum as in "
        "tests/interop/test_llama_cpp_rope.py (MROPE, 4 sections)",
        scaling="xdrope",
    ),
    Convention(
        "vLLM",
        "earlier vLLM's Grok-1 (`grok1_scaling_rope.py`, `extra_method`)",
        '`yarn_log`: `scaling={"rope_type": "freq_factors", "freq_factors": s^(1 - m_i)}` '
        '(m: YaRN\'s kept weight); `yarn` / `yarn_linear`: `{"rope_type": "yarn", '
        '"attention_factor": 1}` (the cache is not scaled); `original`: `rope`; '
        "`theta_scale`: `rope` with base `b^(ln(L s / 2 pi) / ln(L / 2 pi))`",
        _VLLM + " (the first two; the last two are plain RoPE)",
    ),
    Convention(
        "vLLM",
        "`dual_chunk_attention_config` (`chunk_size`, `local_size`; `dual_chunk_rope.py`)",
        "`dca`, `chunk_size`, `local_window=local_size`",
        "the rotary tables (tests/encodings/rotary/test_dca_vllm_config.py); the "
        "sparse-attention `*_critical` tables are not covered",
    ),
    Convention(
        "vLLM",
        '`"default"` with `use_fope` (FoPE, `fope.py`; `num_key_value_heads`, '
        "`fope_sep_head`, `num_inv_freq`, `fope_init_factor`)",
        "`fope`, `kv_heads=num_key_value_heads`, `num_inv_freq`, "
        "`init_factor=fope_init_factor`, `max_position_embeddings=max_position`, "
        '`clipped_pairs="constant-phase"` (sin of the clipped pairs padded with 1; vLLM\'s '
        'later main pads 0: `"identity"`); `fope_sep_head=False` raises in 0.34.0 (main: '
        "`separate_heads=False`); the checkpoint's `cos_coef` / `sin_coef` load as they are",
        _VLLM + " (`FourierRotaryEmbedding`'s cache and GQA view) and "
        "tests/encodings/rotary/test_fope.py (the formula, pinned values)",
    ),
    # ----------------------------------------------------------------- llama.cpp
    Convention("llama.cpp", "`LLAMA_ROPE_TYPE_NORM` (0)", '`rope`, `layout="interleaved"`', _GGML),
    Convention("llama.cpp", "`LLAMA_ROPE_TYPE_NEOX` (2)", '`rope`, `layout="half"`', _GGML),
    Convention(
        "llama.cpp",
        "`LLAMA_ROPE_TYPE_MROPE` (8)",
        "`m-rope` (`e == 0`) or `rope-hierarchical`, 4 levels (the same as `m-rope` with the "
        "four sections `mrope_section=[t, h, w, e]`, positions `(B, L, 4)`)",
        _GGML,
    ),
    Convention(
        "llama.cpp",
        "`LLAMA_ROPE_TYPE_IMROPE` (40)",
        "`m-rope`, `interleaved_sections=True`, `mrope_section=[t, h, w]` when no pair falls "
        "to the fourth position e, else the four sections `[t, h, w, e]` with positions "
        "`(B, L, 4)` (Qwen3-VL's [24, 20, 20, 0] over 64 pairs: pairs 61 and 62 on e). "
        "llama.cpp fills e with 0 for every token its language model decodes "
        "(`llama_cpp_positions`), so those pairs never turn there; transformers' Qwen3-VL "
        "turns them by t",
        _GGML[:-1] + ", with llama.cpp's position rows of text and image tokens)",
    ),
    Convention(
        "llama.cpp",
        "`GGML_ROPE_TYPE_VISION` (24)",
        '`rope-axial`, `layout="half"`, per-axis bases `b^(2 n_a / n_dims)`',
        _GGML,
    ),
    Convention(
        "llama.cpp",
        "`rope_freqs.weight` (per-pair divisors)",
        '`scaling={"rope_type": "freq_factors"}` (`load_gguf` sets it)',
        "tests/interop/test_gguf.py, tests/rope_scaling/test_engine_types.py",
        scaling="freq_factors",
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.type` linear (`scaling.factor`, or `scale_linear`; missing type = "
        "linear)",
        '`scaling={"rope_type": "linear"}`; with `rope.scaling.attn_factor != 1` or per-pair '
        'factors `scaling={"rope_type": "freq_factors", "attention_factor": a}` (the factor '
        "folded into the divisors)",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.type` yarn (`factor`, `original_context_length`, `attn_factor`, "
        "`yarn_beta_fast/slow`)",
        '`scaling={"rope_type": "yarn", "attention_factor": (1 + 0.1 ln s) a}` (llama-context'
        "'s mscale and its cancel, then `rope_yarn`'s factor)",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope_factors_long` / `rope_factors_short` (Phi-3 LongRoPE)",
        '`scaling={"rope_type": "freq_factors", "attention_factor": a}` with the factors '
        "llama.cpp picks once from its context per sequence (`load_gguf(context_length=)`)",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.yarn_ext_factor` e (negative: unset)",
        'e != 0: `scaling={"rope_type": "yarn", "extrapolation_factor": e}` (the kept weight '
        "times e; on any scaling type); e = 0: no ramp, `linear` / `freq_factors`",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.yarn_attn_factor` f",
        'without YaRN\'s ext_factor: `attention_factor` f a (`scaling={"rope_type": '
        '"freq_factors"}`); with it: replaced by YaRN\'s magnitude (llama-context)',
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.yarn_log_multiplier` L",
        "with YaRN's ext_factor: `attention_factor = get_mscale(s, 1) / get_mscale(s, L) a` "
        "(transformers' `mscale` / `mscale_all_dim` ratio); without it: not read",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF YaRN with per-pair factors (`rope_freqs.weight`, LongRoPE's), or below factor 1",
        '`scaling={"rope_type": "freq_factors", "freq_factors": ff_i / ((1 - m_i) / s + m_i), '
        "\"attention_factor\": ...}` (YaRN's blend as one divisor per pair; m_i from `yarn`'s "
        "helper)",
        _GGUF,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.scaling.alpha` (`hunyuan-dense`, `hunyuan_vl`: `src/models/hunyuan-vl.cpp`)",
        "`rope` with `base = freq_base alpha^(d / (d - 2))` (d: the key head size; the base "
        "`ntk_alpha` computes, so llama.cpp's linear / YaRN / factors compose on it); "
        "`gguf_rope_base`",
        _GGUF + "; `alpha > 0` on another architecture (whose loader ignores it) is refused",
    ),
    Convention(
        "llama.cpp",
        "GGUF scaling in the `deepseek2` graph with `kq_scale != 1 / sqrt(d)` (YaRN, a linear "
        "factor, `attn_factor != 1`)",
        "-",
        "refused by name (`relpos.interop.gguf_scaling`): `src/models/deepseek2.cpp` multiplies "
        "the softmax scale of every channel of the MLA head by mscale^2 (mscale = attn (1 + 0.1 "
        "ln s) (1 + 0.1 L ln s)); relpos's rope `attention_factor` scales the rotated channels "
        "only. Neutral files read as plain RoPE",
        supported=False,
    ),
    Convention(
        "llama.cpp",
        "GGUF `rope.freq_base_swa` / `rope.dimension_count_swa` (sliding-window layers' own "
        "base or width)",
        "-",
        "refused by name (`relpos.interop.gguf_scaling`): one relpos rope serves every layer "
        "(`rope_convention` returns one encoding; `load_gguf`'s `LlamaLM` shares one encoding "
        "across layers and has no sliding-window layers)",
        supported=False,
    ),
)


def render_markdown() -> str:
    """``docs/rope_conventions.md``: one table row per ``CONVENTIONS`` entry."""
    lines = [
        "# RoPE conventions across stacks",
        "",
        "Generated by `python -m relpos.interop.rope_conventions` from "
        "`relpos.interop.rope_conventions.CONVENTIONS`; do not edit by hand "
        "(tests/interop/test_rope_conventions.py checks it).",
        "",
        "vLLM rows were read in vLLM 0.34.0 (its PyPI source distribution), in "
        "`vllm/model_executor/layers/rotary_embedding/` unless a row names another file; rows "
        'saying "earlier vLLM" were read in vllm-project/vllm files that 0.34.0 no longer has. '
        "Beside the types, that folder holds helpers that are no RoPE type: `common.py` "
        "(`ApplyRotaryEmb`, NeoX or GPT-J pairs; the YaRN helpers), `packed_qk_rope.py` (a "
        "fused kernel rotating interleaved pairs by angles the model gives) and "
        "`mrope_vit_setup.py` (builds vision-tower M-RoPE cos / sin tables).",
        "",
        "| Defined by | Its name | relpos | Status | How it is checked |",
        "|---|---|---|---|---|",
    ]
    for c in CONVENTIONS:
        status = "exact" if c.supported else "not supported"
        lines.append(f"| {c.stack} | {c.name} | {c.relpos} | {status} | {c.how} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
