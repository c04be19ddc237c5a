"""LightNet: the additive linear recurrence, MD-LRPE and MD-TPE (Qin et al. 2024, "You Only
Scan Once: Efficient Multi-dimension Sequential Modeling with LightNet", arXiv 2405.21022).

The paper itself was not read and the official repository OpenNLPLab/LightNet could not be
fetched; the formulas follow the first author's later ports (Doraemonzzz/xmixers
``lightnet_attention.py``, ``pes/lrpe.py``, ``pes/tpe.py``, ``pes/md/md_tpe.py``;
Doraemonzzz/xopes ``md_lrpe_cosine``).

**Additive recurrence** (``lightnet_scan``). Per channel d, the keys are normalised by their
running log-sum-exp, ``z_t = log(n₀ + Σ_{u≤t} e^{k_u})``, ``k̃_t = exp(k_t - z_t)``, and the
decay is ``f_t = exp(z_{t-1} - z_t)``: the gated recurrence ``S_t = f_t ⊙ S_{t-1} + k̃_t v_tᵀ``,
``o_t = q_tᵀ S_t`` is

    o_t = Σ_d q_{td} Σ_{s≤t} e^{k_{sd}} / (n₀ + Σ_{u≤t} e^{k_{ud}}) · v_s

a softmax over the prefix per channel. ``null_slot=True`` (n₀ = 1) is the port's behaviour:
it seeds the running log-normaliser with 0, not -inf, so every denominator carries an extra
e⁰; ``null_slot=False`` (n₀ = 0) is the pure prefix softmax. Everything is in log space
(``logcumsumexp`` in float64), so keys of any magnitude work where ``exp(k)`` overflows.
``causal=False`` is the multi-dimensional "scan once" form, ``o = qᵀ Σ_s softmax_s(k) v_sᵀ``
over the whole set (order-free: one scan serves any number of axes).

**MD-LRPE** (``md_lrpe``). The cosine ("complex") LRPE map of the port, per axis: the Dk
channels are split into m contiguous groups of ``E = ceil(Dk/m)``; channel c of group a
takes the angle ``θ_{h, c mod E} · p_a``, and ``x -> [x cos(angle), x sin(angle)]`` (2 Dk
channels), so ``q'·k' = Σ_a Σ_{c∈a} q_c k_c cos(θ_c (p_a^q - p_a^k))``: relative along each
axis. The port applies it to ``q`` and to the normalised ``k̃`` (after the log-sum-exp) and
repeats the decay over the two halves; ``lightnet_scan(..., positions=, theta=)`` does the
same. ``lrpe_theta(H, E)`` is the port's type-3 initialisation
``θ = base^(-2 n / (H E))``, ``n = h E + e``.

**MD-TPE** (``tpe_scan`` along one axis; ``relpos.nn.MDTPE`` over all axes). A position-only
linear attention per head with learnt constant ``q_h, k_h`` and decay ``λ_h = σ(·)``:
``o_t = (q_h·k_h) Σ_{s≤t} λ_h^{t-s} v_s`` along the axis (an exponential Toeplitz mixer),
causal in the port; ``causal=False`` (an extension, stated here) uses ``λ^{|t-s|}``.

Shapes: q, k ``(B, H, L, Dk)``, v ``(B, H, L, Dv)``; positions ``(L, m)`` or ``(B, L, m)``;
theta ``(H, E)``.

The layer: ``LightNetAttention`` and ``MDTPE``: LightNet's token mixers for sequences, images and
video (Qin et al. 2024, arXiv 2405.21022; after the author's xmixers port).

``LightNetAttention`` (the port's ``LightNetAttention`` with LRPE on):

    q = silu(W_q x), k = W_k x, v = W_v x               split into H heads
    o = lightnet_scan(q, k, v, positions, theta)        additive recurrence + MD-LRPE
    out = W_o( RMSNorm(o * sigmoid(W_2 W_1 x)) )        low-rank (rank H) output gate

The port's LRPE is a RoPE map on (causal) 1-D text; here MD-LRPE (the cosine map per axis,
``relpos.nn.mixers.lightnet.md_lrpe``) with learnable ``theta (H, E)``: positions ``(L, m)`` give
the
image / video coordinates (``relpos.positions_nd.grid_positions``), default ``0..L-1`` for
text (``axes=1``). ``causal=False`` is the "scan once" whole-set form for images.

``MDTPE`` (the port's ``MdTpe``): per axis of a grid ``x (B, n_1, ..., n_m, dim)``, a TPE
(``relpos.nn.mixers.lightnet.tpe_scan``: ``o_t = (q_h·k_h) Σ_{s≤t} λ_h^{t-s} v_s`` along the axis
with
``v = x``) followed by its own RMSNorm and output projection; the axes' outputs are summed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...validation import check_bool, check_float, check_int
from ..llama import RMSNorm
from .recurrence import decayed_recurrence, working_dtypes

__all__ = ["LightNetState", "lightnet_scan", "lightnet_keys", "md_lrpe", "lrpe_theta", "tpe_scan"]


@dataclass
class LightNetState:
    """What causal LightNet decoding carries: the memory ``S (B, H, Dk', Dv)`` (Dk' = 2 Dk
    with MD-LRPE), the running log-normaliser ``z (B, H, Dk)`` (float64) and the number of
    tokens seen (the next 1-D position)."""

    memory: Tensor
    log_normalizer: Tensor
    length: int


def lightnet_keys(
    k: Tensor, *, null_slot: bool = True, log_normalizer: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The additive normalisation: ``(k̃, log f, z_last)`` for keys ``(B, H, L, Dk)``.

    ``z_t = logaddexp(z_{t-1}, k_t)`` from ``z_{-1}`` = ``log_normalizer`` (a previous call),
    else 0 with the null slot, -inf without; ``k̃_t = exp(k_t - z_t)`` and
    ``log f_t = z_{t-1} - z_t`` (both <= 0). k̃ in the working dtype, log f in float64.
    """
    B, H, L, Dk = k.shape
    if log_normalizer is None:
        start = 0.0 if null_slot else -math.inf
        z_prev = torch.full((B, H, 1, Dk), start, dtype=torch.float64, device=k.device)
    else:
        z_prev = log_normalizer.to(torch.float64)[:, :, None]
    z = torch.logcumsumexp(torch.cat([z_prev, k.to(torch.float64)], dim=2), dim=2)
    log_f = (z[:, :, :-1] - z[:, :, 1:]).clamp(max=0.0)  # <= 0 up to rounding
    k_tilde = torch.exp(k.to(torch.float64) - z[:, :, 1:]).to(working_dtypes(k.dtype)[0])
    return k_tilde, log_f, z[:, :, -1]


def lrpe_theta(num_heads: int, channels: int, base: float = 10000.0) -> Tensor:
    """The port's type-3 LRPE frequencies ``θ[h, e] = base^(-2 (h E + e) / (H E))``, (H, E)."""
    num_heads = check_int(num_heads, "num_heads")
    channels = check_int(channels, "channels")
    base = check_float(base, "base", above=1.0)
    n = torch.arange(num_heads * channels, dtype=torch.float64)
    return (base ** (-2.0 * n / (num_heads * channels))).reshape(num_heads, channels)


def _positions(positions: Tensor, B: int, L: int) -> Tensor:
    """Positions as float64 ``(B or 1, L, m)``."""
    if not isinstance(positions, Tensor):
        raise TypeError("positions must be a tensor of shape (L, m) or (B, L, m)")
    if positions.dim() == 2:
        positions = positions[None]
    if positions.dim() != 3 or positions.shape[1] != L or positions.shape[0] not in (1, B):
        raise ValueError(
            f"positions must have shape (L, m) or (B, L, m) with L = {L}, B = {B}, "
            f"got {tuple(positions.shape)}"
        )
    if positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions must be finite (no NaN or inf)")
    return positions.to(torch.float64)


def md_lrpe(x: Tensor, positions: Tensor, theta: Tensor) -> Tensor:
    """MD-LRPE (cosine map): ``x (B, H, L, D)`` -> ``(B, H, L, 2 D)``.

    ``positions (L, m)`` or ``(B, L, m)`` (coordinates per axis, any real values);
    ``theta (H, E)`` with ``E * m >= D``: channel c uses axis ``c // E`` and frequency
    ``theta[h, c % E]``. Angles are float64 products; the result is in x's dtype (float32
    for half types is not forced: the map is a product by cos/sin in [-1, 1]).
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError("x must be a tensor of shape (B, H, L, D)")
    B, H, L, D = x.shape
    pos = _positions(positions, B, L)
    m = pos.shape[-1]
    if not isinstance(theta, Tensor) or theta.dim() != 2 or theta.shape[0] != H:
        raise ValueError(f"theta must be a tensor of shape (H, E) with H = {H}")
    E = theta.shape[1]
    if E * m < D:
        raise ValueError(f"theta must have E >= ceil(D / m) = {math.ceil(D / m)} columns, got {E}")
    c = torch.arange(D, device=x.device)
    axis, col = c // E, c % E
    # angle[b, h, l, c] = theta[h, c % E] * p[b, l, c // E], formed in float64
    angle = theta.to(torch.float64)[None, :, None, col] * pos[:, None, :, axis]
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    return torch.cat([x * cos, x * sin], dim=-1)


def lightnet_scan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    null_slot: bool = True,
    positions: Tensor | None = None,
    theta: Tensor | None = None,
    mode: str = "chunked",
    chunk_size: int = 64,
    state: LightNetState | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, LightNetState]:
    """LightNet's additive recurrence (optionally with MD-LRPE on q and k̃).

    ``causal=True``: ``o_t = Σ_d q_{td} Σ_{s≤t} e^{k_sd}/(n₀ + Σ_{u≤t} e^{k_ud}) v_s`` in any
    mode of ``decayed_recurrence``; ``state``/``return_state`` carry ``LightNetState`` for
    decoding (O(1) per token with ``mode="recurrent"``). ``causal=False``: the whole-set
    softmax per channel (no state). ``positions``+``theta``: MD-LRPE (both or neither).
    Returns ``o (B, H, L, Dv)`` in q's dtype (and the state).
    """
    causal = check_bool(causal, "causal")
    null_slot = check_bool(null_slot, "null_slot")
    check_bool(return_state, "return_state")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 4:
            raise ValueError(f"{name} must be a floating-point tensor of shape (B, H, L, D)")
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"q, k must be (B, H, L, Dk) and v (B, H, L, Dv), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not bool(torch.isfinite(k).all()):
        raise ValueError("k must be finite (no NaN or inf)")
    if (positions is None) != (theta is None):
        raise ValueError("MD-LRPE needs both positions and theta (or neither)")
    if state is not None and not isinstance(state, LightNetState):
        raise TypeError("state must be a LightNetState or None")
    if not causal and (state is not None or return_state):
        raise ValueError("causal=False has no recurrent state (state / return_state)")
    real_dtype, _ = working_dtypes(q.dtype)
    if not causal:
        return _bidirectional(q, k, v, null_slot, positions, theta).to(q.dtype)
    k_tilde, log_f, z_last = lightnet_keys(
        k, null_slot=null_slot, log_normalizer=None if state is None else state.log_normalizer
    )
    qf = q.to(real_dtype)
    if positions is not None:
        qf, k_tilde = md_lrpe(qf, positions, theta), md_lrpe(k_tilde, positions, theta)
        log_f = torch.cat([log_f, log_f], dim=-1)
    memory = None if state is None else state.memory
    o, memory = decayed_recurrence(
        qf, k_tilde, v, log_f, mode=mode, chunk_size=chunk_size, state=memory
    )
    o = o.to(q.dtype)
    if not return_state:
        return o
    length = (0 if state is None else state.length) + q.shape[2]
    return o, LightNetState(memory, z_last, length)


def _bidirectional(q, k, v, null_slot, positions, theta):
    real_dtype, _ = working_dtypes(q.dtype)
    k64 = k.to(torch.float64)
    lse = torch.logsumexp(k64, dim=2, keepdim=True)
    if null_slot:
        lse = torch.logaddexp(lse, torch.zeros_like(lse))
    k_tilde = torch.exp(k64 - lse).to(real_dtype)
    qf = q.to(real_dtype)
    if positions is not None:
        qf, k_tilde = md_lrpe(qf, positions, theta), md_lrpe(k_tilde, positions, theta)
    memory = k_tilde.transpose(-1, -2) @ v.to(real_dtype)  # (B, H, Dk', Dv)
    return qf @ memory


def tpe_scan(
    v: Tensor,
    log_decay: Tensor,
    coefficient: Tensor,
    *,
    causal: bool = True,
    mode: str = "chunked",
    chunk_size: int = 64,
    state: Tensor | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """TPE along one axis: ``o_t = c_h Σ_{s≤t} λ_h^{t-s} v_s`` (causal) or
    ``c_h Σ_s λ_h^{|t-s|} v_s``.

    v ``(B, H, L, Dv)``; ``log_decay`` = ``log λ_h`` (H,) (<= 0; ``logsigmoid`` of a
    parameter); ``coefficient`` = ``q_h·k_h`` (H,). ``state (B, H, 1, Dv)`` and
    ``return_state`` for causal decoding.
    """
    check_bool(causal, "causal")
    if not isinstance(v, Tensor) or v.dim() != 4 or not v.is_floating_point():
        raise ValueError("v must be a floating-point tensor of shape (B, H, L, Dv)")
    B, H, L, _ = v.shape
    for name, t in (("log_decay", log_decay), ("coefficient", coefficient)):
        if not isinstance(t, Tensor) or t.shape != (H,):
            raise ValueError(f"{name} must be a tensor of shape (H,) = ({H},)")
    if bool((~(log_decay <= 0)).any()):
        raise ValueError("log_decay must be <= 0 (a decay λ in (0, 1]) and not NaN")
    if not causal and (state is not None or return_state):
        raise ValueError("causal=False has no recurrent state (state / return_state)")
    real_dtype, _ = working_dtypes(v.dtype)
    c = coefficient.to(real_dtype)[None, :, None, None].expand(B, H, L, 1)
    ones = torch.ones(B, H, L, 1, dtype=real_dtype, device=v.device)
    g = log_decay.to(torch.float64)[None, :, None, None].expand(B, H, L, 1)
    o, final = decayed_recurrence(c, ones, v, g, mode=mode, chunk_size=chunk_size, state=state)
    if not causal:
        back, _ = decayed_recurrence(c, ones, v.flip(2), g, mode=mode, chunk_size=chunk_size)
        o = o + back.flip(2) - c * v.to(real_dtype)
    o = o.to(v.dtype)
    return (o, final) if return_state else o


class LightNetAttention(nn.Module):
    """LightNet's additive-recurrence attention with MD-LRPE over ``axes`` position axes.

    ``forward(x (B, L, dim), positions=None, state=None, return_state=False)``; positions
    ``(L, axes)`` or ``(B, L, axes)`` (default: ``state.length + 0..L-1`` when ``axes == 1``).
    Causal layers decode with the returned ``LightNetState`` (O(1) per token).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        axes: int = 1,
        causal: bool = True,
        null_slot: bool = True,
        lrpe: bool = True,
        base: float = 10000.0,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.axes = check_int(axes, "axes")
        self.causal = check_bool(causal, "causal")
        self.null_slot = check_bool(null_slot, "null_slot")
        self.chunk_size = check_int(chunk_size, "chunk_size")
        check_bool(lrpe, "lrpe")
        check_float(base, "base", above=1.0)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Sequential(
            nn.Linear(dim, num_heads, bias=False), nn.Linear(num_heads, dim, bias=False)
        )
        self.norm = RMSNorm(dim)
        self.out_proj = nn.Linear(dim, dim, bias=False)
        channels = math.ceil(self.head_dim / self.axes)
        self.theta = nn.Parameter(lrpe_theta(num_heads, channels, base).float()) if lrpe else None

    def _heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        state: LightNetState | None = None,
        return_state: bool = False,
    ) -> Tensor | tuple[Tensor, LightNetState]:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be a tensor of shape (B, L, {self.dim})")
        B, L, _ = x.shape
        if self.theta is not None and positions is None:
            if self.axes != 1:
                raise ValueError(f"positions (L, {self.axes}) are required with axes = {self.axes}")
            start = 0 if state is None else state.length
            positions = torch.arange(start, start + L, device=x.device)[:, None]
        if positions is not None and positions.shape[-1] != self.axes:
            raise ValueError(
                f"positions must have {self.axes} coordinates per token, "
                f"got {tuple(positions.shape)}"
            )
        q = self._heads(F.silu(self.q_proj(x)))
        k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        lrpe = {} if self.theta is None else {"positions": positions, "theta": self.theta}
        mode = "recurrent" if (L == 1 and self.causal) else "chunked"
        result = lightnet_scan(
            q,
            k,
            v,
            causal=self.causal,
            null_slot=self.null_slot,
            mode=mode,
            chunk_size=self.chunk_size,
            state=state,
            return_state=return_state,
            **lrpe,
        )
        o, state = result if return_state else (result, None)
        o = o.transpose(1, 2).reshape(B, L, self.dim)
        out = self.out_proj(self.norm(o * torch.sigmoid(self.gate(x))))
        return (out, state) if return_state else out


class MDTPE(nn.Module):
    """MD-TPE over the ``axes`` grid axes of ``x (B, n_1, ..., n_axes, dim)``."""

    def __init__(self, dim: int, num_heads: int, *, axes: int = 2, causal: bool = True) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.axes = check_int(axes, "axes")
        self.causal = check_bool(causal, "causal")
        self.q = nn.Parameter(torch.randn(axes, dim))
        self.k = nn.Parameter(torch.randn(axes, dim))
        self.decay_logit = nn.Parameter(torch.randn(axes, num_heads))
        self.norms = nn.ModuleList(RMSNorm(dim) for _ in range(axes))
        self.out_projs = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(axes))

    def coefficient(self, axis: int) -> Tensor:
        """``q_h·k_h`` per head (H,) for one axis."""
        H, D = self.num_heads, self.head_dim
        return (self.q[axis].view(H, D) * self.k[axis].view(H, D)).sum(-1)

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != self.axes + 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must be a tensor of shape (B, n_1, ..., n_{self.axes}, {self.dim})"
            )
        out = 0
        for a in range(self.axes):
            xa = x.movedim(a + 1, -2)  # (B, ..., n_a, dim)
            lead = xa.shape[:-2]
            n = xa.shape[-2]
            v = xa.reshape(-1, n, self.num_heads, self.head_dim).transpose(1, 2)
            o = tpe_scan(
                v, F.logsigmoid(self.decay_logit[a]), self.coefficient(a), causal=self.causal
            )
            o = o.transpose(1, 2).reshape(*lead, n, self.dim).movedim(-2, a + 1)
            out = out + self.out_projs[a](self.norms[a](o))
        return out
