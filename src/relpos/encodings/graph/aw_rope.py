"""AW-RoPE: analytic-walk rotary encodings on graphs (``aw-rope``, ``aw-rope-exact``).

"Analytic-Walk Rotary Positional Encodings" (AW-RoPE; official code jiaqingxie/AW-RoPE,
``external/Graph-RoPE/graphgps/layer/aw_rope.py`` and ``scripts/exact_aw_operator.py``, read;
restated here, not copied). The claim: node-wise rotary
encodings give the rotation between two nodes from their endpoints only; AW-RoPE puts the
rotations on the *edges* and sums the transported features over all walks, so routes
reinforce or cancel. Both variants act on the projected queries and keys:

    q~ = W q,   k~ = W k,   logit_ij = <q~_i, k~_j> * scale
    W_c = (I - z T_c)^{-1}                       (aw-rope-exact: a dense solve)
    W_c = sum_{k=0}^{K} z^k T_c^k                (aw-rope: K message-passing steps)
    T_c[u, v] = P[u, v] exp(i omega_c a_uv)      (walk transport, ``walk_transport.py``)

per interleaved channel pair ``c`` (``(x_{2c}, x_{2c+1})`` as a complex number). ``P`` is the
random-walk transition (edge weights over the out-degree; isolated nodes have a zero row),
``a_uv = -a_vu`` the edge angle from an edge field, ``z = sigmoid(z_logit) (1 - 1e-4)``
(learnable, 0.8 at init) and ``omega_j = base^(-2j / d)`` (learnable). As in the official
GraphGPS layer, the transport acts on the model width before the head split: one ladder of
``H * D / 2`` frequencies, head ``h`` taking pairs ``h D/2 .. (h+1) D/2 - 1``
(``frequency_ladder="model"``); ``"head"`` gives every head the ladder ``base^(-2c/D)`` of
its own ``D`` channels (keys of grouped-query attention are then not expanded).

Edge fields (``field``), bounded by ``M tanh(a / M)`` with ``M = max_displacement`` (pi):

* ``"features"`` (official default, ``local-antisymmetric``):
  ``a_uv = psi(h_u, h_v) - psi(h_v, h_u)``, ``psi = MLP(2F -> field_hidden -> 1, SiLU)``
  over per-call ``inputs["node_features"] (B, N, F)`` (the layer input in GraphGPS;
  ``F = feature_dim``, default ``H * D``);
* ``"coordinate"``: ``a_uv = w . (x_v - x_u)`` over ``inputs["node_positions"] (B, N, P)``
  (linear, no bias; ``P = position_dim``). A gradient field: the gauge identity
  ``Y = e^{-i omega x} (I - z P)^{-1} (e^{i omega x} X)`` holds for it (unbounded);
* ``"precomputed"``: ``inputs["edge_angles"] (B, N, N)`` read on the edges, antisymmetric
  where both directions exist, not bounded (as the official ``precomputed-static``).

Tokens are graph nodes: positions are node ids (``q_pos[b, i]`` is a node of graph ``b``),
``inputs["adjacency"] (B, N, N)`` (``check_adjacency``; ``B`` may be 1) and the optional
``inputs["edge_weights"] (B, N, N)`` (non-negative). The features of the tokens at a node
are its node features (tokens at one node add up, nodes without a token hold 0); every
token reads the transported features at its node. So the rotation of a token reads the
other tokens of its side of the call (``mixes_tokens``): not relative, no KV cache (refused
by name), and a call's rows are not the rows of a larger call; ``causal`` and ``mask``
choose the attended pairs, while the transport still reads every node of the graph. A padded
node (no edges) neither sends nor receives. Queries and keys share the transport; values
and outputs are not rotated. Features are transported in float32 (float64 for float64
activations), angles formed in float64. Cost: sparse O(K (N + E) H D) per call, exact
O(B H D N^3 / 2) time and O(B H D N^2) memory (small graphs: ``benchmarks/bench_graph_walks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ...graphs import check_adjacency
from ..base import Encoding
from ..options import Bool, Choice, Float, FloatSequence, Int
from ..registry import register
from .base import DEFAULT_MAX_NODES, MAX_NODES
from .walk_transport import WalkGraph, exact_transport, sparse_transport, walk_coefficients

__all__ = ["AWRoPE", "AWRoPEExact", "AnalyticWalkRoPE", "WalkState", "example_walk_graphs"]

FIELD_INPUTS = {
    "features": ("node_features", "(B, N, F) node features read by the learned edge field"),
    "coordinate": ("node_positions", "(B, N, P) node coordinates (a_uv = w . (x_v - x_u))"),
    "precomputed": ("edge_angles", "(B, N, N) antisymmetric edge angles a_uv"),
}
STABILITY_EPS = 1e-4  # z = sigmoid(z_logit) * (1 - eps) < 1


@dataclass
class WalkState:
    """The rotation state of a call (``prepare_rotary``): the graphs as an edge list."""

    graph: WalkGraph


def _floating(value: object, name: str, form: str, *, dims: int) -> Tensor:
    if not isinstance(value, Tensor) or not value.is_floating_point():
        got = value.dtype if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"{name} must be a floating-point {form} tensor, got {got}")
    if value.dim() != dims:
        raise ValueError(f"{name} must have shape {form}, got {tuple(value.shape)}")
    if value.numel() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return value


def _graph_count(tensors: dict[str, Tensor]) -> int:
    """The number of graphs: every input holds 1 or the same count."""
    counts = {t.shape[0] for t in tensors.values()}
    graphs = max(counts)
    for name, t in tensors.items():
        if t.shape[0] not in (1, graphs):
            raise ValueError(
                f"inputs[{name!r}] holds {t.shape[0]} graphs, expected 1 or {graphs} "
                f"(the other inputs' count)"
            )
    return graphs


class AnalyticWalkRoPE(Encoding):
    """Base of ``aw-rope`` (sparse) and ``aw-rope-exact`` (see the module docstring).

    Args:
        field: the edge field, ``"features"`` | ``"coordinate"`` | ``"precomputed"``.
        feature_dim: ``F`` of ``node_features`` (default ``num_heads * head_dim``).
        field_hidden: hidden width of the learned field's MLP (32).
        position_dim: ``P`` of ``node_positions`` (3).
        max_displacement: bound ``M`` of learned and coordinate angles (pi; None: unbounded).
        base: frequency base (10000).
        frequency_ladder: ``"model"`` (official: one ladder over ``H * D``) or ``"head"``.
        learnable_frequencies, learnable_z: train ``omega`` and ``z`` (both True).
        initial_z: ``z`` at init, in ``[0, 1)`` (0.8).
        max_nodes: the largest node count of a graph (positions are node ids below it).
    """

    paper = "AW-RoPE (analytic-walk rotary encodings on graphs; jiaqingxie/AW-RoPE)"
    relative = False
    has_rotary = True
    cache_rotated_keys = False
    mixes_tokens = True
    needs_inputs = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        field: Annotated[
            str, Choice(choices=tuple(FIELD_INPUTS), doc="edge field of the angles a_uv")
        ] = "features",
        feature_dim: Annotated[
            int | None, Int(optional=True, doc="F of node_features (default H * D)")
        ] = None,
        field_hidden: Annotated[int, Int(doc="hidden width of the learned field's MLP")] = 32,
        position_dim: Annotated[int, Int(doc="P of node_positions")] = 3,
        max_displacement: Annotated[
            float | None, Float(above=0.0, optional=True, doc="angle bound M (None: none)")
        ] = math.pi,
        base: Annotated[float, Float(above=1.0, doc="frequency base")] = 10_000.0,
        frequency_ladder: Annotated[
            str, Choice(choices=("model", "head"), doc="one ladder or one per head")
        ] = "model",
        learnable_frequencies: Annotated[bool, Bool(doc="train the frequencies")] = True,
        initial_z: Annotated[
            float, Float(minimum=0.0, below=1.0, doc="walk weight z at init")
        ] = 0.8,
        learnable_z: Annotated[bool, Bool(doc="train z")] = True,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (channel pairs), got {head_dim}")
        self.max_positions = max_nodes
        self.field, self.max_displacement = field, max_displacement
        self.frequency_ladder = frequency_ladder
        name, form = FIELD_INPUTS[field]
        self.field_input = name
        self.required_inputs = {
            "adjacency": "(B, N, N) bool or 0/1 graph; positions are node ids",
            name: form,
        }
        self.optional_inputs = {"edge_weights": "(B, N, N) non-negative edge weights"}
        if field == "features":
            self.feature_dim = feature_dim or num_heads * head_dim
            self.scorer = nn.Sequential(
                nn.Linear(2 * self.feature_dim, field_hidden),
                nn.SiLU(),
                nn.Linear(field_hidden, 1, bias=False),  # (a bias cancels in psi(u, v) - psi(v, u))
            )
        elif field == "coordinate":
            self.position_dim = position_dim
            self.projection = nn.Linear(position_dim, 1, bias=False)
        C = head_dim // 2
        if frequency_ladder == "model":
            j = torch.arange(num_heads * C, dtype=torch.float64)
            omega = (base ** (-2.0 * j / (num_heads * head_dim))).reshape(num_heads, C)
        else:
            omega = (base ** (-2.0 * torch.arange(C, dtype=torch.float64) / head_dim))[None]
        omega = omega.float()
        if learnable_frequencies:
            self.frequencies = nn.Parameter(omega)
        else:
            self.register_buffer("frequencies", omega)
        scaled = min(initial_z / (1.0 - STABILITY_EPS), 1.0 - 1e-7)
        z_logit = torch.logit(torch.tensor(max(scaled, 1e-7)))
        if learnable_z:
            self.z_logit = nn.Parameter(z_logit)
        else:
            self.register_buffer("z_logit", z_logit)

    @property
    def z(self) -> Tensor:
        """The walk weight ``z = sigmoid(z_logit) (1 - 1e-4)`` in ``[0, 1)``."""
        return torch.sigmoid(self.z_logit) * (1.0 - STABILITY_EPS)

    # ------------------------------------------------------------------ the graph
    def edge_angles(self, graph: WalkGraph, inputs: dict[str, Tensor]) -> Tensor:
        """``a_uv (E,)`` on the edges of ``graph`` from the edge field."""
        name = self.field_input
        b, u, v = graph.graph, graph.source, graph.target
        value = inputs[name]
        if self.field == "precomputed":
            a = value.expand(graph.graphs, -1, -1)[b, u, v]
            back = graph.reverse >= 0
            gap = (a[back] + a[graph.reverse[back]]).abs()
            if bool((gap > 1e-5 * (1.0 + a[back].abs())).any()):
                raise ValueError(
                    f"inputs[{name!r}] must be antisymmetric on the edges (a_uv = -a_vu)"
                )
            return a
        x = value.expand(graph.graphs, -1, -1)
        if self.field == "coordinate":
            w = self.projection.weight
            a = (x[b, v] - x[b, u]).to(w.dtype) @ w[0]
        else:
            h_u = x[b, u].to(self.scorer[0].weight.dtype)
            h_v = x[b, v].to(h_u.dtype)
            a = (
                self.scorer(torch.cat((h_u, h_v), -1)) - self.scorer(torch.cat((h_v, h_u), -1))
            ).squeeze(-1)
        if self.max_displacement is not None:
            m = self.max_displacement
            a = m * torch.tanh(a / m)
        return a

    def _field_tensor(self, inputs: dict[str, Tensor], nodes: int) -> Tensor:
        name = self.field_input
        label = f"inputs[{name!r}]"
        if name not in inputs:
            raise ValueError(f"encoding {self.name!r} with field={self.field!r} needs {label}")
        if self.field == "precomputed":
            t = _floating(inputs[name], label, "(B, N, N)", dims=3)
            if t.shape[1:] != (nodes, nodes):
                shape = tuple(t.shape)
                raise ValueError(f"{label} must have shape (B, {nodes}, {nodes}), got {shape}")
            return t
        last = self.feature_dim if self.field == "features" else self.position_dim
        form = "(B, N, F)" if self.field == "features" else "(B, N, P)"
        t = _floating(inputs[name], label, form, dims=3)
        if t.shape[1:] != (nodes, last):
            raise ValueError(f"{label} must have shape (B, {nodes}, {last}), got {tuple(t.shape)}")
        return t

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> WalkState:
        """The call's graphs as a ``WalkGraph`` (edges, transition weights, field angles);
        node ids (positions) are checked against the graphs' node count."""
        if "adjacency" not in inputs:
            raise ValueError(f"encoding {self.name!r} needs inputs['adjacency'] (B, N, N)")
        adj = check_adjacency(inputs["adjacency"], "inputs['adjacency']")
        N = adj.shape[1]
        field = self._field_tensor(inputs, N)
        given = {"adjacency": adj, self.field_input: field}
        weights = inputs.get("edge_weights")
        if weights is not None:
            weights = _floating(weights, "inputs['edge_weights']", "(B, N, N)", dims=3)
            if weights.shape[1:] != (N, N):
                raise ValueError(
                    f"inputs['edge_weights'] must have shape (B, {N}, {N}), got "
                    f"{tuple(weights.shape)}"
                )
            if bool((weights < 0).any()):
                raise ValueError("inputs['edge_weights'] must be non-negative")
            given["edge_weights"] = weights
        graphs = _graph_count(given)
        for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
            if pos.numel() and int(pos.max()) >= N:
                raise ValueError(
                    f"positions are node ids: {name} holds node {int(pos.max())}, outside "
                    f"inputs['adjacency'] with {N} nodes"
                )
        device = q_pos.device  # the activations' device (inputs may come on another one)
        given = {name: t.to(device) for name, t in given.items()}
        adj, weights = given["adjacency"].expand(graphs, N, N), given.get("edge_weights")
        b, u, v = adj.nonzero(as_tuple=True)
        if weights is None:
            w = torch.ones(b.shape[0], dtype=torch.float64, device=device)
        else:
            w = weights.expand(graphs, N, N)[b, u, v].double()
        degree = torch.zeros(graphs * N, dtype=torch.float64, device=device)
        degree = degree.index_add(0, b * N + u, w)
        w = w / degree[b * N + u].clamp_min(torch.finfo(torch.float64).tiny)
        index = torch.full((graphs, N, N), -1, dtype=torch.long, device=device)
        index[b, u, v] = torch.arange(b.shape[0], device=device)
        graph = WalkGraph(b, u, v, w, w.new_zeros(0), index[b, v, u], graphs, N)
        graph.angle = self.edge_angles(graph, given)
        return WalkState(graph)

    # ------------------------------------------------------------------ the transport
    def transport(self, re: Tensor, im: Tensor, graph: WalkGraph) -> tuple[Tensor, Tensor]:
        """The walk operator on node features ``(Bg * N, F, G, W, C)`` (``walk_transport``)."""
        raise NotImplementedError

    def _groups(self) -> int:
        return self.num_heads if self.frequency_ladder == "model" else 1

    def _to_nodes(self, x: Tensor, pos: Tensor, graph: WalkGraph) -> Tensor:
        """Token features ``x (B, Hx, L, D)`` summed into their nodes: ``(Bg * N, F, Hx, D)``
        in the compute dtype (``F = B / Bg`` batch rows folded onto a shared graph)."""
        B, Hx, L, D = x.shape
        Bg, N = graph.graphs, graph.nodes
        if Bg not in (1, B):
            raise ValueError(
                f"inputs['adjacency'] holds {Bg} graphs, expected 1 or the batch size {B}"
            )
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        pos = pos.expand(B, L).to(x.device)
        flat = (torch.arange(B, device=x.device)[:, None] * N + pos).reshape(-1)
        rows = x.permute(0, 2, 1, 3).reshape(B * L, Hx, D).to(cd)
        nodes = rows.new_zeros(B * N, Hx, D).index_add(0, flat, rows)
        F = B // Bg
        return nodes.reshape(Bg, F, N, Hx, D).transpose(1, 2).reshape(Bg * N, F, Hx, D)

    @staticmethod
    def _to_tokens(nodes: Tensor, pos: Tensor, graph: WalkGraph, like: Tensor) -> Tensor:
        """Node features ``(Bg * N, F, Hx, D)`` read at the tokens' nodes: ``(B, Hx, L, D)``."""
        Bg, N = graph.graphs, graph.nodes
        _, F, Hx, D = nodes.shape
        B, L = Bg * F, pos.shape[-1]
        per_batch = nodes.reshape(Bg, N, F, Hx, D).transpose(1, 2).reshape(B, N, Hx, D)
        pos = pos.expand(B, L).to(like.device)
        out = per_batch[torch.arange(B, device=like.device)[:, None], pos]  # (B, L, Hx, D)
        return out.permute(0, 2, 1, 3).to(like.dtype)

    def _walk(self, nodes: Tensor, graph: WalkGraph) -> Tensor:
        """Transport ``(Bg * N, F, G, W, D)`` node features (pairs interleaved)."""
        re, im = nodes[..., 0::2], nodes[..., 1::2]
        out_re, out_im = self.transport(re, im, graph)
        return torch.stack((out_re, out_im), dim=-1).flatten(-2)

    def _expand_heads(self, x: Tensor) -> Tensor:
        """Grouped keys expanded to the query heads when every head has its own ladder."""
        if self.frequency_ladder == "model" and x.shape[1] != self.num_heads:
            return x.repeat_interleave(self.num_heads // x.shape[1], dim=1)
        return x

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        """``q`` / ``k``: the walk transport of ``x (B, Hx, L, D)`` over the call's graphs
        (``state``); values and outputs are unchanged."""
        if role in ("v", "o"):
            return x
        if not isinstance(state, WalkState):
            raise ValueError(
                f"encoding {self.name!r} rotates over per-call graphs: call it through "
                f"relpos.attention(..., inputs={{'adjacency': ..., {self.field_input!r}: ...}})"
            )
        x = self._expand_heads(x)
        graph = state.graph
        nodes = self._to_nodes(x, pos, graph)  # (Bg*N, F, Hx, D)
        G = self._groups()
        grouped = nodes.reshape(*nodes.shape[:2], G, nodes.shape[2] // G, nodes.shape[3])
        out = self._walk(grouped, graph).reshape(nodes.shape)
        return self._to_tokens(out, pos, graph, x)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None
    ) -> tuple[Tensor, Tensor]:
        """Queries and keys in one transport (they share the graph and the frequencies)."""
        if not isinstance(state, WalkState) or q.shape[0] != k.shape[0]:
            return self.rotate(q, q_pos, "q", state), self.rotate(k, k_pos, "k", state)
        k = self._expand_heads(k)
        graph = state.graph
        nq, nk = self._to_nodes(q, q_pos, graph), self._to_nodes(k, k_pos, graph)
        Hq = nq.shape[2]
        if self.frequency_ladder == "model":  # (.., H, 2, D): group = head, rows = q, k
            out = self._walk(torch.stack((nq, nk), dim=3), graph)
            oq, ok = out[:, :, :, 0], out[:, :, :, 1]
        else:  # one group, rows = query heads then key heads
            out = self._walk(torch.cat((nq, nk), dim=2)[:, :, None], graph)[:, :, 0]
            oq, ok = out[:, :, :Hq], out[:, :, Hq:]
        return self._to_tokens(oq, q_pos, graph, q), self._to_tokens(ok, k_pos, graph, k)

    @classmethod
    def example_options(cls) -> dict:
        return {"max_nodes": 64, "feature_dim": 8}

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        adjacency = example_walk_graphs(batch, 64, generator)
        features = torch.randn(batch, 64, 8, generator=generator)
        return {"adjacency": adjacency, "node_features": features}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, field={self.field!r}, ladder={self.frequency_ladder!r}"


def example_walk_graphs(batch: int, nodes: int, generator: torch.Generator) -> Tensor:
    """Random connected undirected graphs with cycles ``(batch, nodes, nodes)`` bool: a
    random recursive tree (each node joins an earlier one) plus ``nodes / 4`` chords."""
    n = torch.arange(1, nodes)
    adj = torch.zeros(batch, nodes, nodes, dtype=torch.bool)
    for b in range(batch):
        parent = (torch.rand(nodes - 1, generator=generator) * n).long()
        adj[b, n, parent] = True
        extra = torch.randint(0, nodes, (2, nodes // 4), generator=generator)
        adj[b, extra[0], extra[1]] = True
    adj = adj | adj.transpose(1, 2)
    return adj & ~torch.eye(nodes, dtype=torch.bool)


@register("aw-rope")
class AWRoPE(AnalyticWalkRoPE):
    """AW-RoPE, sparse variant: ``sum_{k=0}^{K} z^k T^k`` applied to q and k (the official
    ``AnalyticWalkRoPE`` layer, methods ``aw`` / ``aw-nb`` / ``aw-nb-ms``; see the module
    docstring).

    Args:
        num_steps: ``K`` (8).
        non_backtracking: drop the message returning along the edge it came by (``aw-nb``).
        z_values: several walk scales ``z_m`` (each in ``(0, 1)``, learnable with
            ``learnable_z``) mixed by learned weights ``p = softmax(mixture_logits)`` (zero
            at init): ``c_k = sum_m p_m z_m^k`` replaces ``z^k`` (official ``aw-nb-ms`` with
            ``non_backtracking=True``; ``initial_z`` is then unused).
        (the other options as ``AnalyticWalkRoPE``)
    """

    paper = "AW-RoPE (analytic-walk graph rotary, sparse walk sum; jiaqingxie/AW-RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        num_steps: Annotated[int, Int(minimum=0, doc="K: walk length of the truncated sum")] = 8,
        non_backtracking: Annotated[bool, Bool(doc="exclude immediate edge reversals")] = False,
        z_values: Annotated[
            tuple[float, ...] | None,
            FloatSequence(above=0.0, optional=True, doc="scales z_m of a mixture"),
        ] = None,
        **options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **options)
        self.num_steps, self.non_backtracking = num_steps, non_backtracking
        self.multiscale = z_values is not None
        if z_values is not None:
            if any(not 0.0 < z < 1.0 for z in z_values):
                raise ValueError(f"z_values must lie in (0, 1), got {z_values}")
            scaled = torch.tensor(z_values) / (1.0 - STABILITY_EPS)
            logits = torch.logit(scaled.clamp(1e-7, 1.0 - 1e-7))
            del self.z_logit
            if options.get("learnable_z", True):
                self.z_logits = nn.Parameter(logits)
            else:
                self.register_buffer("z_logits", logits)
            self.mixture_logits = nn.Parameter(torch.zeros(len(z_values)))

    @property
    def z_values(self) -> Tensor:
        """The walk scales ``z_m`` of a multi-scale encoding."""
        return torch.sigmoid(self.z_logits) * (1.0 - STABILITY_EPS)

    def coefficients(self) -> Tensor:
        """``c_k``, ``k = 0..K``: ``z^k``, or ``sum_m p_m z_m^k`` (multi-scale)."""
        if not self.multiscale:
            return walk_coefficients(self.z, self.num_steps)
        mixture = torch.softmax(self.mixture_logits, dim=0)
        scales = torch.stack([walk_coefficients(z, self.num_steps) for z in self.z_values])
        return mixture @ scales

    def transport(self, re, im, graph):
        return sparse_transport(
            re,
            im,
            graph,
            self.frequencies,
            self.coefficients(),
            non_backtracking=self.non_backtracking,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_steps={self.num_steps}"


@register("aw-rope-exact")
class AWRoPEExact(AnalyticWalkRoPE):
    """AW-RoPE, exact variant: ``(I - z T)^{-1}`` applied to q and k by a dense
    differentiable solve per graph and channel (official ``exact_walk_resolvent``; the
    same parameters as ``aw-rope``). For graphs of up to a few hundred nodes."""

    paper = "AW-RoPE (analytic-walk graph rotary, exact resolvent; jiaqingxie/AW-RoPE)"

    def transport(self, re, im, graph):
        return exact_transport(re, im, graph, self.frequencies, self.z)
