"""vLLM's ``dual_chunk_attention_config`` (``chunk_size``, ``local_size``) is relpos's ``dca``
with ``chunk_size`` and ``local_window = local_size``: the rotary positions of its three
query tables and its keys (vllm ``model_executor/layers/rotary_embedding/dual_chunk_rope.py``,
``_compute_cos_sin_cache`` / ``forward_native``), restated here, equal relpos's pieces."""

from __future__ import annotations

import torch

import relpos


def test_piece_positions_equal_vllms_dual_chunk_tables() -> None:
    chunk_size, local_size = 12, 2
    chunk_len = chunk_size - local_size
    enc = relpos.create(
        "dca", num_heads=1, head_dim=8, chunk_size=chunk_size, local_window=local_size
    )
    p = torch.arange(45)[None]
    (intra_q, k0), (succ_q, k1), (inter_q, k2) = enc.piece_positions(p, p)
    # vLLM: q_t = p mod c; qc_t = min(p mod c + c, chunk_size); inter = qc_t[c - 1]; k = p mod c
    q_t = p % chunk_len
    qc = torch.clamp(q_t + chunk_len, max=chunk_size)
    inter = min(chunk_len - 1 + chunk_len, chunk_size)
    assert torch.equal(intra_q, q_t) and torch.equal(succ_q, qc)
    assert torch.equal(inter_q, torch.full_like(p, inter))
    for keys in (k0, k1, k2):
        assert torch.equal(keys, p % chunk_len)
