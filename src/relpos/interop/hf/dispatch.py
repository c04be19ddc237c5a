"""Whether a transformers decoder's RoPE reaches attention only through the attention interface.

``relpos.interop.hf.patch`` registers an attention function in transformers' attention
interface (``AttentionInterface``) and, for every method but ``baseline``, switches the model's
RoPE off (its rotary module returns the identity rotation) and rotates q and k itself inside
that function. That is exact only where every layer that applies the model's rotation hands the
rotated q and k to ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)``:
a layer that computes attention itself (GPT-NeoX-Japanese's ``GPTNeoXJapaneseAttention._attn``)
would silently lose its RoPE.

transformers' class flag ``_supports_attention_backend`` does not say this: it is False for
models whose attention layers do dispatch through the interface but which transformers does not
advertise for custom backends (hybrids with linear-attention or Mamba layers: Qwen3-Next,
Qwen3.5, Bamba, Falcon-H1, OLMo-hybrid; Falcon, StableLM). ``check_attention_dispatch`` reads
it from the model's own code instead: it runs the model twice on a short input under a
temporary attention function that returns zeros (``probe._capture``), once as it is and once
with its rotary modules returning the identity rotation. When attention is only reached through
the interface, every attention output is zero in both runs and nothing else reads the rotation,
so the model's output is the same in both runs (inside a layer, q and k after RoPE differ, and
so may what a layer computes from them on the way to the interface: NanoChat normalizes q and
k after RoPE). Where the output differs, the check refuses and names the first layer (a module
with ``layer_idx``, in the order they finish) whose output differs. A model that calls the
interface not at all (RoFormer: ``RoFormerSelfAttention`` computes its scores with
``torch.matmul`` itself and ``set_attn_implementation`` leaves it as it is) is refused for
that where its output does not show the rotation (a tiny random model's nearly uniform
attention hides it below the check's tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .probe import _capture, identity_rotation

__all__ = ["check_attention_dispatch", "attention_output_refusal", "DISPATCH_TOKENS"]

#: tokens of the check's input (positions 1 .. DISPATCH_TOKENS: every one rotates)
DISPATCH_TOKENS = 8


def _first_tensor(output: Any) -> Tensor | None:
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if torch.is_tensor(item):
                return item
    for name in ("last_hidden_state", "logits"):
        value = getattr(output, name, None)
        if torch.is_tensor(value):
            return value
    return None


def _outputs(
    model: nn.Module,
    ids: Tensor,
    pos: Tensor,
    rotary: Sequence[nn.Module],
    identity: bool,
    output: str = "zeros",
) -> tuple[list[tuple[str, Tensor]], int]:
    """The outputs of the model (name ``""``) and of its layers (modules with a ``layer_idx``,
    rotary modules left out) in the order they finish, and the number of attention-interface
    calls, with every interface call returning ``output`` (``probe._capture``: zeros by
    default)."""
    rotary_ids = {id(m) for m in rotary}
    finished: list[tuple[str, Tensor]] = []
    hooks = []

    def keep(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            out = _first_tensor(output)
            if out is not None and (out.is_floating_point() or out.is_complex()):
                finished.append((name, out.detach().clone()))

        return hook

    for name, module in model.named_modules():
        if id(module) not in rotary_ids and (not name or hasattr(module, "layer_idx")):
            hooks.append(module.register_forward_hook(keep(name)))
    for module in rotary:
        if identity:
            where = type(module).__name__
            hooks.append(
                module.register_forward_hook(
                    lambda m, a, out, w=where: identity_rotation(out, w, m)
                )
            )
    records: list[tuple[Any, Tensor, Tensor]] = []
    try:
        with _capture(model, records, output), torch.no_grad():
            model(input_ids=ids, position_ids=pos, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return finished, len(records)


def _differs(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return True
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    scale = float(torch.maximum(a.abs().max(), b.abs().max()).clamp(min=1e-30).float())
    return float((a.float() - b.float()).abs().max()) > 1e-3 * scale


def _attention_layer(model: nn.Module, name: str) -> str:
    """``name``, or its nearest enclosing module that has a ``layer_idx`` (an attention
    layer), with that module's class."""
    modules = dict(model.named_modules())
    parts = name.split(".") if name else []
    for cut in range(len(parts), -1, -1):
        candidate = ".".join(parts[:cut])
        module = modules.get(candidate)
        if module is not None and hasattr(module, "layer_idx"):
            return f"{candidate} ({type(module).__name__})"
    return f"{name or '<model>'} ({type(modules.get(name, model)).__name__})"


def _check_input(model: nn.Module) -> tuple[Tensor, Tensor]:
    """The checks' input: ``DISPATCH_TOKENS`` random tokens (seed 0) at positions 1, 2, ..."""
    params = next(iter(model.parameters()), None)
    device = params.device if params is not None else torch.device("cpu")
    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, DISPATCH_TOKENS), generator=gen).to(device)
    pos = torch.arange(1, DISPATCH_TOKENS + 1, device=device)[None]
    return ids, pos


def _changed(
    model: nn.Module, ids: Tensor, pos: Tensor, rotary: Sequence[nn.Module], output: str
) -> list[str]:
    """The modules (``_outputs``) whose output changes when the rotary modules return the
    identity rotation, every attention call returning ``output``, in the order they finish
    (``[""]`` where the two runs finish different modules)."""
    was_training = model.training
    model.eval()
    try:
        (normal, _), (switched, _) = (
            _outputs(model, ids, pos, rotary, identity, output) for identity in (False, True)
        )
    finally:
        model.train(was_training)
    if [n for n, _ in normal] != [n for n, _ in switched]:
        return [""]
    return [name for (name, a), (_, b) in zip(normal, switched, strict=True) if _differs(a, b)]


def attention_output_refusal(
    model: nn.Module, rotary: Sequence[nn.Module], model_type: str
) -> str | None:
    """Why the patch cannot replace the RoPE of a model whose layers turn the attention
    output with it after the attention call, or None when none does.

    ``check_attention_dispatch`` returns zeros from every attention call, which hides a
    rotation of the output (it turns zeros into zeros). Here every call returns one fixed
    nonzero output instead; where a layer's output then still changes with the rotation, the
    layer transforms what attention returned by its RoPE, and the patch, which turns q and
    k only (with the model's rotary modules returning the identity), would lose that. A
    second pair of runs returns each query's own value: where the layer's output then does
    not change, the layer turns the output back by exactly the rotation its values carry at
    the query's own position, i.e. it computes ``sum_j p_ij R(p_j - p_i) v_j`` (the
    rotation of RoVE, rotary value embedding). transformers' DeepSeek-V4
    (``models/deepseek_v4/modeling_deepseek_v4.py``, ``DeepseekV4Attention.forward``) reads
    its one rotated key-value head as key and value and applies
    ``apply_rotary_pos_emb(attn_output, cos, -sin)`` to the output."""
    if not rotary:
        return None
    ids, pos = _check_input(model)
    changed = _changed(model, ids, pos, rotary, "fixed")
    if not changed:
        return None
    where = _attention_layer(model, changed[0]) if changed[0] else "a module outside its layers"
    seen = (
        f"relpos.interop.hf: {where} of the {model_type} model turns the attention output by "
        "its RoPE after the attention call: with every attention call returning one fixed "
        "output, its output still changes with the rotation"
    )
    if _changed(model, ids, pos, rotary, "own value"):
        return (
            f"{seen}. relpos's patch turns q and k only, so with the model's RoPE switched "
            "off that transformation of the output would be lost"
        )
    return (
        f"{seen}, and with every call returning each query's own value it does not: the "
        "layer turns the output back by the query's angle, so its values carry their keys' "
        "rotation: it attends as sum_j p_ij R(p_j - p_i) v_j (e.g. DeepSeek-V4, which reads "
        "its one rotated key-value head as key and value and applies "
        "apply_rotary_pos_emb(attn_output, cos, -sin)). relpos's patch turns q and k only, "
        "not values and outputs"
    )


def check_attention_dispatch(
    model: nn.Module, rotary: Sequence[nn.Module], model_type: str
) -> None:
    """``ValueError`` naming the layer (module path and class) when the model uses its RoPE
    outside transformers' attention interface, so that a registered attention function would not
    see (or replace) it; see the module docstring. Nothing to check without rotary modules."""
    if not rotary:
        return
    ids, pos = _check_input(model)
    was_training = model.training
    model.eval()
    try:
        (normal, calls), (switched, _) = (
            _outputs(model, ids, pos, rotary, identity) for identity in (False, True)
        )
    finally:
        model.train(was_training)
    if [n for n, _ in normal] != [n for n, _ in switched]:
        raise ValueError(
            f"relpos.interop.hf: the {model_type} model runs different layers with and without "
            "its RoPE, so where it uses the rotation cannot be checked"
        )
    if not normal or not _differs(normal[-1][1], switched[-1][1]):
        # the rotation reaches the output (the last to finish) only through the interface, or
        # the model calls the interface not at all (then nothing runs through the patch)
        if calls == 0:
            layers = dict.fromkeys(
                type(m).__name__ for m in model.modules() if hasattr(m, "layer_idx")
            )
            found = ", ".join(type(m).__name__ for m in rotary)
            raise ValueError(
                f"relpos.interop.hf: the {model_type} model calls no function of transformers' "
                f"attention interface (0 calls in a forward): its attention layers "
                f"({', '.join(layers) or type(model).__name__}) compute their scores themselves, "
                "so a registered attention function would never run and could neither see nor "
                f"replace the RoPE its rotary module ({found}) computes"
            )
        return
    changed = [name for (name, a), (_, b) in zip(normal, switched, strict=True) if _differs(a, b)]
    where = _attention_layer(model, changed[0]) if changed[0] else "a module outside its layers"
    raise ValueError(
        f"relpos.interop.hf: {where} of the {model_type} model uses its RoPE outside "
        f"transformers' attention interface (with every interface call returning zeros, its "
        f"output still changes with the rotation; {calls} interface calls seen), so it computes "
        "attention itself and a registered attention function would neither see nor replace "
        "its RoPE"
    )
