"""The ``linear`` backend: kernelized attention with relative positions (``relpos.efficient``).

``relpos.attention(q, k, v, encoding, feature_map="elu1" | "prf" | "relu" | FeatureMap)``
asks for the *kernelized* model (``exp(q . k * scale)`` replaced by ``phi(q) . phi(k)``), which
only this backend computes (``auto`` picks it when ``feature_map`` is given; the softmax
backends refuse ``feature_map``). It is not softmax attention: the conformance suite compares
it with its own O(L^2) reference (``relpos.efficient.kernelized_reference``), not with eager.

How the encoding drives it (``linear_path``):

* no bias (none, absolute, rotary): ``"linear-scan"`` (causal: a chunked prefix scan whose
  carry is the recurrent state) or ``"linear-sum"`` (bidirectional); a rotary encoding rotates
  the features after ``phi`` with its ``rotate_qk`` (RoFormer eq. 19, ``efficient.linear_rope``)
  and the denominator stays unrotated;
* a distance-only bias with a per-distance table for the call (ALiBi, T5, KERPLE, FIRE below
  its threshold, Sandwich: ``AttentionCall.distance_table``): ``"linear-fft"``, the Toeplitz RPE
  ``c = exp(b)`` on the kernel by FFT (Luo et al. 2021, ``efficient.kernelized``);
* refused by name: biases that are not a function of ``q_pos - k_pos`` for the call (or whose
  positions are not a batch-shared integer range: no Toeplitz structure), encodings that change
  the weights themselves (value terms, multiplied weights, piecewise logits), ``mask_mod`` and
  masks other than key padding (``(B|1, H|1, 1, Lk)``: padded keys get zero features).

Decoding: ``cache=relpos.efficient.LinearState()`` (causal, no bias) carries the sums
``(S, Z)``: O(m Dv) per token, equal to the full forward. A ``relpos.nn.LayerCache`` also
works (raw keys are cached and every call recomputes over all keys), also with a bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..efficient.feature_maps import FeatureMap
from ..efficient.kernelized import kernelized_attention
from ..efficient.linear_rope import rotate_features
from ..efficient.state import LinearState
from ..encodings.base import Encoding
from .call import AttentionCall, KeyValueCache, MaskMod, prepare_call
from .dense import empty_attention

__all__ = ["linear_attention", "linear_path", "prepare_linear_call"]


def linear_path(call: AttentionCall) -> str:
    """``"linear-fft"`` (a per-distance bias table), ``"linear-scan"`` (causal, no bias) or
    ``"linear-sum"`` (bidirectional, no bias); ``ValueError`` naming what cannot run."""
    enc = call.encoding
    if enc is not None and enc.needs_probabilities:
        raise ValueError(
            f"backend 'linear' cannot run encoding {enc.name!r}: it changes the attention "
            "weights beyond a score term (value terms, multiplied weights or piecewise "
            "logits), which kernelized attention has no form for; use softmax attention "
            "(feature_map=None) with backend 'eager' or 'chunked'"
        )
    if call.mask_mod is not None:
        raise ValueError(
            "backend 'linear' cannot take a mask_mod: kernelized attention sums keys once for "
            "all queries; only causal=True and key-padding masks (B|1, H|1, 1, Lk) apply"
        )
    if call.has_bias:
        assert enc is not None
        if call.distance_delta() is None:
            raise ValueError(
                f"backend 'linear' needs a Toeplitz bias: encoding {enc.name!r} is not a "
                "function of q_pos - k_pos for this call, or the positions are not one "
                "batch-shared integer range (the FFT runs over index distances); use softmax "
                "attention for it, or positions 0..L-1"
            )
        return "linear-fft"
    return "linear-scan" if call.causal else "linear-sum"


def _key_valid(call: AttentionCall) -> Tensor | None:
    """``(B|1, H|1, Lk)`` bool from a key-padding ``mask``; ``ValueError`` for other masks."""
    mask = call.mask
    if mask is None:
        return None
    rows = mask[..., :1, :]
    if mask.dtype == torch.bool:
        valid = rows
    else:
        if bool(((rows != 0) & (rows != float("-inf"))).any()):
            raise ValueError(
                "backend 'linear' takes additive masks of 0 / -inf only (a key-padding mask); "
                "other values re-weight pairs, which kernelized attention cannot express"
            )
        valid = rows == 0
    if mask.stride(-2) != 0 and not bool((mask == mask[..., :1, :]).all()):
        raise ValueError(
            "backend 'linear' takes key-padding masks only: mask must be the same for every "
            "query, broadcastable to (B, H, 1, Lk); kernelized attention sums keys once for "
            "all queries"
        )
    return valid[..., 0, :]


def prepare_linear_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding | None,
    *,
    q_pos: Tensor | None,
    k_pos: Tensor | None,
    causal: bool,
    mask: Tensor | None,
    scale: float | None,
    inputs: dict[str, Tensor] | None,
    mask_mod: MaskMod | None,
    cache: KeyValueCache | LinearState | None,
) -> AttentionCall:
    """``prepare_call`` for the linear backend: q, k, v unrotated (the features are rotated);
    with a ``LinearState`` the default positions continue the state's length."""
    if isinstance(cache, LinearState):
        if not causal:
            raise ValueError(
                "cache=LinearState is the recurrent state of causal linear attention: pass "
                "causal=True"
            )
        if isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() == 4 and k.dim() == 4:
            if q.shape[2] > k.shape[2]:
                raise ValueError(
                    f"with cache=LinearState every query must come with its key: Lq "
                    f"({q.shape[2]}) must be <= the number of new keys ({k.shape[2]})"
                )
            dims = encoding.dims if encoding is not None else 1
            end = cache.length + k.shape[2]

            def default(start: int) -> Tensor:
                pos = torch.arange(start, end, device=k.device)
                return pos[:, None].expand(-1, dims) if dims > 1 else pos

            k_pos = default(cache.length) if k_pos is None else k_pos
            q_pos = default(end - q.shape[2]) if q_pos is None else q_pos
    call = prepare_call(
        q,
        k,
        v,
        encoding,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        mask=mask,
        scale=scale,
        inputs=inputs,
        mask_mod=mask_mod,
        cache=None if isinstance(cache, LinearState) else cache,
        rotate=False,
    )
    path = linear_path(call)
    if isinstance(cache, LinearState) and encoding is not None and encoding.has_rotary:
        if not encoding.cache_rotated_keys:
            raise ValueError(
                f"cache=LinearState sums rotated key features, but encoding {encoding.name!r} "
                "rotates a key differently from call to call (cache_rotated_keys=False: its "
                "rotation reads the call's other positions or heads): decode with a KV cache "
                "(relpos.nn.LayerCache) instead"
            )
    if isinstance(cache, LinearState) and path != "linear-scan":
        assert encoding is not None
        raise ValueError(
            f"cache=LinearState holds sums without a bias; encoding {encoding.name!r} adds a "
            "Toeplitz bias, which has no recurrent state in general: decode with a KV cache "
            "(relpos.nn.LayerCache) instead"
        )
    return call


def linear_attention(
    call: AttentionCall, feature_map: FeatureMap, state: LinearState | None = None
) -> Tensor:
    """Run the kernelized model for a call prepared by ``prepare_linear_call``:
    ``(B, H, Lq, Dv)`` in the dtype of q (before the encoding's ``"o"`` rotation)."""
    path = linear_path(call)
    enc = call.encoding
    B, H, Lq = call.q.shape[:3]
    Lk = call.k.shape[2]
    k, v = call.expanded_kv()
    if enc is not None and enc.has_rotary:
        v = enc.rotate(v, call.k_pos, "v")
        if v.shape[1] != H:
            v = v.repeat_interleave(H // v.shape[1], dim=1)
    if Lq == 0 or Lk == 0:
        out = empty_attention(call)
        if state is not None:
            state.length += Lk
        return out
    phi_q, _ = feature_map(call.q, "q", call.scale)
    phi_k, log_offset = feature_map(k, "k", call.scale)
    sums = None
    if state is not None:
        state.check_shape(B, H, phi_k.shape[-1], v.shape[-1])
        factor, log_offset = state.absorb_offset(log_offset)
        if factor is not None:
            phi_k = phi_k * factor
        sums = state.sums()
        if sums is not None:
            sums = (sums[0].to(phi_k.dtype), sums[1].to(phi_k.dtype))
    rotated = None
    if enc is not None and enc.has_rotary:
        rotated = rotate_features(enc, phi_q, phi_k, call.q_pos, call.k_pos)
    table = call.distance_table(call.causal) if path == "linear-fft" else None
    out, final = kernelized_attention(
        phi_q,
        phi_k,
        v,
        table=table,
        causal=call.causal,
        rotated=rotated,
        key_valid=_key_valid(call),
        state=sums,
    )
    if state is not None:
        assert final is not None
        state.update(final, log_offset, Lk)
    return out.to(call.q.dtype)
