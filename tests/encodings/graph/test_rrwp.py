"""GRIT's RRWP pair encoding (``grit-rrwp``): bias and value term against a dense reference,
forward and backward, on the eager and chunked backends."""

from __future__ import annotations

import torch

import relpos
from relpos.graphs import adjacency_from_edges, random_walk_probabilities

from ._graphs import random_graphs


def test_grit_value_term_matches_dense_reference():
    edges, _, sizes = random_graphs(3, sizes=(12, 12))
    adj, _ = adjacency_from_edges(edges, sizes)
    torch.manual_seed(0)
    enc = relpos.create("grit-rrwp", num_heads=2, head_dim=8, steps=4, values=True)
    P = random_walk_probabilities(adj, 4)  # (B, N, N, K)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(3))
    logits = q @ k.transpose(-1, -2) / 8**0.5 + torch.einsum("bijk,hk->bhij", P, enc.weight)
    p = logits.softmax(-1)
    ref = p @ v + torch.einsum("bhij,bijk,hkd->bhid", p, P, enc.value_weight)
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, enc, inputs={"adjacency": adj}, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        g = torch.autograd.grad(out.square().sum(), (q, enc.value_weight, enc.weight))
        r = torch.autograd.grad(
            ref.square().sum(), (q, enc.value_weight, enc.weight), retain_graph=True
        )
        for a, b in zip(g, r, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
