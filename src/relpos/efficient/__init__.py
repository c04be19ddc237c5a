"""Efficient attention with relative positions (issue 12; spec efficient.md).

* kernelized / linear attention (the ``linear`` backend of ``relpos.attention``) and its
  building blocks: feature maps, the FFT Toeplitz RPE, RoPE on features, the recurrent state;
* ``fold``: biases folded into q/k channels for the fused kernels (exact for ALiBi, low rank
  with a measured weight error otherwise).
"""

from .feature_maps import (
    EluPlusOne,
    FeatureMap,
    PositiveRandomFeatures,
    ReLUFeatures,
    create_feature_map,
)
from .fold import FOLD_LOGIT_TOLERANCE, LowRankFold, folded_attention, low_rank_fold
from .kernelized import kernelized_attention, kernelized_reference, toeplitz_matvec
from .linear_rope import rotate_features
from .state import LinearState

__all__ = [
    "FeatureMap",
    "PositiveRandomFeatures",
    "EluPlusOne",
    "ReLUFeatures",
    "create_feature_map",
    "kernelized_attention",
    "kernelized_reference",
    "toeplitz_matvec",
    "rotate_features",
    "LinearState",
    "FOLD_LOGIT_TOLERANCE",
    "LowRankFold",
    "folded_attention",
    "low_rank_fold",
]
