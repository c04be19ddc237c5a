"""DK-VLM's dual-kernel attention (only the abstract was available, no code or formula is
published, and the paper's title and arXiv id could not be confirmed: a reconstruction).

The abstract: a *semantic kernel* keeps the pretrained model's native attention and
positional encoding; a separate *geometric kernel* uses estimated 3-D points and camera
poses to modulate attention "through point displacements and relative view
transformations"; a learned gate fuses their outputs. What is assumed here (relpos's
reconstruction): two ``relpos.attention`` calls, each a ``MultiHeadAttention`` with its own
projections, and an element-wise gate

    o = g * o_sem + (1 - g) * o_geo,    g = sigmoid(W_g x + b_g)   (per token and channel)

* semantic kernel: ``MultiHeadAttention(dim, num_heads, semantic)`` (default ``"rope"``) on
  the token positions ``pos``;
* geometric kernel (``geometric``):

  - ``"distance"``: the bias ``-alpha_h ||(X_j - X_i) - Delta_h||^2`` on the tokens' 3-D
    points ``X`` (``geo_pos (B, L, 3)``): relpos ``gaussian-shift`` with ``dims=3``, its
    displacements ``Delta_h`` started at 0 (so ``-||X_i - X_j||^2 / tau`` with ``alpha = 1 /
    tau``, ``tau = temperature``) and learned with ``alpha_h``;
  - ``"prope"`` / ``"gta"`` (or any camera encoding name, or an ``Encoding``): relative view
    transformations through per-token camera frames; ``geo_pos`` are the patch coordinates
    the encoding reads and ``inputs`` its cameras (``k_viewmats``, ``k_Ks``, ...);
  - both at once (``displacements=True`` with a camera kernel): the abstract's "point
    displacements and relative view transformations" in one geometric kernel. Its logits
    are the camera encoding's plus the distance kernel's bias on ``points (B, L, 3)``,

        logit_ij = q_i^T T_i T_j^-1 k_j / sqrt(d) - alpha_h ||(X_j - X_i) - Delta_h||^2,

    values re-framed as the camera encoding does. The bias is the ``gaussian-shift``
    encoding's own (``point_bias``, started like the distance kernel's), materialised as an
    additive ``(B, H, L, L)`` mask; no KV cache (the mask would need every cached token's
    point);

* the gate's weight starts at 0 and its bias at ``logit(gate_init)`` (``gate_init=0.5``:
  both kernels equally; close to 1 keeps a pretrained model's semantic path). ``g = 1``
  gives the semantic kernel alone, ``g = 0`` the geometric one.

``forward(x (B, L, dim), pos=None, geo_pos=None, inputs=None, causal=True, cache=None,
points=None) -> (B, L, dim)``; ``cache``: a pair of ``LayerCache`` (semantic, geometric) for
decoding, with the new tokens' geometry in ``geo_pos`` / ``inputs``; ``points``: the 3-D
points of the ``displacements`` term.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.base import BiasContext, Encoding
from ..encodings.registry import create
from ..validation import check_float, check_int
from .attention import MultiHeadAttention
from .cache import LayerCache

__all__ = ["DualKernelAttention"]


class DualKernelAttention(nn.Module):
    """Semantic + geometric attention fused by a learned gate (module docstring).

    Args:
        dim: model width.
        num_heads: heads of the semantic kernel (``head_dim = dim // num_heads``).
        semantic: the semantic kernel's encoding (name or ``Encoding``; default "rope").
        geometric: "distance", a camera encoding name ("prope", "gta", ...) or an
            ``Encoding`` for the geometric kernel.
        geometric_heads: heads of the geometric kernel (default ``num_heads``).
        semantic_options / geometric_options: ``relpos.create`` options for names.
        temperature: ``tau`` of the distance kernel (``alpha = 1 / tau`` at init).
        gate_init: the gate's initial value ``g`` in (0, 1).
        backend: passed to ``relpos.attention`` (both kernels).
        displacements: with a camera kernel, add the point-displacement bias on ``points``
            to its logits (module docstring); ``temperature`` starts its ``alpha``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        semantic: str | Encoding | None = "rope",
        geometric: str | Encoding = "distance",
        *,
        geometric_heads: int | None = None,
        semantic_options: dict[str, Any] | None = None,
        geometric_options: dict[str, Any] | None = None,
        temperature: float = 1.0,
        gate_init: float = 0.5,
        backend: str = "auto",
        displacements: bool = False,
    ) -> None:
        super().__init__()
        dim = check_int(dim, "dim")
        num_heads = check_int(num_heads, "num_heads")
        gh = num_heads if geometric_heads is None else check_int(geometric_heads, "geometric_heads")
        tau = check_float(temperature, "temperature", above=0.0)
        g0 = check_float(gate_init, "gate_init", above=0.0, below=1.0)
        if dim % gh:
            raise ValueError(f"dim ({dim}) must be divisible by geometric_heads ({gh})")
        self.dim = dim
        self.distance = geometric == "distance"
        if not isinstance(displacements, bool):
            raise TypeError(f"displacements must be a bool, got {type(displacements).__name__}")
        if displacements and self.distance:
            raise ValueError(
                "displacements=True adds the point kernel to a camera kernel; geometric="
                "'distance' is the point kernel itself (pass a camera encoding, e.g. 'prope')"
            )
        self.semantic = MultiHeadAttention(
            dim,
            num_heads,
            semantic,
            encoding_options=semantic_options,
            backend=backend,
        )
        if geometric == "distance":
            geometric = _point_kernel(gh, dim // gh, tau, geometric_options)
            geometric_options = None
        elif not isinstance(geometric, (str, Encoding)):
            raise TypeError(
                "geometric must be 'distance', an encoding name or a relpos.Encoding, got "
                f"{type(geometric).__name__}"
            )
        self.geometric = MultiHeadAttention(
            dim, gh, geometric, encoding_options=geometric_options, backend=backend
        )
        self.point_bias = _point_kernel(gh, dim // gh, tau, None) if displacements else None
        self.gate = nn.Linear(dim, dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, math.log(g0 / (1 - g0)))

    def displacement_bias(self, points: Tensor) -> Tensor:
        """The point term ``-alpha_h ||(X_j - X_i) - Delta_h||^2`` as ``(B, H, L, L)``, from
        ``point_bias`` (the ``gaussian-shift`` encoding's ``bias``); ``points (B, L, 3)``."""
        enc = self.point_bias
        if enc is None:
            raise RuntimeError("this DualKernelAttention has no displacements term")
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, L, 3), got {tuple(points.shape)}")
        B, L, _ = points.shape
        dev = points.device
        b = torch.arange(B, device=dev)[:, None, None, None]
        h = torch.arange(enc.num_heads, device=dev)[None, :, None, None]
        i = torch.arange(L, device=dev)[None, None, :, None]
        j = torch.arange(L, device=dev)[None, None, None, :]
        return enc.bias(BiasContext(q_pos=points, k_pos=points), b, h, i, j)

    def gate_values(self, x: Tensor) -> Tensor:
        """``g = sigmoid(W_g x + b_g)``, ``(B, L, dim)``."""
        return torch.sigmoid(self.gate(x))

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        geo_pos: Tensor | None = None,
        inputs: dict[str, Tensor] | None = None,
        causal: bool = True,
        cache: tuple[LayerCache, LayerCache] | None = None,
        points: Tensor | None = None,
    ) -> Tensor:
        if cache is not None and (
            not isinstance(cache, (tuple, list))
            or len(cache) != 2
            or not all(isinstance(c, LayerCache) for c in cache)
        ):
            raise TypeError("cache must be a pair (semantic, geometric) of relpos.nn.LayerCache")
        if self.distance and geo_pos is None:
            raise ValueError(
                "geo_pos is needed: the distance kernel reads each token's 3-D point (B, L, 3)"
            )
        mask = None
        if self.point_bias is not None:
            if points is None:
                raise ValueError(
                    "points is needed: the displacements term reads each token's 3-D point "
                    "(B, L, 3)"
                )
            if cache is not None:
                raise ValueError(
                    "cache: the displacements term needs every cached token's 3-D point; "
                    "call without cache (or use displacements=False)"
                )
            mask = self.displacement_bias(points).to(x.dtype)
        elif points is not None:
            raise ValueError("points are read only with displacements=True")
        sem_cache, geo_cache = cache if cache is not None else (None, None)
        o_sem = self.semantic(x, pos, cache=sem_cache, causal=causal)
        o_geo = self.geometric(x, geo_pos, cache=geo_cache, causal=causal, inputs=inputs, mask=mask)
        g = self.gate_values(x)
        return g * o_sem + (1 - g) * o_geo


def _point_kernel(
    num_heads: int, head_dim: int, tau: float, options: dict[str, Any] | None
) -> Encoding:
    """The distance kernel's ``gaussian-shift`` encoding on 3-D points: ``alpha = 1 / tau``,
    displacements ``Delta_h`` started at 0."""
    opts = {"dims": 3, "alpha": 1.0 / tau, **(options or {})}
    enc = create("gaussian-shift", num_heads=num_heads, head_dim=head_dim, **opts)
    enc.set_shifts(torch.zeros_like(enc.shift))  # the displacements start at 0
    return enc
