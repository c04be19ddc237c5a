"""RoPE frequency scaling: context-extension methods, one record per type.

``ROPE_SCALING`` maps each HF ``rope_type`` to a ``ScalingType`` record (the shape of HF
``modeling_rope_utils``): its frequency function (one signature for all types), the keys its
dict must and may carry, whether it depends on the call's length, whether it reads
``original_max_position_embeddings``, and its range check.

* ``scaling_type.py``: the record and the small shared checks;
* ``methods.py``: the frequency functions (formulas, sources) and ``ROPE_SCALING``;
* ``validation.py``: ``validate_scaling`` (reads only the records) and
  ``is_length_dependent``;
* ``ntk_variants.py``, ``yarn_variants.py``, ``frequency_factors.py``: the types that
  inference engines define besides transformers' table (Hunyuan's NTK by ``alpha``, XD-RoPE,
  vLLM's fixed / mixed NTK and ``deepseek_yarn``, llama.cpp's per-pair ``rope_freqs``),
  registered into ``ROPE_SCALING`` here.

``relpos.functional.rope_frequencies`` is the entry point the encodings use.
"""

from .frequency_factors import FREQUENCY_FACTORS, freq_factors
from .methods import (
    ROPE_SCALING,
    default,
    dynamic,
    linear,
    llama3,
    longrope,
    ntk,
    ntk_scaled_base,
    proportional,
    yarn,
)
from .ntk_variants import NTK_VARIANTS, ntk_alpha, ntk_mixed
from .scaling_type import COMMON_KEYS, RopeScalingFn, ScalingType
from .yarn_variants import YARN_VARIANTS, deepseek_yarn

# before ``validation`` reads the table (``LENGTH_DEPENDENT``)
for _records in (NTK_VARIANTS, YARN_VARIANTS, FREQUENCY_FACTORS):
    ROPE_SCALING.update(_records)

from .validation import (  # noqa: E402 - after the table is complete
    LENGTH_DEPENDENT,
    is_length_dependent,
    resolve_type,
    validate_scaling,
)

__all__ = [
    "COMMON_KEYS",
    "LENGTH_DEPENDENT",
    "ROPE_SCALING",
    "RopeScalingFn",
    "ScalingType",
    "deepseek_yarn",
    "default",
    "dynamic",
    "freq_factors",
    "is_length_dependent",
    "linear",
    "llama3",
    "longrope",
    "ntk",
    "ntk_alpha",
    "ntk_mixed",
    "ntk_scaled_base",
    "proportional",
    "resolve_type",
    "validate_scaling",
    "yarn",
]
