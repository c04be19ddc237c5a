"""WorldRoPE: probabilistic world-centric RoPE for multi-view attention (only the abstract
was available; no code or formula is published, and the paper's title and arXiv id could not be
confirmed).

The abstract: each patch token is back-projected into a set of volumetric Gaussian
primitives in the world (depth hypotheses, depth uncertainty, the finite extent of the
patch frustum); a key's primitives projected into the query view give a distribution over
where the key appears in the query image, and the rotary operator is integrated over it in
closed form: rotations at the projected centres, mixed by the weights, attenuated by the
covariance; a point support gives deterministic RoPE. What is assumed here (a reconstruction,
made concrete; check against the paper before relying on the details):

* **2-D RoPE** of patch coordinates (x = column, y = row, in patch units of a ``grid=(Px,
  Py)`` grid on a ``(W, H)`` image): rotary pair ``p`` turns by ``omega_p^T x``, axial
  (``omega_p`` is ``theta_p`` on one axis), ``theta_j = base^(-j / n_a)`` per axis (pairs
  split ``split_pairs(D/2, 2)``, x first; base 100), the RoPE-ViT / rope-axial layout. Queries
  are deterministic: ``R(omega^T p_i)`` at their own patch.
* **Primitives** of key ``j`` (``m = 1..K``): the point at z-depth ``d_m`` on the patch-centre
  ray, ``X_m = d_m (x~, y~, 1)`` in the key's camera (``x~ = (u - cx)/fx``), with covariance
  ``Sigma_m = J_b diag(s_x^2, s_y^2, sigma_m^2) J_b^T``, ``J_b = [[d, 0, x~], [0, d, y~], [0,
  0, 1]]``: depth doubt ``sigma_m`` along the ray and, with ``patch_extent=True``, the patch
  footprint (a uniform pixel over the patch has variance ``(W/Px)^2 / 12``, so ``s_x =
  (W/Px) / (fx sqrt 12)``), moved to the world by the key's ``c2w``.
* **Projection** into the query camera ``c`` (first order): centre ``mu_m =
  pi_c(X_m)`` in patch units, covariance ``J Sigma_m J^T`` with ``J`` the Jacobian of
  ``pi_c`` at ``X_m``. A primitive with depth ``<= near`` in camera ``c`` is not seen there and
  contributes nothing (its rotation integrates to zero). Against quadrature over the true
  support projected exactly (tests): 8e-4 for depth doubt alone, 1.3e-2 with the footprint
  (its perspective distortion is second order).
* **Closed form** (exact for Gaussians): ``E[R(omega^T x)] = sum_m pi_m
  exp(-1/2 omega^T Sigma_m omega) R(omega^T mu_m)`` with mixture weights ``pi`` (normalised
  to sum 1). Keys get this operator — an attenuated rotation, ``|E| <= 1`` — so ``logit_ij
  = q_i^T R(-omega^T p_i) E[R(omega^T x_j)] k_j``: RoPE in expectation over where key ``j``
  lies in query ``i``'s image.

Properties: with one primitive and no covariance (``K = 1``, ``sigma = 0``,
``patch_extent=False``) it is RoPE of the key's projected coordinates; in the key's own
camera the projection is its own patch whatever the depth (the ray direction projects to
zero, the footprint to ``1/12`` patch^2), so identical cameras give 2-D RoPE with the keys
attenuated by ``exp(-theta^2 / 24)`` per pair (``patch_extent=True``; none without it) — the
same as ``rotate`` without a state. Invariant to a rigid change of world coordinates
(``se3_invariant``); reads absolute pixels (``relative = False``); query-grouped like RayRoPE
(one attention per distinct query camera; no KV cache).

Values: ``rotate_values=False`` (default) rotates queries and keys only, as RoPE; ``True``
gives the values the key's operator and the output the query's inverse rotation.

Geometry per layer: the abstract predicts each layer's primitives from the features;
``PrimitiveHead`` (``Linear(dim, 3K)``) maps token features to the three primitive inputs
(depths ``exp(log d)`` clamped to ``max_depth``, relative doubt ``sigma = d softplus(s)``,
weights ``softmax(w)``), started at ``K`` log-spaced depth hypotheses between ``depth_range``
with equal weights (zero-initialised weights: the start does not depend on the features).

Inputs: ``k_viewmats (B, Lk, 4, 4)`` world-to-camera, ``k_Ks (B, Lk, 3, 3)`` pixel
intrinsics, ``k_depths (B, Lk, K)`` z-depths (> 0, world units; required); optional
``k_depth_sigma (B, Lk, K)`` (>= 0; default 0), ``k_weights (B, Lk, K)`` (>= 0, not all 0;
normalised; default uniform), ``q_viewmats``, ``q_Ks`` (default: the last Lq key tokens').
Shapes: ``x (B, H, L, D)``, ``pos (B|1, L, 2)`` = (x, y) patch indices, even ``D``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ...functional import apply_rotary
from ...validation import check_finite_tensor, check_float, check_float_sequence, check_int
from ..base import QueryGroups
from ..options import Bool, Choice, Float, Int
from ..registry import register
from ..rotary.nd import section_frequencies, split_pairs
from .frames import IMAGE_SIZE, PATCH_GRID, ROTATE_VALUES, CameraFrames
from .groups import query_camera_groups

__all__ = ["WorldRoPE", "WorldState", "PrimitiveHead", "gaussian_expected_rotation"]


def gaussian_expected_rotation(
    omega: Tensor, mean: Tensor, cov: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """``E[cos(omega_p^T x)], E[sin(omega_p^T x)]`` for ``x`` a Gaussian mixture.

    ``omega (P, n)`` frequency vectors, ``mean (..., K, n)``, ``cov (..., K, n, n)``,
    ``weights (..., K)`` -> two ``(..., P)`` tensors: ``sum_m pi_m exp(-1/2 omega^T Sigma_m
    omega) (cos, sin)(omega^T mu_m)`` (e.g. ``mu = .7, sigma = .4, omega = 3`` gives
    ``-.2457349803 + .4201691066 i``)."""
    angle = mean @ omega.transpose(-1, -2)  # (..., K, P)
    spread = torch.einsum("pa,...ab,pb->...p", omega, cov, omega)  # (..., K, P)
    amp = weights[..., None] * torch.exp(-0.5 * spread)
    return (amp * angle.cos()).sum(-2), (amp * angle.sin()).sum(-2)


@dataclass
class WorldState:
    """One query group's rotations (float64): queries ``q_cos, q_sin (B|1, Lq, D/2)`` (the
    deterministic RoPE of their patches), keys ``k_cos, k_sin (B, Lk, D/2)`` (the expected
    rotation of their primitives projected into the group's camera)."""

    q_cos: Tensor
    q_sin: Tensor
    k_cos: Tensor
    k_sin: Tensor


NEAR = Float(above=0.0, doc="primitives at depth <= near in the query camera are unseen")


@register("worldrope")
class WorldRoPE(CameraFrames):
    """WorldRoPE (see the module docstring; a reconstruction). Options: ``grid=(Px, Py)`` and
    ``image_size=(W, H)`` (both needed), ``base`` (100), ``layout`` ("half"),
    ``patch_extent`` (True), ``near`` (1e-3), ``group_limit`` (64), ``rotate_values``
    (False)."""

    paper = "WorldRoPE 2025 (expected RoPE over projected Gaussian key supports; assumed form)"
    reads_intrinsics = True
    needs_intrinsics = True
    relative = False
    cache_rotated_keys = False
    required_inputs = {
        "k_viewmats": "(B, Lk, 4, 4) world-to-camera per key token",
        "k_Ks": "(B, Lk, 3, 3) pixel intrinsics per key token",
        "k_depths": "(B, Lk, K) z-depths (> 0) of each key's K Gaussian primitives",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        grid: Annotated[tuple[int, int] | None, PATCH_GRID] = None,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        base: Annotated[float, Float(above=1.0, doc="RoPE base of the patch coordinates")] = 100.0,
        layout: Annotated[
            str, Choice(choices=("half", "interleaved"), doc="channel pairing")
        ] = "half",
        patch_extent: Annotated[
            bool, Bool(doc="add the patch footprint to each primitive's covariance")
        ] = True,
        near: Annotated[float, NEAR] = 1e-3,
        group_limit: Annotated[
            int, Int(doc="most query cameras per call (each costs one attention)")
        ] = 64,
        rotate_values: Annotated[bool, ROTATE_VALUES] = False,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        if head_dim % 2 or head_dim < 4:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'worldrope': an even head_dim >= 4 "
                "(rotary pairs on the x and y axes)"
            )
        self._set_channels(0, head_dim, "")
        self.optional_inputs.update(
            k_depth_sigma="(B, Lk, K) depth standard deviation of each primitive (>= 0)",
            k_weights="(B, Lk, K) mixture weights of the primitives (>= 0, normalised)",
        )
        self.grid, self.image_size, self.base, self.layout = grid, image_size, base, layout
        self.patch_extent, self.near, self.group_limit = patch_extent, near, group_limit
        self.sections = split_pairs(head_dim // 2, 2)
        omega = section_frequencies(self.sections, base, "per_axis", head_dim)
        # (D/2, 2) float64, not a buffer: ``module.float()`` must never round the frequencies
        self.omega = omega

    @classmethod
    def example_options(cls) -> dict:
        return {"grid": (4, 4), "image_size": (32.0, 32.0)}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """``CameraFrames.example_inputs`` with the same two cameras in every batch row (each
        distinct query camera costs one attention), plus two primitives per key: log depth
        ``N(1, 0.3^2)``, sigma ``U(0, 0.3)``, weights ``softmax(N(0, 1))`` (prefix-consistent:
        drawn for 64 tokens and cut)."""
        one = super().example_inputs(1, length_q, length_k, generator)
        out = {n: t.expand(batch, *t.shape[1:]).contiguous() for n, t in one.items()}
        n = max(64, length_k)
        shape = (batch, n, 2)
        f64 = torch.float64
        out["k_depths"] = torch.exp(1 + 0.3 * torch.randn(shape, generator=generator, dtype=f64))
        out["k_depth_sigma"] = 0.3 * torch.rand(shape, generator=generator, dtype=f64)
        out["k_weights"] = torch.randn(shape, generator=generator, dtype=f64).softmax(-1)
        for name in ("k_depths", "k_depth_sigma", "k_weights"):
            out[name] = out[name][:, :length_k]
        return out

    # ------------------------------------------------------------------ inputs
    def _primitive_input(self, inputs: dict[str, Tensor], name: str, like: Tensor | None):
        value = inputs.get(name)
        if value is None:
            return None
        key = f"inputs[{name!r}]"
        check_finite_tensor(value, key, floating=True)
        if value.dim() != 3 or (like is not None and value.shape[1:] != like.shape[1:]):
            form = "(B, Lk, K)" if like is None else f"(B, Lk, K) = {tuple(like.shape)} as k_depths"
            raise ValueError(f"{key} must have shape {form}, got {tuple(value.shape)}")
        return value.to(torch.float64)

    def primitives(self, inputs: dict[str, Tensor], length: int) -> tuple[Tensor, Tensor, Tensor]:
        """The keys' ``(depths, sigmas, weights)``, each ``(B|1, Lk, K)`` float64, checked
        (weights normalised to sum 1)."""
        depth = self._primitive_input(inputs, "k_depths", None)
        assert depth is not None  # required: the engine checked its presence
        if depth.shape[1] != length or depth.shape[2] == 0:
            raise ValueError(
                f"inputs['k_depths'] must have shape (B, Lk, K) with Lk = {length} (the key "
                f"tokens of this call) and K >= 1, got {tuple(depth.shape)}"
            )
        if bool((depth <= 0).any()):
            raise ValueError("inputs['k_depths'] must be positive z-depths (B, Lk, K)")
        sigma = self._primitive_input(inputs, "k_depth_sigma", depth)
        if sigma is None:
            sigma = torch.zeros_like(depth)
        elif bool((sigma < 0).any()):
            raise ValueError("inputs['k_depth_sigma'] must be non-negative (B, Lk, K)")
        weights = self._primitive_input(inputs, "k_weights", depth)
        if weights is None:
            weights = torch.full_like(depth, 1.0 / depth.shape[2])
        else:
            total = weights.sum(-1, keepdim=True)
            if bool((weights < 0).any()) or bool((total <= 0).any()):
                raise ValueError(
                    "inputs['k_weights'] must be non-negative with a positive sum per key "
                    "(B, Lk, K)"
                )
            weights = weights / total
        return depth, sigma, weights

    # ------------------------------------------------------------------ geometry
    def world_primitives(
        self, view: Tensor, Ks: Tensor, pos: Tensor, depth: Tensor, sigma: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The keys' primitives in the world: centres ``(B, Lk, K, 3)`` and covariance
        factors ``A (B, Lk, K, 3, 3)`` (``Sigma = A A^T``), from cameras ``view (B, Lk, 4,
        4)``, ``Ks (B, Lk, 3, 3)``, patch positions ``pos (B|1, Lk, 2)`` and ``depth, sigma
        (B, Lk, K)``."""
        W, H = self.image_size  # type: ignore[misc]
        px, py = self.grid  # type: ignore[misc]
        p = pos.to(torch.float64)
        u = (p[..., 0] + 0.5) * (W / px)
        v = (p[..., 1] + 0.5) * (H / py)
        fx, fy, cx, cy = Ks[..., 0, 0], Ks[..., 1, 1], Ks[..., 0, 2], Ks[..., 1, 2]
        xt, yt = ((u - cx) / fx)[..., None], ((v - cy) / fy)[..., None]  # (B, Lk, 1)
        xt, yt = xt.expand_as(depth), yt.expand_as(depth)
        X_cam = torch.stack((depth * xt, depth * yt, depth), -1)
        zero = torch.zeros_like(depth)
        if self.patch_extent:
            sx = ((W / px) / (fx * math.sqrt(12.0)))[..., None].expand_as(depth)
            sy = ((H / py) / (fy * math.sqrt(12.0)))[..., None].expand_as(depth)
        else:
            sx = sy = zero
        # A_cam = J_b diag(sx, sy, sigma), J_b = d/d(x~, y~, z) of z (x~, y~, 1)
        A_cam = torch.stack(
            (
                torch.stack((depth * sx, zero, xt * sigma), -1),
                torch.stack((zero, depth * sy, yt * sigma), -1),
                torch.stack((zero, zero, sigma), -1),
            ),
            -2,
        )
        R_c2w = view[..., :3, :3].transpose(-1, -2)[:, :, None]  # (B, Lk, 1, 3, 3)
        centre = -(R_c2w @ view[:, :, None, :3, 3:])[..., 0]
        X_w = (R_c2w @ X_cam[..., None])[..., 0] + centre
        return X_w, R_c2w @ A_cam

    def project(
        self, w2c: Tensor, K: Tensor, X_w: Tensor, A_w: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Primitives seen from one camera (``w2c (4, 4)``, pixel ``K (3, 3)``): centres in its
        patch units ``(..., 2)``, first-order covariances ``(..., 2, 2)`` and whether each is in
        front of it (depth > ``near``)."""
        Y = X_w @ w2c[:3, :3].transpose(-1, -2) + w2c[:3, 3]
        z = Y[..., 2]
        seen = z > self.near
        z = torch.where(seen, z, torch.ones_like(z))
        W, H = self.image_size  # type: ignore[misc]
        px, py = self.grid  # type: ignore[misc]
        # patch coordinates: (fx Y_x / z + cx) Px / W - 1/2 (patch centres at integers)
        ax, ay = K[0, 0] * (px / W), K[1, 1] * (py / H)
        mean = torch.stack(
            (
                ax * Y[..., 0] / z + K[0, 2] * (px / W) - 0.5,
                ay * Y[..., 1] / z + K[1, 2] * (py / H) - 0.5,
            ),
            -1,
        )
        zero = torch.zeros_like(z)
        J = torch.stack(
            (
                torch.stack((ax / z, zero, -ax * Y[..., 0] / z**2), -1),
                torch.stack((zero, ay / z, -ay * Y[..., 1] / z**2), -1),
            ),
            -2,
        )  # d(patch coordinates) / dY
        F = J @ w2c[:3, :3] @ A_w
        return mean, F @ F.transpose(-1, -2), seen

    def query_rotation(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """Deterministic RoPE of patch positions ``(B|1, L, 2)``: cos, sin ``(B|1, L, D/2)``."""
        omega = self.omega.to(device=pos.device)
        ang = torch.remainder(pos.to(torch.float64) @ omega.transpose(-1, -2), 2 * math.pi)
        return ang.cos(), ang.sin()

    def own_camera_attenuation(self) -> Tensor:
        """The keys' attenuation per pair in their own camera, ``exp(-theta^2 / 24)`` with
        ``patch_extent`` (the footprint's ``1/12`` patch^2 per axis), else ones: ``(D/2,)``."""
        if not self.patch_extent:
            return torch.ones_like(self.omega[:, 0])
        return torch.exp(-0.5 * (self.omega**2).sum(-1) / 12.0)  # float64, on the CPU

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> Any:
        if self.grid is None or self.image_size is None:
            raise ValueError(
                "encoding 'worldrope' back-projects each patch: create it with grid=(Px, Py) "
                "and image_size=(W, H)"
            )
        q_view, q_K, k_view, k_K = self.gather_cameras(q_pos, k_pos, inputs)
        assert q_K is not None and k_K is not None
        Lq, Lk = q_pos.shape[1], k_pos.shape[1]
        depth, sigma, weights = self.primitives(inputs, Lk)
        sizes = {
            "q_viewmats": q_view.shape[0],
            "q_Ks": q_K.shape[0],
            "k_viewmats": k_view.shape[0],
            "k_Ks": k_K.shape[0],
            "k_depths": depth.shape[0],
            "k_depth_sigma": sigma.shape[0],
            "k_weights": weights.shape[0],
        }
        batch = max(sizes.values())
        wrong = [f"inputs[{n!r}] has {b}" for n, b in sizes.items() if b not in (1, batch)]
        if wrong:
            raise ValueError(
                f"the inputs of encoding 'worldrope' must share the batch size {batch} (or 1): "
                + ", ".join(wrong)
            )
        q_view, q_K = q_view.expand(batch, Lq, 4, 4), q_K.expand(batch, Lq, 3, 3)
        k_view, k_K = k_view.expand(batch, Lk, 4, 4), k_K.expand(batch, Lk, 3, 3)
        depth, sigma, weights = (t.expand(batch, *t.shape[1:]) for t in (depth, sigma, weights))
        X_w, A_w = self.world_primitives(k_view, k_K, k_pos, depth, sigma)
        views, intrinsics, index = query_camera_groups(q_view, q_K, self.group_limit, self.name)
        assert intrinsics is not None
        q_cos, q_sin = self.query_rotation(q_pos)
        omega = self.omega.to(device=X_w.device)
        groups = []
        for g in range(views.shape[0]):
            mean, cov, seen = self.project(views[g], intrinsics[g], X_w, A_w)
            k_cos, k_sin = gaussian_expected_rotation(omega, mean, cov, weights * seen)
            groups.append((index == g, WorldState(q_cos, q_sin, k_cos, k_sin)))
        return QueryGroups(groups)

    # ------------------------------------------------------------------ rotation
    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        if role not in ("q", "k", "v", "o") or (role in ("v", "o") and not self.rotate_values):
            return x
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"encoding 'worldrope' rotates {role} with head_dim {self.head_dim}, got "
                f"{x.shape[-1]} channels (pass rotate_values=False for another value head_dim)"
            )
        if x.shape[2] == 0:
            return x
        if state is None:
            # no cameras: every key in its own camera (the identical-camera reduction)
            cos, sin = self.query_rotation(pos)
            if role in ("k", "v"):
                att = self.own_camera_attenuation().to(cos.device)
                cos, sin = cos * att, sin * att
        elif not isinstance(state, WorldState):
            raise TypeError(
                "worldrope rotates with one query group's WorldState (the engine runs one "
                f"attention per group), got {type(state).__name__}"
            )
        elif role in ("q", "o"):
            cos, sin = state.q_cos, state.q_sin
        else:
            cos, sin = state.k_cos, state.k_sin
        if cos.shape[1] != x.shape[2]:
            raise ValueError(
                f"the worldrope state has {cos.shape[1]} tokens but {role} has {x.shape[2]}"
            )
        if role == "o":
            sin = -sin  # the inverse of the query's rotation
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        out = apply_rotary(x.to(cd), cos.to(cd)[:, None], sin.to(cd)[:, None], self.layout)
        return out.to(x.dtype)

    def camera_blocks(self, viewmats, Ks, pos):  # pragma: no cover - no camera channels
        raise RuntimeError("worldrope has no camera block channels")


class PrimitiveHead(nn.Module):
    """Each token's ``K`` Gaussian primitives from its features (see the module docstring):
    ``forward(x (B, L, dim)) -> {"k_depths", "k_depth_sigma", "k_weights"}``, each ``(B, L,
    K)``, ready for ``WorldRoPE`` (merge with the cameras into ``inputs``).

    Args:
        dim: feature width; ``primitives``: ``K``.
        depth_range: ``(near, far)`` of the initial log-spaced depth hypotheses (K = 1: their
            geometric mean).
        relative_sigma: initial ``sigma / d`` of every primitive.
        max_depth: clamp of the predicted depths.
    """

    def __init__(
        self,
        dim: int,
        primitives: int = 3,
        *,
        depth_range: tuple[float, float] = (1.0, 10.0),
        relative_sigma: float = 0.1,
        max_depth: float = 100.0,
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.primitives = K = check_int(primitives, "primitives")
        near, far = check_float_sequence(depth_range, "depth_range", length=2, above=0.0)
        if far < near:
            raise ValueError(f"depth_range must be (near, far) with near <= far, got {depth_range}")
        rel = check_float(relative_sigma, "relative_sigma", above=0.0)
        self.max_depth = check_float(max_depth, "max_depth", above=far)
        self.proj = nn.Linear(self.dim, 3 * K)
        nn.init.zeros_(self.proj.weight)
        t = torch.linspace(0, 1, K) if K > 1 else torch.full((1,), 0.5)
        log_d = math.log(near) + t * (math.log(far) - math.log(near))
        with torch.no_grad():
            self.proj.bias[:K] = log_d
            self.proj.bias[K : 2 * K] = math.log(math.expm1(rel))  # softplus^-1
            self.proj.bias[2 * K :] = 0.0

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, L, {self.dim}), got {shape}")
        log_d, s, w = self.proj(x).chunk(3, dim=-1)
        depth = torch.exp(log_d.clamp(max=math.log(self.max_depth)))
        return {
            "k_depths": depth,
            "k_depth_sigma": depth * nn.functional.softplus(s),
            "k_weights": w.softmax(-1),
        }
