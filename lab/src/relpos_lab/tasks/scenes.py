"""Synthetic multi-view scenes for the camera encodings (no downloads,
deterministic per seed).

A scene is ``points`` spheres (radius ``point_radius``) uniform in the unit ball, each with a
colour id from a small ``palette`` (ids repeat, so appearance alone is ambiguous), seen by
``views`` pinhole cameras on a shell around the origin. Each view is a ``grid x grid`` image
of patch tokens (camera-major, x fastest); a token sees the first sphere its patch-centre ray
enters (``hit_id``, -1 for background) and carries that sphere's colour as a noisy one-hot
feature. The last view is the *target*, the others the *context*.

Correspondence labels (depth-consistent reprojection). A target token whose centre ray
enters sphere ``X`` at the surface point ``Y`` is labelled with the context token that

1. sees ``X`` itself (its own centre ray's first sphere is ``X``: the token shows the same
   object, so its appearance matches),
2. in a context view where ``Y`` is in front of the camera, projects inside the image and is
   not occluded (the first sphere on the context camera's ray through ``Y`` is ``X``: the
   depth test of depth-map reprojection, at sphere granularity),
3. has its patch centre nearest to ``Y``'s projection, at most ``pixel_radius`` pixels away
   (default: one patch pitch, ``image / grid``); over several context views the nearest wins
   (ties: the first view).

Otherwise the label is -1 (ignored in the loss). Every step reads only where points and
rays are relative to the cameras, so the labels are invariant to a rigid change of world
coordinates (they are recomputed and compared in the tests) and deterministic per seed.

*Why not the first rule.* A first design labelled a target token only when the hit sphere's *centre*
projects into a context patch whose centre ray hits the same sphere, at 512 spheres of radius
0.07 seen at 45-65 deg: 0.68 % of target tokens got a label (3.5 % at radius 0.15, 5.8 % at
0.25). The rule is not the main culprit: at 3 units a 32-pixel image with 4 x 4 patches has a
patch footprint of about 0.8 world units, so a 0.07 sphere covers ~1/100 of a patch and two
views' 16 centre rays almost never enter the same small sphere, whatever the rule (the rule
above gives 0.6 % there too); and at 45-65 deg the unit ball fills only the central patches
(35 % of target centre rays hit anything). The defaults are therefore a scene that fills the
image and whose spheres are comparable to a patch: 64 spheres of radius 0.25, fov 30-40 deg
(the ball's angular radius at 3 units is 19.5 deg), which gives about 25 % labelled target
tokens (84 % see a sphere) with about 5.5 same-colour context tokens per labelled target
(appearance alone is right about 1 time in 5). The first design's numbers are all still options.

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
Ray casting is exact and vectorised: a ray enters a sphere when the sphere's centre lies
within ``point_radius`` of it; the first sphere is the one entered first, in front of the
camera.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from relpos.cameras import apply_world_transform as move_cameras
from relpos.cameras import invert_se3, look_at, patch_centers, pixel_rays, ray_plucker
from relpos.validation import check_float, check_float_sequence, check_int

__all__ = [
    "make_scenes",
    "apply_world_transform",
    "set_reference",
    "scene_rays",
    "correspondence_labels",
    "label_rate",
]


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
    """First sphere hit by each ray: ``o, d (S, T, 3)`` (unit ``d``), ``points (S, N, 3)``
    -> sphere index ``(S, T)`` (-1: none) and the ray parameter where the ray enters it
    (``inf`` for none). A ray hits a sphere when its centre lies within ``radius`` of the
    ray, in front of the origin; the first hit is the smallest entry parameter."""
    # |X - o|^2 and (X - o) . d by matrix products: (S, T, N) without an (S, T, N, 3) array
    s = d @ points.transpose(1, 2) - (o * d).sum(-1, keepdim=True)
    rel2 = (
        (points * points).sum(-1)[:, None, :]
        - 2 * (o @ points.transpose(1, 2))
        + (o * o).sum(-1, keepdim=True)
    )
    perp2 = rel2 - s * s
    inside = perp2 < radius * radius
    entry = s - (radius * radius - perp2).clamp_min(0).sqrt()
    entry = torch.where(inside & (entry > 0), entry, torch.full_like(s, math.inf))
    best, idx = entry.min(-1)
    return torch.where(torch.isfinite(best), idx, torch.full_like(idx, -1)), best


def scene_rays(viewmats: Tensor, Ks: Tensor, grid: int, image: int) -> tuple[Tensor, Tensor]:
    """Patch-centre rays ``(S, V * grid^2, 3)`` (origins, unit directions), camera-major."""
    pix = patch_centers((grid, grid), (image, image)).to(viewmats)
    o, d = pixel_rays(viewmats, Ks, pix)
    return o.flatten(1, 2), d.flatten(1, 2)


def correspondence_labels(
    scene: dict, grid: int, image: int, point_radius: float, pixel_radius: float
) -> Tensor:
    """The target view's correspondence labels ``(S, grid^2)`` from the scene's geometry
    (depth-consistent reprojection; see the module docstring): a target token whose centre
    ray enters sphere ``X`` at the surface point ``Y`` is labelled with the context token
    that (1) sees ``X`` on its own centre ray and (2) has the patch centre nearest to ``Y``'s
    projection in a context view where (3) ``Y`` projects inside the image and the first
    sphere on the context ray through that pixel is ``X`` (``Y`` not occluded), with (4) that
    distance at most ``pixel_radius`` pixels; -1 when no context token qualifies."""
    views, Ks, hit = scene["viewmats"], scene["Ks"], scene["hit_id"]
    points = scene["points"]
    S, V = views.shape[:2]
    P = grid * grid
    o, d = scene["rays_o"][:, (V - 1) * P :], scene["rays_d"][:, (V - 1) * P :]
    target = hit[:, (V - 1) * P :]
    _, entry = _cast(o, d, points, point_radius)
    Y = o + torch.where(target >= 0, entry, torch.zeros_like(entry))[..., None] * d  # (S, P, 3)
    pix = patch_centers((grid, grid), (image, image)).to(points)  # (P, 2)
    best = torch.full((S, P), math.inf, dtype=points.dtype)
    label = torch.full((S, P), -1, dtype=torch.long)
    for c in range(V - 1):
        Yc = (views[:, c, None, :3, :3] @ Y[..., None])[..., 0] + views[:, c, None, :3, 3]
        z = Yc[..., 2]
        uvw = (Ks[:, c, None] @ Yc[..., None])[..., 0]
        uv = uvw[..., :2] / torch.where(z > 0, z, torch.ones_like(z))[..., None]
        inside = (target >= 0) & (z > 0) & (uv >= 0).all(-1) & (uv < image).all(-1)
        centre = invert_se3(views[:, c])[:, None, :3, 3].expand_as(Y)
        ray = Y - centre
        first, _ = _cast(centre, ray / ray.norm(dim=-1, keepdim=True), points, point_radius)
        visible = inside & (first == target)
        sees = hit[:, c * P : (c + 1) * P]  # (S, P_context)
        dist2 = ((uv[:, :, None, :] - pix[None, None]) ** 2).sum(-1)  # (S, P_target, P_ctx)
        ok = visible[..., None] & (sees[:, None, :] == target[..., None])
        ok &= dist2 <= pixel_radius * pixel_radius
        dist2 = torch.where(ok, dist2, torch.full_like(dist2, math.inf))
        near, idx = dist2.min(-1)
        better = near < best
        best = torch.where(better, near, best)
        label = torch.where(better, c * P + idx, label)
    return label


def _recompute_rays(scene: dict, grid: int, image: int) -> dict:
    o, d = scene_rays(scene["viewmats"], scene["Ks"], grid, image)
    scene["rays_o"], scene["rays_d"], scene["plucker"] = o, d, ray_plucker(o, d)
    return scene


def make_scenes(
    S: int,
    views: int = 3,
    points: int = 64,
    grid: int = 4,
    image: int = 32,
    palette: int = 6,
    cam_radius: Sequence[float] = (2.5, 3.5),
    fov_deg: Sequence[float] = (30.0, 40.0),
    point_radius: float = 0.25,
    pixel_radius: float | None = None,
    seed: int = 0,
) -> dict[str, Tensor]:
    """``S`` random scenes (see the module docstring); the same ``seed`` gives the same
    scenes. ``pixel_radius``: the largest distance in pixels between a target point's
    reprojection and its labelled context patch centre (default ``image / grid``)."""
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
    pixel_radius = (
        image / grid
        if pixel_radius is None
        else check_float(pixel_radius, "pixel_radius", above=0.0)
    )
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
    scene["label"] = correspondence_labels(scene, grid, image, point_radius, pixel_radius)
    return scene


def label_rate(scene: dict) -> float:
    """The fraction of target tokens that have a correspondence label."""
    return float((scene["label"] >= 0).double().mean()) if scene["label"].numel() else 0.0


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
