"""EscherNet's 6-DoF camera positional encoding, CaPE (Kong et al., CVPR 2024, seed 84; spec
camera §2.4, Authority A: kxhit/EscherNet, 6DoF/diffusers/models/attention_processor.py
``cape_embed``, 6DoF/dataset.py).

EscherNet multiplies row-vector 4-chunks of the features by the 4x4 world-to-camera pose
``P = [R | t]``: queries by ``P_q^-T``, keys by ``P_k``, values and outputs untouched. In
column form ``q' = P_q^-1 q``, ``k' = P_k^T k``, so

    logit_ij = q_i^T (P_k P_q^-1)^T k_j

which is the per-token frame of ``frames.CameraFrames`` with ``T = P^-T`` on every channel
(spec R.5: equal exactly), invariant to a rigid change of world coordinates. One frequency,
no RoPE channels: tokens of one camera have no position (positions are not read), and
identical cameras give plain attention (NoPE). Not orthogonal: the logit scale depends on
camera distance (spec P2; normalise scenes). ``rotate_values=True`` also re-frames values
(``T^-1 v``) and outputs (``T o``), which EscherNet does not do.

EscherNet's 4-DoF variant (RoPE over spherical pose angles) is not implemented.

Shapes: ``x (B, H, L, D)`` with ``D % 4 == 0``; ``inputs["k_viewmats"] (B, Lk, 4, 4)``
world-to-camera, optional ``q_viewmats`` (cross-attention: target queries, reference keys).
"""

from __future__ import annotations

from torch import Tensor

from ...cameras import invert_se3
from ...registry import register
from .frames import CameraFrames

__all__ = ["CaPE6DoF"]


@register("cape-6dof")
class CaPE6DoF(CameraFrames):
    """CaPE 6-DoF (see the module docstring). Option: ``rotate_values`` (False)."""

    paper = "Kong et al. 2024 (EscherNet, CaPE 6-DoF)"

    def __init__(self, num_heads: int, head_dim: int, rotate_values: bool = False) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        self._set_channels(head_dim // 4 * 4, 0, "head_dim % 4 == 0 (4-channel pose chunks)")
        if head_dim % 4:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'cape-6dof': head_dim % 4 == 0 "
                "(4-channel pose chunks)"
            )

    def camera_blocks(
        self, viewmats: Tensor, Ks: Tensor | None, pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        # T = P^-T = c2w^T, T^-1 = P^T
        return invert_se3(viewmats).transpose(-1, -2), viewmats.transpose(-1, -2)
