"""``LinearState``: the recurrent state of causal kernelized attention (no bias, or ALiBi).

Causal linear attention (``c = 1``; RoFormer's rotary form included) is an RNN (Katharopoulos
et al. 2020): after the keys ``0..t``

    S_t = sum_{j<=t} a'_j v_j^T   (m, Dv)        Z_t = sum_{j<=t} phi_k_j   (m,)

(``a'`` = rotated key features for RoFormer's linear form, else ``phi_k``), and a new query
reads ``z = a_q^T S / phi_q^T Z``. With a geometric bias (causal ALiBi, ``c = g^(i-j)``) the
sums decay: ``S_t = g S_{t-1} + a'_t v_t^T`` (``log_decay`` per head). Decoding with the
state costs O(m Dv) per token whatever the position, and equals the full causal forward
(``tests/conformance/test_linear.py``).

Pass an empty ``LinearState()`` as ``relpos.attention(..., feature_map=..., causal=True,
cache=state)``; each call adds its keys. Default positions continue ``state.length``.
Random-feature keys carry a per-(batch, head) log offset (``feature_maps``): the state keeps
``log_offset`` and rescales ``S`` and ``Z`` when a later call brings a larger one (the
online-softmax trick), so long decodes never overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LinearState"]


@dataclass
class LinearState:
    """Sums over the keys seen so far: ``S (B, H, m, Dv)``, ``Z (B, H, m)``, the keys'
    ``log_offset (B, H, 1, 1)`` (None: deterministic features) and the key count ``length``."""

    S: Tensor | None = None
    Z: Tensor | None = None
    log_offset: Tensor | None = None
    length: int = 0
    #: per-head ``log g`` of a geometric bias (ALiBi: ``-slope``), None without a bias
    log_decay: Tensor | None = None

    def check_decay(self, log_decay: Tensor) -> None:
        """Record the call's geometric decay (``(H,)``); ``ValueError`` if the sums were
        formed with another one."""
        if self.S is None:
            self.log_decay = log_decay
            return
        if (
            self.log_decay is None
            or self.log_decay.shape != log_decay.shape
            or not bool(torch.allclose(self.log_decay, log_decay, rtol=1e-6, atol=1e-9))
        ):
            raise ValueError(
                "cache (LinearState) holds sums formed with another bias decay (or none): use "
                "one LinearState per encoding"
            )

    def absorb_offset(self, log_offset: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """Align a call's key ``log_offset`` with the state's: returns ``(factor, offset)``,
        the factor to multiply the new key features by (None: 1) and the common offset; the
        stored sums are rescaled in place to it."""
        if log_offset is None:
            return None, None
        if self.log_offset is None or self.S is None:
            return None, log_offset
        common = torch.maximum(self.log_offset, log_offset)
        old = torch.exp(self.log_offset - common)
        assert self.Z is not None
        self.S = self.S * old
        self.Z = self.Z * old[..., 0]
        self.log_offset = common
        return torch.exp(log_offset - common), common

    def sums(self) -> tuple[Tensor, Tensor] | None:
        """``(S, Z)`` or None before the first call."""
        if self.S is None or self.Z is None:
            return None
        return self.S, self.Z

    def update(self, sums: tuple[Tensor, Tensor], log_offset: Tensor | None, added: int) -> None:
        """Store the sums after a call that added ``added`` keys."""
        self.S, self.Z = sums
        if log_offset is not None:
            self.log_offset = log_offset
        self.length += added

    def check_shape(self, batch: int, heads: int, features: int, value_dim: int) -> None:
        """``ValueError`` unless the stored sums fit a call of these sizes."""
        if self.S is None:
            return
        want = (batch, heads, features, value_dim)
        if tuple(self.S.shape) != want:
            raise ValueError(
                f"cache (LinearState) holds sums of shape (B, H, m, Dv) = {tuple(self.S.shape)}, "
                f"but this call has {want}"
            )
