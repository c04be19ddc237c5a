"""``SyntaxEmbedding``: SiPE's encoder form, an absolute embedding of each token's place in a
dependency parse, added to the token embeddings ("Syntax-informed Positional Embeddings";
only the abstract was available, no code: a reconstruction).

The abstract: a lightweight syntactic prior learned from dependency parses is injected into
the PE; for encoders it is *added to the input embeddings*. The encoder form taken here is
``embed(depth, head relation)``; its reconstruction (assumed: the abstract gives neither
the features nor how they combine):

    e_t = D[min(depth_t, M_d)] + R[head relation of t]                (dim,)

with the classes of ``relpos.encodings.graph.sipe.syntax_features`` (the depth below the
root, and the head's side and clipped token distance, 0 for a root) and two learned tables
``D (M_d + 1, dim)``, ``R (2 M + 1, dim)``, zero-initialised so a model starts as it would
without the parse. The decoder form, a prior multiplied into a relative bias, is the
``sipe`` encoding; the rotary form is not built (no text says what it rotates by).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..encodings.graph.sipe import syntax_features
from ..validation import check_bool, check_int

__all__ = ["SyntaxEmbedding"]


class SyntaxEmbedding(nn.Module):
    """``forward(heads (B, L) int) -> (B, L, dim)``: the parse embedding of every token.

    Args:
        dim: the model width.
        max_depth: depths are clipped to this (8).
        max_offset: head distances are clipped to this (8).
        single_root: each row's parse must have exactly one root (False: several sentences
            or padding tokens, each its own root, are allowed).

    Use: ``x = model_embed(tokens) + SyntaxEmbedding(dim)(heads)``. The parse is checked
    (``check_parse``: integers, range, no cycle), errors naming ``heads``.
    """

    def __init__(
        self, dim: int, *, max_depth: int = 8, max_offset: int = 8, single_root: bool = False
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.max_depth = check_int(max_depth, "max_depth")
        self.max_offset = check_int(max_offset, "max_offset")
        self.single_root = check_bool(single_root, "single_root")
        self.depth = nn.Embedding(self.max_depth + 1, self.dim)
        self.relation = nn.Embedding(2 * self.max_offset + 1, self.dim)
        nn.init.zeros_(self.depth.weight)
        nn.init.zeros_(self.relation.weight)

    def forward(self, heads: Tensor) -> Tensor:
        depth, relation = syntax_features(
            heads,
            max_depth=self.max_depth,
            max_offset=self.max_offset,
            single_root=self.single_root,
        )
        device = self.depth.weight.device
        return self.depth(depth.to(device)) + self.relation(relation.to(device))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_depth={self.max_depth}, max_offset={self.max_offset}"
