"""``TransformerLM``: a pre-norm decoder-only language model that takes an encoding name."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.call import MaskMod
from ..attention.linear.feature_maps import FeatureMap
from ..attention.linear.state import LinearState
from ..encodings.base import Encoding
from ..validation import check_int, check_token_ids
from .attention import MultiHeadAttention, build_encoding
from .cache import KVCache, LayerCache


def _layer_feature_map(feature_map: str | FeatureMap | None, index: int) -> str | FeatureMap | None:
    """Layer ``index``'s feature map: a name is built per layer; an instance is used by the
    first layer and deep-copied for the others (no module shared by two layers unasked)."""
    if isinstance(feature_map, FeatureMap) and index > 0:
        return copy.deepcopy(feature_map)
    return feature_map


class MLP(nn.Module):
    """Position-wise feed-forward: ``Linear(dim, r dim) -> GELU -> Linear(r dim, dim)``."""

    def __init__(self, dim: int, ratio: float = 4.0) -> None:
        super().__init__()
        hidden = int(dim * ratio)
        self.fc_in = nn.Linear(dim, hidden)
        self.fc_out = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(torch.nn.functional.gelu(self.fc_in(x)))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, dim: int, attn: MultiHeadAttention, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None,
        cache: LayerCache | LinearState | None,
        inputs: dict[str, Tensor] | None = None,
        mask_mod: MaskMod | None = None,
    ) -> Tensor:
        x = x + self.attn(self.norm1(x), pos=pos, cache=cache, inputs=inputs, mask_mod=mask_mod)
        return x + self.mlp(self.norm2(x))


#: weight initialisations of ``TransformerLM`` (its ``init`` argument)
INIT_SCHEMES = ("gpt2", "fan-in")


class TransformerLM(nn.Module):
    """Decoder-only LM (pre-norm, GELU MLP, tied or untied input/output embeddings).

    Args:
        vocab_size, dim, depth, num_heads: the usual sizes.
        encoding: registry name (e.g. "rope", "alibi", "kerple-log", "sinusoidal", "nope").
        encoding_options: keyword options for ``relpos.create``.
        share_encoding: one encoding module for all layers (the KERPLE and T5 papers' code
            share their bias parameters across layers); False gives each layer its own.
        num_kv_heads: grouped-query attention.
        backend: attention backend ("auto" picks per call).
        feature_map: kernelized (linear) attention in every layer instead of softmax
            (``MultiHeadAttention``: ``"elu1"``, ``"relu"``, ``"prf"`` or a
            ``relpos.attention.linear.feature_maps.FeatureMap``, one per layer);
            ``feature_map_options`` for a
            name. ``new_cache()`` then holds each layer's recurrent ``LinearState`` where the
            encoding allows (O(1) work per decoded token), a ``LayerCache`` otherwise.
        qkv_conv: causal depth-wise convolutions of q, k, v with this kernel size in every
            layer (``MultiHeadAttention(qkv_conv=)``; RCMHA: 3 with ``encoding="rcmha"``).
        qk_norm: ``"rms"``: every layer RMS-normalises its queries and keys per head before
            the encoding (``MultiHeadAttention(qk_norm=)``; TRA's model); None: off. No
            parameters: the state dict is the same either way.
        init: how the model's own layers start (``INIT_SCHEMES``):

            * ``"fan-in"`` (default): PyTorch's fan-in init of every linear layer (weights
              and biases uniform in ``+-1/sqrt(fan_in)``) and the token embedding
              ``N(0, 2 / dim)`` (He), as x-transformers' ``TransformerWrapper`` starts; a tied
              head is scaled, ``logits = norm(x) @ E^T * dim ** -0.5``.
            * ``"gpt2"``: GPT-2's init (weights ``N(0, 0.02)``, zero biases, residual output
              projections ``N(0, 0.02 / sqrt(2 depth))``), logits ``norm(x) @ E^T`` when
              tied. The default before ``"fan-in"``: ``init="gpt2", tie_embedding=True``
              builds that model.

            At x-transformers' configuration (dim 128, depth 4, batch 32, lr 1e-3, 1000
            steps) the default reaches the peer's perplexity at its own defaults, where GPT-2's
            init with a tied head is 6-8% behind; the fan-in init with a *tied* head trains
            markedly slower than either (docs/benchmarks.md, "Model quality vs
            x-transformers").

            Either way an encoding's own modules get what they always got: ``N(0, 0.02)``
            for its linear and embedding layers unless it keeps its own init
            (``Encoding.keeps_own_init`` / ``own_init_modules``). The state dict keys do
            not depend on ``init``.
        tie_embedding: False (default): an output layer of its own, ``head =
            nn.Linear(dim, vocab_size, bias=False)`` (state dict key ``head.weight``), logits
            ``head(norm(x))`` unscaled, initialised by ``init`` like the other linear layers:
            PyTorch's fan-in init for ``"fan-in"`` (x-transformers' ``LinearNoBias`` head, its
            default ``tie_embedding=False``), ``N(0, 0.02)`` for ``"gpt2"`` (GPT-2's untied
            ``lm_head`` in transformers' ``GPT2LMHeadModel._init_weights``). The head is
            built last, so every other weight gets the same random draws as the tied model.
            True: the output layer is the token embedding, logits ``norm(x) @ E^T`` (times
            ``dim ** -0.5`` with ``init="fan-in"``); no ``head.weight`` in the state dict.

    ``forward(tokens (B, L), pos=None, cache=None, inputs=None, mask_mod=None) -> logits
    (B, L, vocab)``. ``mask_mod`` restricts attention beyond causal (``relpos.attention``;
    e.g. packed documents: ``relpos.schedules.anchor_mask_mod(doc_ids)``).
    Absolute encodings (``adds_to_input``) are added to the token embeddings; the rest act in
    attention. An encoding that does both (BiPE-RoPE: ``adds_to_input`` and ``has_rotary``)
    gets input positions for ``embed`` and attention positions for its attention part: with
    ``pos=None`` from ``encoding.positions_from_tokens(tokens, state)`` (continued from the
    cached prefix when decoding with a ``KVCache``), else ``pos=(input_pos, attention_pos)``.
    Such an encoding is one module (its input table exists once), so every layer uses it
    whatever ``share_encoding`` says. ``inputs`` (per-call encoding inputs such as a graph's
    adjacency) reach every layer's attention.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        encoding: str = "rope",
        *,
        encoding_options: dict[str, Any] | None = None,
        share_encoding: bool = True,
        num_kv_heads: int | None = None,
        mlp_ratio: float = 4.0,
        backend: str = "auto",
        feature_map: str | FeatureMap | None = None,
        feature_map_options: dict[str, Any] | None = None,
        qkv_conv: int | None = None,
        qk_norm: str | None = None,
        init: str = "fan-in",
        tie_embedding: bool = False,
    ) -> None:
        super().__init__()
        if init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {', '.join(INIT_SCHEMES)}, got {init!r}")
        if not isinstance(tie_embedding, bool):
            raise TypeError(f"tie_embedding must be a bool, got {tie_embedding!r}")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.vocab_size, self.dim, self.depth = vocab_size, dim, depth
        head_dim = dim // num_heads
        options = dict(encoding_options or {})
        first = build_encoding(encoding, num_heads, head_dim, options)
        assert first is not None
        self.encoding_name = encoding
        self.input_encoding: Encoding | None = first if first.adds_to_input else None
        in_attention = first.has_rotary or first.has_bias or first.needs_probabilities
        attn_encoding = first if in_attention or not first.adds_to_input else None
        #: the encoding acts on the input and in attention (BiPE): two position sets
        self.two_position_sets = first.adds_to_input and attn_encoding is not None

        def layer_encoding(index: int) -> Encoding | None:
            if attn_encoding is None:
                return None
            if share_encoding or index == 0 or self.two_position_sets:
                return attn_encoding
            return build_encoding(encoding, num_heads, head_dim, options)

        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            Block(
                dim,
                MultiHeadAttention(
                    dim,
                    num_heads,
                    layer_encoding(i),
                    num_kv_heads=num_kv_heads,
                    backend=backend,
                    feature_map=_layer_feature_map(feature_map, i),
                    feature_map_options=feature_map_options,
                    qkv_conv=qkv_conv,
                    qk_norm=qk_norm,
                ),
                mlp_ratio,
            )
            for i in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.init = init
        self.tie_embedding = tie_embedding
        #: multiplies the tied head's logits (``init="fan-in"``: ``dim ** -0.5``)
        self.logit_scale = dim**-0.5 if init == "fan-in" and tie_embedding else 1.0
        #: the untied output layer (None: logits from the token embedding)
        self.head: nn.Linear | None = None
        self._initialise(depth)
        if not tie_embedding:  # built and drawn last: the rest as in the tied model
            self.head = nn.Linear(dim, vocab_size, bias=False)  # fan-in init
            if init == "gpt2":
                nn.init.normal_(self.head.weight, std=0.02)

    def _initialise(self, depth: int) -> None:
        """The ``init`` scheme on the model's own layers; GPT-2's ``N(0, 0.02)`` (zero biases)
        on the linear and embedding layers of encodings, except those an encoding keeps as
        it initialised them (``Encoding.keeps_own_init`` / ``own_init_modules``)."""
        own_init, in_encoding = set(), set()
        for enc in self.modules():
            if isinstance(enc, Encoding):
                own_init.update(id(sub) for sub in enc.modules_keeping_init())
                in_encoding.update(id(sub) for sub in enc.modules())

        def initialise(module: nn.Module) -> None:
            if id(module) in own_init or not isinstance(module, (nn.Linear, nn.Embedding)):
                return
            if self.init == "gpt2" or id(module) in in_encoding:
                nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif module is self.embed:
                nn.init.kaiming_normal_(module.weight)  # N(0, 2 / dim): fan-in = dim
            # the model's own linear layers keep the fan-in init nn.Linear gave them

        # ``apply`` visits a shared encoding once per layer: the same random draws as before
        self.apply(initialise)
        if self.init == "gpt2":
            for name, p in self.named_parameters():
                if name.endswith("out_proj.weight") or name.endswith("fc_out.weight"):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * depth))

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """``nn.Module.load_state_dict``, with a head mismatch named: a state dict without
        ``head.weight`` is from a tied-head model (``tie_embedding=True``, also every model
        saved before the untied head became the default, with ``init="gpt2"``), one with it
        from an untied model."""
        if strict:
            has_head = "head.weight" in state_dict
            if has_head != (self.head is not None):
                saved = "an untied head ('head.weight')" if has_head else "no 'head.weight'"
                want = "False" if has_head else "True"
                raise ValueError(
                    f"state_dict: holds {saved} but this model has tie_embedding="
                    f"{self.tie_embedding}; build TransformerLM(..., tie_embedding={want})"
                    + (
                        ""
                        if has_head
                        else " (with init='gpt2' for models saved before "
                        "the untied head became the default)"
                    )
                    + " to load it"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding: one ``MultiHeadAttention.new_cache()``
        per layer (``LayerCache``, or ``LinearState`` for recurrent kernelized attention)."""
        return KVCache([block.attn.new_cache() for block in self.blocks])

    def forward(
        self,
        tokens: Tensor,
        pos: Tensor | tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        inputs: dict[str, Tensor] | None = None,
        mask_mod: MaskMod | None = None,
    ) -> Tensor:
        check_token_ids(tokens, self.vocab_size)
        B, L = tokens.shape
        x = self.embed(tokens)
        input_pos, attn_pos = self._positions(tokens, pos, cache)
        if self.input_encoding is not None:
            if input_pos is None:
                start = cache.length if cache is not None else 0
                input_pos = torch.arange(start, start + L, device=tokens.device)[None]
                if not self.two_position_sets:
                    attn_pos = input_pos
            x = x + self.input_encoding.embed(input_pos, self.dim).to(x.dtype)
        for index, block in enumerate(self.blocks):
            layer_cache = cache.layers[index] if cache is not None else None
            x = block(x, attn_pos, layer_cache, inputs, mask_mod)
        x = self.norm(x)
        if self.head is not None:
            return self.head(x)
        if self.logit_scale != 1.0:
            x = x * self.logit_scale  # (B, L, dim): fewer products than scaling the logits
        return x @ self.embed.weight.t()

    def _positions(
        self, tokens: Tensor, pos: Tensor | tuple[Tensor, Tensor] | None, cache: KVCache | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(input_pos, attention_pos)`` of this call (None = the default ``arange``)."""
        if not self.two_position_sets:
            return pos, pos  # type: ignore[return-value]
        name = self.encoding_name
        if pos is not None:
            if not (isinstance(pos, (tuple, list)) and len(pos) == 2):
                raise ValueError(
                    f"pos: encoding {name!r} acts on the input and in attention; pass "
                    "pos=(input_pos, attention_pos) or pos=None to derive both from the tokens, "
                    f"got {type(pos).__name__}"
                )
            if cache is not None:
                cache.position_state = None  # explicit positions: nothing to continue from
            return pos[0], pos[1]
        assert self.input_encoding is not None
        state = None
        if cache is not None and cache.length > 0:
            state = cache.position_state
            if state is None:
                raise ValueError(
                    f"pos: the cached prefix was run with explicit positions, so encoding "
                    f"{name!r} cannot continue them from the tokens; pass "
                    "pos=(input_pos, attention_pos) for these tokens too"
                )
        derived = self.input_encoding.positions_from_tokens(tokens, state)
        if derived is None:
            return None, None
        if cache is not None:
            cache.position_state = derived.state
        return derived.input, derived.attention

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int) -> Tensor:
        """Greedy decoding with a KV cache: ``(B, L) -> (B, L + max_new_tokens)``."""
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        cache = self.new_cache()
        logits = self(tokens, cache=cache)
        out = [tokens]
        for _ in range(max_new_tokens):
            nxt = logits[:, -1:].argmax(-1)
            out.append(nxt)
            logits = self(nxt, cache=cache)
        return torch.cat(out, dim=1)
