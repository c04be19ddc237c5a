"""Tree relations (``tree``): the bias reads the (up, down) table."""

from __future__ import annotations

import torch

import relpos


def test_tree_bias_reads_the_up_down_table():
    parent = torch.tensor([[-1, 0, 0, 1]])  # 0 -> {1, 2}, 1 -> 3
    enc = relpos.create("tree", num_heads=1, head_dim=8, max_up=1, max_down=2)
    with torch.no_grad():
        enc.table.copy_(torch.arange(enc.table.numel(), dtype=torch.float32)[:, None])
    q = torch.zeros(1, 1, 4, 8)
    s = relpos.scores(q, q, enc, inputs={"parent": parent})[0, 0].detach()
    # pair (3, 2): up 2 (clipped to 1), down 1 -> 1 * 3 + 1 = 4; pair (0, 3): up 0, down 2 -> 2
    assert float(s[3, 2]) == 4.0 and float(s[0, 3]) == 2.0 and float(s[2, 2]) == 0.0
