"""relpos: relative positional encodings for Transformers.

Public API (stable names; see docs/architecture.md)::

    relpos.available() -> list[str]
    relpos.create(name, *, num_heads, head_dim, **options) -> relpos.Encoding
    relpos.describe(name) -> str   (the encoding's paper and options)
    relpos.attention(q, k, v, encoding=None, *, q_pos=None, k_pos=None, causal=False,
                     mask=None, scale=None, backend="auto")
    relpos.scores(q, k, encoding=None, *, q_pos=None, k_pos=None, scale=None)
    relpos.functional.{rope_frequencies, apply_rotary, alibi_slopes, t5_bucket}
"""

from . import encodings as _encodings  # noqa: F401  (registers the encodings)
from . import functional, nn, registry, schedules
from .attention import attention, scores
from .encodings.base import BiasContext, Encoding
from .encodings.registry import available, create, describe, encoding_class

__version__ = "0.1.0"

__all__ = [
    "available",
    "create",
    "describe",
    "encoding_class",
    "attention",
    "scores",
    "functional",
    "nn",
    "schedules",
    "registry",
    "Encoding",
    "BiasContext",
    "__version__",
]
