"""Validation and preparation shared by every backend: one ``AttentionCall`` per call.

``prepare_call`` checks shapes, dtypes, head counts and positions (errors name the argument
and the expected form), normalises the positions once (``relpos.positions.CallPositions``),
applies the encoding's rotations (the one place that rotates, also for KV-cache decoding:
``cache``), and runs its ``prepare``. Backends then only read the ``AttentionCall``.

Also here, because they are properties of a call and not of one backend: the per-distance
bias table (``AttentionCall.distance_table``, used by the sdpa and chunked backends) and the
query-block iteration every blocked loop shares (``query_blocks`` / ``run_blocks``, which
owns activation checkpointing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..encodings.base import BiasContext, Encoding, QueryGroups
from ..positions import CallPositions, Positions, normalize_positions
from ..validation import check_float
from . import frozen_cache

#: ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend), FlexAttention's convention
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
_UNSET = object()


class KeyValueCache(Protocol):
    """What ``relpos.attention(..., cache=...)`` needs of a KV cache (``relpos.nn.LayerCache``).

    ``length``: keys cached so far; ``append(k, v, k_pos)`` stores the new keys, values and
    key positions and returns the whole cache ``(k, v, k_pos)``; ``rotated`` is set by the
    engine: whether the stored keys carry the encoding's rotation."""

    rotated: bool

    @property
    def length(self) -> int: ...

    def append(self, k: Tensor, v: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


class QueryBlock(NamedTuple):
    """Query rows ``start:end`` of a blocked loop and the keys ``0:key_end`` they may see
    (causal blocks stop at their last query's key)."""

    start: int
    end: int
    key_end: int


def query_blocks(
    length_q: int,
    length_k: int,
    rows: int,
    *,
    causal: bool,
    breaks: Callable[[int], int | None] | None = None,
) -> Iterator[QueryBlock]:
    """Blocks of at most ``rows`` query rows over ``length_q`` queries and ``length_k`` keys
    (bottom-right causal alignment). ``breaks(row)``: the first row after ``row`` where a
    block must end (None: anywhere)."""
    offset = length_k - length_q
    s = 0
    while s < length_q:
        e = min(s + rows, length_q)
        if breaks is not None:
            cut = breaks(s)
            if cut is not None:
                e = min(e, max(s + 1, cut))
        # causal with Lq > Lk: early blocks may see no key (key_end 0, dead rows)
        yield QueryBlock(s, e, max(0, min(length_k, e + offset)) if causal else length_k)
        s = e


def run_blocks(fn: Callable[..., Tensor], blocks: Iterator[QueryBlock], *tensors: Tensor) -> Tensor:
    """``fn(block, *tensors)`` for every block, concatenated over the query rows (dim 2).

    Under autograd each block runs under activation checkpointing: backward recomputes the
    block's temporaries (its bias slice, logits) instead of storing them."""
    grad = torch.is_grad_enabled()
    outs = [
        checkpoint(fn, block, *tensors, use_reentrant=False) if grad else fn(block, *tensors)
        for block in blocks
    ]
    return torch.cat(outs, dim=2)


@dataclass
class AttentionCall:
    """Everything a backend needs. q/k/v are rotated; k/v keep their own head count."""

    q: Tensor  # (B, H, Lq, D)
    k: Tensor  # (B, Hkv, Lk, D)
    v: Tensor  # (B, Hkv, Lk, Dv)
    encoding: Encoding | None
    ctx: BiasContext | None  # set when the encoding has a bias
    q_pos: Tensor  # (B|1, Lq[, m])
    k_pos: Tensor
    causal: bool
    mask: Tensor | None  # bool (True = attend) or float additive, broadcastable to (B,H,Lq,Lk)
    scale: float
    # piecewise encodings: the rotated (q_r, k_r) of each piece (q/k above are piece 0)
    pieces: list[tuple[Tensor, Tensor]] | None = None
    # element-wise mask over (batch, head, query index in key coordinates, key index)
    mask_mod: MaskMod | None = None
    # the position facts of the call (spans, distance range), shared with ``ctx``
    positions: CallPositions | None = None
    # what the encoding's ``prepare_rotary`` returned (camera frames), passed to ``rotate``
    # for the output ("o") by ``relpos.attention``; None for position-only rotations
    rotary_state: object = None
    # attention-logit softcapping: logits ``s`` become ``softcap * tanh(s / softcap)``
    softcap: float | None = None
    # attention sinks: one logit per query head ``(H,)`` in every row's softmax, no value
    sinks: Tensor | None = None
    # ``distance_delta``, once computed (it may read positions: computed once per call)
    _delta: object = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._delta = _UNSET
        self._state: object = _UNSET

    def encoding_state(self) -> tuple | None:
        """``frozen_cache.encoding_state`` of the encoding, once per call (None: a gradient
        can reach its parameters in this call)."""
        if self._state is _UNSET:
            assert self.encoding is not None
            self._state = frozen_cache.encoding_state(self.encoding)
        return self._state  # type: ignore[return-value]

    @property
    def query_grouped(self) -> bool:
        """The rotation state is per query group (``QueryGroups``): backends run once per
        group on ``group_calls()``."""
        return isinstance(self.rotary_state, QueryGroups)

    def group_calls(self) -> list[tuple[Tensor, AttentionCall]]:
        """For a query-grouped call: ``(rows (B|1, Lq) bool, call)`` per group, each call with
        q, k, v rotated by the group's state (q, k, v of this call are not rotated)."""
        assert isinstance(self.rotary_state, QueryGroups) and self.encoding is not None
        out = []
        for rows, state in self.rotary_state.groups:
            q, k, v = _rotate(self.encoding, self.q, self.k, self.v, self.q_pos, self.k_pos, state)
            out.append((rows, dataclasses.replace(self, q=q, k=k, v=v, rotary_state=state)))
        return out

    def rotate_output(self, out: Tensor) -> Tensor:
        """The encoding's rotation of the attention output (role "o")."""
        assert self.encoding is not None
        if self.rotary_state is None:
            return self.encoding.rotate(out, self.q_pos, "o")
        return self.encoding.rotate(out, self.q_pos, "o", self.rotary_state)

    @property
    def score_features(self) -> frozenset[str]:
        """The features of this call that change the softmax beyond an additive score
        (``"softcap"``, ``"sinks"``): a backend runs the call only if it computes them
        (``relpos.attention.api.BACKEND_FEATURES``)."""
        out = set()
        if self.softcap is not None:
            out.add("softcap")
        if self.sinks is not None:
            out.add("sinks")
        return frozenset(out)

    @property
    def has_user_mask(self) -> bool:
        """A ``mask`` tensor or a ``mask_mod`` restricts this call beyond ``causal``."""
        return self.mask is not None or self.mask_mod is not None

    @property
    def bias_takes_gradients(self) -> bool:
        """Gradients are on and flow into the encoding's parameters (its bias is trained in
        this call)."""
        enc = self.encoding
        return (
            torch.is_grad_enabled()
            and enc is not None
            and self.has_bias
            and any(p.requires_grad for p in enc.parameters())
        )

    @property
    def takes_gradients(self) -> bool:
        """Gradients are on and flow into q, k, v or the encoding's parameters (a training
        step, not inference)."""
        if not torch.is_grad_enabled():
            return False
        if self.q.requires_grad or self.k.requires_grad or self.v.requires_grad:
            return True
        return self.bias_takes_gradients

    @property
    def has_bias(self) -> bool:
        """The encoding adds a bias (``bias`` hook) to the logits of this call."""
        return self.ctx is not None and self.encoding is not None and self.encoding.has_bias

    @property
    def needs_probabilities(self) -> bool:
        """Value terms, multiplied weights or piecewise logits: eager / chunked only."""
        return self.encoding is not None and self.encoding.needs_probabilities

    def index_grids(self, i: Tensor, j: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``b, h, i, j`` index tensors broadcasting to ``(B|1, H, T, S)`` for the encoding's
        element-wise hooks (one batch row when positions are batch-shared and nothing
        batch-specific was prepared)."""
        assert self.ctx is not None
        dev = self.q.device
        # ``ctx.data`` is batch-specific unless it says otherwise (``batch_shared = True``)
        data_shared = getattr(self.ctx.data, "batch_shared", self.ctx.data is None)
        shared = self.q_pos.shape[0] == 1 and self.k_pos.shape[0] == 1 and data_shared
        b = torch.arange(1 if shared else self.q.shape[0], device=dev)[:, None, None, None]
        h = torch.arange(self.q.shape[1], device=dev)[None, :, None, None]
        return b, h, i[None, None, :, None], j[None, None, None, :]

    @property
    def groups(self) -> int:
        return self.q.shape[1] // self.k.shape[1]

    @property
    def causal_offset(self) -> int:
        """Causal masks are bottom-right aligned: query i may see keys j <= i + offset."""
        return self.k.shape[2] - self.q.shape[2]

    def expanded_kv(self) -> tuple[Tensor, Tensor]:
        """k, v repeated to the query head count (grouped-query attention)."""
        if self.groups == 1:
            return self.k, self.v
        return (
            self.k.repeat_interleave(self.groups, dim=1),
            self.v.repeat_interleave(self.groups, dim=1),
        )

    def blocks(
        self, rows: int, breaks: Callable[[int], int | None] | None = None
    ) -> Iterator[QueryBlock]:
        """``query_blocks`` over this call's queries and keys."""
        return query_blocks(
            self.q.shape[2], self.k.shape[2], rows, causal=self.causal, breaks=breaks
        )

    def distance_delta(self) -> int | None:
        """When this call's bias is a function of ``q_pos - k_pos`` and both positions are one
        batch-shared integer range: ``position distance - index distance``, where the index
        distance of pair ``(i, j)`` is ``i - j + Lk - Lq``. Else None (no per-distance table).
        No host sync for defaulted positions. Computed once per call."""
        if self._delta is _UNSET:
            self._delta = self._distance_delta()
        return self._delta  # type: ignore[return-value]

    def _distance_delta(self) -> int | None:
        enc = self.encoding
        if enc is None or self.ctx is None or not enc.has_bias or self.positions is None:
            return None
        q_span, k_span = self.positions.q.span, self.positions.k.span
        if q_span is None or k_span is None:
            return None
        if not enc.is_distance_only(self.ctx):
            return None
        return (q_span.start - k_span.start) - (self.k.shape[2] - self.q.shape[2])

    def distance_table(self, causal: bool) -> Tensor | None:
        """The per-distance bias table ``(H, Lq + Lk - 1)`` if this call's bias has one (see
        ``distance_delta``), else None. Entry ``t`` holds the bias at index distance
        ``i - j = t - (Lk - 1)`` (``-inf`` for keys in the future if ``causal``)."""
        delta = self.distance_delta()
        if delta is None:
            return None
        enc = self.encoding
        assert enc is not None
        Lq, Lk, dev = self.q.shape[2], self.k.shape[2], self.q.device

        def compute() -> Tensor:
            table = enc.distance_table(1 - Lq + delta, Lk - 1 + delta, dev)
            if causal:
                future = torch.arange(Lq + Lk - 1, device=dev) < Lq - 1
                table = table.masked_fill(future, float("-inf"))
            return table

        # the same table for every call of these lengths while the encoding is unchanged
        key = ("distance_table", Lq, Lk, delta, causal, dev)
        return frozen_cache.cached(enc, key, compute, self.encoding_state())

    def bias_block(self, i: Tensor, j: Tensor) -> Tensor:
        """The encoding's bias over query indices ``i (T,)`` and key indices ``j (S,)``:
        ``(B|1, H, T, S)``."""
        assert self.encoding is not None and self.ctx is not None
        return self.encoding.bias(self.bias_context(i, j), *self.index_grids(i, j))

    def bias_context(self, i: Tensor, j: Tensor) -> BiasContext:
        """The context the encoding's ``bias`` reads over query indices ``i (T,)`` and key
        indices ``j (S,)`` (``Encoding.block_context``: per-block precomputation)."""
        assert self.encoding is not None and self.ctx is not None
        return self.encoding.block_context(self.ctx, i, j)

    def allowed_block(self, q_start: int, q_end: int, k_end: int, k_start: int = 0) -> Tensor:
        """``mask_mod`` over query rows ``q_start:q_end`` and keys ``k_start:k_end``: bool,
        broadcastable to ``(B, H, T, S)``. Queries are passed in key coordinates
        (``i + Lk - Lq``, aligned bottom-right like ``causal``)."""
        assert self.mask_mod is not None
        dev = self.q.device
        B, H = self.q.shape[:2]
        b = torch.arange(B, device=dev)[:, None, None, None]
        h = torch.arange(H, device=dev)[None, :, None, None]
        i = torch.arange(q_start, q_end, device=dev)[None, None, :, None] + self.causal_offset
        j = torch.arange(k_start, k_end, device=dev)[None, None, None, :]
        out = self.mask_mod(b, h, i, j)
        if not isinstance(out, Tensor) or out.dtype != torch.bool:
            raise TypeError(
                "mask_mod(b, h, q_idx, kv_idx) must return a bool tensor (True = attend), got "
                f"{out.dtype if isinstance(out, Tensor) else type(out).__name__}"
            )
        try:
            torch.broadcast_shapes(out.shape, (B, H, q_end - q_start, k_end - k_start))
        except RuntimeError:
            raise ValueError(
                f"mask_mod must return a mask broadcastable to (B, H, T, S) = "
                f"{(B, H, q_end - q_start, k_end - k_start)} for index tensors of those shapes, "
                f"got "
                f"{tuple(out.shape)}"
            ) from None
        return out

    def mask_block(
        self, q_start: int, q_end: int, k_end: int, dtype: torch.dtype, k_start: int = 0
    ) -> Tensor | None:
        """Additive float mask (0 / -inf) for the query rows ``q_start:q_end`` and keys
        ``k_start:k_end``, combining ``causal``, the user ``mask`` and ``mask_mod``; None when
        nothing is masked."""
        out = None
        dev = self.q.device
        if self.causal:
            i = torch.arange(q_start, q_end, device=dev)[:, None] + self.causal_offset
            j = torch.arange(k_start, k_end, device=dev)[None, :]
            out = torch.zeros((), dtype=dtype, device=dev).masked_fill(j > i, float("-inf"))
        if self.mask is not None:
            m = self.mask[..., q_start:q_end, k_start:k_end]
            if m.dtype == torch.bool:
                m = torch.zeros((), dtype=dtype, device=dev).masked_fill(~m, float("-inf"))
            else:
                m = m.to(dtype)
            out = m if out is None else out + m
        if self.mask_mod is not None:
            m = torch.zeros((), dtype=dtype, device=dev).masked_fill(
                ~self.allowed_block(q_start, q_end, k_end, k_start), float("-inf")
            )
            out = m if out is None else out + m
        return out


def _check_qkv(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"q, k, v must share the batch size B, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
        )
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(
            f"k and v must have the same heads and length, got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[1] == 0 or t.shape[3] == 0:
            raise ValueError(
                f"{name} must have at least one head and a head_dim >= 1: shape (B, H, L, D) "
                f"with H >= 1 and D >= 1, got {tuple(t.shape)}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim D, got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"the query head count ({q.shape[1]}) must be a multiple of the key/value head count "
            f"({k.shape[1]}) for grouped-query attention"
        )


def _check_mask(
    mask: object, shape: tuple[int, int, int, int], device: torch.device | None = None
) -> Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be bool (True = attend) or float (additive), got {mask.dtype}")
    if device is not None and mask.device != device:
        raise ValueError(f"mask must be on the device of q ({device}), got {mask.device}")
    if mask.dim() > 4:
        raise ValueError(
            f"mask must broadcast to (B, H, Lq, Lk) = {shape}, got {tuple(mask.shape)}"
        )
    try:
        return (
            mask.expand(shape)
            if mask.dim() == 4
            else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(shape)
        )
    except RuntimeError:
        raise ValueError(
            f"mask must broadcast to (B, H, Lq, Lk) = {shape}, got {tuple(mask.shape)}"
        ) from None


def check_softcap(softcap: object) -> float | None:
    """``softcap`` (a finite float > 0, or None) as a float."""
    if softcap is None:
        return None
    return check_float(
        softcap, "softcap (the logit cap c of c * tanh(logits / c), or None)", above=0.0
    )


def check_sinks(sinks: object, heads: int, device: torch.device) -> Tensor | None:
    """``sinks``: None, or one finite logit per query head, a float tensor ``(H,)`` on the
    device of q."""
    if sinks is None:
        return None
    form = f"a float tensor of shape (H,) = ({heads},): one sink logit per query head"
    if not isinstance(sinks, Tensor):
        raise TypeError(f"sinks must be {form}, or None; got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be {form}; got dtype {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must be {form}; got shape {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks must be on the device of q ({device}), got {sinks.device}")
    if not bool(torch.isfinite(sinks.detach()).all()):
        raise ValueError(f"sinks must be finite ({form}); got {sinks.detach().tolist()}")
    return sinks


def _check_inputs(encoding: Encoding | None, inputs: object) -> dict[str, Tensor]:
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs must be a dict of tensors or None, got {type(inputs).__name__}")
    if encoding is None:
        if inputs:
            raise ValueError("inputs are read by an encoding; got inputs but encoding=None")
        return inputs
    known = {**encoding.required_inputs, **encoding.optional_inputs}
    if encoding.needs_inputs and not inputs:
        expected = ", ".join(f"{n!r}: {f}" for n, f in known.items())
        raise ValueError(
            f"encoding {encoding.name!r} needs per-call inputs: pass "
            f"relpos.attention(..., inputs={{...}}) with one of {expected}"
        )
    for name, form in encoding.required_inputs.items():
        if name not in inputs:
            raise ValueError(
                f"encoding {encoding.name!r} needs inputs={{{name!r}: {form}}} "
                f"(relpos.attention(..., inputs=...))"
            )
    for name, value in inputs.items():
        if name not in known:
            expected = ", ".join(f"{n!r}: {f}" for n, f in known.items()) or "none"
            raise ValueError(
                f"encoding {encoding.name!r} does not read inputs[{name!r}]; it reads: {expected}"
            )
        if not isinstance(value, Tensor):
            raise TypeError(
                f"inputs[{name!r}] must be a torch.Tensor ({known[name]}), "
                f"got {type(value).__name__}"
            )
    return inputs


def _rotate(
    encoding: Encoding,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    qp: Tensor,
    kp: Tensor,
    state: object = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The encoding's rotations of queries, keys and values (the one place that rotates);
    ``state`` (``prepare_rotary``) is passed only when there is one."""
    if state is None:
        q, k = encoding.rotate_qk(q, k, qp, kp)
        return q, k, encoding.rotate(v, kp, "v")
    q, k = encoding.rotate_qk(q, k, qp, kp, state)
    return q, k, encoding.rotate(v, kp, "v", state)


def prepare_call(
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
    check_causal: bool = True,
    inputs: dict[str, Tensor] | None = None,
    mask_mod: MaskMod | None = None,
    cache: KeyValueCache | None = None,
    rotate: bool = True,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> AttentionCall:
    """Validate the arguments of ``relpos.attention``, normalise positions and rotate q, k
    (and v, if the encoding asks).

    ``rotate=False`` leaves q, k, v unrotated (and a cache stores raw keys): the ``linear``
    backend rotates the feature maps of q and k itself (RoFormer's linear form).
    ``cache`` (KV-cache decoding, e.g. ``relpos.nn.LayerCache``): ``k``, ``v`` and ``k_pos``
    are the new tokens' (default positions ``cache.length ..``); they are appended to the
    cache and the queries attend to all cached keys. Encodings whose key rotation never
    depends on the other positions (``cache_rotated_keys``) have the new keys stored rotated;
    the others store raw keys and the whole cache is rotated on every call.
    ``check_causal=False`` (``relpos.scores``: logits before any mask) lets causal-only
    encodings be inspected without a causal mask. ``softcap`` and ``sinks``: see
    ``relpos.attention``.
    """
    _check_qkv(q, k, v)
    softcap = check_softcap(softcap)
    sinks = check_sinks(sinks, q.shape[1], q.device)
    if encoding is not None and not isinstance(encoding, Encoding):
        raise TypeError(
            f"encoding must be a relpos.Encoding (see relpos.create) or None, "
            f"got {type(encoding).__name__}"
        )
    B, H, Lq, D = q.shape
    cached = 0 if cache is None else cache.length
    Lnew = k.shape[2]
    Lk = cached + Lnew
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if encoding is not None and q.device.type == "meta":
        raise ValueError(
            "q, k, v are on the meta device: relpos encodings compute positions and tables from "
            "real values, so only encoding=None runs on meta tensors (shape inference through "
            "SDPA); pass tensors on a real device"
        )
    if scale is None:
        scale = encoding.default_scale(D) if isinstance(encoding, Encoding) else 1 / math.sqrt(D)
    else:
        # SDPA takes any float but gives NaN for inf and silently 0 for NaN; a zero or negative
        # temperature has no meaning next to a positional bias added after scaling
        scale = check_float(scale, "scale (a logit scale, or None for 1/sqrt(D))", above=0.0)
    mask = _check_mask(mask, (B, H, Lq, Lk), q.device)
    if mask_mod is not None and not callable(mask_mod):
        raise TypeError(
            f"mask_mod must be a callable mask_mod(b, h, q_idx, kv_idx) -> bool tensor or None, "
            f"got {type(mask_mod).__name__}"
        )
    dims = encoding.dims if encoding is not None else 1
    continuous = encoding.continuous if encoding is not None else True
    common = dict(batch=B, dims=dims, continuous=continuous, device=q.device)
    qp = _positions(q_pos, "q_pos", Lq, Lk - Lq, **common)
    kp = _positions(k_pos, "k_pos", Lnew, cached, **common)
    ctx = None
    pieces = None
    selection = None
    if encoding is not None:
        if encoding.num_heads != H:
            raise ValueError(
                f"q has {H} heads but encoding {encoding.name!r} was created with "
                f"num_heads={encoding.num_heads}"
            )
        if check_causal and encoding.causal_only and not causal and Lq > 1:
            raise ValueError(
                f"encoding {encoding.name!r} is causal-only (meant for causal attention only, "
                f"see its docstring); pass causal=True"
            )
        encoding.check_positions(qp.tensor, "q_pos")
        encoding.check_positions(kp.tensor, "k_pos")
    inputs = _check_inputs(encoding, inputs)
    # per-call rotation state (camera frames), from the new tokens' positions and inputs:
    # with a KV cache the new keys are rotated once and cached rotated
    state = None
    if encoding is not None and encoding.has_rotary:
        state = encoding.prepare_rotary(qp.tensor, kp.tensor, inputs)
    grouped = isinstance(state, QueryGroups)
    if grouped and cache is not None:
        assert encoding is not None
        raise ValueError(
            f"encoding {encoding.name!r} encodes the keys in each query's frame (query-grouped): "
            f"a KV cache of rotated or raw keys cannot serve it; call without cache"
        )
    if cache is not None and encoding is not None and encoding.mixes_tokens:
        raise ValueError(
            f"encoding {encoding.name!r} rotates each token with the features of the other "
            f"tokens of the call (mixes_tokens: a walk transport over a graph), so cached keys "
            f"would change with every new token and a decoding step lacks the other queries; "
            f"call without cache"
        )
    rotated = False
    past_queries = None
    if cache is not None and encoding is not None and encoding.reads_past_queries:
        # schedules that read earlier tokens' raw queries (LongHeads' chunk features)
        append_queries = getattr(cache, "append_queries", None)
        if append_queries is None:
            raise TypeError(
                f"encoding {encoding.name!r} reads the queries of earlier tokens: the cache must "
                f"keep them (append_queries(q) -> earlier queries or None, as "
                f"relpos.nn.LayerCache)"
            )
        past_queries = append_queries(q)
    if cache is not None:
        rotated = (
            rotate
            and encoding is not None
            and encoding.has_rotary
            and encoding.cache_rotated_keys
            and not encoding.piecewise
        )
        if rotated:
            assert encoding is not None
            q, k, v = _rotate(encoding, q, k, v, qp.tensor, kp.tensor, state)
        cache.rotated = rotated
        k, v, k_all = cache.append(k, v, kp.tensor)
        kp = Positions(k_all)
    positions = CallPositions(qp, kp)
    # An empty call (Lq = 0 or Lk = 0) is validated but not encoded: its output is empty or
    # zeros whatever the rotations and biases are, and the backends return it without them
    # (dense.empty_attention). Encodings need not handle empty positions (xPos centres its
    # scales on k_pos.min(), graph encodings read the largest node index).
    if encoding is not None and not (Lq == 0 or Lk == 0):
        if encoding.piecewise:
            # the raw q/k/v: selecting schedules (LongHeads, PINE) choose keys or positions
            pieces, selection = encoding.select_pieces(
                q, k, v, qp.tensor, kp.tensor, inputs, past_queries=past_queries
            )
            q, k = pieces[0]
        elif encoding.has_rotary and not rotated and not grouped and rotate:
            q, k, v = _rotate(encoding, q, k, v, qp.tensor, kp.tensor, state)
        if k.shape[1] != v.shape[1]:
            # per-head rotations expand grouped keys to the query heads: values follow
            v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
        if encoding.needs_context:
            ctx = _prepare(encoding, q, k, positions, inputs)
            ctx.scale = float(scale)
            if selection is not None:  # a selecting schedule's per-call layout
                ctx.data = selection
    if encoding is not None and encoding.own_causal_mask:
        causal = False  # validated above; the schedule's piece_index is its causal mask
    return AttentionCall(
        q,
        k,
        v,
        encoding,
        ctx,
        qp.tensor,
        kp.tensor,
        causal,
        mask,
        float(scale),
        pieces,
        mask_mod,
        positions,
        state,
        softcap,
        sinks,
    )


def _positions(pos: Tensor | None, name: str, length: int, offset: int, **common) -> Positions:
    """``pos`` normalised (``normalize_positions``), or the default range from ``offset``."""
    if pos is None:
        return Positions.default(
            length=length, dims=common["dims"], device=common["device"], offset=offset
        )
    return Positions(normalize_positions(pos, name=name, length=length, **common))


def _prepare(
    encoding: Encoding, q: Tensor, k: Tensor, positions: CallPositions, inputs: dict
) -> BiasContext:
    """The encoding's ``prepare`` with the call's position facts (``ctx.positions``).
    Encodings that still override ``prepare`` get the facts after their precomputation."""
    qp, kp = positions.q.tensor, positions.k.tensor
    if type(encoding).prepare is Encoding.prepare:
        return encoding.prepare(q, k, qp, kp, inputs, positions=positions)
    ctx = encoding.prepare(q, k, qp, kp, inputs)
    ctx.positions = positions
    return ctx
