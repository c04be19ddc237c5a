"""Attention backends behind ``relpos.attention``."""

from .api import BACKENDS, DENSE_BIAS_LIMIT, attention, choose_backend, scores

__all__ = ["attention", "scores", "choose_backend", "BACKENDS", "DENSE_BIAS_LIMIT"]
