"""The relative-table reader (``relpos.encodings.contextual.table``): ``DistanceRows``,
``TableRead``, per-block products (``Encoding.block_context``), and the state dicts of the
encodings built on it.

The numerical agreement of every encoding with its dense paper formula is tested in the
module's own test file (test_embedding_table.py, test_transformer_xl.py, test_deberta.py);
here: the reader's bookkeeping, and that per-block products change nothing but their size.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.attention import chunked
from relpos.encodings.base import BiasContext
from relpos.encodings.contextual.table import (
    NO_ROW,
    DistanceRows,
    RowIndex,
    TableRead,
    distance_range,
)

H, D = 4, 8
NAMES = {  # encodings on the reader, with options that make every part active at test sizes
    "shaw": {"max_relative_position": 5},
    "nezha": {"max_relative_position": 6},
    "music-transformer": {"max_relative_position": 50},
    "huang2020-m3": {"max_position_embeddings": 40},
    "huang2020-m4": {"max_position_embeddings": 40},
    "transformer-xl": {"clamp_len": 30},
    "deberta": {"position_buckets": 8, "max_relative_positions": 32},
}


def test_distance_range_is_per_batch_row_and_covers_both_signs() -> None:
    q = torch.tensor([[10, 11], [0, 1]])
    k = torch.tensor([[0, 1, 2], [5, 6, 7]])
    assert distance_range(q, k) == (-7, 11)  # row 1: 0 - 7; row 0: 11 - 0 (never 11 - 5)
    assert distance_range(q, k, both_signs=True) == (-11, 11)
    assert distance_range(q[:, :0], k) == (0, 0)


def test_distance_rows_pin_a_clipped_window_and_its_restriction() -> None:
    """Shaw-like rows ``clip(-d, -2, 2) + 2`` over d = q - k of positions 0..5."""
    pos = torch.arange(6)[None]
    rows = DistanceRows.build(lambda d: (-d).clamp(-2, 2) + 2, pos, pos, bounds=(-3, 3))
    assert (rows.lo, rows.hi, rows.first, rows.count, rows.gaps) == (-3, 3, 0, 5, False)
    assert rows.lookup.tolist() == [4, 4, 3, 2, 1, 0, 0]  # d = -3 .. 3
    # a block of queries 4..5 against keys 0..5 reaches d = -1 .. 5, rows 0 .. 3
    part = rows.restrict(pos[:, 4:], pos)
    assert (part.lo, part.hi, part.first, part.count) == (-1, 3, 0, 4)
    assert part.lookup.tolist() == [3, 2, 1, 0, 0]


def test_distance_rows_mark_pairs_without_a_row() -> None:
    """Zero beyond a causal window of 3 rows (Music Transformer): future keys and d >= 3 have
    no row; ``at`` clamps the row and says which pairs are inside."""
    pos = torch.arange(5)[None]
    rows = DistanceRows.build(
        lambda d: torch.where((d >= 0) & (d < 3), 2 - d, NO_ROW), pos, pos, bounds=(-1, 3)
    )
    assert rows.gaps and rows.lookup.tolist() == [-1, 2, 1, 0, -1]
    ctx = BiasContext(q_pos=pos, k_pos=pos)
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    r = rows.at(ctx, b, torch.arange(5)[None, None, :, None], torch.arange(5)[None, None, None, :])
    want_inside = (pos[0, :, None] - pos[0, None, :]).clamp(-1, 3)
    want_inside = (want_inside >= 0) & (want_inside < 3)
    assert torch.equal(r.inside[0, 0], want_inside)
    assert int(r.rows.min()) >= 0


def test_a_key_read_of_a_shared_table_keeps_the_key_heads() -> None:
    """Grouped-query keys: a shared table read by 2 key heads serves 4 query heads."""
    k = torch.randn(1, 2, 5, D)
    table = torch.randn(7, D)
    read = TableRead.keys(k, table, 0, num_heads=4)
    assert read.products.shape == (1, 2, 5, 7) and read.group == 2
    rows = torch.randint(0, 7, (1, 1, 3, 5))
    got = read.read(
        torch.zeros(1, 1, 1, 1, dtype=torch.long),
        torch.arange(4)[None, :, None, None],
        torch.arange(5)[None, None, None, :],
        RowIndex(rows, None, 0),
    )
    want = torch.einsum("bhjd,ijd->bhij", k, table[rows[0, 0]]).repeat_interleave(2, dim=1)
    torch.testing.assert_close(got, want)


def test_block_products_cover_only_the_rows_the_block_reaches() -> None:
    """The unclipped Music Transformer over L = 64: the call reaches 64 rows, a causal block of
    queries 16..23 against keys 0..23 only 24 (distances 0..23): its products are (B, H, 8, 24),
    never (B, H, L, L)."""
    L = 64
    enc = relpos.create("music-transformer", num_heads=H, head_dim=D, max_relative_position=L)
    q = torch.randn(2, H, L, D)
    pos = torch.arange(L)[None]
    ctx = enc.prepare(q, q, pos, pos)
    assert ctx.data.query.products is None  # query reads are formed per block
    assert ctx.data.rows.count == L
    block = enc.block_context(ctx, torch.arange(16, 24), torch.arange(24))
    assert block.data.query.products.shape == (2, H, 8, 24)
    assert (block.data.rows.first, block.data.rows.count) == (L - 24, 24)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_block_context_gives_the_bias_of_the_whole_call(name) -> None:
    torch.manual_seed(0)
    enc = relpos.create(name, num_heads=H, head_dim=D, **NAMES[name]).double()
    q = torch.randn(2, H, 20, D, dtype=torch.float64)
    k = torch.randn(2, H // 2, 26, D, dtype=torch.float64)
    q_pos = torch.tensor([[3 * t for t in range(20)], [t + 6 for t in range(20)]])
    k_pos = torch.tensor([[2 * t for t in range(26)], list(range(26))])
    ctx = enc.prepare(q, k, q_pos, k_pos)
    ctx.scale = 0.5
    b = torch.arange(2)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    i, j = torch.arange(5, 12), torch.arange(3, 20)
    whole = enc.bias(ctx, b, h, i[None, None, :, None], j[None, None, None, :])
    block = enc.block_context(ctx, i, j)
    got = enc.bias(block, b, h, i[None, None, :, None], j[None, None, None, :])
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_chunked_tiles_equal_eager_forward_and_backward(name, monkeypatch) -> None:
    """Many small tiles (per-tile products inside the checkpoint) against ``eager``, float64,
    batch 2, grouped-query keys, causal: outputs and every gradient."""
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 40 * 40)
    torch.manual_seed(1)
    enc = relpos.create(name, num_heads=H, head_dim=D, **NAMES[name]).double()
    monkeypatch.setattr(enc, "block_rows", lambda ctx: 1)  # 16-row tiles even with key reads
    q = torch.randn(2, H, 40, D, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(2, 2, H // 2, 40, D, dtype=torch.float64).unbind(0)
    k.requires_grad_(), v.requires_grad_()
    leaves = [q, k, v] + [p for p in enc.parameters() if p.requires_grad]
    results = {}
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend)
        results[backend] = (out, torch.autograd.grad((out * out).sum(), leaves))
    torch.testing.assert_close(results["chunked"][0], results["eager"][0], rtol=0, atol=1e-12)
    for got, want in zip(results["chunked"][1], results["eager"][1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


STATE_KEYS = {  # parameter and buffer names of the default instances (checkpoints load by them)
    "shaw": {"key_table": (33, D), "value_table": (33, D)},
    "nezha": {},  # the sinusoid is a non-persistent buffer
    "music-transformer": {"key_table": (H, 2048, D)},
    "huang2020-m3": {"distance_embedding": (1023, D)},
    "huang2020-m4": {"distance_embedding": (1023, D)},
    "transformer-xl": {"r_net.weight": (H * D, H * D), "r_w_bias": (H, D), "r_r_bias": (H, D)},
    "deberta": {
        "rel_embeddings": (512, H * D),
        "rel_norm.weight": (H * D,),
        "rel_norm.bias": (H * D,),
        "pos_key_proj.weight": (H * D, H * D),
        "pos_key_proj.bias": (H * D,),
        "pos_query_proj.weight": (H * D, H * D),
        "pos_query_proj.bias": (H * D,),
    },
}


@pytest.mark.parametrize("name", sorted(STATE_KEYS))
def test_state_dicts_keep_their_names_and_shapes(name) -> None:
    """Checkpoints saved before the table reader load unchanged: same keys, same shapes."""
    enc = relpos.create(name, num_heads=H, head_dim=D)
    got = {key: tuple(t.shape) for key, t in enc.state_dict().items()}
    assert got == STATE_KEYS[name]
    fresh = relpos.create(name, num_heads=H, head_dim=D)
    fresh.load_state_dict(enc.state_dict())  # strict


def test_block_rows_cover_the_rows_of_a_key_read() -> None:
    """Chunked tiles of a table encoding have at least ``MIN_BLOCK_ROWS`` query rows, and at
    least R with a key read (DeBERTa's p2c, Huang's method 4: the key read's (B, H, Lk, R)
    gradient is a per-tile cost)."""
    q = torch.randn(1, H, 64, D)
    pos = torch.arange(64)[None]
    deberta = relpos.create("deberta", num_heads=H, head_dim=D)
    least = deberta.MIN_BLOCK_ROWS
    ctx = deberta.prepare(q, q, pos, pos)
    assert deberta.block_rows(ctx) == least and ctx.data.rows.count == 127
    wide = relpos.create("huang2020-m4", num_heads=H, head_dim=D, max_position_embeddings=2048)
    q, pos = torch.randn(1, H, 700, D), torch.arange(700)[None]
    assert wide.block_rows(wide.prepare(q, q, pos, pos)) == 1399  # distances -699 .. 699
    music = relpos.create("music-transformer", num_heads=H, head_dim=D)
    assert music.block_rows(music.prepare(q, q, pos, pos)) == least  # queries only
