"""The ``linear`` backend: kernelized attention with relative positions (``relpos.efficient``).

``relpos.attention(q, k, v, encoding, feature_map="elu1" | "prf" | "relu" | FeatureMap)``
asks for the *kernelized* model (``exp(q . k * scale)`` replaced by ``phi(q) . phi(k)``), which
only this backend computes (``auto`` picks it when ``feature_map`` is given; the softmax
backends refuse ``feature_map``). It is not softmax attention: the conformance suite compares
it with its own O(L^2) reference (``relpos.attention.linear.kernelized.kernelized_reference``), not
with eager.

How the encoding drives it (``linear_path``):

* no bias (none, absolute, rotary): ``"linear-scan"`` (causal: a chunked prefix scan whose
  carry is the recurrent state) or ``"linear-sum"`` (bidirectional); a rotary encoding rotates
  the features after ``phi`` with its ``rotate_qk`` (RoFormer eq. 19, ``efficient.linear_rope``)
  and the denominator stays unrotated;
* a distance-only bias with a per-distance table for the call (ALiBi, T5, KERPLE, FIRE below
  its threshold, Sandwich: ``AttentionCall.distance_table``): the Toeplitz RPE ``c = exp(b)``
  on the kernel (Luo et al. 2021, ``efficient.kernelized``): ``"linear-decay"`` when the table
  decays geometrically on each side of distance 0 (ALiBi: a decayed scan, O(L), with a
  recurrent state), else ``"linear-fft"`` (by FFT, O(L log L));
* refused by name: biases that are not a function of ``q_pos - k_pos`` for the call (or whose
  positions are not a batch-shared integer range: no Toeplitz structure), encodings that change
  the weights themselves (value terms, multiplied weights, piecewise logits), ``mask_mod`` and
  masks other than key padding (``(B|1, H|1, 1, Lk)``: padded keys get zero features).

Decoding: ``cache=relpos.attention.linear.state.LinearState()`` (causal; no bias or a geometric one)
carries the sums ``(S, Z)``: O(m Dv) per token, equal to the full forward. A
``relpos.nn.LayerCache`` also works (raw keys are cached and every call recomputes over all
keys), with any bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...encodings.base import Encoding
from ..call import AttentionCall, KeyValueCache, MaskMod, prepare_call
from ..dense import empty_attention
from .feature_maps import FeatureMap
from .kernelized import geometric_halves, kernelized_attention
from .rotary_features import rotate_features
from .state import LinearState

__all__ = ["linear_attention", "linear_path", "prepare_linear_call"]


def linear_path(call: AttentionCall) -> str:
    """``"linear-decay"`` (a geometric per-distance table, ALiBi), ``"linear-fft"`` (any other
    per-distance table), ``"linear-scan"`` (causal, no bias) or ``"linear-sum"``
    (bidirectional, no bias); ``ValueError`` naming what cannot run."""
    enc = call.encoding
    if enc is not None and enc.needs_probabilities:
        raise ValueError(
            f"backend 'linear' cannot run encoding {enc.name!r}: it changes the attention "
            "weights beyond a score term (value terms, multiplied weights or piecewise "
            "logits), which kernelized attention has no form for; use softmax attention "
            "(feature_map=None) with backend 'eager' or 'chunked'"
        )
    if enc is not None and call.rotary_state is not None:
        raise ValueError(
            f"backend 'linear' cannot run encoding {enc.name!r}: its rotation reads per-call "
            "inputs (prepare_rotary: camera frames), which the feature rotation of kernelized "
            "attention does not take; use softmax attention (feature_map=None)"
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
        table = call.distance_table(call.causal)
        assert table is not None
        Lq, Lk = call.q.shape[2], call.k.shape[2]
        geometric = geometric_halves(table, Lq, Lk, call.causal) is not None
        return "linear-decay" if geometric else "linear-fft"
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
    if isinstance(cache, LinearState) and path not in ("linear-scan", "linear-decay"):
        assert encoding is not None
        raise ValueError(
            f"cache=LinearState holds sums without a bias or with a geometric decay (ALiBi); "
            f"encoding {encoding.name!r} adds a Toeplitz bias of another shape, which has no "
            "recurrent state: decode with a KV cache (relpos.nn.LayerCache) instead"
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
    table = call.distance_table(call.causal) if path in ("linear-fft", "linear-decay") else None
    log_decay = None
    if state is not None and table is not None:
        log_decay = _state_decay(call, state.length + Lk)
        state.check_decay(log_decay)
    out, final = kernelized_attention(
        phi_q,
        phi_k,
        v,
        table=table,
        causal=call.causal,
        rotated=rotated,
        key_valid=_key_valid(call),
        state=sums,
        log_decay=log_decay,
    )
    if state is not None:
        assert final is not None
        state.update(final, log_offset, Lk)
    return out.to(call.q.dtype)


def _state_decay(call: AttentionCall, total: int) -> Tensor:
    """The per-head ``log g`` of a geometric causal bias, read the same way on every decoding
    call (from the bias at index distances 0, 1 and ``total - 1``, the farthest key the state
    holds), so a state built over many calls keeps one decay; ``ValueError`` when these
    three points are not on one line (the bias is not geometric that far)."""
    enc = call.encoding
    delta = call.distance_delta()
    assert enc is not None and delta is not None
    far = max(total - 1, 2)
    d = torch.tensor([0, 1, far], device=call.q.device) + delta
    h = torch.arange(enc.num_heads, device=call.q.device)[:, None]
    b = enc.bias_at_distance(h, d[None]).double()  # (H, 3)
    step = b[:, 0] - b[:, 1]
    if bool((step < 0).any()) or not bool(
        torch.allclose(b[:, 0] - b[:, 2], step * far, rtol=1e-5, atol=1e-6)
    ):
        raise ValueError(
            f"cache=LinearState needs a geometric bias (ALiBi) over the whole decoded length: "
            f"encoding {enc.name!r} is not geometric up to distance {far}; decode with a KV "
            "cache (relpos.nn.LayerCache)"
        )
    return -step
