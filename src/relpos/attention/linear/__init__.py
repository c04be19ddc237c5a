"""Kernelized (linear) attention with relative positions: the ``linear`` backend.

* ``feature_maps``: the kernel feature maps ``phi`` (``elu1``, ``relu``, ``prf``, low-rank);
* ``kernelized``: ``phi(q) phi(k)^T`` attention with the Toeplitz RPE ``exp(b(i - j))`` by FFT
  or a decayed scan (Luo et al. 2021, "Stable, Fast and Accurate: Kernelized Attention with
  Relative Positional Encoding", arXiv 2106.12566), and its O(L^2) reference;
* ``rotary_features``: RoPE applied to the features after ``phi`` (RoFormer, arXiv 2104.09864,
  eq. 19);
* ``state``: ``LinearState``, the recurrent sums that decode one token in O(m Dv);
* ``backend``: how ``relpos.attention(..., feature_map=...)`` runs a call (``linear_path``).
"""

from .backend import linear_attention, linear_path, prepare_linear_call
from .feature_maps import (
    EluPlusOne,
    FeatureMap,
    HeadwiseLowRankFeatures,
    LowRankFeatures,
    PositiveRandomFeatures,
    ReLUFeatures,
    create_feature_map,
)
from .kernelized import kernelized_attention, kernelized_reference, toeplitz_matvec
from .rotary_features import rotate_features
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
    "LinearState",
    "linear_attention",
    "linear_path",
    "prepare_linear_call",
]
