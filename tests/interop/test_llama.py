"""``relpos.nn.LlamaLM`` on small random models: the pieces the GGUF loader and the lab rely on."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.nn import LlamaConfig, LlamaLM
from relpos.nn.llama import QueryTemperatureAttention, RMSNorm, query_temperature


def tiny(**overrides) -> LlamaLM:
    config = LlamaConfig(
        **{
            "vocab_size": 97,
            "dim": 32,
            "depth": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "hidden_dim": 48,
            "rope_base": 500.0,
            "rope_layout": "interleaved",
            "max_position_embeddings": 64,
            **overrides,
        }
    )
    torch.manual_seed(0)
    return LlamaLM(config).eval()


def tokens(length: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_rmsnorm_is_weight_times_x_over_root_mean_square():
    norm = RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 7.0))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    x64 = x.double()
    expected = norm.weight.double() * x64 / torch.sqrt((x64**2).mean(-1, keepdim=True) + 1e-6)
    # the norm runs in float32 (as HF's LlamaRMSNorm): float32 tolerance against float64
    torch.testing.assert_close(norm(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_the_model_passes_its_base_layout_and_trained_length_to_the_encoding():
    model = tiny()
    enc = model.encoding
    assert (enc.name, enc.base, enc.layout, enc.max_position_embeddings) == (
        "rope",
        500.0,
        "interleaved",
        64,
    )
    assert model.encoding_defaults("alibi") == {}  # ALiBi takes none of them
    # explicit options win over the model's defaults
    assert model.set_encoding("rope", base=10.0, layout="half").base == 10.0
    assert model.encoding.layout == "half"


def test_model_defaults_follow_the_declared_options_not_the_signature():
    """``encoding_defaults`` reads ``option_specs``: an option the encoding refuses by name
    (LieRE has no base, RoPE-Mixed no scaling length) is never passed, so every rotary
    encoding can be set on a model."""
    model = tiny()
    full = {"base": 500.0, "layout": "interleaved", "max_position_embeddings": 64}
    assert model.encoding_defaults("m-rope") == full
    assert model.encoding_defaults("rope-axial") == full
    assert model.encoding_defaults("rope-mixed") == {"base": 500.0, "layout": "interleaved"}
    assert model.encoding_defaults("minkowski") == {"base": 500.0}
    assert model.encoding_defaults("liere") == {}
    enc = model.set_encoding("liere")
    assert enc.name == "liere" and not hasattr(enc, "base")
    mr = model.set_encoding("m-rope", scaling={"rope_type": "yarn", "factor": 2.0})
    assert (mr.base, mr.layout, mr.max_position_embeddings) == (500.0, "interleaved", 64)


def test_the_encoding_keeps_its_own_initialisation():
    """The model re-initialises the layers it builds (normal, std 0.02), never the
    encoding's: FIRE's MLP, or an encoding passed in already trained."""
    torch.manual_seed(3)
    fire = relpos.create("fire", num_heads=4, head_dim=8)
    before = {k: v.clone() for k, v in fire.state_dict().items()}
    config = tiny().config
    torch.manual_seed(0)
    model = LlamaLM(config, fire)
    assert model.encoding is fire
    for key, value in fire.state_dict().items():
        assert torch.equal(value, before[key]), key
    std = model.blocks[0].attn.q_proj.weight.std().item()
    assert abs(std - 0.02) < 0.005


def test_logits_of_the_last_positions_and_chunked_nll_match_the_full_forward():
    model = tiny()
    x = tokens(33)
    with torch.no_grad():
        full = model(x)
        torch.testing.assert_close(model(x, last=5), full[:, -5:])
        nll = model.token_nll(x, start=10, chunk=7)
    ref = F.cross_entropy(full[:, 10:-1].transpose(1, 2), x[:, 11:], reduction="none")
    assert nll.shape == (2, 22)
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "yarn", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}],
    ids=["plain", "yarn", "dynamic"],
)
def test_kv_cache_decoding_equals_the_full_forward_past_the_trained_length(scaling):
    model = tiny()
    if scaling is not None:
        model.set_encoding("rope", scaling=scaling)
    x = tokens(80)  # past max_position_embeddings = 64: dynamic NTK changes its base per call
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        steps = [model(x[:, :60], cache=cache)]
        steps += [model(x[:, t : t + 1], cache=cache) for t in range(60, 80)]
    # dynamic NTK: each decoding step uses the base of its own length, the full forward the
    # base of all 80 tokens; only the last step sees exactly the same length
    if scaling and scaling["rope_type"] == "dynamic":
        torch.testing.assert_close(steps[-1], full[:, -1:], rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}],
    ids=["plain", "linear", "dynamic"],
)
def test_no_length_squared_tensor_in_prefill_decoding_or_scoring(scaling, largest_allocation):
    """Rotary encodings go through SDPA's flash kernel, decoding computes the last logits
    only and ``token_nll`` chunks the LM head: nothing of L x L (or L x vocab) elements."""
    model = tiny(vocab_size=1024)
    if scaling is not None:
        model.set_encoding("rope", scaling=scaling)
    L = 2048
    x = torch.randint(0, 1024, (1, L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), largest_allocation() as probe:
        model(x, last=1)
        model.generate(x, 2)
        model.token_nll(x, start=L - 300, chunk=64)
    assert probe.largest < L * L // 16, probe.op
    assert probe.largest < L * 1024 // 4, probe.op  # no L x vocab logits either


def test_greedy_generate_appends_the_argmax_of_the_full_forward():
    model = tiny()
    x = tokens(12, batch=1)
    out = model.generate(x, 5)
    assert out.shape == (1, 17) and torch.equal(out[:, :12], x)
    with torch.no_grad():
        for t in range(12, 17):
            assert out[0, t] == model(out[:, :t])[0, -1].argmax()
    assert model.generate(x, 5, stop=lambda new: new.shape[1] == 2).shape == (1, 14)


def test_set_encoding_accepts_any_registered_attention_encoding():
    model = tiny()
    x = tokens(20)
    for name in ("alibi", "nope", "rope"):
        model.set_encoding(name)
        assert all(b.attn.encoding is model.encoding for b in model.blocks)
        with torch.no_grad():
            assert torch.isfinite(model(x)).all()
    enc = relpos.create("rope", num_heads=4, head_dim=8, base=7.0)
    assert model.set_encoding(enc) is enc and model.encoding_name == "rope"


def test_bad_arguments_name_what_is_expected():
    model = tiny()
    with pytest.raises(TypeError, match="tokens must be an int64/int32 tensor"):
        model(torch.randn(2, 3))  # policy: a float tensor is the wrong type
    with pytest.raises(ValueError, match="last must be a positive int"):
        model(tokens(4), last=0)
    with pytest.raises(TypeError, match="last must be a positive int"):
        model(tokens(4), last=1.5)
    with pytest.raises(ValueError, match=r"tokens must be .* ids in \[0, 97\).*got ids 1\.\.97"):
        model(torch.tensor([[1, 97]]))  # out of the vocabulary: was an IndexError
    with pytest.raises(ValueError, match=r"tokens must be .* ids in \[0, 97\).*got ids -1\.\.3"):
        model.generate(torch.tensor([[3, -1]]), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(tokens(4), -1)
    with pytest.raises(TypeError, match="LlamaConfig.depth"):
        tiny(depth=2.0)
    with pytest.raises(ValueError, match="start must be an int"):
        model.token_nll(tokens(4), start=3)
    with pytest.raises(ValueError, match="adds to the token embeddings"):
        model.set_encoding("sinusoidal")
    with pytest.raises(ValueError, match="created for 2 heads"):
        model.set_encoding(relpos.create("rope", num_heads=2, head_dim=8))
    with pytest.raises(ValueError, match="unknown encoding"):
        model.set_encoding("no-such-encoding")
    with pytest.raises(ValueError, match="num_kv_heads"):
        tiny(num_kv_heads=3)
    with pytest.raises(ValueError, match="rope_layout"):
        tiny(rope_layout="split")


def test_query_temperature_steps_at_multiples_of_its_length():
    """Llama-4's temperature as Ministral 3 applies it: 1 + beta ln(1 + floor(p / length))."""
    pos = torch.tensor([[0, 16383, 16384, 3 * 16384 - 1, 3 * 16384]])
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(4)]
    assert query_temperature(pos, 0.1, 16384)[0].tolist() == pytest.approx(expected, rel=1e-15)
    assert query_temperature(pos.double() + 0.5, 0.1, 16384)[0, 2] == pytest.approx(expected[2])
    with pytest.raises(ValueError, match="positions p >= 0"):
        query_temperature(torch.tensor([-1]), 0.1, 16384)


def _sharp(model: LlamaLM) -> LlamaLM:
    """``model`` with q rows 30 times the init's: sharper attention, so temperatures show."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(30)
    return model


def test_query_temperature_multiplies_the_queries_of_every_layer():
    """Below the first step the model is the model without temperature; past it, a query at
    position p is the plain model's with its q rows scaled by the temperature of p (one
    layer: keys and values are not scaled); cached decoding continues the positions (the
    default ones from the cache length, as given ones)."""
    plain = _sharp(tiny())
    warm = tiny(query_temperature_beta=0.5, query_temperature_length=8)
    warm.load_state_dict(plain.state_dict())
    assert all(isinstance(block.attn, QueryTemperatureAttention) for block in warm.blocks)
    x = tokens(20)
    with torch.no_grad():
        torch.testing.assert_close(warm(x[:, :8]), plain(x[:, :8]))
        full = warm(x)
        assert (full[:, 8:] - plain(x)[:, 8:]).abs().max() > 1e-2
        one_layer = _sharp(tiny(depth=1))
        warm_one = tiny(depth=1, query_temperature_beta=0.5, query_temperature_length=8)
        warm_one.load_state_dict(one_layer.state_dict())
        out = warm_one(x)
        for p in (8, 16, 19):
            scaled = tiny(depth=1)
            scaled.load_state_dict(one_layer.state_dict())
            scaled.blocks[0].attn.q_proj.weight.mul_(1 + 0.5 * math.log(1 + p // 8))
            torch.testing.assert_close(out[:, p], scaled(x[:, : p + 1])[:, p], rtol=1e-5, atol=1e-5)
        cache = warm.new_cache()
        steps = [warm(x[:, :6], cache=cache)]
        steps += [warm(x[:, t : t + 1], cache=cache) for t in range(6, 20)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
        pos = torch.arange(20) + 100
        cache = warm.new_cache()
        steps = [warm(x[:, :6], pos[:6], cache=cache)]
        steps += [warm(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(6, 20)]
        torch.testing.assert_close(torch.cat(steps, 1), warm(x, pos), rtol=1e-5, atol=1e-5)


def test_query_temperature_options_are_checked_by_name():
    with pytest.raises(ValueError, match="go together"):
        tiny(query_temperature_beta=0.1)
    with pytest.raises(ValueError, match="query_temperature_beta"):
        tiny(query_temperature_beta=-0.1, query_temperature_length=8)
    with pytest.raises(ValueError, match="query_temperature_length"):
        tiny(query_temperature_beta=0.1, query_temperature_length=0)
    model = tiny(query_temperature_beta=0.1, query_temperature_length=8)
    with pytest.raises(ValueError, match="one position per token"):
        model(tokens(4), torch.zeros(2, 4, 3, dtype=torch.long))
