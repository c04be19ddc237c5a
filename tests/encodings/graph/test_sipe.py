"""SiPE (``sipe``; a reconstruction from the abstract): a hand-worked parse, the tree relations
against networkx tree distances, the prior multiplied into its base, and the parse checks."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.graph.sipe import check_parse, syntax_relations

# "The cat sat on the mat": The -> cat, cat -> sat (root), on -> mat, the -> mat, mat -> sat
HEADS = torch.tensor([[1, 2, -1, 5, 5, 2]])
# hand-worked (up, down): depths sat 0; cat, mat 1; The, on, the 2
UP = [
    [0, 1, 2, 2, 2, 2],  # The: up to itself / cat / sat ...
    [0, 0, 1, 1, 1, 1],
    [0, 0, 0, 0, 0, 0],
    [2, 2, 2, 0, 1, 1],
    [2, 2, 2, 1, 0, 1],
    [1, 1, 1, 0, 0, 0],
]
DOWN = [
    [0, 0, 0, 2, 2, 1],
    [1, 0, 0, 2, 2, 1],
    [2, 1, 0, 2, 2, 1],
    [2, 1, 0, 0, 1, 0],
    [2, 1, 0, 1, 0, 0],
    [2, 1, 0, 1, 1, 0],
]


def test_relations_of_a_hand_worked_parse():
    rel = syntax_relations(HEADS)[0]
    assert rel[..., 0].tolist() == UP
    assert rel[..., 1].tolist() == DOWN


def _features(up, down, M):
    up, down = torch.as_tensor(up), torch.as_tensor(down)
    cross = (up < 0).float()
    return torch.stack((up.clamp(0, M) / M, down.clamp(0, M) / M, cross), -1)


def test_bias_is_the_prior_of_the_relation_times_the_base():
    torch.manual_seed(0)
    enc = relpos.create("sipe", num_heads=2, head_dim=8, max_relation=2)
    torch.nn.init.normal_(enc.prior[2].weight)  # a prior that is not 1
    zeros = torch.zeros(1, 2, 6, 8)
    s = relpos.scores(zeros, zeros, enc, inputs={"heads": HEADS})[0].detach()
    pi = 1 + enc.prior(_features(UP, DOWN, 2)).detach()  # (6, 6, H); up / down clipped at 2
    d = torch.arange(6)[:, None] - torch.arange(6)[None]
    beta = torch.stack([enc.base.bias_at_distance(torch.tensor(h), d) for h in range(2)])
    torch.testing.assert_close(s, pi.permute(2, 0, 1) * beta.detach())
    assert not torch.allclose(pi, torch.ones_like(pi))


@pytest.mark.parametrize("base", ["t5", "kerple-log", "alibi"])
def test_sipe_starts_as_its_base(base):
    """The prior's last layer is zero: pi = 1, the scores are the base's."""
    torch.manual_seed(0)
    enc = relpos.create("sipe", num_heads=4, head_dim=8, base=base)
    torch.manual_seed(0)
    ref = relpos.create(base, num_heads=4, head_dim=8)
    enc.base.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 6, 8, generator=gen), torch.randn(2, 4, 6, 8, generator=gen)
    inputs = {"heads": HEADS.expand(2, 6)}
    out = relpos.scores(q, k, enc, inputs=inputs)
    torch.testing.assert_close(out, relpos.scores(q, k, ref))


def test_relations_match_networkx_tree_distances_and_ancestors():
    nx = pytest.importorskip("networkx")
    gen = torch.Generator().manual_seed(2)
    n = 30
    heads = (torch.rand(n, generator=gen) * torch.arange(n)).long()
    heads[torch.tensor([0, 11, 20])] = -1  # three sentences
    heads = torch.tensor(_relabel(heads, gen))  # heads to the right too, as in real parses
    rel = syntax_relations(heads[None])[0]
    tree = nx.DiGraph()
    tree.add_nodes_from(range(n))
    tree.add_edges_from((int(h), t) for t, h in enumerate(heads.tolist()) if h >= 0)
    undirected = tree.to_undirected()
    distance = dict(nx.all_pairs_shortest_path_length(undirected))
    for i in range(n):
        for j in range(n):
            up, down = rel[i, j].tolist()
            if j not in distance[i]:
                assert up == down == -1
                continue
            assert up + down == distance[i][j]
            lca = nx.lowest_common_ancestor(tree, i, j)
            assert down == nx.shortest_path_length(tree, lca, j)


def _relabel(heads: torch.Tensor, gen: torch.Generator) -> list[int]:
    """The same forest with its tokens in a random order (heads may point right)."""
    n = heads.numel()
    perm = torch.randperm(n, generator=gen)  # token t becomes perm[t]
    out = [0] * n
    for t, h in enumerate(heads.tolist()):
        out[int(perm[t])] = -1 if h < 0 else int(perm[h])
    return out


def test_tokens_of_different_sentences_get_their_own_prior():
    torch.manual_seed(0)
    enc = relpos.create("sipe", num_heads=1, head_dim=8, base="alibi")
    torch.nn.init.normal_(enc.prior[2].weight)
    heads = torch.tensor([[-1, 0, 0, -1, 3]])  # two sentences
    zeros = torch.zeros(1, 1, 5, 8)
    s = relpos.scores(zeros, zeros, enc, inputs={"heads": heads})[0, 0].detach()
    pi_cross = 1 + enc.prior(torch.tensor([0.0, 0.0, 1.0])).detach()
    alibi = enc.base.bias_at_distance(torch.tensor(0), torch.tensor(4 - 1)).detach()
    torch.testing.assert_close(s[4, 1], pi_cross[0] * alibi)


def test_precomputed_relations_equal_the_heads():
    torch.manual_seed(0)
    enc = relpos.create("sipe", num_heads=2, head_dim=8)
    torch.nn.init.normal_(enc.prior[2].weight)
    q = torch.randn(1, 2, 6, 8)
    a = relpos.scores(q, q, enc, inputs={"heads": HEADS})
    b = relpos.scores(q, q, enc, inputs={"relations": syntax_relations(HEADS)})
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "heads,error,match",
    [
        (torch.tensor([[1.0, -1.0]]), TypeError, "integer"),
        (torch.tensor([1, -1]), ValueError, r"shape \(B, L\)"),
        (torch.tensor([[1, -1, 7]]), ValueError, "0..2, got 7 at row 0, token 2"),
        (torch.tensor([[1, -1, -3]]), ValueError, "got -3"),
        (torch.tensor([[-1, 1, 0]]), ValueError, "token 1 of row 0 is its own head"),
        (torch.tensor([[-1, 2, 3, 1]]), ValueError, "cycle through token 1 of row 0"),
    ],
)
def test_bad_parses_raise_errors_that_name_the_input(heads, error, match):
    enc = relpos.create("sipe", num_heads=1, head_dim=8)
    L = heads.shape[-1]
    q = torch.zeros(1, 1, L, 8)
    with pytest.raises(error, match=match) as info:
        relpos.scores(q, q, enc, inputs={"heads": heads})
    assert "inputs['heads']" in str(info.value)


def test_single_root_requires_one_root_per_row():
    two = torch.tensor([[-1, 0, -1, 2]])
    check_parse(two)  # several sentences: allowed by default
    with pytest.raises(ValueError, match="row 0 has 2 roots"):
        check_parse(two, single_root=True)
    enc = relpos.create("sipe", num_heads=1, head_dim=8, single_root=True)
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="roots"):
        relpos.scores(q, q, enc, inputs={"heads": two})


@pytest.mark.parametrize("base", ["rope", "shaw", "graph-spd", "not-an-encoding"])
def test_base_must_be_a_distance_only_bias(base):
    with pytest.raises(ValueError, match="base"):
        relpos.create("sipe", num_heads=2, head_dim=8, base=base)


def test_base_options_reach_the_base():
    enc = relpos.create("sipe", num_heads=2, head_dim=8, base_options={"num_buckets": 8})
    assert enc.base.num_buckets == 8
    with pytest.raises(TypeError, match="base_options"):
        relpos.create("sipe", num_heads=2, head_dim=8, base_options=[("num_buckets", 8)])
