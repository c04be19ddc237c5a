"""``relpos.interop.hf.patch`` on tiny random transformers models (Llama, Qwen2, Mistral,
Gemma-3 text, Phi-3): baseline is the unpatched model bit for bit; the schedules and RoPE
scalings equal relpos's own ``LlamaLM`` on the same weights (forward and KV-cache decoding);
padding, GQA, partial rotary, per-layer RoPE, bf16; every refusal by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny import FAMILIES, left_padded, model, tokens  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from relpos.interop.hf import from_hf, patch  # noqa: E402
from relpos.registry import encoding_class  # noqa: E402

SCHEDULES = ("self-extend", "dca", "lm-infinite")


def logits(m, ids, **kw):
    with torch.no_grad():
        return m(ids, **kw).logits


# ------------------------------------------------------------------------------ baseline


@pytest.mark.parametrize("family", FAMILIES)
def test_baseline_is_bit_identical_to_the_unpatched_model_padded_and_unpadded(family):
    m = model(family)
    ids = tokens(24)
    batch, mask, pos = left_padded(ids)
    ref = logits(m, ids)
    ref_pad = logits(m, batch, attention_mask=mask, position_ids=pos)
    with patch(m, "baseline") as handle:
        assert m.config._attn_implementation == handle.name
        assert torch.equal(logits(m, ids), ref)
        assert torch.equal(logits(m, batch, attention_mask=mask, position_ids=pos), ref_pad)
    assert m.config._attn_implementation == "sdpa"
    # relpos's own backends on the model's rotated q/k agree too (real tokens only: a
    # padded query row that sees no key is 0 in relpos, transformers leaves it undefined)
    for backend in ("sdpa", "chunked", "eager"):
        with patch(m, "baseline", backend=backend):
            torch.testing.assert_close(logits(m, ids), ref, atol=1e-5, rtol=0)
            out = logits(m, batch, attention_mask=mask, position_ids=pos)
            torch.testing.assert_close(out[0], ref_pad[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(out[1, 5:], ref_pad[1, 5:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_baseline_greedy_generate_gives_the_unpatched_tokens(family):
    m = model(family)
    batch, mask, _ = left_padded(tokens(12), pad=3)
    kw = dict(attention_mask=mask, max_new_tokens=3, do_sample=False)
    ref = m.generate(batch, **kw)
    with patch(m, "baseline"):
        assert torch.equal(m.generate(batch, **kw), ref)
    with patch(m, "baseline", backend="chunked"):
        assert torch.equal(m.generate(batch, **kw), ref)


@pytest.mark.parametrize("method", ["baseline", "self-extend"])
def test_padding_reaches_the_patched_attention_through_the_registered_mask_builder(method):
    """The trap: transformers builds no mask for an implementation without a mask builder and
    every layer then ignores padding (0.44 logit error measured). With the builder the padded
    row equals the same tokens unpadded; with it removed, baseline goes wrong and the
    schedules refuse (their key positions no longer follow from position_ids)."""
    m = model("llama")
    options = encoding_class(method).example_options() if method != "baseline" else {}
    ids = tokens(40)
    batch, mask, pos = left_padded(ids)
    with patch(m, method, **options) as handle:
        builder = AttentionMaskInterface._global_mapping[handle.name]
        assert builder.__name__ == "sdpa_mask"
        alone = logits(m, ids[:, :35])[0]
        padded = logits(m, batch, attention_mask=mask, position_ids=pos)[1, 5:]
        torch.testing.assert_close(padded, alone, atol=2e-6, rtol=0)
        del AttentionMaskInterface._global_mapping[handle.name]  # the trap
        try:
            if method == "baseline":
                ignored = logits(m, batch, attention_mask=mask, position_ids=pos)[1, 5:]
                assert (ignored - alone).abs().max() > 1e-2
            else:
                with pytest.raises(ValueError, match="not contiguous"):
                    logits(m, batch, attention_mask=mask, position_ids=pos)
        finally:
            AttentionMaskInterface._global_mapping[handle.name] = builder
    assert handle.name not in AttentionMaskInterface._global_mapping


# ------------------------------------------------------------------------------ schedules


def relpos_twin(hf, method, options):
    lm = from_hf(hf).eval()
    lm.set_encoding(method, **options)
    return lm


@pytest.mark.parametrize("method", SCHEDULES)
def test_schedules_through_the_patch_equal_relpos_llama_on_the_same_weights(method):
    options = encoding_class(method).example_options()
    hf = model("llama")
    ids = tokens(40, batch=2)
    plain = logits(hf, ids)
    lm = relpos_twin(hf, method, options)
    with torch.no_grad():
        expected = lm(ids)
    with patch(hf, method, **options):
        out = logits(hf, ids)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=0)
    assert (out - plain).abs().max() > 1e-3  # the schedule changes the model here


def test_self_extend_pins_its_reference_values():
    """Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325; official code
    datamllab/LongLM) with G=4, W=6 (fractional shift 4.5) on the tiny Llama: regression values
    pinned on torch 2.13 CPU."""
    hf = model("llama", num_hidden_layers=2)
    with patch(hf, "self-extend", group_size=4, neighbor_window=6):
        out = logits(hf, tokens(40))
    expected = torch.tensor([0.0582158, -0.2498933, 0.1514538, 0.0050236])
    torch.testing.assert_close(out[0, -1, :4], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", SCHEDULES)
def test_schedules_decode_with_the_kv_cache_as_the_full_forward(method):
    options = encoding_class(method).example_options()
    hf = model("llama")
    ids = tokens(40)
    with patch(hf, method, **options), torch.no_grad():
        full = hf(ids).logits
        cache = DynamicCache(config=hf.config)
        steps = [hf(ids[:, :36], cache=cache, use_cache=True).logits[:, -1]]
        for t in range(36, 39):
            steps.append(hf(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 35:39], atol=2e-6, rtol=0)


@pytest.mark.parametrize("method", SCHEDULES)
def test_schedules_on_a_left_padded_batch_equal_each_row_alone(method):
    options = encoding_class(method).example_options()
    hf = model("llama")
    ids = tokens(40)
    batch, mask, pos = left_padded(ids)
    lm = relpos_twin(hf, method, options)
    with torch.no_grad():
        alone = lm(ids[:, :35])[0]
    with patch(hf, method, **options):
        out = logits(hf, batch, attention_mask=mask, position_ids=pos)
    torch.testing.assert_close(out[1, 5:], alone, atol=2e-6, rtol=0)


def test_generate_through_the_patch_gives_relpos_llama_tokens():
    options = {"group_size": 4, "neighbor_window": 6}
    hf = model("llama")
    ids = tokens(30)
    lm = relpos_twin(hf, "self-extend", options)
    expected = lm.generate(ids, 6)
    with patch(hf, "self-extend", **options):
        out = hf.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("method", SCHEDULES)
def test_generate_on_a_left_padded_batch_gives_each_rows_tokens(method):
    """Decoding with pads in the KV cache: key positions follow from each row's last query
    position, so the padded row decodes as it does alone."""
    options = encoding_class(method).example_options()
    hf = model("llama")
    ids = tokens(30)
    batch, mask, _ = left_padded(ids, pad=4)
    lm = relpos_twin(hf, method, options)
    alone = lm.generate(ids[:, :26], 5)[0, 26:]
    with patch(hf, method, **options):
        out = hf.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(out[1, 30:], alone)


def test_the_chunked_backend_gives_the_same_schedule():
    options = encoding_class("dca").example_options()
    hf = model("llama")
    ids = tokens(40)
    with patch(hf, "dca", **options):
        eager = logits(hf, ids)
    with patch(hf, "dca", backend="chunked", **options):
        chunked = logits(hf, ids)
    torch.testing.assert_close(chunked, eager, atol=2e-6, rtol=0)


# ------------------------------------------------------------------------------ RoPE scalings

SCALINGS = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
    {"rope_type": "dynamic", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
def test_rope_scalings_through_the_patch_equal_relpos_llama(scaling):
    hf = model("llama", max_position_embeddings=16)
    ids = tokens(40)
    lm = relpos_twin(hf, "rope", {"scaling": scaling})
    with torch.no_grad():
        expected = lm(ids)
    with patch(hf, "rope", scaling=scaling) as handle:
        assert handle.encoding(0).scaling["rope_type"] == scaling["rope_type"]
        out = logits(hf, ids)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=0)


def test_the_models_own_scaling_is_what_relpos_computes():
    """A model configured with YaRN: relpos's ``rope`` takes the config's dict and matches
    transformers' own rotary (float32 angles there, float64 products here)."""
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    hf = model("llama", rope_scaling=scaling)
    ids = tokens(40)
    ref = logits(hf, ids)
    with patch(hf, "rope") as handle:
        assert handle.encoding(0).scaling["rope_type"] == "yarn"
        torch.testing.assert_close(logits(hf, ids), ref, atol=1e-5, rtol=0)


def decode_vs_prefix(hf, ids, start):
    """Largest gap between KV-cache decoding logits and a fresh forward over each prefix."""
    gap = 0.0
    with torch.no_grad():
        cache = DynamicCache(config=hf.config)
        hf(ids[:, :start], cache=cache, use_cache=True)
        for t in range(start, ids.shape[1]):
            step = hf(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            prefix = hf(ids[:, : t + 1]).logits[:, -1]
            gap = max(gap, float((step - prefix).abs().max()))
    return gap


def test_dynamic_ntk_is_consistent_under_the_kv_cache():
    """Each decoding step uses the frequencies of its own length for every key (the cache
    holds raw keys, relpos rotates them per call): step t equals a fresh forward over the
    first t + 1 tokens. transformers keeps each key rotated with the frequencies of the step
    that cached it, so its steps do not. One layer: deeper layers' cached values depend on
    the frequencies of the prefill in both."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    hf = model("llama", max_position_embeddings=16, num_hidden_layers=1, rope_scaling=scaling)
    ids = tokens(30)
    assert decode_vs_prefix(hf, ids, 26) > 1e-4  # transformers' own dynamic NTK
    with patch(hf, "rope") as handle:
        assert handle.encoding(0).scaling["rope_type"] == "dynamic"
        assert decode_vs_prefix(hf, ids, 26) < 2e-6


# ------------------------------------------------------------------------------ model features


def test_per_layer_rope_and_sliding_window_of_gemma3():
    hf = model("gemma3")
    ids = tokens(24)  # longer than the window of 8: the window mask is in force
    ref = logits(hf, ids)
    with patch(hf, "rope") as handle:
        assert handle.encoding(0).base == 1e4 and handle.encoding(1).base == 1e6
        torch.testing.assert_close(logits(hf, ids), ref, atol=1e-5, rtol=0)


def test_partial_rotary_of_phi3():
    hf = model("phi3")
    ids = tokens(24)
    ref = logits(hf, ids)
    with patch(hf, "rope") as handle:
        assert handle.encoding(0).rotary_dim == 8  # half of 16 channels
        torch.testing.assert_close(logits(hf, ids), ref, atol=1e-5, rtol=0)


def test_bfloat16():
    hf = model("llama")
    ids = tokens(40)
    lm = relpos_twin(hf, "self-extend", {"group_size": 4, "neighbor_window": 6})
    with torch.no_grad():
        expected = lm(ids)
    hf = hf.to(torch.bfloat16)
    ref = logits(hf, ids)
    with patch(hf, "baseline"):
        assert torch.equal(logits(hf, ids), ref)
    with patch(hf, "self-extend", group_size=4, neighbor_window=6):
        out = logits(hf, ids)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=0)


def test_unpatch_restores_the_model_and_its_rope():
    hf = model("llama")
    ids = tokens(40)
    ref = logits(hf, ids)
    handle = patch(hf, "self-extend", group_size=4, neighbor_window=6)
    assert not torch.equal(logits(hf, ids), ref)
    handle.unpatch()
    handle.unpatch()  # idempotent
    assert hf.config._attn_implementation == "sdpa"
    assert torch.equal(logits(hf, ids), ref)


# ------------------------------------------------------------------------------ refusals


def test_accepts_softcapping():
    import transformers as tf

    cfg = tf.Gemma2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attn_logit_softcapping=50.0,
    )
    hf = tf.Gemma2ForCausalLM(cfg).eval()
    ids = tokens(12)
    with torch.no_grad():
        full = hf(ids).logits
    with patch(hf, "self-extend", group_size=4, neighbor_window=16), torch.no_grad():
        extended = hf(ids).logits  # accepted: the cap reaches relpos.attention
    torch.testing.assert_close(extended, full, rtol=0, atol=1e-5)  # all within the window


def test_refuses_models_that_do_not_use_the_attention_interface():
    """What the layers do decides, not transformers' ``_supports_attention_backend`` flag: a
    Llama whose flag is False still dispatches (and runs); one whose layers call transformers'
    eager function directly (a config of their own that says ``eager``) is refused."""
    import copy

    import transformers as tf

    class Forked(tf.LlamaForCausalLM):
        _supports_attention_backend = False

    from hf_tiny import config

    hf = Forked(config("llama")).eval()
    with patch(hf, "baseline"):
        logits(hf, tokens(8))
    for layer in hf.model.layers:
        layer.self_attn.config = copy.copy(layer.self_attn.config)
        layer.self_attn.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="layers.0.self_attn .* attention interface"):
        patch(hf, "baseline")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        patch(torch.nn.Linear(2, 2), "baseline")


def test_refuses_packed_sequences_for_schedules():
    hf = model("llama")
    ids = tokens(20)
    pos = torch.cat([torch.arange(10), torch.arange(10)])[None]
    with patch(hf, "self-extend", group_size=4, neighbor_window=6):
        with pytest.raises(ValueError, match="packed"):
            logits(hf, ids, position_ids=pos)


def test_refuses_a_static_cache_for_schedules():
    hf = model("llama")
    with patch(hf, "self-extend", group_size=4, neighbor_window=6):
        with pytest.raises(ValueError, match="StaticCache"):
            hf.generate(
                tokens(10), max_new_tokens=3, do_sample=False, cache_implementation="static"
            )
    with patch(hf, "baseline"):  # the model's own RoPE: the mask holds everything
        hf.generate(tokens(10), max_new_tokens=3, do_sample=False, cache_implementation="static")


def test_refuses_attention_dropout_in_training():
    hf = model("llama", attention_dropout=0.1).train()
    with patch(hf, "alibi"):
        with pytest.raises(ValueError, match="dropout"):
            hf(tokens(8))


@pytest.mark.parametrize(
    ("method", "options", "match"),
    [
        ("baseline", {"group_size": 4}, "baseline"),
        ("no-such-encoding", {}, "no-such-encoding"),
        ("sinusoidal", {}, "token embeddings"),
        ("graph-spd", {}, "per-call inputs"),
        ("rope-axial", {}, "2-D positions"),
    ],
)
def test_refuses_methods_it_cannot_run(method, options, match):
    with pytest.raises(ValueError, match=match):
        patch(model("llama"), method, **options)


def test_refuses_an_encoding_that_cannot_take_the_models_partial_rotary():
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        patch(model("phi3"), "complexformer")


def test_refuses_backends_that_cannot_run_the_method_and_unknown_ones():
    hf = model("llama")
    with pytest.raises(ValueError, match="backend 'sdpa' cannot run method 'self-extend'"):
        patch(hf, "self-extend", backend="sdpa")
    with pytest.raises(ValueError, match="backend must be"):
        patch(hf, "baseline", backend="fast")


def test_refuses_a_second_patch_and_unsupported_attention_arguments():
    hf = model("llama")
    with patch(hf, "rope") as handle:
        with pytest.raises(ValueError, match="already patched"):
            patch(hf, "baseline")
        attn = hf.model.layers[0].self_attn
        q = torch.randn(1, 4, 12, 16)
        kv = torch.randn(1, 2, 12, 16)
        pos = torch.arange(12)[None]
        hf(tokens(4))  # the rotary hook has run
        with pytest.raises(ValueError, match="sliding window 8"):
            handle.attend(attn, q, kv, kv, None, position_ids=pos, sliding_window=8)
        capped, _ = handle.attend(attn, q, kv, kv, None, position_ids=pos, softcap=0.5)
        plain, _ = handle.attend(attn, q, kv, kv, None, position_ids=pos)
        assert not torch.allclose(capped, plain)  # the cap reaches relpos.attention
        with pytest.raises(ValueError, match="position_bias"):
            handle.attend(attn, q, kv, kv, None, position_ids=pos, position_bias=q)
        with pytest.raises(ValueError, match="position_ids"):
            handle.attend(attn, q, kv, kv, None)
