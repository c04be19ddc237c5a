"""Efficient attention with relative positions (issue 12; spec efficient.md).

* kernelized / linear attention (the ``linear`` backend of ``relpos.attention``) and its
  building blocks: feature maps, the FFT Toeplitz RPE, RoPE on features, the recurrent state;
* data-controlled decayed recurrences (``recurrence``): GateLoop and LightNet, exact in
  recurrent, chunked and surrogate-attention form, O(1) decoding;
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
from .gateloop import gateloop_scan
from .kernelized import kernelized_attention, kernelized_reference, toeplitz_matvec
from .lightnet import LightNetState, lightnet_keys, lightnet_scan, lrpe_theta, md_lrpe, tpe_scan
from .linear_rope import rotate_features
from .recurrence import decayed_recurrence
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
    "gateloop_scan",
    "decayed_recurrence",
    "lightnet_scan",
    "lightnet_keys",
    "LightNetState",
    "md_lrpe",
    "lrpe_theta",
    "tpe_scan",
]
