"""``relpos.attention`` and ``relpos.scores``: one entry point, several backends.

``backend="auto"`` runs, of the backends that compute the call exactly, the one measured
fastest for calls like it, in two steps:

* **candidates** (``candidate_backends``), from capabilities and memory, never from encoding
  names: encodings that change the weights beyond an additive score
  (``Encoding.needs_probabilities``: value terms, URPE, piecewise logits, row-dependent terms)
  run on ``eager`` and ``chunked`` only; otherwise ``sdpa``, ``chunked``, ``flex`` where it
  compiles (on CPU only without gradients: torch 2.13 has no FlexAttention backward there;
  never for float64 or a float mask) and ``fold`` where the bias folds exactly into q/k
  channels (``DistanceBias.linear_pieces``: every ALiBi form; DeBERTa's two-sided tables
  outside their band, ``attention/disentangled.py``), the folded logits' rounding bound
  ``u * max|slope| * Lk / 2`` is within ``FOLD_LOGIT_TOLERANCE``, the call has more than a
  few queries (``Lq Lk > (Lq + 2 Lk)(D + 1)``: the fold copies q, k, v) and the device has
  fused kernels for its passes. Above ``DENSE_BIAS_LIMIT`` score elements ``eager`` and a
  materialising ``sdpa`` (a bias or a ``mask_mod``) are dropped: ``auto`` never builds an
  ``Lq x Lk`` tensor there.
* **ranking** (``relpos.attention.policy``): the call's facts (``call_facts``: device, dtype
  class, kind of score term, causal or not, forward or training step, ``B * H * Lq * Lk``)
  select a ranking of backends in the active policy table, measured by
  ``relpos bench --calibrate`` (shipped with the package, or this machine's); the first
  ranked candidate runs.

``softcap`` (Gemma-2's attention-logit softcapping) and ``sinks`` (gpt-oss's attention sinks)
change the softmax beyond an additive score: each backend either computes them exactly or
refuses the call by name (``BACKEND_FEATURES``), and ``auto`` chooses among the backends that
compute them (``eager``, ``chunked``, ``flex``; ``sdpa`` for sinks).

``feature_map`` (the kernelized model, not softmax attention) always runs ``linear``
(``attention/linear``), the only backend that computes it; ``linear`` is never chosen
otherwise and the softmax backends refuse ``feature_map``.

``plan(q, k, v, encoding, **same keywords as attention)`` says which backend and which path
inside it a call takes (``"fused"``, ``"dense-bias"``, ``"dense"``, ``"score-mod"``,
``"toeplitz"``, ``"row-affine"``, ``"tile"``, ``"probabilities"``, ``"piecewise-sdpa"``,
``"row-suffix"``, ``"fold-sdpa"``, ``"fold-passes"``, ``"fold-band"``; the linear backend's
``"linear-scan"``, ``"linear-sum"``, ``"linear-decay"``, ``"linear-fft"``), without running
it: the same dispatch as ``attention``, so in the same grad mode it is what runs.
``facts(...)`` gives the facts the choice read. Calls of one shape whose preparation depends
only on the encoding reuse it (``call_memo``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

from ..encodings.base import Encoding
from . import call_memo, policy
from .call import AttentionCall, KeyValueCache, MaskMod, prepare_call
from .chunked import chunked_attention, chunked_path
from .disentangled import disentangled_fold_pays, folds_disentangled
from .eager import eager_attention, logits
from .flex import flex_accepts, flex_attention_backend
from .fold import (
    FOLD_LOGIT_TOLERANCE,
    exact_fold_attention,
    exact_fold_pieces,
    fold_path,
    fold_refusal,
    fold_rounding_bound,
)
from .linear.backend import linear_attention, linear_path, prepare_linear_call
from .linear.feature_maps import FeatureMap, create_feature_map
from .linear.state import LinearState
from .policy import CallFacts, dtype_class, select_backend
from .query_split import split_call
from .sdpa import sdpa_attention

DENSE_BIAS_LIMIT = 1 << 22  # elements of a materialised (B, H, Lq, Lk) bias (16 MiB in fp32)

BACKENDS: dict[str, Callable[[AttentionCall], Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "chunked": chunked_attention,
    "flex": flex_attention_backend,
    "fold": exact_fold_attention,
}


#: the score features (``AttentionCall.score_features``) each backend computes exactly; a
#: backend refuses a call with a feature it lacks and ``auto`` never chooses it for one
BACKEND_FEATURES: dict[str, frozenset[str]] = {
    "eager": frozenset({"softcap", "sinks"}),
    "chunked": frozenset({"softcap", "sinks"}),  # explicit logits per block (probabilities)
    "flex": frozenset({"softcap", "sinks"}),  # score_mod; the sink as an appended key
    "sdpa": frozenset({"sinks"}),  # the sink as an appended key; no tanh in the kernel
    "fold": frozenset(),
    "linear": frozenset(),
}
#: why a backend lacks a feature (the refusal names it)
_FEATURE_REFUSALS = {
    "sdpa": "its kernel adds a mask to q k^T and has no tanh of the logits",
    "fold": "it folds biases into q/k channels and runs the fused kernel on them, which has "
    "neither a tanh of the logits nor a sink",
    "linear": "kernelized attention phi(q) . phi(k) has no softmax logits to cap and no "
    "softmax denominator for a sink",
}


def _call_features(softcap: object, sinks: object) -> frozenset[str]:
    return frozenset(
        name for name, value in (("softcap", softcap), ("sinks", sinks)) if value is not None
    )


def _check_features(backend: str, features: frozenset[str]) -> None:
    """ValueError naming the feature when an explicit ``backend`` cannot compute it."""
    if backend == "auto":
        return
    missing = sorted(features - BACKEND_FEATURES[backend])
    if missing:
        able = [b for b, f in BACKEND_FEATURES.items() if features <= f and b != "linear"]
        raise ValueError(
            f"backend {backend!r} cannot apply {' and '.join(missing)}: "
            f"{_FEATURE_REFUSALS[backend]}; use backend 'auto' or one of {able}"
        )


def supported_backends(encoding: Encoding | None) -> list[str]:
    """Backends that compute this encoding exactly (``sdpa`` materialises biases; ``fold``
    takes biases that fold exactly into q/k channels, ``exact_fold_pieces``, and DeBERTa's
    outside its band, ``folds_disentangled``)."""
    if encoding is not None and encoding.needs_probabilities:
        return ["eager", "chunked"]
    out = ["eager", "sdpa", "chunked", "flex"]
    if (exact_fold_pieces(encoding) is not None and not encoding.has_rotary) or (
        folds_disentangled(encoding)
    ):
        out.append("fold")
    return out


def _fold_is_candidate(call: AttentionCall) -> bool:
    """The ``fold`` backend computes this call exactly and within ``FOLD_LOGIT_TOLERANCE``:
    it applies (``fold_refusal``), its rounding bound is within the tolerance, the ``Lq x Lk``
    bias it saves is larger than the copies of q, k, v it makes (``Lq Lk > (Lq + 2 Lk)(D +
    1)``: decoding steps keep the small bias), and its kernels are fused on the device (the
    multi-pass merge and DeBERTa's band have fused kernels on CPU only; elsewhere only the
    one-pass fold)."""
    Lq, Lk, D = call.q.shape[2], call.k.shape[2], call.q.shape[3]
    if Lq == 0 or Lk == 0 or fold_refusal(call) is not None:
        return False
    if Lq * Lk <= (Lq + 2 * Lk) * (D + 1):
        return False
    if folds_disentangled(call.encoding):
        return disentangled_fold_pays(call, 0.0)
    if fold_rounding_bound(call) > FOLD_LOGIT_TOLERANCE:
        return False
    return call.q.device.type == "cpu" or fold_path(call) == "fold-sdpa"


def candidate_backends(call: AttentionCall) -> tuple[str, ...]:
    """The backends ``auto`` may run for this call: those that compute it exactly (``fold``
    within its rounding tolerance, ``flex`` where it compiles and, on CPU, only without
    gradients; only backends whose ``BACKEND_FEATURES`` hold the call's softcap and sinks)
    and never form an ``Lq x Lk`` tensor above ``DENSE_BIAS_LIMIT`` elements (``eager``
    always forms one; ``sdpa`` does for a bias, a ``mask_mod`` or sinks)."""
    B, H, Lq = call.q.shape[:3]
    small = B * H * Lq * call.k.shape[2] <= DENSE_BIAS_LIMIT
    features = call.score_features
    if call.needs_probabilities:
        return ("eager", "chunked") if small else ("chunked",)
    out = []
    if small or not (call.has_bias or call.mask_mod is not None or call.sinks is not None):
        out.append("sdpa")
    if small:
        out.append("eager")
    out.append("chunked")
    if flex_accepts(call):
        out.append("flex")
    if _fold_is_candidate(call):
        out.append("fold")
    return tuple(b for b in out if features <= BACKEND_FEATURES[b])


def call_kind(call: AttentionCall, candidates: tuple[str, ...] | None = None) -> str:
    """The kind of call a policy table distinguishes (``policy.KINDS``): ``plain`` (no
    bias), ``band`` (a two-sided table bias the fold runs as a band), else the chunked
    backend's path (``toeplitz``, ``row-affine``, ``tile``, ``probabilities``,
    ``piecewise-sdpa``, ``row-suffix``; calls with softcap or sinks are ``probabilities``
    or ``row-suffix``), with ``toeplitz`` as ``learned-toeplitz`` when the table takes
    gradients in this call."""
    if not call.needs_probabilities and not call.has_bias and not call.score_features:
        return "plain"
    if folds_disentangled(call.encoding) and "fold" in (
        candidate_backends(call) if candidates is None else candidates
    ):
        return "band"
    path = chunked_path(call)
    if path == "toeplitz" and call.bias_takes_gradients:
        return "learned-toeplitz"
    return path


def call_facts(call: AttentionCall) -> CallFacts:
    """What ``auto``'s choice for this call depends on (``policy.CallFacts``)."""
    candidates = candidate_backends(call)
    B, H, Lq = call.q.shape[:3]
    return CallFacts(
        device=call.q.device.type,
        dtype=dtype_class(call.q.dtype),
        kind=call_kind(call, candidates),
        causal=call.causal,
        training=call.takes_gradients,
        elements=B * H * Lq * call.k.shape[2],
        candidates=candidates,
        encoding=registered_name(call.encoding),
    )


def registered_name(encoding: Encoding | None) -> str:
    """The name ``encoding``'s own class is registered under ("" for none, or for a class
    that is not registered itself, such as a user's subclass: its costs are not those its
    parent was measured with)."""
    return "" if encoding is None else vars(type(encoding)).get("name", "")


def choose_backend(call: AttentionCall) -> str:
    """The backend ``auto`` uses for this call: the candidate the active policy table
    ranks first for the call's facts (``relpos.attention.policy``)."""
    return select_backend(call_facts(call), policy.active_table())


def backend_path(call: AttentionCall, backend: str) -> str:
    """The path ``backend`` takes for this call: ``"fused"`` (sdpa, no bias) or
    ``"dense-bias"`` (sdpa, materialised bias), ``"dense"`` (eager), ``"score-mod"`` (flex),
    or the chunked backend's ``"piecewise-sdpa"`` / ``"row-suffix"`` / ``"probabilities"`` /
    ``"toeplitz"`` / ``"row-affine"`` / ``"tile"``."""
    if backend == "chunked":
        return chunked_path(call)
    if backend == "linear":
        return linear_path(call)
    if backend == "sdpa":
        if call.has_bias or (call.sinks is not None and call.q.shape[2] and call.k.shape[2]):
            return "dense-bias"
        return "fused"
    if backend == "flex":
        return "score-mod"
    if backend == "fold":
        reason = fold_refusal(call)
        if reason is not None:
            raise ValueError(reason)
        return fold_path(call)
    return "dense"


#: backends of other attention models than softmax, chosen through their own argument
MODEL_BACKENDS = ("linear",)


def _check_backend(backend: object, encoding: Encoding | None, feature_map: object = None) -> None:
    if backend != "auto" and backend not in BACKENDS and backend not in MODEL_BACKENDS:
        raise ValueError(
            f"backend must be one of {['auto', *BACKENDS, *MODEL_BACKENDS]}, got {backend!r}"
        )
    if feature_map is not None and backend not in ("auto", "linear"):
        raise ValueError(
            f"feature_map asks for kernelized attention, which only backend 'linear' computes; "
            f"got backend {backend!r} (pass backend='linear' or 'auto', or feature_map=None)"
        )
    if backend == "linear":
        if feature_map is None:
            raise ValueError(
                "backend 'linear' computes kernelized attention: pass feature_map ('elu1', "
                "'relu', 'prf' or a relpos.attention.linear.feature_maps.FeatureMap)"
            )
        return
    if backend == "fold" and "fold" not in supported_backends(encoding):
        name = "no encoding" if encoding is None else f"encoding {encoding.name!r}"
        raise ValueError(
            f"backend 'fold' cannot run {name}: it folds biases that are piecewise linear in "
            f"q_pos - k_pos (ALiBi) and two-sided table biases (DeBERTa's) outside their band "
            f"into q/k channels; for other biases use "
            f"relpos.attention.fold.folded_attention(..., rank=r) (a low-rank fold with its "
            f"measured weight error) or backend 'auto' or one of {supported_backends(encoding)}"
        )
    if backend != "auto" and backend not in (ok := supported_backends(encoding)):
        assert encoding is not None
        raise ValueError(
            f"backend {backend!r} cannot run encoding {encoding.name!r}: it changes the "
            f"attention weights beyond an additive score (value terms, multiplied weights, "
            f"piecewise logits or row-dependent terms); use backend 'auto' or one of {ok}"
        )


def _dispatch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding | None,
    backend: str,
    feature_map: object = None,
    **call: object,
) -> tuple[list[dict] | None, AttentionCall | None, str]:
    """Check ``backend``; then either the query blocks of a call the encoding cannot take at
    once (``split_call``) or the prepared call and the backend that runs it (``linear``
    when a ``feature_map`` asks for kernelized attention)."""
    _check_backend(backend, encoding, feature_map)
    features = _call_features(call.get("softcap"), call.get("sinks"))
    _check_features("linear" if feature_map is not None else backend, features)
    if feature_map is not None:
        create_feature_map(feature_map, q.shape[-1])  # validates it
        call = {n: value for n, value in call.items() if n not in ("softcap", "sinks")}
        return None, prepare_linear_call(q, k, v, encoding, **call), "linear"  # type: ignore[arg-type]
    if isinstance(call.get("cache"), LinearState):
        raise ValueError(
            "cache=LinearState is the recurrent state of kernelized attention: pass "
            "feature_map=... (or a relpos.nn.LayerCache for softmax attention)"
        )
    memo = call_memo.memo_applies(encoding, call)
    if memo:  # an earlier call of this shape was prepared: reuse it
        assert isinstance(encoding, Encoding)
        table = policy.active_table()
        hit = call_memo.lookup(q, k, v, encoding, backend, call.get("causal"), table)
        if hit is not None:
            return None, hit[0], hit[1]
    blocks = split_call(q, k, v, encoding, **call)  # type: ignore[arg-type]
    if blocks is not None:
        return blocks, None, backend
    prepared = prepare_call(q, k, v, encoding, **call)  # type: ignore[arg-type]
    name = choose_backend(prepared) if backend == "auto" else backend
    if memo:
        call_memo.store(prepared, backend, name, call.get("causal"), table)
    return None, prepared, name


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
    feature_map: str | FeatureMap | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[str, str]:
    """``(backend, path)`` that ``relpos.attention`` with these arguments would take (see
    the module docstring for the paths). It validates and prepares the call (rotations,
    the encoding's precomputation) but runs no attention; a ``cache`` is left unchanged.
    Gradient mode matters (``auto`` trains learnable biases on ``chunked``): call it under
    the same ``torch.no_grad()`` as the attention it describes."""
    blocks, call, name = _dispatch(
        q,
        k,
        v,
        encoding,
        backend,
        feature_map,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        mask=mask,
        scale=scale,
        inputs=inputs,
        mask_mod=mask_mod,
        cache=None if cache is None else copy.copy(cache),
        softcap=softcap,
        sinks=sinks,
    )
    if blocks is not None:  # the first query block stands for the call
        return plan(**blocks[0], backend=backend)
    return name, backend_path(call, name)


def facts(
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
    inputs: dict[str, Tensor] | None = None,
    mask_mod: MaskMod | None = None,
    cache: KeyValueCache | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> CallFacts:
    """The facts ``auto``'s choice reads for this call (``policy.CallFacts``: kind, size,
    mode, candidates), with the arguments of ``relpos.attention``; for a call split into
    query blocks, the first block's. Like ``plan`` it runs no attention and leaves a
    ``cache`` unchanged; call it in the grad mode of the attention it describes."""
    blocks, call, _ = _dispatch(
        q,
        k,
        v,
        encoding,
        "auto",
        None,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        mask=mask,
        scale=scale,
        inputs=inputs,
        mask_mod=mask_mod,
        cache=None if cache is None else copy.copy(cache),
        softcap=softcap,
        sinks=sinks,
    )
    if blocks is not None:
        return facts(**blocks[0])
    assert call is not None
    return call_facts(call)


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
    cache: KeyValueCache | LinearState | None = None,
    feature_map: str | FeatureMap | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
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
        backend: "auto", "eager", "sdpa", "chunked", "flex" or "fold" (biases folded exactly
            into q/k channels: ALiBi; see ``supported_backends``); "linear" for kernelized
            attention (with ``feature_map``).
        inputs: per-call tensors the encoding reads (``encoding.required_inputs``: e.g. a
            graph's adjacency, token boxes), by name.
        cache: KV-cache decoding (``relpos.nn.LayerCache`` or any ``KeyValueCache``):
            ``k``, ``v`` (and ``k_pos``) are the new tokens', appended to the cache; the
            queries attend to every cached key. Default positions continue the cache
            (``cache.length ..``). The engine stores keys rotated when the encoding allows
            (``cache_rotated_keys``) and rotates the whole cache on every call otherwise.
            Kernelized attention also takes a ``relpos.attention.linear.state.LinearState``
            (causal, no
            bias): the recurrent sums, O(1) per decoded token.
        feature_map: ask for kernelized attention ``phi(q) . phi(k)`` instead of softmax:
            ``"elu1"``, ``"relu"``, ``"prf"`` (Performer's positive random features with
            default options) or a ``relpos.attention.linear.feature_maps.FeatureMap``. Runs on
            backend
            ``linear`` (``auto`` picks it): rotary encodings rotate the features (RoFormer
            eq. 19), distance-only biases multiply the kernel by ``exp(b)`` through an FFT
            (Luo et al. 2021); see ``relpos.attention.linear.backend``.
        softcap: attention-logit softcapping (Gemma-2: "Gemma 2: Improving Open Language
            Models at a Practical Size", arXiv:2408.00118): a finite float ``c > 0``; the
            logits ``s = q k^T * scale + every score term of the encoding`` become
            ``c * tanh(s / c)`` before the mask is added, the order of transformers'
            ``models/gemma2/modeling_gemma2.py`` (``eager_attention_forward``: ``/ c``,
            ``tanh``, ``* c``, then ``+ attention_mask``) and of flash-attention
            (Dao-AILab/flash-attention ``csrc/flash_attn/src/flash_fwd_kernel.h``:
            ``apply_softcap`` on the scores right after ``Q K^T``, before ``apply_mask``).
            flash-attention adds its ALiBi slopes inside ``apply_mask``, after the cap;
            relpos caps the whole logit including the encoding's bias (no model pairs a
            bias with softcapping). ``eager``, ``chunked`` and ``flex`` compute it;
            ``sdpa``, ``fold`` and ``linear`` refuse it.
        sinks: attention sinks (gpt-oss; "Efficient Streaming Language Models with
            Attention Sinks", arXiv:2309.17453, as learned logits): a float tensor ``(H,)``
            of finite values, one logit per query head, cast to the dtype of the scores.
            Each row's softmax runs over its masked logits and the head's sink logit, whose
            weight is dropped (it has no value), as transformers'
            ``models/gpt_oss/modeling_gpt_oss.py`` ``eager_attention_forward`` and
            openai/gpt-oss ``gpt_oss/torch/model.py`` (``sdpa``) do; the sink is not
            softcapped. A row whose every key is masked gives 0 (the sink takes it), as
            does ``Lk = 0``. ``eager``, ``chunked``, ``flex`` and ``sdpa`` compute it;
            ``fold`` and ``linear`` refuse it.

    Returns:
        ``(B, H, Lq, Dv)`` in the dtype of q.
    """
    blocks, call, name = _dispatch(
        q,
        k,
        v,
        encoding,
        backend,
        feature_map,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        mask=mask,
        scale=scale,
        inputs=inputs,
        mask_mod=mask_mod,
        cache=cache,
        softcap=softcap,
        sinks=sinks,
    )
    if blocks is not None:  # the encoding bounds the query span of a call (xPos)
        return torch.cat(
            [attention(**block, backend=backend, feature_map=feature_map) for block in blocks],
            dim=2,
        )
    if name == "linear":
        fmap = create_feature_map(feature_map, q.shape[-1])
        out = linear_attention(call, fmap, cache if isinstance(cache, LinearState) else None)
    elif call.query_grouped and call.q.shape[2] and call.k.shape[2]:
        # one attention per query group (RayRoPE: keys re-encoded in each query camera);
        # every query keeps the row of its own group
        out = None
        for rows, sub in call.group_calls():
            part = sub.rotate_output(BACKENDS[name](sub))
            keep = rows[:, None, :, None]
            out = torch.where(keep, part, 0.0 if out is None else out)
        assert out is not None
        return out
    else:
        out = BACKENDS[name](call)
    if encoding is not None and encoding.has_rotary and not call.query_grouped:
        out = call.rotate_output(out)  # (an empty grouped call: zeros, nothing to rotate)
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
    if call.query_grouped and call.q.shape[2] and call.k.shape[2]:
        out = None
        for rows, sub in call.group_calls():
            out = torch.where(rows[:, None, :, None], logits(sub), 0.0 if out is None else out)
        assert out is not None
        return out
    return logits(call)


# ``relpos.attention`` is the function at the package's top level: ``relpos.attention.plan``
# reads as the docs spell it (also importable: ``from relpos.attention import plan``)
attention.plan = plan  # type: ignore[attr-defined]

__all__ = [
    "attention",
    "scores",
    "plan",
    "choose_backend",
    "candidate_backends",
    "call_facts",
    "facts",
    "supported_backends",
    "BACKENDS",
    "DENSE_BIAS_LIMIT",
]
