"""FoPE, Fourier Position Embedding: each rotated pair's cos and sin are learned mixtures of
the cos and sin of every kept RoPE frequency.

Paper: "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization" (Hua et al., arXiv 2412.17739); official code
``TsinghuaC3I/Fourier-Position-Embedding`` (``olmo/model.py``, ``FourierEmbedding``). The
formula here is the one vLLM serves (``vllm/model_executor/layers/rotary_embedding/fope.py``,
``FourierRotaryEmbedding``, which ``get_rope`` builds for ``rope_type "default"`` with
``use_fope``): see ``FoPE``.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ..options import Bool, Choice, Float, Int, Refused
from ..registry import register
from .headwise import group_mean
from .rope import RoPE, rotate_pairs, same_positions

__all__ = ["FoPE", "kept_frequencies"]

#: the options FoPE takes itself (the RoPE options it keeps come through ``**rope_options``)
FOPE_KV_HEADS = Int(
    optional=True,
    doc="coefficient sets, one per key head (vLLM's num_key_value_heads); None: num_heads",
)
FOPE_NUM_INV_FREQ = Int(
    optional=True,
    doc="keep the first N frequencies (vLLM's num_inv_freq); None: clip at the trained length",
)
FOPE_SEPARATE_HEADS = Bool(doc="one coefficient set per key head (vLLM's fope_sep_head)")
FOPE_CLIPPED_PAIRS = Choice(
    ("constant-phase", "identity"),
    doc="clipped pairs: cos = sin = 1 (official code, vLLM 0.34.0) or cos = 1, sin = 0",
)
FOPE_INIT_FACTOR = Float(
    minimum=0.0, doc="gain of the Xavier-normal noise added to the identity coefficients"
)


def kept_frequencies(
    inv_freq: Tensor, num_inv_freq: int | None, max_position_embeddings: int | None
) -> Tensor:
    """The frequencies FoPE mixes, as vLLM's ``_compute_inv_freq`` selects them: the first
    ``num_inv_freq`` when given; else those above the floor ``2 pi / max_position_embeddings``
    (a frequency whose period exceeds the trained length is clipped to zero: its pair gets a
    position-independent phase); else all. ``ValueError`` naming the option when none is kept or
    ``num_inv_freq`` exceeds the count."""
    count = inv_freq.numel()
    if num_inv_freq is not None:
        if num_inv_freq > count:
            raise ValueError(
                f"num_inv_freq must be at most the {count} frequencies of the rotated "
                f"channels (rotary_dim / 2), got {num_inv_freq}"
            )
        return inv_freq[:num_inv_freq]
    if max_position_embeddings is None:
        return inv_freq
    kept = inv_freq[inv_freq > 2.0 * math.pi / max_position_embeddings]
    if kept.numel() == 0:
        raise ValueError(
            f"max_position_embeddings={max_position_embeddings} clips every frequency (all "
            f"periods exceed it): FoPE would not rotate; pass a longer trained length or "
            f"num_inv_freq"
        )
    return kept


@register("fope")
class FoPE(RoPE):
    """FoPE, Fourier Position Embedding (Hua et al., arXiv 2412.17739), as vLLM computes it.

    Paper: "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
    Generalization"; official code ``TsinghuaC3I/Fourier-Position-Embedding``
    (``olmo/model.py``, ``FourierEmbedding``); the formula below is vLLM's
    ``FourierRotaryEmbedding`` (``vllm/model_executor/layers/rotary_embedding/fope.py``).

    Frequencies ``w_j = base^(-2j/r)`` (``r = int(D * partial_rotary_factor)``) are kept as
    ``kept_frequencies`` says: the first ``num_inv_freq``, or those with ``w_j > 2 pi /
    max_position_embeddings`` (the paper's clip of under-trained low frequencies to zero),
    ``F`` of them. Per coefficient set ``s`` (a key head) and position ``p``:

        C_s(p)_d = sum_j cos(p w_j) cos_coef[s, j, d]
        S_s(p)_d = sum_j sin(p w_j) sin_coef[s, j, d]        d = 0 .. F-1

    and, for the clipped pairs ``d = F .. D/2 - 1`` (frequency zero), ``C_d = S_d = 1`` with
    ``clipped_pairs="constant-phase"`` (the default: the official code and vLLM 0.34.0 pad
    both with 1; the paper's authors describe it as zero frequency at a 45-degree phase, scaled
    by sqrt 2, so every channel carries signal) or ``C_d = 1, S_d = 0`` with
    ``"identity"`` (the pairs pass through; vLLM's main branch pads sin with 0 since a later
    fix). Pair ``(a, b) = (x_d, x_{d + D/2})`` of every head using set ``s`` becomes
    ``(a C_d - b S_d, b C_d + a S_d)``; queries and keys alike. The pairs always split the whole
    head in half (vLLM pads cos / sin to ``head_size / 2``), also when ``r < D``. With
    ``cos_coef = sin_coef = I`` and every pair kept (``F = D/2``) this is RoPE; otherwise
    ``C^2 + S^2 != 1`` and ``q . k`` depends on both positions, not on ``n - m`` alone
    (``relative = False``).

    Grouped-query attention: ``kv_heads`` sets (``H / kv_heads`` query heads per set, the
    contiguous groups of ``relpos.attention``): query heads ``g G .. g G + G - 1`` and key
    head ``g`` use set ``g``, as in vLLM, where the per-KV-head cos / sin serve the query
    heads of their group. ``rotate_qk`` fits the sets to the call's key heads: equal counts
    are used as they are, keys expanded to more heads repeat them, and fewer key heads than
    sets average each group's sets (``group_mean``, as ``harope``). ``rotate`` alone fits
    them to the head count of the one tensor.

    Learned: ``cos_coef``, ``sin_coef (S, F, F)`` with ``S = kv_heads`` (``1`` with
    ``separate_heads=False``: every head shares set 0, as vLLM's main branch reads
    ``fope_sep_head=False``; vLLM 0.34.0 raises on it). Initialised as the official code's
    ``eye_xavier_norm``: ``I + N(0, (init_factor / sqrt(F))^2)`` per set (an ``F x F``
    Xavier-normal draw with gain ``init_factor``; vLLM's ``fope_init_factor`` default is 0.1).
    A vLLM / HF checkpoint's ``rotary_emb.cos_coef`` and ``rotary_emb.sin_coef``
    (``(num_key_value_heads, F, F)``) load into them as they are (``[:1]`` of them with
    ``separate_heads=False``).

    Options: ``kv_heads`` (default ``num_heads``; must divide it), ``num_inv_freq``,
    ``separate_heads`` (True), ``clipped_pairs`` (``"constant-phase"``), ``init_factor``
    (0.1); ``base``, ``partial_rotary_factor`` and ``max_position_embeddings`` (the clip
    floor; None: no clip) as for ``rope``. ``layout`` is ``half`` (vLLM applies
    ``rotate_neox`` whatever ``is_neox_style`` says) and ``scaling`` is refused (vLLM builds
    FoPE for ``rope_type "default"`` only).

    Precision: angles are float64 products ``p w_j``; the mixtures are formed in float32
    (float64 for float64 activations or coefficients) and the rotation runs in the activation
    dtype (vLLM casts its float32 cache to the model dtype the same way).

    Shapes: ``x (B, H|Hkv, L, D)`` with ``D`` even, ``pos (B|1, L)``.
    """

    paper = "Hua et al. 2024 (FoPE, Fourier Position Embedding)"
    relative = False  # learned mixtures: C^2 + S^2 != 1 and the phases of several frequencies
    option_overrides = {
        "layout": Refused(
            "fope mixes half-split pairs (x_d, x_{d+D/2}), as vLLM's fope.py (rotate_neox)",
            default="half",
        ),
        "scaling": Refused(
            "vLLM builds FoPE for rope_type 'default' only (get_rope): its coefficients mix "
            "the plain frequencies",
            default=None,
        ),
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        kv_heads: Annotated[int | None, FOPE_KV_HEADS] = None,
        num_inv_freq: Annotated[int | None, FOPE_NUM_INV_FREQ] = None,
        separate_heads: Annotated[bool, FOPE_SEPARATE_HEADS] = True,
        clipped_pairs: Annotated[str, FOPE_CLIPPED_PAIRS] = "constant-phase",
        init_factor: Annotated[float, FOPE_INIT_FACTOR] = 0.1,
        **rope_options,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for fope (half-split pairs), got {head_dim}")
        kv_heads = num_heads if kv_heads is None else kv_heads
        if num_heads % kv_heads:
            raise ValueError(
                f"kv_heads must divide num_heads={num_heads} (query heads per key head), "
                f"got {kv_heads}"
            )
        self.kv_heads = kv_heads
        self.num_inv_freq = num_inv_freq
        self.separate_heads = separate_heads
        self.clipped_pairs = clipped_pairs
        self.init_factor = init_factor
        self.inv_freq = kept_frequencies(self.inv_freq, num_inv_freq, self.max_position_embeddings)
        count = self.inv_freq.numel()
        sets = kv_heads if separate_heads else 1
        noise = init_factor / math.sqrt(count)
        eye = torch.eye(count)
        self.cos_coef = nn.Parameter(eye + noise * torch.randn(sets, count, count))
        self.sin_coef = nn.Parameter(eye + noise * torch.randn(sets, count, count))

    @classmethod
    def example_options(cls) -> dict:
        # clip the lowest frequencies at test lengths (head_dim 16: 3 of 8 kept)
        return {"max_position_embeddings": 64}

    # ----------------------------------------------------------------- coefficient sets
    def sets_for(self, heads: int, name: str = "k") -> tuple[Tensor, Tensor]:
        """``(cos_coef, sin_coef)`` fitted to a tensor of ``heads`` heads, ``(heads, F, F)``
        each: shared (``separate_heads=False``), as they are, repeated over the heads of each
        set, or averaged over the sets of each head; ``ValueError`` naming ``name`` when
        ``heads`` is neither a divisor nor a multiple of ``kv_heads``."""
        cos_coef, sin_coef = self.cos_coef, self.sin_coef
        sets = cos_coef.shape[0]
        if sets == heads:
            return cos_coef, sin_coef
        if sets == 1 or heads % sets == 0:
            repeat = heads // sets
            return (
                cos_coef.repeat_interleave(repeat, dim=0),
                sin_coef.repeat_interleave(repeat, dim=0),
            )
        if sets % heads == 0:
            return group_mean(cos_coef, heads), group_mean(sin_coef, heads)
        raise ValueError(
            f"{name} has {heads} heads, which is neither a divisor nor a multiple of the "
            f"encoding's kv_heads={sets} coefficient sets"
        )

    def fourier_cos_sin(
        self, pos: Tensor, cos_coef: Tensor, sin_coef: Tensor, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """``C, S`` of shape ``(B|1, S, L, D/2)`` in ``dtype`` for positions ``(B|1, L)`` and
        coefficient sets ``(S, F, F)``: the mixtures, padded with ``C = 1`` and ``S = 1``
        (``clipped_pairs="constant-phase"``) or ``S = 0`` (``"identity"``)."""
        angles = pos.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
        basis_cos = angles.cos().to(dtype)[:, None]  # (B|1, 1, L, F)
        basis_sin = angles.sin().to(dtype)[:, None]
        cos = basis_cos @ cos_coef.to(dtype)[None]  # (B|1, S, L, F)
        sin = basis_sin @ sin_coef.to(dtype)[None]
        pad = self.head_dim // 2 - cos.shape[-1]
        if pad:
            cos = torch.cat((cos, cos.new_ones(*cos.shape[:-1], pad)), dim=-1)
            clipped_sin = 1.0 if self.clipped_pairs == "constant-phase" else 0.0
            sin = torch.cat((sin, sin.new_full((*sin.shape[:-1], pad), clipped_sin)), dim=-1)
        return cos, sin

    def _mix_dtype(self, *xs: Tensor) -> torch.dtype:
        wide = any(x.dtype == torch.float64 for x in (*xs, self.cos_coef))
        return torch.float64 if wide else torch.float32

    # ----------------------------------------------------------------- rotation
    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        cos, sin = self.fourier_cos_sin(pos, *self.sets_for(x.shape[1], role), self._mix_dtype(x))
        return rotate_pairs(x, cos, sin, "half")

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        heads, kv = q.shape[1], k.shape[1]
        if heads % kv:
            raise ValueError(f"k has {kv} heads, which does not divide the {heads} query heads")
        dtype = self._mix_dtype(q, k)
        key_sets = self.sets_for(kv, "k")
        k_cos, k_sin = self.fourier_cos_sin(k_pos, *key_sets, dtype)
        if same_positions(q_pos, k_pos):
            q_cos, q_sin = k_cos, k_sin
        else:
            q_cos, q_sin = self.fourier_cos_sin(q_pos, *key_sets, dtype)
        if heads != kv:  # each key head's set serves its group of query heads
            q_cos = q_cos.repeat_interleave(heads // kv, dim=1)
            q_sin = q_sin.repeat_interleave(heads // kv, dim=1)
        return rotate_pairs(q, q_cos, q_sin, "half"), rotate_pairs(k, k_cos, k_sin, "half")

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, kv_heads={self.kv_heads}, "
            f"frequencies={self.inv_freq.numel()}, separate_heads={self.separate_heads}, "
            f"clipped_pairs={self.clipped_pairs!r}"
        )
