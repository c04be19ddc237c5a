"""BiPE-RoPE (He et al. 2024) against the spec: formulas-rotary.md §35 and R.16.

R.16 (the reference repo's own ``get_bilevel_ids``, Llama separators ``.`` = 869 and newline =
13): ids ``[5, 6, 869, 7, 8, 9, 13, 10]`` -> intra ``[0, 1, 2, 0, 1, 2, 3, 0]``, segment
``[0, 0, 0, 1, 1, 1, 1, 2]``. Checked through the encoding's hook and through the positions a
``TransformerLM`` actually uses (input embedding, cached key positions).
"""

from __future__ import annotations

import torch

import relpos
from relpos.nn import TransformerLM

R16_IDS = [5, 6, 869, 7, 8, 9, 13, 10]
R16_INTRA = [0, 1, 2, 0, 1, 2, 3, 0]
R16_SEGMENT = [0, 0, 0, 1, 1, 1, 1, 2]
LLAMA_SEPARATORS = [869, 13]  # spec §35: '.' and newline in the Llama tokenizer
TRAIN_SCALE = 1024  # config/bipe_rope.json


def r16_model() -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(
        1000,
        dim=32,
        depth=2,
        num_heads=4,
        encoding="bipe-rope",
        encoding_options={"separators": LLAMA_SEPARATORS},
    )
    with torch.no_grad():  # sharp attention: the rotary positions change the output
        for block in model.blocks:
            block.attn.q_proj.weight.normal_(std=0.3)
            block.attn.kv_proj.weight.normal_(std=0.3)
    return model.eval()


def test_r16_positions_from_the_hook():
    enc = relpos.create("bipe-rope", num_heads=4, head_dim=8, separators=LLAMA_SEPARATORS)
    got = enc.positions_from_tokens(torch.tensor([R16_IDS]))
    assert got.input.tolist() == [R16_INTRA]
    assert got.attention.tolist() == [R16_SEGMENT]
    # the next token would continue segment 2 at offset 1 (10 is not a separator)
    assert got.state.tolist() == [[1, 2]]


def test_r16_defaults_match_the_reference_config():
    enc = relpos.create("bipe-rope", num_heads=12, head_dim=64, separators=LLAMA_SEPARATORS)
    assert enc.max_intra == TRAIN_SCALE and enc.intra.table.shape == (TRAIN_SCALE, 768)
    assert enc.base == 10000.0 and enc.layout == "half"  # HF Llama rotate_half
    # offsets clip at train_scale - 1 = 1023 ...
    rows = enc.embed(torch.tensor([[1022, 1023, 1024, 5000]]), 768)
    torch.testing.assert_close(rows[0, 2:], enc.intra.table[1023].expand(2, 768))
    # ... and, unlike the reference (padding_idx = -1 zeroes and freezes row 1023), relpos keeps
    # row 1023 an ordinary learned row (the documented decision, spec §35 pitfall)
    assert enc.intra.table[1023].abs().sum() > 0 and enc.intra.table.requires_grad


@torch.no_grad()
def test_r16_through_the_model_forward():
    """The model's input is token embedding + intra row R16_INTRA, and its attention uses the
    R16_SEGMENT positions: equal to passing them explicitly, unlike plain arange positions."""
    model = r16_model()
    ids = torch.tensor([R16_IDS])
    seen = {}

    def keep_input(module, args) -> None:
        seen["x"] = args[0]

    hook = model.blocks[0].register_forward_pre_hook(keep_input)
    logits = model(ids)
    hook.remove()
    table = model.input_encoding.intra.table
    expected = model.embed.weight[ids] + table[torch.tensor([R16_INTRA])]
    torch.testing.assert_close(seen["x"], expected, rtol=0, atol=0)
    explicit = model(ids, pos=(torch.tensor([R16_INTRA]), torch.tensor([R16_SEGMENT])))
    torch.testing.assert_close(logits, explicit, rtol=0, atol=0)
    arange = torch.arange(8)[None]
    wrong = model(ids, pos=(torch.tensor([R16_INTRA]), arange))
    assert (wrong - logits).abs().max() > 1e-3


@torch.no_grad()
def test_r16_through_kv_cache_decoding():
    """Token by token, the cache ends up with keys at the R.16 segment positions and the
    logits equal the full forward (the reference code forbids a cache; relpos continues the
    positions from the cached prefix)."""
    model = r16_model()
    ids = torch.tensor([R16_IDS])
    cache = model.new_cache()
    steps = [model(ids[:, t : t + 1], cache=cache) for t in range(len(R16_IDS))]
    assert cache.layers[0].k_pos.tolist() == [R16_SEGMENT]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids), rtol=1e-5, atol=1e-5)
