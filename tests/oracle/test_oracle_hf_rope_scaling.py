"""relpos RoPE frequency scaling against Hugging Face ``transformers`` as an oracle.

For every HF scaling type (linear, dynamic, yarn, llama3, longrope, proportional) and a grid of
parameters, ``relpos.functional.rope_frequencies`` must equal
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[type](config, device=None, seq_len=...)``
**bit for bit** (inv_freq via ``torch.equal``, attention factor via ``==``). The config is a
``LlamaConfig`` built as HF v5 expects: ``rope_parameters=...`` (a fresh copy: HF edits it in
place), ``head_dim``, ``max_position_embeddings`` and, for partial rotary, the model-level
``partial_rotary_factor`` keyword (``standardize_rope_params`` copies it into the dict). The
HF functions are imported, never copied.

Each test loops over a sub-grid and reports every mismatching case at once.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from relpos.functional import rope_frequencies  # noqa: E402

# (head_dim, partial_rotary_factor): full rotary, and GPT-NeoX partial rotary with 40 of 80.
HEADS = [(64, 1.0), (128, 1.0), (80, 0.5)]
BASES = [10000.0, 500000.0]
FACTORS = [2.0, 4.0, 8.0, 16.0]


@pytest.fixture(autouse=True)
def _quiet_hf_logging() -> Iterator[None]:
    # HF logs (does not raise) on e.g. an explicit YaRN factor != max_pos / original.
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


def _hf(
    rope_type: str,
    params: dict,
    *,
    head_dim: int,
    partial: float,
    max_position_embeddings: int,
    seq_len: int | None,
) -> tuple[torch.Tensor, float]:
    extra = {} if partial == 1.0 else {"partial_rotary_factor": partial}
    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=copy.deepcopy(params),
        **extra,
    )
    return ROPE_INIT_FUNCTIONS[rope_type](config, device=None, seq_len=seq_len)


def _compare(
    rope_type: str,
    params: dict,
    *,
    head_dim: int,
    partial: float,
    max_position_embeddings: int,
    seq_len: int | None = None,
) -> str | None:
    """None when relpos equals HF bit for bit, else a description of the difference."""
    ours, ours_af = rope_frequencies(
        head_dim,
        scaling=copy.deepcopy(params),
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
        partial_rotary_factor=partial,
    )
    ref, ref_af = _hf(
        rope_type,
        params,
        head_dim=head_dim,
        partial=partial,
        max_position_embeddings=max_position_embeddings,
        seq_len=seq_len,
    )
    if ours.dtype == ref.dtype and torch.equal(ours, ref) and ours_af == ref_af:
        return None
    where = (
        f"{params} head_dim={head_dim} partial={partial} "
        f"max_position_embeddings={max_position_embeddings} seq_len={seq_len}"
    )
    if ours.shape != ref.shape:
        return f"{where}: shape {tuple(ours.shape)} vs HF {tuple(ref.shape)}"
    rel = ((ours.double() - ref.double()).abs() / ref.double().abs().clamp_min(1e-30)).max()
    return f"{where}: max rel diff {rel.item():.3g}, attention_factor {ours_af!r} vs HF {ref_af!r}"


def _assert_all_equal(failures: list[str | None], count: int) -> None:
    bad = [f for f in failures if f is not None]
    assert count > 0
    assert not bad, f"{len(bad)}/{count} cases differ from HF:\n" + "\n".join(bad[:20])


grid = pytest.mark.parametrize(
    ("head_dim", "partial", "base"), [(h, p, b) for (h, p) in HEADS for b in BASES]
)


# ---------------------------------------------------------------------------- linear


@grid
def test_linear_is_bit_identical_to_hf(head_dim: int, partial: float, base: float) -> None:
    results = []
    for factor, key in itertools.product(FACTORS + [1.0, 2.5], ["rope_type", "type"]):
        params = {key: "linear", "factor": factor, "rope_theta": base}
        results.append(
            _compare(
                "linear", params, head_dim=head_dim, partial=partial, max_position_embeddings=4096
            )
        )
    _assert_all_equal(results, len(results))


# ---------------------------------------------------------------------------- dynamic


@grid
def test_dynamic_is_bit_identical_to_hf_below_and_above_the_original_length(
    head_dim: int, partial: float, base: float
) -> None:
    results = []
    seq_lens = [None, 1, 1000, 2048, 2049, 3000, 8192, 40000]
    for factor, seq_len, key in itertools.product(FACTORS + [1.5], seq_lens, ["rope_type", "type"]):
        params = {key: "dynamic", "factor": factor, "rope_theta": base}
        results.append(
            _compare(
                "dynamic",
                params,
                head_dim=head_dim,
                partial=partial,
                max_position_embeddings=2048,
                seq_len=seq_len,
            )
        )
    _assert_all_equal(results, len(results))


# ---------------------------------------------------------------------------- yarn

YARN_EXTRAS: list[dict] = [
    {},
    {"mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V3
    {"mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V2
    {"mscale": 0.707, "mscale_all_dim": 1.0},
    {"mscale": 1.0},  # only one given: plain 0.1 ln s + 1
    {"attention_factor": 1.3},
    {"beta_fast": 16, "beta_slow": 2},
    {"beta_fast": 64.0, "beta_slow": 0.5},
    {"beta_fast": 8, "beta_slow": 8},  # low == high after clamping for some configs
]


@grid
def test_yarn_is_bit_identical_to_hf(head_dim: int, partial: float, base: float) -> None:
    results = []
    for factor, original, truncate, extra in itertools.product(
        FACTORS, [2048, 4096], [None, True, False], YARN_EXTRAS
    ):
        params = {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
            "rope_theta": base,
            **extra,
        }
        if truncate is not None:
            params["truncate"] = truncate
        for seq_len in (None, 2 * original * int(factor)):
            results.append(
                _compare(
                    "yarn",
                    params,
                    head_dim=head_dim,
                    partial=partial,
                    max_position_embeddings=int(original * factor),
                    seq_len=seq_len,
                )
            )
    _assert_all_equal(results, len(results))


@grid
def test_yarn_implicit_factor_and_original_length_match_hf(
    head_dim: int, partial: float, base: float
) -> None:
    results = []
    for max_pos in (4096, 8192, 32768, 163840):
        # factor None: max_position_embeddings / original (DeepSeek-style configs).
        params = {
            "rope_type": "yarn",
            "factor": None,
            "original_max_position_embeddings": 4096,
            "rope_theta": base,
        }
        results.append(
            _compare(
                "yarn", params, head_dim=head_dim, partial=partial, max_position_embeddings=max_pos
            )
        )
        # original missing: filled from max_position_embeddings (factor explicit).
        params = {"rope_type": "yarn", "factor": 4.0, "rope_theta": base}
        results.append(
            _compare(
                "yarn", params, head_dim=head_dim, partial=partial, max_position_embeddings=max_pos
            )
        )
        # an explicit factor that disagrees with max_pos / original: the explicit one wins.
        params = {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "rope_theta": base,
        }
        results.append(
            _compare(
                "yarn", params, head_dim=head_dim, partial=partial, max_position_embeddings=max_pos
            )
        )
    _assert_all_equal(results, len(results))


# ---------------------------------------------------------------------------- llama3


@grid
def test_llama3_is_bit_identical_to_hf(head_dim: int, partial: float, base: float) -> None:
    results = []
    bands = [(1.0, 4.0), (2.0, 8.0), (1, 2), (0.5, 32.0)]
    for factor, (low, high), original in itertools.product(FACTORS, bands, [2048, 8192]):
        params = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
            "rope_theta": base,
        }
        results.append(
            _compare(
                "llama3",
                params,
                head_dim=head_dim,
                partial=partial,
                max_position_embeddings=int(original * factor),
                seq_len=original * 2,
            )
        )
    _assert_all_equal(results, len(results))


# ---------------------------------------------------------------------------- longrope


@grid
def test_longrope_is_bit_identical_to_hf_on_both_sides_of_the_switch(
    head_dim: int, partial: float, base: float
) -> None:
    n = int(head_dim * partial) // 2
    gen = torch.Generator().manual_seed(head_dim + int(base))
    short = (1 + 0.2 * torch.rand(n, generator=gen, dtype=torch.float64)).tolist()
    long = (1 + 15 * torch.rand(n, generator=gen, dtype=torch.float64)).sort().values.tolist()
    results = []
    original = 4096
    for factor, mode in itertools.product(FACTORS, ["implicit", "factor", "attention_factor"]):
        params = {
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": original,
            "rope_theta": base,
        }
        if mode == "factor":
            params["factor"] = factor
        elif mode == "attention_factor":
            params["attention_factor"] = 1.0 + factor / 100
        for seq_len in (None, 1, original, original + 1, int(original * factor)):
            results.append(
                _compare(
                    "longrope",
                    params,
                    head_dim=head_dim,
                    partial=partial,
                    max_position_embeddings=int(original * factor),
                    seq_len=seq_len,
                )
            )
    _assert_all_equal(results, len(results))


# ---------------------------------------------------------------------------- proportional


@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
@pytest.mark.parametrize("base", BASES + [1e6])
def test_proportional_is_bit_identical_to_hf(head_dim: int, base: float) -> None:
    results = []
    for p, factor in itertools.product([0.0, 0.1, 0.25, 0.5, 0.75, 1.0], [None, 1.0, 2.0, 8.0]):
        params = {"rope_type": "proportional", "rope_theta": base, "partial_rotary_factor": p}
        if factor is not None:
            params["factor"] = factor
        results.append(
            _compare(
                "proportional", params, head_dim=head_dim, partial=1.0, max_position_embeddings=8192
            )
        )
    _assert_all_equal(results, len(results))


def test_proportional_partial_rotary_factor_from_the_model_config_matches_hf() -> None:
    # Gemma 4 style: p given at model level; relpos takes it as the partial_rotary_factor arg.
    params = {"rope_type": "proportional", "rope_theta": 1e6}
    assert (
        _compare("proportional", params, head_dim=256, partial=0.25, max_position_embeddings=8192)
        is None
    )


def test_earlier_vllm_yarn_keys_are_dropped_where_transformers_reads_a_config() -> None:
    """transformers' ``yarn`` ignores earlier vLLM's ``extrapolation_factor`` / ``attn_factor``
    / ``apply_yarn_scaling`` (Mistral-family configs carry the last); relpos's ``yarn`` reads
    them, so ``relpos.interop.hf`` drops them from a transformers config: the RoPE it patches
    in is bit-identical to the model's own."""
    from relpos.interop.hf.model import rope_facts

    params = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 8.0,
        "original_max_position_embeddings": 1024,
        "extrapolation_factor": 0.5,
        "attn_factor": 0.7,
        "apply_yarn_scaling": False,
    }
    hf, hf_af = _hf("yarn", params, head_dim=64, partial=1.0, max_position_embeddings=8192,
                    seq_len=None)  # fmt: skip
    config = LlamaConfig(head_dim=64, max_position_embeddings=8192)
    facts = rope_facts(params, config)
    ours, ours_af = rope_frequencies(64, base=facts.base, scaling=facts.scaling,
                                     max_position_embeddings=8192)  # fmt: skip
    assert torch.equal(ours, hf) and ours_af == hf_af
    # read as vLLM did, the same dict is another rotation
    vllm = rope_frequencies(64, base=1e6, scaling={k: v for k, v in params.items()
                                                   if k != "rope_theta"})  # fmt: skip
    assert not torch.equal(vllm[0], hf) and vllm[1] != hf_af
