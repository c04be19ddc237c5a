"""GTA, Geometric Transform Attention (Miyato, Jaeger, Welling, Geiger, ICLR 2024; official code
autonomousvision/gta, ``source/utils/gta.py``, ``source/layers.py`` ``trans_coeff``).

Per-token frame (``frames.CameraFrames``) with channel sections ``se3 | so2 | identity``:

* **se3** (``se3_dim`` channels, a multiple of 4): ``Proj4(T_i)`` with
  ``T = D_s w2c D_s^-1``, ``D_s = diag(1, 1, 1, 1/s)``: the world-to-camera matrix with its
  translation scaled by ``s = trans_coeff`` (init 0.01, learned per layer by default) and
  ``T^-1 = D_s c2w D_s^-1`` exactly (the scale applied to both). q gets
  ``T^T``, k and v ``T^-1``, the output ``T``.
* **so2** (``4 * so2_freqs`` channels): coordinates ``p = (row / H_p, col / W_p)``,
  frequencies ``omega_k = 2 pi max_freq 2^(k - n)``, ``k = 1..n``; 2x2 rotations
  ``[[cos, -sin], [sin, cos]]`` on interleaved pairs, frequency-major and axis-minor (pairs
  ``(omega_1, row), (omega_1, col), (omega_2, row), ...``); q, k, v turn by ``+omega p``
  and the output back (the HF sign: logits depend on ``p_j - p_i``).
* **so3** (``so3_dim`` channels, whole chunks of ``sum_{l=1..L} (2l + 1) = L (L + 2)``
  channels, ``L = so3_degrees``; GTA: "so3rep"): on each chunk the block-diagonal real
  Wigner-D matrices ``D^l(R_c2w)``, ``l = 1..L`` (``camera.wigner``): ``q' = D(R_i) q``,
  ``k' = D(R_j) k``, ``v' = D(R_j) v``, ``o' = D(R_i)^T o``, so ``logit = q^T D(R_i^T R_j)
  k`` reads the relative camera rotation only (orthogonal: no scale problem). GTA detaches
  ``D``; here it stays differentiable (cameras are usually inputs without gradients).
* **t2** (``t2_dim`` channels, chunks of 3; GTA: "t2rep"): ``T(p) = [[1, 0, 0], [0, 1, 0],
  [p_row, p_col, 1]]`` of the so2 coordinates, ``q' = T(p_i)^-T q``, ``k' = T(p_j) k``, ``v'
  = T(p_j) v``, ``o' = T(p_i)^-1 o`` (``T(p)^-1 = T(-p)``): ``logit = q^T T(p_j - p_i) k``,
  a relative translation of the patch plane (not orthogonal).
* remaining channels pass through (GTA's "triv" section). GTA orders the sections ``triv |
  se3 | so3 | so2 | t2``; here ``se3 | so2 | so3 | t2 | triv``: the same model up to a fixed
  permutation of the head channels.

The released CLEVR-TR and MSN configurations use se3 + so2 (the defaults). GTA
canonicalises the cameras to the first input view (``relpos.cameras.anchor``): an exact
gauge here.

Shapes: ``x (B, H, L, D)``; ``pos (B|1, L, 2)`` = (row, col) patch indices (or, with
``grid=None``, the normalised coordinates themselves); ``inputs["k_viewmats"] (B, Lk, 4,
4)`` world-to-camera, optional ``q_viewmats``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ..options import Bool, Float, Int, IntSequence
from ..registry import register
from .frames import ROTATE_VALUES, CameraFrames, FrameState
from .wigner import wigner_d

__all__ = ["GTA", "GTAState", "so2_frequencies", "t2_matrices"]


def so2_frequencies(n: int, max_freq: float = 1.0) -> Tensor:
    """GTA's so2 frequencies ``2 pi max_freq 2^(k - n)``, ``k = 1..n`` (float64, ``(n,)``):
    at most ``max_freq`` turns over the image (n = 8 -> 0.049 .. 6.283)."""
    k = torch.arange(1, n + 1, dtype=torch.float64)
    return 2 * math.pi * max_freq * 2.0 ** (k - n)


def t2_matrices(p: Tensor) -> Tensor:
    """GTA's T(2) matrices ``[[1, 0, 0], [0, 1, 0], [p_0, p_1, 1]]`` of 2-D coordinates
    ``p (..., 2)``: ``(..., 3, 3)`` (``T(p)^-1 = T(-p)``, ``T(a) T(b) = T(a + b)``)."""
    out = torch.zeros(*p.shape[:-1], 3, 3, dtype=p.dtype, device=p.device)
    out[..., 0, 0] = out[..., 1, 1] = out[..., 2, 2] = 1
    out[..., 2, :2] = p
    return out


def _apply_chunks(x: Tensor, M: Tensor) -> Tensor:
    """The same matrix per token on every chunk of ``x``: ``x (B, H, L, c n)``, ``M (B|1, L,
    n, n)`` -> ``(B, H, L, c n)`` (``out_chunk = M @ x_chunk``)."""
    B, H, L, C = x.shape
    n = M.shape[-1]
    chunks = x.reshape(B, H, L, C // n, n)
    return (chunks @ M[:, None].transpose(-1, -2).to(x.dtype)).reshape(B, H, L, C)


@dataclass
class GTAState(FrameState):
    """``FrameState`` plus the SO(3) section's block-diagonal Wigner-D matrices ``D(R_c2w)``
    of the queries and keys, ``(B|1, L, s, s)`` float64 (``s = L (L + 2)``; None without
    an so3 section)."""

    q_so3: Tensor | None = None
    k_so3: Tensor | None = None


SO2_FREQS = Int(minimum=0, optional=True, doc="frequencies per axis of the so2 section")


@register("gta")
class GTA(CameraFrames):
    """GTA (see the module docstring). Options: ``se3_dim`` (default ``head_dim / 2``
    rounded down to a multiple of 4), ``so2_freqs`` (default: the rest of the head, ``(D -
    se3_dim) // 4``), ``grid=(H_p, W_p)`` (patch grid; None: positions are already
    normalised), ``max_freq`` (1), ``trans_coeff`` (0.01), ``learn_trans_coeff`` (True),
    ``so3_degrees`` (0: no SO(3) section), ``so3_dim`` (default one chunk, ``L (L + 2)``),
    ``t2_dim`` (0), ``rotate_values`` (True). The defaults split what so3 and t2 leave."""

    paper = "Miyato et al. 2024 (GTA, Geometric Transform Attention)"
    reads_intrinsics = False
    rope_layout = "interleaved"
    rope_sign = 1.0

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        se3_dim: Annotated[
            int | None, Int(minimum=0, optional=True, doc="channels of the SE(3) section (x4)")
        ] = None,
        so2_freqs: Annotated[int | None, SO2_FREQS] = None,
        grid: Annotated[
            tuple[int, int] | None,
            IntSequence(length=2, optional=True, doc="(H_p, W_p) patch grid"),
        ] = None,
        max_freq: Annotated[
            float, Float(above=0.0, doc="largest so2 frequency, in turns per image")
        ] = 1.0,
        trans_coeff: Annotated[float, Float(doc="initial translation scale s")] = 0.01,
        learn_trans_coeff: Annotated[
            bool, Bool(doc="train s (an nn.Parameter per encoding)")
        ] = True,
        so3_degrees: Annotated[
            int, Int(minimum=0, doc="Wigner-D degrees 1..L of the SO(3) section")
        ] = 0,
        so3_dim: Annotated[
            int | None, Int(minimum=0, optional=True, doc="channels of the SO(3) section")
        ] = None,
        t2_dim: Annotated[int, Int(minimum=0, doc="channels of the T(2) section (x3)")] = 0,
        rotate_values: Annotated[bool, ROTATE_VALUES] = True,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        chunk = so3_degrees * (so3_degrees + 2)  # sum of 2l + 1 over l = 1..L
        so3 = chunk if so3_dim is None else so3_dim
        extra = so3 + t2_dim
        if se3_dim is None and so2_freqs is None and not extra and head_dim % 4:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'gta' with its default sections: "
                "head_dim % 4 == 0 (se3 and so2 come in 4-channel chunks); pass se3_dim and "
                "so2_freqs to keep identity channels"
            )
        if (so3 and (not chunk or so3 % chunk)) or t2_dim % 3:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'gta' with so3_dim={so3}, "
                f"so3_degrees={so3_degrees}, t2_dim={t2_dim}: so3_dim must be a multiple of "
                f"so3_degrees * (so3_degrees + 2) = {chunk} (one Wigner-D block per degree) "
                "and t2_dim a multiple of 3"
            )
        free = head_dim - extra
        se3 = (free // 2) // 4 * 4 if se3_dim is None else se3_dim
        n = max(free - se3, 0) // 4 if so2_freqs is None else so2_freqs
        self._set_channels(
            se3,
            4 * n,
            "se3_dim must be a multiple of 4 and se3_dim + 4 * so2_freqs + so3_dim + t2_dim "
            "<= head_dim",
        )
        if se3 + 4 * n + extra > head_dim:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'gta': se3_dim + 4 * so2_freqs + "
                f"so3_dim + t2_dim = {se3 + 4 * n + extra} channels"
            )
        self.se3_dim, self.so2_freqs, self.grid, self.max_freq = se3, n, grid, max_freq
        self.so3_degrees, self.so3_dim, self.t2_dim = so3_degrees, so3, t2_dim
        if t2_dim:
            self.dims = 2  # t2 reads (row, col) like so2
        if trans_coeff == 0:
            raise ValueError("trans_coeff must be a non-zero number (T = D_s w2c D_s^-1)")
        s = torch.tensor(float(trans_coeff))
        if learn_trans_coeff:
            self.trans_coeff = nn.Parameter(s)
        else:
            self.register_buffer("trans_coeff", s)
        self.register_buffer("omega", so2_frequencies(n, max_freq), persistent=False)

    @classmethod
    def example_options(cls) -> dict:
        return {"grid": (8, 8)}

    def camera_blocks(
        self, viewmats: Tensor, Ks: Tensor | None, pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        s = self.trans_coeff.to(torch.float64)
        R, t = viewmats[..., :3, :3], viewmats[..., :3, 3:]
        Rt = R.transpose(-1, -2)
        bottom = viewmats[..., 3:, :]
        T = torch.cat((torch.cat((R, s * t), -1), bottom), -2)
        T_inv = torch.cat((torch.cat((Rt, -s * (Rt @ t)), -1), bottom), -2)
        return T, T_inv

    def coordinates(self, pos: Tensor) -> Tensor:
        """The so2 / t2 coordinates ``p = (row / H_p, col / W_p)`` (float64, ``(B|1, L, 2)``)."""
        p = pos.to(torch.float64)
        if self.grid is not None:
            p = p / torch.tensor(self.grid, dtype=torch.float64, device=pos.device)
        return p

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        if not self.so2_freqs:
            return []
        p = self.coordinates(pos)
        omega = self.omega.to(device=pos.device, dtype=torch.float64)
        # frequency-major, axis-minor: (omega_1, row), (omega_1, col), (omega_2, row), ...
        return [(omega[:, None] * p[..., None, :]).flatten(-2)]

    def so3_blocks(self, viewmats: Tensor) -> Tensor:
        """``blockdiag(D^1, .., D^L)(R_c2w)`` per token, ``(B|1, L, s, s)`` float64."""
        R_c2w = viewmats[..., :3, :3].transpose(-1, -2)
        blocks = [wigner_d(R_c2w, l) for l in range(1, self.so3_degrees + 1)]
        return _block_diagonal(blocks)

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> FrameState:
        q_view, q_K, k_view, k_K = self.gather_cameras(q_pos, k_pos, inputs)
        q_blocks, _ = self.camera_blocks(q_view, q_K, q_pos)
        _, k_inverse = self.camera_blocks(k_view, k_K, k_pos)
        if not self.so3_dim:
            return FrameState(q_blocks=q_blocks, k_inverse=k_inverse)
        return GTAState(
            q_blocks=q_blocks,
            k_inverse=k_inverse,
            q_so3=self.so3_blocks(q_view),
            k_so3=self.so3_blocks(k_view),
        )

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        out = super().rotate(x, pos, role, state)
        if not (self.so3_dim or self.t2_dim) or role not in ("q", "k", "v", "o"):
            return out
        if (role in ("v", "o") and not self.rotate_values) or x.shape[2] == 0:
            return out
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        start = self.proj_channels + self.rope_channels
        parts = [out[..., :start].to(cd)]
        if self.so3_dim:
            seg = x[..., start : start + self.so3_dim].to(cd)
            D = None
            if isinstance(state, GTAState):
                D = state.q_so3 if role in ("q", "o") else state.k_so3
                if D.shape[1] != x.shape[2]:
                    raise ValueError(
                        f"the cameras of this call have {D.shape[1]} tokens but {role} has "
                        f"{x.shape[2]}"
                    )
            # no state: identity cameras, D = I
            if D is not None:
                seg = _apply_chunks(seg, D.transpose(-1, -2) if role == "o" else D)
            parts.append(seg)
            start += self.so3_dim
        if self.t2_dim:
            seg = x[..., start : start + self.t2_dim].to(cd)
            p = self.coordinates(pos)
            # q: T(p)^-T = T(-p)^T, k and v: T(p), o: T(p)^-1 = T(-p)
            if role == "q":
                T = t2_matrices(-p).transpose(-1, -2)
            else:
                T = t2_matrices(-p if role == "o" else p)
            parts.append(_apply_chunks(seg, T))
            start += self.t2_dim
        parts.append(out[..., start:].to(cd))
        return torch.cat(parts, -1).to(x.dtype)


def _block_diagonal(blocks: list[Tensor]) -> Tensor:
    """Batched block-diagonal matrix of ``blocks (..., n_b, n_b)``: ``(..., sum n_b, sum
    n_b)``."""
    n = sum(b.shape[-1] for b in blocks)
    out = blocks[0].new_zeros(*blocks[0].shape[:-2], n, n)
    start = 0
    for b in blocks:
        e = start + b.shape[-1]
        out[..., start:e, start:e] = b
        start = e
    return out
