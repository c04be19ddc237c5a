"""PRoPE, "Cameras as Relative Positional Encoding" (Li et al., NeurIPS 2025, arXiv
2507.10496; official code liruilong940607/prope, ``per_token_camera.py``), and StereoWorld's
unified camera-frame encoding (Sun et al. 2026, "Stereo World Model: Camera-Guided Stereo
Video Generation", arXiv 2603.17375; code VAST-AI-Research/StereoWorld, ``prope_utils.py``
``_prepare_apply_fns_all_dim``).

PRoPE's per-token frame (``frames.CameraFrames``), with ``D % 8 == 0`` by default:

* channels ``[0, D/2)``: ``Proj4(P_i)``, ``P = lift(K~) w2c`` (image <- world) with the
  image-normalised intrinsics ``K~ = [[fx/W, 0, cx/W - 1/2], [0, fy/H, cy/H - 1/2], [0, 0,
  1]]`` (``relpos.cameras.normalize_K``); without intrinsics ``P = w2c`` (the "GTA
  formula"). ``P^-1 = c2w lift(K~^-1)`` in closed form.
* channels ``[D/2, 3D/4)``: RoPE of the patch column x; ``[3D/4, D)``: RoPE of the row y;
  split-half pairs, ``omega_i = base^(-i / n)`` for ``i < n = D/8`` (base 100);
  q, k and v turn by ``-omega p``, the output by ``+omega p`` (logits depend on
  ``p_i - p_j``, the opposite sign of HF RoPE).

So ``logit_ij = q^T blockdiag(P_i P_j^-1, R(omega (p_i - p_j))) k``, invariant to a rigid
change of world coordinates. ``rope_fraction`` sets the RoPE share of the head (0: all
channels camera, StereoWorld); ``principal_point="zero"`` drops the principal point from
``K~`` (StereoWorld). Not orthogonal: the logit scale depends on scene units and focal
lengths (normalise scenes, e.g. unit mean camera distance).

Shapes: ``x (B, H, L, D)``; ``pos (B|1, L, 2)`` = (x = column, y = row) integer or float
patch indices within each image (the same pixel in two views has the same phase); inputs as
in ``frames``: ``k_viewmats (B, Lk, 4, 4)`` and optional ``k_Ks (B, Lk, 3, 3)``,
``q_viewmats``, ``q_Ks``; intrinsics need ``image_size=(W, H)``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ...cameras import invert_K, invert_se3, normalize_K
from ..options import Choice, Float, Refused
from ..registry import register
from .frames import IMAGE_SIZE, ROTATE_VALUES, CameraFrames

__all__ = ["PRoPE", "StereoWorld", "lift"]


def lift(K: Tensor) -> Tensor:
    """``blockdiag(K, 1)``: 3x3 intrinsics ``(..., 3, 3)`` as 4x4 ``(..., 4, 4)``."""
    out = torch.zeros(*K.shape[:-2], 4, 4, dtype=K.dtype, device=K.device)
    out[..., :3, :3] = K
    out[..., 3, 3] = 1
    return out


PATCH_BASE = Float(above=1.0, doc="RoPE base of the patch channels")
ROPE_FRACTION = Float(minimum=0.0, below=1.0, doc="share of the head that is RoPE")
PRINCIPAL_POINT = Choice(choices=("normalized", "zero"), doc="keep (cx/W - 1/2) or zero it in K~")


@register("prope")
class PRoPE(CameraFrames):
    """PRoPE (see the module docstring). Options: ``image_size=(W, H)`` (pixels; needed with
    intrinsics), ``base`` (100), ``rope_fraction`` (0.5: half the head is RoPE, split between
    x and y), ``principal_point`` ("normalized" | "zero"), ``rotate_values`` (True)."""

    paper = "Li et al. 2025 (PRoPE, Cameras as Relative Positional Encoding)"
    reads_intrinsics = True
    rope_layout = "half"
    rope_sign = -1.0
    rope_multiple = 4

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        base: Annotated[float, PATCH_BASE] = 100.0,
        rope_fraction: Annotated[float, ROPE_FRACTION] = 0.5,
        principal_point: Annotated[str, PRINCIPAL_POINT] = "normalized",
        rotate_values: Annotated[bool, ROTATE_VALUES] = True,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        self.image_size = image_size
        self.base = base
        self.rope_fraction = rope_fraction
        self.principal_point = principal_point
        rope = int(round(head_dim * rope_fraction))
        if abs(head_dim * rope_fraction - rope) > 1e-9:
            rope = -1  # not a whole number of channels: refused below
        self._set_channels(
            head_dim - rope,
            rope,
            f"rope_fraction={rope_fraction} needs head_dim * rope_fraction and the rest to be "
            "multiples of 4 (PRoPE's default 0.5 needs head_dim % 8 == 0)",
        )
        n = rope // 4  # pairs per axis
        inv = base ** (-torch.arange(n, dtype=torch.float64) / max(n, 1))
        self.register_buffer("inv_freq", inv, persistent=False)

    @classmethod
    def example_options(cls) -> dict:
        return {"image_size": (32.0, 32.0)}

    def _normalized_K(self, Ks: Tensor) -> Tensor:
        if self.image_size is None:
            raise ValueError(
                f"encoding {self.name!r} got intrinsics (inputs['k_Ks']) but no image size: "
                f"create it with image_size=(W, H) in pixels"
            )
        return normalize_K(Ks, self.image_size, self.principal_point)

    def camera_blocks(
        self, viewmats: Tensor, Ks: Tensor | None, pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        if Ks is None:
            return viewmats, invert_se3(viewmats)
        K = self._normalized_K(Ks)
        P = lift(K) @ viewmats
        P_inv = invert_se3(viewmats) @ lift(invert_K(K))
        return P, P_inv

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        inv = self.inv_freq.to(device=pos.device, dtype=torch.float64)
        p = pos.to(torch.float64)
        return [p[..., 0, None] * inv, p[..., 1, None] * inv]


@register("stereoworld")
class StereoWorld(PRoPE):
    """StereoWorld's camera encoding (arXiv 2603.17375; code read): PRoPE's ``Proj4(P)``
    on *all* head channels (no RoPE channels: tokens of one camera have no position) with the
    principal point zeroed, ``K~ = diag(fx/W, fy/H, 1)``. In StereoWorld it runs as a
    zero-initialised branch parallel to the pretrained RoPE attention
    (``relpos.nn.CameraAdapter(..., "stereoworld", qk_norm=True)``: own q/k/v, RMSNorm on q
    and k, the output projection zero-initialised); poses
    relative to frame 0 (``relpos.cameras.anchor``), right eye ``c2w_R = c2w_L
    Trans(0.065 e_x)``. Needs ``head_dim % 4 == 0``."""

    paper = "StereoWorld 2025 (unified camera-frame PRoPE branch)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        base: Annotated[float, Refused("StereoWorld has no RoPE channels", default=100.0)] = 100.0,
        rope_fraction: Annotated[
            float, Refused("StereoWorld puts the camera on every channel", default=0.0)
        ] = 0.0,
        principal_point: Annotated[
            str, Refused("StereoWorld zeroes the principal point", default="zero")
        ] = "zero",
        rotate_values: Annotated[bool, ROTATE_VALUES] = True,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            image_size=image_size,
            base=base,
            rope_fraction=rope_fraction,
            principal_point=principal_point,
            rotate_values=rotate_values,
        )
