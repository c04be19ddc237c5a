"""SiPE, syntax-informed positions: a learned syntactic prior multiplied into a relative bias
(``sipe``).

"Syntax-informed Positional Embeddings" (SiPE; arXiv id not confirmed): no paper text or code
was found, only the abstract. The claim: a
lightweight syntactic prior, learned from dependency parses during pretraining, injected into
the positional encoding; for autoregressive decoders with a relative PE it works best
*multiplied into the relative-position term* of the attention score; one parse at inference.

Reconstruction (assumed; the abstract gives neither the prior's inputs nor its form):

    logit_hij = s_hij + pi_h(tau_ij) * beta_h(p_i - p_j)
    tau_ij    = (up_ij, down_ij)          steps from token i up to the lowest common
                                          ancestor of i and j in the parse, and down to j
    pi_h(tau) = 1 + MLP(min(up, M) / M, min(down, M) / M, [i, j in different trees])_h

* ``beta`` is a distance-only relative bias (option ``base``, default ``"t5"`` with its
  decoder buckets; any registered distance-only bias, e.g. ``kerple-log``, ``alibi``), the
  "relative-position term"; ``tau`` is the tree relation of ``relpos.graphs.tree_relations``
  (``up + down`` is the tree distance, ``up = 0``: i is an ancestor of j);
* the MLP (3 -> ``prior_hidden`` -> H, SiLU) has a zero last layer, so ``pi = 1`` at init
  and SiPE starts as its base; it is evaluated once per call on the
  ``(M + 1)^2 + 1`` relation classes, so the bias stays one element-wise formula (every
  backend, FlexAttention included);
* a pair whose base bias is infinite keeps it (a mask stays a mask).

The encoder form (the prior added to the input embeddings, the abstract's form for
encoders) is absolute and reads the parse, not positions, so it is not an ``Encoding`` (whose
``embed`` has no per-call inputs): ``syntax_features(heads)`` gives each token's
``(depth, head relation)`` classes (like CoordConv's ``add_coord_channels``, a function
beside the encodings) and ``relpos.nn.SyntaxEmbedding`` embeds them, ``embed(depth) +
embed(head relation)``, to be added to the token embeddings. Not built: the rotary form (the
abstract names it, but no text says what it rotates by, so it is not guessed).

Inputs: ``heads (B, L)`` int, the dependency head of each token (0-based token index, -1 for
a root; CoNLL-U's HEAD minus 1), checked as a parse (``check_parse``: integer, range, no
cycle, and one root per row with ``single_root``), or the precomputed
``relations (B, L, L, 2)`` (``tree_relations``), reusable by every layer. Positions are token
ids into the parse (``GraphEncoding``); ``p_i - p_j`` is the base's distance. Not relative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ...graphs import tree_relations
from ...validation import check_int
from .. import registry
from ..base import BiasContext
from ..options import Bool, Custom, Int, Str
from ..registry import register
from .base import (
    DEFAULT_MAX_NODES,
    MAX_NODES,
    GraphEncoding,
    GraphStructure,
    check_structure,
    example_forest,
)

__all__ = ["SyntaxPriorBias", "check_parse", "syntax_relations", "syntax_features"]

EXAMPLE_TOKENS = 64


def check_parse(heads: object, name: str = "inputs['heads']", *, single_root: bool = False):
    """Validate a batch of dependency parses ``heads (B, L)``: an integer tensor, every entry
    -1 (a root) or a token index ``0..L-1`` other than the token itself, no cycle (every token
    reaches a root), and exactly one root per row when ``single_root``. ``TypeError`` /
    ``ValueError`` naming ``name``, the row and the token. Returns ``heads`` as int64."""
    if not isinstance(heads, Tensor) or heads.is_floating_point() or heads.is_complex():
        got = heads.dtype if isinstance(heads, Tensor) else type(heads).__name__
        raise TypeError(f"{name} must be an integer (B, L) tensor of head indices, got {got}")
    if heads.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer (B, L) tensor of head indices, got bool")
    if heads.dim() != 2:
        raise ValueError(f"{name} must have shape (B, L), got {tuple(heads.shape)}")
    heads = heads.long()
    B, L = heads.shape
    if heads.numel() == 0:
        return heads
    bad = (heads < -1) | (heads >= L)
    if bool(bad.any()):
        b, t = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"{name} entries must be -1 (the root) or a token index 0..{L - 1}, got "
            f"{int(heads[b, t])} at row {b}, token {t}"
        )
    own = heads == torch.arange(L, device=heads.device)
    if bool(own.any()):
        b, t = (int(x) for x in own.nonzero()[0])
        raise ValueError(f"{name}: token {t} of row {b} is its own head (a parse is a tree)")
    # pointer doubling: after 2^s >= L steps every token of a tree has left through a root
    jump = heads  # the ancestor 2^s steps up (-1 above a root)
    for _ in range(math.ceil(math.log2(L)) if L > 1 else 0):
        jump = torch.where(jump >= 0, jump.gather(1, jump.clamp_min(0)), jump)
    cyclic = jump >= 0
    if bool(cyclic.any()):
        b, t = (int(x) for x in cyclic.nonzero()[0])
        raise ValueError(
            f"{name} contains a cycle through token {t} of row {b}: a dependency parse is a "
            f"tree (every token reaches a root, -1)"
        )
    if single_root:
        roots = (heads == -1).sum(1)
        wrong = (roots != 1).nonzero()
        if wrong.numel():
            b = int(wrong[0, 0])
            raise ValueError(
                f"{name} row {b} has {int(roots[b])} roots, expected exactly one (single_root="
                f"True; pass single_root=False for several sentences or padding per row)"
            )
    return heads


def syntax_relations(heads: Tensor, *, single_root: bool = False) -> Tensor:
    """``tau (B, L, L, 2)`` int64 ``(up, down)`` of a checked parse (``check_parse``), -1 for
    tokens of different trees: the precomputed ``inputs['relations']`` of ``sipe``."""
    heads = check_parse(heads, "heads", single_root=single_root)
    _, up, down = tree_relations(heads, "heads")
    return torch.stack((up, down), dim=-1)


def syntax_features(
    heads: Tensor, *, max_depth: int = 8, max_offset: int = 8, single_root: bool = False
) -> tuple[Tensor, Tensor]:
    """SiPE's encoder-form inputs (reconstructed from the abstract): each token's depth class and
    head-relation class, ``(B, L)`` int64 each, from a parse ``heads (B, L)`` (checked by
    ``check_parse``; -1 for a root).

    * depth: ``min(depth, max_depth)``, the steps from the token up to its root
      (``relpos.graphs.tree_relations``), ``max_depth + 1`` classes;
    * head relation: 0 for a root; else ``min(|h - t|, M)`` (1..M) when the head h lies left
      of token t and ``M + min(|h - t|, M)`` (M+1..2M) when it lies right (M =
      ``max_offset``): the head's side and its clipped token distance, ``2 M + 1`` classes.
    """
    heads = check_parse(heads, "heads", single_root=single_root)
    max_depth = check_int(max_depth, "max_depth")
    max_offset = check_int(max_offset, "max_offset")
    depth, _, _ = tree_relations(heads, "heads")
    t = torch.arange(heads.shape[1], device=heads.device)
    offset = (heads - t).abs().clamp(max=max_offset)
    side = torch.where(heads > t, max_offset, 0)
    relation = torch.where(heads < 0, 0, side + offset)
    return depth.clamp(max=max_depth), relation


@dataclass
class SyntaxPriorData(GraphStructure):
    """The call's relation class per pair (``structure (B, N, N)``) and the prior of every
    class ``prior (R, H)`` (``pi = 1 + MLP``)."""

    prior: Tensor | None = None


def _base_checker(value: Any, name: str) -> str:
    value = Str()(value, name)
    if value not in registry.available():
        raise ValueError(f"{name} must name a registered distance-only bias, got {value!r}")
    return value


def _dict_checker(value: Any, name: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"{name} must be a dict of the base's options, got {type(value).__name__}")
    return dict(value)


BASE_BIAS = Custom(
    checker=_base_checker,
    invalid=((3, TypeError), ("not-an-encoding", ValueError), ("rope", ValueError)),
    doc="registered distance-only bias multiplied by the prior",
)
BASE_BIAS_OPTIONS = Custom(
    checker=_dict_checker, invalid=((3, TypeError),), doc="options of the base bias"
)


@register("sipe")
class SyntaxPriorBias(GraphEncoding):
    """SiPE's decoder form: ``pi_h(tau_ij) * beta_h(p_i - p_j)`` (see the module docstring;
    reconstructed from the abstract).

    Args:
        base: the registered distance-only bias ``beta`` ("t5").
        base_options: its options ({}).
        max_relation: ``M``, up and down steps clipped to ``M`` (8).
        prior_hidden: hidden width of the prior's MLP (32).
        single_root: each row's parse must have exactly one root (False: several sentences
            or padding tokens, each its own root, are allowed).
        max_nodes: the longest parse (positions are token ids below it).
    """

    paper = "SiPE (syntax-informed PE; decoder form: parse prior x relative bias; abstract only)"
    structure_input = "relations"
    optional_inputs = {
        "heads": "(B, L) int dependency head of each token, -1 for a root",
        "relations": "(B, L, L, 2) int (up, down) from relpos.encodings.graph.sipe."
        "syntax_relations",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: Annotated[str, BASE_BIAS] = "t5",
        base_options: Annotated[dict | None, BASE_BIAS_OPTIONS] = None,
        max_relation: Annotated[int, Int(doc="M: up / down steps clipped to M")] = 8,
        prior_hidden: Annotated[int, Int(doc="hidden width of the prior's MLP")] = 32,
        single_root: Annotated[bool, Bool(doc="exactly one root per row")] = False,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        options = base_options or {}
        self.base = registry.create(base, num_heads=num_heads, head_dim=head_dim, **options)
        usable = (
            self.base.distance_only
            and not self.base.has_rotary
            and not self.base.needs_probabilities
            and not (self.base.required_inputs or self.base.needs_inputs)
        )
        if not usable:
            raise ValueError(
                f"base must name a distance-only bias without rotation or per-call inputs "
                f"(t5, kerple-log, alibi, ...), got {base!r}"
            )
        self.causal_only = self.base.causal_only
        self.max_relation, self.single_root = max_relation, single_root
        self.prior = nn.Sequential(
            nn.Linear(3, prior_hidden), nn.SiLU(), nn.Linear(prior_hidden, num_heads)
        )
        nn.init.zeros_(self.prior[2].weight)  # pi = 1: SiPE starts as its base
        nn.init.zeros_(self.prior[2].bias)
        inner = tuple(f"base.{n}" for n in self.base.own_init_modules)
        self.own_init_modules = ("prior", *(("base",) if self.base.keeps_own_init else inner))
        M = max_relation
        up, down = torch.meshgrid(torch.arange(M + 1), torch.arange(M + 1), indexing="ij")
        classes = torch.stack((up.flatten() / M, down.flatten() / M, torch.zeros(up.numel())), 1)
        classes = torch.cat((classes, torch.tensor([[0.0, 0.0, 1.0]])))  # different trees
        self.register_buffer("classes", classes, persistent=False)

    def structure(self, inputs: dict[str, Tensor]) -> Tensor:
        """The relation class ``(B, N, N)``: ``min(up, M) (M + 1) + min(down, M)``, the last
        class for tokens of different trees."""
        if "relations" in inputs:
            rel = check_structure(
                inputs["relations"],
                "relations",
                "(B, N, N, 2)",
                dims=4,
                last=2,
                integer=True,
                minimum=-1,
            )
            up, down = rel[..., 0].long(), rel[..., 1].long()
        elif "heads" in inputs:
            heads = check_parse(inputs["heads"], single_root=self.single_root)
            _, up, down = tree_relations(heads, "inputs['heads']")
        else:
            raise ValueError("pass inputs={'heads': (B, L)} or the precomputed 'relations'")
        M = self.max_relation
        index = up.clamp(max=M) * (M + 1) + down.clamp(max=M)
        return torch.where(up < 0, self.classes.shape[0] - 1, index)

    def precompute(self, q, k, ctx, inputs) -> SyntaxPriorData:
        found = super().precompute(q, k, ctx, inputs)
        classes = self.classes.to(self.prior[0].weight.dtype)
        return SyntaxPriorData(found.structure, 1.0 + self.prior(classes))

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        beta = self.base.bias_at_distance(h, ctx.q_pos[b, i] - ctx.k_pos[b, j])
        scaled = ctx.data.prior[self.pair(ctx, b, i, j), h] * beta
        return torch.where(torch.isinf(beta), beta, scaled)

    @classmethod
    def example_options(cls) -> dict:
        return {"max_nodes": EXAMPLE_TOKENS}  # (conformance positions reduced into 64 tokens)

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"relations": _example_relations(batch)}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_relation={self.max_relation}"


@lru_cache(maxsize=4)
def _example_relations(batch: int) -> Tensor:
    """Relations of random parses of ``EXAMPLE_TOKENS`` tokens, two sentences per row."""
    heads = example_forest(batch, EXAMPLE_TOKENS, 0)[0].clone()
    heads[:, EXAMPLE_TOKENS * 5 // 8] = -1  # the second sentence
    return syntax_relations(heads)
