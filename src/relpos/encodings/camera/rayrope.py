"""RayRoPE (Wu et al. 2026, "RayRoPE: Projective Ray Positional Encoding for Multi-view
Attention", arXiv 2601.15275; official code Lucas-707/RayRoPE, ``pos_enc/rayrope.py``
``_transform_to_query_frame``, ``_get_point_coords``, ``_prepare_depths``,
``_prepare_rope_coeff_uniformd``, ``_get_frequency``; read, not copied).

Every token is a set of ray points, encoded in the frame of the *query's* camera ``c``
(query-grouped: ``relpos.encodings.base.QueryGroups``, one attention per query camera):

* rays of patch ``(x, y)`` of a ``(Px, Py)`` grid at normalised image coordinates
  ``u = (x + o_x)/Px - 1/2``, ``v = (y + o_y)/Py - 1/2``, offsets (0, 0), (1, 0), (0, 1)
  (3 rays: patch corners), (0, 0), (1, 1) (2 rays) or (1/2, 1/2) (1 ray);
* ``p0`` = the token's camera centre, in camera ``c``: ``w2c_c [centre, 1]`` (3 coordinates);
* per ray the point at depth ``d``: ``X = P_j^-1 [u, v, 1, 1/d]`` (``P = lift(K~) w2c``,
  PRoPE's normalised intrinsics; ``d`` clamped to [1e-2, 100]), projected into ``c``:
  ``Y = P_c X``, direction ``(Y_xyz / (|Y_xyz| + 1e-6))[:2]`` (2 coordinates) and depth
  ``max(sqrt(Y_z^2 + 1e-9), 1e-4) / max(Y_w, 1e-4)`` (clamped to [-10, 10]; 1 coordinate).

Default: 3 rays -> 12 coordinates ``[p0 xyz | dir of ray 0, 1, 2 | depth of ray 0, 1, 2]``,
``F = D / 24`` frequencies each, ``omega_f = 2 pi / max_period * freq_base^f`` (max periods 4,
8, 80 for p0, direction, depth; ``freq_base`` 3), angles frequency-major
(pair ``f * 12 + coordinate``) on split-half pairs; q, k and v turn by ``-a``, the output by
``+a``. A query's own coordinates are its own in its own camera (``p0 = 0``).

Depth: ``inputs["k_depth_logsigma"] (B, Lk, 2)`` = ``(log d, sigma)`` per token (RayRoPE's
depth head predicts it; known depth: ``sigma = 0``). The depth is uncertain in ``[d1, d2]``,
``d1,2 = exp(min(log d -+ sigma, 3))``; the rotation is its expectation for an angle uniform
between the two endpoint angles ``a1, a2``: ``E[cos] = (sin a2 - sin a1)/(a2 - a1)``,
``E[sin] = (cos a1 - cos a2)/(a2 - a1)`` (``cos a1, sin a1`` where ``|a2 - a1| <= 1e-2``) — an
attenuation, not a rotation, when ``sigma > 0``.

Invariant to a rigid change of world coordinates (``se3_invariant``, to float64 rounding);
reads absolute pixels (``relative = False``); keys depend on the query camera, so keys are
never cached (``cache_rotated_keys = False``; a KV cache is refused by name). Groups are the
distinct query cameras (viewmats and intrinsics) of each batch row (``row_camera_groups``:
group ``g`` is the ``g``-th camera of every row, so a batch of scenes of ``V`` views costs
``V`` attentions); the cost is one attention per group over all queries (rows of other
groups are discarded). ``group_limit`` bounds the cameras of one batch row.

``head_dim % (2 * coordinates) == 0`` (24 with 3 rays) reproduces RayRoPE exactly; other
even head dims rotate the first ``head_dim // 24 * 24`` channels and pass the rest through
(``identity_channels=False`` refuses them instead).

Shapes: ``x (B, H, L, D)``; ``pos (B|1, L,
2)`` = (x, y) patch indices; inputs ``k_viewmats``, ``k_Ks``, ``k_depth_logsigma``
(required), ``q_viewmats``, ``q_Ks``, ``q_depth_logsigma`` (default: the last Lq key tokens').
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from ...cameras import camera_centers, invert_K, invert_se3, normalize_K
from ...validation import check_finite_tensor
from ..base import QueryGroups
from ..options import Bool, Choice, Float, Int
from ..registry import register
from .frames import IMAGE_SIZE, PATCH_GRID, ROTATE_VALUES, CameraFrames
from .groups import row_camera_groups
from .prope import lift

__all__ = ["RayRoPE", "RayState", "expected_rotation", "rayrope_frequencies", "ray_offsets"]

MAX_DEPTH, MAX_LOG_DEPTH, MAX_DEPTH_COORD = 100.0, 3.0, 10.0
#: max periods of the coordinate kinds (p0, direction, depth)
MAX_PERIODS = {"p0": 4.0, "dir": 8.0, "depth": 80.0}


def ray_offsets(rays_per_patch: int) -> list[tuple[float, float]]:
    """Offsets of the rays inside a patch (in patch units)."""
    return {1: [(0.5, 0.5)], 2: [(0.0, 0.0), (1.0, 1.0)], 3: [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]}[
        rays_per_patch
    ]


def rayrope_frequencies(num_freqs: int, max_period: float, freq_base: float = 3.0) -> Tensor:
    """``2 pi / max_period * freq_base^f``, ``f < num_freqs`` (float64)."""
    return 2 * math.pi / max_period * freq_base ** torch.arange(num_freqs, dtype=torch.float64)


def expected_rotation(a1: Tensor, a2: Tensor) -> tuple[Tensor, Tensor]:
    """``E[cos a], E[sin a]`` for ``a`` uniform between ``a1`` and ``a2`` (``cos a1, sin a1``
    where they are within 1e-2)."""
    same = (a2 - a1).abs() <= 1e-2
    delta = torch.where(same, torch.ones_like(a1), a2 - a1)
    cos = torch.where(same, a1.cos(), (a2.sin() - a1.sin()) / delta)
    sin = torch.where(same, a1.sin(), (a1.cos() - a2.cos()) / delta)
    return cos, sin


@dataclass
class RayState:
    """One query group's RoPE coefficients (float64): ``q_cos, q_sin (B|1, Lq, D/2)`` and
    ``k_cos, k_sin (B|1, Lk, D/2)``; q, k, v get the inverse rotation, the output the
    forward one."""

    q_cos: Tensor
    q_sin: Tensor
    k_cos: Tensor
    k_sin: Tensor


IDENTITY_CHANNELS = Bool(
    doc="let head_dim % (2 * coordinates) channels pass through (False: refuse such a "
    "head_dim, as RayRoPE does)"
)


@register("rayrope")
class RayRoPE(CameraFrames):
    """RayRoPE (see the module docstring). Options: ``grid=(Px, Py)``, ``image_size=(W,
    H)`` (both needed), ``rays_per_patch`` (3), ``freq_base`` (3), ``rotate_values`` (True)."""

    paper = "RayRoPE 2025 (ray-based RoPE in the query frame, expected RoPE under depth doubt)"
    reads_intrinsics = True
    needs_intrinsics = True
    relative = False
    cache_rotated_keys = False
    required_inputs = {
        "k_viewmats": "(B, Lk, 4, 4) world-to-camera per key token",
        "k_Ks": "(B, Lk, 3, 3) pixel intrinsics per key token",
        "k_depth_logsigma": "(B, Lk, 2) (log depth, sigma) per key token",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        grid: Annotated[tuple[int, int] | None, PATCH_GRID] = None,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        rays_per_patch: Annotated[
            int, Choice(choices=(1, 2, 3), doc="rays per patch (corners or centre)")
        ] = 3,
        freq_base: Annotated[float, Float(above=1.0, doc="ratio of adjacent frequencies")] = 3.0,
        max_log_depth: Annotated[
            float, Float(doc="clamp of log d -+ sigma (3: depths up to e^3)")
        ] = MAX_LOG_DEPTH,
        group_limit: Annotated[
            int, Int(doc="most query cameras per batch row (each costs one attention)")
        ] = 64,
        identity_channels: Annotated[bool, IDENTITY_CHANNELS] = True,
        rotate_values: Annotated[bool, ROTATE_VALUES] = True,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        self.optional_inputs["q_depth_logsigma"] = "(B, Lq, 2) (log depth, sigma) per query"
        self.coordinates = 3 + 3 * rays_per_patch
        per = 2 * self.coordinates
        if head_dim % 2 or head_dim < per or (head_dim % per and not identity_channels):
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'rayrope' with rays_per_patch="
                f"{rays_per_patch}: head_dim % {per} == 0 (a pair per coordinate and frequency; "
                f"identity_channels=True lets the remainder of an even head_dim pass through)"
            )
        self.identity_channels = identity_channels
        self._set_channels(0, head_dim // per * per, "")
        self.grid, self.image_size = grid, image_size
        self.rays_per_patch, self.freq_base = rays_per_patch, freq_base
        self.max_log_depth, self.group_limit = max_log_depth, group_limit
        F = head_dim // per
        kinds = ["p0"] * 3 + ["dir"] * (2 * rays_per_patch) + ["depth"] * rays_per_patch
        freqs = torch.stack([rayrope_frequencies(F, MAX_PERIODS[k], freq_base) for k in kinds], -1)
        self.register_buffer("freqs", freqs, persistent=False)  # (F, coordinates) float64

    @classmethod
    def example_options(cls) -> dict:
        return {"grid": (4, 4), "image_size": (32.0, 32.0), "rays_per_patch": 1}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """``CameraFrames.example_inputs`` with the same two cameras in every batch row (each
        distinct query camera costs one attention), plus depths: log depth ``N(1, 0.3^2)``
        and sigma ``U(0, 0.3)`` per token (prefix-consistent: drawn for 64 tokens and cut)."""
        one = super().example_inputs(1, length_q, length_k, generator)
        out = {n: t.expand(batch, *t.shape[1:]).contiguous() for n, t in one.items()}
        n = max(64, length_k, length_q)
        logd = 1.0 + 0.3 * torch.randn(batch, n, generator=generator, dtype=torch.float64)
        sigma = 0.3 * torch.rand(batch, n, generator=generator, dtype=torch.float64)
        table = torch.stack((logd, sigma), -1)
        out["k_depth_logsigma"] = table[:, :length_k]
        if length_q > length_k:
            out["q_depth_logsigma"] = table[:, :length_q]
        return out

    # ------------------------------------------------------------------ coordinates
    def _depths(self, inputs: dict[str, Tensor], side: str, length: int, keys: Tensor | None):
        name = f"{side}_depth_logsigma"
        value = inputs.get(name)
        if value is None:
            return self._last_rows(keys, name, length)
        key = f"inputs[{name!r}]"
        check_finite_tensor(value, key, floating=True)
        if value.dim() != 3 or value.shape[1] != length or value.shape[2] != 2:
            raise ValueError(
                f"{key} must have shape (B, L, 2) = (log depth, sigma) with L = {length}, got "
                f"{tuple(value.shape)}"
            )
        return value.to(torch.float64)

    def _rays(self, pos: Tensor) -> Tensor:
        """Normalised image coordinates of each token's rays ``(B|1, L, R, 2)``."""
        px, py = self.grid  # type: ignore[misc]
        p = pos.to(torch.float64)
        off = torch.tensor(ray_offsets(self.rays_per_patch), dtype=torch.float64, device=p.device)
        u = (p[..., None, 0] + off[:, 0]) / px - 0.5
        v = (p[..., None, 1] + off[:, 1]) / py - 0.5
        return torch.stack((u, v), -1)

    def coordinates_in(
        self,
        w2c_c: Tensor,
        P_c: Tensor,
        view: Tensor,
        K: Tensor,
        pos: Tensor,
        depth: Tensor,
    ) -> Tensor:
        """RayRoPE's coordinates ``(B, L, 3 + 3R)`` of tokens with cameras ``view (B, L, 4,
        4)``, normalised intrinsics ``K (B, L, 3, 3)``, positions ``pos`` and depths ``depth
        (B, L)`` in the frame of the camera ``w2c_c``, ``P_c`` (``(B|1, 1, 4, 4)``)."""
        centre = camera_centers(view)
        one = torch.ones_like(centre[..., :1])
        p0 = (w2c_c @ torch.cat((centre, one), -1)[..., None])[..., 0]
        p0 = p0[..., :3] / p0[..., 3:].clamp_min(1e-4)
        P_inv = invert_se3(view) @ lift(invert_K(K))  # (B, L, 4, 4)
        uv = self._rays(pos)
        uv = uv.expand(*P_inv.shape[:2], *uv.shape[2:])
        d = depth.clamp(1e-2, MAX_DEPTH)[..., None, None].expand(*uv.shape[:-1], 1)
        h = torch.cat((uv, torch.ones_like(d), 1 / d), -1)  # (B, L, R, 4)
        X = (P_inv[:, :, None] @ h[..., None])[..., 0]
        Y = (P_c[:, :, None] @ X[..., None])[..., 0]
        z = torch.sqrt(Y[..., 2] ** 2 + 1e-9).clamp_min(1e-4)
        dist = (z / Y[..., 3].clamp_min(1e-4)).clamp(-MAX_DEPTH_COORD, MAX_DEPTH_COORD)
        direction = Y[..., :3] / (Y[..., :3].norm(dim=-1, keepdim=True) + 1e-6)
        return torch.cat((p0, direction[..., :2].flatten(-2), dist), -1)

    def _coefficients(self, coords1: Tensor, coords2: Tensor) -> tuple[Tensor, Tensor]:
        """Expected cos/sin ``(B, L, F * C)`` (frequency-major) between two depth bounds."""
        a1 = (self.freqs * coords1[..., None, :]).flatten(-2)
        a2 = (self.freqs * coords2[..., None, :]).flatten(-2)
        return expected_rotation(a1, a2)

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> Any:
        if self.grid is None or self.image_size is None:
            raise ValueError(
                "encoding 'rayrope' casts rays per patch: create it with grid=(Px, Py) and "
                "image_size=(W, H)"
            )
        q_view, q_K, k_view, k_K = self.gather_cameras(q_pos, k_pos, inputs)
        assert q_K is not None and k_K is not None
        Lq, Lk = q_pos.shape[1], k_pos.shape[1]
        k_depth = self._depths(inputs, "k", Lk, None)
        q_depth = self._depths(inputs, "q", Lq, k_depth)
        batch = max(q_view.shape[0], k_view.shape[0], k_depth.shape[0], q_depth.shape[0])
        q_view, k_view = q_view.expand(batch, Lq, 4, 4), k_view.expand(batch, Lk, 4, 4)
        q_K, k_K = q_K.expand(batch, Lq, 3, 3), k_K.expand(batch, Lk, 3, 3)
        q_depth, k_depth = q_depth.expand(batch, Lq, 2), k_depth.expand(batch, Lk, 2)
        qn = normalize_K(q_K, self.image_size)  # type: ignore[arg-type]
        kn = normalize_K(k_K, self.image_size)  # type: ignore[arg-type]
        # the groups: the distinct query cameras (extrinsics and intrinsics) of each batch
        # row; group g holds the g-th camera of every row, (G, B, 4, 4)
        views, intrinsics, index = row_camera_groups(q_view, qn, self.group_limit, self.name)
        assert intrinsics is not None
        bounds = []
        for depth in (q_depth, k_depth):
            logd, sigma = depth[..., 0], depth[..., 1]
            lo = torch.exp((logd - sigma).clamp(max=self.max_log_depth))
            hi = torch.exp((logd + sigma).clamp(max=self.max_log_depth))
            bounds.append((lo, hi))
        groups = []
        for g in range(views.shape[0]):
            w2c_c = views[g][:, None]  # (B, 1, 4, 4)
            P_c = lift(intrinsics[g][:, None]) @ w2c_c
            coefs = []
            for (view, K, pos), (lo, hi) in zip(
                ((q_view, qn, q_pos), (k_view, kn, k_pos)), bounds, strict=True
            ):
                c1 = self.coordinates_in(w2c_c, P_c, view, K, pos, lo)
                c2 = self.coordinates_in(w2c_c, P_c, view, K, pos, hi)
                coefs.append(self._coefficients(c1, c2))
            state = RayState(coefs[0][0], coefs[0][1], coefs[1][0], coefs[1][1])
            groups.append((index == g, state))
        return QueryGroups(groups)

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        if role not in ("q", "k", "v", "o") or (role in ("v", "o") and not self.rotate_values):
            return x
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"encoding 'rayrope' re-frames {role} with head_dim {self.head_dim}, got "
                f"{x.shape[-1]} channels (pass rotate_values=False for another value head_dim)"
            )
        if state is None or x.shape[2] == 0:
            return x  # no cameras: the identity
        if not isinstance(state, RayState):
            raise TypeError(
                "rayrope rotates with one query group's RayState (the engine runs one "
                f"attention per group), got {type(state).__name__}"
            )
        cos, sin = (state.q_cos, state.q_sin) if role in ("q", "o") else (state.k_cos, state.k_sin)
        if cos.shape[1] != x.shape[2]:
            raise ValueError(
                f"the rayrope state has {cos.shape[1]} tokens but {role} has {x.shape[2]}"
            )
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        c, s = cos.to(cd)[:, None], sin.to(cd)[:, None]
        r = self.rope_channels
        x1, x2 = x[..., :r].to(cd).chunk(2, dim=-1)
        if role == "o":
            parts = [x1 * c - x2 * s, x1 * s + x2 * c]
        else:
            parts = [x1 * c + x2 * s, x2 * c - x1 * s]
        if r < self.head_dim:
            parts.append(x[..., r:].to(cd))
        return torch.cat(parts, -1).to(x.dtype)

    def camera_blocks(self, viewmats, Ks, pos):  # pragma: no cover - no camera channels
        raise RuntimeError("rayrope has no camera block channels")
