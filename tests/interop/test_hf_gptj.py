"""GPT-J and CodeGen under ``relpos.interop.hf.patch``: exact, though their rotary module
indexes a table of sines and cosines by position and returns ``(sin, cos)``.

transformers 5.25 (``models/gptj/modeling_gptj.py``, ``models/codegen/modeling_codegen.py``):
the decoder's ``rotary_emb`` keeps ``embed_positions`` (row ``p``: ``sin | cos`` of ``p *
10000^(-2i/r)``, ``r = rotary_dim``) and returns ``(sin, cos)`` for the position ids; each
attention layer rotates interleaved pairs (``rotate_every_two``) over its first
``rotary_dim`` channels and hands q and k to transformers' attention interface. The patch
switches the table's rotation off by its row 0 (the identity, in the module's own order),
reads the base from the table and the pairs from the model's own code (the probe).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from hf_families import PAD, STEPS, _forward_and_decode, _inputs  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402
from relpos.interop.hf.probe import identity_rotation, position_table, table_base  # noqa: E402

FAMILIES = ("gptj", "codegen")


def _model(family: str, n_positions: int = 64):
    import transformers as tf

    sizes = dict(
        vocab_size=128, n_positions=n_positions, n_embd=64, n_layer=2, n_head=4, rotary_dim=8
    )
    config = tf.GPTJConfig(**sizes) if family == "gptj" else tf.CodeGenConfig(n_ctx=64, **sizes)
    torch.manual_seed(0)
    cls = tf.GPTJForCausalLM if family == "gptj" else tf.CodeGenForCausalLM
    return cls(config).float().eval()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference over the real (not pad) tokens, relative to the largest logit."""
    a = torch.cat([a[0], a[1, PAD:]]) if a.shape[1] > STEPS else a
    b = torch.cat([b[0], b[1, PAD:]]) if b.shape[1] > STEPS else b
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rotary_module_is_switched_off_in_its_own_sin_cos_order(family):
    rotary = _model(family).transformer.rotary_emb
    x = torch.zeros(1, 4, 8)
    sin, cos = rotary(x, position_ids=torch.tensor([[1, 2, 5, 9]]))
    assert position_table(rotary) is rotary.embed_positions
    off_sin, off_cos = identity_rotation((sin, cos), "rotary_emb", rotary)
    assert torch.equal(off_sin, torch.zeros_like(sin))  # sin 0 first: the module's order
    assert torch.equal(off_cos, torch.ones_like(cos))
    # what the module itself gives at position 0
    at_zero = rotary(x, position_ids=torch.zeros(1, 4, dtype=torch.long))
    assert all(torch.equal(a, b) for a, b in zip(at_zero, (off_sin, off_cos), strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_probe_reads_interleaved_pairs_over_rotary_dim_and_the_tables_base(family):
    facts = inspect_model(_model(family), probe=True)
    assert math.isclose(facts.rope["full_attention"].base, 10000.0, rel_tol=1e-6)
    for layer in facts.layers:
        assert (layer.layout, layer.rotary_dim, layer.head_dim) == ("interleaved", 8, 16)
        assert layer.permutation is None


def test_the_base_is_read_from_the_table_not_assumed():
    positions = torch.arange(32, dtype=torch.float64)[:, None]
    inv_freq = 500000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    angles = (positions * inv_freq).float()
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    assert math.isclose(table_base(table), 500000.0, rel_tol=1e-5)
    with pytest.raises(ValueError, match="not 1"):
        table_base(torch.cat([(2 * angles).sin(), (2 * angles).cos()], dim=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_baseline_is_bit_identical_and_rope_exact_in_forward_and_decoding(family):
    model = _model(family)
    inputs = _inputs()
    ref, ref_steps = _forward_and_decode(model, *inputs)
    with patch(model, "baseline"):
        base, base_steps = _forward_and_decode(model, *inputs)
    assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    with patch(model, "rope", backend="eager"):
        rope, rope_steps = _forward_and_decode(model, *inputs)
    assert _relative(rope, ref) <= 1e-5
    assert _relative(rope_steps, ref_steps) <= 1e-5
    # the same comparison fails for a RoPE the model does not compute: half-split pairs
    with patch(model, "rope", backend="eager", layout="half"):
        wrong, wrong_steps = _forward_and_decode(model, *inputs)
    assert _relative(wrong, ref) > 1e-3 and _relative(wrong_steps, ref_steps) > 1e-3
    # unpatched again: the model's own table and forward are back
    assert torch.equal(_forward_and_decode(model, *inputs)[0], ref)
    assert "forward" not in vars(model.transformer.rotary_emb)


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_past_the_table_run_under_the_patch(family):
    model = _model(family, n_positions=16)
    inputs = _inputs(24)
    with pytest.raises(IndexError):  # the model alone indexes its 16-row table
        _forward_and_decode(model, *inputs)
    with patch(model, "self-extend", group_size=4, neighbor_window=6):
        full, steps = _forward_and_decode(model, *inputs)
    assert torch.isfinite(full).all()
    assert _relative(steps, full[:, -STEPS:]) <= 1e-5


def test_unpatching_puts_back_a_forward_set_on_the_rotary_module_before():
    model = _model("gptj")
    rotary = model.transformer.rotary_emb
    calls = []

    def wrapped(*args, **kwargs):  # as accelerate's device hooks wrap a module's forward
        calls.append(1)
        return type(rotary).forward(rotary, *args, **kwargs)

    rotary.forward = wrapped
    inputs = _inputs()
    with patch(model, "rope", backend="eager"):
        assert rotary.forward is not wrapped
        calls.clear()
        _forward_and_decode(model, *inputs)
        assert calls  # the patched forward goes through it (at position 0)
    assert rotary.forward is wrapped
