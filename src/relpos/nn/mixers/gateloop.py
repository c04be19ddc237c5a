"""GateLoop: data-controlled relative decay (Katsch 2023, "GateLoop: Fully Data-Controlled
Linear Recurrence for Sequence Modeling", arXiv 2311.01927).

Per head and q/k channel d, a complex gate from the token itself,

    a_{t,d} = σ(α_{t,d}) · exp(i ω_{t,d})          amplitude in (0, 1), phase ω
    H_t = a_t ⊙ H_{t-1} + k_tᵀ v_t                  H_t ∈ C^{Dk x Dv}
    y_t = Re(q_t H_t)

equivalently the surrogate attention with a relative, data-dependent decay

    y_i = Re Σ_{j≤i} Σ_d q_{id} k_{jd} Π_{l=j+1}^{i} a_{ld} · v_j

(RetNet is a constant ``a``; a unit amplitude with a constant phase is a RoPE-like rotation; the
product does not conjugate k). The recurrence and its equivalence check follow the official code
(tobiaskatsch/GatedLinearRNN, notebook ``log_quadratic_scan_equality_check.ipynb``); the readout
``Re`` is an assumption (the paper's exact readout was not read): ``output="complex"`` returns the
complex ``y``.

The three modes of ``relpos.nn.mixers.recurrence`` compute it exactly: ``recurrent`` (the
loop; decoding), ``attention`` (quadratic, log space, masked before exp) and ``chunked``
(linear in L; the default). The notebook's ``cumprod(a)`` / ``1/cumprod(a)`` quadratic form
is unstable and is not used.

Shapes: q, k ``(B, H, L, Dk)``; v ``(B, H, L, Dv)``; amplitude (or log_amplitude) and phase
broadcastable to ``(B, H, L, Dk)``; state ``(B, H, Dk, Dv)`` complex.

The layer: ``GateLoop``: a token mixer with data-controlled complex relative decay (Katsch 2023).

    q, k, v = W_q x, W_k x, W_v x                      split into H heads (Dk = Dv = dim / H)
    a_t     = sigmoid(W_α x_t) · exp(i relu(W_ω x_t))    per head and q/k channel
    y_t     = Re(q_t H_t),  H_t = a_t ⊙ H_{t-1} + k_tᵀ v_t
    (relpos.nn.mixers.gateloop.gateloop_scan)
    out     = W_o( RMSNorm(y) * silu(W_g x) )

The gate (sigmoid amplitude, ReLU phase) follows the official equivalence notebook; the readout
``Re``, the per-token RMSNorm and the SiLU output gate are assumptions (the paper's block was not
read), stated here. The amplitude enters in log space (``logsigmoid``), so it never underflows.

``forward(x (B, L, dim), state=None, return_state=False)``: with ``return_state`` it returns
``(out, state)``; feeding the state back with the next tokens continues the sequence exactly
(decoding is O(1) per token: ``mode="recurrent"`` for single tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...validation import check_bool, check_choice, check_int
from ..llama import RMSNorm
from .recurrence import decayed_recurrence, working_dtypes

__all__ = ["gateloop_scan"]


OUTPUTS = ("real", "complex")


def _gate(value: Tensor, name: str, shape: torch.Size) -> Tensor:
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor broadcastable to {tuple(shape)}")
    try:
        return torch.broadcast_to(value, shape)
    except RuntimeError:
        raise ValueError(
            f"{name} must be broadcastable to (B, H, L, Dk) = {tuple(shape)}, "
            f"got {tuple(value.shape)}"
        ) from None


def gateloop_scan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    amplitude: Tensor | None = None,
    phase: Tensor | None = None,
    *,
    log_amplitude: Tensor | None = None,
    mode: str = "chunked",
    chunk_size: int = 64,
    output: str = "real",
    state: Tensor | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """GateLoop's linear recurrence ``H_t = a_t ⊙ H_{t-1} + k_tᵀ v_t``, ``y_t = q_t H_t``.

    Args:
        q, k: ``(B, H, L, Dk)``; v: ``(B, H, L, Dv)``.
        amplitude: ``|a_t|`` in ``[0, 1]`` (e.g. ``sigmoid(α)``), broadcastable to q.
        phase: ``arg a_t`` in radians, broadcastable to q; None for real gates.
        log_amplitude: ``log |a_t| <= 0`` instead of ``amplitude`` (``logsigmoid(α)``: no
            underflow for very negative α). Exactly one of the two.
        mode: ``"chunked"`` (O(L)), ``"recurrent"`` (the loop) or ``"attention"`` (quadratic
            surrogate attention); all exact.
        chunk_size: tokens per chunk in ``"chunked"`` mode.
        output: ``"real"`` (``Re y``, in q's dtype) or ``"complex"`` (complex64/complex128).
        state: ``H`` carried from a previous call ``(B, H, Dk, Dv)`` (complex), or None.
        return_state: also return the final state (for decoding: feed one token at a time
            with ``mode="recurrent"``; the result equals the full forward).

    Returns ``y (B, H, L, Dv)``, or ``(y, state)`` with ``return_state``.
    """
    check_choice(output, "output", OUTPUTS)
    check_bool(return_state, "return_state")
    if not isinstance(q, Tensor) or q.dim() != 4:
        raise ValueError("q must be a tensor of shape (B, H, L, Dk)")
    if (amplitude is None) == (log_amplitude is None):
        raise ValueError("pass exactly one of amplitude and log_amplitude")
    if amplitude is not None:
        amplitude = _gate(amplitude, "amplitude", q.shape)
        if amplitude.numel() and bool(
            ((amplitude < 0) | (amplitude > 1) | amplitude.isnan()).any()
        ):
            raise ValueError(
                "amplitude must lie in [0, 1] (|a_t| <= 1 keeps the recurrence stable)"
            )
        log_a = torch.log(amplitude.to(torch.float64))
    else:
        log_amplitude = _gate(log_amplitude, "log_amplitude", q.shape)
        if log_amplitude.numel() and bool((~(log_amplitude <= 0)).any()):
            raise ValueError("log_amplitude must be <= 0 (|a_t| <= 1) and not NaN")
        log_a = log_amplitude.to(torch.float64)
    if phase is not None:
        phase = _gate(phase, "phase", q.shape)
        if phase.numel() and not bool(torch.isfinite(phase).all()):
            raise ValueError("phase must be finite (no NaN or inf)")
        g = torch.complex(log_a, phase.to(torch.float64))
    else:
        g = torch.complex(log_a, torch.zeros_like(log_a))
    if state is not None and not state.is_complex():
        state = state.to(working_dtypes(q.dtype)[1])
    y, final = decayed_recurrence(q, k, v, g, mode=mode, chunk_size=chunk_size, state=state)
    y = y.real.to(q.dtype) if output == "real" else y
    return (y, final) if return_state else y


class GateLoop(nn.Module):
    """GateLoop token mixer. ``dim`` divisible by ``num_heads``; ``mode`` the prefill mode
    of ``gateloop_scan`` (single-token calls always run the recurrence)."""

    def __init__(
        self, dim: int, num_heads: int, *, mode: str = "chunked", chunk_size: int = 64
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.mode = check_choice(mode, "mode", ("chunked", "recurrent", "attention"))
        self.chunk_size = check_int(chunk_size, "chunk_size")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.gates = nn.Linear(dim, 2 * dim)  # amplitude and phase logits
        self.gate_out = nn.Linear(dim, dim, bias=False)
        self.norm = RMSNorm(dim)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self, x: Tensor, state: Tensor | None = None, return_state: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        check_bool(return_state, "return_state")
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be a tensor of shape (B, L, {self.dim})")
        B, L, _ = x.shape
        q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        alpha, omega = (self._heads(t) for t in self.gates(x).chunk(2, dim=-1))
        mode = "recurrent" if L == 1 else self.mode
        y, state = gateloop_scan(
            q,
            k,
            v,
            log_amplitude=F.logsigmoid(alpha),
            phase=torch.relu(omega),
            mode=mode,
            chunk_size=self.chunk_size,
            state=state,
            return_state=True,
        )
        y = y.transpose(1, 2).reshape(B, L, self.dim)
        out = self.out_proj(self.norm(y) * F.silu(self.gate_out(x)))
        return (out, state) if return_state else out
