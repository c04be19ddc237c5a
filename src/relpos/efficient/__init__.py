"""Efficient attention with relative positions (issue 12; spec efficient.md).

* kernelized / linear attention (the ``linear`` backend of ``relpos.attention``) and its
  building blocks: feature maps, the FFT Toeplitz RPE, RoPE on features, the recurrent state;
* RoLA's low-rank branch (``rola``): RoPE outside a low-rank feature map, on a frequency
  subset of a model's (N-D) rotary schedule;
* ``sparse_lowrank``: a block-sparse softmax branch with RoPE plus a low-rank branch over the
  blocks it does not cover (RoLA's, or RoPeSLR's absolute-PE baseline from ``ropeslr``),
  combined as SLA (``O_s + W O_l``);
* data-controlled decayed recurrences (``recurrence``): GateLoop and LightNet, exact in
  recurrent, chunked and surrogate-attention form, O(1) decoding;
* ``relflexformer``: linear attention with an integrable modulation of arbitrary m-D relative
  positions (seed 3): exact sum, dense spectral quadrature, a torch NUFFT (``nufft``) and
  random Fourier features, with the aliasing / truncation conditions checked per call;
* ``fold``: biases folded into q/k channels for the fused kernels (exact for ALiBi, low rank
  with a measured weight error otherwise).

Layers: the kernelized building blocks sit below the engine (``attention/linear.py`` imports
them); ``fold`` sits above it (it calls ``relpos.attention``), so its names are loaded on
first use (``__getattr__``) and importing the engine never imports it.
"""

from typing import Any

from .feature_maps import (
    EluPlusOne,
    FeatureMap,
    HeadwiseLowRankFeatures,
    LowRankFeatures,
    PositiveRandomFeatures,
    ReLUFeatures,
    create_feature_map,
)
from .gateloop import gateloop_scan
from .kernelized import kernelized_attention, kernelized_reference, toeplitz_matvec
from .lightnet import LightNetState, lightnet_keys, lightnet_scan, lrpe_theta, md_lrpe, tpe_scan
from .linear_rope import rotate_features
from .nufft import NUFFTGrid, nufft_convolve, nufft_type1, nufft_type2
from .recurrence import decayed_recurrence
from .relflexformer import (
    CauchyModulation,
    GaussianModulation,
    Modulation,
    plan_grid,
    relflexformer_attention,
    relflexformer_reference,
)
from .rola import rola_attention, rotary_schedule, select_frequencies
from .ropeslr import GridPositionEmbedding, ropeslr_features
from .sparse_lowrank import (
    BlockSelection,
    block_sparse_attention,
    complement_linear_attention,
    select_blocks,
    sparse_lowrank_attention,
)
from .state import LinearState

__all__ = [
    "FeatureMap",
    "PositiveRandomFeatures",
    "EluPlusOne",
    "ReLUFeatures",
    "LowRankFeatures",
    "HeadwiseLowRankFeatures",
    "create_feature_map",
    "kernelized_attention",
    "kernelized_reference",
    "toeplitz_matvec",
    "rotate_features",
    "rola_attention",
    "rotary_schedule",
    "select_frequencies",
    "GridPositionEmbedding",
    "ropeslr_features",
    "BlockSelection",
    "select_blocks",
    "block_sparse_attention",
    "complement_linear_attention",
    "sparse_lowrank_attention",
    "LinearState",
    "FOLD_LOGIT_TOLERANCE",
    "LowRankFold",
    "folded_attention",
    "low_rank_fold",
    "gateloop_scan",
    "decayed_recurrence",
    "lightnet_scan",
    "lightnet_keys",
    "LightNetState",
    "md_lrpe",
    "lrpe_theta",
    "tpe_scan",
    "NUFFTGrid",
    "nufft_type1",
    "nufft_type2",
    "nufft_convolve",
    "Modulation",
    "GaussianModulation",
    "CauchyModulation",
    "plan_grid",
    "relflexformer_attention",
    "relflexformer_reference",
]

_FOLD_NAMES = ("FOLD_LOGIT_TOLERANCE", "LowRankFold", "folded_attention", "low_rank_fold")


def __getattr__(name: str) -> Any:
    if name in _FOLD_NAMES:
        from . import fold

        return getattr(fold, name)
    raise AttributeError(f"module 'relpos.efficient' has no attribute {name!r}")
