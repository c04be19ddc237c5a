"""Per-call products that depend only on an encoding's state and a call's shape, kept across
calls while the encoding does not change: the per-distance bias table of a call and the
dense score mask ``sdpa`` passes (bias plus causal mask). Calls that change nothing about
the encoding (inference, or training with a fixed bias such as ALiBi) then skip the table's
evaluation and the ``Lq x Lk`` gather.

An entry is used only while its encoding is *frozen for the call*: no gradient can reach
the encoding's parameters (grad mode off, or no parameter requires grad), so the cached
tensor carries no autograd graph. Its key holds the encoding's *state*: for every parameter
and buffer its storage address, version counter (bumped by every in-place write through
the tensor: optimizer steps, ``load_state_dict``, ``with torch.no_grad(): p.copy_(...)``),
dtype and device, and every plain (int, float, bool, str) attribute of the encoding and its
submodules. A write that bypasses the version counter (through ``p.data``) is not seen:
``clear()`` empties the cache.

The cache is one least-recently-used map for the process, bounded by ``CACHE_BYTES``; an
entry never outlives its encoding (weak reference) and tensors above ``ENTRY_BYTES`` are not
kept.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor, nn

__all__ = ["CACHE_BYTES", "ENTRY_BYTES", "encoding_state", "cached", "clear"]

#: the most the cache holds, in bytes of tensor storage
CACHE_BYTES = 64 << 20
#: tensors larger than this are computed on every call (a dense mask of 2^22 fp32 elements)
ENTRY_BYTES = 16 << 20
_SIMPLE = (int, float, bool, str)
_UNKNOWN = object()

_entries: OrderedDict[tuple, tuple[weakref.ref, Tensor]] = OrderedDict()
_held = 0


def encoding_state(encoding: nn.Module) -> tuple | None:
    """The encoding's state for a cache key, or None when a gradient could reach its
    parameters in this call (nothing may be cached then)."""
    grad = torch.is_grad_enabled()
    state: list = []
    for module in encoding.modules():
        for t in module._parameters.values():
            if t is None:
                continue
            if grad and t.requires_grad:
                return None
            state.append((t.data_ptr(), t._version, t.dtype, t.device))
        for t in module._buffers.values():
            if t is not None:
                state.append((t.data_ptr(), t._version, t.dtype, t.device))
        state.extend((n, v) for n, v in vars(module).items() if isinstance(v, _SIMPLE))
    return tuple(state)


def cached(
    encoding: nn.Module,
    key: Hashable,
    compute: Callable[[], Tensor],
    state: tuple | None | object = _UNKNOWN,
) -> Tensor:
    """``compute()``, or the tensor it gave for the same encoding, state and ``key``
    (``state``: ``encoding_state(encoding)`` when the caller has it already)."""
    global _held
    if state is _UNKNOWN:
        state = encoding_state(encoding)
    if state is None:
        return compute()
    full = (id(encoding), state, key)
    hit = _entries.get(full)
    if hit is not None and hit[0]() is encoding:
        _entries.move_to_end(full)
        return hit[1]
    value = compute()
    size = value.numel() * value.element_size()
    if size > ENTRY_BYTES or value.requires_grad:
        return value
    if hit is not None:  # a dead encoding's entry under a reused id
        _drop(full)
    _entries[full] = (weakref.ref(encoding, _forget), value)
    _held += size
    while _held > CACHE_BYTES and _entries:
        _drop(next(iter(_entries)))
    return value


def _drop(full: tuple) -> None:
    global _held
    _, value = _entries.pop(full)
    _held -= value.numel() * value.element_size()


def _forget(ref: weakref.ref) -> None:
    """An encoding was collected: drop its entries."""
    for full in [f for f, (r, _) in _entries.items() if r is ref]:
        _drop(full)


def clear() -> None:
    """Empty the cache (after writing an encoding's tensors through ``.data``)."""
    global _held
    _entries.clear()
    _held = 0
