"""SiPE's encoder form (a reconstruction from the abstract): each token's depth
and head relation from a dependency parse, embedded and added to the token embeddings."""

from __future__ import annotations

import pytest
import torch

from relpos.encodings.graph.sipe import syntax_features
from relpos.nn import SyntaxEmbedding

# "the old man saw a dog": det -> man, amod -> man, man -> saw (root), det -> dog, dog -> saw
HEADS = torch.tensor([[2, 2, 3, -1, 5, 3]])


def test_depth_and_head_relation_classes_of_a_parse():
    depth, relation = syntax_features(HEADS, max_depth=8, max_offset=8)
    assert depth.tolist() == [[2, 2, 1, 0, 2, 1]]
    # head to the right: M + distance; to the left: distance; the root: 0
    assert relation.tolist() == [[8 + 2, 8 + 1, 8 + 1, 0, 8 + 1, 2]]
    depth, relation = syntax_features(HEADS, max_depth=1, max_offset=1)
    assert depth.tolist() == [[1, 1, 1, 0, 1, 1]]
    assert relation.tolist() == [[2, 2, 2, 0, 2, 1]]


def test_the_embedding_starts_at_zero_and_trains_per_class():
    emb = SyntaxEmbedding(6)
    out = emb(HEADS)
    assert out.shape == (1, 6, 6) and torch.count_nonzero(out) == 0
    with torch.no_grad():
        emb.depth.weight.copy_(torch.arange(9, dtype=torch.float32)[:, None].expand(9, 6))
        rows = 100 * torch.arange(17, dtype=torch.float32)
        emb.relation.weight.copy_(rows[:, None].expand(17, 6))
    got = emb(HEADS)[0, :, 0].tolist()
    assert got == [2 + 1000, 2 + 900, 1 + 900, 0, 2 + 900, 1 + 200]
    emb(HEADS).sum().backward()
    assert emb.depth.weight.grad is not None and emb.relation.weight.grad is not None


def test_bad_parses_are_refused_naming_heads():
    emb = SyntaxEmbedding(4)
    with pytest.raises(ValueError, match="heads contains a cycle"):
        emb(torch.tensor([[1, 0]]))
    with pytest.raises(TypeError, match="heads must be an integer"):
        emb(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="exactly one"):
        SyntaxEmbedding(4, single_root=True)(torch.tensor([[-1, -1]]))
    with pytest.raises(ValueError, match="max_depth"):
        SyntaxEmbedding(4, max_depth=0)
