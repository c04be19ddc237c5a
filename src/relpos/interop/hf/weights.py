"""Weights both ways between transformers' Llama-family models and ``relpos.nn.LlamaLM``.

``from_hf(model) -> LlamaLM`` and ``to_hf(lm) -> transformers.LlamaForCausalLM`` move the same
tensors (copied) under these names (``i`` = layer):

    transformers                                   relpos LlamaLM
    model.embed_tokens.weight                      embed.weight
    model.layers.i.input_layernorm.weight          blocks.i.attn_norm.weight
    model.layers.i.self_attn.q_proj.weight         blocks.i.attn.q_proj.weight
    model.layers.i.self_attn.{k,v}_proj.weight     blocks.i.attn.kv_proj.weight = cat(k, v, 0)
    model.layers.i.self_attn.o_proj.weight         blocks.i.attn.out_proj.weight
    model.layers.i.post_attention_layernorm.weight blocks.i.mlp_norm.weight
    model.layers.i.mlp.{gate,up,down}_proj.weight  blocks.i.mlp.{gate,up,down}_proj.weight
    model.norm.weight                              norm.weight
    lm_head.weight                                 lm_head.weight (absent when tied)

Both models are the same function: pre-norm blocks, RMSNorm in float32 then
``weight * x.to(dtype)``, SwiGLU, GQA, RoPE in the pair layout ``from_hf`` reads from the
model itself (``inspect_model(model, probe=True)``: transformers' Llama pairs channels
half-split; a model found to pair them interleaved has its q/k rows permuted into the
requested ``layout``, ``relpos.interop.rope_layout``), the RoPE scaling dict carried over as
the ``rope`` encoding's ``scaling``. Logits agree to float32
rounding both ways (tests/interop/test_hf_weights.py).

Refused by name: anything ``LlamaLM`` cannot represent exactly. Leftover or missing tensors
(Qwen2's q/k/v biases, Qwen3's q/k norms, Cohere's parallel block without a second norm, ...),
another activation than SiLU, a head size other than ``hidden_size / num_attention_heads``,
constant factors on embeddings, residuals, attention or logits (Granite's multipliers,
Cohere's ``logit_scale``), partial rotary, a sliding window (Mistral), layer types with
different RoPEs, layers without RoPE, pairs in neither relpos layout, a RoPE-dict key the
model's attention applies itself other than ``llama_4_scaling_beta``, and for ``to_hf`` an
encoding other than ``rope`` or a model with a query temperature. Ministral-3's
``llama_4_scaling_beta`` (with the dict's ``original_max_position_embeddings``) becomes
``LlamaConfig.query_temperature_beta`` / ``query_temperature_length``: ``LlamaLM`` multiplies
its queries by ``1 + beta ln(1 + floor(p / length))`` as ``Ministral3Attention`` does
(transformers ``models/ministral3/modeling_ministral3.py``). Finally ``from_hf`` runs both
models on a short known input (and, with a temperature, at positions across its steps) and
refuses unless their logits agree (``check=True``), so what a model computes beyond its
tensors and these config keys is refused too rather than copied wrong.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ...nn.llama import LlamaConfig, LlamaLM
from ...validation import check_choice
from ..rope_layout import half_to_interleaved, interleaved_to_half
from .facts import FULL
from .model import inspect_model, rope_facts
from .patch import _transformers

__all__ = ["llama_config_from_hf", "from_hf", "to_hf", "MULTIPLIERS"]

#: config keys of constant factors LlamaLM does not apply, with the value that is no factor
#: (transformers ``models/granite``: ``embedding_multiplier``, ``residual_multiplier``,
#: ``attention_multiplier`` as the softmax scale, ``logits_scaling`` as a divisor;
#: ``models/cohere``: ``logit_scale``)
MULTIPLIERS = {
    "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0,
    "logits_scaling": 1.0,
    "logit_scale": 1.0,
}

#: RoPE-dict keys the model's attention applies that ``LlamaLM`` states
#: (``LlamaConfig.query_temperature_*``)
LLAMA_LM_APPLIES = frozenset({"llama_4_scaling_beta"})

#: relative error of the logits within which ``from_hf``'s check accepts the copy, by the
#: model's dtype (float32 rounding of two summation orders; 16-bit rounding)
CHECK_RTOL = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 3e-2}


def llama_config_from_hf(config: Any, *, layout: str = "half") -> tuple[LlamaConfig, dict | None]:
    """``(LlamaConfig, scaling)`` of a transformers Llama-family config; ``scaling`` is the
    RoPE scaling dict (None for plain RoPE). ``ValueError`` naming what LlamaLM lacks."""
    check_choice(layout, "layout", ("half", "interleaved"))
    what = getattr(config, "model_type", type(config).__name__)
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"from_hf: {what} uses hidden_act={act!r}; LlamaLM's MLP is SwiGLU (silu)")
    from .model import _read, _rope_per_type

    heads, dim = config.num_attention_heads, config.hidden_size
    head_dim = _read(config, "head_dim") or dim // heads
    if head_dim * heads != dim:
        raise ValueError(
            f"from_hf: {what} has head_dim={head_dim} with {heads} heads and hidden_size={dim}; "
            "LlamaLM needs head_dim = hidden_size / num_attention_heads"
        )
    for key, neutral in MULTIPLIERS.items():
        value = _read(config, key)
        if value is not None and value != neutral:
            raise ValueError(
                f"from_hf: {what} has {key}={value} (a constant factor on the embeddings, the "
                "residual branches, the attention logits or the output logits: Granite, "
                "Cohere); LlamaLM has none"
            )
    scale = _read(config, "attention_multiplier")
    if scale is not None and not math.isclose(scale, head_dim**-0.5, rel_tol=1e-6):
        raise ValueError(
            f"from_hf: {what} has attention_multiplier={scale} as its softmax scale; LlamaLM "
            f"scales the logits by head_dim^-0.5 = {head_dim**-0.5:g}"
        )
    window = _read(config, "sliding_window")
    if window is not None and getattr(config, "use_sliding_window", True):
        raise ValueError(
            f"from_hf: {what} has sliding_window={window}; LlamaLM has no sliding-window "
            "attention (use relpos.interop.hf.patch to run the model itself)"
        )
    for key in ("attention_bias", "mlp_bias"):
        if getattr(config, key, False):
            raise ValueError(f"from_hf: {what} has {key}=True; LlamaLM's projections have no bias")
    if _read(config, "rope_parameters") is None and _read(config, "rope_scaling") is None:
        config_rope = {FULL: rope_facts({"rope_theta": 10000.0}, config)}
    else:
        config_rope, _ = _rope_per_type(config)
    distinct = {
        (r.base, repr(r.scaling), r.partial_rotary_factor, repr(r.model_applied))
        for r in config_rope.values()
    }
    if len(distinct) > 1:
        raise ValueError(
            f"from_hf: {what} gives its layer types different RoPEs ({sorted(config_rope)}); "
            "LlamaLM has one RoPE for every layer"
        )
    if not config_rope:
        raise ValueError(f"from_hf: {what} configures no RoPE; LlamaLM rotates every layer")
    rope = next(iter(config_rope.values()))
    if rope.partial_rotary_factor != 1.0:
        raise ValueError(
            f"from_hf: {what} rotates a part of each head (partial_rotary_factor="
            f"{rope.partial_rotary_factor}); LlamaLM rotates whole heads"
        )
    temperature = _query_temperature(rope.model_applied, rope.scaling, what)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    out = LlamaConfig(
        vocab_size=config.vocab_size,
        dim=dim,
        depth=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        hidden_dim=config.intermediate_size,
        rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        rope_base=rope.base,
        rope_layout=layout,
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048)),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        bos_token_id=getattr(config, "bos_token_id", None),
        eos_token_id=eos,
        name=str(getattr(config, "name_or_path", "") or what),
        **temperature,
    )
    return out, rope.scaling


def _query_temperature(applied: dict[str, Any], scaling: dict | None, what: str) -> dict:
    """``LlamaConfig``'s query temperature options of a RoPE dict's ``llama_4_scaling_beta``
    (``Ministral3Attention``: ``beta`` with the dict's ``original_max_position_embeddings``);
    ``{}`` without it."""
    beta = applied.get("llama_4_scaling_beta")
    if beta is None:
        return {}
    length = (scaling or {}).get("original_max_position_embeddings")
    if length is None:
        raise ValueError(
            f"from_hf: {what} has llama_4_scaling_beta={beta} but its rope_parameters have no "
            "original_max_position_embeddings, the length of the temperature's steps"
        )
    return {"query_temperature_beta": float(beta), "query_temperature_length": int(length)}


def _qk(weight: Tensor, heads: int, head_dim: int, source: str, target: str) -> Tensor:
    """q/k projection rows of pair layout ``source`` reordered for layout ``target``."""
    if source == target:
        return weight
    if target == "interleaved":
        return half_to_interleaved(weight, heads, head_dim)
    return interleaved_to_half(weight, heads, head_dim)


def _source_layout(model: nn.Module) -> str:
    """The pair layout every layer of ``model`` rotates q and k in (probed); ``ValueError``
    naming what ``LlamaLM`` cannot state."""
    facts = inspect_model(model, probe=True)
    what = f"from_hf: {facts.model_type}"
    for rope in facts.rope.values():
        unstated = sorted(set(rope.model_applied) - LLAMA_LM_APPLIES)
        if unstated:
            raise ValueError(
                f"{what} applies {unstated} in its attention, outside the rotation; LlamaLM "
                "has no such step"
            )
    layouts = set()
    for i, layer in enumerate(facts.layers or ()):
        if layer is None:
            raise ValueError(f"{what} layer {i} has no RoPE; LlamaLM rotates every layer")
        if layer.rotary_dim != layer.head_dim:
            raise ValueError(
                f"{what} layer {i} rotates {layer.rotary_dim} of {layer.head_dim} channels; "
                "LlamaLM rotates whole heads"
            )
        if layer.permutation is not None:
            raise ValueError(
                f"{what} layer {i} pairs its channels in neither the half-split nor the "
                "interleaved layout; LlamaLM's rope has these two"
            )
        layouts.add(layer.layout)
    if len(layouts) != 1:
        raise ValueError(f"{what} rotates its layers in different layouts {sorted(layouts)}")
    return layouts.pop()


def from_hf(
    model: nn.Module, *, layout: str = "half", backend: str = "auto", check: bool = True
) -> LlamaLM:
    """A ``LlamaLM`` with the weights of a transformers Llama-family causal LM (copied).

    Args:
        model: ``LlamaForCausalLM`` (or any model with exactly Llama's tensors: Mistral
            without a sliding window, ...).
        layout: RoPE pair layout of the result (``"half"``: a half-split model's rows as
            they are).
        backend: the ``LlamaLM``'s attention backend.
        check: run both models once on a short known input (two rows of 8 tokens) and
            refuse (``ValueError``) unless their logits agree within ``CHECK_RTOL`` of the
            model's dtype: the guard against what a model computes beyond its tensors.

    The encoding is ``rope`` with the model's base, trained length and scaling dict. Returned
    in the model's training mode and dtype, on its device.
    """
    _transformers()
    config, scaling = llama_config_from_hf(model.config, layout=layout)
    source = _source_layout(model)  # the refusals every HF entry point shares
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}

    def take(name: str) -> Tensor:
        try:
            return state.pop(name).detach().clone()
        except KeyError:
            raise ValueError(
                f"from_hf: the {model.config.model_type} model has no tensor {name!r}, so its "
                "blocks are not LlamaLM's (pre-norm RMSNorm before attention and before a "
                "SwiGLU MLP with separate q/k/v and gate/up/down projections)"
            ) from None

    hd = config.head_dim
    sd: dict[str, Tensor] = {
        "embed.weight": take("model.embed_tokens.weight"),
        "norm.weight": take("model.norm.weight"),
    }
    for i in range(config.depth):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        sd[b + "attn_norm.weight"] = take(p + "input_layernorm.weight")
        sd[b + "mlp_norm.weight"] = take(p + "post_attention_layernorm.weight")
        q = take(p + "self_attn.q_proj.weight")
        k = take(p + "self_attn.k_proj.weight")
        sd[b + "attn.q_proj.weight"] = _qk(q, config.num_heads, hd, source, layout)
        k = _qk(k, config.num_kv_heads, hd, source, layout)
        sd[b + "attn.kv_proj.weight"] = torch.cat((k, take(p + "self_attn.v_proj.weight")), 0)
        sd[b + "attn.out_proj.weight"] = take(p + "self_attn.o_proj.weight")
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[b + f"mlp.{name}.weight"] = take(p + f"mlp.{name}.weight")
    head = state.pop("lm_head.weight", None)
    if not config.tie_embeddings:
        if head is None:
            raise ValueError("from_hf: the model has no tensor 'lm_head.weight'")
        sd["lm_head.weight"] = head.detach().clone()
    if state:
        raise ValueError(
            f"from_hf: the {model.config.model_type} model holds tensors LlamaLM has no place "
            f"for: {sorted(state)[:4]}"
        )
    options = {} if scaling is None else {"scaling": scaling}
    with torch.device("meta"):
        lm = LlamaLM(config, "nope", backend=backend)
    lm.load_state_dict(sd, assign=True, strict=True)
    lm.set_encoding("rope", **options)
    if check:
        _check_same_logits(model, lm)
    return lm.train(model.training)


def _check_same_logits(model: nn.Module, lm: LlamaLM) -> None:
    """``ValueError`` unless ``lm`` gives the model's logits on a short known input (two rows
    of 8 tokens) within ``CHECK_RTOL`` of the model's dtype: what the model computes beyond
    its tensors and config keys (a constant factor, another norm) shows here. With a query
    temperature the rows also run at positions across its first and third steps."""
    weight = lm.embed.weight
    vocab = weight.shape[0]
    ids = torch.arange(16, device=weight.device).reshape(2, 8) * 7 % vocab
    positions: list[Tensor | None] = [None]
    step = lm.config.query_temperature_length
    if step is not None:
        starts = torch.tensor([[step - 4], [3 * step - 4]], device=weight.device)
        positions.append(starts + torch.arange(8, device=weight.device))
    was_training = model.training
    model.eval()
    lm.eval()
    err = 0.0
    try:
        with torch.no_grad():
            for pos in positions:
                extra = {} if pos is None else {"position_ids": pos}
                ref = model(input_ids=ids, use_cache=False, **extra).logits.float()
                out = lm(ids, pos=pos).float()
                err = max(err, float((out - ref).abs().max() / ref.abs().max().clamp(min=1e-30)))
    finally:
        model.train(was_training)
    tol = CHECK_RTOL.get(weight.dtype, 3e-2)
    if not err <= tol:
        raise ValueError(
            f"from_hf: the {model.config.model_type} model computes something LlamaLM does not "
            f"with the same tensors: their logits differ by {err:.3g} (relative; tolerance "
            f"{tol:g}). Run the model itself with relpos.interop.hf.patch"
        )


def to_hf(lm: LlamaLM) -> nn.Module:
    """A transformers ``LlamaForCausalLM`` with the weights of ``lm`` (copied), whose encoding
    must be ``rope`` (its base, trained length and ``scaling`` dict become the config's
    ``rope_parameters``). Other encodings have no transformers equivalent: export the RoPE
    model and run the method with ``relpos.interop.hf.patch``."""
    tf = _transformers()
    if not isinstance(lm, LlamaLM):
        raise TypeError(f"lm must be a relpos.nn.LlamaLM, got {type(lm).__name__}")
    enc = lm.encoding
    if lm.encoding_name != "rope" or enc is None:
        raise ValueError(
            f"to_hf exports LlamaLM with the 'rope' encoding, got {lm.encoding_name!r}; use "
            "lm.set_encoding('rope') and run the method on the exported model with "
            "relpos.interop.hf.patch(model, method=...)"
        )
    if enc.partial_rotary_factor != 1.0:
        raise ValueError("to_hf: partial rotary is not supported by LlamaForCausalLM's export")
    if lm.config.query_temperature_beta is not None:
        raise ValueError(
            "to_hf: the model has a query temperature (query_temperature_beta="
            f"{lm.config.query_temperature_beta}); LlamaForCausalLM has none"
        )
    c = lm.config
    rope_parameters = {"rope_type": "default", **(enc.scaling or {}), "rope_theta": enc.base}
    kwargs: dict[str, Any] = {}
    if c.bos_token_id is not None:
        kwargs["bos_token_id"] = c.bos_token_id
    if c.eos_token_id is not None:
        kwargs["eos_token_id"] = c.eos_token_id
    config = tf.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.dim,
        intermediate_size=c.hidden_dim,
        num_hidden_layers=c.depth,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=enc.max_position_embeddings or c.max_position_embeddings,
        tie_word_embeddings=c.tie_embeddings,
        rope_parameters=rope_parameters,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        **kwargs,
    )
    hd, layout = c.head_dim, enc.layout
    src = lm.state_dict()
    sd: dict[str, Tensor] = {
        "model.embed_tokens.weight": src["embed.weight"],
        "model.norm.weight": src["norm.weight"],
    }
    for i in range(c.depth):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        sd[p + "input_layernorm.weight"] = src[b + "attn_norm.weight"]
        sd[p + "post_attention_layernorm.weight"] = src[b + "mlp_norm.weight"]
        q = src[b + "attn.q_proj.weight"]
        k, v = src[b + "attn.kv_proj.weight"].split(c.num_kv_heads * hd, 0)
        sd[p + "self_attn.q_proj.weight"] = _qk(q, c.num_heads, hd, layout, "half")
        sd[p + "self_attn.k_proj.weight"] = _qk(k, c.num_kv_heads, hd, layout, "half")
        sd[p + "self_attn.v_proj.weight"] = v
        sd[p + "self_attn.o_proj.weight"] = src[b + "attn.out_proj.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{name}.weight"] = src[b + f"mlp.{name}.weight"]
    sd["lm_head.weight"] = src["embed.weight" if c.tie_embeddings else "lm_head.weight"]
    dtype = src["embed.weight"].dtype
    model = tf.LlamaForCausalLM(config).to(dtype)
    missing, unexpected = model.load_state_dict(
        {k: v.detach().clone() for k, v in sd.items()}, strict=False
    )
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"to_hf: tensors did not match: missing {missing}, extra {unexpected}")
    return model.to(src["embed.weight"].device).train(lm.training)
