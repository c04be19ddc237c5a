"""Training a transformers model built from a config with a relpos bias encoding (ALiBi,
KERPLE, FIRE, T5) through the patch: the model's RoPE is off, relpos's memory-efficient
``chunked`` backend computes attention, gradients reach the model and the encoding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny import model, tokens  # noqa: E402

from relpos.interop.hf import patch  # noqa: E402

BIASES = ("alibi", "kerple-log", "fire", "t5")


def loss_and_grads(hf, handle, ids, mask=None):
    hf.zero_grad()
    for p in handle.parameters():
        p.grad = None
    loss = hf(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}
    grads.update({f"enc.{n}": p.grad.clone() for n, p in handle.encodings.named_parameters()})
    return loss.detach(), grads


@pytest.mark.parametrize("method", BIASES)
def test_a_bias_encoding_trains_on_the_chunked_backend_as_on_eager(method):
    hf = model("llama").train()
    ids = tokens(32, batch=2)
    with patch(hf, method, backend="chunked") as handle:
        loss, grads = loss_and_grads(hf, handle, ids)
        state = handle.encodings.state_dict()  # the same (randomly initialised) encoding
    with patch(hf, method, backend="eager") as handle:
        handle.encodings.load_state_dict(state)
        ref_loss, ref_grads = loss_and_grads(hf, handle, ids)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    assert grads.keys() == ref_grads.keys()
    assert "model.layers.0.self_attn.q_proj.weight" in grads
    learnable = [n for n, p in handle.encodings.named_parameters() if p.requires_grad]
    for name in learnable:
        assert grads[f"enc.{name}"].abs().sum() > 0, name
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_training_steps_lower_the_loss_with_padding():
    """A few AdamW steps on one right-padded batch (model and encoding parameters)."""
    hf = model("llama").train()
    ids = tokens(24, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0
    with patch(hf, "kerple-log", backend="chunked") as handle:
        opt = torch.optim.AdamW([*hf.parameters(), *handle.parameters()], lr=3e-3)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = hf(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(p.grad is not None for p in handle.parameters())


def test_the_bias_replaces_the_models_rope():
    """With a bias encoding the attention sees raw q/k: shifting every position by the same
    amount leaves ALiBi's logits unchanged (no RoPE left, the bias is relative)."""
    hf = model("llama")
    ids = tokens(16)
    with patch(hf, "alibi"), torch.no_grad():
        a = hf(ids, position_ids=torch.arange(16)[None]).logits
        b = hf(ids, position_ids=torch.arange(16)[None] + 7).logits
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
