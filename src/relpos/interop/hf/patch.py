"""``patch(model, method, **options)``: relpos attention inside a transformers decoder.

No modeling file is forked. transformers (5.x) dispatches every attention layer through a
registry of attention functions (``AttentionInterface``) chosen by
``config._attn_implementation``, and builds the layers' masks with a registry of mask builders
(``AttentionMaskInterface``) chosen by the same name. The patch registers, under a name of its
own (``relpos_<method>_<n>``):

* an attention function ``fn(module, q (B, H, Lq, D), k, v (B, Hkv, Lk, D), attention_mask,
  *, dropout, scaling, position_ids, **kwargs) -> ((B, Lq, H, Dv), None)`` that runs
  ``relpos.attention``;
* transformers' own ``sdpa_mask`` as the mask builder, so padding, packed-sequence and
  sliding-window masks reach the function as a bool ``(B, 1, Lq, Lk)`` tensor (True = attend)
  or None when a causal mask suffices. Without a builder transformers silently passes
  ``attention_mask=None`` to every layer and padding is ignored (measured: 0.44 logit error on
  a left-padded row; ``tests/interop/test_hf_patch.py`` keeps that trap covered).

Methods:

* ``"baseline"``: the model's own RoPE (applied by the model), attention by relpos's
  backends. ``backend=None`` (default) calls transformers' own attention function itself, so
  logits are bit-identical to the unpatched model: ``sdpa_attention_forward``, or, for a call
  with softcapping or sinks (which transformers' SDPA function does not compute) and for a
  model that ran eager attention before the patch, the model's own
  ``eager_attention_forward`` (its modeling module's) with transformers' eager form of the
  mask; ``backend="chunked"`` (O(L x block) memory), ``"eager"``, ``"sdpa"`` or
  ``"flex"`` run ``relpos.attention`` on the rotated q/k.

Attention-logit softcapping and attention sinks are passed to ``relpos.attention`` for every
method: the ``softcap`` the model gives its attention function (Gemma-2 and VaultGemma pass
``config.attn_logit_softcapping``) and the sinks it gives as ``s_aux`` (gpt-oss, Granite-SWA,
Flint, MiMo-V2-Flash: the layer's ``sinks`` parameter, one logit per query head). Backends
that cannot compute them refuse the call by name (``sdpa`` cannot softcap); ``auto`` chooses
among those that can (``relpos.attention.api.BACKEND_FEATURES``).
* any relpos encoding name (``relpos.available()``) that acts inside attention on 1-D
  positions: ``"rope"`` (with ``scaling=`` an HF dict: linear, dynamic, yarn, llama3,
  longrope, ... as ``relpos.rope_scaling`` computes them), the piecewise schedules
  ``"self-extend"``, ``"dca"``, ``"lm-infinite"``, other rotary variants, and biases
  (``"alibi"``, ``"kerple-log"``, ``"fire"``, ``"t5"``) for models trained with them. The
  model's RoPE is switched off (a forward hook on its rotary module(s), found by what they
  are: ``probe.rotary_modules``, makes the
  rotation exactly the identity: ``(cos, sin) = (1, 0)``, the complex ``1``, or the row 0
  of a table of sines and cosines by position, ``probe.position_table``, so the
  model's apply function returns q and k unchanged and the cache stores raw keys) and relpos
  applies the encoding with float64 angle products.

  How each layer rotates is read from the model first (``probe.probe_rotary``: the model's
  own code run on a known input): pair layout, rotated channels and their place, sense of
  rotation, layers without RoPE. A rotary encoding takes the model's ``rope_theta``,
  scaling dict and ``max_position_embeddings`` (of each layer's type: Gemma-3's local and
  global RoPE) with the probed layout and ``partial_rotary_factor``; pairs relpos's layouts
  do not name (NanoChat's reversed half-split pairs, DeepSeek's rotated channels at the end
  of the head) are brought into relpos's ``half`` layout by a channel permutation of q and k
  (logits are unchanged by a permutation applied to both). ``options`` override the facts.
  Layers the probe finds without RoPE (Llama-4's and SmolLM3's NoPE layers) run without an
  encoding for every method. One encoding per distinct layer RoPE is shared by its layers;
  learnable ones train through ``handle.parameters()``.

  Multi-axis RoPE (M-RoPE; vision-language text decoders: Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
  GLM-4V, Ernie 4.5 VL), whose rotary module takes position ids ``(3, B, L)`` (time,
  height, width): the probe also reads the axis each pair follows
  (``probe.probe_position_axes``), and ``"rope"`` runs relpos's ``m-rope`` with that
  ``axis_of_pair`` on the positions the rotary module receives. The keys' positions cannot
  follow from the queries' (a decoded text token's keys include an image's grid), so the
  patch keeps, per KV cache, the positions of the tokens it holds (logged after each
  forward; a cache the patch did not fill, or one cropped since, is refused). A rotary
  module that receives the positions of every cached token followed by the new ones
  (Qwen4-Exp: its attention's indexer rotates blocks of cached keys again, and the model
  keeps those positions with its cache) gives them directly. 1-D
  encodings (the schedules, biases) run on text positions (equal on every axis) and refuse
  ids that differ between axes. HunYuanVL splits its sections per channel (3 or 4 axes):
  ``"rope"`` runs relpos's ``m-rope`` with ``section_split="channels"`` and the config's
  ``mrope_section`` where the probe finds it reproduces the model; HunYuanVL as built
  normalizes q and k after RoPE, so only its text positions are exact (the probe's
  ``axes_refusal`` names the norm). A composite model's other towers (the vision encoder) keep
  the attention implementation they had.

Positions: transformers passes the query positions ``position_ids (B, Lq)`` only (where the
model does not pass them to attention, Persimmon, the positions its rotary module received
in the same forward are used; 3-D M-RoPE ids: see above). Keys are
contiguous (the cache holds the ``Lk`` latest tokens), so key ``j`` of row ``b`` sits at
``p_b,last - (Lk - 1 - j)``; left padding (``generate``) gives pads negative positions, which
are clamped to 0 and masked. A row whose query positions do not follow from that (packed
sequences: positions restarting inside a row) is refused for every method but baseline;
pad queries are those whose own key is masked (False, or the dtype's minimum in an additive
float mask such as Doge's dynamic mask) and are not checked.
Because the attention sees every key's position in each call, length-dependent scalings
(dynamic NTK, LongRoPE) use one set of frequencies for all keys of a call, also under the KV
cache (transformers keeps keys rotated with the frequencies of the step that cached them).

Refusals (``ValueError`` naming the feature and the reason): models that do not use the
attention interface (``model.inspect_model``) or have no rotary module, an additive
``position_bias``, attention dropout while training,
packed sequences, flash-attention varlen inputs, a layer that hands attention a bool mask
other than those transformers' builder made (a selection of keys made inside the layer,
Qwen4-Exp's indexer, scored with the RoPE the patch switches off; non-baseline methods,
layers with RoPE) and static or indexed KV caches (whose key
slots are not the latest tokens in order; non-baseline methods; the cache layers of layers
that never call attention, e.g. LFM2's convolutions, are not checked), encodings that add to
the token embeddings, read per-call inputs or m-D positions, a model option the encoding refuses
(e.g. partial rotary for an encoding without it), and a model that is already patched.

Sliding windows (Mistral, Qwen2, Gemma-3 local layers) are honoured exactly: transformers'
builder puts the window into the mask whenever the keys outgrow it, and relpos applies that
mask as given.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ...encodings.base import Encoding
from ...encodings.options import Refused
from ...encodings.registry import available, create, encoding_class
from ...optional import require
from .model import ModelFacts, inspect_model
from .probe import LayerRotary, TableAtPositionZero, identity_rotation, position_table

__all__ = ["patch", "PatchHandle", "BASELINE", "BACKENDS", "call_positions"]

BASELINE = "baseline"
#: relpos backends the patch accepts (None: transformers' SDPA, baseline only)
BACKENDS = ("auto", "eager", "sdpa", "chunked", "flex")
#: attention kwargs that change the result and that relpos does not implement
_REFUSED_KWARGS = {
    "cu_seq_lens_q": "flash-attention varlen (packed) inputs",
    "cu_seq_lens_k": "flash-attention varlen (packed) inputs",
}
_names = itertools.count()


def _transformers() -> Any:
    require("relpos.interop.hf", {"transformers": "Hugging Face models"})
    import transformers

    return transformers


# ------------------------------------------------------------------------------ positions


def call_positions(
    position_ids: Tensor, batch: int, lq: int, lk: int, mask: Tensor | None, method: str
) -> tuple[Tensor, Tensor]:
    """``(q_pos (B, Lq), k_pos (B, Lk))`` int64 of one attention call from transformers'
    ``position_ids (B|1, Lq)``: key ``j`` at ``position_ids[b, -1] - (Lk - 1 - j)`` (clamped to
    0: pads, masked). ``ValueError`` naming ``method`` when a query that is not padding has
    another position: packed sequences, whose key positions cannot be known. A query is
    padding when its own key (the diagonal entry of ``mask``) is masked in every head: False
    in a bool mask, the dtype's minimum (or -inf) in an additive float one (Doge hands
    attention its dynamic mask, a per-head bias on the keys with the dtype's minimum where
    transformers' mask excludes them); with ``mask`` None every query is real."""
    if position_ids.dim() != 2 or position_ids.shape[-1] != lq:
        raise ValueError(
            f"position_ids must be (batch, {lq}) for {lq} queries, got {tuple(position_ids.shape)}"
        )
    if position_ids.is_floating_point():
        raise ValueError(f"position_ids must be integers, got {position_ids.dtype}")
    pid = position_ids.to(torch.int64).expand(batch, lq)
    offset = pid[:, -1:] - (lk - 1)
    k_pos = torch.arange(lk, device=pid.device) + offset
    expected = k_pos[:, lk - lq :]
    wrong = pid != expected
    if mask is not None and mask.dim() == 4:
        i = torch.arange(lq, device=mask.device)
        own = mask[:, :, i, i + (lk - lq)]  # (B|1, H|1, Lq)
        if mask.dtype != torch.bool:
            own = own > torch.finfo(mask.dtype).min
        real = own.any(dim=1).expand(batch, lq)
        wrong = wrong & real.to(wrong.device)
    if bool(wrong.any()):
        raise ValueError(
            f"relpos.interop.hf method {method!r}: position_ids are not contiguous inside a "
            "row (packed sequences, or positions that restart); the key positions cannot be "
            "known. Pass one sequence per row (left or right padding with an attention_mask), "
            "or use method='baseline'"
        )
    return expected.clamp(min=0), k_pos.clamp(min=0)


class _PositionMemo:
    """The positions of the latest call, reused by the other layers of the same forward (the
    model passes one ``position_ids`` tensor to every layer)."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.value: tuple[Tensor, Tensor] | None = None

    def get(self, position_ids, batch, lq, lk, mask, method) -> tuple[Tensor, Tensor]:
        key = (id(position_ids), position_ids._version, batch, lq, lk, id(mask))
        if self.key is not None and self.key[1:] == key[1:] and self.key[0]() is position_ids:
            return self.value
        value = call_positions(position_ids, batch, lq, lk, mask, method)
        self.key = (weakref.ref(position_ids), *key[1:])
        self.value = value
        return value


def _forward_tokens(args: Any, kwargs: dict[str, Any]) -> int | None:
    """The number of tokens a decoder forward takes: the length of its ``input_ids`` or
    ``inputs_embeds`` (None when it receives neither)."""
    for name, index in (("input_ids", 0), ("inputs_embeds", None)):
        value = kwargs.get(name)
        if value is None and index is not None and len(args) > index:
            value = args[index]
        if torch.is_tensor(value) and value.dim() >= 2:
            return int(value.shape[1])
    return None


# ------------------------------------------------------------------------------ encodings


def _encoding_for(
    method: str, facts: ModelFacts, spec: LayerRotary, options: dict[str, Any]
) -> Encoding:
    extra: dict[str, Any] = {}
    if method == "rope" and spec.axis_of_pair is not None:
        # M-RoPE: relpos's m-rope with the probed axis of every pair (positions (B, L, 3))
        method, extra = "m-rope", {"axis_of_pair": spec.axis_of_pair}
    elif method == "rope" and spec.channel_sections is not None:
        # HunYuanVL's split of the doubled vector per channel (positions (B, L, axes))
        method = "m-rope"
        extra = {"mrope_section": list(spec.channel_sections), "section_split": "channels"}
    cls = encoding_class(method)
    if cls.adds_to_input:
        raise ValueError(
            f"method {method!r} adds to the token embeddings; the patch runs encodings that "
            "act inside attention (rotary, bias, nope)"
        )
    if cls.required_inputs or cls.needs_inputs:
        names = ", ".join(cls.required_inputs or cls.optional_inputs)
        raise ValueError(
            f"method {method!r} reads per-call inputs ({names}), which a transformers model "
            "does not pass"
        )
    if cls.dims != 1 and not extra:
        raise ValueError(
            f"method {method!r} takes {cls.dims}-D positions; transformers decoders give 1-D "
            "position_ids"
        )
    specs = cls.option_specs
    model_rope = facts.rope[spec.layer_type].options()
    model_rope.update(layout=spec.layout, partial_rotary_factor=spec.partial_rotary_factor)
    full: dict[str, Any] = {}
    for key, value in model_rope.items():
        if key in options or value is None:
            continue
        if key not in specs or isinstance(specs[key], Refused):
            needed = (
                (key == "partial_rotary_factor" and value != 1.0)
                or key == "scaling"
                or (key == "layout" and value != "half")
            )
            if needed and cls.has_rotary:
                reason = specs[key].reason if key in specs else "it has no such option"
                raise ValueError(
                    f"method {method!r} cannot take the model's {key}={value!r} "
                    f"({facts.model_type}): {reason}"
                )
            continue
        full[key] = value
    full.update(extra)
    full.update(options)
    return create(method, num_heads=spec.num_heads, head_dim=spec.head_dim, **full)


def _encoding_keys(facts: ModelFacts) -> tuple[dict[str, LayerRotary], tuple[str | None, ...]]:
    """One name per distinct layer RoPE (its layer type, numbered when a type has several)
    and each layer's name (None: no RoPE)."""
    by_key: dict[tuple, str] = {}
    specs: dict[str, LayerRotary] = {}
    names: list[str | None] = []
    for spec in facts.layers or ():
        if spec is None:
            names.append(None)
            continue
        if spec.key() not in by_key:
            taken = sum(1 for s in specs.values() if s.layer_type == spec.layer_type)
            name = spec.layer_type if taken == 0 else f"{spec.layer_type}_{taken}"
            by_key[spec.key()] = name
            specs[name] = spec
        names.append(by_key[spec.key()])
    return specs, tuple(names)


# ------------------------------------------------------------------------------ the handle


class PatchHandle:
    """A patched model: ``unpatch()`` (or leaving the ``with`` block) restores it.

    Attributes:
        model: the patched model; method, backend: what runs; name: the registered
            attention implementation; encodings: ``nn.ModuleDict`` layer type -> encoding
            (empty for baseline); facts: the model's ``ModelFacts``.
    """

    def __init__(
        self,
        model: nn.Module,
        method: str,
        backend: str | None,
        facts: ModelFacts,
        encodings: nn.ModuleDict,
        layer_keys: tuple[str | None, ...] = (),
        permutations: dict[str, Tensor] | None = None,
    ) -> None:
        self.model = model
        self.layer_keys = layer_keys
        self.permutations = permutations or {}
        self._rotary_positions: Tensor | None = None
        self.method = method
        self.backend = backend
        self.facts = facts
        self.encodings = encodings
        self.name = f"relpos_{method.replace('-', '_')}_{next(_names)}"
        self.previous = model.config._attn_implementation
        self.active = False
        self._hooks: list[Any] = []
        self._rotary_calls = 0
        self._positions = _PositionMemo()
        # multi-axis (M-RoPE) positions: those of the tokens each KV cache holds, of the
        # cached tokens at the start of this forward (None: not known) and of every token
        # of this forward's cache (None: not known)
        self._axis_log: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # a composite (vision-language) model: the decoder's attention modules are patched,
        # its other towers keep their attention (None: every module is the decoder's)
        composite = facts.config is not None and facts.config is not model.config
        self._decoder_modules = {id(m) for m in facts.decoder.modules()} if composite else None
        self._past_axis_positions: Tensor | None = None
        self._axis_positions: Tensor | None = None
        # tokens the cache held at the start of this forward, and this forward's tokens
        # (None: not known); a rotary module that receives positions for both turned every
        # cached token's (Qwen4-Exp's indexer rotates its cached keys' blocks again)
        self._cached_tokens = 0
        self._forward_tokens: int | None = None
        # the bool masks transformers' builder made in this forward (non-baseline methods)
        self._built_masks: list[Tensor] = []

    # -------------------------------------------------------------- lifecycle
    def _install(self) -> None:
        tf = _transformers()
        from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

        tf.AttentionInterface.register(self.name, _attention_function(weakref.ref(self)))
        # baseline without a relpos backend on a model that ran eager attention calls the
        # model's eager function: it gets the mask eager attention is built with (some
        # models extend the additive mask themselves: DeepSeek-V4's compressed keys)
        own_eager = self.method == BASELINE and self.backend is None and self.previous == "eager"
        if own_eager:
            builder = eager_mask
        elif self.method == BASELINE:
            builder = sdpa_mask
        else:  # the masks it builds are kept for the check of in-layer key selections
            builder = _mask_builder(weakref.ref(self))
        AttentionMaskInterface.register(self.name, builder)
        if self.method != BASELINE:
            self._hooks = [
                module.register_forward_hook(self._identity_rotation, with_kwargs=True)
                for module in self.facts.rotary_modules
            ]
            # a rotary module that indexes a position table (GPT-J, CodeGen) reads row 0, the
            # identity, for every position, so positions past the table run too
            self._hooks += [
                TableAtPositionZero(module)
                for module in self.facts.rotary_modules
                if position_table(module) is not None
            ]
            self._hooks.append(
                self.facts.decoder.register_forward_pre_hook(self._check_cache, with_kwargs=True)
            )
            self._hooks.append(self.facts.decoder.register_forward_hook(self._forget_masks))
            if self.facts.position_axes > 1:
                self._hooks.append(
                    self.facts.decoder.register_forward_hook(self._log_axes, with_kwargs=True)
                )
        try:
            self.model.set_attn_implementation(self.name)
            if self.model.config._attn_implementation != self.name:
                raise ValueError(
                    f"relpos.interop.hf: {type(self.model).__name__} refused to switch its "
                    "attention implementation (set_attn_implementation)"
                )
        except BaseException:
            self._uninstall()
            raise
        self.model._relpos_patch = self
        self.active = True

    def _uninstall(self) -> None:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.model.config._attn_implementation == self.name:
            self.model.set_attn_implementation(self.previous)
        AttentionInterface._global_mapping.pop(self.name, None)
        AttentionMaskInterface._global_mapping.pop(self.name, None)
        if getattr(self.model, "_relpos_patch", None) is self:
            del self.model._relpos_patch

    def unpatch(self) -> None:
        """Restore the model's attention implementation and RoPE (idempotent). A KV cache
        filled while patched holds raw (unrotated) keys for non-baseline methods: do not
        continue it unpatched."""
        if self.active:
            self._uninstall()
            self.active = False

    def __enter__(self) -> PatchHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unpatch()

    def parameters(self) -> Iterator[nn.Parameter]:
        """The encodings' parameters (learnable biases: FIRE, T5, KERPLE, ...), for the
        optimizer; they are not part of ``model.parameters()``."""
        return self.encodings.parameters()

    def encoding(self, layer_idx: int | None = None) -> Encoding | None:
        """The encoding layer ``layer_idx`` runs (None for baseline and layers without
        RoPE)."""
        if not len(self.encodings):
            return None
        if layer_idx is None:
            layer_idx = next(i for i, k in enumerate(self.layer_keys) if k is not None)
        key = self._layer_key(layer_idx)
        return None if key is None else self.encodings[key]

    def _layer_key(self, layer_idx: int | None) -> str | None:
        if layer_idx is None or not 0 <= layer_idx < len(self.layer_keys):
            raise ValueError(
                f"attention layer index {layer_idx!r} is not a layer of this "
                f"{self.facts.model_type} model ({len(self.layer_keys)} layers)"
            )
        return self.layer_keys[layer_idx]

    def __repr__(self) -> str:
        state = "active" if self.active else "unpatched"
        return (
            f"PatchHandle({type(self.model).__name__}, method={self.method!r}, "
            f"backend={self.backend!r}, {state})"
        )

    # -------------------------------------------------------------- the hooks
    def _check_cache(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        """Refuse caches whose attention layers' keys are not the latest ``Lk`` tokens in
        order (static caches keep fixed slots, so key positions would not follow from the
        queries'); a ``DynamicIndexedLayer`` (DeepSeek Sparse Attention: DeepSeek-V3.2,
        GLM-MoE-DSA) is a ``DynamicLayer`` whose attention keys grow in order, plus the
        indexer's own keys, which attention never receives; the cache layers of layers that
        never call attention and cache layers that hold no keys (LFM2's short convolutions, a
        hybrid's linear-attention or Mamba state: ``LinearAttentionLayer``, ``DummyLayer``)
        are not checked. For a multi-axis model: the positions of the tokens the cache
        already holds."""
        from transformers.cache_utils import CacheLayerMixin, DynamicLayer

        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = list(getattr(cache, "layers", None) or ())
        attention = self.facts.attention_layers
        if attention is not None and len(layers) == self.facts.num_layers:
            layers = [layers[i] for i in attention]
        for layer in layers:
            if not isinstance(layer, CacheLayerMixin):
                continue  # no keys
            if not isinstance(layer, DynamicLayer):
                raise ValueError(
                    f"relpos.interop.hf method {self.method!r}: {type(cache).__name__} "
                    f"({type(layer).__name__}) is not supported; its key slots are not the "
                    "latest tokens in order. Use the default DynamicCache, or method='baseline'"
                )
        self._rotary_positions = None
        self._cached_tokens = max(
            (int(layer.get_seq_length()) for layer in layers if isinstance(layer, CacheLayerMixin)),
            default=0,
        )
        self._forward_tokens = _forward_tokens(args, kwargs)
        if self.facts.position_axes > 1:
            self._axis_positions = None
            self._past_axis_positions = self._cached_axis_positions(cache)

    def _cached_axis_positions(self, cache: Any) -> Tensor | None:
        """The multi-axis positions ``(A, B, n)`` of the ``n`` tokens ``cache`` holds (an
        empty tensor for an empty cache); None when they are not known (a cache filled
        outside this patch, or cropped since)."""
        seen = self._cached_tokens
        if cache is None or seen == 0:
            return torch.zeros(self.facts.position_axes, 1, 0, dtype=torch.long)
        try:
            logged = self._axis_log.get(cache)
        except TypeError:  # an unhashable cache object
            return None
        return logged if logged is not None and logged.shape[-1] == seen else None

    def _log_axes(self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any):
        """After a forward of a multi-axis model: the positions of every token its cache
        now holds (for the keys of the next call)."""
        cache = None
        for source in (output, kwargs):  # the output's cache first: one the forward created
            for name in ("cache", "past_key_values"):
                if cache is None:
                    cache = (
                        source.get(name)
                        if isinstance(source, dict)
                        else getattr(source, name, None)
                    )
        if cache is None:
            return
        try:
            if self._axis_positions is None:
                self._axis_log.pop(cache, None)
            else:
                self._axis_log[cache] = self._axis_positions
        except TypeError:  # an unhashable cache object: its positions cannot be kept
            pass

    def _forget_masks(self, module: nn.Module, args: Any, output: Any) -> None:
        """After a decoder forward: drop the masks it built."""
        self._built_masks = []

    def _check_selection(self, module: nn.Module, mask: Tensor | None) -> None:
        """Refuse an attention call of a RoPE layer whose bool mask is none of the masks
        transformers' builder made in this forward: the layer changed the mask itself before
        attention, as a selection of keys does (Qwen4-Exp's query-selected-attention indexer
        keeps the top-scoring blocks of keys, scored with q and keys the model rotates by
        its RoPE). The patch switches that RoPE off (and a non-rope method turns by other
        angles), so such a selection is not the model's. While the selection keeps every
        key the mask allows (Qwen4-Exp: at most ``indexer_budget`` keys), the mask is the
        built one and the call runs. Not checked: masks of other dtypes (Doge's additive
        dynamic mask, computed from the values, which the patch leaves as they are), masks
        of a shape the builder did not make, and layers without RoPE (Kolibri's indexed NoPE
        layers select from their own q and k, which the patch leaves as they are)."""
        if mask is None or mask.dtype != torch.bool:
            return
        if any(built is mask for built in self._built_masks):  # handed on as built
            return
        shaped = [
            built
            for built in self._built_masks
            if built.dim() == mask.dim() == 4
            and built.shape[-2:] == mask.shape[-2:]
            and built.shape[0] in (1, mask.shape[0])
        ]
        if not shaped or any(not bool((built ^ mask).any()) for built in shaped):
            return
        raise ValueError(
            f"relpos.interop.hf method {self.method!r}: {type(module).__name__} hands "
            "attention a mask other than the one transformers built: it selects keys itself "
            "before it calls attention (Qwen4-Exp's query-selected-attention indexer keeps "
            "the top blocks of keys, scored with the model's RoPE, which the patch switches "
            "off), so the selection would not be the model's. Run at most as many tokens as "
            "the selection keeps (Qwen4-Exp: indexer_budget), or use method='baseline'"
        )

    def _identity_rotation(
        self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any
    ) -> Any:
        """The rotary module's rotation replaced by the identity (``probe.identity_rotation``:
        the model's apply function then returns q and k unchanged; relpos rotates instead);
        the positions it was asked for are kept for attention calls without position_ids,
        and, in a multi-axis model, for the keys of later calls."""
        out = identity_rotation(output, type(module).__name__, module)
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if torch.is_tensor(position_ids):
            self._rotary_positions = position_ids
            if self.facts.position_axes > 1:
                self._axis_positions = self._joined_axis_positions(position_ids)
        self._rotary_calls += 1
        return out

    def _covers_cache(self, positions: Tensor) -> bool:
        """Whether the rotary module received ``positions`` for every token the cache held
        at the start of this forward followed by this forward's tokens (Qwen4-Exp's decoder
        turns them all: its attention's indexer rotates blocks of cached keys again; the
        model keeps those positions with the cache, through crops and reorders), rather
        than for this forward's tokens only."""
        return (
            self._cached_tokens > 0
            and self._forward_tokens is not None
            and positions.shape[-1] == self._cached_tokens + self._forward_tokens
        )

    def _joined_axis_positions(self, position_ids: Tensor) -> Tensor | None:
        """The cached tokens' multi-axis positions followed by this forward's ``(A, B, L)``
        (1-D ids: the same on every axis); None when the cached ones are not known. Where
        the rotary module received the positions of the cached tokens too
        (``_covers_cache``), they are these."""
        axes = self.facts.position_axes
        current = position_ids.to(torch.int64)
        if current.dim() == 2:
            current = current[None].expand(axes, -1, -1)
        if current.dim() != 3 or current.shape[0] != axes:
            return None
        if self._covers_cache(current):
            return current
        past = self._past_axis_positions
        if past is None:
            return None
        if past.shape[-1] == 0:
            return current
        batch = max(past.shape[1], current.shape[1])
        if {past.shape[1], current.shape[1]} - {1, batch}:
            return None
        past, current = past.expand(-1, batch, -1), current.expand(-1, batch, -1)
        return torch.cat([past.to(current.device), current], dim=-1)

    def _axis_call_positions(self, batch: int, lq: int, lk: int) -> tuple[Tensor, Tensor]:
        """``(q_pos (B, Lq, 3), k_pos (B, Lk, 3))`` of an attention call of relpos's m-rope:
        the keys are the ``Lk`` latest tokens of the cache, the queries its last ``Lq``."""
        positions = self._axis_positions
        what = f"relpos.interop.hf method {self.method!r}"
        if positions is None or positions.shape[-1] < lk:
            raise ValueError(
                f"{what}: the multi-axis (M-RoPE) positions of the cached keys are not known "
                "(a cache filled outside this patch, or cropped or reordered since); pass the "
                "cache this patch filled, or use method='baseline'"
            )
        keys = positions[..., positions.shape[-1] - lk :].permute(1, 2, 0)
        keys = keys.expand(batch, -1, -1)
        return keys[:, lk - lq :], keys

    def _position_ids(self, kwargs: dict[str, Any]) -> Tensor:
        """The query positions of an attention call: its ``position_ids``, else those the
        rotary module received in this forward. Multi-axis (M-RoPE) ids must agree on every
        axis (text), also where the model hands attention 1-D text positions while its rotary
        module turns by the multi-axis ones (Qwen2-VL's 4-row ids)."""
        position_ids = kwargs.get("position_ids")
        rotary = self._rotary_positions
        what = f"relpos.interop.hf method {self.method!r}"
        for ids in (rotary, position_ids):
            if torch.is_tensor(ids) and ids.dim() == 3 and not bool((ids == ids[:1]).all()):
                why = (
                    f" ({self.facts.axes_refusal})"
                    if self.method == "rope" and self.facts.axes_refusal
                    else ": relpos's m-rope runs them for method 'rope' only"
                )
                raise ValueError(
                    f"{what}: multi-axis (M-RoPE) position_ids that differ between axes "
                    f"(image or video tokens) are not 1-D positions{why}"
                )
        if position_ids is None and rotary is not None and self._covers_cache(rotary):
            position_ids = rotary[..., rotary.shape[-1] - self._forward_tokens :]
        if position_ids is None:
            position_ids = rotary
        if position_ids is None:
            raise ValueError(f"{what}: the model passed no position_ids to attention")
        if position_ids.dim() == 3:
            position_ids = position_ids[0]
        return position_ids

    def owns(self, module: nn.Module) -> bool:
        """Whether ``module`` is an attention module of the decoder the patch runs (a
        vision-language model's vision tower is not)."""
        return self._decoder_modules is None or id(module) in self._decoder_modules

    def outside(
        self,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        **kwargs: Any,
    ) -> tuple[Tensor, Any]:
        """The attention of a module outside the decoder (a vision tower), computed by the
        implementation the model ran before the patch."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        previous = self.previous if isinstance(self.previous, str) else "sdpa"
        if previous == "eager" or previous not in ALL_ATTENTION_FUNCTIONS:
            return _model_eager_attention(
                module,
                query,
                key,
                value,
                attention_mask,
                softcap=kwargs.pop("softcap", None),
                s_aux=kwargs.pop("s_aux", None),
                **kwargs,
            )
        return ALL_ATTENTION_FUNCTIONS[previous](
            module, query, key, value, attention_mask, **kwargs
        )

    def attend(
        self,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        position_bias: Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        """The registered attention function (see the module docstring)."""
        from ...attention import attention

        what = f"relpos.interop.hf method {self.method!r}"
        for name, feature in _REFUSED_KWARGS.items():
            if kwargs.get(name) is not None:
                raise ValueError(f"{what}: {feature} ({name}=) is not supported")
        selected = kwargs.pop("indices", None)  # sparse attention's top-k keys per query
        if selected is not None and selected.shape[-1] < key.shape[-2]:
            raise ValueError(
                f"{what}: the model's sparse attention selects {selected.shape[-1]} of its "
                f"{key.shape[-2]} keys per query (indices=: DeepSeek Sparse Attention's "
                "indexer, config index_topk), which relpos's attention does not reproduce "
                "(it attends to every key the mask allows); run at most index_topk tokens"
            )
        if position_bias is not None:
            raise ValueError(f"{what}: an additive position_bias is not supported")
        if dropout and module.training:
            raise ValueError(
                f"{what}: attention dropout ({dropout}) is not supported; set the config's "
                "attention_dropout to 0 for training"
            )
        softcap = kwargs.pop("softcap", None)
        sinks = kwargs.pop("s_aux", None)
        if sinks is None:
            sinks = kwargs.pop("sinks", None)
        if self.method == BASELINE and self.backend is None:
            if softcap is not None or sinks is not None or self.previous == "eager":
                forward, extra = _model_eager_attention, {"softcap": softcap, "s_aux": sinks}
            else:
                from transformers.integrations.sdpa_attention import sdpa_attention_forward

                forward, extra = sdpa_attention_forward, {}
            return forward(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                is_causal=is_causal,
                **extra,
                **kwargs,
            )
        lq, lk = query.shape[2], key.shape[2]
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        window = kwargs.get("sliding_window")
        if window is not None and attention_mask is None and lk > window:
            raise ValueError(
                f"{what}: sliding window {window} with {lk} keys but no mask; the window "
                "reaches relpos only through transformers' mask"
            )
        mask = attention_mask  # causality (bottom-right), padding, windows; causal agrees
        encoding = None
        q_pos = k_pos = None
        if self.method != BASELINE:
            if self._rotary_calls == 0:
                raise ValueError(
                    f"{what}: the model's RoPE did not come from its rotary module, so it "
                    "cannot be replaced"
                )
            name = self._layer_key(getattr(module, "layer_idx", None))
            if name is not None:
                encoding = self.encodings[name]
                _to_device(encoding, query.device)
                perm = self.permutations.get(name)
                if perm is not None:  # the model's pairs in relpos's layout (q and k alike)
                    perm = perm.to(query.device)
                    query, key = query[..., perm], key[..., perm]
                self._check_selection(module, mask)
                if encoding.dims > 1:  # M-RoPE: relpos's m-rope on the logged positions
                    q_pos, k_pos = self._axis_call_positions(query.shape[0], lq, lk)
                else:
                    q_pos, k_pos = self._positions.get(
                        self._position_ids(kwargs), query.shape[0], lq, lk, mask, self.method
                    )
        out = attention(
            query,
            key,
            value,
            encoding,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal,
            mask=mask,
            scale=scaling,
            backend=self.backend or "auto",
            softcap=softcap,
            sinks=sinks,
        )
        return out.transpose(1, 2).contiguous(), None


def _model_eager_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    softcap: float | None,
    s_aux: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The model's own ``eager_attention_forward`` (its modeling module's), for ``baseline``
    without a relpos backend on a call with softcapping or sinks or in a model that ran eager
    attention before the patch, with the mask in the form transformers' eager attention
    receives (``masking_utils.eager_mask``: 0 where attended, the dtype's minimum
    elsewhere). Without one: transformers' SDPA function, or a ``ValueError`` for a call
    with softcapping or sinks."""
    import sys

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None and softcap is None and s_aux is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if eager is None:
        raise ValueError(
            f"relpos.interop.hf method 'baseline': {type(module).__name__} applies "
            "softcapping or sinks and its modeling module has no eager_attention_forward to "
            "call; pass backend='eager' (relpos computes them)"
        )
    lq, lk = query.shape[2], key.shape[2]
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    if attention_mask is None and causal and lq > 1:
        # transformers' builder leaves out a purely causal mask (SDPA's is_causal covers it);
        # eager attention needs it spelt out (bottom-right aligned)
        i = torch.arange(lq, device=query.device)[:, None] + (lk - lq)
        attention_mask = (torch.arange(lk, device=query.device)[None, :] <= i)[None, None]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        low = torch.finfo(query.dtype).min
        attention_mask = torch.where(attention_mask, 0.0, low).to(query.dtype)
    extra: dict[str, Any] = {}
    if softcap is not None:
        extra["softcap"] = softcap
    if s_aux is not None:
        extra["s_aux"] = s_aux
    out, _ = eager(module, query, key, value, attention_mask, **kwargs, **extra)
    return out, None


def _to_device(encoding: Encoding, device: torch.device) -> None:
    """Move ``encoding`` to ``device`` if the model moved (``model.to`` does not reach it)."""
    for tensor in itertools.chain(encoding.parameters(), encoding.buffers()):
        if tensor.device != device:
            encoding.to(device)
        return


def _mask_builder(ref: weakref.ReferenceType) -> Any:
    """transformers' ``sdpa_mask`` (wrapped: its name and signature), keeping the bool masks
    it builds in a forward for ``PatchHandle._check_selection``."""
    from transformers.masking_utils import sdpa_mask

    @functools.wraps(sdpa_mask)
    def relpos_mask(*args: Any, **kwargs: Any) -> Tensor | None:
        mask = sdpa_mask(*args, **kwargs)
        handle = ref()
        if handle is not None and torch.is_tensor(mask) and mask.dtype == torch.bool:
            handle._built_masks.append(mask)
        return mask

    return relpos_mask


def _attention_function(ref: weakref.ReferenceType) -> Any:
    def relpos_attention(module, query, key, value, attention_mask, **kwargs):
        handle = ref()
        if handle is None or not handle.active:
            raise ValueError(
                "relpos.interop.hf: this attention implementation belongs to a patch that was "
                "undone; patch the model again"
            )
        if not handle.owns(module):  # a vision tower's attention: as before the patch
            return handle.outside(module, query, key, value, attention_mask, **kwargs)
        return handle.attend(module, query, key, value, attention_mask, **kwargs)

    return relpos_attention


# ------------------------------------------------------------------------------ patch


def patch(
    model: nn.Module, method: str = BASELINE, *, backend: str | None = None, **options: Any
) -> PatchHandle:
    """Run relpos attention (and a relpos positional encoding) inside a transformers decoder.

    Args:
        model: a transformers causal LM that uses the attention interface (Llama, Qwen2/3,
            Mistral, Gemma-3, Phi-3, OLMo-2, ...).
        method: ``"baseline"`` (the model's own RoPE, relpos's attention) or a relpos
            encoding name: ``"self-extend"``, ``"dca"``, ``"lm-infinite"``, ``"rope"``
            (``scaling=`` an HF rope dict), a bias (``"alibi"``, ``"kerple-log"``, ``"fire"``,
            ``"t5"``), ...
        backend: ``None`` (baseline: transformers' own SDPA call, bit-identical; other
            methods: ``"auto"``) or a relpos backend (``"auto"``, ``"eager"``, ``"sdpa"``,
            ``"chunked"``, ``"flex"``); ``"chunked"`` keeps memory at O(L x block).
        options: the encoding's options (``relpos.create``), over the model's RoPE facts.

    Returns a ``PatchHandle`` (a context manager; ``unpatch()``). ``model(...)`` and
    ``model.generate(...)`` then run through relpos, with padding, the KV cache, GQA, partial
    rotary and any activation dtype. See the module docstring for what is refused.
    """
    _transformers()
    facts = inspect_model(model)
    if not isinstance(method, str):
        raise TypeError(f"method must be 'baseline' or a relpos encoding name, got {method!r}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {list(BACKENDS)}, got {backend!r}")
    existing = getattr(model, "_relpos_patch", None)
    if existing is not None and existing.active:
        raise ValueError(f"the model is already patched ({existing!r}); unpatch it first")
    encodings = nn.ModuleDict()
    layer_keys: tuple[str | None, ...] = ()
    permutations: dict[str, Tensor] = {}
    if method == BASELINE:
        if options:
            raise ValueError(
                f"method 'baseline' takes no encoding options, got {sorted(options)}; the model "
                "keeps its own RoPE"
            )
    else:
        if method not in available():
            encoding_class(method)  # ValueError naming the known encodings (or an alias)
        try:
            facts = inspect_model(model, probe=True)
        except RuntimeError as err:  # the probe's q/k rows do not fit the positions
            raise ValueError(
                f"relpos.interop.hf method {method!r}: the {facts.model_type} layers' q and k "
                f"do not match the tokens' positions when their rotation is read ({err}): "
                "keys that are not one per token (DeepSeek-V4 appends compressed keys to its "
                "attention keys) have positions relpos cannot know. Use method='baseline'"
            ) from None
        specs, layer_keys = _encoding_keys(facts)
        if not specs:
            raise ValueError(
                f"relpos.interop.hf: no layer of the {facts.model_type} model applies RoPE, so "
                f"method {method!r} has no RoPE to replace"
            )
        device = next(itertools.chain(model.parameters(), [torch.empty(0)])).device
        for key, spec in specs.items():
            encodings[key] = _encoding_for(method, facts, spec, options).to(device)
            if spec.permutation is not None:
                permutations[key] = torch.tensor(spec.permutation, dtype=torch.long)
        if backend is None:
            backend = "auto"
        from ...attention import supported_backends

        allowed = supported_backends(next(iter(encodings.values())))
        if backend != "auto" and backend not in allowed:
            raise ValueError(
                f"backend {backend!r} cannot run method {method!r} exactly; its backends are "
                f"{allowed} (or 'auto')"
            )
    handle = PatchHandle(model, method, backend, facts, encodings, layer_keys, permutations)
    handle._install()
    return handle
