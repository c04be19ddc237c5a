"""DeepSeek-V4 through ``relpos.interop.hf``: the probe reads each layer's RoPE from the label
its attention names (``"main"`` / ``"compress"``, transformers
``models/deepseek_v4/modeling_deepseek_v4.py``), relpos's rope reproduces both, and the patch
refuses the family for what it does and the patch cannot state: the attention output turned
back by the query's angle (values that carry their keys' rotation), and compressed keys
appended at positions counted in tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

import hf_families  # noqa: E402

from relpos.interop.hf import inspect_model, patch  # noqa: E402
from relpos.interop.hf.probe import probe_model  # noqa: E402

SLIDING, CSA, HCA = (
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
)


def _deepseek_v4(layer_types: list[str], yarn: dict | None = None):
    """The walk's tiny DeepSeek-V4 (``hf_families``) with ``layer_types``, its query and
    output ranks and its indexer shrunk too (the probe's runs stay fast); ``yarn``: the
    config's YaRN keys, which it gives the "compress" RoPE only."""
    import transformers

    cfg = hf_families.tiny_config("deepseek_v4").to_dict()
    cfg.update(
        num_hidden_layers=len(layer_types),
        layer_types=list(layer_types),
        mlp_layer_types=cfg["mlp_layer_types"][: len(layer_types)],
        q_lora_rank=16,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
    )
    if yarn is not None:  # the flat dict the config splits into "main" and "compress"
        cfg["rope_parameters"] = dict(yarn)
    torch.manual_seed(0)
    return transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**cfg)).eval()


@pytest.fixture(scope="module")
def sliding_and_hca():
    # a heavily compressed layer appends one key per 128 tokens: none in the probe's rows
    return _deepseek_v4([SLIDING, HCA])


def test_each_layer_takes_the_rope_its_attention_names(sliding_and_hca):
    """rope_parameters are keyed by rope labels, not layer types: sliding layers rotate with
    "main" (rope_theta), compressed ones with "compress" (compress_rope_theta)."""
    facts = inspect_model(sliding_and_hca)
    assert facts.layer_types == ("main", "compress")
    assert facts.per_layer_type
    assert facts.rope["main"].base == sliding_and_hca.config.rope_theta == 10000.0
    assert facts.rope["compress"].base == sliding_and_hca.config.compress_rope_theta == 160000.0


def test_relpos_rope_reproduces_both_bases_and_a_wrong_base_is_caught(sliding_and_hca):
    """The probe (its attention calls return zeros, so the output rotation does not show)
    reads interleaved pairs in the last 8 of 16 channels in both layers, relpos's half layout
    over a permuted head, with each layer's own base; the "main" base given to the
    compressed layer is caught with the turns the model measures (1/20 = 160000^(-1/4))."""
    facts = inspect_model(sliding_and_hca)
    layers = probe_model(sliding_and_hca, facts).layers
    for spec, label in zip(layers, ("main", "compress"), strict=True):
        assert (spec.layer_type, spec.layout, spec.rotary_dim) == (label, "half", 8)
        assert spec.permutation == (8, 10, 12, 14, 9, 11, 13, 15, *range(8))
    wrong = dict(facts.rope, compress=facts.rope["main"])
    with pytest.raises(ValueError, match=r"layer 1: .*turns its pairs by \[1, 0\.05, 0\.0025"):
        probe_model(sliding_and_hca, dataclasses.replace(facts, rope=wrong))


def test_the_compressed_layers_yarn_is_reproduced():
    """With YaRN in the config, only "compress" scales (attention_factor 1: cos and sin are
    not multiplied by YaRN's mscale); relpos's rope with that dict reproduces it."""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16}
    model = _deepseek_v4([SLIDING, HCA], yarn=yarn)
    facts = inspect_model(model)
    assert facts.rope["main"].scaling is None
    assert facts.rope["compress"].scaling["attention_factor"] == 1.0
    layers = probe_model(model, facts).layers
    assert [spec.layer_type for spec in layers] == ["main", "compress"]


def test_the_patch_refuses_the_output_rotated_back_by_the_querys_angle(sliding_and_hca):
    """Every layer turns the attention output back by the query's angle (its values are its
    rotated keys), which the patch, turning q and k only, cannot state; baseline runs."""
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = sliding_and_hca(ids).logits
        with patch(sliding_and_hca, "baseline"):
            assert torch.equal(sliding_and_hca(ids).logits, ref)
    with pytest.raises(ValueError) as refused:
        patch(sliding_and_hca, "rope", backend="eager")
    reason = str(refused.value)
    assert "layers.0.self_attn (DeepseekV4Attention)" in reason
    assert "turns the output back by the query's angle" in reason
    assert "not one relpos computes" not in reason


def test_compressed_keys_are_refused_with_their_positions():
    """A compressed-sparse layer appends one key per 4 tokens, rotated at its window's first
    token: the same positions in every probe row, whatever the rows' position ids."""
    model = _deepseek_v4([CSA, HCA])
    with pytest.raises(ValueError, match=r"appends 6 keys .*at positions \[0, 4, 8, 12, 16, 20\]"):
        probe_model(model, inspect_model(model))
