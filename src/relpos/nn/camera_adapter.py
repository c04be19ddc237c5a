"""A zero-initialised camera attention branch beside a pretrained attention layer (UCPE's
``UcpeSelfAttention``, arXiv 2512.07237; StereoWorld's ``PropeSelfAttention``, arXiv
2603.17375; official code chengzhag/UCPE ``src/camera_control.py``, VAST-AI-Research/StereoWorld
``wan_transformer_3d.py``, read, not copied).

Both systems keep the pretrained attention (with its own RoPE) and add a parallel branch
with its own projections and a camera encoding, whose output projection starts at zero, so
the model is unchanged at step 0:

    y = host(x) + out_proj(Attn_camera(q, k, v)),   q, k, v = proj(x + E(orientation))

* UCPE: ``encoding="ucpe"`` (per-ray frames + PRoPE's RoPE channels), the branch at
  ``attn_dim = dim / attn_compress`` (8 in the release: Wan 1.3B 1536 -> 192 channels, 1
  head), plus the absolute orientation map embedded by ``OrientationEmbedding``
  (``orientation=True``; ``relpos.encodings.camera.ucpe.orientation_map`` gives its input);
* StereoWorld: ``encoding="stereoworld"`` (PRoPE's camera block on every channel) with
  RMSNorm on q and k (``qk_norm=True``).

``CameraAdapter`` is the branch; the caller adds it to its own attention output.
``forward(x (B, L, dim), pos=None, inputs=None, orientation=None, causal=False) -> (B, L,
dim)``: ``pos`` and ``inputs`` (cameras) as the encoding reads them, ``orientation (B, L,
3)`` when ``orientation=True``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..attention import attention
from ..encodings.base import Encoding
from ..encodings.camera.ucpe import OrientationEmbedding
from ..validation import check_int
from .attention import build_encoding

__all__ = ["CameraAdapter"]


class CameraAdapter(nn.Module):
    """The parallel camera branch (module docstring).

    Args:
        dim: model width.
        num_heads: heads of the branch (``head_dim = attn_dim // num_heads``).
        encoding: the camera encoding (name or ``Encoding``; default "ucpe").
        attn_dim: width of the branch's q, k, v (default ``dim``; UCPE: ``dim / 8``).
        orientation: add ``OrientationEmbedding(dim)`` of UCPE's orientation map to ``x``
            before the projections.
        qk_norm: RMSNorm on q and k per head (StereoWorld).
        encoding_options: ``relpos.create`` options when ``encoding`` is a name.
        backend: passed to ``relpos.attention``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding = "ucpe",
        *,
        attn_dim: int | None = None,
        orientation: bool = False,
        qk_norm: bool = False,
        encoding_options: dict[str, Any] | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.num_heads = check_int(num_heads, "num_heads")
        self.attn_dim = self.dim if attn_dim is None else check_int(attn_dim, "attn_dim")
        if self.attn_dim % self.num_heads:
            raise ValueError(
                f"attn_dim ({self.attn_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        self.head_dim = self.attn_dim // self.num_heads
        self.backend = backend
        self.encoding = build_encoding(
            encoding, self.num_heads, self.head_dim, encoding_options or {}
        )
        self.q_proj = nn.Linear(self.dim, self.attn_dim)
        self.k_proj = nn.Linear(self.dim, self.attn_dim)
        self.v_proj = nn.Linear(self.dim, self.attn_dim)
        self.out_proj = nn.Linear(self.attn_dim, self.dim)
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        self.orientation = OrientationEmbedding(self.dim) if orientation else None
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else None

    def _heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        inputs: dict[str, Tensor] | None = None,
        orientation: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, L, {self.dim}), got {shape}")
        if self.orientation is not None:
            if orientation is None:
                raise ValueError(
                    "orientation (B, L, 3) is needed: the adapter was created with "
                    "orientation=True (relpos.encodings.camera.ucpe.orientation_map)"
                )
            x = x + self.orientation(orientation).to(x.dtype)
        elif orientation is not None:
            raise ValueError("orientation was given but the adapter has no orientation embedding")
        q, k, v = (self._heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = attention(
            q,
            k,
            v,
            self.encoding,
            q_pos=pos,
            k_pos=pos,
            causal=causal,
            backend=self.backend,
            inputs=inputs,
        )
        B, L, _ = x.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, L, self.attn_dim))
