"""The decayed linear recurrence shared by GateLoop and LightNet, in three exact modes.

Per batch row and head, with a per-channel decay ``a_t = exp(g_t)`` (``g`` real, or complex
``log|a| + i*phase``):

    S_t = a_t ⊙ S_{t-1} + k_t v_tᵀ          S_t: (Dk, Dv), a_t broadcast over Dv
    y_t = q_tᵀ S_t

which unrolls into the *surrogate attention*

    y_i = Σ_{j≤i} Σ_d q_{id} k_{jd} exp(G_{id} - G_{jd}) v_j  (+ Σ_d q_{id} exp(G_{id}) S_{-1,d})
    G_i = Σ_{l≤i} g_l                                          (the product Π_{l=j+1}^{i} a_l)

Modes (all exact; they agree to rounding):

* ``"recurrent"``: the loop over t; O(1) work per token, used for decoding.
* ``"attention"``: the quadratic surrogate attention in log space. The exponent
  ``G_i - G_j`` is masked to ``j ≤ i`` *before* ``exp``; the cumulative sums are float64.
  Never ``cumprod(a)`` times ``1/cumprod(a)``: that underflows (0.5^2000 = 0, then 1/0).
* ``"chunked"``: chunks of ``T`` tokens. Inside a chunk, the pairwise exponents in log space
  (``T x T x Dk``); across chunks, a carried state. Every exponential it forms has a
  non-positive real part (``G_i - G_b`` and ``G_b - G_j`` around a chunk boundary ``b``), so
  nothing overflows and the product underflows only where the true weight does. O(L) time,
  O(T^2 Dk + Dk Dv) memory per batch row and head for each group of chunks it evaluates.

Numerics: the log-decays and their cumulative sums are float64 (phases are angles: the
product is formed in float64, reduced mod 2π, then evaluated in the working precision).
Work happens in float32/complex64 for float16, bfloat16 and float32 inputs, in
float64/complex128 for float64. The real part of ``g`` must be ``<= 0`` (|a| <= 1); it is
clipped at ``-LOG_FLOOR`` (exp(-1000) is 0 in float64), so an exact zero gate (``g = -inf``)
gives 0 instead of NaN.

Shapes: q, k ``(B, H, L, Dk)``; v ``(B, H, L, Dv)``; g ``(B, H, L, Dk)``; state
``(B, H, Dk, Dv)``. Returns ``(y (B, H, L, Dv), state (B, H, Dk, Dv))`` in the working
dtype (complex when ``g`` is).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..validation import check_choice, check_int

__all__ = ["MODES", "LOG_FLOOR", "decayed_recurrence", "working_dtypes"]

MODES = ("chunked", "recurrent", "attention")
LOG_FLOOR = 1000.0
_TWO_PI = 2.0 * math.pi
# Elements of one (..., T, T, Dk) or (..., Lq_block, L, Dk) pairwise tensor evaluated at once.
_PAIR_BUDGET = 1 << 22


def working_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) working dtypes for an activation dtype."""
    if dtype == torch.float64:
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


def _exp(log: Tensor, real_dtype: torch.dtype) -> Tensor:
    """``exp(log)`` for a float64 or complex128 exponent, evaluated in the working precision
    (the phase is reduced mod 2π in float64 first)."""
    if not log.is_complex():
        return torch.exp(log.to(real_dtype))
    magnitude = torch.exp(log.real.to(real_dtype))
    angle = torch.remainder(log.imag, _TWO_PI).to(real_dtype)
    return torch.polar(magnitude, angle)


def _masked_exp(log: Tensor, keep: Tensor, real_dtype: torch.dtype) -> Tensor:
    """``exp(log)`` where ``keep``, exactly 0 elsewhere; the exponent is masked before exp."""
    if not log.is_complex():
        return torch.exp(torch.where(keep, log, -math.inf).to(real_dtype))
    magnitude = torch.exp(torch.where(keep, log.real, -math.inf).to(real_dtype))
    angle = torch.where(keep, torch.remainder(log.imag, _TWO_PI), 0.0).to(real_dtype)
    return torch.polar(magnitude, angle)


def _log_decay(g: Tensor) -> Tensor:
    """The float64 (complex128) log-decay with its real part clipped at ``-LOG_FLOOR``."""
    if g.is_complex():
        g = g.to(torch.complex128)
        return torch.complex(g.real.clamp(min=-LOG_FLOOR), g.imag)
    return g.to(torch.float64).clamp(min=-LOG_FLOOR)


def _check(q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (B, H, L, D)")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape (B, H, L, Dv) with (B, H, L) = {tuple(q.shape[:3])}, "
            f"got {tuple(v.shape)}"
        )
    if g.shape != q.shape:
        raise ValueError(
            f"the log-decay must have the shape of q {tuple(q.shape)}, got {tuple(g.shape)}"
        )
    if state is not None:
        expected = (*q.shape[:2], q.shape[3], v.shape[3])
        if not isinstance(state, Tensor):
            raise TypeError(f"state must be a tensor of shape {expected} or None")
        if tuple(state.shape) != expected:
            raise ValueError(f"state must have shape {expected}, got {tuple(state.shape)}")


def decayed_recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    mode: str = "chunked",
    chunk_size: int = 16,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``S_t = exp(g_t) ⊙ S_{t-1} + k_t v_tᵀ``, ``y_t = q_tᵀ S_t`` (see the module docstring).

    ``g`` real or complex ``(B, H, L, Dk)`` with real part <= 0; ``state`` the ``S_{-1}`` of
    a previous call (None: zeros). Returns ``(y, final_state)`` in the working dtype.
    """
    check_choice(mode, "mode", MODES)
    chunk_size = check_int(chunk_size, "chunk_size")
    _check(q, k, v, g, state)
    real_dtype, complex_dtype = working_dtypes(q.dtype)
    dtype = (
        complex_dtype
        if (g.is_complex() or (state is not None and state.is_complex()))
        else real_dtype
    )
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    q, k, v = (t.to(real_dtype) for t in (q, k, v))
    S = (
        torch.zeros(B, H, Dk, Dv, dtype=dtype, device=q.device)
        if state is None
        else state.to(dtype)
    )
    if L == 0:
        return torch.zeros(B, H, 0, Dv, dtype=dtype, device=q.device), S
    real = g.real if g.is_complex() else g
    if bool((~(real <= 0)).any()):
        raise ValueError("the log-decay's real part must be <= 0 (|a| <= 1) and not NaN")
    g = _log_decay(g)
    if mode == "recurrent":
        return _recurrent(q, k, v, g, S, real_dtype, dtype)
    if mode == "attention":
        return _attention(q, k, v, g, S, real_dtype, dtype)
    return _chunked(q, k, v, g, S, chunk_size, real_dtype, dtype)


def _recurrent(q, k, v, g, S, real_dtype, dtype):
    decay = _exp(g, real_dtype)  # (B, H, L, Dk)
    ys = []
    for t in range(q.shape[2]):
        S = decay[:, :, t, :, None] * S + (k[:, :, t, :, None] * v[:, :, t, None, :]).to(dtype)
        ys.append(torch.einsum("bhd,bhde->bhe", q[:, :, t].to(dtype), S))
    return torch.stack(ys, dim=2), S


def _attention(q, k, v, g, S0, real_dtype, dtype):
    B, H, L, Dk = q.shape
    G = torch.cumsum(g, dim=2)  # float64: G_i = Σ_{l<=i} g_l
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    rows = max(1, _PAIR_BUDGET // max(1, B * H * L * Dk))
    j = torch.arange(L, device=q.device)
    out = []
    for start in range(0, L, rows):
        i = torch.arange(start, min(L, start + rows), device=q.device)
        keep = (j[None, :] <= i[:, None])[None, None, :, :, None]
        log = G[:, :, i, None, :] - G[:, :, None, :, :]  # (B, H, T, L, Dk)
        w = _masked_exp(log, keep, real_dtype)
        scores = torch.einsum("bhtd,bhsd,bhtsd->bhts", qc[:, :, i], kc, w)
        y = scores @ vc
        y = y + (qc[:, :, i] * _exp(G[:, :, i], real_dtype)) @ S0  # the initial state
        out.append(y)
    last = G[:, :, -1:]
    S = _exp(last[:, :, 0], real_dtype)[..., None] * S0
    S = S + (kc * _exp(last - G, real_dtype)).transpose(-1, -2) @ vc
    return torch.cat(out, dim=2), S


def _chunked(q, k, v, g, S, T, real_dtype, dtype):
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-L) % T
    if pad:  # padded steps: no key, no decay (g = 0), outputs dropped
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g = torch.nn.functional.pad(g, (0, 0, 0, pad))
    C = (L + pad) // T
    shape = (B, H, C, T)
    q, k, v = (t.reshape(*shape, t.shape[-1]).to(dtype) for t in (q, k, v))
    G = torch.cumsum(g.reshape(*shape, Dk), dim=3)  # float64, local to each chunk
    G_end = G[:, :, :, -1:]  # (B, H, C, 1, Dk)
    tri = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[:, :, None]
    group = max(1, _PAIR_BUDGET // max(1, B * H * T * T * Dk))
    out = []
    for c0 in range(0, C, group):
        c = slice(c0, min(C, c0 + group))
        Gc, Ge = G[:, :, c], G_end[:, :, c]
        qc, kc, vc = q[:, :, c], k[:, :, c], v[:, :, c]
        # Intra-chunk: exp(G_i - G_j) for j <= i, masked before exp.
        w = _masked_exp(Gc[..., :, None, :] - Gc[..., None, :, :], tri, real_dtype)
        scores = torch.einsum("bhcid,bhcjd,bhcijd->bhcij", qc, kc, w)
        y = scores @ vc  # (B, H, c, T, Dv)
        # Each chunk's own contribution to the state at its end: exp(G_end - G_j) <= 1.
        U = (kc * _exp(Ge - Gc, real_dtype)).transpose(-1, -2) @ vc  # (B, H, c, Dk, Dv)
        A = _exp(Ge[:, :, :, 0], real_dtype)[..., None]  # whole-chunk decay (B, H, c, Dk, 1)
        starts = []
        for n in range(U.shape[2]):  # the state entering each chunk (sequential over chunks)
            starts.append(S)
            S = A[:, :, n] * S + U[:, :, n]
        S_in = torch.stack(starts, dim=2)  # (B, H, c, Dk, Dv)
        y = y + (qc * _exp(Gc, real_dtype)) @ S_in  # inter-chunk: exp(G_i - G_b) <= 1
        out.append(y)
    y = torch.cat(out, dim=2).reshape(B, H, C * T, Dv)[:, :, :L]
    return y, S
