"""Every causal-LM family of the installed transformers is exact under
``relpos.interop.hf.patch`` or refused by name (``hf_families.py`` builds and checks them);
the probe reads each convention from the model's own code."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402
from hf_tiny import model, tokens  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402

#: family -> the words its refusal must name (families not listed must be exact)
REFUSED = {
    "gpt_neox_japanese": "GPTNeoXJapaneseAttention) of the gpt_neox_japanese model uses its "
    "RoPE outside transformers' attention interface",
    "roformer": "the roformer model calls no function of transformers' attention interface (0 "
    "calls in a forward): its attention layers (RoFormerSelfAttention) compute their scores "
    "themselves",
}


def _family(model_type: str) -> tuple[str, str]:
    for family in hf_families.families():
        if family[0] == model_type:
            return family
    pytest.skip(f"transformers has no {model_type} causal LM")


@pytest.mark.parametrize("model_type", hf_families.REPRESENTATIVES)
def test_one_family_per_rope_convention_is_exact_or_refused_by_name(model_type):
    outcome = hf_families.check_family(*_family(model_type))
    if model_type in REFUSED:
        assert outcome.status == "refused", outcome
        assert REFUSED[model_type] in outcome.detail
    else:
        assert outcome.status == "exact", outcome


@pytest.mark.slow
def test_every_family_is_exact_refused_or_not_buildable():
    results = hf_families.walk()
    print()
    print(hf_families.table(results))
    silent = [r for r in results if r.status == "FAILED"]
    assert not silent, silent
    exact = {r.family for r in results if r.status == "exact"}
    assert {"llama", "cohere", "glm", "glm4", "helium", "nanochat", "ernie4_5"} <= exact
    for r in results:
        if r.status == "refused":
            assert r.detail.startswith(("relpos.interop.hf", "method")), r


# ------------------------------------------------------------------------------ the probe


def _tiny(model_type: str, **overrides):
    cfg = hf_families.tiny_config(model_type)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, _family(model_type)[1])(cfg).eval()


def test_the_probe_reads_each_convention_from_the_model():
    half = inspect_model(model("llama"), probe=True).layers[0]
    assert (half.layout, half.rotary_dim, half.permutation) == ("half", 16, None)
    cohere = inspect_model(_tiny("cohere"), probe=True).layers[0]
    assert (cohere.layout, cohere.rotary_dim, cohere.permutation) == ("interleaved", 16, None)
    glm = inspect_model(_tiny("glm"), probe=True).layers[0]  # first half, interleaved
    assert (glm.layout, glm.rotary_dim, glm.permutation) == ("interleaved", 8, None)
    phi3 = inspect_model(model("phi3"), probe=True).layers[0]
    assert (phi3.layout, phi3.rotary_dim) == ("half", 8)
    # NanoChat rotates by -p: its half-split pairs with their two channels swapped
    nanochat = inspect_model(_tiny("nanochat"), probe=True).layers[0]
    assert nanochat.permutation == (*range(8, 16), *range(8))


def test_roformer_rotary_table_is_found_and_its_own_attention_refused():
    """RoFormer (Su et al. 2021, arXiv:2104.09864) turns q and k by a frozen table of
    ``sin | cos`` one head wide (``RoFormerSinusoidalPositionalEmbedding``, an
    ``nn.Embedding``): discovery finds it (its base is RoFormer's 10000), and the patch
    refuses every method because RoFormer's self-attention computes its scores itself,
    never through the attention interface. Marian's table of the same layout is as wide as
    the hidden states, an absolute embedding added to them: not taken for RoPE."""
    from relpos.interop.hf.probe import position_table, rotary_modules, table_base

    hf = _tiny("roformer")
    table = hf.roformer.encoder.embed_positions
    assert rotary_modules(hf) == [table]
    assert position_table(table) is table.weight
    assert table_base(table.weight) == pytest.approx(10000.0, rel=1e-4)
    for method in ("baseline", "rope"):
        with pytest.raises(ValueError, match=r"calls no function of transformers' attention"):
            patch(hf, method)
    assert hf.config._attn_implementation == "eager"  # left as it was
    marian = _tiny("marian")
    assert position_table(marian.model.decoder.embed_positions) is not None
    assert rotary_modules(marian) == []


def test_zamba2_shared_attention_with_rope_is_refused_by_name():
    """Zamba2 with ``use_mem_rope`` (its default config, which the walk builds, has no RoPE)
    rotates q and k in its shared attention block, whose ``layer_idx`` is -1 (the calling
    layer reaches it as a forward argument): refused by name, not as a model without RoPE;
    ``baseline`` stays bit-identical."""
    hf = _tiny("zamba2", use_mem_rope=True)
    ids = tokens(12)
    with torch.no_grad():
        ref = hf(ids).logits
        with patch(hf, "baseline"):
            assert torch.equal(hf(ids).logits, ref)
    with pytest.raises(ValueError, match=r"layer_idx \(-1\) is not one of its 3 layers"):
        patch(hf, "rope")


def test_the_probe_finds_llama4_nope_layers():
    hf = _tiny("llama4_text")  # chunked-attention RoPE layers 0-2, a NoPE layer 3
    assert hf.config.no_rope_layers == [1, 1, 1, 0]
    layers = inspect_model(hf, probe=True).layers
    assert layers[0] is not None and layers[0].layout == "interleaved"
    assert layers[3] is None
    ids = tokens(20)
    with torch.no_grad():
        ref = hf(ids).logits
    with patch(hf, "rope", backend="eager") as handle, torch.no_grad():
        assert handle.encoding(3) is None
        torch.testing.assert_close(hf(ids).logits, ref, atol=1e-5, rtol=0)


def test_a_rotation_relpos_cannot_state_is_refused_with_what_was_found():
    """A model whose rotary module turns every pair twice as fast as its rope_theta says:
    the probe finds half-split pairs and names the difference."""
    hf = model("llama")

    def doubled(module, args, out):
        cos, sin = out
        return cos * cos - sin * sin, 2 * sin * cos

    hf.model.rotary_emb.register_forward_hook(doubled)
    with pytest.raises(ValueError, match=r"llama layer 0: relpos's rope .* differs"):
        patch(hf, "rope")
    with patch(hf, "baseline"):  # the model's own RoPE: nothing to match
        hf(tokens(8))


def test_the_probe_leaves_a_dynamic_ntk_model_as_it_was():
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    hf = model("llama", max_position_embeddings=16, rope_scaling=scaling)
    before = hf.model.rotary_emb.inv_freq.clone()
    inspect_model(hf, probe=True)  # its far row is beyond the trained length
    assert torch.equal(hf.model.rotary_emb.inv_freq, before)
    assert hf.model.rotary_emb.max_seq_len_cached == 16


# ------------------------------------------------------------------------------ softcap, sinks


@pytest.mark.parametrize(("model_type", "feature"), [("gemma2", "softcap"), ("gpt_oss", "s_aux")])
@pytest.mark.parametrize("backend", ["eager", "chunked", "auto"])
def test_softcapping_and_sinks_run_in_relpos_attention(model_type, feature, backend):
    """Gemma-2's softcap and gpt-oss's sinks reach ``relpos.attention``: baseline on a relpos
    backend equals the unpatched model (float32 rounding), and a relpos call sees them."""
    from relpos.attention import api

    hf = _tiny(model_type)
    batch, mask, pos = hf_families._inputs()
    ref, ref_steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    seen = []
    original = api._dispatch

    def spy(*args, **kwargs):
        seen.append((kwargs.get("softcap"), kwargs.get("sinks")))
        return original(*args, **kwargs)

    api._dispatch = spy
    try:
        with patch(hf, "baseline", backend=backend):
            out, steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    finally:
        api._dispatch = original
    err = max(hf_families._relative(out, ref), hf_families._relative(steps, ref_steps))
    assert err <= hf_families.RTOL, err
    softcap, sinks = seen[0]
    if feature == "softcap":
        assert softcap == hf.config.attn_logit_softcapping and sinks is None
    else:
        assert softcap is None and sinks is hf.model.layers[0].self_attn.sinks


def test_sdpa_cannot_softcap_and_says_so():
    hf = _tiny("gemma2")
    with (
        patch(hf, "baseline", backend="sdpa"),
        pytest.raises(ValueError, match="cannot apply softcap"),
    ):
        hf(tokens(8))


def test_the_cap_the_model_passes_is_the_cap_relpos_applies():
    """A cap the logits reach (0.01 instead of Gemma-2's 50): the unpatched model changes
    (the check has teeth) and relpos follows it."""
    hf = _tiny("gemma2")
    batch, mask, pos = hf_families._inputs()
    ref, _ = hf_families._forward_and_decode(hf, batch, mask, pos)
    for layer in hf.model.layers:
        layer.self_attn.attn_logit_softcapping = 0.01
    tight, _ = hf_families._forward_and_decode(hf, batch, mask, pos)
    assert hf_families._relative(tight, ref) > 1e-3
    with patch(hf, "rope", backend="chunked"):
        out, _ = hf_families._forward_and_decode(hf, batch, mask, pos)
    assert hf_families._relative(out, tight) <= hf_families.RTOL


# ------------------------------------------------------------------------------ Doge


def test_doge_dynamic_mask_with_left_padding_is_exact():
    """Doge hands attention its dynamic mask: an additive float mask, per head a bias on the
    keys from the value states, the dtype's minimum where transformers' mask excludes a key
    and, past ``keep_window_size`` keys, on all but the top ones. Its pad queries are read
    from that mask (their own key at the minimum), not taken for positions that restart:
    on the walk's left-padded batch ``baseline`` is bit-identical and ``rope`` equals the
    unpatched model in the full forward and 3 KV-cache decoding steps, with the dynamic mask
    keeping 8 of up to 20 keys."""
    hf = _tiny("doge", keep_window_size=8)
    batch, mask, pos = hf_families._inputs()
    ref, ref_steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    with patch(hf, "baseline"):
        base, base_steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    assert torch.equal(base, ref) and torch.equal(base_steps, ref_steps)
    with patch(hf, "rope", backend="eager"):
        rope, rope_steps = hf_families._forward_and_decode(hf, batch, mask, pos)
    assert hf_families._relative(rope, ref) <= 1e-5
    assert hf_families._relative(rope_steps, ref_steps) <= 1e-5
    # the check can fail: the same tokens three times as far apart are far off
    far, far_steps = hf_families._forward_and_decode(hf, batch, mask, 3 * pos)
    assert hf_families._relative(far, ref) > 1e-2
    assert hf_families._relative(far_steps, ref_steps) > 1e-2


def test_pad_queries_of_an_additive_float_mask_are_not_checked_but_restarts_are():
    from relpos.interop.hf.patch import call_positions

    low = torch.finfo(torch.float32).min
    allowed = torch.ones(5, 5).tril().bool()
    allowed[:, :2] = False  # two left pads: no query attends to them
    bias = torch.where(allowed, 0.5, low)[None, None].expand(1, 2, 5, 5)  # 2 heads
    left_padded = torch.tensor([[0, 0, 0, 1, 2]])  # pads at 0, then 0, 1, 2
    q_pos, k_pos = call_positions(left_padded, 1, 5, 5, bias, "rope")
    assert q_pos.tolist() == [[0, 0, 0, 1, 2]] and k_pos.tolist() == [[0, 0, 0, 1, 2]]
    restart = torch.tensor([[0, 0, 0, 1, 0]])  # a real query whose position restarts
    with pytest.raises(ValueError, match="not contiguous inside a row"):
        call_positions(restart, 1, 5, 5, bias, "rope")
