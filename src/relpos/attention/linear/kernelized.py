"""Kernelized attention with a Toeplitz RPE, computed with an FFT (Luo et al. 2021).

Paper: Luo, Li, Cai, Ke, He, Wang, Liu, "Stable, Fast and Accurate: Kernelized Attention with
Relative Positional Encoding", NeurIPS 2021, arXiv 2106.12566. No official code exists; this
follows the paper's math (reconstructed, not checked against code) and is exact for the
kernelized model: tested against the O(L^2) kernelized reference ``kernelized_reference``.

Model. Features ``phi_q (B, H, Lq, m)``, ``phi_k (B, H, Lk, m)`` (``relpos.efficient.
feature_maps``), values ``v (B, H, Lk, Dv)``, and a per-distance log-weight table
``b (H, Lq + Lk - 1)`` — the bias of a distance-only encoding, ``AttentionCall.
distance_table``: entry ``t`` holds the bias at index distance ``i - j = t - (Lk - 1)``,
``-inf`` for masked (future) keys. With ``c = exp(b)``:

    z_i = sum_j c_{ij} (a_i . a'_j) v_j / sum_j c_{ij} (phi_q_i . phi_k_j)

where ``(a, a') = (phi_q, phi_k)``, or the rotated features of RoFormer's linear form
(``relpos.attention.linear.rotary_features``: rotated numerator, unrotated denominator). Each sum
over
``j`` is a Toeplitz mat-vec along the sequence, one per column of ``a'_j (x) v_j`` (``m * Dv``
columns) and of ``phi_k`` (``m`` columns): ``y_i = sum_j c[i - j + Lk - 1] x_j`` is the linear
convolution of the table with ``x``, read at ``i + Lk - 1``, formed by ``rfft``/``irfft`` of
a fast length ``N >= Lq + Lk - 1`` (the rows read receive no wrapped-around term, see
``_toeplitz_last``): O(B H m Dv N log N) time. Columns are
processed in feature chunks (``O(B H N chunk Dv)`` memory, activation checkpointing under
autograd), so the outer products ``phi_k (x) v`` are never held whole.

Without a table (``c = 1``) the sums need no FFT: prefix sums (causal, a chunked scan over the
sequence whose carry is the recurrent state ``(S, Z)`` of
``relpos.attention.linear.state.LinearState``) or
one global sum (bidirectional): O(L m Dv).

Stability:

* ``c = exp(b)`` overflows for learnt ``b``: ``z`` is invariant to ``c -> c * e^{-max b}``; the
  table's maximum (per head) is subtracted before ``exp``.
* The FFT's rounding is relative to the largest weight of the whole table; a query row whose
  own largest visible weight is ``e^{-gap}`` times smaller gets a relative error of about
  ``eps * log2(N) * e^{gap}``. ``fft_dtype=None`` computes each row's gap (a sliding-window
  maximum over the table, O(L)) and picks float32 when that bound is below ``FFT_TOLERANCE``
  (and ``N < 2^14``, an 8K rule), else float64; when even float64 cannot resolve a row
  it raises a ``ValueError`` naming the gap (run such a bias on the exact softmax backends, or
  with ``c = 1``). Decaying biases (ALiBi, KERPLE, T5 with small tables, Sandwich) have their
  maximum at distance 0, seen by every row: gap 0.
* Denominators: non-negative features and ``c >= 0`` keep them >= 0; FFT rounding can leave
  ``|den| ~ eps`` where the exact value is 0. Rows that see no key (causal dead rows, every key
  masked) are found structurally (a count of visible keys) and give exactly 0 with zero
  gradients; a row whose exact denominator is 0 (ReLU features) gives 0.
* Padding: keys that a key-padding mask removes have ``phi_k = 0`` (zero rows), not a masked
  logit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ...validation import check_choice

__all__ = [
    "FFT_TOLERANCE",
    "toeplitz_matvec",
    "fft_length",
    "kernelized_attention",
    "kernelized_reference",
    "choose_fft_dtype",
    "row_gaps",
    "geometric_halves",
]

#: the relative error the FFT path must stay under (estimated per row, see module docstring)
FFT_TOLERANCE = 1e-5
#: elements (complex) of one chunk of FFT columns: ``B * H * N * columns``
CHUNK_ELEMENTS = 1 << 23
#: query rows per chunk of the causal scan without a table
SCAN_CHUNK = 128


def fft_length(size: int) -> int:
    """The smallest ``2^a * {1, 3, 5}`` >= ``size`` (fast FFT lengths)."""
    best = 1 << max(0, math.ceil(math.log2(max(size, 1))))
    for odd in (3, 5):
        n = odd << max(0, math.ceil(math.log2(max(size / odd, 1))))
        if size <= n < best:
            best = n
    return best


def _toeplitz_last(table_f: Tensor, x: Tensor, n: int, length_q: int) -> Tensor:
    """``toeplitz_matvec`` with the sequence on the last axis: ``x (..., Lk)``, the table's
    ``rfft`` of length ``n`` given (``(..., n // 2 + 1)``, broadcasting) -> ``(..., Lq)``.

    A circular convolution of length ``n >= Lq + Lk - 1`` is enough: the outputs read,
    ``Lk - 1 .. Lk + Lq - 2``, receive no wrapped-around term (the linear convolution has
    support ``0 .. Lq + 2 Lk - 3`` and ``Lk - 1 + n`` lies beyond it)."""
    Lk = x.shape[-1]
    y = torch.fft.irfft(table_f * torch.fft.rfft(x, n=n), n=n)
    return y[..., Lk - 1 : Lk - 1 + length_q]


def toeplitz_matvec(table: Tensor, x: Tensor, fft_dtype: torch.dtype | None = None) -> Tensor:
    """``y_i = sum_j table[..., i - j + Lk - 1] x_j``: a Toeplitz matrix ``(Lq, Lk)`` given by
    its ``Lq + Lk - 1`` diagonals, times ``x (..., Lk, n)``, by FFT -> ``(..., Lq, n)``.

    ``table (..., Lq + Lk - 1)`` broadcasts against the leading dims of ``x`` (e.g. ``(H, T)``
    against ``(B, H, Lk, n)``); entry ``t`` is the weight at index distance ``i - j = t - (Lk -
    1)``. Computed in ``fft_dtype`` (default: the dtype of ``x``), returned in it."""
    Lk = x.shape[-2]
    T = table.shape[-1]
    Lq = T - Lk + 1
    if Lq < 0:
        raise ValueError(f"table must have Lq + Lk - 1 >= Lk - 1 = {Lk - 1} entries, got {T}")
    dtype = fft_dtype or x.dtype
    n = fft_length(T)
    tf = torch.fft.rfft(table.to(dtype), n=n)[..., None, :]
    return _toeplitz_last(tf, x.to(dtype).transpose(-1, -2), n, Lq).transpose(-1, -2)


def _window_max(table: Tensor, width: int) -> Tensor:
    """Maximum of every window ``table[..., s : s + width]`` (``s = 0 .. T - width``): the
    van Herk / Gil-Werman two-pass trick with cumulative maxima, O(T)."""
    T = table.shape[-1]
    blocks = math.ceil(T / width)
    pad = blocks * width - T
    t = torch.nn.functional.pad(table, (0, pad), value=float("-inf"))
    t = t.reshape(*table.shape[:-1], blocks, width)
    prefix = t.cummax(-1).values.reshape(*table.shape[:-1], -1)
    suffix = t.flip(-1).cummax(-1).values.flip(-1).reshape(*table.shape[:-1], -1)
    s = torch.arange(T - width + 1, device=table.device)
    return torch.maximum(suffix[..., s], prefix[..., s + width - 1])


def row_gaps(table: Tensor, length_k: int) -> Tensor:
    """Per head and query row, ``max(table) - max(row's visible entries)`` in nats: ``(H,
    Lq)`` (``inf`` for rows that see no entry). Row ``i`` reads entries ``i .. i + Lk - 1``."""
    top = table.amax(-1, keepdim=True)
    return top - _window_max(table, length_k)


def choose_fft_dtype(table: Tensor, length_k: int, input_dtype: torch.dtype) -> torch.dtype:
    """The FFT dtype for this table (see the module docstring): float32 when every row's error
    bound ``eps * log2(N) * e^gap`` is below ``FFT_TOLERANCE`` and ``N < 2^14``; else float64;
    ``ValueError`` when float64 cannot resolve some row either."""
    n = fft_length(table.shape[-1])
    gaps = row_gaps(table.detach().double(), length_k)
    finite = gaps[torch.isfinite(gaps)]
    gap = float(finite.max()) if finite.numel() else 0.0

    def bound(dtype: torch.dtype) -> float:
        return torch.finfo(dtype).eps * math.log2(n) * math.exp(min(gap, 700.0))

    if input_dtype != torch.float64 and n < (1 << 14) and bound(torch.float32) <= FFT_TOLERANCE:
        return torch.float32
    if bound(torch.float64) <= FFT_TOLERANCE:
        return torch.float64
    raise ValueError(
        f"kernelized attention with this bias cannot be computed by FFT: some query row's "
        f"largest visible weight is exp(-{gap:.1f}) of the table's largest "
        f"(rounding bound {bound(torch.float64):.1e} > {FFT_TOLERANCE:g} even in float64); "
        "the bias grows toward distances some rows never see. Use softmax attention "
        "(backend 'chunked') or a bias without such a gap"
    )


def _nonzero_ratio(num: Tensor, den: Tensor, alive: Tensor | None) -> Tensor:
    """``num / den`` where the row is alive and ``den > 0``, else exactly 0 (zero gradients)."""
    ok = den > 0
    if alive is not None:
        ok = ok & alive
    safe = torch.where(ok, den, torch.ones_like(den))
    return torch.where(ok[..., None], num / safe[..., None], torch.zeros_like(num))


def _fft_sums(
    table: Tensor,
    aq: Tensor,
    ak: Tensor,
    dq: Tensor,
    dk: Tensor,
    v: Tensor,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Numerator ``(B, H, Lq, Dv)`` and denominator ``(B, H, Lq)`` through the FFT, in feature
    chunks (checkpointed under autograd). ``table`` holds the weights ``c`` (not logs)."""
    B, H, Lk, m = ak.shape
    Lq = aq.shape[2]
    Dv = v.shape[-1]
    n = fft_length(table.shape[-1])
    table_f = torch.fft.rfft(table.to(dtype), n=n)  # (H, n // 2 + 1)
    per_feature = max(1, B * H * n * Dv)
    step = max(1, min(m, CHUNK_ELEMENTS // per_feature))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (table, aq, ak, v))
    v_t = v.to(dtype).transpose(-1, -2)  # (B, H, Dv, Lk): the sequence last for the FFT

    def numerator_chunk(table_f: Tensor, aq_c: Tensor, ak_c: Tensor, v_t: Tensor) -> Tensor:
        x = ak_c.to(dtype).transpose(-1, -2)[..., :, None, :] * v_t[..., None, :, :]
        y = _toeplitz_last(table_f[:, None, None, :], x, n, Lq)  # (B, H, c, Dv, Lq)
        return torch.einsum("bhlm,bhmdl->bhld", aq_c.to(dtype), y)

    num = None
    for s in range(0, m, step):
        args = (table_f, aq[..., s : s + step], ak[..., s : s + step], v_t)
        if grad:
            part = checkpoint(numerator_chunk, *args, use_reentrant=False)
        else:
            part = numerator_chunk(*args)
        num = part if num is None else num + part
    ksum = _toeplitz_last(table_f[:, None, :], dk.to(dtype).transpose(-1, -2), n, Lq)
    den = (dq.to(dtype) * ksum.transpose(-1, -2)).sum(-1)
    assert num is not None
    return num, den


def _causal_sums(
    a_q: Tensor,
    a_k: Tensor,
    x: Tensor,
    init: Tensor | None,
    log_decay: Tensor | None,
    chunk: int = SCAN_CHUNK,
) -> tuple[Tensor, Tensor]:
    """``out_i = sum_{j<=i} g^(i-j) (a_q_i . a_k_j) x_j + g^(i+1) a_q_i . init`` for queries
    aligned with the keys (``a_q (B,H,L,m)``, ``a_k (B,H,L,m)``, ``x (B,H,L,X)``,
    ``init (B,H,m,X)``: sums over earlier keys), with ``g = exp(log_decay) <= 1`` per head
    (``log_decay (H,)``; None: ``g = 1``). Chunks of ``chunk`` rows: an explicit
    lower-triangular product inside a chunk, the carried sums across chunks (a cumulative sum
    for ``g = 1``, a recurrence over chunks otherwise: no ``g^(-j)`` is ever formed, so
    nothing overflows). Returns ``out (B,H,L,X)`` and the sums after the last key
    ``(B,H,m,X)``."""
    B, H, L, m = a_k.shape
    nc = math.ceil(L / chunk) if L else 0
    pad = nc * chunk - L

    def blocks(t: Tensor) -> Tensor:
        return torch.nn.functional.pad(t, (0, 0, 0, pad)).unflatten(2, (nc, chunk))

    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=a_k.device).tril()
    aq_b, ak_b, x_b = blocks(a_q), blocks(a_k), blocks(x)  # (B, H, nc, C, .)
    scores = aq_b @ ak_b.transpose(-1, -2)  # (B, H, nc, C, C)
    if log_decay is None:
        kv = ak_b.transpose(-1, -2) @ x_b  # (B, H, nc, m, X)
        before = kv.cumsum(2) - kv  # exclusive prefix over chunks
        if init is not None:
            before = before + init[:, :, None]
        out = aq_b @ before + scores.masked_fill(~tri, 0.0) @ x_b
        final = kv.sum(2) + (0 if init is None else init)
        return out.flatten(2, 3)[:, :, :L], final
    ld = log_decay.to(a_k.dtype).view(1, H, 1, 1)
    idx = torch.arange(chunk, device=a_k.device, dtype=a_k.dtype)
    lag = (idx[:, None] - idx[None, :]).clamp(min=0)
    within = torch.exp(ld[..., None] * lag).masked_fill(~tri, 0.0)  # (1, H, 1, C, C)
    to_end = torch.exp(ld * (chunk - 1 - idx))[..., None]  # (1, H, 1, C, 1)
    from_start = torch.exp(ld * (idx + 1))[..., None]
    kv = (ak_b * to_end).transpose(-1, -2) @ x_b  # sums at each chunk's last row
    step = torch.exp(ld * chunk)  # (1, H, 1, 1)
    carry = torch.zeros_like(kv[:, :, 0]) if init is None else init
    befores = []
    for c in range(nc):
        befores.append(carry)
        carry = step * carry + kv[:, :, c]
    before = torch.stack(befores, 2) if befores else kv
    out = (aq_b * from_start) @ before + (scores * within) @ x_b
    to_last = torch.exp(ld[..., 0] * (L - 1 - torch.arange(L, device=a_k.device)))[..., None]
    final = (a_k * to_last).transpose(-1, -2) @ x
    if init is not None:
        final = final + init * torch.exp(ld * L)
    return out.flatten(2, 3)[:, :, :L], final


def _scan_sums(
    aq: Tensor,
    ak: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    v: Tensor,
    state: tuple[Tensor, Tensor] | None,
    log_decay: Tensor | None = None,
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
    """Causal numerator ``(B,H,L,Dv)``, denominator ``(B,H,L)`` and final state ``(S, Z)`` for
    queries aligned with the keys, carrying ``state`` (``_causal_sums``). ``dq``/``dk`` None:
    the denominator uses ``aq``/``ak`` (no rotation), through a ones column of ``v``."""
    Dv = v.shape[-1]
    if dq is None:
        x = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        init = None if state is None else torch.cat([state[0], state[1][..., None]], dim=-1)
        out, final = _causal_sums(aq, ak, x, init, log_decay)
        return out[..., :Dv], out[..., Dv], (final[..., :Dv], final[..., Dv])
    assert dk is not None
    num, S = _causal_sums(aq, ak, v, None if state is None else state[0], log_decay)
    ones = torch.ones_like(v[..., :1])
    den, Z = _causal_sums(dq, dk, ones, None if state is None else state[1][..., None], log_decay)
    return num, den[..., 0], (S, Z[..., 0])


def geometric_halves(
    table: Tensor, length_q: int, length_k: int, causal: bool
) -> tuple[Tensor, Tensor | None, Tensor | None] | None:
    """Whether the table's weights decay geometrically on each side of distance 0 (ALiBi):
    ``b(d) = b(0) - s d`` for key-coordinate distances ``d = 0 .. Lk - 1`` and, when not
    causal, ``b(d) = b(-1) - s' (|d| - 1)`` for ``d = -1 .. -(Lq - 1)``, with ``s, s' >= 0``,
    to ``1e-6 (1 + |b|)``. Returns ``(log_decay (H,), log_decay' (H,) | None, log_ratio (H,) |
    None)`` (``-s``, ``-s'``, ``b(-1) - b(0)``) in float64, or None. Needs ``Lq <= Lk`` (and
    ``Lq == Lk`` when not causal)."""
    if length_q > length_k or (not causal and length_q != length_k):
        return None
    t = table.detach().double()

    def slope(b: Tensor) -> Tensor | None:  # b (H, n) along growing |d|
        if not bool(torch.isfinite(b).all()):
            return None
        if b.shape[-1] < 2:
            return torch.zeros(b.shape[0], dtype=b.dtype, device=b.device)
        n = b.shape[-1]
        s = (b[:, 0] - b[:, -1]) / (n - 1)
        fit = b[:, :1] - s[:, None] * torch.arange(n, dtype=b.dtype, device=b.device)
        if bool((s < 0).any()) or bool(((fit - b).abs() > 1e-6 * (1 + b.abs())).any()):
            return None
        return s

    ahead = slope(t[:, length_q - 1 :])
    if ahead is None:
        return None
    if causal:
        return -ahead, None, None
    back = t[:, : length_q - 1].flip(-1)
    behind = slope(back)
    if behind is None:
        return None
    if back.shape[-1] == 0:  # one query: no key after it
        return -ahead, -behind, torch.zeros_like(behind)
    return -ahead, -behind, back[:, 0] - t[:, length_q - 1]


def kernelized_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    table: Tensor | None = None,
    causal: bool = False,
    rotated: tuple[Tensor, Tensor] | None = None,
    key_valid: Tensor | None = None,
    state: tuple[Tensor, Tensor] | None = None,
    fft_dtype: torch.dtype | None = None,
    method: str = "auto",
    log_decay: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """Kernelized attention ``z (B, H, Lq, Dv)`` (see the module docstring) and, for causal
    calls without a table, the final state ``(S (B, H, m, Dv), Z (B, H, m))``.

    Args:
        phi_q: ``(B, H, Lq, m)`` non-negative query features; phi_k: ``(B, H, Lk, m)``.
        v: ``(B, H, Lk, Dv)``.
        table: ``(H, Lq + Lk - 1)`` log weights ``b`` per index distance (``-inf``: masked);
            None for ``c = 1``. Causal calls with a table carry ``-inf`` at future distances
            (``AttentionCall.distance_table(causal=True)``).
        causal: bottom-right aligned causal mask (query ``i`` sees keys ``j <= i + Lk - Lq``).
        rotated: ``(a_q, a_k)`` features for the numerator (RoFormer's linear form); the
            denominator keeps ``phi_q``, ``phi_k``.
        key_valid: ``(B, 1|H, Lk)`` bool, False for padded keys (their features become 0).
        state: causal calls without a table: sums ``(S, Z)`` over earlier keys (decoding).
        fft_dtype: dtype of the FFT (None: ``choose_fft_dtype``).
        method: ``"auto"``: a table that decays geometrically on each side of distance 0
            (ALiBi; ``geometric_halves``) runs as a decayed scan, O(L m Dv), exact and with a
            recurrent state; any other table by FFT. ``"fft"``: always the FFT.
        log_decay: ``(H,)`` the geometric decay of a causal table when the call alone cannot
            show it (decoding one key at a time with ``state``); else read from the table.
    """
    check_choice(method, "method", ("auto", "fft"))
    B, H, Lq, m = phi_q.shape
    Lk = phi_k.shape[2]
    Dv = v.shape[-1]
    work = phi_q.dtype
    v = v.to(work)
    aq, ak = (phi_q, phi_k) if rotated is None else (rotated[0].to(work), rotated[1].to(work))
    dq, dk = phi_q, phi_k
    valid_count = None
    if key_valid is not None:
        kv = key_valid.to(work)[..., None]
        ak, dk = ak * kv, dk * kv
        if rotated is None:
            ak = dk
        valid_count = key_valid.long().cumsum(-1)  # (B, 1|H, Lk)
    off = Lk - Lq
    if table is not None:
        geo = geometric_halves(table, Lq, Lk, causal) if method == "auto" else None
        if geo is not None and log_decay is not None:
            geo = (log_decay.to(geo[0]), None, None)
        if geo is not None:
            return _decay_path(aq, ak, dq, dk, v, geo, causal, state, rotated is not None)
        if state is not None:
            raise ValueError(
                "a decoding state holds sums with c = 1 or a geometric decay (ALiBi); this "
                "table has neither"
            )
        dtype = fft_dtype or choose_fft_dtype(table, Lk, work)
        shift = table.detach().amax(-1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        weights = torch.exp((table - shift).to(dtype))  # (H, T), 0 at -inf
        num, den = _fft_sums(weights, aq, ak, dq, dk, v, dtype)
        alive = _alive(valid_count, B, H, Lq, Lk, causal, table, phi_q.device)
        return _nonzero_ratio(num, den, alive).to(work), None
    if not causal:
        if state is not None:
            raise ValueError("a decoding state is for causal calls")
        S = ak.transpose(-1, -2) @ v  # (B, H, m, Dv)
        num = aq @ S
        den = (dq * dk.sum(-2)[:, :, None, :]).sum(-1)
        return _nonzero_ratio(num, den, None), None
    # causal, c = 1: keys before the first query form the initial state; queries that see
    # no key (Lq > Lk) are dead rows
    dead = max(0, -off)
    pre = max(0, off)
    if pre:
        S_pre = ak[:, :, :pre].transpose(-1, -2) @ v[:, :, :pre]
        Z_pre = dk[:, :, :pre].sum(-2)
        state = (S_pre, Z_pre) if state is None else (state[0] + S_pre, state[1] + Z_pre)
    rot = rotated is not None
    num, den, final = _scan_sums(
        aq[:, :, dead:],
        ak[:, :, pre:],
        dq[:, :, dead:] if rot else None,
        dk[:, :, pre:] if rot else None,
        v[:, :, pre:],
        state,
    )
    # exact sums of non-negative terms: a row that sees no key has den == 0 exactly
    out = _nonzero_ratio(num, den, None)
    if dead:
        out = torch.cat([out.new_zeros(B, H, dead, Dv), out], dim=2)
    return out, final


def _decay_path(
    aq: Tensor,
    ak: Tensor,
    dq: Tensor,
    dk: Tensor,
    v: Tensor,
    geo: tuple[Tensor, Tensor | None, Tensor | None],
    causal: bool,
    state: tuple[Tensor, Tensor] | None,
    rotated: bool,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """A geometric table (``geometric_halves``): weights ``g^d`` relative to distance 0 for
    keys at or before the query, by a decayed causal scan (queries padded in front to the
    keys); when not causal plus ``e^(b(-1) - b(0)) g'^(j - i - 1)`` for the keys after it, by
    the same scan over the reversed sequence with the keys shifted by one (strictly after:
    no subtraction of the diagonal). ``Lq <= Lk`` (``Lq == Lk`` when not causal)."""
    ahead, behind, ratio = geo
    Lq, Lk = aq.shape[2], ak.shape[2]
    pre = Lk - Lq

    def front(x: Tensor) -> Tensor:
        return torch.nn.functional.pad(x, (0, 0, pre, 0))

    num, den, final = _scan_sums(
        front(aq),
        ak,
        front(dq) if rotated else None,
        dk if rotated else None,
        v,
        state,
        ahead,
    )
    num, den = num[:, :, pre:], den[:, :, pre:]
    if causal:
        return _nonzero_ratio(num, den, None), final
    assert behind is not None and ratio is not None

    def after(x: Tensor) -> Tensor:  # key j + 1 at row j, reversed
        return torch.nn.functional.pad(x[:, :, 1:], (0, 0, 0, 1)).flip(2)

    nb, db, _ = _scan_sums(
        aq.flip(2),
        after(ak),
        dq.flip(2) if rotated else None,
        after(dk) if rotated else None,
        after(v),
        None,
        behind,
    )
    top = ratio.clamp(min=0)  # weights relative to the larger side: nothing overflows
    w_ahead = torch.exp(-top).to(num.dtype).view(1, -1, 1)
    w_behind = torch.exp(ratio - top).to(num.dtype).view(1, -1, 1)
    num = w_ahead[..., None] * num + w_behind[..., None] * nb.flip(2)
    den = w_ahead * den + w_behind * db.flip(2)
    return _nonzero_ratio(num, den, None), None


def _alive(
    valid_count: Tensor | None,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    causal: bool,
    table: Tensor,
    device: torch.device,
) -> Tensor:
    """Rows that see at least one finite-weight, unmasked key: ``(B|1, H, Lq)`` bool."""
    finite = torch.isfinite(table)  # (H, T): row i reads entries i .. i + Lk - 1
    if valid_count is None:
        counts = finite.long().cumsum(-1)
        c = torch.nn.functional.pad(counts, (1, 0))
        i = torch.arange(Lq, device=device)
        return ((c[:, i + Lk] - c[:, i]) > 0)[None]
    # unmasked keys with a finite weight: sum_j valid[j] * finite[i - j + Lk - 1]; ranges
    # only (causal tables are finite on a prefix of keys per row, bidirectional everywhere)
    i = torch.arange(Lq, device=device)
    vc = torch.nn.functional.pad(valid_count, (1, 0))  # (B, 1|H, Lk + 1)
    if causal:
        last = (i + Lk - Lq).clamp(-1, Lk - 1)  # last visible key
        seen = vc[..., last + 1]
    else:
        seen = vc[..., -1:].expand(*vc.shape[:-1], Lq)
    rows_finite = _alive(None, B, H, Lq, Lk, causal, table, device)
    return (seen > 0) & rows_finite


def kernelized_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    table: Tensor | None = None,
    causal: bool = False,
    rotated: tuple[Tensor, Tensor] | None = None,
    key_valid: Tensor | None = None,
) -> Tensor:
    """The O(L^2) definition of ``kernelized_attention`` (tests): ``A = (phi_q phi_k^T) * C``,
    ``z = (A_num v) / (A 1)`` with ``C_ij = exp(table[i - j + Lk - 1])`` (1 without a table),
    the causal and key masks as zeros; rows with no visible key or a zero denominator give 0."""
    B, H, Lq, m = phi_q.shape
    Lk = phi_k.shape[2]
    i = torch.arange(Lq, device=phi_q.device)[:, None]
    j = torch.arange(Lk, device=phi_q.device)[None, :]
    keep = torch.ones(Lq, Lk, dtype=torch.bool, device=phi_q.device)
    if causal:
        keep = j <= i + Lk - Lq
    c = torch.ones(1, Lq, Lk, dtype=phi_q.dtype, device=phi_q.device)
    if table is not None:
        c = torch.exp(table[:, i - j + Lk - 1].to(phi_q.dtype))
    w = c * keep
    if key_valid is not None:
        w = w * key_valid[..., None, :].to(w.dtype)
    den_w = (phi_q @ phi_k.transpose(-1, -2)) * w
    aq, ak = (phi_q, phi_k) if rotated is None else rotated
    num_w = (aq @ ak.transpose(-1, -2)) * w
    num = num_w @ v.to(phi_q.dtype)
    den = den_w.sum(-1)
    alive = (w > 0).any(-1).expand(B, H, Lq)
    return _nonzero_ratio(num, den, alive)
