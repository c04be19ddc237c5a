"""Synthetic multi-view scenes for the camera encodings (spec camera §4; no downloads,
deterministic per seed).

A scene is ``points`` spheres (radius ``point_radius``) uniform in the unit ball, each with a
colour id from a small ``palette`` (ids repeat, so appearance alone is ambiguous), seen by
``views`` pinhole cameras on a shell around the origin. Each view is a ``grid x grid`` image
of patch tokens (camera-major, x fastest); a token sees the first sphere its patch-centre ray
hits (``hit_id``, -1 for background) and carries that sphere's colour as a noisy one-hot
feature. The last view is the *target*, the others the *context*; a target token's
correspondence label is the index of the context token that sees the same sphere (the
sphere projects into that context patch and is the first hit on its centre ray), -1 when no
context token does (ignored in the loss).

``make_scenes(S, ...) -> dict`` of tensors (float64 geometry, ``T = views * grid^2`` tokens):

* ``points (S, N, 3)``, ``colour (S, N)``;
* ``viewmats (S, V, 4, 4)`` world-to-camera, ``Ks (S, V, 3, 3)``;
* ``hit_id (S, T)``, ``depth (S, T)`` (camera z of the hit sphere's centre, 0 for
  background), ``feat (S, T, palette + 1)`` (one-hot colour or background, plus
  ``N(0, 0.05^2)`` noise, float32), ``patch_xy (S, T, 2)``, ``camera_index (S, T)``,
  ``rays_o``, ``rays_d (S, T, 3)``, ``plucker (S, T, 6)``;
* ``label (S, grid^2)``: context token index per target token, or -1.

``apply_world_transform(scene, G)`` moves the world rigidly (``points <- G X``, ``viewmats <-
viewmats G^-1``, rays and Plücker coordinates recomputed; images and labels unchanged);
``set_reference(scene, view)`` re-expresses everything in the frame of camera ``view`` (the
first-camera gauge of CameraCtrl-style Plücker embeddings).

Cameras: centres at radius ``U(cam_radius)``, azimuth uniform, elevation within +-60 deg,
looking at a target ``N(0, 0.2^2 I)``, rolled by ``U(+-15 deg)`` about the optical axis;
focal ``f = (W/2) / tan(fov/2)`` with ``fov ~ U(fov_deg)``, principal point ``W/2 + N(0, 1)``.
Ray casting is exact and vectorised: the nearest sphere whose centre lies within
``point_radius`` of the ray, in front of the camera.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..cameras import apply_world_transform as move_cameras
from ..cameras import (
    look_at,
    patch_centers,
    pixel_rays,
    ray_plucker,
)
from ..validation import check_float, check_float_sequence, check_int

__all__ = ["make_scenes", "apply_world_transform", "set_reference", "scene_rays"]


def _uniform(gen: torch.Generator, shape: tuple[int, ...], lo: float, hi: float) -> Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)


def _cameras(
    gen: torch.Generator,
    S: int,
    V: int,
    image: int,
    cam_radius: tuple[float, float],
    fov_deg: tuple[float, float],
) -> tuple[Tensor, Tensor]:
    r = _uniform(gen, (S, V), *cam_radius)
    az = _uniform(gen, (S, V), -math.pi, math.pi)
    el = _uniform(gen, (S, V), -math.pi / 3, math.pi / 3)
    centre = torch.stack(
        (r * el.cos() * az.sin(), -r * el.sin(), -r * el.cos() * az.cos()), -1
    )  # world y down
    target = 0.2 * torch.randn(S, V, 3, generator=gen, dtype=torch.float64)
    w2c = look_at(centre, target)
    roll = _uniform(gen, (S, V), -math.pi / 12, math.pi / 12)
    Rz = torch.zeros(S, V, 4, 4, dtype=torch.float64)
    Rz[..., 0, 0], Rz[..., 0, 1] = roll.cos(), -roll.sin()
    Rz[..., 1, 0], Rz[..., 1, 1] = roll.sin(), roll.cos()
    Rz[..., 2, 2] = Rz[..., 3, 3] = 1.0
    w2c = Rz @ w2c
    fov = _uniform(gen, (S, V), *fov_deg) * math.pi / 180
    f = (image / 2) / torch.tan(fov / 2)
    K = torch.zeros(S, V, 3, 3, dtype=torch.float64)
    K[..., 0, 0] = K[..., 1, 1] = f
    K[..., 0, 2] = image / 2 + torch.randn(S, V, generator=gen, dtype=torch.float64)
    K[..., 1, 2] = image / 2 + torch.randn(S, V, generator=gen, dtype=torch.float64)
    K[..., 2, 2] = 1.0
    return w2c, K


def _cast(o: Tensor, d: Tensor, points: Tensor, radius: float) -> tuple[Tensor, Tensor]:
    """Nearest sphere hit by each ray: ``o, d (S, T, 3)``, ``points (S, N, 3)`` -> point
    index ``(S, T)`` (-1: none) and ray parameter of the closest approach."""
    rel = points[:, None, :, :] - o[:, :, None, :]  # (S, T, N, 3)
    s = (rel * d[:, :, None, :]).sum(-1)
    perp2 = (rel * rel).sum(-1) - s * s
    hit = (perp2 < radius * radius) & (s > 0)
    s_hit = torch.where(hit, s, torch.full_like(s, math.inf))
    best, idx = s_hit.min(-1)
    return torch.where(torch.isfinite(best), idx, torch.full_like(idx, -1)), best


def scene_rays(viewmats: Tensor, Ks: Tensor, grid: int, image: int) -> tuple[Tensor, Tensor]:
    """Patch-centre rays ``(S, V * grid^2, 3)`` (origins, unit directions), camera-major."""
    pix = patch_centers((grid, grid), (image, image)).to(viewmats)
    o, d = pixel_rays(viewmats, Ks, pix)
    return o.flatten(1, 2), d.flatten(1, 2)


def _labels(scene: dict, grid: int, image: int) -> Tensor:
    """Correspondence labels of the target view (see the module docstring)."""
    views, Ks, hit = scene["viewmats"], scene["Ks"], scene["hit_id"]
    S, V = views.shape[:2]
    P = grid * grid
    target_hit = hit[:, (V - 1) * P :]  # (S, P)
    label = torch.full((S, P), -1, dtype=torch.long)
    safe = target_hit.clamp_min(0)
    X = torch.gather(scene["points"], 1, safe[..., None].expand(S, P, 3))  # (S, P, 3)
    for c in range(V - 1):
        Xc = (views[:, c, None, :3, :3] @ X[..., None])[..., 0] + views[:, c, None, :3, 3]
        uv = (Ks[:, c, None] @ Xc[..., None])[..., 0]
        z = uv[..., 2]
        u, v = uv[..., 0] / z, uv[..., 1] / z
        inside = (z > 0) & (u >= 0) & (u < image) & (v >= 0) & (v < image)
        px = (u * grid / image).floor().clamp(0, grid - 1).long()
        py = (v * grid / image).floor().clamp(0, grid - 1).long()
        token = c * P + py * grid + px
        seen = inside & (target_hit >= 0)
        seen &= torch.gather(hit, 1, token) == target_hit
        label = torch.where(seen & (label < 0), token, label)
    return label


def _recompute_rays(scene: dict, grid: int, image: int) -> dict:
    o, d = scene_rays(scene["viewmats"], scene["Ks"], grid, image)
    scene["rays_o"], scene["rays_d"], scene["plucker"] = o, d, ray_plucker(o, d)
    return scene


def make_scenes(
    S: int,
    views: int = 3,
    points: int = 512,
    grid: int = 4,
    image: int = 32,
    palette: int = 6,
    cam_radius: Sequence[float] = (2.5, 3.5),
    fov_deg: Sequence[float] = (45.0, 65.0),
    point_radius: float = 0.07,
    seed: int = 0,
) -> dict[str, Tensor]:
    """``S`` random scenes (see the module docstring); the same ``seed`` gives the same
    scenes."""
    S = check_int(S, "S")
    views = check_int(views, "views", minimum=2)
    points = check_int(points, "points")
    grid = check_int(grid, "grid")
    image = check_int(image, "image")
    palette = check_int(palette, "palette")
    radii = check_float_sequence(cam_radius, "cam_radius", length=2, above=1.0)
    fovs = check_float_sequence(fov_deg, "fov_deg", length=2, above=0.0)
    if fovs[1] >= 180:
        raise ValueError(f"fov_deg must lie in (0, 180) degrees, got {fov_deg}")
    point_radius = check_float(point_radius, "point_radius", above=0.0)
    check_int(seed, "seed", minimum=None)
    gen = torch.Generator().manual_seed(seed)
    # points uniform in the unit ball
    dirs = torch.randn(S, points, 3, generator=gen, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    rad = torch.rand(S, points, 1, generator=gen, dtype=torch.float64) ** (1 / 3)
    pts = dirs * rad
    colour = torch.randint(0, palette, (S, points), generator=gen)
    w2c, K = _cameras(gen, S, views, image, (radii[0], radii[1]), (fovs[0], fovs[1]))
    o, d = scene_rays(w2c, K, grid, image)
    hit, _ = _cast(o, d, pts, point_radius)
    P = grid * grid
    camera_index = torch.arange(views).repeat_interleave(P).expand(S, -1)
    xy = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="xy"), -1)
    patch_xy = xy.reshape(P, 2).repeat(views, 1).expand(S, -1, -1)
    X = torch.gather(pts, 1, hit.clamp_min(0)[..., None].expand(*hit.shape, 3))
    per_token = torch.gather(w2c, 1, camera_index[..., None, None].expand(S, -1, 4, 4))
    z = ((per_token[..., 2, :3] * X).sum(-1) + per_token[..., 2, 3]).where(hit >= 0, 0.0)
    cid = torch.where(hit >= 0, torch.gather(colour, 1, hit.clamp_min(0)), palette)
    feat = torch.nn.functional.one_hot(cid, palette + 1).float()
    feat = feat + 0.05 * torch.randn(feat.shape, generator=gen)
    scene = {
        "points": pts,
        "colour": colour,
        "viewmats": w2c,
        "Ks": K,
        "hit_id": hit,
        "depth": z,
        "feat": feat,
        "patch_xy": patch_xy.contiguous(),
        "camera_index": camera_index.contiguous(),
    }
    _recompute_rays(scene, grid, image)
    scene["label"] = _labels(scene, grid, image)
    return scene


def apply_world_transform(scene: dict, G: Tensor, image: int = 32) -> dict:
    """The scene after the rigid world change ``G (4, 4)`` (or ``(S, 4, 4)``): points ``G X``,
    cameras ``w2c G^-1``, rays and Plücker coordinates recomputed; images, depths and labels
    unchanged. ``image``: the image size the scene was made with."""
    G = G.to(torch.float64)
    Gs = G if G.dim() == 3 else G.expand(scene["points"].shape[0], 4, 4)
    out = dict(scene)
    out["points"] = (Gs[:, None, :3, :3] @ scene["points"][..., None])[..., 0] + Gs[:, None, :3, 3]
    out["viewmats"] = move_cameras(scene["viewmats"], Gs[:, None])
    grid = int(round(math.sqrt(scene["label"].shape[1])))
    return _recompute_rays(out, grid, image)


def set_reference(scene: dict, view: int = 0, image: int = 32) -> dict:
    """The scene in the frame of camera ``view`` (that camera becomes the identity):
    ``apply_world_transform`` with ``G = w2c_view``."""
    check_int(view, "view", minimum=0, maximum=scene["viewmats"].shape[1] - 1)
    return apply_world_transform(scene, scene["viewmats"][:, view], image)
