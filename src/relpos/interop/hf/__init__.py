"""relpos inside Hugging Face ``transformers`` models (``transformers`` is optional).

* ``patch(model, method="self-extend", **options) -> PatchHandle``: relpos attention and
  positional schemes inside any decoder that dispatches through transformers' attention
  interface (``patch.py``);
* ``from_hf(model) -> LlamaLM`` / ``to_hf(lm) -> LlamaForCausalLM``: weights both ways between
  transformers' Llama-family models and ``relpos.nn.LlamaLM`` (``weights.py``);
* ``HFCausalLM`` / ``load_hf``: a transformers model behind ``LlamaLM``'s lab interface
  (``set_encoding`` patches), for ``relpos longctx --model hf:...`` (``lab_model.py``);
* ``inspect_model``: the sizes and RoPE the others read (``model.py``); with ``probe=True``
  how each layer actually rotates q and k, read from the model's own code (``probe.py``).

Nothing here imports transformers until it is called.
"""

from .lab_model import HFCausalLM, load_hf
from .model import ModelFacts, RopeFacts, inspect_model
from .patch import BASELINE, PatchHandle, patch
from .probe import LayerRotary, probe_rotary
from .weights import from_hf, llama_config_from_hf, to_hf

__all__ = [
    "patch",
    "PatchHandle",
    "BASELINE",
    "from_hf",
    "to_hf",
    "llama_config_from_hf",
    "HFCausalLM",
    "load_hf",
    "inspect_model",
    "ModelFacts",
    "RopeFacts",
    "LayerRotary",
    "probe_rotary",
]
