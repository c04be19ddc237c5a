"""The models ``relpos longctx`` runs: SmolLM2 (or any Llama-family GGUF file), or an
untrained ``random-tiny`` model over bytes for smoke tests (``load_model``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["ByteTokenizer", "random_tiny_model", "load_model"]


class ByteTokenizer:
    """UTF-8 bytes as token ids (the ``random-tiny`` smoke-test model's tokenizer)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def random_tiny_model(seed: int = 0) -> tuple[Any, ByteTokenizer]:
    """A randomly initialised 2-layer ``LlamaLM`` over bytes (smoke tests of the pipeline)."""
    from ...nn.llama import LlamaConfig, LlamaLM

    config = LlamaConfig(
        vocab_size=256,
        dim=32,
        depth=2,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=64,
        rope_base=10000.0,
        max_position_embeddings=256,
        name="random-tiny (untrained)",
    )
    torch.manual_seed(seed)
    return LlamaLM(config).eval(), ByteTokenizer()


def load_model(name: str) -> tuple[Any, Any, float]:
    """``(model, tokenizer, seconds)`` for ``--model``: ``smollm2`` (the bundled GGUF),
    a path to a Llama-family ``.gguf`` file, or ``random-tiny`` (untrained, for smoke tests)."""
    t0 = time.perf_counter()
    if name == "random-tiny":
        model, tokenizer = random_tiny_model()
    else:
        from ...interop.gguf import load_gguf

        if name != "smollm2" and not Path(name).is_file():
            raise ValueError(f"--model must be smollm2, random-tiny or a .gguf file, got {name!r}")
        model, tokenizer, _ = load_gguf(None if name == "smollm2" else name)
    return model, tokenizer, time.perf_counter() - t0
