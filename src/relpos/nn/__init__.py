"""Neural-network layers built on relpos encodings."""

from .attention import MultiHeadAttention
from .cache import KVCache, LayerCache
from .convolution import ConvolutionAttention
from .gateloop import GateLoop
from .lightnet import MDTPE, LightNetAttention
from .llama import LlamaConfig, LlamaLM
from .location import DirectionMix, LocationAttention, reverse_align
from .memory import SegmentRecurrence
from .qkv_convolution import CausalDepthwiseConv
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
    "ConvolutionAttention",
    "DirectionMix",
    "LocationAttention",
    "reverse_align",
    "CausalDepthwiseConv",
]
