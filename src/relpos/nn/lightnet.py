"""``LightNetAttention`` and ``MDTPE``: LightNet's token mixers for sequences, images and
video (Qin et al. 2024, arXiv 2405.21022; authority B: the author's xmixers port).

``LightNetAttention`` (the port's ``LightNetAttention`` with LRPE on):

    q = silu(W_q x), k = W_k x, v = W_v x               split into H heads
    o = lightnet_scan(q, k, v, positions, theta)        additive recurrence + MD-LRPE
    out = W_o( RMSNorm(o * sigmoid(W_2 W_1 x)) )        low-rank (rank H) output gate

The port's LRPE is a RoPE map on (causal) 1-D text; here MD-LRPE (the cosine map per axis,
``relpos.efficient.md_lrpe``) with learnable ``theta (H, E)``: positions ``(L, m)`` give the
image / video coordinates (``relpos.positions_nd.grid_positions``), default ``0..L-1`` for
text (``axes=1``). ``causal=False`` is the "scan once" whole-set form for images.

``MDTPE`` (the port's ``MdTpe``): per axis of a grid ``x (B, n_1, ..., n_m, dim)``, a TPE
(``relpos.efficient.tpe_scan``: ``o_t = (q_h·k_h) Σ_{s≤t} λ_h^{t-s} v_s`` along the axis with
``v = x``) followed by its own RMSNorm and output projection; the axes' outputs are summed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..efficient.lightnet import LightNetState, lightnet_scan, lrpe_theta, tpe_scan
from ..validation import check_bool, check_float, check_int
from .llama import RMSNorm


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
