"""UCPE, Unified Camera Positional Encoding, "Relative Ray Encoding" ("Unified Camera
Positional Encoding for Controlled Video Generation", arXiv 2512.07237; official code
chengzhag/UCPE, ``src/camera_control.py`` ``world_to_ray_mats``).

PRoPE without intrinsics in the matrix, but with one frame per *ray*: token ``i``'s camera
block is the rigid world-to-ray matrix of its patch-centre ray,

    d_cam = unproject(u_i, v_i)    (UCM lens model, xi = 0: pinhole)
    d_w = R_c2w d_cam,  z = d_w / |d_w|,  x = normalize(cam_y x z),  y = normalize(z x x)
    R_w2l = [x y z]^T,  t_w2l = -R_w2l c        (cam_y = R_c2w[:, 1], c the camera centre)

on the first half of the head (``Proj4``), and PRoPE's RoPE channels (patch indices, base
100, ``p_i - p_j`` sign) on the rest. Every frame moves with the world (``w2l -> w2l
G^-1``), so logits are invariant to a rigid change of world coordinates (to float64 rounding);
identical cameras give identical per-pixel frames. UCM unprojection (standard formula):
``m = ((u - cx)/fx, (v - cy)/fy)``, ``lambda = (xi + sqrt(1 + (1 - xi^2)|m|^2)) / (1 +
|m|^2)``, ray ``(lambda m, lambda - xi)``; ``xi`` in [0, 1].

UCPE's **Absolute Orientation Encoding** ("absmap", chengzhag/UCPE ``compute_up_lat_map``,
read, not copied) is absolute, so it is a helper next to the encoding, like the Plücker
rays: ``orientation_map`` gives per patch ``(up_x, up_y, lat)`` — the latitude of the ray
``lat = atan2(-Y_w, sqrt(X_w^2 + Z_w^2))`` (``d_w = R_c2w d_cam`` unit, world y down, i.e.
``world_up = (0, -1, 0)``) and the unit image direction ``up`` in which the ray moves when it
is turned by ``delta = 0.1`` rad toward world-up (Rodrigues about ``normalize(d_w x up)``, the
turned ray projected with the UCM lens): pitch and roll only, blind to yaw and position.
``OrientationEmbedding`` is UCPE's ``cam_encoder``: ``Linear(3, dim)`` added to the tokens
before q, k, v. UCPE's parallel-adapter block (own q/k/v, zero-init output, the
orientation embedding on its input) is ``relpos.nn.CameraAdapter``.

Shapes: ``pos (B|1, L, 2)`` = (x, y) patch indices on a ``grid=(Px, Py)`` grid of a
``image_size=(W, H)`` image (the ray of patch (x, y) passes through pixel ``((x + 0.5) W /
Px, (y + 0.5) H / Py)``); inputs ``k_viewmats (B, Lk, 4, 4)`` and ``k_Ks (B, Lk, 3, 3)``
(required: the rays are cast through them), optional ``q_viewmats``, ``q_Ks``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from torch import Tensor, nn

from ...cameras import check_intrinsics, check_viewmats, invert_se3, patch_centers
from ...validation import check_float, check_float_sequence, check_int
from ..options import Float, Refused
from ..registry import register
from .frames import IMAGE_SIZE, PATCH_GRID, ROTATE_VALUES
from .prope import PATCH_BASE, ROPE_FRACTION, PRoPE

__all__ = [
    "UCPE",
    "OrientationEmbedding",
    "orientation_map",
    "ucm_project",
    "ucm_unproject",
    "world_to_ray",
]


def ucm_unproject(pixels: Tensor, Ks: Tensor, xi: float = 0.0) -> Tensor:
    """Unit camera-frame rays of the unified camera model through ``pixels (..., 2)`` with
    intrinsics ``Ks (..., 3, 3)``: ``(..., 3)``; ``xi = 0`` is the pinhole camera."""
    mx = (pixels[..., 0] - Ks[..., 0, 2]) / Ks[..., 0, 0]
    my = (pixels[..., 1] - Ks[..., 1, 2]) / Ks[..., 1, 1]
    r2 = mx * mx + my * my
    lam = (xi + torch.sqrt(1 + (1 - xi * xi) * r2)) / (1 + r2)
    ray = torch.stack((lam * mx, lam * my, lam - xi), -1)
    return ray / ray.norm(dim=-1, keepdim=True)


def ucm_project(points: Tensor, Ks: Tensor, xi: float = 0.0) -> Tensor:
    """Pixels ``(..., 2)`` of camera-frame points ``(..., 3)`` under the unified camera model:
    ``u = fx X / (Z + xi |X|) + cx``, ``v = fy Y / (Z + xi |X|) + cy`` (``xi = 0``: pinhole)."""
    alpha = points[..., 2] + xi * points.norm(dim=-1)
    u = Ks[..., 0, 0] * points[..., 0] / alpha + Ks[..., 0, 2]
    v = Ks[..., 1, 1] * points[..., 1] / alpha + Ks[..., 1, 2]
    return torch.stack((u, v), -1)


def orientation_map(
    viewmats: Tensor,
    Ks: Tensor,
    grid: Sequence[int],
    image_size: Sequence[float],
    *,
    xi: float = 0.0,
    delta: float = 0.1,
    world_up: Sequence[float] = (0.0, -1.0, 0.0),
) -> Tensor:
    """UCPE's absolute orientation map (module docstring): ``(up_x, up_y, lat)`` of every
    patch-centre ray, ``viewmats (..., C, 4, 4)`` world-to-camera, ``Ks (..., C, 3, 3)`` ->
    ``(..., C * Px * Py, 3)``, camera-major, x fastest. ``world_up``: the world's up
    direction (UCPE: y down, ``(0, -1, 0)``); rays parallel to it get ``up = (0, 0)``."""
    view = check_viewmats(viewmats, "viewmats")
    K = check_intrinsics(Ks, "Ks")
    xi = check_float(xi, "xi", minimum=0.0, maximum=1.0)
    delta = check_float(delta, "delta", above=0.0, below=math.pi / 2)
    up = torch.tensor(check_float_sequence(world_up, "world_up", length=3), dtype=view.dtype)
    if float(up.norm()) == 0:
        raise ValueError("world_up must be a non-zero 3-vector")
    up = (up / up.norm()).to(view.device)
    pixels = patch_centers(grid, image_size, dtype=view.dtype).to(view.device)  # (N, 2)
    Kc = K[..., None, :, :]
    d_cam = ucm_unproject(pixels, Kc, xi)  # (..., C, N, 3)
    R_c2w = view[..., None, :3, :3].transpose(-1, -2)
    d_w = (R_c2w @ d_cam[..., None])[..., 0]
    d_w = d_w / d_w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    vertical = (d_w * up).sum(-1)
    horizontal = (d_w - vertical[..., None] * up).norm(dim=-1)
    lat = torch.atan2(vertical, horizontal)
    axis = torch.linalg.cross(d_w, up.expand_as(d_w))
    norm = axis.norm(dim=-1, keepdim=True)
    axis = axis / norm.clamp_min(1e-12)
    # Rodrigues with the axis orthogonal to the ray: d cos + (axis x d) sin
    turned = d_w * math.cos(delta) + torch.linalg.cross(axis, d_w) * math.sin(delta)
    moved = ucm_project((R_c2w.transpose(-1, -2) @ turned[..., None])[..., 0], Kc, xi)
    step = moved - ucm_project(d_cam, Kc, xi)
    step = torch.where(norm > 1e-9, step, torch.zeros_like(step))
    step = step / step.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.cat((step, lat[..., None]), -1).flatten(-3, -2)


class OrientationEmbedding(nn.Module):
    """UCPE's ``cam_encoder`` for the orientation map: ``Linear(3, dim)`` of ``(up_x, up_y,
    lat)`` per token, added to the tokens before q, k and v. ``forward(orientation (B, L,
    3)) -> (B, L, dim)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.proj = nn.Linear(3, self.dim)

    def forward(self, orientation: Tensor) -> Tensor:
        if (
            not isinstance(orientation, Tensor)
            or orientation.dim() != 3
            or orientation.shape[-1] != 3
        ):
            shape = (
                tuple(orientation.shape)
                if isinstance(orientation, Tensor)
                else type(orientation).__name__
            )
            raise ValueError(
                f"orientation must have shape (B, L, 3) = (up_x, up_y, lat), got {shape}"
            )
        return self.proj(orientation)


def world_to_ray(viewmats: Tensor, d_cam: Tensor, eps: float = 1e-6) -> Tensor:
    """UCPE's rigid world-to-ray matrices ``(..., 4, 4)`` from world-to-camera ``viewmats
    (..., 4, 4)`` and unit camera-frame rays ``d_cam (..., 3)`` (formula in the module
    docstring)."""
    R_c2w = viewmats[..., :3, :3].transpose(-1, -2)
    c = -(R_c2w @ viewmats[..., :3, 3:])[..., 0]
    z = (R_c2w @ d_cam[..., None])[..., 0]
    z = z / z.norm(dim=-1, keepdim=True).clamp_min(eps)
    cam_y = R_c2w[..., :, 1]
    x = torch.linalg.cross(cam_y, z)
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(eps)
    y = torch.linalg.cross(z, x)
    y = y / y.norm(dim=-1, keepdim=True).clamp_min(eps)
    R = torch.stack((x, y, z), -2)
    t = -(R @ c[..., None])
    top = torch.cat((R, t), -1)
    return torch.cat((top, viewmats[..., 3:, :]), -2)


@register("ucpe")
class UCPE(PRoPE):
    """UCPE's relative ray encoding (see the module docstring). Options: ``grid=(Px, Py)``
    and ``image_size=(W, H)`` (both needed to cast the patch rays), ``xi`` (UCM, 0 =
    pinhole), ``base`` (100), ``rope_fraction`` (0.5), ``rotate_values`` (True)."""

    paper = "UCPE 2025 (Unified Camera Positional Encoding, relative ray encoding)"
    needs_intrinsics = True
    #: the ray frames read the absolute pixel of each patch: a shift of the positions moves
    #: the rays, so logits are not a function of ``q_pos - k_pos`` alone
    relative = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        grid: Annotated[tuple[int, int] | None, PATCH_GRID] = None,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        xi: Annotated[
            float, Float(minimum=0.0, maximum=1.0, doc="unified camera model parameter")
        ] = 0.0,
        base: Annotated[float, PATCH_BASE] = 100.0,
        rope_fraction: Annotated[float, ROPE_FRACTION] = 0.5,
        principal_point: Annotated[
            str, Refused("the ray frames carry no intrinsics", default="normalized")
        ] = "normalized",
        rotate_values: Annotated[bool, ROTATE_VALUES] = True,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            image_size=image_size,
            base=base,
            rope_fraction=rope_fraction,
            rotate_values=rotate_values,
        )
        self.grid, self.xi = grid, xi

    @classmethod
    def example_options(cls) -> dict:
        return {"grid": (4, 4), "image_size": (32.0, 32.0)}

    def camera_blocks(
        self, viewmats: Tensor, Ks: Tensor | None, pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        if self.grid is None or self.image_size is None:
            raise ValueError(
                "encoding 'ucpe' casts a ray per patch: create it with grid=(Px, Py) and "
                "image_size=(W, H)"
            )
        assert Ks is not None  # required input
        W, H = self.image_size
        px, py = self.grid
        p = pos.to(torch.float64)
        pixels = torch.stack(((p[..., 0] + 0.5) * (W / px), (p[..., 1] + 0.5) * (H / py)), -1)
        pixels = pixels.expand(*torch.broadcast_shapes(pixels.shape[:-1], viewmats.shape[:-2]), 2)
        T = world_to_ray(viewmats, ucm_unproject(pixels, Ks, self.xi))
        return T, invert_se3(T)
