"""Tiny random transformers models for the ``relpos.interop.hf`` tests (no downloads).

Every family has 2 layers, 4 query / 2 key-value heads of 16 channels (grouped-query
attention), a vocabulary of 128 and weights from ``torch.manual_seed(0)``. Gemma-3 has one
sliding-window layer (window 8) with its local RoPE (base 1e4) and one global layer (base 1e6);
Phi-3 rotates half of each head.
"""

from __future__ import annotations

import torch

SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
FAMILIES = ("llama", "qwen2", "mistral", "gemma3")


def config(family: str, **overrides):
    import transformers as tf

    sizes = {**SIZES, **overrides}
    if family == "llama":
        return tf.LlamaConfig(**sizes)
    if family == "qwen2":
        return tf.Qwen2Config(**sizes)
    if family == "mistral":
        return tf.MistralConfig(**{"sliding_window": None, **sizes})
    if family == "gemma3":
        return tf.Gemma3TextConfig(
            **{
                "head_dim": 16,
                "query_pre_attn_scalar": 16,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
                **sizes,
            }
        )
    if family == "phi3":
        return tf.Phi3Config(**{"partial_rotary_factor": 0.5, "pad_token_id": 0, **sizes})
    raise ValueError(family)


def model(family: str = "llama", **overrides):
    import transformers as tf

    cfg = config(family, **overrides)
    cls = {
        "llama": tf.LlamaForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
        "mistral": tf.MistralForCausalLM,
        "gemma3": tf.Gemma3ForCausalLM,
        "phi3": tf.Phi3ForCausalLM,
    }[family]
    torch.manual_seed(0)
    m = cls(cfg).eval()
    m.generation_config.pad_token_id = 0
    return m


def tokens(length: int = 40, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded(ids: torch.Tensor, pad: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask, position_ids)`` of a batch whose row 1 is row 0 shifted right by
    ``pad`` pad tokens (its last ``L - pad`` tokens), with ``generate``'s positions
    (``cumsum(mask) - 1``, pads at 0)."""
    L = ids.shape[1]
    row = torch.cat([torch.zeros(pad, dtype=ids.dtype), ids[0, : L - pad]])
    batch = torch.stack([ids[0], row])
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return batch, mask, pos
