"""``GateLoop``: a token mixer with data-controlled complex relative decay (Katsch 2023).

    q, k, v = W_q x, W_k x, W_v x                      split into H heads (Dk = Dv = dim / H)
    a_t     = sigmoid(W_α x_t) · exp(i relu(W_ω x_t))    per head and q/k channel
    y_t     = Re(q_t H_t),  H_t = a_t ⊙ H_{t-1} + k_tᵀ v_t   (relpos.efficient.gateloop_scan)
    out     = W_o( RMSNorm(y) * silu(W_g x) )

The gate (sigmoid amplitude, ReLU phase) follows the official equivalence notebook
(authority A); the readout ``Re``, the per-token RMSNorm and the SiLU output gate are
assumptions (the paper's block was not read), stated here. The amplitude enters in log space
(``logsigmoid``), so it never underflows.

``forward(x (B, L, dim), state=None, return_state=False)``: with ``return_state`` it returns
``(out, state)``; feeding the state back with the next tokens continues the sequence exactly
(decoding is O(1) per token: ``mode="recurrent"`` for single tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..efficient.gateloop import gateloop_scan
from ..validation import check_bool, check_choice, check_int
from .llama import RMSNorm


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
