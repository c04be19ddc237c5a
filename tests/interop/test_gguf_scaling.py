"""llama.cpp's RoPE scaling read from GGUF metadata (``relpos.interop.gguf_scaling``) gives the
frequencies and magnitude llama.cpp rotates with, or is refused by name.

The reference is this file's own reimplementation of llama.cpp's arithmetic, in float64
(ggml-org/llama.cpp): ``llama_context``'s constructor (``src/llama-context.cpp``:
``yarn_ext_factor`` (negative: unset), ``yarn_attn_factor``, YaRN's ``get_mscale`` with
``rope_yarn_log_mul`` and its cancel, ``rope_attn_factor``), ``ggml_rope_yarn_corr_dims``
(``ggml/src/ggml.c``), ``rope_yarn`` / ``rope_yarn_ramp`` / ``ggml_rope_cache_init``
(``ggml/src/ggml-cpu/ops.cpp``), the ``deepseek2`` graph's softmax scale
(``src/models/deepseek2.cpp``: ``kq_scale = mscale^2 / sqrt(d)``) and Hunyuan's base
(``src/models/hunyuan-vl.cpp``: ``base * alpha^(d / (d - 2))``). Small GGUF files are written
with the ``gguf`` package's ``GGUFWriter``; nothing is downloaded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from gguf_files import tiny_llama_gguf  # noqa: E402

from relpos.encodings.registry import create  # noqa: E402
from relpos.interop.gguf import load_gguf, rope_convention  # noqa: E402
from relpos.interop.gguf_scaling import gguf_rope_base, gguf_rope_scaling  # noqa: E402

# ------------------------------------------------------------------ llama.cpp, reimplemented


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def llama_cpp_context_attn(
    freq_scale: float,
    ext_factor: float,
    yarn_attn_factor: float,
    attn_factor: float,
    *,
    log_mul: float = 0.0,
    arch: str = "llama",
) -> float:
    """``cparams.yarn_attn_factor`` of the ``llama_context`` constructor: with ``ext_factor !=
    0`` YaRN's ``get_mscale(s, m) / get_mscale(s, log_mul)`` (``m = log_mul`` for deepseek2
    when ``log_mul != 1``, else 1; just ``get_mscale(s, 1)`` without ``log_mul``) times the
    cancel ``1 / (1 + 0.1 ln s)``, replacing ``yarn_attn_factor``; then times the file's
    ``rope.scaling.attn_factor``."""
    attn = yarn_attn_factor
    if ext_factor != 0.0:
        scale = 1.0 / freq_scale
        if log_mul != 0.0:
            mscale = log_mul if (arch == "deepseek2" and log_mul != 1.0) else 1.0
            attn = _get_mscale(scale, mscale) / _get_mscale(scale, log_mul)
        else:
            attn = _get_mscale(scale, 1.0)
        attn *= 1.0 / (1.0 + 0.1 * math.log(scale))
    return attn * attn_factor


def llama_cpp_rotation(
    *,
    n_dims: int,
    base: float,
    kind: str,
    factor: float = 0.0,
    attn_factor: float = 1.0,
    n_ctx_orig: int = 2048,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    freq_factors: np.ndarray | None = None,
    ext_factor: float = -1.0,
    yarn_attn_factor: float = 1.0,
    log_mul: float = 0.0,
    arch: str = "llama",
) -> tuple[np.ndarray, float]:
    """``(per-pair angle per position, mscale)``: what ``ggml_rope_ext`` turns pair ``i`` by
    per unit of position and the factor on cos / sin, for a context built from the file
    (``ext_factor``, ``yarn_attn_factor``, ``log_mul``: the file's ``yarn_*`` keys, as the
    loader hands them to the context)."""
    freq_scale = 1.0 if (factor == 0.0 or kind == "none") else 1.0 / factor
    if ext_factor < 0.0:  # not set
        ext_factor = 1.0 if kind == "yarn" else 0.0
    attn = llama_cpp_context_attn(
        freq_scale, ext_factor, yarn_attn_factor, attn_factor, log_mul=log_mul, arch=arch
    )
    low = max(0.0, math.floor(_corr_dim(n_dims, n_ctx_orig, beta_fast, base)))
    high = min(n_dims - 1.0, math.ceil(_corr_dim(n_dims, n_ctx_orig, beta_slow, base)))
    theta_scale = base ** (-2.0 / n_dims)
    thetas, mscale = [], attn
    for i0 in range(0, n_dims, 2):
        ff = 1.0 if freq_factors is None else float(freq_factors[i0 // 2])
        extrap = theta_scale ** (i0 // 2) / ff
        interp = freq_scale * extrap
        theta = interp
        if ext_factor != 0.0:
            y = (i0 // 2 - low) / max(0.001, high - low)
            ramp_mix = (1 - min(1.0, max(0.0, y))) * ext_factor
            theta = interp * (1 - ramp_mix) + extrap * ramp_mix
        thetas.append(theta)
    if ext_factor != 0.0:
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return np.array(thetas), mscale


def deepseek2_kq_mscale(
    *, factor: float, attn_factor: float = 1.0, log_mul: float = 0.0, kind: str = "yarn"
) -> float:
    """The ``mscale`` of ``deepseek2.cpp``'s ``kq_scale = mscale^2 / sqrt(d)``: the context's
    attention factor times ``1 + 0.1 ln(1 / freq_scale)`` (undoing its cancel), times ``1 +
    0.1 rope_yarn_log_mul ln(1 / freq_scale)``."""
    freq_scale = 1.0 if (factor == 0.0 or kind == "none") else 1.0 / factor
    ext = 1.0 if kind == "yarn" else 0.0
    attn = llama_cpp_context_attn(freq_scale, ext, 1.0, attn_factor, log_mul=log_mul,
                                  arch="deepseek2")  # fmt: skip
    log_s = math.log(1.0 / freq_scale)
    return attn * (1.0 + 0.1 * log_s) * (1.0 + 0.1 * log_mul * log_s)


def hunyuan_base(base: float, alpha: float, head_dim: int) -> float:
    """``llama_model_hunyuan_vl::load_arch_hparams``: ``base * alpha^(d / (d - 2))``."""
    return base * alpha ** (head_dim / (head_dim - 2))


def _meta(arch: str = "llama", head_dim: int = 64, **rope: object) -> dict:
    meta = {
        "general.architecture": arch,
        f"{arch}.embedding_length": 2 * head_dim,
        f"{arch}.attention.head_count": 2,
        f"{arch}.context_length": 8192,
        f"{arch}.rope.freq_base": 1e4,
    }
    meta.update({f"{arch}.rope.{k}": v for k, v in rope.items()})
    return meta


def _check_against_llama_cpp(meta: dict, reference: dict, **convention: object):
    encoding, options = rope_convention(meta, **convention)
    assert encoding == "rope"
    head_dim = meta[f"{meta['general.architecture']}.embedding_length"] // 2
    enc = create("rope", num_heads=1, head_dim=head_dim, **options)
    reference = {"base": 1e4, **reference}
    thetas, mscale = llama_cpp_rotation(n_dims=enc.rotary_dim, **reference)
    np.testing.assert_allclose(enc.inv_freq.double().numpy(), thetas, rtol=1e-6, atol=0)
    assert enc.attention_factor == pytest.approx(mscale, rel=1e-7)
    pos = torch.arange(0, 64)[None]
    cos, sin = enc.cos_sin(pos)
    angles = np.arange(0, 64)[:, None] * thetas
    np.testing.assert_allclose(cos[0, 0].double().numpy(), np.cos(angles) * mscale, atol=1e-5)
    np.testing.assert_allclose(sin[0, 0].double().numpy(), np.sin(angles) * mscale, atol=1e-5)
    return options.get("scaling")


# ------------------------------------------------------------------ the conventions


@pytest.mark.parametrize(
    ("keys", "reference"),
    [
        (
            {"scaling.type": "yarn", "scaling.factor": 4.0,
             "scaling.original_context_length": 2048},
            {"kind": "yarn", "factor": 4.0, "n_ctx_orig": 2048},
        ),
        (  # the file's attention factor and YaRN betas
            {"scaling.type": "yarn", "scaling.factor": 8.0, "scaling.attn_factor": 0.9,
             "scaling.original_context_length": 1024, "scaling.yarn_beta_fast": 16.0,
             "scaling.yarn_beta_slow": 2.0},
            {"kind": "yarn", "factor": 8.0, "attn_factor": 0.9, "n_ctx_orig": 1024,
             "beta_fast": 16.0, "beta_slow": 2.0},
        ),
        (  # no original length: the trained context length
            {"scaling.type": "yarn", "scaling.factor": 2.0},
            {"kind": "yarn", "factor": 2.0, "n_ctx_orig": 8192},
        ),
        ({"scaling.type": "linear", "scaling.factor": 2.0}, {"kind": "linear", "factor": 2.0}),
        ({"scale_linear": 3.0}, {"kind": "linear", "factor": 3.0}),  # the older key, no type
        (
            {"scaling.type": "linear", "scaling.factor": 2.0, "scaling.attn_factor": 1.25},
            {"kind": "linear", "factor": 2.0, "attn_factor": 1.25},
        ),
        ({"scaling.type": "none", "scaling.factor": 4.0}, {"kind": "none", "factor": 4.0}),
        # yarn_ext_factor: the kept weight of YaRN's ramp scaled by e
        (
            {"scaling.type": "yarn", "scaling.factor": 8.0, "scaling.yarn_ext_factor": 0.5,
             "scaling.original_context_length": 1024},
            {"kind": "yarn", "factor": 8.0, "ext_factor": 0.5, "n_ctx_orig": 1024},
        ),
        (  # a negative one is llama_hparams' "not set" (-1): YaRN's 1
            {"scaling.type": "yarn", "scaling.factor": 8.0, "scaling.yarn_ext_factor": -1.0},
            {"kind": "yarn", "factor": 8.0, "n_ctx_orig": 8192},
        ),
        (  # 0 on YaRN: position interpolation, magnitude yarn_attn_factor * attn_factor
            {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.yarn_ext_factor": 0.0,
             "scaling.yarn_attn_factor": 1.3, "scaling.attn_factor": 0.9},
            {"kind": "yarn", "factor": 4.0, "ext_factor": 0.0, "yarn_attn_factor": 1.3,
             "attn_factor": 0.9},
        ),
        (  # e on a linear file: YaRN's ramp and magnitude
            {"scaling.type": "linear", "scaling.factor": 4.0, "scaling.yarn_ext_factor": 1.0,
             "scaling.original_context_length": 2048},
            {"kind": "linear", "factor": 4.0, "ext_factor": 1.0, "n_ctx_orig": 2048},
        ),
        (  # e without a factor: the ramp blends theta with itself
            {"scaling.type": "none", "scaling.yarn_ext_factor": 1.0, "scaling.attn_factor": 1.1},
            {"kind": "none", "ext_factor": 1.0, "attn_factor": 1.1},
        ),
        # yarn_attn_factor: cos / sin times it without YaRN, replaced by YaRN's with it
        (
            {"scaling.type": "linear", "scaling.factor": 2.0, "scaling.yarn_attn_factor": 2.0},
            {"kind": "linear", "factor": 2.0, "yarn_attn_factor": 2.0},
        ),
        (
            {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.yarn_attn_factor": 2.0},
            {"kind": "yarn", "factor": 4.0, "yarn_attn_factor": 2.0, "n_ctx_orig": 8192},
        ),
        # yarn_log_multiplier: get_mscale(s, 1) / get_mscale(s, L) (transformers' mscale ratio)
        (
            {"scaling.type": "yarn", "scaling.factor": 16.0, "scaling.yarn_log_multiplier": 0.5,
             "scaling.attn_factor": 1.2},
            {"kind": "yarn", "factor": 16.0, "log_mul": 0.5, "attn_factor": 1.2,
             "n_ctx_orig": 8192},
        ),
        (  # read only with YaRN's ext_factor
            {"scaling.type": "linear", "scaling.factor": 2.0, "scaling.yarn_log_multiplier": 1.0},
            {"kind": "linear", "factor": 2.0, "log_mul": 1.0},
        ),
        (  # betas the other way round (relpos's yarn refuses them; here low = high = 22):
            # per-pair divisors
            {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.yarn_beta_fast": 2.0,
             "scaling.yarn_beta_slow": 2.5},
            {"kind": "yarn", "factor": 4.0, "beta_fast": 2.0, "beta_slow": 2.5,
             "n_ctx_orig": 8192},
        ),
        (  # YaRN below factor 1 (a frequency increase): per-pair divisors
            {"scaling.type": "yarn", "scaling.factor": 0.5, "scaling.original_context_length": 512},
            {"kind": "yarn", "factor": 0.5, "n_ctx_orig": 512},
        ),
    ],
)  # fmt: skip
def test_metadata_scaling_matches_llama_cpps_arithmetic(keys, reference):
    _check_against_llama_cpp(_meta(**keys), reference)


def test_the_reference_tells_the_yarn_keys_apart():
    """Each ``yarn_*`` key changes what llama.cpp rotates by more than the comparison's
    tolerance, so a relpos that dropped or misread it would fail the test above."""
    plain = llama_cpp_rotation(n_dims=64, base=1e4, kind="yarn", factor=8.0, n_ctx_orig=1024)
    for changed in (
        {"ext_factor": 0.5},
        {"ext_factor": 0.0},
        {"log_mul": 0.5},
    ):
        other = llama_cpp_rotation(
            n_dims=64, base=1e4, kind="yarn", factor=8.0, n_ctx_orig=1024, **changed
        )
        differs = not np.allclose(other[0], plain[0], rtol=1e-4) or abs(other[1] - plain[1]) > 1e-4
        assert differs, changed
    linear = llama_cpp_rotation(n_dims=64, base=1e4, kind="linear", factor=2.0)
    doubled = llama_cpp_rotation(n_dims=64, base=1e4, kind="linear", factor=2.0,
                                 yarn_attn_factor=2.0)  # fmt: skip
    assert doubled[1] == pytest.approx(2 * linear[1])


def test_pinned_reference_values():
    """The restatement at hand-checked points: YaRN's magnitude with ``log_mul`` 0.5 and
    ``s = 16`` is ``(1 + 0.1 ln 16) / (1 + 0.05 ln 16) = 1.2772589 / 1.1386294``; with
    ``ext_factor`` 0.5, pair 0 keeps half its frequency: ``theta_0 (1/8 + 1/2) / ...``;
    Hunyuan's base for ``alpha`` 1000 and head size 128 is ``1e4 * 1000^(128/126)``
    (11158839.925, the figure of llama.cpp's converter)."""
    _, mscale = llama_cpp_rotation(n_dims=64, base=1e4, kind="yarn", factor=16.0, log_mul=0.5)
    assert mscale == pytest.approx(1.2772589 / 1.1386294, rel=1e-7)
    thetas, _ = llama_cpp_rotation(n_dims=64, base=1e4, kind="yarn", factor=8.0, ext_factor=0.5)
    assert thetas[0] == pytest.approx(1 / 8 * 0.5 + 0.5, rel=1e-12)
    assert hunyuan_base(1e4, 1000.0, 128) == pytest.approx(11158839.9251, rel=1e-10)
    assert deepseek2_kq_mscale(factor=40.0, log_mul=1.0) == pytest.approx(1 + 0.1 * math.log(40))


def test_each_type_becomes_the_relpos_scaling_that_states_it():
    yarn = gguf_rope_scaling(
        _meta(**{"scaling.type": "yarn", "scaling.factor": 4.0,
                 "scaling.original_context_length": 2048}),
        rotary_dim=64,
    )  # fmt: skip
    assert yarn == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": pytest.approx(1 + 0.1 * math.log(4.0)),
    }
    linear = _meta(**{"scaling.type": "linear", "scaling.factor": 2.0})
    assert gguf_rope_scaling(linear, rotary_dim=64) == {"rope_type": "linear", "factor": 2.0}
    assert gguf_rope_scaling(_meta(), rotary_dim=64) is None
    none = _meta(**{"scaling.type": "none", "scaling.factor": 4.0})
    assert gguf_rope_scaling(none, rotary_dim=64) is None  # llama.cpp: never scale


def test_longrope_factors_are_chosen_by_the_context_size_as_llama_cpp_does():
    """Phi-3 (NEOX, partial rotary): llama.cpp divides by ``rope_factors_long`` when its
    context per sequence exceeds the original length, by the short ones otherwise, and
    multiplies cos / sin by ``rope.scaling.attn_factor``."""
    meta = _meta("phi3", **{"dimension_count": 32, "scaling.attn_factor": 1.19,
                            "scaling.original_context_length": 4096})  # fmt: skip
    long, short = np.linspace(1.0, 40.0, 16), np.linspace(1.0, 2.0, 16)
    factors = {"rope_factors_long.weight": long, "rope_factors_short.weight": short}
    for context, chosen in ((8192, long), (4096, short)):
        scaling = _check_against_llama_cpp(
            meta,
            {"kind": "linear", "attn_factor": 1.19, "freq_factors": chosen},
            factors=factors,
            context_length=context,
        )
        assert scaling["rope_type"] == "freq_factors"
    with pytest.raises(ValueError, match="pass context_length"):
        rope_convention(meta, factors=factors)
    with pytest.raises(ValueError, match="only one of rope_factors_long"):
        rope_convention(meta, factors={"rope_factors_long.weight": long}, context_length=1)
    longrope = dict(meta, **{"phi3.rope.scaling.type": "longrope"})
    with pytest.raises(ValueError, match="'longrope' but the file holds no"):
        rope_convention(longrope)


def test_rope_freqs_with_linear_scaling_fold_the_factor_into_the_divisors():
    ff = np.array([1.0, 2.0, 4.0, 8.0] * 8)
    _check_against_llama_cpp(
        _meta(**{"scaling.type": "linear", "scaling.factor": 2.0}),
        {"kind": "linear", "factor": 2.0, "freq_factors": ff},
        factors={"rope_freqs.weight": ff},
    )


@pytest.mark.parametrize(
    ("keys", "factors", "match"),
    [
        ({"scaling.type": "dynamic"}, None, "llama.cpp knows"),
        ({"scaling.alpha": 1000.0}, None, r"scaling.alpha = 1000.*unscaled base"),
        ({"freq_base_swa": 1e6}, None, "freq_base_swa.*one rope for every layer"),
        ({"dimension_count_swa": 32}, None, "dimension_count_swa.*one rope for every layer"),
        ({"rope_freqs.weight": None}, {"rope_freqs.weight": [1.0] * 3}, "must hold 32"),
        ({"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.yarn_beta_slow": 0.0}, None,
         "betas must be > 0"),
        ({"scaling.type": "yarn", "scaling.factor": 4.0,
          "scaling.original_context_length": 4}, None, r"correction range \[0, -1\] is empty"),
    ],
)  # fmt: skip
def test_what_llama_cpp_computes_otherwise_is_refused_by_name(keys, factors, match):
    meta = _meta(**{k: v for k, v in keys.items() if v is not None})
    with pytest.raises(ValueError, match=match):
        rope_convention(meta, factors=factors)


def test_yarn_with_per_pair_factors_divides_by_both():
    """``rope_yarn`` blends ``theta_i / ff_i`` and ``freq_scale theta_i / ff_i`` with YaRN's
    ramp: one divisor per pair, ``ff_i / ((1 - w_i) / s + w_i)`` (``freq_factors``)."""
    ff = np.array([1.0, 1.0, 2.0, 4.0] * 8)
    for ext in (1.0, 0.25):
        scaling = _check_against_llama_cpp(
            _meta(**{"scaling.type": "yarn", "scaling.factor": 4.0,
                     "scaling.original_context_length": 1024, "scaling.yarn_ext_factor": ext}),
            {"kind": "yarn", "factor": 4.0, "n_ctx_orig": 1024, "freq_factors": ff,
             "ext_factor": ext},
            factors={"rope_freqs.weight": ff},
        )  # fmt: skip
        assert scaling["rope_type"] == "freq_factors"
        assert scaling["attention_factor"] == pytest.approx(1 + 0.1 * math.log(4.0))


def test_hunyuan_alpha_scales_the_base_as_llama_cpp_loads_it():
    """``hunyuan-dense`` (NEOX): ``scaling.alpha`` multiplies the base by ``alpha^(d/(d-2))``
    before anything else reads it, so a linear factor or YaRN's ramp compose with it."""
    for keys, reference in (
        ({}, {"kind": "linear"}),
        ({"scaling.type": "linear", "scaling.factor": 2.0}, {"kind": "linear", "factor": 2.0}),
        ({"scaling.type": "yarn", "scaling.factor": 4.0}, {"kind": "yarn", "factor": 4.0,
                                                           "n_ctx_orig": 8192}),
    ):  # fmt: skip
        meta = _meta("hunyuan-dense", **{"scaling.alpha": 1000.0, **keys})
        base = hunyuan_base(1e4, 1000.0, 64)
        _check_against_llama_cpp(meta, {"base": base, **reference})
        assert rope_convention(meta)[1]["base"] == pytest.approx(base, rel=1e-12)
    # the key's neutral value (llama.cpp applies alpha > 0 only) leaves the base alone
    assert rope_convention(_meta("hunyuan-dense", **{"scaling.alpha": 0.0}))[1]["base"] == 1e4
    assert gguf_rope_base(_meta(**{"scaling.alpha": 0.0})) == 1e4


def test_deepseek2_is_refused_where_its_graph_rescales_the_softmax():
    """``deepseek2.cpp`` multiplies ``kq_scale`` (every channel, not only the rotated ones)
    by ``mscale^2``: refused whenever that is not 1, read as plain RoPE when it is."""
    for keys, kq in (
        ({"scaling.type": "yarn", "scaling.factor": 40.0}, deepseek2_kq_mscale(factor=40.0)),
        ({"scaling.type": "yarn", "scaling.factor": 40.0, "scaling.yarn_log_multiplier": 1.0},
         deepseek2_kq_mscale(factor=40.0, log_mul=1.0)),
        ({"scaling.type": "linear", "scaling.factor": 2.0},
         deepseek2_kq_mscale(factor=2.0, kind="linear")),
        ({"scaling.attn_factor": 1.5}, deepseek2_kq_mscale(factor=0.0, attn_factor=1.5,
                                                           kind="linear")),
    ):  # fmt: skip
        assert kq != pytest.approx(1.0)
        with pytest.raises(ValueError, match=f"deepseek2 graph.*mscale\\^2 = {kq**2:.6g}"):
            rope_convention(_meta("deepseek2", **keys))
    assert deepseek2_kq_mscale(factor=0.0, kind="linear") == 1.0
    assert gguf_rope_scaling(_meta("deepseek2"), rotary_dim=64) is None


# ------------------------------------------------------------------ the loader


def test_load_gguf_applies_the_files_yarn_as_llama_cpp_computes_it(tmp_path):
    keys = {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.original_context_length": 16}
    model, _, _ = load_gguf(tiny_llama_gguf(tmp_path / "yarn.gguf", rope_keys=keys))
    enc = model.blocks[0].attn.encoding
    assert enc.scaling["rope_type"] == "yarn"
    thetas, mscale = llama_cpp_rotation(n_dims=8, base=1e4, kind="yarn", factor=4.0, n_ctx_orig=16)
    np.testing.assert_allclose(enc.inv_freq.double().numpy(), thetas, rtol=1e-6)
    assert enc.attention_factor == pytest.approx(mscale, rel=1e-7)
    plain, _, _ = load_gguf(tiny_llama_gguf(tmp_path / "plain.gguf"))
    ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])
    with torch.no_grad():
        assert not torch.allclose(model(ids), plain(ids))
    with pytest.raises(ValueError, match="asks for RoPE scaling 'yarn'"):
        load_gguf(tmp_path / "yarn.gguf", encoding="alibi")


def test_load_gguf_picks_longrope_factors_by_the_context_length(tmp_path):
    long, short = [1.0, 3.0, 9.0, 27.0], [1.0, 1.5, 2.0, 2.5]
    path = tiny_llama_gguf(
        tmp_path / "longrope.gguf",
        rope_keys={"scaling.attn_factor": 1.2, "scaling.original_context_length": 32},
        tensors={"rope_factors_long.weight": long, "rope_factors_short.weight": short},
    )
    with pytest.raises(ValueError, match="pass context_length"):
        load_gguf(path)
    for context, chosen in ((64, long), (32, short)):
        model, _, _ = load_gguf(path, context_length=context)
        enc = model.blocks[0].attn.encoding
        thetas, mscale = llama_cpp_rotation(
            n_dims=8, base=1e4, kind="linear", attn_factor=1.2, freq_factors=np.array(chosen)
        )
        np.testing.assert_allclose(enc.inv_freq.double().numpy(), thetas, rtol=1e-6)
        assert enc.attention_factor == pytest.approx(mscale, rel=1e-6)


def test_load_gguf_applies_yarn_keys_and_factors_as_llama_cpp_computes_them(tmp_path):
    """A file with YaRN, ``yarn_ext_factor`` 0.5 and a ``rope_freqs.weight`` tensor: the
    loaded model rotates by llama.cpp's angles and magnitude (and not by plain YaRN's)."""
    ff = [1.0, 2.0, 4.0, 8.0]
    keys = {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.original_context_length": 16,
            "scaling.yarn_ext_factor": 0.5}  # fmt: skip
    path = tiny_llama_gguf(tmp_path / "yarn_ff.gguf", rope_keys=keys,
                           tensors={"rope_freqs.weight": ff})  # fmt: skip
    model, _, _ = load_gguf(path)
    enc = model.blocks[0].attn.encoding
    thetas, mscale = llama_cpp_rotation(
        n_dims=8, base=1e4, kind="yarn", factor=4.0, n_ctx_orig=16, ext_factor=0.5,
        freq_factors=np.array(ff),
    )  # fmt: skip
    np.testing.assert_allclose(enc.inv_freq.double().numpy(), thetas, rtol=1e-6)
    assert enc.attention_factor == pytest.approx(mscale, rel=1e-7)
    plain, _ = llama_cpp_rotation(n_dims=8, base=1e4, kind="yarn", factor=4.0, n_ctx_orig=16)
    assert not np.allclose(plain, thetas, rtol=1e-3)


def test_qwen3_vl_sections_read_from_a_file_give_m_rope_with_the_fourth_axis(tmp_path):
    """A Qwen3-VL GGUF header (as llama.cpp's converter writes it: ``rope.dimension_sections``
    ``[24, 20, 20, 0]``, 64 pairs) reads as interleaved ``m-rope`` over four position axes,
    the IMROPE layout tests/interop/test_llama_cpp_rope.py checks against ggml; a RoPE scaling
    on it is refused by name."""
    import gguf

    from relpos.interop.gguf import open_gguf, read_metadata

    path = tmp_path / "qwen3vl.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3vl")
    writer.add_embedding_length(256)
    writer.add_head_count(2)
    writer.add_key_length(128)
    writer.add_rope_freq_base(5e6)
    writer.add_rope_dimension_sections([24, 20, 20, 0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta = read_metadata(open_gguf(path))
    encoding, options = rope_convention(meta)
    assert (encoding, options["mrope_section"]) == ("m-rope", [24, 20, 20, 0])
    enc = create(encoding, num_heads=2, head_dim=128, **options)
    assert enc.dims == 4 and enc.pair_axes()[61:63].tolist() == [3, 3]
    meta["qwen3vl.rope.scaling.type"] = "linear"
    meta["qwen3vl.rope.scaling.factor"] = 2.0
    with pytest.raises(ValueError, match="scaling 'linear' on llama.cpp's 'm-rope'"):
        rope_convention(meta)
