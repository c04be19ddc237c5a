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
_GGML = "numpy restatement of ggml's CPU rope (tests/interop/test_llama_cpp_rope.py)"
_GGUF = (
    "float64 restatement of llama-context's scaling and ggml's `rope_yarn` on metadata and "
    "GGUFWriter files (tests/interop/test_gguf_scaling.py)"
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
        "`mrope_section` / `xdrope_section`",
        "-",
        "not supported: the sections split the doubled `cat(freqs, freqs)` per channel, "
        "so the two channels of a pair can take different position axes (not a rotation); "
        "vLLM's XD-RoPE splits per pair (below). Text tokens are plain `ntk_alpha` RoPE",
        supported=False,
    ),
    Convention(
        "transformers (Llama 4, Ministral 3)",
        "`llama_4_scaling_beta` attention temperature",
        "-",
        "not a relpos scaling: the model scales its queries by the temperature after "
        "RoPE, outside attention, so the patch keeps the model's step "
        "(`RopeFacts.model_applied`); Ministral 3 exact in the family walk "
        "(docs/hf_families.md). `from_hf` refuses it by name: `LlamaLM` has no such step",
        supported=False,
    ),
    # ----------------------------------------------------------------- vLLM
    *(
        Convention(
            "vLLM",
            t,
            f'`scaling={{"rope_type": "{t}"}}`',
            "same formula as transformers' type (get_rope reads the same keys)",
        )
        for t in ("linear", "llama3", "yarn")
    ),
    Convention(
        "vLLM",
        '`"yarn"` keys `extrapolation_factor`, `attn_factor`, `apply_yarn_scaling`',
        "-",
        "not supported: refused as unknown keys of `yarn` (use `deepseek_yarn` for the first two)",
        supported=False,
    ),
    Convention(
        "vLLM",
        '`"dynamic"` with `factor`',
        "`rope` without scaling",
        "read (`dynamic_ntk_scaling_rope.py`): the base is `b * (L f / L - (f - 1))^(d/(d-2))"
        " = b`, so vLLM's frequencies never change; relpos's `dynamic` follows "
        "transformers instead",
    ),
    Convention("vLLM", '`"dynamic"` with `alpha`', '`scaling={"rope_type": "ntk_alpha"}`', _ENGINE),
    Convention(
        "vLLM",
        '`"ntk"` (fixed / mixed NTK, `mixed_b`)',
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
        '`"deepseek_yarn"` / `"deepseek_llama_scaling"`',
        '`scaling={"rope_type": "deepseek_yarn"}` (either name)',
        _ENGINE,
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
        '`"longrope"`',
        '`scaling={"rope_type": "longrope"}`',
        "same factors; vLLM picks long or short once from `max_model_len`, relpos per call "
        "(tests/interop/test_rope_cache_crossing.py); `short_mscale` / `long_mscale` are "
        "refused as unknown keys",
    ),
    Convention(
        "vLLM",
        '`"xdrope"` (XD-RoPE, `alpha`, `xdrope_section`)',
        '`scaling={"rope_type": "xdrope", ...}` with `rope-hierarchical`, '
        "`levels=len(xdrope_section)`, `sections=xdrope_section`",
        _ENGINE + "; contiguous per-pair sections over one spectrum as in "
        "tests/interop/test_llama_cpp_rope.py (MROPE, 4 sections)",
        scaling="xdrope",
    ),
    Convention(
        "vLLM",
        "`mrope_section`, `mrope_interleaved`",
        "`m-rope`",
        "same layouts as transformers' Qwen2-VL / Qwen3-VL",
    ),
    Convention(
        "vLLM",
        "`dual_chunk_attention_config` (`chunk_size`, `local_size`)",
        "`dca`, `chunk_size`, `local_window=local_size`",
        "the rotary tables (tests/encodings/rotary/test_dca_vllm_config.py); the "
        "sparse-attention `*_critical` tables are not covered",
    ),
    Convention(
        "vLLM",
        "FoPE (`fope.py`)",
        "-",
        "not supported: cos and sin are learned per-KV-head mixtures of every "
        "frequency's cos and sin (checkpoint weights), not a rotation by a frequency set",
        supported=False,
    ),
    # ----------------------------------------------------------------- llama.cpp
    Convention("llama.cpp", "`LLAMA_ROPE_TYPE_NORM` (0)", '`rope`, `layout="interleaved"`', _GGML),
    Convention("llama.cpp", "`LLAMA_ROPE_TYPE_NEOX` (2)", '`rope`, `layout="half"`', _GGML),
    Convention(
        "llama.cpp",
        "`LLAMA_ROPE_TYPE_MROPE` (8)",
        "`m-rope` (`e == 0`) or `rope-hierarchical`, 4 levels",
        _GGML,
    ),
    Convention(
        "llama.cpp",
        "`LLAMA_ROPE_TYPE_IMROPE` (40)",
        "`m-rope`, `interleaved_sections=True`, when no pair falls to the 4th position; "
        "refused otherwise (e.g. Qwen3-VL's [24, 20, 20] over 64 pairs)",
        _GGML,
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
        "GGUF `yarn_ext_factor` / `yarn_attn_factor` / `yarn_log_multiplier` / "
        "`scaling.alpha`, YaRN with per-pair factors, YaRN in `deepseek2`, "
        "`freq_base_swa`",
        "-",
        "refused by name (`relpos.interop.gguf_scaling`): read by llama.cpp only for some "
        "architectures whose graphs apply them their own way, or a composition relpos's "
        "scalings do not state",
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
        "| Defined by | Its name | relpos | Status | How it is checked |",
        "|---|---|---|---|---|",
    ]
    for c in CONVENTIONS:
        status = "exact" if c.supported else "not supported"
        lines.append(f"| {c.stack} | {c.name} | {c.relpos} | {status} | {c.how} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
