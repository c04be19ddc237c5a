"""``relpos.interop.hf.patch`` on HunYuanVL's text decoder (``HunYuanVLForConditionalGeneration``).

HunYuanVL's rotary module (transformers ``models/hunyuan_vl/modeling_hunyuan_vl.py``,
``HunYuanVLRotaryEmbedding.recomposition_frequencies``) splits the doubled vector
``cat(theta, theta)`` in bands of ``2 * mrope_section[a]`` channels, band ``a`` on position
axis ``a`` (3 or 4 axes; the checkpoints' ``xdrope_section`` is the same list), so the two
channels of a pair may follow different axes: relpos's ``m-rope`` with
``section_split="channels"``. Its attention then normalizes q and k per head
(``query_layernorm`` / ``key_layernorm``) after ``apply_rotary_pos_emb``. On text positions
(equal on every axis) the map is a rotation, which that norm commutes with: ``rope`` is
exact. On positions that differ between axes it is not a rotation, so the norm the model
divides by is not that of the q and k the patch receives: ``rope`` refuses them by name.
Without those norms (replaced by the identity) the probe maps the layers to the channel
split and ``rope`` is exact on image positions too.

Tiny random models from transformers' own classes (no downloads), float32; the logits are
compared with the unpatched model's, in the full forward and in KV-cache decoding.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from test_hf_mrope import (  # noqa: E402
    QK_SCALE,
    STEPS,
    TEXT_SIZES,
    forward_and_decode,
    relative,
    tokens,
)

from relpos import create  # noqa: E402
from relpos.interop.hf import inspect_model, patch  # noqa: E402

#: float32 rounding, relative to the largest logit
RTOL = 1e-5
#: (mrope_section over the 8 pairs of a 16-channel head, the checkpoints' NTK alpha)
CASES = [((2, 3, 3), None), ((2, 2, 2, 2), 1000.0)]


def hunyuan_vl(sections, alpha=None, *, post_norm=True):
    """The tiny HunYuanVL (seed 0, eval): a 2-layer text decoder of 4 query / 2 key-value
    heads of 16 channels, a 1-block vision tower. ``alpha``: the checkpoints' ``"dynamic"``
    dict with a fixed alpha (transformers' ``ntk_alpha``). ``post_norm=False`` replaces the
    q / k norms after RoPE by the identity."""
    import transformers as tf

    cfg = tf.AutoConfig.for_model("hunyuan_vl")
    text = cfg.text_config
    for key, value in TEXT_SIZES.items():
        setattr(text, key, value)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(sections)}
    if alpha is not None:
        rope = {**rope, "rope_type": "dynamic", "alpha": alpha, "factor": 1.0}
    text.rope_parameters = rope
    vision = cfg.vision_config
    for key, value in dict(
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        out_hidden_size=64,
        text_hidden_size=64,
    ).items():
        setattr(vision, key, value)
    for offset, key in enumerate(("image_token_id", "im_start_id", "im_end_id", "im_newline_id")):
        setattr(cfg, key, 120 + offset)
    torch.manual_seed(0)
    model = tf.HunYuanVLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for attention in model.model.language_model.layers:
            attn = attention.self_attn
            if post_norm:  # one scale for every channel: the norm still commutes with RoPE
                attn.query_layernorm.weight.mul_(QK_SCALE)
                attn.key_layernorm.weight.mul_(QK_SCALE)
            else:
                attn.query_layernorm, attn.key_layernorm = nn.Identity(), nn.Identity()
                attn.q_proj.weight.mul_(QK_SCALE)
                attn.k_proj.weight.mul_(QK_SCALE)
    return model


def text_positions(batch: int, length: int, axes: int) -> torch.Tensor:
    return torch.arange(length).expand(axes, batch, -1).contiguous()


def image_positions(batch: int, length: int, axes: int) -> torch.Tensor:
    """``(axes, B, L)``: 5 text tokens, a 3 x 4 image (HunYuanVL's axes (width, height, image
    index), after a position axis for 4 axes), then text from 9 on (every axis)."""
    rows = [list(range(5)) for _ in range(axes)]
    for i in range(12):
        grid = [5 + i % 4, 5 + i // 4, 1]
        for axis, value in enumerate(grid if axes == 3 else [5, *grid]):
            rows[axis].append(value)
    after = list(range(9, 9 + length - 17))
    row = torch.tensor([r + after for r in rows])
    return row[:, None].expand(-1, batch, -1).contiguous()


@pytest.mark.parametrize(("sections", "alpha"), CASES)
def test_without_the_norm_after_rope_the_channel_split_is_exact_on_images(sections, alpha):
    """The probe maps the layers to relpos's m-rope with ``section_split="channels"`` and
    the config's sections; ``rope`` then equals the unpatched model on an image's positions
    (the cached keys include the image tokens); ``baseline`` is bit-identical."""
    model = hunyuan_vl(sections, alpha, post_norm=False)
    axes = len(sections)
    facts = inspect_model(model, probe=True)
    assert facts.position_axes == axes and facts.axes_refusal is None
    assert [layer.channel_sections for layer in facts.layers] == [sections, sections]
    ids, pos = tokens(2, 22), image_positions(2, 22, axes)
    ref, ref_steps = forward_and_decode(model, ids, pos)
    with patch(model, "baseline"):
        base, base_steps = forward_and_decode(model, ids, pos)
    assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    with patch(model, "rope", backend="eager") as handle:
        encoding = handle.encoding(0)
        assert type(encoding).__name__ == "MRoPE" and encoding.section_split == "channels"
        full, steps = forward_and_decode(model, ids, pos)
        assert relative(full, ref) <= RTOL
        assert relative(steps, ref_steps) <= RTOL
        # the check can fail: Qwen2-VL's split of the same sections by pairs is far off
        pairs = create(
            "m-rope", num_heads=4, head_dim=16, mrope_section=list(sections), **_rope(alpha)
        )
        handle.encodings["full_attention"] = pairs
        wrong, _ = forward_and_decode(model, ids, pos)
    assert relative(wrong, ref) > 1e-3


def _rope(alpha):
    return {} if alpha is None else {"scaling": {"rope_type": "ntk_alpha", "alpha": alpha}}


@pytest.mark.parametrize(("sections", "alpha"), CASES)
def test_hunyuan_vl_is_exact_on_text_and_refuses_image_positions_by_name(sections, alpha):
    """HunYuanVL as built (q / k norms after RoPE): ``baseline`` is bit-identical on text
    and image positions; ``rope`` equals the unpatched model on text positions (full forward
    and cached decoding) and refuses positions that differ between axes, naming the norm."""
    model = hunyuan_vl(sections, alpha)
    axes = len(sections)
    ids = tokens(2, 22)
    text, image = text_positions(2, 22, axes), image_positions(2, 22, axes)
    for pos in (text, image):
        ref, ref_steps = forward_and_decode(model, ids, pos)
        with patch(model, "baseline"):
            base, base_steps = forward_and_decode(model, ids, pos)
        assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    ref, ref_steps = forward_and_decode(model, ids, text)
    with patch(model, "rope", backend="eager") as handle:
        assert handle.facts.position_axes == axes
        full, steps = forward_and_decode(model, ids, text)
        assert relative(full, ref) <= RTOL
        assert relative(steps, ref_steps) <= RTOL
        refusal = (
            r"multi-axis \(M-RoPE\) position_ids that differ between axes .* only up to one "
            r"scale per head vector .* the model normalizes q and k after its RoPE"
        )
        with pytest.raises(ValueError, match=refusal):
            forward_and_decode(model, ids, image)
    # the check can fail: the image's positions change the model's logits
    image_ref, _ = forward_and_decode(model, ids, image)
    assert relative(image_ref, ref) > 1e-2


def test_hunyuan_vl_self_extend_runs_text_positions_and_refuses_image_positions():
    model = hunyuan_vl((2, 3, 3))
    ids = tokens(1, 22)
    with patch(model, "self-extend", group_size=4, neighbor_window=6):
        full, steps = forward_and_decode(model, ids, text_positions(1, 22, 3))
        assert relative(steps, full[:, -STEPS:]) <= RTOL
        with pytest.raises(ValueError, match=r"relpos's m-rope runs them for method 'rope'"):
            forward_and_decode(model, ids, image_positions(1, 22, 3))


def test_hunyuan_vl_norm_weights_that_differ_within_a_pair_are_refused():
    """A trained norm weighs the two channels of a pair differently: after the rotation it
    no longer commutes with it, so even text positions are not relpos's rope of the q and k
    the patch receives; the probe refuses and baseline stays bit-identical."""
    model = hunyuan_vl((2, 3, 3))
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.query_layernorm.weight.mul_(torch.linspace(0.5, 1.5, 16))
    ids, pos = tokens(1, 12), text_positions(1, 12, 3)
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=pos).logits
        with patch(model, "baseline"):
            assert torch.equal(model(input_ids=ids, position_ids=pos).logits, ref)
    with pytest.raises(ValueError, match=r"hunyuan_vl layer 0: relpos's rope .* differs"):
        patch(model, "rope")
