"""Kernelized attention with a Toeplitz RPE, computed with an FFT (Luo et al. 2021).

Paper: Luo, Li, Cai, Ke, He, Wang, Liu, "Stable, Fast and Accurate: Kernelized Attention with
Relative Positional Encoding", NeurIPS 2021 (seed 2). No official code exists; this follows
the paper's math (efficient.md §1, formulas-bias.md §19, authority C) and is exact for the
kernelized model: tested against the O(L^2) kernelized reference ``kernelized_reference``.

Model. Features ``phi_q (B, H, Lq, m)``, ``phi_k (B, H, Lk, m)`` (``relpos.efficient.
feature_maps``), values ``v (B, H, Lk, Dv)``, and a per-distance log-weight table
``b (H, Lq + Lk - 1)`` — the bias of a distance-only encoding, ``AttentionCall.
distance_table``: entry ``t`` holds the bias at index distance ``i - j = t - (Lk - 1)``,
``-inf`` for masked (future) keys. With ``c = exp(b)``:

    z_i = sum_j c_{ij} (a_i . a'_j) v_j / sum_j c_{ij} (phi_q_i . phi_k_j)

where ``(a, a') = (phi_q, phi_k)``, or the rotated features of RoFormer's linear form
(``relpos.efficient.linear_rope``: rotated numerator, unrotated denominator). Each sum over
``j`` is a Toeplitz mat-vec along the sequence, one per column of ``a'_j (x) v_j`` (``m * Dv``
columns) and of ``phi_k`` (``m`` columns): ``y_i = sum_j c[i - j + Lk - 1] x_j`` is the linear
convolution of the table with ``x``, read at ``i + Lk - 1``, formed by ``rfft``/``irfft`` of
a fast length ``N >= Lq + Lk - 1`` (the rows read receive no wrapped-around term, see
``_toeplitz_last``): O(B H m Dv N log N) time. Columns are
processed in feature chunks (``O(B H N chunk Dv)`` memory, activation checkpointing under
autograd), so the outer products ``phi_k (x) v`` are never held whole.

Without a table (``c = 1``) the sums need no FFT: prefix sums (causal, a chunked scan over the
sequence whose carry is the recurrent state ``(S, Z)`` of ``relpos.efficient.LinearState``) or
one global sum (bidirectional): O(L m Dv).

Stability (the spec's list):

* ``c = exp(b)`` overflows for learnt ``b``: ``z`` is invariant to ``c -> c * e^{-max b}``; the
  table's maximum (per head) is subtracted before ``exp``.
* The FFT's rounding is relative to the largest weight of the whole table; a query row whose
  own largest visible weight is ``e^{-gap}`` times smaller gets a relative error of about
  ``eps * log2(N) * e^{gap}``. ``fft_dtype=None`` computes each row's gap (a sliding-window
  maximum over the table, O(L)) and picks float32 when that bound is below ``FFT_TOLERANCE``
  (and ``N < 2^14``, the spec's 8K rule), else float64; when even float64 cannot resolve a row
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

__all__ = [
    "FFT_TOLERANCE",
    "toeplitz_matvec",
    "fft_length",
    "kernelized_attention",
    "kernelized_reference",
    "choose_fft_dtype",
    "row_gaps",
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


def _scan_sums(
    aq: Tensor,
    ak: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    v: Tensor,
    state: tuple[Tensor, Tensor] | None,
    chunk: int = SCAN_CHUNK,
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
    """Causal sums with ``c = 1`` for queries aligned with the keys (``Lq == Lk``): query ``i``
    sees keys ``0..i`` plus the carried ``state = (S (B,H,m,Dv), Z (B,H,m))``. Chunks of
    ``chunk`` rows: within a chunk an explicit lower-triangular product, across chunks the
    exclusive prefix sum of per-chunk sums. ``dq``/``dk`` None: the denominator uses ``aq``/
    ``ak`` (no rotation). Returns numerator, denominator and the final state."""
    B, H, L, m = ak.shape
    Dv = v.shape[-1]
    rotated = dq is not None
    if not rotated:  # a ones column gives the denominator in the same products
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    nc = math.ceil(L / chunk) if L else 0
    pad = nc * chunk - L

    def blocks(x: Tensor) -> Tensor:
        return torch.nn.functional.pad(x, (0, 0, 0, pad)).unflatten(2, (nc, chunk))

    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=ak.device).tril()
    aq_b, ak_b, v_b = blocks(aq), blocks(ak), blocks(v)  # (B, H, nc, C, .)
    kv = ak_b.transpose(-1, -2) @ v_b  # (B, H, nc, m, Dv(+1))
    before = kv.cumsum(2) - kv  # exclusive prefix over chunks
    S0 = None if state is None else state[0]
    if S0 is not None:
        init = S0 if rotated else torch.cat([S0, state[1][..., None]], dim=-1)
        before = before + init[:, :, None]
    scores = (aq_b @ ak_b.transpose(-1, -2)).masked_fill(~tri, 0.0)
    out = aq_b @ before + scores @ v_b  # (B, H, nc, C, Dv(+1))
    out = out.flatten(2, 3)[:, :, :L]
    total = kv.sum(2) + (0 if S0 is None else init)
    if rotated:
        assert dq is not None and dk is not None
        dq_b, dk_b = blocks(dq), blocks(dk)
        ksum = dk_b.sum(-2)  # (B, H, nc, m)
        kbefore = ksum.cumsum(2) - ksum
        if state is not None:
            kbefore = kbefore + state[1][:, :, None]
        dscores = (dq_b @ dk_b.transpose(-1, -2)).masked_fill(~tri, 0.0)
        den = (dq_b * kbefore[..., None, :]).sum(-1) + dscores.sum(-1)
        den = den.flatten(2, 3)[:, :, :L]
        Z = ksum.sum(2) + (0 if state is None else state[1])
        return out, den, (total, Z)
    return out[..., :Dv], out[..., Dv], (total[..., :Dv], total[..., Dv])


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
    """
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
        if state is not None:
            raise ValueError("a decoding state holds sums with c = 1; it cannot carry a table")
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
