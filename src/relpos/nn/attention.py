"""``MultiHeadAttention``: projections + any relpos encoding + a KV cache for decoding."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..attention import attention, plan
from ..attention.call import MaskMod
from ..attention.linear.feature_maps import FeatureMap, create_feature_map
from ..attention.linear.state import LinearState
from ..encodings.base import Encoding
from ..encodings.contextual.tra import LAYER_INPUT  # filled by this layer (TRA's gate)
from ..encodings.registry import create
from ..validation import check_int
from .cache import LayerCache
from .qkv_convolution import CausalDepthwiseConv

#: ``MultiHeadAttention(qk_norm=...)``: None (off) or ``"rms"``
QK_NORMS = (None, "rms")
#: epsilon of ``qk_norm="rms"`` (the TRA notebook's ``RMSNorm``)
QK_NORM_EPS = 1e-6


def rms_normalize(x: Tensor, eps: float = QK_NORM_EPS) -> Tensor:
    """``x / sqrt(mean(x^2, last axis) + eps)``, computed in float32 (float64 stays float64)
    and returned in ``x``'s dtype; no affine weight."""
    y = x.float() if x.dtype != torch.float64 else x
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def build_encoding(
    encoding: str | Encoding | None, num_heads: int, head_dim: int, options: dict[str, Any]
) -> Encoding | None:
    """An ``Encoding`` from a registry name (with ``options``), an instance, or None."""
    if encoding is None or isinstance(encoding, Encoding):
        if options:
            raise ValueError("encoding_options are only used with an encoding name")
        return encoding
    return create(encoding, num_heads=num_heads, head_dim=head_dim, **options)


class MultiHeadAttention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention with a relative encoding.

    Args:
        dim: model width; ``head_dim = dim // num_heads``.
        num_heads: query heads ``H``.
        encoding: registry name, ``relpos.Encoding`` (may be shared across layers), or None.
        num_kv_heads: key/value heads (divides ``num_heads``); default ``num_heads``.
        encoding_options: keyword options for ``relpos.create`` when ``encoding`` is a name.
        backend: passed to ``relpos.attention``.
        feature_map: kernelized (linear) attention instead of softmax: ``"elu1"``,
            ``"relu"``, ``"prf"`` or a ``relpos.attention.linear.feature_maps.FeatureMap`` for
            ``head_dim``
            (``relpos.attention(..., feature_map=...)``, backend ``linear``). A name builds
            one map owned by the layer (its random projection is in the ``state_dict``).
        feature_map_options: constructor options of a feature map given by name
            (``num_features``, ``seed``, ... for ``"prf"``).
        qkv_conv: kernel size ``K`` of causal depth-wise convolutions over the tokens of the
            projected q, k and v, one kernel per role shared by the heads (RCMHA, Sugiharto
            et al. 2023: ``qkv_conv=3`` with ``encoding="rcmha"``; ``qkv_convolution.py``);
            None: no convolution. A ``LayerCache`` keeps the last ``K - 1`` projections.
        qk_norm: ``"rms"`` normalises each head's query and key to unit RMS before the
            encoding, ``x / sqrt(mean_c x_c^2 + 1e-6)`` in float32, no affine weight: TRA's
            layer (Opper et al. 2025, the authors' notebook ``TRA_FFL.ipynb``: "qk norm but
            no scale"); None (default): off. It has no parameters, so the state dict is the
            same either way.

    ``forward(x (B, L, dim), pos=None, cache=None, causal=True, inputs=None) -> (B, L, dim)``.
    With a ``LayerCache`` the new tokens get positions ``cache.length ..`` (unless ``pos`` is
    given; on every axis for m-D encodings), keys/values are appended, and the queries attend
    to the whole cache. With a ``feature_map`` the cache may also be a
    ``relpos.attention.linear.state.LinearState`` (the recurrent sums: O(m Dv) per decoded token);
    ``new_cache()`` gives the one that applies (``LinearState`` when the call has a
    recurrent form: no bias or a geometric one, keys rotated the same in every call).
    ``inputs`` are the encoding's per-call tensors (graphs, boxes); an
    encoding that reads ``inputs["layer_input"]`` (TRA's forget gate) gets this layer's ``x``;
    ``mask_mod`` a structured mask over the whole sequence (``relpos.attention``: queries in
    key coordinates, so the same mask_mod serves prefill and cached decoding); ``mask`` a
    bool (True = attend) or additive float tensor broadcastable to ``(B, H, L, Lk)``
    (``relpos.attention``'s ``mask``; DK-VLM's point term in ``DualKernelAttention``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding | None = "rope",
        *,
        num_kv_heads: int | None = None,
        encoding_options: dict[str, Any] | None = None,
        backend: str = "auto",
        bias: bool = False,
        feature_map: str | FeatureMap | None = None,
        feature_map_options: dict[str, Any] | None = None,
        qkv_conv: int | None = None,
        qk_norm: str | None = None,
    ) -> None:
        super().__init__()
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be None or 'rms', got {qk_norm!r}")
        self.qk_norm = qk_norm
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({num_kv_heads}) must be a positive divisor of num_heads "
                f"({num_heads})"
            )
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim = dim // num_heads
        self.backend = backend
        self.encoding = build_encoding(encoding, num_heads, self.head_dim, encoding_options or {})
        self.feature_map: FeatureMap | None = None
        if feature_map is not None:
            self.feature_map = create_feature_map(
                feature_map, self.head_dim, **(feature_map_options or {})
            )
        elif feature_map_options:
            raise ValueError("feature_map_options are only used with a feature_map name")
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.kv_proj = nn.Linear(dim, 2 * num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.qkv_conv = None
        if qkv_conv is not None:
            qkv_conv = check_int(qkv_conv, "qkv_conv")
            self.qkv_conv = nn.ModuleList(
                CausalDepthwiseConv(self.head_dim, qkv_conv) for _ in range(3)
            )

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, heads, self.head_dim).transpose(1, 2)

    def new_cache(self) -> LayerCache | LinearState:
        """An empty cache for this layer: a ``LinearState`` when kernelized attention has a
        recurrent form for the encoding (``relpos.attention.plan`` gives ``linear-scan`` or
        ``linear-decay`` and the keys' rotation does not change from call to call), else a
        ``LayerCache`` (softmax attention, or a kernelized call that recomputes over all
        cached keys)."""
        if self.feature_map is None or self.qkv_conv is not None:
            return LayerCache()  # (the q/k/v convolution state lives in a LayerCache)
        enc = self.encoding
        if enc is not None and enc.has_rotary and not enc.cache_rotated_keys:
            return LayerCache()
        probe = torch.zeros(1, self.num_heads, 2, self.head_dim)
        kv = probe[:, : self.num_kv_heads]
        try:
            _, path = plan(probe, kv, kv, enc, causal=True, feature_map=self.feature_map)
        except ValueError:  # needs per-call inputs: decided on the first call instead
            return LayerCache()
        return LinearState() if path in ("linear-scan", "linear-decay") else LayerCache()

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        cache: LayerCache | LinearState | None = None,
        causal: bool = True,
        inputs: dict[str, Tensor] | None = None,
        mask_mod: MaskMod | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, L, {self.dim}), got {tuple(x.shape)}")
        B, L, _ = x.shape
        q, k, v = self.project(x, cache)
        enc = self.encoding
        if enc is not None and LAYER_INPUT in {**enc.required_inputs, **enc.optional_inputs}:
            inputs = {**(inputs or {}), LAYER_INPUT: x}  # this layer's own input (TRA's gate)
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
            mask_mod=mask_mod,
            mask=mask,
            cache=cache,
            feature_map=self.feature_map,
        )
        return self.out_proj(out.transpose(1, 2).reshape(B, L, self.dim))

    def project(
        self, x: Tensor, cache: LayerCache | LinearState | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """What the layer hands the encoding for ``x (B, L, dim)``: ``q (B, H, L, D)``,
        ``k, v (B, Hkv, L, D)`` after the projections, the ``qkv_conv`` convolutions
        (continued from and stored in ``cache``) and ``qk_norm``; not yet rotated."""
        q = self._heads(self.q_proj(x), self.num_heads)
        k, v = self.kv_proj(x).chunk(2, dim=-1)
        k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if self.qkv_conv is not None:
            if isinstance(cache, LinearState):
                raise ValueError(
                    "cache: a layer with qkv_conv keeps its convolution state in a LayerCache; "
                    "use layer.new_cache() (a LinearState holds no convolution state)"
                )
            q, k, v = self._convolve(q, k, v, cache)
        if self.qk_norm == "rms":
            q, k = rms_normalize(q), rms_normalize(k)
        return q, k, v

    def _convolve(
        self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The causal convolutions of q, k, v, continued from (and stored in) the cache."""
        assert self.qkv_conv is not None
        tails = cache.conv_tail if cache is not None and cache.length > 0 else None
        if cache is not None and cache.length > 0 and tails is None:
            raise ValueError(
                "cache: the layer convolves q, k and v (qkv_conv) but the cache was filled "
                "without their convolution state; decode with a cache this layer filled"
            )
        out = [
            conv(x, None if tails is None else tails[n])
            for n, (conv, x) in enumerate(zip(self.qkv_conv, (q, k, v), strict=True))
        ]
        if cache is not None:
            cache.conv_tail = (out[0][1], out[1][1], out[2][1])
        return out[0][0], out[1][0], out[2][0]
