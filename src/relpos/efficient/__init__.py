"""Deprecated alias: ``relpos.efficient`` was dissolved into the engine and the layers.

Kernelized attention now lives in ``relpos.attention.linear`` (feature maps, the FFT Toeplitz
RPE, RoPE on features, ``LinearState``); the folds in ``relpos.attention.fold``; the
sub-quadratic layers with their math in ``relpos.nn.mixers`` (RoLA, sparse + low-rank,
GateLoop, LightNet, RelFlexformer, NUFFT). Every name and submodule of the old package still
resolves here, with a ``DeprecationWarning`` that names its new path.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any

#: every public name of the old package -> the module that holds it now
MOVED_NAMES: dict[str, str] = {
    "EluPlusOne": "relpos.attention.linear.feature_maps",
    "FeatureMap": "relpos.attention.linear.feature_maps",
    "HeadwiseLowRankFeatures": "relpos.attention.linear.feature_maps",
    "LowRankFeatures": "relpos.attention.linear.feature_maps",
    "PositiveRandomFeatures": "relpos.attention.linear.feature_maps",
    "ReLUFeatures": "relpos.attention.linear.feature_maps",
    "create_feature_map": "relpos.attention.linear.feature_maps",
    "gateloop_scan": "relpos.nn.mixers.gateloop",
    "kernelized_attention": "relpos.attention.linear.kernelized",
    "kernelized_reference": "relpos.attention.linear.kernelized",
    "toeplitz_matvec": "relpos.attention.linear.kernelized",
    "LightNetState": "relpos.nn.mixers.lightnet",
    "lightnet_keys": "relpos.nn.mixers.lightnet",
    "lightnet_scan": "relpos.nn.mixers.lightnet",
    "lrpe_theta": "relpos.nn.mixers.lightnet",
    "md_lrpe": "relpos.nn.mixers.lightnet",
    "tpe_scan": "relpos.nn.mixers.lightnet",
    "rotate_features": "relpos.attention.linear.rotary_features",
    "NUFFTGrid": "relpos.nn.mixers.nufft",
    "nufft_convolve": "relpos.nn.mixers.nufft",
    "nufft_type1": "relpos.nn.mixers.nufft",
    "nufft_type2": "relpos.nn.mixers.nufft",
    "decayed_recurrence": "relpos.nn.mixers.recurrence",
    "CauchyModulation": "relpos.nn.mixers.relflexformer",
    "GaussianModulation": "relpos.nn.mixers.relflexformer",
    "Modulation": "relpos.nn.mixers.relflexformer",
    "plan_grid": "relpos.nn.mixers.relflexformer",
    "relflexformer_attention": "relpos.nn.mixers.relflexformer",
    "relflexformer_reference": "relpos.nn.mixers.relflexformer",
    "rola_attention": "relpos.nn.mixers.rola",
    "rotary_schedule": "relpos.nn.mixers.rola",
    "select_frequencies": "relpos.nn.mixers.rola",
    "GridPositionEmbedding": "relpos.nn.mixers.ropeslr",
    "ropeslr_features": "relpos.nn.mixers.ropeslr",
    "BlockSelection": "relpos.nn.mixers.sparse_lowrank",
    "block_sparse_attention": "relpos.nn.mixers.sparse_lowrank",
    "complement_linear_attention": "relpos.nn.mixers.sparse_lowrank",
    "select_blocks": "relpos.nn.mixers.sparse_lowrank",
    "sparse_lowrank_attention": "relpos.nn.mixers.sparse_lowrank",
    "LinearState": "relpos.attention.linear.state",
    "FOLD_LOGIT_TOLERANCE": "relpos.attention.fold",
    "LowRankFold": "relpos.attention.fold",
    "folded_attention": "relpos.attention.fold",
    "low_rank_fold": "relpos.attention.fold",
}
#: every submodule of the old package -> its new module
MOVED_MODULES: dict[str, str] = {
    "feature_maps": "relpos.attention.linear.feature_maps",
    "kernelized": "relpos.attention.linear.kernelized",
    "linear_rope": "relpos.attention.linear.rotary_features",
    "state": "relpos.attention.linear.state",
    "nufft": "relpos.nn.mixers.nufft",
    "recurrence": "relpos.nn.mixers.recurrence",
    "ropeslr": "relpos.nn.mixers.ropeslr",
    "gateloop": "relpos.nn.mixers.gateloop",
    "lightnet": "relpos.nn.mixers.lightnet",
    "relflexformer": "relpos.nn.mixers.relflexformer",
    "rola": "relpos.nn.mixers.rola",
    "sparse_lowrank": "relpos.nn.mixers.sparse_lowrank",
    "fold": "relpos.attention.fold",
}

__all__ = sorted(MOVED_NAMES)

warnings.warn(
    "relpos.efficient is deprecated: import from relpos.attention.linear, "
    "relpos.attention.fold or relpos.nn.mixers (see relpos.efficient.MOVED_NAMES)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    module = MOVED_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'relpos.efficient' has no attribute {name!r}")
    warnings.warn(
        f"relpos.efficient.{name} moved to {module}.{name}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(module), name)


def _alias_submodules() -> None:
    """``import relpos.efficient.rola`` finds the new module under its old name."""
    for old, new in MOVED_MODULES.items():
        module: ModuleType = importlib.import_module(new)
        sys.modules[f"{__name__}.{old}"] = module


_alias_submodules()
