"""``LlamaLM``: the Llama decoder (RMSNorm, SwiGLU, grouped-query attention) on relpos modules.

Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models" (arXiv
2302.13971). One block is

    h   = x + Attn(RMSNorm(x))            attention: relpos ``MultiHeadAttention`` (GQA, KV cache)
    out = h + W_down(silu(W_gate g) * W_up g),   g = RMSNorm(h)

with bias-free projections, ``RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)`` computed in float32
(as Hugging Face ``LlamaRMSNorm``), and a final RMSNorm before the (optionally tied) LM head.
``LlamaConfig.query_temperature_beta`` adds Llama-4's attention temperature as Ministral 3
applies it (``QueryTemperatureAttention``).
The positional encoding is *pluggable*: one encoding module is shared by every layer and
``set_encoding(name, **options)`` swaps it (e.g. RoPE with a context-extension ``scaling``)
without touching the weights. Pretrained weights come from ``relpos.interop.load_gguf``.

Memory: nothing of size ``L x L`` is built for rotary encodings (``auto`` sends them to SDPA's
flash kernels), and the LM head runs only where it is asked to: ``forward(..., last=n)`` gives
the logits of the last ``n`` positions and ``token_nll`` scores targets chunk by chunk, so a
16K-token prompt never holds ``16K x vocab`` logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encodings.base import Encoding
from ..encodings.options import Refused
from ..encodings.registry import create, encoding_class
from ..positions import normalize_positions
from ..validation import check_float, check_int, check_token_ids
from .attention import MultiHeadAttention
from .cache import KVCache, LayerCache

# Logit rows per LM-head call in ``token_nll`` (1024 x 49152 float32 = 192 MiB for SmolLM2).
HEAD_CHUNK = 1024


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a Llama-family model (the GGUF ``llama.*`` metadata keys in brackets).

    Attributes:
        vocab_size: tokens (``llama.vocab_size``).
        dim: model width (``embedding_length``).
        depth: decoder blocks (``block_count``).
        num_heads / num_kv_heads: query and key/value heads (``attention.head_count[_kv]``).
        hidden_dim: SwiGLU width (``feed_forward_length``).
        rms_norm_eps: RMSNorm epsilon (``attention.layer_norm_rms_epsilon``).
        rope_base: ``rope_theta`` (``rope.freq_base``).
        rope_layout: RoPE pair layout of the q/k projection rows: ``"interleaved"`` for rows
            as llama.cpp stores them, ``"half"`` for Hugging Face's row order.
        max_position_embeddings: the trained context (``context_length``); context-extension
            scalings read it as their reference length.
        tie_embeddings: the LM head is the token embedding (no ``output.weight``).
        bos_token_id / eos_token_id: special tokens of the tokenizer, if known.
        name: the model's name, if known.
        query_temperature_beta / query_temperature_length: Llama-4's attention temperature as
            Ministral 3 applies it (``beta``: ``rope_parameters["llama_4_scaling_beta"]``,
            ``length``: ``rope_parameters["original_max_position_embeddings"]``): every
            layer's queries are multiplied by ``1 + beta ln(1 + floor(p / length))`` at their
            position ``p`` (``query_temperature``); both None (default): no temperature.
    """

    vocab_size: int
    dim: int
    depth: int
    num_heads: int
    num_kv_heads: int
    hidden_dim: int
    rms_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_layout: str = "half"
    max_position_embeddings: int = 2048
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    name: str = ""
    query_temperature_beta: float | None = None
    query_temperature_length: int | None = None

    def __post_init__(self) -> None:
        for key in ("vocab_size", "dim", "depth", "num_heads", "num_kv_heads", "hidden_dim"):
            check_int(getattr(self, key), f"LlamaConfig.{key}")
        beta, length = self.query_temperature_beta, self.query_temperature_length
        if (beta is None) != (length is None):
            raise ValueError(
                "LlamaConfig.query_temperature_beta and query_temperature_length go together "
                f"(the temperature 1 + beta ln(1 + floor(p / length))), got beta={beta!r}, "
                f"length={length!r}"
            )
        if beta is not None:
            check_float(beta, "LlamaConfig.query_temperature_beta", minimum=0.0)
            check_int(length, "LlamaConfig.query_temperature_length")
        if self.dim % self.num_heads:
            raise ValueError(
                f"LlamaConfig.dim ({self.dim}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                f"({self.num_heads})"
            )
        if self.rope_layout not in ("half", "interleaved"):
            raise ValueError(
                f"LlamaConfig.rope_layout must be 'half' or 'interleaved', got {self.rope_layout!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): ``w * x / sqrt(mean(x^2) + eps)``.

    Computed in float32 and cast back, as Hugging Face ``LlamaRMSNorm``. ``x (..., dim)``.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps:g}"


class SwiGLU(nn.Module):
    """Gated feed-forward (Shazeer 2020): ``W_down(silu(W_gate x) * W_up x)``, no biases."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def query_temperature(pos: Tensor, beta: float, length: int) -> Tensor:
    """Llama-4's attention temperature ``1 + beta ln(1 + floor(p / length))`` of positions
    ``pos`` (float64, ``pos``'s shape; ``floor`` exact for integer positions).

    As Ministral 3 computes it (transformers ``models/ministral3/modeling_ministral3.py``:
    ``get_llama_4_attn_scale`` of the layer's ``position_ids``, ``beta =
    rope_parameters["llama_4_scaling_beta"]``, ``length =
    rope_parameters["original_max_position_embeddings"]``). Llama 4 itself differs: its
    ``Llama4TextAttention`` (``models/llama4/modeling_llama4.py``) scales only its NoPE
    layers, by ``1 + attn_scale ln(1 + floor((p + 1) / floor_scale))`` with ``p`` counted
    from the cache length rather than read from ``position_ids``.
    """
    if bool((pos < 0).any()):
        raise ValueError(
            "the query temperature 1 + beta ln(1 + floor(p / length)) needs positions p >= 0, "
            f"got {pos.min().item()}"
        )
    if pos.is_floating_point():
        steps = torch.floor(pos.double() / length)
    else:
        steps = torch.div(pos, length, rounding_mode="floor").double()
    return 1.0 + beta * torch.log1p(steps)


class QueryTemperatureAttention(MultiHeadAttention):
    """``MultiHeadAttention`` whose projected queries are multiplied by the attention
    temperature of their positions (``query_temperature``; Ministral 3's
    ``Ministral3Attention``) before the encoding acts.

    Ministral 3 multiplies its queries after RoPE; a rotation is linear, so the product is the
    same (to float rounding). The positions are the call's ``pos`` (1-D per token), or the
    default ``cache.length ..`` that ``relpos.attention`` gives the queries.
    """

    def __init__(self, *args: Any, beta: float, length: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.temperature_beta = float(beta)
        self.temperature_length = int(length)
        self._query_scale: Tensor | None = None  # set for the duration of one forward

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        pos: Tensor | None = None,
        cache: Any = None,
        causal: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"x must have shape (B, L, {self.dim}), got {tuple(x.shape)}")
        B, L, _ = x.shape
        if pos is not None and pos.dim() == 3 and pos.shape[-1] != 1:
            raise ValueError(
                "the query temperature reads one position per token; pos has shape "
                f"{tuple(pos.shape)} (multi-axis positions)"
            )
        offset = 0 if cache is None else int(cache.length)  # relpos.attention's default
        positions = normalize_positions(
            pos, name="pos", batch=B, length=L, dims=1, continuous=True, device=x.device,
            offset=offset,
        )  # fmt: skip
        scale = query_temperature(positions, self.temperature_beta, self.temperature_length)
        self._query_scale = scale[:, None, :, None]
        try:
            return super().forward(x, pos, cache, causal, **kwargs)
        finally:
            self._query_scale = None

    def project(self, x: Tensor, cache: Any = None) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(x, cache)
        if self._query_scale is not None:
            q = q * self._query_scale.to(q.dtype)
        return q, k, v

    def extra_repr(self) -> str:
        return (
            f"query temperature 1 + {self.temperature_beta:g} ln(1 + floor(p / "
            f"{self.temperature_length}))"
        )


class LlamaBlock(nn.Module):
    """Pre-norm Llama block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, config: LlamaConfig, encoding: Encoding | None, backend: str) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.rms_norm_eps)
        temperature: dict[str, Any] = {}
        attention_class = MultiHeadAttention
        if config.query_temperature_beta is not None:
            attention_class = QueryTemperatureAttention
            temperature = {
                "beta": config.query_temperature_beta,
                "length": config.query_temperature_length,
            }
        self.attn = attention_class(
            config.dim,
            config.num_heads,
            encoding,
            num_kv_heads=config.num_kv_heads,
            backend=backend,
            **temperature,
        )
        self.mlp_norm = RMSNorm(config.dim, config.rms_norm_eps)
        self.mlp = SwiGLU(config.dim, config.hidden_dim)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None,
        cache: LayerCache | None,
        inputs: dict[str, Tensor] | None = None,
    ) -> Tensor:
        x = x + self.attn(self.attn_norm(x), pos=pos, cache=cache, inputs=inputs)
        return x + self.mlp(self.mlp_norm(x))


def chunked_token_nll(head: nn.Module, hidden: Tensor, targets: Tensor, chunk: int) -> Tensor:
    """Per-token negative log-likelihood ``(B, T)`` of ``targets (B, T)`` under
    ``head(hidden (B, T, dim))``, ``chunk`` positions at a time (never a ``T x vocab``
    tensor), in float32."""
    out = []
    for a in range(0, hidden.shape[1], chunk):
        logits = head(hidden[:, a : a + chunk]).float()
        nll = F.cross_entropy(
            logits.flatten(0, 1), targets[:, a : a + chunk].flatten(), reduction="none"
        )
        out.append(nll.view(targets.shape[0], -1))
    return torch.cat(out, dim=1)


class LlamaLM(nn.Module):
    """Llama-family decoder-only LM whose positional encoding is any relpos encoding.

    Args:
        config: the sizes (``LlamaConfig``).
        encoding: registry name (default ``"rope"``) or a ``relpos.Encoding`` instance.
        encoding_options: options for ``relpos.create``; the model's ``rope_base`` (as
            ``base``), ``rope_layout`` (as ``layout``) and ``max_position_embeddings`` are
            added for every one of those options the encoding declares (and does not refuse)
            and the options omit.
        backend: attention backend (``"auto"``: SDPA for rotary encodings).

    ``forward(tokens (B, L), pos=None, cache=None, *, last=None) -> logits (B, L|last, vocab)``.
    Weights start randomly initialised (normal, std 0.02); see ``relpos.interop.load_gguf``.
    """

    def __init__(
        self,
        config: LlamaConfig,
        encoding: str | Encoding = "rope",
        *,
        encoding_options: dict[str, Any] | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.encoding_name = ""
        self.encoding_options: dict[str, Any] = {}
        enc = self._build_encoding(encoding, encoding_options or {})
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(LlamaBlock(config, enc, backend) for _ in range(config.depth))
        self.norm = RMSNorm(config.dim, config.rms_norm_eps)
        self.lm_head = None
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        # the model initialises the layers it builds; the encoding (built by relpos.create,
        # or passed in already trained) keeps the initialisation it has (FIRE's MLP)
        encoding_modules = {id(m) for m in enc.modules()}
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and id(module) not in encoding_modules:
                nn.init.normal_(module.weight, std=0.02)

    # ------------------------------------------------------------------ the encoding
    def encoding_defaults(self, name: str) -> dict[str, Any]:
        """The model-level options ``set_encoding`` adds for encoding ``name``: ``base``,
        ``layout`` and ``max_position_embeddings``, each only if the encoding declares it
        (``option_specs``) and does not refuse it (``Refused``: LieRE has no base)."""
        specs = encoding_class(name).option_specs
        model = {
            "base": self.config.rope_base,
            "layout": self.config.rope_layout,
            "max_position_embeddings": self.config.max_position_embeddings,
        }
        return {k: v for k, v in model.items() if k in specs and not isinstance(specs[k], Refused)}

    def _build_encoding(self, encoding: str | Encoding, options: dict[str, Any]) -> Encoding:
        if isinstance(encoding, Encoding):
            if options:
                raise ValueError("encoding_options are only used with an encoding name")
            enc, name = encoding, encoding.name
        elif isinstance(encoding, str):
            full = {**self.encoding_defaults(encoding), **options}
            enc = create(
                encoding,
                num_heads=self.config.num_heads,
                head_dim=self.config.head_dim,
                **full,
            )
            name = encoding
        else:
            raise TypeError(
                f"encoding must be a registry name or a relpos.Encoding, got "
                f"{type(encoding).__name__}"
            )
        if enc.num_heads != self.config.num_heads or enc.head_dim != self.config.head_dim:
            raise ValueError(
                f"encoding {name!r} was created for {enc.num_heads} heads of {enc.head_dim} "
                f"channels; the model has {self.config.num_heads} heads of {self.config.head_dim}"
            )
        if enc.adds_to_input:
            raise ValueError(
                f"encoding {name!r} adds to the token embeddings; LlamaLM takes encodings that "
                "act inside attention (rotary, bias, nope)"
            )
        self.encoding_name = name
        self.encoding_options = dict(options)
        return enc

    @property
    def encoding(self) -> Encoding | None:
        """The encoding shared by every layer."""
        return self.blocks[0].attn.encoding if len(self.blocks) else None

    def set_encoding(self, encoding: str | Encoding, **options: Any) -> Encoding:
        """Replace the shared positional encoding of every layer; the weights stay.

        ``set_encoding("rope", scaling={"rope_type": "yarn", "factor": 2.0})`` gives YaRN x2
        with the model's base, layout and trained length. Returns the new encoding (on the
        model's device).
        """
        enc = self._build_encoding(encoding, options)
        device = self.embed.weight.device
        enc = enc.to(device)
        for block in self.blocks:
            block.attn.encoding = enc
        return enc

    # ------------------------------------------------------------------ forward
    def new_cache(self) -> KVCache:
        """An empty KV cache for incremental decoding."""
        return KVCache.empty(self.config.depth)

    def _check_tokens(self, tokens: Tensor) -> None:
        check_token_ids(tokens, self.embed.num_embeddings)

    def hidden(
        self,
        tokens: Tensor,
        pos: Tensor | None = None,
        cache: KVCache | None = None,
        inputs: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Final-norm hidden states ``(B, L, dim)`` (the LM head's input). ``inputs``: the
        encoding's per-call tensors (PINE's ``segments``), passed to every layer."""
        self._check_tokens(tokens)
        if cache is not None and len(cache.layers) != len(self.blocks):
            raise ValueError(
                f"cache has {len(cache.layers)} layers, the model {len(self.blocks)}; "
                "use model.new_cache()"
            )
        x = self.embed(tokens)
        for index, block in enumerate(self.blocks):
            x = block(x, pos, cache.layers[index] if cache is not None else None, inputs)
        return self.norm(x)

    def head(self, h: Tensor) -> Tensor:
        """Logits ``(..., vocab)`` of hidden states ``(..., dim)``."""
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight)

    def forward(
        self,
        tokens: Tensor,
        pos: Tensor | None = None,
        cache: KVCache | None = None,
        *,
        last: int | None = None,
        inputs: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Logits ``(B, L, vocab)``, or of the last ``last`` positions only."""
        h = self.hidden(tokens, pos, cache, inputs)
        if last is not None:
            check_int(last, "last")
            h = h[:, -last:]
        return self.head(h)

    @torch.no_grad()
    def token_nll(
        self,
        tokens: Tensor,
        *,
        start: int = 0,
        chunk: int = HEAD_CHUNK,
        inputs: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Negative log-likelihood (nats) of each next token: ``(B, L - 1 - start)``.

        Entry ``t`` is ``-log p(tokens[:, start + t + 1] | tokens[:, :start + t + 1])``. One
        forward pass; the LM head runs over at most ``chunk`` positions at a time.
        """
        self._check_tokens(tokens)
        L = tokens.shape[1]
        if L < 2:
            raise ValueError(f"tokens must hold at least 2 positions to score, got {L}")
        check_int(start, "start", minimum=0, maximum=L - 2)
        check_int(chunk, "chunk")
        h = self.hidden(tokens[:, :-1], inputs=inputs)[:, start:]
        return chunked_token_nll(self.head, h, tokens[:, start + 1 :], chunk)

    @torch.no_grad()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        stop: Any = None,
        inputs: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Greedy decoding with a KV cache: ``(B, L) -> (B, L + n)``, ``n <= max_new_tokens``.

        Only the last position's logits are computed at each step. Decoding stops early when
        every row has produced ``eos_token_id``, or when ``stop(new_tokens (B, n))`` is true.
        ``inputs`` (the encoding's per-call tensors) are passed unchanged to every step (PINE
        reads keys past its ``segments`` as the suffix).
        """
        self._check_tokens(tokens)
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        cache = self.new_cache()
        logits = self(tokens, cache=cache, last=1, inputs=inputs)
        new: list[Tensor] = []
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            new.append(nxt)
            if eos_token_id is not None:
                done |= nxt[:, 0] == eos_token_id
                if bool(done.all()):
                    break
            if stop is not None and stop(torch.cat(new, dim=1)):
                break
            if step + 1 < max_new_tokens:
                logits = self(nxt, cache=cache, last=1, inputs=inputs)
        return torch.cat([tokens, *new], dim=1)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"vocab={c.vocab_size}, dim={c.dim}, depth={c.depth}, heads={c.num_heads}/"
            f"{c.num_kv_heads}, encoding={self.encoding_name!r}"
        )


__all__ = [
    "LlamaConfig",
    "LlamaLM",
    "LlamaBlock",
    "QueryTemperatureAttention",
    "RMSNorm",
    "SwiGLU",
    "HEAD_CHUNK",
    "query_temperature",
]
