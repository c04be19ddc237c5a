"""EscherNet's 6-DoF camera positional encoding, CaPE (Kong et al., CVPR 2024, "EscherNet: A
Generative Model for Scalable View Synthesis", arXiv 2402.03908; official code kxhit/EscherNet,
``6DoF/diffusers/models/attention_processor.py`` ``cape_embed``, ``6DoF/dataset.py``).

EscherNet multiplies row-vector 4-chunks of the features by the 4x4 world-to-camera pose
``P = [R | t]``: queries by ``P_q^-T``, keys by ``P_k``, values and outputs untouched. In
column form ``q' = P_q^-1 q``, ``k' = P_k^T k``, so

    logit_ij = q_i^T (P_k P_q^-1)^T k_j

which is the per-token frame of ``frames.CameraFrames`` with ``T = P^-T`` on every channel
(equal exactly), invariant to a rigid change of world coordinates. One frequency,
no RoPE channels: tokens of one camera have no position (positions are not read), and
identical cameras give plain attention (NoPE). Not orthogonal: the logit scale depends on
camera distance (normalise scenes). ``rotate_values=True`` also re-frames values
(``T^-1 v``) and outputs (``T o``), which EscherNet does not do.

EscherNet's 4-DoF variant (RoPE over spherical pose angles) is ``cape-4dof`` below.

Shapes: ``x (B, H, L, D)`` with ``D % 4 == 0``; ``inputs["k_viewmats"] (B, Lk, 4, 4)``
world-to-camera, optional ``q_viewmats`` (cross-attention: target queries, reference keys).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor

from ...cameras import camera_centers, invert_se3
from ..options import FloatSequence, Refused
from ..registry import register
from .frames import ROTATE_VALUES, CameraFrames, FrameState

__all__ = ["CaPE6DoF", "CaPE4DoF", "spherical_pose"]


@register("cape-6dof")
class CaPE6DoF(CameraFrames):
    """CaPE 6-DoF (see the module docstring). Option: ``rotate_values`` (False)."""

    paper = "Kong et al. 2024 (EscherNet, CaPE 6-DoF)"

    def __init__(
        self, num_heads: int, head_dim: int, rotate_values: Annotated[bool, ROTATE_VALUES] = False
    ) -> None:
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


def spherical_pose(viewmats: Tensor, radius: tuple[float, float] = (1.5, 2.2)) -> Tensor:
    """EscherNet's 4-DoF pose of each camera ``(..., 4)``: polar angle ``theta`` of the
    camera centre from +z, azimuth ``phi = atan2(y, x)``, the log radius mapped to
    ``pi (ln r - ln r0) / (ln r1 - ln r0)`` with ``r`` clipped to ``radius = (r0, r1)``, and
    0. ``viewmats (..., 4, 4)`` world-to-camera, the object at the world origin."""
    c = camera_centers(viewmats)
    r = c.norm(dim=-1).clamp_min(1e-12)
    theta = torch.arccos((c[..., 2] / r).clamp(-1.0, 1.0))
    phi = torch.atan2(c[..., 1], c[..., 0])
    lo, hi = math.log(radius[0]), math.log(radius[1])
    z = math.pi * (r.clamp(radius[0], radius[1]).log() - lo) / (hi - lo)
    return torch.stack((theta, phi, z, torch.zeros_like(z)), -1)


@register("cape-4dof")
class CaPE4DoF(CameraFrames):
    """EscherNet's 4-DoF CaPE (Kong et al., CVPR 2024, arXiv 2402.03908; official code
    kxhit/EscherNet ``4DoF/diffusers/models/attention_processor.py`` ``cape``,
    4DoF/dataset.py ``get_pose``).

    RoPE over the four numbers of ``spherical_pose`` (polar angle, azimuth, scaled log
    radius, 0), each repeated over a quarter of the head, one frequency (1): channel pair
    ``(x_{2i}, x_{2i+1})`` of quarter ``a`` turns by ``pose_a``, ``q' = q cos m + rot2(q) sin
    m`` with ``rot2(x_0, x_1) = (-x_1, x_0)``, on queries and keys alike (values untouched),
    so logits depend on pose differences: invariant to rotating every camera about the world
    z axis (the azimuth wraps), but not to a general rigid change of world coordinates
    (``se3_invariant = False``: the object sits at the origin). Positions are not read.

    Shapes: ``x (B, H, L, D)``, ``D % 8 == 0``; ``inputs["k_viewmats"] (B, Lk, 4, 4)``
    world-to-camera (optional ``q_viewmats``). Option ``radius`` ((1.5, 2.2): the clip of
    the camera distance)."""

    paper = "Kong et al. 2024 (EscherNet, CaPE 4-DoF)"
    rope_layout = "interleaved"
    rope_sign = 1.0
    se3_invariant = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        radius: Annotated[
            tuple[float, float],
            FloatSequence(length=2, above=0.0, doc="(r0, r1): camera distance clip"),
        ] = (1.5, 2.2),
        rotate_values: Annotated[
            bool, Refused("EscherNet's CaPE rotates queries and keys only", default=False)
        ] = False,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=False)
        if head_dim % 8:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'cape-4dof': head_dim % 8 == 0 "
                "(a quarter of whole channel pairs per pose number)"
            )
        if not radius[0] < radius[1]:
            raise ValueError(f"radius must be (r0, r1) with r0 < r1, got {radius}")
        self._set_channels(0, head_dim, "")
        self.dims = 1
        self.radius = tuple(radius)

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        """Without cameras: the zero pose (the identity)."""
        zero = torch.zeros(*pos.shape[:2], self.head_dim // 8, dtype=torch.float64)
        return [zero.to(pos.device)] * 4

    def _angles(self, view: Tensor) -> list[Tensor]:
        pose = spherical_pose(view, self.radius)
        n = self.head_dim // 8
        return [pose[..., a, None].expand(*pose.shape[:-1], n) for a in range(4)]

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> FrameState:
        q_view, _, k_view, _ = self.gather_cameras(q_pos, k_pos, inputs)
        return FrameState(None, None, q_angles=self._angles(q_view), k_angles=self._angles(k_view))

    def camera_blocks(self, viewmats, Ks, pos):  # pragma: no cover - no camera channels
        raise RuntimeError("cape-4dof has no camera block channels")
