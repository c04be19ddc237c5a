"""Neural-network layers built on relpos encodings."""

from .attention import MultiHeadAttention
from .cache import KVCache, LayerCache
from .camera_adapter import CameraAdapter
from .convolution import ConvolutionAttention
from .dual_kernel import DualKernelAttention
from .llama import LlamaConfig, LlamaLM
from .location import DirectionMix, LocationAttention, reverse_align
from .memory import SegmentRecurrence
from .mixers.gateloop import GateLoop
from .mixers.lightnet import MDTPE, LightNetAttention
from .mixers.relflexformer import RelFlexformerAttention
from .mixers.rola import RoLAAttention
from .mixers.sparse_lowrank import SparseLowRankAttention
from .qkv_convolution import CausalDepthwiseConv
from .syntax_embedding import SyntaxEmbedding
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
    "RelFlexformerAttention",
    "RoLAAttention",
    "SparseLowRankAttention",
    "ConvolutionAttention",
    "DualKernelAttention",
    "CameraAdapter",
    "DirectionMix",
    "LocationAttention",
    "reverse_align",
    "CausalDepthwiseConv",
    "SyntaxEmbedding",
]
