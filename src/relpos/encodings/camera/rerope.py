"""ReRoPE: camera projection written into the low-frequency temporal RoPE bands of a video
model (Li et al. 2026, "ReRoPE: Repurposing RoPE for Relative Camera Control", arXiv
2602.08068; only the abstract and project page were available, no code or formula: a
reconstruction).

What is assumed (check the paper before relying on it): the video
model's 3-D RoPE (Wan 2.1 style: axes (t, h, w), contiguous sections of interleaved pairs,
each axis its own spectrum ``theta_j = base^(-j / n_a)``, pairs split ``split_pairs(D/2,
3)``) is kept, except for the lowest-frequency *temporal* pairs, which barely turn over a clip:
the temporal pairs with ``theta_j (frames - 1) < epsilon`` (an even number of them, the last
ones of the temporal section: whole 4-channel chunks) carry PRoPE's camera block
``Proj4(P_i)``, ``P = lift(K~) w2c`` (``relpos.encodings.camera.prope``) instead of their rotation.
q gets ``P^T``, k ``P^-1`` (and, with ``rotate_values=True``, v ``P^-1`` and the output ``P``,
values also turning with the RoPE pairs); queries and keys turn by ``+theta p`` (HF sign). With one
camera for every frame the band is the identity: the base model with those pairs set to identity (a
check of the reconstruction). Invariant to a rigid change of world coordinates (the RoPE pairs read
patch positions only).

Shapes: ``x (B, H, L, D)``, ``pos (B|1, L, 3)`` = (t, h, w); inputs as in ``frames``
(``k_viewmats``, optional ``k_Ks`` with ``image_size``, ``q_viewmats``, ``q_Ks``).
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from torch import Tensor

from ...functional import apply_rotary
from ...validation import check_int
from ..options import Float, Int, Refused
from ..registry import register
from ..rotary.nd import split_pairs
from .frames import IMAGE_SIZE, ROTATE_VALUES, FrameState, apply_proj4
from .prope import PRoPE

__all__ = ["ReRoPE"]


@register("rerope")
class ReRoPE(PRoPE):
    """ReRoPE (see the module docstring; a reconstruction). Options: ``base`` (10000, the video
    model's RoPE base), ``frames`` (16: the clip length that selects the band), ``epsilon``
    (0.5 rad: a temporal pair whose angle over the clip stays below it carries the camera),
    ``image_size`` (to normalise intrinsics), ``rotate_values`` (False)."""

    paper = "ReRoPE 2025 (camera projection in low-frequency temporal RoPE bands; assumed form)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        base: Annotated[float, Float(above=1.0, doc="the video model's RoPE base")] = 10000.0,
        frames: Annotated[
            int, Int(minimum=2, doc="clip length used to select the low-frequency band")
        ] = 16,
        epsilon: Annotated[
            float, Float(above=0.0, doc="largest angle (rad) over the clip of a band pair")
        ] = 0.5,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        rope_fraction: Annotated[
            float, Refused("the band is chosen by frames and epsilon", default=0.5)
        ] = 0.5,
        principal_point: Annotated[
            str, Refused("PRoPE's normalised intrinsics", default="normalized")
        ] = "normalized",
        rotate_values: Annotated[bool, ROTATE_VALUES] = False,
    ) -> None:
        head_dim = check_int(head_dim, "head_dim")
        if head_dim % 8:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'rerope': head_dim % 8 == 0 (3-D "
                "RoPE pairs and 4-channel camera chunks)"
            )
        super().__init__(
            num_heads,
            head_dim,
            image_size=image_size,
            rope_fraction=0.5,
            principal_point="normalized",
            rotate_values=rotate_values,
        )
        self.base, self.frames, self.epsilon = base, frames, epsilon
        self.sections = split_pairs(head_dim // 2, 3)
        n_t = self.sections[0]
        theta_t = base ** (-torch.arange(n_t, dtype=torch.float64) / n_t)
        slow = int((theta_t * (frames - 1) < epsilon).sum())
        self.band_pairs = slow - slow % 2
        if self.band_pairs == 0:
            raise ValueError(
                f"encoding 'rerope' found no temporal pair with theta * (frames - 1) < "
                f"epsilon={epsilon} at head_dim={head_dim}, base={base}, frames={frames}: raise "
                "epsilon or base"
            )
        freqs = [base ** (-torch.arange(n, dtype=torch.float64) / n) for n in self.sections]
        self.register_buffer("theta", torch.cat(freqs), persistent=False)
        self.register_buffer(
            "axis",
            torch.repeat_interleave(torch.arange(3), torch.tensor(self.sections)),
            persistent=False,
        )
        self.dims = 3
        # channels [c0, c0 + 2 * band) carry the camera; every other pair is RoPE
        self.band_start = 2 * (n_t - self.band_pairs)
        self.proj_channels = 2 * self.band_pairs
        self.rope_channels = head_dim - self.proj_channels

    @classmethod
    def example_options(cls) -> dict:
        return {"image_size": (32.0, 32.0), "base": 10000.0, "epsilon": 1.0}

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        p = pos.to(torch.float64)
        return [p[..., self.axis] * self.theta.to(pos.device)]

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        if role not in ("q", "k", "v", "o") or (role in ("v", "o") and not self.rotate_values):
            return x
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"encoding 'rerope' re-frames {role} with head_dim {self.head_dim}, got "
                f"{x.shape[-1]} channels"
            )
        if x.shape[2] == 0:
            return x
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        sign = 1.0 if role in ("q", "k", "v") else -1.0
        a = torch.remainder(sign * self.rope_sections(pos)[0], 2 * torch.pi)
        cos, sin = a.cos().to(cd)[:, None], a.sin().to(cd)[:, None]
        out = apply_rotary(x.to(cd), cos, sin, "interleaved")
        s, e = self.band_start, self.band_start + self.proj_channels
        band = x[..., s:e].to(cd)
        if state is not None:
            if not isinstance(state, FrameState):
                raise TypeError(f"state must be a FrameState, got {type(state).__name__}")
            M = state.q_blocks.transpose(-1, -2) if role == "q" else None
            M = state.q_blocks if role == "o" else (state.k_inverse if M is None else M)
            if M.shape[1] != x.shape[2]:
                raise ValueError(
                    f"the cameras of this call have {M.shape[1]} tokens but {role} has {x.shape[2]}"
                )
            band = apply_proj4(band, M.to(cd))
        return torch.cat((out[..., :s], band, out[..., e:]), -1).to(x.dtype)
