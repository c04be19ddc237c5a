"""Flex4DHuman's five-axis positional encoding (Cheng et al. 2026, "Flex4DHuman: Flexible
Multi-view Video Diffusion for 4D Human Reconstruction", arXiv 2606.13655; only the abstract and
project page were available, no code or formula is published: a reconstruction).

The abstract: on Wan 2.1 (1.3B), a "five-axis positional encoding that extends spatio-temporal
RoPE with view indices and continuous SE(3) relative camera geometry", conditioning only on
relative camera poses. What is assumed here (relpos's reconstruction; check the paper before
relying on the split): a per-token frame (``frames.CameraFrames``) with channel sections

    [ Proj4(P_i) | RoPE(t) | RoPE(h) | RoPE(w) | RoPE(view) | identity ]

* **camera** (``camera_dim`` channels, a multiple of 4; default ``4 * (D // 16)``, a quarter
  of the head): PRoPE's block ``P = lift(K~) w2c`` (``relpos.encodings.camera.prope``;
  without intrinsics ``P = w2c``, the GTA formula): q gets ``P^T``, k ``P^-1``, so
  ``logit_ij`` reads the relative camera ``P_i P_j^-1`` (continuous SE(3), invariant to a
  rigid change of world coordinates);
* **(t, h, w)**: Wan 2.1's 3-D RoPE over the remaining pairs: contiguous sections,
  ``split_pairs`` (the extra pairs to time, as Wan splits 64 pairs into 22/21/21), each axis
  its own spectrum ``theta_j = base^(-j / n_a)`` (``rotary.nd.section_frequencies``), base
  10000, interleaved pairs, q and k turned by ``+theta p`` (Wan's complex product);
* **view** (``view_pairs`` pairs; default ``max(1, D // 32)``): the same RoPE over the view
  index, its own spectrum.

With one camera and one view index for every token the camera blocks cancel (``P_i P_j^-1 = I``) and
the view rotations are equal, so the logits are Wan's 3-D RoPE on its channels plus plain dot
products on the others (a check of the reconstruction). Values are not re-framed by default
(``rotate_values=False``: Wan's attention with RoPE on q and k only); ``True`` also re-frames values
and outputs (PRoPE's ``v' = T^-1 v``, ``o' = T o``).

Shapes: ``x (B, H, L, D)`` with even ``D``; ``pos (B|1, L, 4)`` = (t, h, w, view) (float
positions are accepted); inputs ``k_viewmats (B, Lk, 4, 4)`` world-to-camera, optional
``k_Ks`` (with ``image_size``), ``q_viewmats``, ``q_Ks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
from torch import Tensor

from ...validation import check_int
from ..options import Float, Int, IntSequence, Refused
from ..registry import register
from ..rotary.nd import section_frequencies, split_pairs
from .frames import IMAGE_SIZE, ROTATE_VALUES, CameraFrames
from .prope import PRoPE

__all__ = ["Flex4DHuman"]


@register("flex4dhuman")
class Flex4DHuman(PRoPE):
    """Flex4DHuman (see the module docstring; a reconstruction). Options: ``camera_dim``
    (default ``4 * (head_dim // 16)``), ``view_pairs`` (default ``max(1, head_dim // 32)``),
    ``sections`` ((t, h, w) pairs; default Wan's split of the rest), ``base`` (10000),
    ``image_size`` (to normalise intrinsics), ``rotate_values`` (False)."""

    paper = "Flex4DHuman 2025 (5-axis RoPE: t, h, w, view index + relative camera; assumed form)"
    rope_layout = "interleaved"
    rope_sign = 1.0
    rope_multiple = 2

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        camera_dim: Annotated[
            int | None, Int(minimum=0, optional=True, doc="channels of the camera section (x4)")
        ] = None,
        view_pairs: Annotated[
            int | None, Int(minimum=0, optional=True, doc="rotary pairs of the view index")
        ] = None,
        sections: Annotated[
            Sequence[int] | None,
            IntSequence(length=3, minimum=0, optional=True, doc="(t, h, w) pairs"),
        ] = None,
        base: Annotated[
            float, Float(above=1.0, doc="RoPE base of the (t, h, w, view) sections (Wan 2.1)")
        ] = 10000.0,
        image_size: Annotated[tuple[float, float] | None, IMAGE_SIZE] = None,
        rope_fraction: Annotated[
            float, Refused("the sections are set by camera_dim and view_pairs", 0.5)
        ] = 0.5,
        principal_point: Annotated[
            str, Refused("PRoPE's normalised intrinsics", default="normalized")
        ] = "normalized",
        rotate_values: Annotated[bool, ROTATE_VALUES] = False,
    ) -> None:
        head_dim = check_int(head_dim, "head_dim")
        if head_dim % 2:
            raise ValueError(
                f"head_dim={head_dim} cannot take encoding 'flex4dhuman': an even head_dim "
                "(rotary pairs of Wan's 3-D RoPE)"
            )
        # PRoPE's camera blocks and checks; the channel layout is this encoding's own
        CameraFrames.__init__(self, num_heads, head_dim, rotate_values=rotate_values)
        self.image_size, self.base, self.principal_point = image_size, base, "normalized"
        camera = 4 * (head_dim // 16) if camera_dim is None else camera_dim
        view = max(1, head_dim // 32) if view_pairs is None else view_pairs
        if sections is None:
            free = (head_dim - camera) // 2 - view
            thw = split_pairs(free, 3) if free >= 3 else [-1, 0, 0]
        else:
            thw = list(sections)
        pairs = sum(thw) + view
        self._set_channels(
            camera,
            2 * pairs if min(thw) >= 0 else -1,
            "camera_dim must be a multiple of 4 and camera_dim + 2 * (t + h + w + view pairs) "
            "<= head_dim, with at least one pair per (t, h, w) axis by default",
        )
        self.camera_dim, self.view_pairs, self.sections = camera, view, thw
        self.dims = 4
        omega = section_frequencies([*thw, view], base, "per_axis", head_dim)
        # (pairs, 4) float64, not a buffer: ``module.float()`` must never round it
        self.omega = omega

    @classmethod
    def example_options(cls) -> dict:
        return {"image_size": (32.0, 32.0)}

    def rope_sections(self, pos: Tensor) -> list[Tensor]:
        omega = self.omega.to(device=pos.device)
        return [pos.to(torch.float64) @ omega.transpose(-1, -2)]
