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
* ``"chunked"``: chunks of ``T`` tokens (default 64). Across chunks, a carried state read
  with ``exp(G_i - G_b)`` and built with ``exp(G_b - G_j)`` around the chunk boundary ``b``
  (real part <= 0: nothing overflows). Inside a chunk, ``exp(G_i - G_j)`` is factored as
  ``exp(G_i) exp(-G_j)`` (a matmul) when the chunk's total log-decay is at most
  ``_FACTOR_LIMIT`` (60 in float32, 600 in float64: both factors finite and normal, each
  exact to rounding); a chunk with a stronger decay takes the pairwise exponents in log
  space (``T x T x Dk``, masked before exp) instead. O(L) time.

Numerics: the log-decays and their cumulative sums are float64; magnitudes are evaluated in
float64 and phases from float64 cos/sin (angles as float64 products), each rounded once.
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

from ...validation import check_choice, check_int

__all__ = ["MODES", "LOG_FLOOR", "decayed_recurrence", "working_dtypes"]

MODES = ("chunked", "recurrent", "attention")
LOG_FLOOR = 1000.0
# Elements of one (..., T, T, Dk) or (..., Lq_block, L, Dk) pairwise tensor evaluated at once.
_PAIR_BUDGET = 1 << 22
# Largest total log-decay of a chunk for which exp(G_i) and exp(-G_j) are both finite and
# normal in the working precision (e^60 = 1e26 in float32, e^600 = 4e260 in float64).
_FACTOR_LIMIT = {torch.float32: 60.0, torch.float64: 600.0}
# Elements of a group's largest per-chunk tensor in chunked mode (its working set).
_GROUP_BUDGET = 1 << 20


def working_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) working dtypes for an activation dtype."""
    if dtype == torch.float64:
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


class _Exp:
    """Evaluates ``exp(R + i Phi)`` for float64 exponents, rounded once to the working
    precision: magnitudes ``exp(R)`` in float64; unit phases ``e^{i Phi}`` from float64
    cos/sin, formed once per token and combined by products and conjugates (``e^{i(a-b)} =
    e^{ia} conj(e^{ib})``), so no angle is rounded before its cos/sin."""

    def __init__(self, real_dtype: torch.dtype, complex_dtype: torch.dtype | None) -> None:
        self.real_dtype, self.complex_dtype = real_dtype, complex_dtype

    def magnitude(self, R: Tensor) -> Tensor:
        return torch.exp(R).to(self.real_dtype)

    def phase(self, Phi: Tensor | None) -> Tensor | None:
        if Phi is None:
            return None
        return torch.complex(torch.cos(Phi).to(self.real_dtype), torch.sin(Phi).to(self.real_dtype))

    def __call__(self, R: Tensor, P: Tensor | None = None, *, conj: bool = False) -> Tensor:
        """``exp(R) * P`` (``P`` a unit phase or None; ``conj``: its conjugate)."""
        m = self.magnitude(R)
        if P is None:
            return m
        return m * (P.conj() if conj else P)

    def masked(self, R: Tensor, Phi: Tensor | None, keep: Tensor) -> Tensor:
        """``exp(R + i Phi)`` where ``keep``, exactly 0 elsewhere (masked before exp)."""
        m = torch.exp(torch.where(keep, R, -math.inf)).to(self.real_dtype)
        if Phi is None:
            return m
        return m * self.phase(torch.where(keep, Phi, 0.0))


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
    if not isinstance(g, Tensor) or g.shape != q.shape:
        raise ValueError(
            f"the log-decay must be a tensor of the shape of q {tuple(q.shape)}, "
            f"got {tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__}"
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
    chunk_size: int = 64,
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
    is_complex = g.is_complex() or (state is not None and state.is_complex())
    dtype = complex_dtype if is_complex else real_dtype
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    q, k, v = (t.to(real_dtype) for t in (q, k, v))
    if state is None:
        S = torch.zeros(B, H, Dk, Dv, dtype=dtype, device=q.device)
    else:
        S = state.to(dtype)
    if L == 0:
        return torch.zeros(B, H, 0, Dv, dtype=dtype, device=q.device), S
    R = (g.real if g.is_complex() else g).to(torch.float64)
    if bool((~(R <= 0)).any()):
        raise ValueError("the log-decay's real part must be <= 0 (|a| <= 1) and not NaN")
    R = R.clamp(min=-LOG_FLOOR)
    Phi = g.imag.to(torch.float64) if g.is_complex() else None
    if Phi is None and is_complex:
        Phi = torch.zeros_like(R)
    ex = _Exp(real_dtype, complex_dtype if is_complex else None)
    if mode == "recurrent":
        return _recurrent(q, k, v, R, Phi, S, ex, dtype)
    if mode == "attention":
        return _attention(q, k, v, R, Phi, S, ex, dtype)
    return _chunked(q, k, v, R, Phi, S, chunk_size, ex, dtype)


def _cumsum(x: Tensor | None, dim: int) -> Tensor | None:
    return None if x is None else torch.cumsum(x, dim=dim)


def _recurrent(q, k, v, R, Phi, S, ex, dtype):
    decay = ex(R, ex.phase(Phi))  # a_t (B, H, L, Dk)
    ys = []
    for t in range(q.shape[2]):
        S = decay[:, :, t, :, None] * S + (k[:, :, t, :, None] * v[:, :, t, None, :]).to(dtype)
        ys.append(torch.einsum("bhd,bhde->bhe", q[:, :, t].to(dtype), S))
    return torch.stack(ys, dim=2), S


def _attention(q, k, v, R, Phi, S0, ex, dtype):
    B, H, L, Dk = q.shape
    GR, GP = _cumsum(R, 2), _cumsum(Phi, 2)  # float64: G_i = Σ_{l<=i} g_l
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    rows = max(1, _PAIR_BUDGET // max(1, B * H * L * Dk))
    j = torch.arange(L, device=q.device)
    P = ex.phase(GP)
    out = []
    for start in range(0, L, rows):
        i = torch.arange(start, min(L, start + rows), device=q.device)
        keep = (j[None, :] <= i[:, None])[None, None, :, :, None]
        dR = GR[:, :, i, None, :] - GR[:, :, None, :, :]  # (B, H, T, L, Dk)
        dP = None if GP is None else GP[:, :, i, None, :] - GP[:, :, None, :, :]
        w = ex.masked(dR, dP, keep)
        scores = torch.einsum("bhtd,bhsd,bhtsd->bhts", qc[:, :, i], kc, w)
        Pi = None if P is None else P[:, :, i]
        y = scores @ vc + (qc[:, :, i] * ex(GR[:, :, i], Pi)) @ S0  # + the initial state
        out.append(y)
    P_last = None if P is None else P[:, :, -1:]
    S = ex(GR[:, :, -1], None if P is None else P[:, :, -1])[..., None] * S0
    if P is None:
        weight = ex(GR[:, :, -1:] - GR)
    else:
        weight = ex(GR[:, :, -1:] - GR) * (P_last * P.conj())
    S = S + (kc * weight).transpose(-1, -2) @ vc
    return torch.cat(out, dim=2), S


def _chunked(q, k, v, R, Phi, S, T, ex, dtype):
    """Chunks of T tokens, evaluated in groups of chunks (a bounded working set: time
    linear in L), the state carried from group to group."""
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-L) % T
    if pad:  # padded steps: no key, no decay (g = 0), outputs dropped
        q, k, v, R = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v, R))
        Phi = None if Phi is None else torch.nn.functional.pad(Phi, (0, 0, 0, pad))
    C = (L + pad) // T
    shape = (B, H, C, T)
    q, k, v, R = (t.reshape(*shape, t.shape[-1]) for t in (q, k, v, R))
    Phi = None if Phi is None else Phi.reshape(*shape, Dk)
    group = max(1, _GROUP_BUDGET // max(1, B * H * T * max(T, Dk, Dv)))
    tri = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    out = []
    for c0 in range(0, C, group):
        c = slice(c0, min(C, c0 + group))
        Pc = None if Phi is None else Phi[:, :, c]
        y, S = _chunk_group(q[:, :, c], k[:, :, c], v[:, :, c], R[:, :, c], Pc, S, tri, ex, dtype)
        out.append(y)
    return torch.cat(out, dim=2).reshape(B, H, C * T, Dv)[:, :, :L], S


def _chunk_group(q, k, v, R, Phi, S, tri, ex, dtype):
    """One group of chunks ``(B, H, c, T, .)`` entering with state ``S``."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    GR = torch.cumsum(R, dim=3)  # float64, local to each chunk
    GP = None if Phi is None else torch.cumsum(Phi, dim=3)
    P = ex.phase(GP)  # e^{i Phi_i}, (B, H, c, T, Dk)
    R_end = GR[:, :, :, -1:]  # (B, H, c, 1, Dk)
    P_end = None if P is None else P[:, :, :, -1:]
    limit = _FACTOR_LIMIT[ex.real_dtype]
    safe = -R_end[:, :, :, 0].amin(-1) <= limit  # (B, H, c)
    decay_in = ex(GR, P)  # exp(G_i - G_b), |.| <= 1: reads the state entering the chunk
    # Intra-chunk scores. Where the chunk's total decay is at most `limit`, factor
    # exp(G_i - G_j) = exp(G_i) exp(-G_j): both finite and normal, each exact to rounding,
    # and the product is a matmul. Elsewhere, the pairwise exponents (masked before exp).
    all_safe = bool(safe.all())
    GR_safe = GR if all_safe else GR.clamp(min=-limit)
    q_f = q * decay_in if all_safe else q * ex(GR_safe, P)
    scores = q_f @ (k * ex(-GR_safe, P, conj=True)).transpose(-1, -2)
    if not all_safe:
        idx = (~safe).nonzero(as_tuple=True)
        Ru = GR[idx]  # (N, T, Dk)
        Pu = None if GP is None else GP[idx][:, :, None, :] - GP[idx][:, None, :, :]
        w = ex.masked(Ru[:, :, None, :] - Ru[:, None, :, :], Pu, tri[:, :, None])
        exact = torch.einsum("nid,njd,nijd->nij", q[idx], k[idx], w)
        scores = scores.index_put(idx, exact)
    y = torch.where(tri, scores, 0.0) @ v  # (B, H, c, T, Dv)
    # Each chunk's contribution to the state at its end: exp(G_end - G_j), |.| <= 1.
    weight = ex(R_end - GR) if P is None else ex(R_end - GR) * (P_end * P.conj())
    U = (k * weight).transpose(-1, -2) @ v  # (B, H, c, Dk, Dv)
    A = ex(R_end[:, :, :, 0], None if P is None else P_end[:, :, :, 0])[..., None]
    starts = []
    for n in range(U.shape[2]):  # the state entering each chunk (sequential over chunks)
        starts.append(S)
        S = A[:, :, n] * S + U[:, :, n]
    y = y + (q * decay_in) @ torch.stack(starts, dim=2)
    return y, S
