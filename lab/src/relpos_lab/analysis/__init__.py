"""Diagnostics of positional encodings (``relpos analyze``); each returns numbers and can draw
them (matplotlib, imported only by the plot functions).

* ``decay``: RoFormer's long-term-decay bound and expected scores vs distance, any encoding;
* ``base_bound``: the RoPE base lower bound for a context length (Men et al. 2024);
* ``resolution``: attention resolution (Sun et al. 2022, xPos);
* ``frequencies``: RoPE frequencies and wavelengths under any scaling;
* ``receptive_field``: theoretical (bias) and effective (gradient) receptive fields (Qin et al.
  2024);
* ``positional_heads``: dimension-level analysis of rotary heads (Hong et al. 2024);
* ``influence``: positional influence of masks and RPEs by attention rollout (Wu et al. 2025);
* ``causal_mask``: the causal mask as positional information, non-relativity (Kim et al. 2025);
* ``kv_phase``: phase sensitivity of chunked KV compression;
* ``model_capture``: models as input (rotated q/k, logits and weights per layer).
"""

from .base_bound import (
    BaseBound,
    is_feasible,
    min_similarity_advantage,
    plot_base_bound,
    rope_base_lower_bound,
    similarity_advantage,
)
from .causal_mask import ScoreMaps, diagonal_residual, non_relativity, simulate_scores
from .decay import DecayCurves, decay_curves, expected_logits, expected_scores, plot_decay
from .frequencies import FrequencyProfile, frequency_profile, plot_wavelengths, scaling_presets
from .influence import (
    InfluenceProfile,
    encoding_attention,
    influence_profile,
    mask_attention,
    rollout,
)
from .kv_phase import PhaseSensitivity, phase_scores, phase_sensitivity
from .positional_heads import (
    HeadScores,
    dimension_centroid,
    encoding_head_scores,
    head_scores,
    pair_contributions,
)
from .receptive_field import (
    ReceptiveField,
    cumulative_mass,
    effective_receptive_field,
    receptive_field,
    theoretical_receptive_field,
)
from .resolution import Resolution, attention_resolution, encoding_resolution, plot_resolution

__all__ = [
    "HeadScores",
    "InfluenceProfile",
    "PhaseSensitivity",
    "ReceptiveField",
    "ScoreMaps",
    "cumulative_mass",
    "diagonal_residual",
    "dimension_centroid",
    "effective_receptive_field",
    "encoding_attention",
    "encoding_head_scores",
    "head_scores",
    "influence_profile",
    "mask_attention",
    "non_relativity",
    "pair_contributions",
    "phase_scores",
    "phase_sensitivity",
    "receptive_field",
    "rollout",
    "simulate_scores",
    "theoretical_receptive_field",
    "BaseBound",
    "DecayCurves",
    "FrequencyProfile",
    "Resolution",
    "attention_resolution",
    "decay_curves",
    "encoding_resolution",
    "expected_logits",
    "expected_scores",
    "frequency_profile",
    "is_feasible",
    "min_similarity_advantage",
    "plot_base_bound",
    "plot_decay",
    "plot_resolution",
    "plot_wavelengths",
    "rope_base_lower_bound",
    "scaling_presets",
    "similarity_advantage",
]
