"""The models ``relpos longctx`` runs: SmolLM2 (or any Llama-family GGUF file), a transformers
model through ``relpos.interop.hf`` (``hf:<smollm2, folder, config .json or .gguf>``), or an
untrained ``random-tiny`` model over bytes for smoke tests (``load_model``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ByteTokenizer",
    "random_tiny_model",
    "load_model",
    "model_config",
    "bytes_per_token",
    "prompt_floor",
    "is_hf",
]


class ByteTokenizer:
    """UTF-8 bytes as token ids (the ``random-tiny`` smoke-test model's tokenizer)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def _tiny_config() -> Any:
    from relpos.nn.llama import LlamaConfig

    return LlamaConfig(
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


def random_tiny_model(seed: int = 0) -> tuple[Any, ByteTokenizer]:
    """A randomly initialised 2-layer ``LlamaLM`` over bytes (smoke tests of the pipeline)."""
    from relpos.nn.llama import LlamaLM

    config = _tiny_config()
    torch.manual_seed(seed)
    return LlamaLM(config).eval(), ByteTokenizer()


def is_hf(name: str) -> bool:
    """Whether ``--model`` names a transformers model (``hf:...``)."""
    return name.startswith("hf:")


def load_model(name: str) -> tuple[Any, Any, float]:
    """``(model, tokenizer, seconds)`` for ``--model``: ``smollm2`` (the bundled GGUF),
    a path to a Llama-family ``.gguf`` file, ``random-tiny`` (untrained, for smoke tests), or
    ``hf:<spec>``: a transformers model patched by relpos (``relpos.interop.hf.load_hf``;
    its ``set_encoding`` patches the model, so every method runs the same way)."""
    t0 = time.perf_counter()
    if is_hf(name):
        from relpos.interop.hf.lab_model import load_hf

        model, tokenizer = load_hf(name)
        if tokenizer is None:  # a config, or a folder without a tokenizer: UTF-8 bytes
            if model.config.vocab_size < 256:
                raise ValueError(
                    f"--model {name} has no tokenizer and a vocabulary of "
                    f"{model.config.vocab_size} < 256 ids, so it cannot read UTF-8 bytes"
                )
            tokenizer = ByteTokenizer()
    elif name == "random-tiny":
        model, tokenizer = random_tiny_model()
    else:
        from relpos.interop.gguf import load_gguf

        if name != "smollm2" and not Path(name).is_file():
            raise ValueError(f"--model must be smollm2, random-tiny or a .gguf file, got {name!r}")
        model, tokenizer, _ = load_gguf(None if name == "smollm2" else name)
    return model, tokenizer, time.perf_counter() - t0


def model_config(name: str) -> Any:
    """The ``LlamaConfig`` of ``--model`` read without its weights (the GGUF header only), so
    lengths can be checked against the model before it is loaded."""
    if name == "random-tiny":
        return _tiny_config()
    if is_hf(name):
        from relpos.interop.hf.lab_model import hf_config

        return hf_config(name)
    from relpos.interop.gguf import llama_config, open_gguf, read_metadata, smollm2_path

    reader = open_gguf(smollm2_path() if name == "smollm2" else name)
    shapes = {t.name: [int(n) for n in t.shape.tolist()] for t in reader.tensors}
    return llama_config(
        read_metadata(reader),
        vocab_size=shapes.get("token_embd.weight", [None])[-1],
        tie_embeddings="output.weight" not in shapes,
    )


def bytes_per_token(config: Any) -> int:
    """Memory a prompt token costs at its peak, in bytes (float32): the KV cache of every layer
    plus one layer's activations while it runs (q, k, v, attention output, the MLP's three
    hidden rows). Attention itself runs in O(L) memory (SDPA's flash kernels) and the LM head
    sees only the scored positions, so nothing grows as L^2 or L x vocab."""
    head_dim = config.head_dim
    cache = config.depth * 2 * config.num_kv_heads * head_dim
    layer = 4 * config.dim + 3 * config.hidden_dim + 2 * config.num_kv_heads * head_dim
    return 4 * (cache + layer)


def prompt_floor(name: str, fixed_text: str) -> int:
    """A lower bound on the tokens of ``fixed_text`` under ``--model``'s tokenizer, known
    before the tokenizer is loaded: exact for the byte tokenizer of ``random-tiny``, the number
    of words for a BPE (every word is at least one token)."""
    if name == "random-tiny":
        return len(ByteTokenizer().encode(fixed_text))
    return len(fixed_text.split())
