"""The few global switches (timm's ``layers/config.py`` habit).

``FUSED_ROTARY``: "auto" compiles the rotation (``torch.compile``) for tensors of at least
``FUSED_ROTARY_MIN_NUMEL`` elements, where it runs close to the time of a copy and well ahead of
HF-style eager RoPE (docs/benchmarks.md, "RoPE apply"); True always, False never. A failed compile
falls back to eager once, with a warning.
"""

from __future__ import annotations

FUSED_ROTARY: bool | str = "auto"
FUSED_ROTARY_MIN_NUMEL = 1 << 20
