"""Diagnostics of positional encodings (``relpos analyze``); each returns numbers and can draw
them (matplotlib, imported only by the plot functions).

* ``decay``: RoFormer's long-term-decay bound and expected scores vs distance, any encoding;
* ``base_bound``: the RoPE base lower bound for a context length (Men et al. 2024);
* ``resolution``: attention resolution (Sun et al. 2022, xPos);
* ``frequencies``: RoPE frequencies and wavelengths under any scaling.
"""

from .base_bound import (
    BaseBound,
    is_feasible,
    min_similarity_advantage,
    plot_base_bound,
    rope_base_lower_bound,
    similarity_advantage,
)
from .decay import DecayCurves, decay_curves, expected_logits, expected_scores, plot_decay
from .frequencies import FrequencyProfile, frequency_profile, plot_wavelengths, scaling_presets
from .resolution import Resolution, attention_resolution, encoding_resolution, plot_resolution

__all__ = [
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
