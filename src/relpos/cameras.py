"""Camera and ray utilities for the camera encodings (``relpos.encodings.camera``).

Conventions, stated once (every function here and every camera encoding follows them):

* ``viewmats`` are **world-to-camera** (w2c) 4x4 matrices ``[R | t; 0 0 0 1]`` with OpenCV
  axes (x right, y down, z forward): a world point ``X`` has camera coordinates
  ``R X + t``. The camera-to-world matrix is ``c2w = invert_se3(w2c) = [R^T | -R^T t]``
  and the camera centre is ``c2w[:3, 3]``. Feeding c2w where w2c is expected is the
  commonest bug: the camera encodings then lose their invariance to a rigid change of world
  coordinates (logits change by several units). ``check_viewmats`` rejects non-rigid
  matrices but cannot tell w2c from c2w (both are rigid); ``camera_centers`` and
  ``look_at`` make the direction explicit.
* ``Ks`` are 3x3 pixel intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` without skew;
  ``image_size = (W, H)`` in pixels; pixel ``(u, v)`` = (column, row), pixel centres at
  ``(i + 0.5, j + 0.5)``.
* A rigid change of world coordinates ``G`` maps ``X -> G X``, ``w2c -> w2c G^-1``,
  ``c2w -> G c2w`` (``apply_world_transform``); images and tokens are unchanged.
* Tokens of several cameras are camera-major; patch ``(x, y)`` of a ``(Px, Py)`` grid covers
  pixels ``[x W / Px, (x + 1) W / Px)`` and its centre ray passes through
  ``((x + 0.5) W / Px, (y + 0.5) H / Py)``.

Inverses are closed-form (``R^T, -R^T t``; ``invert_K``), never ``torch.linalg.inv``.
Computations run in the dtype of the inputs; pass float64 for re-anchoring far from the
origin (``anchor``).

Shapes: ``viewmats (..., 4, 4)``, ``Ks (..., 3, 3)``, points and rays ``(..., 3)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_float, check_float_sequence, check_int, check_int_sequence

__all__ = [
    "intrinsics",
    "extrinsics",
    "invert_se3",
    "invert_K",
    "camera_centers",
    "look_at",
    "normalize_K",
    "anchor",
    "patch_centers",
    "patch_rays",
    "plucker",
    "random_se3",
    "apply_world_transform",
    "expand_cameras",
    "check_viewmats",
    "check_intrinsics",
    "pixel_rays",
    "ray_plucker",
    "rotation_about",
]

#: tolerance of the rigidity checks (``R^T R = I``, bottom row) in ``check_viewmats``
RIGID_TOLERANCE = 1e-4


def _tensor(value: object, name: str, form: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {form}, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor {form}, got dtype {value.dtype}")
    return value


def check_viewmats(viewmats: object, name: str = "viewmats") -> Tensor:
    """``viewmats (..., 4, 4)`` as rigid world-to-camera matrices, or a ``ValueError`` that
    names the argument: finite, bottom row ``[0, 0, 0, 1]``, ``R^T R = I`` and ``det R = +1``
    within ``RIGID_TOLERANCE`` (a reflection or a scaled rotation is refused)."""
    form = "(..., 4, 4) world-to-camera [R | t; 0 0 0 1]"
    m = _tensor(viewmats, name, form)
    if m.dim() < 2 or tuple(m.shape[-2:]) != (4, 4):
        raise ValueError(f"{name} must have shape {form}, got {tuple(m.shape)}")
    if m.numel() == 0:
        return m
    if not bool(torch.isfinite(m).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf): {form}")
    d = m.detach().to(torch.float64)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64, device=d.device)
    if float((d[..., 3, :] - bottom).abs().max()) > RIGID_TOLERANCE:
        raise ValueError(f"{name} must have the bottom row [0, 0, 0, 1]: {form}")
    R = d[..., :3, :3]
    eye = torch.eye(3, dtype=torch.float64, device=d.device)
    if float((R.transpose(-1, -2) @ R - eye).abs().max()) > RIGID_TOLERANCE:
        raise ValueError(
            f"{name} must be rigid: its rotation R must satisfy R^T R = I (no scale or shear): "
            f"{form}"
        )
    if float(torch.linalg.det(R).min()) < 0:
        raise ValueError(f"{name} must have det R = +1 (a rotation, not a reflection): {form}")
    return m


def check_intrinsics(Ks: object, name: str = "Ks") -> Tensor:
    """``Ks (..., 3, 3)`` as pinhole intrinsics, or a ``ValueError`` that names the argument:
    finite, ``fx > 0``, ``fy > 0``, zero skew and the rows ``[0, fy, cy]``, ``[0, 0, 1]``."""
    form = "(..., 3, 3) pixel intrinsics [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]"
    K = _tensor(Ks, name, form)
    if K.dim() < 2 or tuple(K.shape[-2:]) != (3, 3):
        raise ValueError(f"{name} must have shape {form}, got {tuple(K.shape)}")
    if K.numel() == 0:
        return K
    if not bool(torch.isfinite(K).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf): {form}")
    d = K.detach()
    if bool((d[..., 0, 0] <= 0).any()) or bool((d[..., 1, 1] <= 0).any()):
        raise ValueError(f"{name} must have focal lengths fx > 0 and fy > 0: {form}")
    if bool((d[..., 0, 1] != 0).any()):
        raise ValueError(f"{name} must have zero skew (K[0, 1] = 0): {form}")
    zeros = torch.stack((d[..., 1, 0], d[..., 2, 0], d[..., 2, 1]), -1)
    if bool((zeros != 0).any()) or bool((d[..., 2, 2] != 1).any()):
        raise ValueError(f"{name} must have the rows [0, fy, cy] and [0, 0, 1]: {form}")
    return K


def intrinsics(
    fx: Tensor | float,
    fy: Tensor | float,
    cx: Tensor | float,
    cy: Tensor | float,
    *,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """``K = [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` from broadcasting values: ``(..., 3, 3)``."""
    parts = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=dtype) for v in (fx, fy, cx, cy)))
    fx_, fy_, cx_, cy_ = parts
    zero, one = torch.zeros_like(fx_), torch.ones_like(fx_)
    rows = (
        torch.stack((fx_, zero, cx_), -1),
        torch.stack((zero, fy_, cy_), -1),
        torch.stack((zero, zero, one), -1),
    )
    return check_intrinsics(torch.stack(rows, -2), "intrinsics")


def extrinsics(R: Tensor, t: Tensor) -> Tensor:
    """The world-to-camera matrix ``[R | t; 0 0 0 1]`` from ``R (..., 3, 3)`` (world to
    camera) and ``t (..., 3)``: ``(..., 4, 4)``."""
    R = _tensor(R, "R", "(..., 3, 3)")
    t = _tensor(t, "t", "(..., 3)")
    if tuple(R.shape[-2:]) != (3, 3) or t.shape[-1:] != (3,):
        raise ValueError(
            f"R must be (..., 3, 3) and t (..., 3), got {tuple(R.shape)}, {tuple(t.shape)}"
        )
    batch = torch.broadcast_shapes(R.shape[:-2], t.shape[:-1])
    out = torch.zeros(*batch, 4, 4, dtype=R.dtype, device=R.device)
    out[..., :3, :3] = R
    out[..., :3, 3] = t
    out[..., 3, 3] = 1
    return check_viewmats(out, "extrinsics")


def invert_se3(m: Tensor) -> Tensor:
    """Closed-form inverse of rigid ``[R | t; 0 0 0 1]`` matrices: ``[R^T | -R^T t]``
    (w2c <-> c2w). ``(..., 4, 4)``, differentiable, no ``linalg.inv``."""
    R = m[..., :3, :3]
    t = m[..., :3, 3:]
    Rt = R.transpose(-1, -2)
    top = torch.cat((Rt, -Rt @ t), -1)
    bottom = m[..., 3:, :]
    return torch.cat((top, bottom), -2)


def invert_K(K: Tensor) -> Tensor:
    """Closed-form inverse of zero-skew intrinsics: ``[[1/fx, 0, -cx/fx], [0, 1/fy,
    -cy/fy], [0, 0, 1]]``. ``(..., 3, 3)``."""
    fx, fy, cx, cy = K[..., 0, 0], K[..., 1, 1], K[..., 0, 2], K[..., 1, 2]
    zero, one = torch.zeros_like(fx), torch.ones_like(fx)
    rows = (
        torch.stack((1 / fx, zero, -cx / fx), -1),
        torch.stack((zero, 1 / fy, -cy / fy), -1),
        torch.stack((zero, zero, one), -1),
    )
    return torch.stack(rows, -2)


def camera_centers(viewmats: Tensor) -> Tensor:
    """Camera centres in world coordinates, ``-R^T t``, from w2c ``(..., 4, 4)``: ``(..., 3)``."""
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3:]
    return (-R.transpose(-1, -2) @ t)[..., 0]


def _normalize(v: Tensor, eps: float = 1e-12) -> Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp_min(eps)


def look_at(
    centre: Tensor,
    target: Tensor | None = None,
    up: Sequence[float] = (0.0, 1.0, 0.0),
) -> Tensor:
    """World-to-camera matrices of cameras at ``centre (..., 3)`` looking at ``target``
    (default the origin): ``z = normalize(target - centre)``, ``x = normalize(z x up)``,
    ``y = z x x``, ``R_c2w = [x y z]``, ``w2c = [R_c2w^T | -R_c2w^T centre]`` (with
    ``up = (0, 1, 0)`` the image y axis points to world -y, OpenCV style for a y-up world).
    ``(..., 4, 4)`` in the dtype of ``centre``."""
    centre = _tensor(centre, "centre", "(..., 3)")
    if centre.shape[-1:] != (3,):
        raise ValueError(f"centre must have shape (..., 3), got {tuple(centre.shape)}")
    if target is None:
        target = torch.zeros_like(centre)
    upv = torch.tensor(check_float_sequence(up, "up", length=3), dtype=centre.dtype)
    z = _normalize(target - centre)
    x = torch.linalg.cross(z, upv.to(centre.device).expand_as(z))
    if bool((x.norm(dim=-1) < 1e-9).any()):
        raise ValueError("look_at: the viewing direction is parallel to up; pass another up")
    x = _normalize(x)
    y = torch.linalg.cross(z, x)
    R_c2w = torch.stack((x, y, z), -1)
    R = R_c2w.transpose(-1, -2)
    t = -(R @ centre[..., None])[..., 0]
    return extrinsics(R, t)


def normalize_K(
    Ks: Tensor, image_size: Sequence[float], principal_point: str = "normalized"
) -> Tensor:
    """PRoPE's image-normalised intrinsics (image in ``[-1/2, 1/2]^2``):
    ``[[fx/W, 0, cx/W - 1/2], [0, fy/H, cy/H - 1/2], [0, 0, 1]]``;
    ``principal_point="zero"`` (StereoWorld) gives ``diag(fx/W, fy/H, 1)``."""
    W, H = check_float_sequence(image_size, "image_size", length=2, above=0.0)
    if principal_point not in ("normalized", "zero"):
        raise ValueError(f"principal_point must be 'normalized' or 'zero', got {principal_point!r}")
    K = Ks.clone()
    K[..., 0, 0] = Ks[..., 0, 0] / W
    K[..., 1, 1] = Ks[..., 1, 1] / H
    if principal_point == "zero":
        K[..., 0, 2] = 0
        K[..., 1, 2] = 0
    else:
        K[..., 0, 2] = Ks[..., 0, 2] / W - 0.5
        K[..., 1, 2] = Ks[..., 1, 2] / H - 0.5
    return K


def anchor(viewmats: Tensor, index: int = 0, dim: int = -3) -> Tensor:
    """Re-express the cameras relative to camera ``index`` along ``dim`` (default: the
    camera axis of ``(..., C, 4, 4)``): ``w2c_k <- w2c_k c2w_index``, computed in float64 and
    returned in the input dtype. An exact gauge for the SE(3)-invariant encodings (the
    common transform cancels in ``T_i T_j^-1``), and the fix for float32 far from the
    origin (float32 logit errors shrink by orders of magnitude at ``|t| = 1e4``). Camera
    ``index`` becomes the identity."""
    m = check_viewmats(viewmats, "viewmats")
    check_int(index, "index", minimum=None)
    d = m.to(torch.float64)
    ref = d.select(dim if dim >= 0 else d.dim() + dim, index).unsqueeze(dim)
    return (d @ invert_se3(ref)).to(m.dtype)


def patch_centers(
    grid: Sequence[int], image_size: Sequence[float], *, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Pixel coordinates ``(Px * Py, 2)`` of the patch-centre rays of a ``(Px, Py)`` grid on
    a ``(W, H)`` image, x fastest: ``((x + 0.5) W / Px, (y + 0.5) H / Py)``."""
    px, py = check_int_sequence(grid, "grid", length=2)
    W, H = check_float_sequence(image_size, "image_size", length=2, above=0.0)
    x = (torch.arange(px, dtype=dtype) + 0.5) * (W / px)
    y = (torch.arange(py, dtype=dtype) + 0.5) * (H / py)
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    return torch.stack((xx.flatten(), yy.flatten()), -1)


def pixel_rays(viewmats: Tensor, Ks: Tensor, pixels: Tensor) -> tuple[Tensor, Tensor]:
    """World rays through pixels ``(..., N, 2)`` of cameras ``viewmats (..., 4, 4)``, ``Ks
    (..., 3, 3)``: origins ``(..., N, 3)`` (the camera centre) and unit directions
    ``R_c2w normalize(((u - cx)/fx, (v - cy)/fy, 1))``."""
    K = Ks[..., None, :, :]
    u, v = pixels[..., 0], pixels[..., 1]
    x = (u - K[..., 0, 2]) / K[..., 0, 0]
    y = (v - K[..., 1, 2]) / K[..., 1, 1]
    x, y = torch.broadcast_tensors(x, y)
    d_cam = torch.stack((x, y, torch.ones_like(x)), -1)
    R_c2w = viewmats[..., :3, :3].transpose(-1, -2)
    d = _normalize((R_c2w[..., None, :, :] @ d_cam[..., None])[..., 0])
    o = camera_centers(viewmats)[..., None, :].expand_as(d)
    return o, d


def patch_rays(
    viewmats: Tensor, Ks: Tensor, grid: Sequence[int], image_size: Sequence[float]
) -> tuple[Tensor, Tensor]:
    """Patch-centre rays of every camera: ``viewmats (..., C, 4, 4)``, ``Ks (..., C, 3, 3)``
    -> origins and unit directions ``(..., C * Px * Py, 3)``, camera-major, x fastest."""
    check_viewmats(viewmats, "viewmats")
    check_intrinsics(Ks, "Ks")
    pix = patch_centers(grid, image_size, dtype=viewmats.dtype).to(viewmats.device)
    o, d = pixel_rays(viewmats, Ks, pix)
    return o.flatten(-3, -2), d.flatten(-3, -2)


def plucker(
    viewmats: Tensor,
    Ks: Tensor,
    grid: Sequence[int],
    image_size: Sequence[float],
    frame: str = "world",
) -> Tensor:
    """Plücker coordinates ``[o x d, d]`` (moment first, CameraCtrl / UCPE convention) of the
    patch-centre rays: ``(..., C * Px * Py, 6)``. ``frame="first"`` first re-expresses every
    camera relative to camera 0 (``anchor``: invariant to a global rigid transform but
    dependent on the reference camera); ``"world"`` is not invariant
    (``d' = R d``, ``m' = R m + t x R d``). Independent of the point chosen on the ray."""
    if frame not in ("world", "first"):
        raise ValueError(f"frame must be 'world' or 'first', got {frame!r}")
    if frame == "first":
        viewmats = anchor(viewmats, 0)
    o, d = patch_rays(viewmats, Ks, grid, image_size)
    return ray_plucker(o, d)


def ray_plucker(origins: Tensor, directions: Tensor) -> Tensor:
    """Plücker coordinates ``[o x d, d]`` of rays through ``origins (..., 3)`` with unit
    ``directions (..., 3)``: ``(..., 6)``. The moment ``o x d`` is the same for every point
    ``o + s d`` of the ray; under a rigid ``G = [R | t]``: ``d' = R d``,
    ``m' = R m + t x R d``."""
    return torch.cat((torch.linalg.cross(origins, directions), directions), -1)


def random_se3(
    n: int,
    *,
    translation_std: float = 1.0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """``n`` random rigid transforms ``(n, 4, 4)``: rotation from the QR decomposition of a
    Gaussian matrix (signs fixed, ``det = +1``: Haar-distributed), translation
    ``N(0, translation_std^2)``. Usable as world-to-camera matrices or as a world change
    ``G``."""
    check_int(n, "n", minimum=0)
    std = check_float(translation_std, "translation_std", minimum=0.0)
    a = torch.randn(n, 3, 3, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    flip = torch.linalg.det(q) < 0
    q[flip, :, 0] = -q[flip, :, 0]
    t = std * torch.randn(n, 3, generator=generator, dtype=torch.float64)
    out = torch.zeros(n, 4, 4, dtype=torch.float64)
    out[:, :3, :3] = q
    out[:, :3, 3] = t
    out[:, 3, 3] = 1
    return out.to(dtype)


def apply_world_transform(viewmats: Tensor, G: Tensor) -> Tensor:
    """The cameras after the rigid world change ``X -> G X``: ``w2c G^-1`` (``G (4, 4)`` or
    broadcasting ``(..., 4, 4)``)."""
    return viewmats @ invert_se3(G.to(viewmats.dtype))


def expand_cameras(viewmats: Tensor, camera_index: Tensor) -> Tensor:
    """Per-token matrices from per-camera ones: ``viewmats (B, C, r, c)`` (4x4 extrinsics or
    3x3 intrinsics) and ``camera_index (B, L)`` (int, in ``[0, C)``) -> ``(B, L, r, c)``."""
    m = _tensor(viewmats, "viewmats", "(B, C, r, c)")
    if m.dim() != 4:
        raise ValueError(f"viewmats must have shape (B, C, r, c), got {tuple(m.shape)}")
    if not isinstance(camera_index, Tensor) or camera_index.is_floating_point():
        raise TypeError("camera_index must be an integer tensor (B, L)")
    idx = camera_index
    if idx.dim() == 1:
        idx = idx[None].expand(m.shape[0], -1)
    if idx.dim() != 2 or idx.shape[0] not in (1, m.shape[0]):
        raise ValueError(
            f"camera_index must have shape (B, L) with B = {m.shape[0]}, "
            f"got {tuple(camera_index.shape)}"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= m.shape[1]):
        raise ValueError(f"camera_index must lie in [0, {m.shape[1]}) (C = viewmats.shape[1])")
    idx = idx.expand(m.shape[0], -1)
    return torch.gather(m, 1, idx[..., None, None].expand(*idx.shape, *m.shape[2:]))


def rotation_about(
    axis: Sequence[float], angle: float, *, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Rotation matrix ``(3, 3)`` of ``angle`` radians about ``axis`` (Rodrigues)."""
    a = torch.tensor(check_float_sequence(axis, "axis", length=3), dtype=torch.float64)
    if float(a.norm()) == 0:
        raise ValueError("axis must be a non-zero 3-vector")
    a = a / a.norm()
    th = check_float(angle, "angle")
    Kx = torch.tensor(
        [[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]], dtype=torch.float64
    )
    R = torch.eye(3, dtype=torch.float64) + math.sin(th) * Kx + (1 - math.cos(th)) * (Kx @ Kx)
    return R.to(dtype)
