"""Analytic-walk transport of rotary channel pairs over a graph (the operator of AW-RoPE).

Channel pairs ``(x_{2c}, x_{2c+1})`` are complex numbers ``x_c``. For a directed edge
``u -> v`` with transition weight ``P[u, v]`` (edge weights divided by the out-degree of
``u``; a node without edges has a zero row) and edge angle ``a_uv``, channel ``c`` of
frequency ``omega_c`` moves along the edge by

    T_c[u, v] = P[u, v] exp(i omega_c a_uv)            (the message from v, summed at u)

and the transport sums over every walk, weighted by ``z^length`` (``0 <= z < 1``):

* exact:  ``Y_c = (I - z T_c)^{-1} X_c`` — a dense solve per graph and channel, O(N^3);
* sparse: ``Y_c = sum_{k=0}^{K} z^k T_c^k X_c`` — K message-passing steps, O(K (N + E));
  ``non_backtracking`` drops the message that returns along the edge it came by; a
  multi-scale mixture replaces ``z^k`` by ``sum_m p_m z_m^k``.

Since ``|T_c| <= P`` is sub-stochastic, the truncation error is at most
``z^(K+1) / (1 - z) * max|X|`` per entry (AW-RoPE's forward bound).

Layout: node features ``X (Bg * N, F, G, W, C)`` as two real tensors (real and imaginary
parts), for ``Bg`` graphs of ``N`` nodes; ``F`` batch rows folded onto one graph (a graph
shared by the batch), ``G`` frequency groups (``omega (G, C)``: one ladder per head, or one
for all) and ``W`` feature rows per group (heads, queries and keys). Everything is real
arithmetic (no complex dtypes: ``torch.compile`` and every backend take it); the angles
``omega * a`` are formed in float64.

"Analytic-Walk Rotary Positional Encodings" (AW-RoPE; code jiaqingxie/AW-RoPE): the operator
of the official ``truncated_walk_resolvent`` / ``exact_walk_resolvent``, read and restated here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "WalkGraph",
    "exact_transport",
    "sparse_transport",
    "truncation_bound",
    "walk_coefficients",
]


@dataclass
class WalkGraph:
    """A padded batch of graphs as directed edges ``u -> v`` (``E`` of them).

    ``graph (E,)``, ``source (E,)`` (``u``), ``target (E,)`` (``v``): int64; ``weight (E,)``:
    ``P[u, v]``; ``angle (E,)``: ``a_uv`` (differentiable); ``reverse (E,)``: the index of
    the edge ``v -> u`` or -1; ``graphs``, ``nodes``: ``Bg`` and ``N``."""

    graph: Tensor
    source: Tensor
    target: Tensor
    weight: Tensor
    angle: Tensor
    reverse: Tensor
    graphs: int
    nodes: int

    @property
    def flat_source(self) -> Tensor:
        return self.graph * self.nodes + self.source

    @property
    def flat_target(self) -> Tensor:
        return self.graph * self.nodes + self.target


def truncation_bound(z: float, num_steps: int, largest: float) -> float:
    """``z^(K+1) / (1 - z) * largest``: the largest entry of ``exact - sparse`` for
    features whose largest magnitude ``|x_c|`` is ``largest``."""
    return z ** (num_steps + 1) / (1.0 - z) * largest


def _phases(graph: WalkGraph, omega: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``P_e cos(omega a_e)``, ``P_e sin(omega a_e)`` of shape ``(E, 1, G, 1, C)``; the
    products ``omega * a`` in float64."""
    theta = graph.angle.double()[:, None, None] * omega.double()[None]  # (E, G, C)
    w = graph.weight.double()[:, None, None]
    cos = (w * torch.cos(theta)).to(dtype)[:, None, :, None, :]
    sin = (w * torch.sin(theta)).to(dtype)[:, None, :, None, :]
    return cos, sin


def walk_coefficients(z: Tensor, num_steps: int) -> Tensor:
    """``(1, z, z^2, ..., z^K)`` as products (no ``z^0`` whose gradient is NaN at 0)."""
    out = [torch.ones((), dtype=z.dtype, device=z.device)]
    for _ in range(num_steps):
        out.append(out[-1] * z)
    return torch.stack(out)


def sparse_transport(
    re: Tensor,
    im: Tensor,
    graph: WalkGraph,
    omega: Tensor,
    coefficients: Tensor,
    *,
    non_backtracking: bool = False,
) -> tuple[Tensor, Tensor]:
    """``sum_{k=0}^{K} c_k T^k X`` for ``X = re + i im`` of shape ``(Bg * N, F, G, W, C)``
    (see the module); ``omega (G, C)``, ``coefficients (K + 1,)``: ``c_k = z^k``
    (``walk_coefficients``), or a mixture ``sum_m p_m z_m^k`` over several scales.
    Non-backtracking: the state lives on edges and the message a node sent along ``u -> v``
    is removed from what ``v`` passes back to ``u``."""
    cos, sin = _phases(graph, omega, re.dtype)  # (E, 1, G, 1, C)
    # pairs stacked on a last axis of 2: (r, i) * (c + i s) = (r, i) * (c, c) + (i, r) * (-s, s)
    cc, ss = torch.stack((cos, cos), dim=-1), torch.stack((-sin, sin), dim=-1)
    src, tgt = graph.flat_source, graph.flat_target
    c = coefficients.to(re.dtype)
    x = torch.stack((re, im), dim=-1)  # (Bg * N, F, G, W, C, 2)
    out = c[0] * x
    back = graph.reverse >= 0
    reverse = graph.reverse.clamp_min(0)
    back = back.reshape(-1, *([1] * (x.dim() - 1)))
    edge = x[tgt]  # what each edge carries towards its source
    for hop in range(1, c.shape[0]):
        msg = edge * cc + edge.flip(-1) * ss
        state = torch.zeros_like(x).index_add(0, src, msg)
        out = out + c[hop] * state
        if hop == c.shape[0] - 1:
            break
        edge = state[tgt]
        if non_backtracking:
            edge = edge - torch.where(back, msg[reverse], 0.0)
    return out[..., 0], out[..., 1]


def exact_transport(
    re: Tensor, im: Tensor, graph: WalkGraph, omega: Tensor, z: Tensor
) -> tuple[Tensor, Tensor]:
    """``(I - z T)^{-1} X`` for ``X = re + i im`` of shape ``(Bg * N, F, G, W, C)``: one
    dense solve per graph, frequency group and channel, as the equivalent real system
    ``[[A, -B], [B, A]] [y_re; y_im] = [x_re; x_im]`` for ``I - z T = A + i B`` (the
    official CUDA path's form; no complex dtypes). Nodes without edges keep their features."""
    Bg, N = graph.graphs, graph.nodes
    _, F, G, W, C = re.shape
    cos, sin = _phases(graph, omega, re.dtype)  # (E, 1, G, 1, C)
    z = z.to(re.dtype)
    # T_re / T_im dense: (Bg, G, C, N, N)
    index = (graph.graph, graph.source, graph.target)
    zeros = re.new_zeros(Bg, N, N, G, C)
    t_re = zeros.index_put(index, cos[:, 0, :, 0, :], accumulate=True).permute(0, 3, 4, 1, 2)
    t_im = zeros.index_put(index, sin[:, 0, :, 0, :], accumulate=True).permute(0, 3, 4, 1, 2)
    eye = torch.eye(N, dtype=re.dtype, device=re.device)
    a, b = eye - z * t_re, -z * t_im
    system = torch.cat((torch.cat((a, -b), dim=-1), torch.cat((b, a), dim=-1)), dim=-2)

    def columns(x: Tensor) -> Tensor:  # (Bg * N, F, G, W, C) -> (Bg, G, C, N, F * W)
        return x.reshape(Bg, N, F, G, W, C).permute(0, 3, 5, 1, 2, 4).reshape(Bg, G, C, N, F * W)

    rhs = torch.cat((columns(re), columns(im)), dim=-2)  # (Bg, G, C, 2N, F * W)
    sol = torch.linalg.solve(system, rhs)

    def rows(y: Tensor) -> Tensor:  # inverse of columns
        return y.reshape(Bg, G, C, N, F, W).permute(0, 3, 4, 1, 5, 2).reshape(Bg * N, F, G, W, C)

    return rows(sol[..., :N, :]), rows(sol[..., N:, :])
