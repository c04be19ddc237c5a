"""Efficient attention with relative positions (issue 12; spec efficient.md).

``fold``: biases folded into q/k channels for the fused kernels (exact for ALiBi, low rank
with a measured weight error otherwise)."""

from .fold import FOLD_LOGIT_TOLERANCE, LowRankFold, folded_attention, low_rank_fold

__all__ = ["FOLD_LOGIT_TOLERANCE", "LowRankFold", "folded_attention", "low_rank_fold"]
