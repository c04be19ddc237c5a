"""relpos ``shaw`` (keys only) against Hugging Face ``transformers``' ``relative_key`` attention.

BERT's ``position_embedding_type="relative_key"`` / ``"relative_key_query"`` (Shaw keys and
Huang et al. 2020 method 4) are gone from ``transformers`` 5.x (5.24 here has no
``distance_embedding`` in ``models/bert``), so method 4 has no installed oracle; its dense
reference is in tests/encodings/contextual/test_embedding_table.py. The same Shaw key term lives on
in Wav2Vec2-BERT's ``position_embeddings_type="relative_key"`` (``nn.Embedding(left + right
+ 1, head_dim)`` read at ``clamp(j - i, -left, right) + left``, shared by the heads, added
after scaling): the oracle here, with its weights copied into relpos
(``max_relative_position=(left, right)``, ``values=False``).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import Wav2Vec2BertConfig  # noqa: E402
from transformers.models.wav2vec2_bert.modeling_wav2vec2_bert import (  # noqa: E402
    Wav2Vec2BertSelfAttention,
)

import relpos  # noqa: E402

HIDDEN, HEADS = 32, 4
HEAD_DIM = HIDDEN // HEADS


def _hf_attention(left: int, right: int) -> Wav2Vec2BertSelfAttention:
    config = Wav2Vec2BertConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        position_embeddings_type="relative_key",
        left_max_position_embeddings=left,
        right_max_position_embeddings=right,
        attention_dropout=0.0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = Wav2Vec2BertSelfAttention(config).eval()
    with torch.no_grad():
        module.distance_embedding.weight.normal_()  # unit scale: a visible relative term
    return module


def _relpos_forward(hf: Wav2Vec2BertSelfAttention, enc, x: torch.Tensor, backend: str):
    """HF's projections around ``relpos.attention`` with the copied encoding."""

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(*x.shape[:2], HEADS, HEAD_DIM).transpose(1, 2)

    q, k, v = heads(hf.linear_q(x)), heads(hf.linear_k(x)), heads(hf.linear_v(x))
    out = relpos.attention(q, k, v, enc, backend=backend)
    return hf.linear_out(out.transpose(1, 2).reshape(*x.shape[:2], HIDDEN))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
@pytest.mark.parametrize(("left", "right"), [(64, 8), (5, 5), (3, 0)])
def test_shaw_keys_only_equals_wav2vec2_bert_relative_key(left, right, backend) -> None:
    hf = _hf_attention(left, right)
    enc = relpos.create(
        "shaw",
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        max_relative_position=(left, right),
        values=False,
    )
    with torch.no_grad():
        enc.key_table.copy_(hf.distance_embedding.weight)
    x = torch.randn(2, 37, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = hf(x)
        got = _relpos_forward(hf, enc, x, backend)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_gradients_of_the_table_equal_wav2vec2_bert() -> None:
    hf = _hf_attention(6, 2)
    enc = relpos.create(
        "shaw", num_heads=HEADS, head_dim=HEAD_DIM, max_relative_position=(6, 2), values=False
    )
    with torch.no_grad():
        enc.key_table.copy_(hf.distance_embedding.weight)
    x = torch.randn(2, 30, HIDDEN, generator=torch.Generator().manual_seed(2))
    g = torch.randn(2, 30, HIDDEN, generator=torch.Generator().manual_seed(3))
    (hf(x)[0] * g).sum().backward()
    (_relpos_forward(hf, enc, x, "chunked") * g).sum().backward()
    torch.testing.assert_close(enc.key_table.grad, hf.distance_embedding.weight.grad)
