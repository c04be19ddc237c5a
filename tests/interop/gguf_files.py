"""Small GGUF files written in tests with the ``gguf`` package's ``GGUFWriter`` (no
downloads): a 1-layer llama (dim 16, 2 heads of 8, FFN 32, vocabulary 4, random weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYER_TENSORS = [
    ("attn_norm", (16,)),
    ("attn_q", (16, 16)),
    ("attn_k", (16, 16)),
    ("attn_v", (16, 16)),
    ("attn_output", (16, 16)),
    ("ffn_norm", (16,)),
    ("ffn_gate", (32, 16)),
    ("ffn_up", (32, 16)),
    ("ffn_down", (16, 32)),
]


def tiny_llama_gguf(
    path: Path,
    *,
    base: float = 1e4,
    rope_keys: dict | None = None,
    tensors: dict | None = None,
) -> Path:
    """Write the tiny llama to ``path``: RoPE base ``base``, extra ``llama.rope.<key>``
    metadata ``rope_keys`` (str, int or float values) and extra float tensors ``tensors``
    (e.g. ``rope_freqs.weight``)."""
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(base)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, value in (rope_keys or {}).items():
        if isinstance(value, str):
            writer.add_string(f"llama.rope.{key}", value)
        elif isinstance(value, int):
            writer.add_uint32(f"llama.rope.{key}", value)
        else:
            writer.add_float32(f"llama.rope.{key}", value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab", "<s>"])
    writer.add_token_merges(["a b"])
    writer.add_token_types([1, 1, 1, 3])
    shapes = {"token_embd.weight": (4, 16), "output_norm.weight": (16,)}
    shapes |= {f"blk.0.{name}.weight": shape for name, shape in LAYER_TENSORS}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    for name, values in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
