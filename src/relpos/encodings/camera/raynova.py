"""RAYNOVA's relative Plücker-ray positional encoding (Xie et al. 2026, "RAYNOVA:
Scale-Temporal Autoregressive World Modeling in Ray Space", arXiv 2602.20685; official code
Applied-Intuition-Open-Source/RayNova@d54a0ab, ``infinity/raynova_models/rope.py``
``apply_rotary_emb_with_camera_ray6D``).

Axial RoPE over seven coordinates of each token, in one fixed world frame (RayNova: the
first frame's ego frame; ``relpos.cameras.anchor`` re-expresses the cameras so):

* the time index ``t``;
* the unit direction ``d`` of the patch-centre ray (pixel ``((x + 1/2) W / Px, (y + 1/2) H
  / Py)``, ``relpos.cameras.pixel_rays``);
* the Plücker moment ``m = c x d`` of that ray (``moment=True``, RayNova's "prel"), or the
  camera centre ``c`` (``moment=False``).

The head is cut into 8 equal parts ``[t t | d_x | d_y | d_z | m_x | m_y | m_z]`` (t takes the
first two as one section); each section of ``n`` channels is a 1-D RoPE with
``inv_freq_i = base^(-2i / n)`` and ``angle = scale * coordinate * inv_freq`` (scales 30 for
t, 50 for d, 2 for m or c), interleaved pairs, queries and keys only (q and k turn by
``+angle``). ``D % 16 == 0``.

Logits depend on coordinate differences, but the coordinates live in one world frame: the
encoding is **not** invariant to a rigid change of world coordinates (``se3_invariant =
False``: a logit moves under a rigid transform; moments shift by ``t x d`` under
a translation), and it reads absolute pixels through the rays (``relative = False``).
Without a rotation state (``rotate`` called directly) only the time channels turn.

Shapes: ``pos (B|1, L, 3)`` = (t, x, y): time index and patch column/row on a
``grid=(Px, Py)`` grid of an ``image_size=(W, H)`` image; inputs ``k_viewmats (B, Lk, 4,
4)``, ``k_Ks (B, Lk, 3, 3)`` (required), optional ``q_viewmats``, ``q_Ks``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ...cameras import camera_centers, pixel_rays
from ..options import Bool, Float, FloatSequence, Refused
from ..registry import register
from .frames import IMAGE_SIZE, PATCH_GRID, CameraFrames, FrameState

__all__ = ["RayNova", "ray_coordinates"]


def ray_coordinates(
    viewmats: Tensor,
    Ks: Tensor,
    pos: Tensor,
    grid: tuple[int, int],
    image_size: tuple[float, float],
    moment: bool = True,
) -> Tensor:
    """RayNova's seven coordinates per token ``(B|1, L, 7)`` = (t, d_xyz, m_xyz) (or the
    camera centre instead of the moment) from per-token ``viewmats (B|1, L, 4, 4)``, ``Ks
    (B|1, L, 3, 3)`` and ``pos (B|1, L, 3)`` = (t, x, y)."""
    W, H = image_size
    px, py = grid
    p = pos.to(viewmats.dtype)
    pixels = torch.stack(((p[..., 1] + 0.5) * (W / px), (p[..., 2] + 0.5) * (H / py)), -1)
    shape = torch.broadcast_shapes(pixels.shape[:-1], viewmats.shape[:-2], Ks.shape[:-2])
    pixels = pixels.expand(*shape, 2)
    o, d = pixel_rays(viewmats.expand(*shape, 4, 4), Ks.expand(*shape, 3, 3), pixels[..., None, :])
    o, d = o[..., 0, :], d[..., 0, :]
    third = torch.linalg.cross(o, d) if moment else camera_centers(viewmats).expand_as(d)
    t = p[..., :1].expand(*shape, 1)
    return torch.cat((t, d, third), -1)


@register("raynova")
class RayNova(CameraFrames):
    """RAYNOVA's axial Plücker-ray RoPE (see the module docstring). Options: ``grid=(Px,
    Py)`` and ``image_size=(W, H)`` (both needed for the rays), ``scales`` ((30, 50, 2): time,
    direction, moment), ``base`` (100), ``moment`` (True: ``c x d``; False: the centre)."""

    paper = "RAYNOVA 2025 (relative Plücker-ray positional encoding)"
    reads_intrinsics = True
    needs_intrinsics = True
    rope_layout = "interleaved"
    rope_sign = 1.0
    relative = False
    se3_invariant = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        grid: Annotated[tuple[int, int] | None, PATCH_GRID] = None,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        scales: Annotated[
            tuple[float, float, float],
            FloatSequence(length=3, doc="angle scales of (time, direction, moment)"),
        ] = (30.0, 50.0, 2.0),
        base: Annotated[float, Float(above=1.0, doc="RoPE base of every section")] = 100.0,
        moment: Annotated[
            bool, Bool(doc="Plücker moment c x d (True) or camera centre c (False)")
        ] = True,
        rotate_values: Annotated[
            bool, Refused("RAYNOVA rotates queries and keys only", default=False)
        ] = False,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=False)
        if head_dim % 16:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'raynova': head_dim % 16 == 0 (8 "
                "equal parts of whole rotary pairs)"
            )
        self._set_channels(0, head_dim, "head_dim % 16 == 0")
        self.dims = 3
        self.grid, self.image_size, self.scales = grid, image_size, tuple(scales)
        self.base, self.moment = base, moment
        part = head_dim // 8
        sizes = [2 * part] + [part] * 6  # channels per section
        axis_scale = [scales[0]] + [scales[1]] * 3 + [scales[2]] * 3
        freqs = [
            s * base ** (-torch.arange(0, n, 2, dtype=torch.float64) / n)
            for s, n in zip(axis_scale, sizes, strict=True)
        ]
        self._freqs = freqs  # float64 (pairs,) per section: angle = coordinate * freq

    @classmethod
    def example_options(cls) -> dict:
        return {"grid": (4, 4), "image_size": (32.0, 32.0)}

    def _angles(self, coords: Tensor) -> list[Tensor]:
        return [coords[..., a, None] * f.to(coords.device) for a, f in enumerate(self._freqs)]

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        """Without cameras: the time channels only (the ray coordinates are zero)."""
        coords = torch.zeros(*pos.shape[:-1], 7, dtype=torch.float64, device=pos.device)
        coords[..., 0] = pos[..., 0].to(torch.float64)
        return self._angles(coords)

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> FrameState:
        if self.grid is None or self.image_size is None:
            raise ValueError(
                "encoding 'raynova' casts a ray per patch: create it with grid=(Px, Py) and "
                "image_size=(W, H)"
            )
        q_view, q_K, k_view, k_K = self.gather_cameras(q_pos, k_pos, inputs)
        assert q_K is not None and k_K is not None  # k_Ks is required
        sides = []
        for view, K, pos in ((q_view, q_K, q_pos), (k_view, k_K, k_pos)):
            coords = ray_coordinates(view, K, pos, self.grid, self.image_size, self.moment)
            sides.append(self._angles(coords))
        return FrameState(None, None, q_angles=sides[0], k_angles=sides[1])

    def camera_blocks(self, viewmats, Ks, pos):  # pragma: no cover - no camera channels
        raise RuntimeError("raynova has no camera block channels")
