"""``relpos.attention`` and ``relpos.scores``: one entry point, several backends.

``backend="auto"`` picks, from what the call needs and from measurements recorded in
docs/benchmarks.md (2-core CPU, torch 2.13):

* no additive bias (rotary / none / absolute encodings) -> ``sdpa`` (fused kernels);
* a bias, and ``B * H * Lq * Lk <= DENSE_BIAS_LIMIT`` -> ``sdpa`` with the bias materialised
  (fastest for small problems);
* a bias above that size -> ``chunked`` on CPU (forward and backward, O(L) extra memory for
  distance-only biases: 1.14-1.18x the no-bias SDPA time at L=4096, docs/benchmarks.md),
  ``flex`` on CUDA. It never builds an L x L bias above the limit.
* a ``mask_mod`` (structured mask) follows the same size rule as a bias: evaluated densely
  for ``sdpa`` when small, per query block (``chunked``) or as a block mask (``flex``) above.
* a bias whose parameters train (gradients on, e.g. FIRE, T5, KERPLE) and that has a
  per-distance table for this call (``AttentionCall.distance_table``: positions are ranges,
  the bias depends on ``q_pos - k_pos`` only, no user mask) -> ``chunked`` even when small:
  its Toeplitz path sums the table's gradient over anti-diagonals, where a dense bias
  scatters it back through an ``Lq x Lk`` gather (FIRE at the lab's training size, batch 16
  x L 128 x 4 heads, trains on it without naming it);
* encodings that change the weights themselves (``Encoding.needs_probabilities``: value
  terms, URPE, piecewise logits) -> ``eager`` up to the same size, ``chunked`` above it;
  ``sdpa`` and ``flex`` only take an additive score term and refuse them.

``plan(q, k, v, encoding, **same keywords as attention)`` says which backend and which path
inside it a call takes (``"fused"``, ``"dense-bias"``, ``"dense"``, ``"score-mod"``,
``"toeplitz"``, ``"tile"``, ``"probabilities"``, ``"piecewise-sdpa"``), without running it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

from ..encodings.base import Encoding
from .call import AttentionCall, KeyValueCache, MaskMod, prepare_call
from .chunked import chunked_attention, chunked_path
from .eager import eager_attention, logits
from .flex import flex_attention_backend, flex_available
from .sdpa import sdpa_attention

DENSE_BIAS_LIMIT = 1 << 22  # elements of a materialised (B, H, Lq, Lk) bias (16 MiB in fp32)

BACKENDS: dict[str, Callable[[AttentionCall], Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "chunked": chunked_attention,
    "flex": flex_attention_backend,
}


def supported_backends(encoding: Encoding | None) -> list[str]:
    """Backends that compute this encoding exactly (``sdpa`` materialises biases)."""
    if encoding is not None and encoding.needs_probabilities:
        return ["eager", "chunked"]
    return ["eager", "sdpa", "chunked", "flex"]


def _trains_bias(call: AttentionCall) -> bool:
    """Gradients are on and the encoding's bias has parameters that take them."""
    enc = call.encoding
    return (
        torch.is_grad_enabled()
        and enc is not None
        and call.has_bias
        and any(p.requires_grad for p in enc.parameters())
    )


def choose_backend(call: AttentionCall) -> str:
    """The backend ``auto`` uses for this call (see module docstring)."""
    B, H, Lq = call.q.shape[:3]
    small = B * H * Lq * call.k.shape[2] <= DENSE_BIAS_LIMIT
    if call.needs_probabilities:
        return "eager" if small else "chunked"
    if not call.has_bias and (call.mask_mod is None or small):
        return "sdpa"
    if small:
        if _trains_bias(call) and chunked_path(call) == "toeplitz":
            return "chunked"
        return "sdpa"
    if call.q.device.type == "cuda" and flex_available():
        return "flex"
    return "chunked"


def backend_path(call: AttentionCall, backend: str) -> str:
    """The path ``backend`` takes for this call: ``"fused"`` (sdpa, no bias) or
    ``"dense-bias"`` (sdpa, materialised bias), ``"dense"`` (eager), ``"score-mod"`` (flex),
    or the chunked backend's ``"piecewise-sdpa"`` / ``"probabilities"`` / ``"toeplitz"`` /
    ``"tile"``."""
    if backend == "chunked":
        return chunked_path(call)
    if backend == "sdpa":
        return "dense-bias" if call.has_bias else "fused"
    if backend == "flex":
        return "score-mod"
    return "dense"


def _check_backend(backend: object, encoding: Encoding | None) -> None:
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {['auto', *BACKENDS]}, got {backend!r}")
    if backend != "auto" and backend not in (ok := supported_backends(encoding)):
        assert encoding is not None
        raise ValueError(
            f"backend {backend!r} cannot run encoding {encoding.name!r}: it changes the "
            f"attention weights beyond an additive score (value terms, multiplied weights or "
            f"piecewise logits); use backend 'auto' or one of {ok}"
        )


def plan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding | None = None,
    *,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    inputs: dict[str, Tensor] | None = None,
    mask_mod: MaskMod | None = None,
    cache: KeyValueCache | None = None,
) -> tuple[str, str]:
    """``(backend, path)`` that ``relpos.attention`` with these arguments would take (see
    the module docstring for the paths). It validates and prepares the call (rotations,
    the encoding's precomputation) but runs no attention; a ``cache`` is left unchanged.
    Gradient mode matters (``auto`` trains learnable biases on ``chunked``): call it under
    the same ``torch.no_grad()`` as the attention it describes."""
    _check_backend(backend, encoding)
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
        cache=None if cache is None else copy.copy(cache),
    )
    name = choose_backend(call) if backend == "auto" else backend
    return name, backend_path(call, name)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding | None = None,
    *,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    inputs: dict[str, Tensor] | None = None,
    mask_mod: MaskMod | None = None,
    cache: KeyValueCache | None = None,
) -> Tensor:
    """Scaled dot-product attention with a relative positional encoding.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, Hkv, Lk, D)``; v: ``(B, Hkv, Lk, Dv)``, with ``H``
            a multiple of ``Hkv`` (grouped-query attention).
        encoding: a ``relpos.Encoding`` (``relpos.create(name, ...)``) or None.
        q_pos, k_pos: positions ``(L,)``, ``(B, L)`` or ``(B, L, m)``. Defaults: keys
            ``0..Lk-1``, queries the last ``Lq`` of those (``Lk-Lq .. Lk-1``), as in decoding.
        causal: mask keys after each query, aligned bottom-right (query ``i`` sees keys
            ``j <= i + Lk - Lq``).
        mask: bool (True = attend) or additive float, broadcastable to ``(B, H, Lq, Lk)``.
        mask_mod: a structured mask without an ``Lq x Lk`` tensor: ``mask_mod(b, h, q_idx,
            kv_idx) -> bool`` (True = attend), element-wise on broadcasting index tensors
            (FlexAttention's convention; ``relpos.schedules.anchor_mask_mod`` for packed
            documents, ``cca_mask_mod``). ``q_idx`` is the query's index in the key
            sequence (``i + Lk - Lq``, aligned bottom-right like ``causal``), so a mask_mod
            over a whole sequence also serves decoding with a KV cache. The chunked backend
            evaluates it per query block, flex builds a block mask from it, eager and sdpa
            evaluate it densely. Combined with ``causal`` and ``mask`` (all must allow).
        scale: logit scale, default ``1/sqrt(D)``; biases are added after scaling.
        backend: "auto", "eager", "sdpa", "chunked" or "flex" (see ``supported_backends``).
        inputs: per-call tensors the encoding reads (``encoding.required_inputs``: e.g. a
            graph's adjacency, token boxes), by name.
        cache: KV-cache decoding (``relpos.nn.LayerCache`` or any ``KeyValueCache``):
            ``k``, ``v`` (and ``k_pos``) are the new tokens', appended to the cache; the
            queries attend to every cached key. Default positions continue the cache
            (``cache.length ..``). The engine stores keys rotated when the encoding allows
            (``cache_rotated_keys``) and rotates the whole cache on every call otherwise.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of q.
    """
    _check_backend(backend, encoding)
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
        cache=cache,
    )
    name = choose_backend(call) if backend == "auto" else backend
    out = BACKENDS[name](call)
    if encoding is not None and encoding.has_rotary:
        out = encoding.rotate(out, call.q_pos, "o")
    return out


def scores(
    q: Tensor,
    k: Tensor,
    encoding: Encoding | None = None,
    *,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    scale: float | None = None,
    inputs: dict[str, Tensor] | None = None,
    v: Tensor | None = None,
) -> Tensor:
    """Attention logits ``(B, H, Lq, Lk)`` before masking and softmax (eager, O(L^2)).

    Piecewise encodings give their merged logits (-inf where a pair is masked); value terms
    and multiplied weights act after the softmax and are not part of the logits. ``v``: the
    values, read only by schedules whose selection reads them (LongHeads' chunk features);
    without it ``k`` stands in."""
    if v is None:
        v = k  # logits never read v otherwise; k has its shape
    call = prepare_call(
        q,
        k,
        v,
        encoding,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=False,
        mask=None,
        scale=scale,
        check_causal=False,
        inputs=inputs,
    )
    return logits(call)


# ``relpos.attention`` is the function at the package's top level: ``relpos.attention.plan``
# reads as the docs spell it (also importable: ``from relpos.attention import plan``)
attention.plan = plan  # type: ignore[attr-defined]

__all__ = [
    "attention",
    "scores",
    "plan",
    "choose_backend",
    "supported_backends",
    "BACKENDS",
    "DENSE_BIAS_LIMIT",
]
