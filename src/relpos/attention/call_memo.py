"""Repeated calls of one shape skip their preparation: for a call whose preparation depends
only on the encoding and the shapes of q, k, v (``memo_applies``), what ``prepare_call``
produced besides q, k, v (positions, the bias context, the distance facts) and the backend
``auto`` chose are kept, and the next call of the same key gets a new ``AttentionCall`` with
its own q, k, v at once.

It applies to calls with default positions and scale and no mask, ``mask_mod``, per-call
inputs, cache, ``softcap`` or ``sinks``, for an encoding that neither rotates, nor changes
the weights beyond a score term, nor prepares per-call data (``Encoding.prepare`` /
``precompute`` not overridden). The key holds the shapes, dtype and device of q, k, v,
``causal``, the backend asked for, the grad mode and which of q, k, v require grad, and the
encoding's state (``frozen_cache.encoding_state``: no entry while a gradient can reach its
parameters); an entry is used only with the policy table it was chosen under. The memo is a
bounded least-recently-used map; the entry of a collected encoding is never used.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from ..encodings.base import BiasContext, Encoding
from .call import AttentionCall
from .frozen_cache import encoding_state

__all__ = ["MEMO_ENTRIES", "memo_applies", "lookup", "store", "clear"]

#: the most prepared calls kept
MEMO_ENTRIES = 256
_KEYWORDS = ("q_pos", "k_pos", "mask", "scale", "inputs", "mask_mod", "cache", "softcap", "sinks")


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What a prepared call holds besides q, k, v."""

    encoding: weakref.ref
    table: object
    ctx: BiasContext | None
    fields: dict[str, Any]
    delta: object
    backend: str


_memo: OrderedDict[tuple, _Prepared] = OrderedDict()


def memo_applies(encoding: object, call: dict[str, object]) -> bool:
    """Whether this call's preparation depends only on the encoding and the shapes."""
    if not isinstance(encoding, Encoding) or any(call.get(n) is not None for n in _KEYWORDS):
        return False
    cls = type(encoding)
    return not (
        encoding.has_rotary
        or encoding.needs_probabilities
        or encoding.required_inputs
        or encoding.needs_inputs
        or encoding.own_causal_mask
        or cls.prepare is not Encoding.prepare
        or cls.precompute is not Encoding.precompute
        or cls.block_context is not Encoding.block_context
        or cls.query_span_limit is not Encoding.query_span_limit
    )


def _key(q: Tensor, k: Tensor, v: Tensor, encoding: Encoding, backend: str, causal: object, state):
    if state is None:
        return None
    grad = torch.is_grad_enabled()
    return (
        id(encoding),
        state,
        tuple(q.shape),
        tuple(k.shape),
        tuple(v.shape),
        q.dtype,
        k.dtype,
        v.dtype,
        q.device,
        k.device,
        v.device,
        causal,
        backend,
        grad,
        grad and q.requires_grad,
        grad and k.requires_grad,
        grad and v.requires_grad,
    )


def lookup(
    q: Tensor, k: Tensor, v: Tensor, encoding: Encoding, backend: str, causal: object, table: object
) -> tuple[AttentionCall, str] | None:
    """A prepared call for these tensors and the backend to run, when an earlier call of the
    same key was prepared under the same policy ``table``; else None."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        return None
    state = encoding_state(encoding)
    key = _key(q, k, v, encoding, backend, causal, state)
    hit = None if key is None else _memo.get(key)
    if hit is None or hit.encoding() is not encoding or hit.table is not table:
        return None
    _memo.move_to_end(key)
    ctx = None if hit.ctx is None else dataclasses.replace(hit.ctx)
    call = AttentionCall(q, k, v, encoding, ctx, **hit.fields)
    call._delta = hit.delta
    call._state = state
    return call, hit.backend


def store(
    call: AttentionCall, backend_asked: str, backend: str, causal: object, table: object
) -> None:
    """Keep what ``call`` holds besides q, k, v for the next call of its key."""
    enc = call.encoding
    assert isinstance(enc, Encoding)
    key = _key(call.q, call.k, call.v, enc, backend_asked, causal, call.encoding_state())
    if key is None:
        return
    fields = {
        f.name: getattr(call, f.name)
        for f in dataclasses.fields(call)
        if f.name not in ("q", "k", "v", "encoding", "ctx", "_delta")
    }
    ctx = None if call.ctx is None else dataclasses.replace(call.ctx)
    _memo[key] = _Prepared(weakref.ref(enc), table, ctx, fields, call._delta, backend)
    while len(_memo) > MEMO_ENTRIES:
        _memo.popitem(last=False)


def clear() -> None:
    """Forget every prepared call."""
    _memo.clear()
