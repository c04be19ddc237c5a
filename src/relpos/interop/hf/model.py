"""What ``relpos.interop.hf`` reads from a Hugging Face ``transformers`` decoder.

``inspect_model(model) -> ModelFacts`` reads, once and loudly (``ValueError`` naming what is
missing), the facts every part of the integration needs:

* the attention sizes: ``num_heads`` ``H``, ``num_kv_heads`` ``Hkv`` (grouped-query attention:
  query head ``h`` reads key/value head ``h // (H / Hkv)``), ``head_dim`` ``D``;
* the RoPE of each layer type (``RopeFacts``): ``rope_theta``, ``partial_rotary_factor``, the
  scaling dict (``rope_parameters`` without its ``rope_theta`` / ``partial_rotary_factor``
  keys; None for ``default``) and ``max_position_embeddings``. Models with one RoPE
  (Llama, Qwen2, Mistral, Phi-3) have one type, ``"full_attention"``; Gemma-3-style configs
  nest ``rope_parameters[layer_type]`` and name each layer's type in ``config.layer_types``
  (an entry None, or a type the dict does not name, is a layer type without RoPE: Beam's and
  Ergo's full-attention layers, LFM-3's convolution layers); DeepSeek-V4 keys it by RoPE
  labels that its attention modules name (``rope_labels``: ``"main"``, ``"compress"``);
* the decoder and its rotary module(s), which compute the rotation every layer applies,
  found by what they are (``probe.rotary_modules``: modules that hold inverse frequencies,
  ``*RotaryEmbedding`` classes), not by their attribute name (LFM2-MoE's ``pos_emb``;
  ModernBERT's decoder, whose ``get_decoder()`` is its LM head); a vision-language model's
  text decoder and its text config (``decoder_config``);
* with ``probe=True``, how each attention layer actually rotates q and k (``probe.py``: pair
  layout, rotated channels and their place, sense of rotation, frequencies and attention
  scaling, layers without RoPE), read by running the model's own code on a known input, not
  from a table of model types. Every non-baseline patch, ``from_hf`` and ``HFCausalLM`` use
  these facts.

Keys of a RoPE dict that place channels on position axes (``AXIS_KEYS``: ``mrope_section``,
``mrope_interleaved``) are kept out of the scaling dict; the sections are kept in
``RopeFacts.mrope_section`` for the probe to check (HunYuanVL's per-channel split).

Keys of a RoPE dict that the model's attention applies itself, outside the rotation, are
left to the model (``RopeFacts.model_applied``): Ministral-3's ``llama_4_scaling_beta``
(Llama-4's attention temperature, ``q * (1 + beta log(1 + floor(p / original_length)))``
after RoPE, in ``Ministral3Attention``). relpos's rotation is linear, so it commutes with
that per-position factor.

It refuses, by name and with the reason, models it cannot run exactly: a model with a layer
that uses its RoPE outside transformers' attention interface (``dispatch.py``: read from what
the layers compute, not from the ``_supports_attention_backend`` flag, which is False for
models whose attention does dispatch, e.g. Falcon and the linear-attention hybrids) and
encoder-decoder models (attention-logit softcapping and sinks reach ``relpos.attention``
through the attention call: ``patch``). With ``probe=True`` it also refuses a model whose
layers turn the attention output by their RoPE (``dispatch.attention_output_refusal``:
DeepSeek-V4 turns it back by the query's angle), naming what the probe finds besides. A
decoder without a rotary module runs ``baseline`` only (the probe's refusal names why). Read
against transformers 5.25.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .dispatch import attention_output_refusal, check_attention_dispatch
from .facts import FULL, ModelFacts, RopeFacts
from .probe import (
    hidden_width,
    is_rotary_module,
    position_table,
    probe_model,
    rotary_modules,
    table_base,
)

__all__ = [
    "RopeFacts",
    "ModelFacts",
    "inspect_model",
    "rope_facts",
    "rope_labels",
    "MODEL_APPLIED_KEYS",
    "AXIS_KEYS",
]


#: RoPE-dict keys whose effect the model's attention module applies itself, outside the
#: rotation (transformers ``models/ministral3/modeling_ministral3.py``:
#: ``get_llama_4_attn_scale`` multiplies q after RoPE)
MODEL_APPLIED_KEYS = frozenset({"llama_4_scaling_beta"})

#: RoPE-dict keys that say which position axis each rotated pair or channel of a multi-axis
#: RoPE (M-RoPE) follows, not its frequencies (Qwen2-VL's ``mrope_section``, Qwen3-VL's
#: ``mrope_interleaved``; HunYuanVL's ``mrope_section``, the ``xdrope_section`` its config
#: renames): kept out of the scaling dict, whose frequency functions do not take them. The
#: probe reads the axes from the model (``probe.probe_position_axes``)
AXIS_KEYS = frozenset({"mrope_section", "mrope_interleaved"})

#: RoPE-dict keys transformers' RoPE functions do not read (``modeling_rope_utils`` takes
#: the length from ``config.max_position_embeddings``; Ministral-3's dicts carry a copy)
UNREAD_KEYS = frozenset({"max_position_embeddings"})

#: keys of one scaling type that transformers' function for it does not read but relpos's
#: type does: earlier vLLM's YaRN keys (``relpos.rope_scaling.yarn``), which
#: ``_compute_yarn_parameters`` (``modeling_rope_utils.py``) ignores with a warning; the
#: patch drops them to rotate as the transformers model does
UNREAD_BY_TYPE = {"yarn": frozenset({"extrapolation_factor", "attn_factor", "apply_yarn_scaling"})}


def _read(config: Any, key: str) -> Any:
    """``config.key``, or None where the config has none or no single value (transformers'
    per-layer attributes raise on the global read)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - e.g. AmbiguousGlobalPerLayerAttributeError
        return None


def _need(config: Any, key: str, model_type: str) -> Any:
    value = _read(config, key)
    if value is None:
        raise ValueError(
            f"relpos.interop.hf: the {model_type} config has no {key!r}; the patch needs the "
            "attention sizes of a decoder (num_attention_heads, num_key_value_heads, head_dim)"
        )
    return value


def rope_facts(params: Mapping[str, Any], config: Any) -> RopeFacts:
    """``RopeFacts`` of one ``rope_parameters`` dict (``rope_type``, ``rope_theta``, scaling
    keys; ``partial_rotary_factor`` inside it or on the config)."""
    params = dict(params)
    base = params.pop("rope_theta", None)
    if base is None:
        base = _read(config, "rope_theta")
    if base is None:
        raise ValueError("relpos.interop.hf: the config's rope_parameters have no 'rope_theta'")
    partial = params.pop("partial_rotary_factor", None)
    if partial is None:
        partial = _read(config, "partial_rotary_factor") or 1.0
    applied = {k: params.pop(k) for k in sorted(MODEL_APPLIED_KEYS & set(params))}
    applied = {k: v for k, v in applied.items() if v is not None}
    for key in UNREAD_KEYS:
        params.pop(key, None)
    sections = params.pop("mrope_section", None)
    for key in AXIS_KEYS:
        params.pop(key, None)
    rope_type = params.get("rope_type", params.get("type", "default"))
    for key in UNREAD_BY_TYPE.get(rope_type, ()):
        params.pop(key, None)
    scaling = None if rope_type == "default" else params
    return RopeFacts(
        base=float(base),
        partial_rotary_factor=float(partial),
        scaling=scaling,
        max_position_embeddings=_read(config, "max_position_embeddings"),
        model_applied=applied,
        mrope_section=None if sections is None else tuple(int(n) for n in sections),
    )


def rope_labels(decoder: nn.Module, params: Any, num_layers: int) -> tuple[str, ...] | None:
    """The key of ``rope_parameters`` each attention layer rotates with, where the dict is
    keyed by RoPE labels that the modeling code assigns to layers instead of by
    ``config.layer_types``, or None. transformers' DeepSeek-V4
    (``models/deepseek_v4/modeling_deepseek_v4.py``) keys it ``"main"`` (``rope_theta``, no
    scaling) and ``"compress"`` (``compress_rope_theta``, with the config's YaRN), and each
    ``DeepseekV4Attention`` names its label in ``rope_layer_type``: ``"main"`` for
    ``sliding_attention`` layers, ``"compress"`` for the compressed ones (CSA, HCA), whose
    compressors rotate their compressed keys with it too. Read from the attention modules
    (a ``layer_idx`` and a ``rope_layer_type`` that names a nested entry of the dict); None
    unless every layer ``0 .. num_layers - 1`` names one, and for two labels on one layer."""
    if not isinstance(params, Mapping):
        return None
    labels = {k for k, v in params.items() if isinstance(v, Mapping)}
    found: dict[int, str] = {}
    for module in decoder.modules():
        layer, label = getattr(module, "layer_idx", None), getattr(module, "rope_layer_type", None)
        if not isinstance(layer, int) or not isinstance(label, str) or label not in labels:
            continue
        if found.setdefault(layer, label) != label:
            return None
    if not labels or sorted(found) != list(range(num_layers)):
        return None
    return tuple(found[i] for i in range(num_layers))


def _rope_per_type(
    config: Any, rotary: tuple[nn.Module, ...] = (), labels: tuple[str, ...] | None = None
) -> tuple[dict[str, RopeFacts], bool]:
    """The RoPE of each layer type and whether ``rope_parameters`` is keyed by layer type.

    A dict keyed by the layer types of ``config.layer_types`` (Gemma-3, Gemma-4, LFM-3) gives
    one ``RopeFacts`` per type it names; a type whose entry is None (Beam, Ergo: their
    full-attention layers run without RoPE) or that it does not name (LFM-3's convolution
    layers) has none, and the probe must then find no rotation in its layers. Any other dict
    is the one RoPE of every layer. A config without one (GPT-J, CodeGen: their rotary
    module indexes a table of sines and cosines, ``probe.position_table``) gets the base
    the ``rotary`` modules' table follows (``probe.table_base``); the rotated channels and
    their pairs are the probe's to read."""
    params = _read(config, "rope_parameters")
    if params is None:
        params = _read(config, "rope_scaling")
    if not isinstance(params, Mapping):
        tables = [t for t in map(position_table, rotary) if t is not None]
        if tables:
            bases = {table_base(t) for t in tables}
            if len(bases) > 1:
                raise ValueError(
                    "relpos.interop.hf: the config has no rope_parameters dict and the rotary "
                    f"modules' position tables follow different bases {sorted(bases)}"
                )
            rope = RopeFacts(
                base=bases.pop(), max_position_embeddings=_read(config, "max_position_embeddings")
            )
            return {FULL: rope}, False
        raise ValueError(
            "relpos.interop.hf: the config has no rope_parameters dict; the patch runs RoPE "
            "decoders (transformers >= 5)"
        )
    if labels is not None:  # keyed by the layers' RoPE labels (rope_labels: DeepSeek-V4)
        return {t: rope_facts(params[t], config) for t in sorted(set(labels))}, True
    layer_types = _read(config, "layer_types") or ()
    typed = sorted({t for t in layer_types if t in params})
    if typed and all(params[t] is None or isinstance(params[t], Mapping) for t in typed):
        return {t: rope_facts(params[t], config) for t in typed if params[t] is not None}, True
    return {FULL: rope_facts(params, config)}, False


def _has_rotary_child(module: nn.Module, hidden_size: int | None) -> bool:
    return any(
        is_rotary_module(name, child, hidden_size) for name, child in module.named_children()
    )


def _decoder(model: nn.Module, hidden_size: int | None = None) -> nn.Module:
    """The module that runs the decoder layers and computes their RoPE, found by the rotary
    modules it holds (``probe.is_rotary_module``), not by an attribute name:

    * ``model.get_decoder()`` when it holds a rotary module (a VL model's language model),
      narrowed to its shallowest submodule that has a rotary module as a child and holds all
      of them (Llama-4's causal LM returns itself; its ``model`` computes the RoPE);
    * otherwise (ModernBERT's decoder returns its LM head) the shallowest module of ``model``
      that has a rotary module as a child, the one with the most attention layers
      (``layer_idx``) among equally shallow ones;
    * without any rotary module, ``model.get_decoder()`` (or ``model``).

    ``hidden_size``: the model's (``probe.hidden_width``), for rotary position tables
    (``probe.is_rotary_table``: RoFormer)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    if not isinstance(decoder, nn.Module):
        decoder = model
    rotary = rotary_modules(decoder, hidden_size)
    if rotary:
        for _, module in decoder.named_modules():
            if _has_rotary_child(module, hidden_size):
                inside = {id(m) for m in module.modules()}
                if all(id(r) in inside for r in rotary):
                    return module
        return decoder
    best: tuple[tuple[int, int], nn.Module] | None = None
    for name, module in model.named_modules():
        if _has_rotary_child(module, hidden_size):
            layers = sum(1 for m in module.modules() if hasattr(m, "layer_idx"))
            rank = (name.count(".") + bool(name), -layers)
            if best is None or rank < best[0]:
                best = (rank, module)
    if best is not None:
        return best[1]
    return decoder


def decoder_config(config: Any) -> Any:
    """The config of the decoder: a composite (vision-language) config's text config
    (``get_text_config(decoder=True)``: Qwen2-VL's ``text_config``), else ``config``."""
    get = getattr(config, "get_text_config", None)
    if not callable(get):
        return config
    try:
        text = get(decoder=True)
    except TypeError:
        text = get()
    return config if text is None else text


def inspect_model(model: nn.Module, *, probe: bool = False) -> ModelFacts:
    """The ``ModelFacts`` of a transformers causal LM (or its decoder); ``ValueError`` naming
    what is missing or refused (see the module docstring); ``TypeError`` for a non-model.
    ``probe=True`` also reads how every layer rotates q and k (``probe.probe_rotary``: two
    forward passes of the model on a short known input)."""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None:
        raise TypeError(
            f"model must be a transformers PreTrainedModel (e.g. LlamaForCausalLM), got "
            f"{type(model).__name__}"
        )
    model_type = getattr(config, "model_type", type(model).__name__)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"relpos.interop.hf runs decoder-only models; {model_type} is an encoder-decoder"
        )
    hidden_size = hidden_width(model)
    decoder = _decoder(model, hidden_size)
    rotary = tuple(rotary_modules(decoder, hidden_size))
    config = decoder_config(config)
    heads = int(_need(config, "num_attention_heads", model_type))
    kv_heads = int(_read(config, "num_key_value_heads") or heads)
    head_dim = _read(config, "head_dim") or (int(_need(config, "hidden_size", model_type)) // heads)
    layers = int(_need(config, "num_hidden_layers", model_type))
    params = _read(config, "rope_parameters")
    labels = rope_labels(decoder, params, layers)
    rope, per_layer_type = _rope_per_type(config, rotary, labels)
    layer_types = labels or tuple(_read(config, "layer_types") or (FULL,) * layers)
    facts = ModelFacts(
        model_type=model_type,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        num_layers=layers,
        rope=rope,
        layer_types=layer_types,
        per_layer_type=per_layer_type,
        decoder=decoder,
        rotary=rotary[0] if rotary else None,
        rotary_modules=rotary,
        config=config,
    )
    # what the layers do, not transformers' _supports_attention_backend flag (dispatch.py)
    if facts.rotary_modules:  # nothing to switch off without one: baseline only
        check_attention_dispatch(model, facts.rotary_modules, model_type)
    if probe:
        # a layer that turns the attention output by its RoPE (dispatch.py): refused, with
        # what the probe finds besides (the probe's calls return zeros, which it leaves be)
        refusal = attention_output_refusal(model, facts.rotary_modules, model_type)
        try:
            facts = probe_model(model, facts)
        except ValueError as err:
            if refusal is None:
                raise
            besides = str(err).removeprefix("relpos.interop.hf: ")
            raise ValueError(f"{refusal}. Besides, {besides}") from None
        if refusal is not None:
            raise ValueError(refusal)
    return facts
