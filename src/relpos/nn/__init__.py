"""Neural-network layers built on relpos encodings."""

from .attention import MultiHeadAttention
from .cache import KVCache, LayerCache
from .gateloop import GateLoop
from .lightnet import MDTPE, LightNetAttention
from .llama import LlamaConfig, LlamaLM
from .memory import SegmentRecurrence
from .transformer import TransformerLM

__all__ = [
    "MultiHeadAttention",
    "TransformerLM",
    "LlamaLM",
    "LlamaConfig",
    "KVCache",
    "LayerCache",
    "SegmentRecurrence",
    "GateLoop",
    "LightNetAttention",
    "MDTPE",
]
