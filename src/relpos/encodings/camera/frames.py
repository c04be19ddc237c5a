"""Per-token frames: the building block of the relative camera encodings.

Token ``i`` carries a block-diagonal frame ``T_i in GL(D)``: one 4x4 camera block repeated
on each 4-channel chunk of the first ``proj_channels`` channels (``Proj4(M_i)``), then RoPE
sections (2x2 rotations of the token's patch position), then identity channels. The roles:

    q'_i = T_i^T q_i,   k'_j = T_j^-1 k_j,   v'_j = T_j^-1 v_j,   o'_i = T_i o_i

so ``logit_ij = q_i^T (T_i T_j^-1) k_j * scale`` and ``out_i = sum_j a_ij (T_i T_j^-1) v_j``:
key ``j``'s frame is mapped into query ``i``'s (e.g. ``P_i P_j^-1``: key image -> world ->
query image), and values arrive in the query's frame. A gauge ``T_i -> T_i A`` cancels, so
any block ``M = f(w2c)`` with ``f(w2c G^-1) = f(w2c) G'`` makes the encoding invariant to a
rigid change of world coordinates ``G`` (``se3_invariant``). For the orthogonal RoPE blocks
``T^T = T^-1``: queries and keys get the same rotation, as in RoPE.

An encoding is one choice of ``M`` (``camera_blocks``) and of its RoPE sections
(``rope_sections``): PRoPE, StereoWorld, UCPE, GTA and CaPE-6DoF live next to this module.

Engine hooks: ``prepare_rotary(q_pos, k_pos, inputs)`` reads the per-call cameras once and
returns a ``FrameState`` (the query blocks ``M_i`` and the key inverses ``M_j^-1``, float64);
the engine passes it to ``rotate(x, pos, role, state)`` for q, k, v and the output. Without a
state (``rotate`` called directly, e.g. by ``relpos_lab.analysis``) every token has the identity
camera block: for encodings whose blocks depend on the camera only (PRoPE, GTA, CaPE,
StereoWorld) that is the reduction for identical cameras, whose logits and outputs equal
those of any shared camera; UCPE's per-ray frames also read the pixel, so there it is only
the RoPE part.

Inputs (``relpos.attention(..., inputs=...)``):

* ``k_viewmats (B, Lk, 4, 4)`` world-to-camera per key token (required; ``relpos.cameras``:
  ``expand_cameras`` turns per-camera matrices and a camera index into per-token ones);
* ``k_Ks (B, Lk, 3, 3)`` pixel intrinsics (encodings that read them);
* ``q_viewmats``, ``q_Ks`` for the queries (cross-attention); by default the last ``Lq``
  rows of the key side, as relpos's default query positions are the last ``Lq`` key
  positions. With a KV cache, pass the new tokens' cameras: cached keys keep their frames.

Batch size 1 broadcasts. Arithmetic: the 4x4 products run in float32 (float64 for float64
activations) with the matrices built in float64 from the inputs; far from the origin,
re-anchor the cameras in float64 first (``relpos.cameras.anchor``). GQA: frames are
shared by the heads, so grouped keys are rotated before they are repeated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor

from ...cameras import check_intrinsics, check_viewmats, random_se3
from ...functional import apply_rotary
from ..base import Encoding
from ..options import Bool, FloatSequence, IntSequence

__all__ = ["FrameState", "CameraFrames", "apply_proj4"]


@dataclass
class FrameState:
    """What ``CameraFrames.prepare_rotary`` computes once per call (float64).

    ``q_blocks (B|1, Lq, 4, 4)``: the camera blocks ``M_i`` of the queries (q gets ``M_i^T``,
    the output ``M_i``); ``k_inverse (B|1, Lk, 4, 4)``: ``M_j^-1`` of the keys (k and v).
    ``q_angles`` / ``k_angles``: RoPE angles per section, ``(B|1, L, pairs)``, for encodings
    whose RoPE coordinates come from the cameras (RayNova); None: ``rope_sections(pos)``."""

    q_blocks: Tensor | None
    k_inverse: Tensor | None
    q_angles: list[Tensor] | None = None
    k_angles: list[Tensor] | None = None


def apply_proj4(x: Tensor, M: Tensor) -> Tensor:
    """``Proj4(M)``: the same 4x4 matrix per token on every 4-channel chunk of ``x``.

    ``x (B, H, L, 4c)``, ``M (B|1, L, 4, 4)`` -> ``(B, H, L, 4c)`` in ``x.dtype``:
    ``out[b, h, l, 4n:4n+4] = M[b, l] @ x[b, h, l, 4n:4n+4]`` (16 multiply-adds per 4
    channels)."""
    B, H, L, C = x.shape
    chunks = x.reshape(B, H, L, C // 4, 4)
    return (chunks @ M[:, None].transpose(-1, -2).to(x.dtype)).reshape(B, H, L, C)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


#: the options the camera encodings share
IMAGE_SIZE = FloatSequence(
    length=2, above=0.0, optional=True, doc="(W, H) in pixels, to normalise intrinsics"
)
PATCH_GRID = IntSequence(length=2, optional=True, doc="(Px, Py) patches per image")
ROTATE_VALUES = Bool(
    doc="re-frame values (T_j^-1 v) and outputs (T_i o); False: queries and keys only"
)


class CameraFrames(Encoding):
    """Base class of the per-token frame encodings (see the module docstring).

    Subclasses set ``proj_channels`` (a multiple of 4) in ``__init__`` and implement
    ``camera_blocks(viewmats, Ks, pos) -> (M, M^-1)`` (float64, ``(B|1, L, 4, 4)``, inverse in
    closed form), and, when they have RoPE channels, ``rope_sections(pos)`` (a list of angle
    tensors ``(B|1, L, pairs)``, one per contiguous section of ``2 * pairs`` channels after the
    camera channels) with ``rope_layout`` and ``rope_sign`` (q, k and v turn by
    ``rope_sign * angle``, the output by ``-rope_sign * angle``). Channels after the sections
    pass through.
    """

    paper: ClassVar[str] = ""

    relative = True
    continuous = True
    has_rotary = True
    cache_rotated_keys = True
    se3_invariant = True
    required_inputs = {"k_viewmats": "(B, Lk, 4, 4) world-to-camera per key token"}
    #: whether the camera blocks read intrinsics (adds ``k_Ks`` / ``q_Ks`` to the inputs)
    reads_intrinsics: ClassVar[bool] = False
    #: whether ``k_Ks`` is required (UCPE casts its rays through them)
    needs_intrinsics: ClassVar[bool] = False
    rope_layout: ClassVar[str] = "half"
    #: the RoPE channels come in multiples of this (PRoPE: 4, a pair per axis)
    rope_multiple: ClassVar[int] = 2
    rope_sign: ClassVar[float] = -1.0
    #: image size used by ``example_inputs`` (W, H) when the encoding has none
    EXAMPLE_IMAGE: ClassVar[tuple[float, float]] = (32.0, 32.0)

    def __init__(
        self, num_heads: int, head_dim: int, rotate_values: Annotated[bool, ROTATE_VALUES] = True
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.rotate_values = rotate_values
        self.rotates_values = rotate_values
        self.proj_channels = 0
        self.rope_channels = 0
        self.optional_inputs = {"q_viewmats": "(B, Lq, 4, 4) world-to-camera per query token"}
        self.required_inputs = dict(type(self).required_inputs)
        if self.reads_intrinsics:
            ks = {"k_Ks": "(B, Lk, 3, 3) pixel intrinsics per key token"}
            if self.needs_intrinsics:
                self.required_inputs.update(ks)
            else:
                self.optional_inputs.update(ks)
            self.optional_inputs["q_Ks"] = "(B, Lq, 3, 3) pixel intrinsics per query token"

    def _set_channels(self, proj_channels: int, rope_channels: int, requirement: str) -> None:
        """Record the channel layout; a head_dim that cannot take it is refused by name."""
        if (
            proj_channels % 4
            or rope_channels % self.rope_multiple
            or rope_channels < 0
            or proj_channels + rope_channels > self.head_dim
        ):
            raise ValueError(
                f"head_dim={self.head_dim} cannot take encoding {self.name!r}: {requirement} "
                f"(camera channels {proj_channels}, rope channels {rope_channels})"
            )
        self.proj_channels = proj_channels
        self.rope_channels = rope_channels
        self.dims = 2 if rope_channels else 1

    # ------------------------------------------------------------------ subclass hooks
    def camera_blocks(
        self, viewmats: Tensor, Ks: Tensor | None, pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(M, M^-1)`` per token, float64 ``(B|1, L, 4, 4)``, from checked float64 cameras
        ``viewmats (B|1, L, 4, 4)``, ``Ks (B|1, L, 3, 3)`` or None, and ``pos``."""
        raise NotImplementedError

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        """Angles (float64, ``(B|1, L, pairs)``) of each RoPE section, in channel order."""
        return []

    # ------------------------------------------------------------------ engine hooks
    def _cameras(self, inputs: dict[str, Tensor], name: str, length: int) -> Tensor | None:
        """``inputs[name]`` checked (rigid w2c or intrinsics, ``(B, length, r, c)``) as
        float64, or None when absent."""
        value = inputs.get(name)
        if value is None:
            return None
        key = f"inputs[{name!r}]"
        views = name.endswith("viewmats")
        value = check_viewmats(value, key) if views else check_intrinsics(value, key)
        form = "(B, L, 4, 4)" if views else "(B, L, 3, 3)"
        if value.dim() != 4 or value.shape[1] != length:
            side = "query" if name.startswith("q") else "key"
            raise ValueError(
                f"{key} must have shape {form} with L = {length} (the {side} tokens of this "
                f"call), got {tuple(value.shape)}"
            )
        return value.to(torch.float64)

    @staticmethod
    def _last_rows(keys: Tensor | None, name: str, length: int) -> Tensor | None:
        """The query side's default: the last ``length`` rows of the key side."""
        if keys is None:
            return None
        if keys.shape[1] < length:
            raise ValueError(
                f"inputs[{name!r}] is needed: the queries ({length}) outnumber the keys "
                f"({keys.shape[1]}), so they cannot default to the last Lq key tokens' cameras"
            )
        return keys[:, keys.shape[1] - length :]

    def gather_cameras(
        self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """The call's cameras, checked, as float64 ``(q_viewmats, q_Ks, k_viewmats, k_Ks)``
        (the query side defaulting to the last Lq key tokens'; Ks None when not read)."""
        Lq, Lk = q_pos.shape[1], k_pos.shape[1]
        k_view = self._cameras(inputs, "k_viewmats", Lk)
        assert k_view is not None  # required: the engine checked its presence
        q_view = self._cameras(inputs, "q_viewmats", Lq)
        if q_view is None:
            q_view = self._last_rows(k_view, "q_viewmats", Lq)
        k_K = q_K = None
        if self.reads_intrinsics:
            k_K = self._cameras(inputs, "k_Ks", Lk)
            q_K = self._cameras(inputs, "q_Ks", Lq)
            if q_K is None:
                q_K = self._last_rows(k_K, "q_Ks", Lq)
            elif k_K is None:
                raise ValueError("inputs['q_Ks'] needs inputs['k_Ks'] (intrinsics for both sides)")
        for side, view, K in (("q", q_view, q_K), ("k", k_view, k_K)):
            if (
                K is not None
                and K.shape[0] != view.shape[0]
                and 1 not in (K.shape[0], view.shape[0])
            ):
                raise ValueError(
                    f"inputs[{side + '_Ks'!r}] and the {side} side's viewmats must share the "
                    f"batch size, got {K.shape[0]} and {view.shape[0]}"
                )
        return q_view, q_K, k_view, k_K

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> FrameState:
        """Check the call's cameras and build the frames (``FrameState``, float64)."""
        q_view, q_K, k_view, k_K = self.gather_cameras(q_pos, k_pos, inputs)
        q_blocks, _ = self.camera_blocks(q_view, q_K, q_pos)
        _, k_inverse = self.camera_blocks(k_view, k_K, k_pos)
        return FrameState(q_blocks=q_blocks, k_inverse=k_inverse)

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        if role in ("v", "o") and not self.rotate_values:
            return x
        if role not in ("q", "k", "v", "o"):
            return x
        D = self.proj_channels + self.rope_channels
        if x.shape[-1] != self.head_dim:
            what = {"q": "q", "k": "k", "v": "v", "o": "the output"}[role]
            raise ValueError(
                f"encoding {self.name!r} re-frames {what} with head_dim {self.head_dim}, got "
                f"{x.shape[-1]} channels (pass rotate_values=False for another value head_dim)"
            )
        if x.shape[2] == 0:
            return x
        cd = _compute_dtype(x)
        parts = []
        if self.proj_channels:
            M = None
            if state is not None and self.proj_channels:
                if not isinstance(state, FrameState):
                    raise TypeError(
                        f"state must be a FrameState (prepare_rotary), got {type(state).__name__}"
                    )
                if role == "q":
                    M = state.q_blocks.transpose(-1, -2)
                elif role == "o":
                    M = state.q_blocks
                else:
                    M = state.k_inverse
                if M.shape[1] != x.shape[2] or M.shape[0] not in (1, x.shape[0]):
                    side = "q" if role in ("q", "o") else "k"
                    raise ValueError(
                        f"the cameras of this call (inputs[{side + '_viewmats'!r}]) have shape "
                        f"{tuple(M.shape)}, but {role} has batch {x.shape[0]} and "
                        f"{x.shape[2]} tokens"
                    )
            xp = x[..., : self.proj_channels].to(cd)
            parts.append(xp if M is None else apply_proj4(xp, M.to(cd)))
        if self.rope_channels:
            sign = self.rope_sign if role in ("q", "k", "v") else -self.rope_sign
            start = self.proj_channels
            sections = None
            if isinstance(state, FrameState):
                sections = state.q_angles if role in ("q", "o") else state.k_angles
            for angles in self.rope_sections(pos) if sections is None else sections:
                n = angles.shape[-1]
                a = torch.remainder(sign * angles, 2 * math.pi)
                cos, sin = a.cos().to(cd)[:, None], a.sin().to(cd)[:, None]
                seg = x[..., start : start + 2 * n].to(cd)
                parts.append(apply_rotary(seg, cos, sin, self.rope_layout))
                start += 2 * n
        if D < self.head_dim:
            parts.append(x[..., D:].to(cd))
        return torch.cat(parts, -1).to(x.dtype)

    # ------------------------------------------------------------------ tests and docs
    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Two random cameras per batch row (rotation Haar, translation N(0, 1), focal
        ``U(0.8, 1.2) W``, principal point ``(W/2, H/2)``), token ``n`` of the key side in
        camera ``(n // 8) % 2``: the cameras of a prefix of the keys do not depend on the
        length (KV-cache and single-query tests). Query cameras follow the same rule in key
        coordinates (``i + Lk - Lq``) and are passed only when ``Lq > Lk``."""
        cams = random_se3(2 * batch, generator=generator).reshape(batch, 2, 4, 4)
        W, H = cls.EXAMPLE_IMAGE
        f = W * (0.8 + 0.4 * torch.rand(batch, 2, generator=generator, dtype=torch.float64))
        K = torch.zeros(batch, 2, 3, 3, dtype=torch.float64)
        K[..., 0, 0], K[..., 1, 1] = f, f
        K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = W / 2, H / 2, 1.0

        def pick(index: Tensor, mats: Tensor) -> Tensor:
            cam = torch.div(index, 8, rounding_mode="floor") % 2
            return mats[:, cam]

        out = {"k_viewmats": pick(torch.arange(length_k), cams)}
        if cls.reads_intrinsics:
            out["k_Ks"] = pick(torch.arange(length_k), K)
        if length_q > length_k:
            qi = torch.arange(length_q) + length_k - length_q
            out["q_viewmats"] = pick(qi, cams)
            if cls.reads_intrinsics:
                out["q_Ks"] = pick(qi, K)
        return out
