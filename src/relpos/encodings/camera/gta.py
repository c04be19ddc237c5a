"""GTA, Geometric Transform Attention (Miyato, Jaeger, Welling, Geiger, ICLR 2024; spec camera
§2.1, Authority A: autonomousvision/gta, source/utils/gta.py, layers.py ``trans_coeff``).

Per-token frame (``frames.CameraFrames``) with channel sections ``se3 | so2 | identity``:

* **se3** (``se3_dim`` channels, a multiple of 4): ``Proj4(T_i)`` with
  ``T = D_s w2c D_s^-1``, ``D_s = diag(1, 1, 1, 1/s)``: the world-to-camera matrix with its
  translation scaled by ``s = trans_coeff`` (init 0.01, learned per layer by default) and
  ``T^-1 = D_s c2w D_s^-1`` exactly (the scale applied to both; spec pitfall). q gets
  ``T^T``, k and v ``T^-1``, the output ``T``.
* **so2** (``4 * so2_freqs`` channels): coordinates ``p = (row / H_p, col / W_p)``,
  frequencies ``omega_k = 2 pi max_freq 2^(k - n)``, ``k = 1..n``; 2x2 rotations
  ``[[cos, -sin], [sin, cos]]`` on interleaved pairs, frequency-major and axis-minor (pairs
  ``(omega_1, row), (omega_1, col), (omega_2, row), ...``); q, k, v turn by ``+omega p``
  and the output back (the HF sign: logits depend on ``p_j - p_i``).
* remaining channels pass through (GTA's "triv" section; GTA puts it first, here it is
  last: the same model up to a fixed permutation of the head channels).

GTA's SO(3) (Wigner-D) and T(2) sections are not implemented (the released CLEVR-TR and MSN
configurations use se3 + so2). GTA canonicalises the cameras to the first input view
(``relpos.cameras.anchor``): an exact gauge here.

Shapes: ``x (B, H, L, D)``; ``pos (B|1, L, 2)`` = (row, col) patch indices (or, with
``grid=None``, the normalised coordinates themselves); ``inputs["k_viewmats"] (B, Lk, 4,
4)`` world-to-camera, optional ``q_viewmats``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...registry import register
from ..options import Bool, Float, Int, IntSequence
from .frames import CameraFrames

__all__ = ["GTA", "so2_frequencies"]


def so2_frequencies(n: int, max_freq: float = 1.0) -> Tensor:
    """GTA's so2 frequencies ``2 pi max_freq 2^(k - n)``, ``k = 1..n`` (float64, ``(n,)``):
    at most ``max_freq`` turns over the image (spec R.2: n = 8 -> 0.049 .. 6.283)."""
    k = torch.arange(1, n + 1, dtype=torch.float64)
    return 2 * math.pi * max_freq * 2.0 ** (k - n)


@register("gta")
class GTA(CameraFrames):
    """GTA (see the module docstring). Options: ``se3_dim`` (default ``head_dim / 2``
    rounded down to a multiple of 4), ``so2_freqs`` (default: the rest of the head, ``(D -
    se3_dim) // 4``), ``grid=(H_p, W_p)`` (patch grid; None: positions are already
    normalised), ``max_freq`` (1), ``trans_coeff`` (0.01), ``learn_trans_coeff`` (True),
    ``rotate_values`` (True)."""

    paper = "Miyato et al. 2024 (GTA, Geometric Transform Attention)"
    reads_intrinsics = False
    rope_layout = "interleaved"
    rope_sign = 1.0
    options = {
        "se3_dim": Int(minimum=0, optional=True, doc="channels of the SE(3) section (x4)"),
        "so2_freqs": Int(minimum=0, optional=True, doc="frequencies per axis of the so2 section"),
        "grid": IntSequence(length=2, optional=True, doc="(H_p, W_p) patch grid"),
        "max_freq": Float(above=0.0, doc="largest so2 frequency, in turns per image"),
        "trans_coeff": Float(doc="initial translation scale s"),
        "learn_trans_coeff": Bool(doc="train s (an nn.Parameter per encoding)"),
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        se3_dim: int | None = None,
        so2_freqs: int | None = None,
        grid: tuple[int, int] | None = None,
        max_freq: float = 1.0,
        trans_coeff: float = 0.01,
        learn_trans_coeff: bool = True,
        rotate_values: bool = True,
    ) -> None:
        super().__init__(num_heads, head_dim, rotate_values=rotate_values)
        if se3_dim is None and so2_freqs is None and head_dim % 4:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'gta' with its default sections: "
                "head_dim % 4 == 0 (se3 and so2 come in 4-channel chunks); pass se3_dim and "
                "so2_freqs to keep identity channels"
            )
        se3 = (head_dim // 2) // 4 * 4 if se3_dim is None else se3_dim
        n = max(head_dim - se3, 0) // 4 if so2_freqs is None else so2_freqs
        self._set_channels(
            se3,
            4 * n,
            "se3_dim must be a multiple of 4 and se3_dim + 4 * so2_freqs <= head_dim",
        )
        self.se3_dim, self.so2_freqs, self.grid, self.max_freq = se3, n, grid, max_freq
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

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        if not self.so2_freqs:
            return []
        p = pos.to(torch.float64)
        if self.grid is not None:
            p = p / torch.tensor(self.grid, dtype=torch.float64, device=pos.device)
        omega = self.omega.to(device=pos.device, dtype=torch.float64)
        # frequency-major, axis-minor: (omega_1, row), (omega_1, col), (omega_2, row), ...
        return [(omega[:, None] * p[..., None, :]).flatten(-2)]
