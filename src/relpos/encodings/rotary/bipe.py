"""BiPE-RoPE, bilevel positional encoding (He et al. 2024, "Two Stones Hit One Bird: Bilevel
Positional Encoding for Better Length Extrapolation", arXiv 2401.16421; reference code
zhenyuhe00/BiPE ``my_modeling_llama_bipe_rope.py``).

Text is cut into segments that end at separator tokens (``.`` and newline); each token gets an
intra-segment offset, read by a learned absolute table added to the token embeddings, and a
segment index, used as the RoPE position. ``relpos.schedules.bilevel_positions`` computes the
two position sets; this module makes the pair one registered encoding (``"bipe-rope"``) that
``relpos.nn.TransformerLM`` drives from token ids, with KV-cache decoding.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Annotated, Any, NamedTuple

import torch
from torch import Tensor

from ...schedules.bilevel import bilevel_positions
from ..absolute import LearnedAbsolute
from ..options import Custom, Int
from ..registry import register
from .rope import RoPE


class TokenPositions(NamedTuple):
    """Positions an encoding derives from token ids (``BiPERoPE.positions_from_tokens``).

    ``input``: positions for ``embed`` (BiPE: intra-segment offsets, unclipped), ``(B, L)``;
    ``attention``: positions for attention (BiPE: segment indices), ``(B, L)``;
    ``state``: what the next call needs to continue the sequence (BiPE: ``(B, 2)`` = the next
    token's intra offset and segment index), kept by ``relpos.nn`` in the ``KVCache``.
    """

    input: Tensor
    attention: Tensor
    state: Tensor


def check_separators(separators: object, name: str = "separators") -> tuple[int, ...]:
    """``separators`` as a tuple of non-negative int token ids (any iterable of integer-like
    ids: ints, 0-d integer tensors). ``TypeError`` for a wrong type (a string, a float or
    bool id), ``ValueError`` for a wrong value (empty, a negative id); both name ``name``."""
    form = "a non-empty list of non-negative int token ids, e.g. [13, 869]"
    if isinstance(separators, (str, bytes)) or not isinstance(separators, Iterable):
        raise TypeError(f"{name} must be {form}, got {separators!r}")
    ids = []
    for s in separators:
        try:
            if isinstance(s, bool):
                raise TypeError
            value = operator.index(s)
        except TypeError:
            raise TypeError(f"{name} must be {form}, got the element {s!r}") from None
        if value < 0:
            raise ValueError(f"{name} must be {form}, got the element {value}")
        ids.append(value)
    if not ids:
        raise ValueError(f"{name} must be {form}, got an empty collection")
    return tuple(ids)


SEPARATORS = Custom(
    checker=check_separators,
    invalid=[(".", TypeError), ([1.5], TypeError), ([], ValueError), ([-1], ValueError)],
    optional=True,
    doc="token ids that end a segment",
)


@register("bipe-rope")
class BiPERoPE(RoPE):
    """BiPE-RoPE (He et al. 2024, arXiv 2401.16421; official code zhenyuhe00/BiPE).

    A token ``t`` in segment ``s(t)`` (the number of separators strictly before it; a separator
    belongs to the segment it ends) at offset ``o(t)`` inside that segment gets

        input:     x_t = E_tok[id_t] + E_intra[min(o(t), max_intra - 1)]
        attention: logit(i, j) = < R(s(i)) q_i , R(s(j)) k_j > * scale
                               = < q_i , R(s(j) - s(i)) k_j > * scale

    i.e. plain RoPE (``relpos`` ``rope``, all of its options) on segment indices, plus a
    learned absolute table ``E_intra (max_intra, dim)`` (``relpos`` ``learned``, initialised
    ``N(0, 0.02^2)``) on intra offsets. The logits depend on segment differences only; tokens
    of one segment see each other unrotated.

    Args:
        separators: token ids that end a segment (BiPE's Llama tokenizer: ``[869, 13]`` for
            ``.`` and newline). Only needed to derive positions from token ids
            (``positions_from_tokens``, what ``TransformerLM`` does when ``pos`` is None).
        max_intra: rows of the intra table (BiPE's ``train_scale``, 1024); offsets are clipped
            at ``max_intra - 1``.
        dim: width of the intra table (default ``num_heads * head_dim``, the model width).
        **rope_options: ``base``, ``layout``, ``partial_rotary_factor``, ``scaling``,
            ``max_position_embeddings`` of ``rope`` (declared there; every scaling composes:
            it rescales the RoPE on segment indices).

    Shapes: ``rotate(x (B, H, L, D), pos (B|1, L))`` with segment indices;
    ``embed(pos (B|1, L) intra offsets, dim) -> (B|1, L, dim)``;
    ``positions_from_tokens(tokens (B, L), state (B|1, 2) | None) -> TokenPositions``.

    In a model: ``TransformerLM(vocab, encoding="bipe-rope", encoding_options={"separators":
    [...]})`` derives both position sets from the tokens (``pos=None``) or takes
    ``pos=(intra, segment)``. ``relpos.attention`` with this encoding is RoPE on the positions
    it is given (``relative``: the attention part; the intra table is absolute within a
    segment).

    Pitfall: the official code (``my_modeling_llama_bipe_rope.py``) builds the table as
    ``nn.Embedding(1024, d, padding_idx=pad_token_id)`` with ``pad_token_id = -1``, so row 1023 is a
    frozen zero and tokens whose offset is clipped get no intra embedding. relpos does not reproduce
    this: row ``max_intra - 1`` is a trained row like the others. The reference asserts there is no
    KV cache; relpos decodes incrementally (the next token's offset and segment continue from the
    cached prefix, ``TokenPositions.state``), equal to the full forward.
    """

    paper = "He et al. 2024 (BiPE)"
    adds_to_input = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        separators: Annotated[Iterable[int] | None, SEPARATORS] = None,
        max_intra: Annotated[int, Int(minimum=1, doc="rows of the intra-segment table")] = 1024,
        dim: Annotated[
            int | None, Int(minimum=1, optional=True, doc="width of the intra-segment table")
        ] = None,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.separators = separators
        self.max_intra = max_intra
        self.intra = LearnedAbsolute(num_heads, head_dim, max_positions=max_intra, dim=dim)

    @classmethod
    def example_options(cls) -> dict[str, Any]:
        """Separators among the test vocabulary and a table of 8 rows, so short tests see
        several segments and clipped offsets (the conformance tests draw tokens from 50 ids)."""
        return {"separators": (3, 7, 11, 19, 42), "max_intra": 8}

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        """``E_intra[min(pos, max_intra - 1)]`` for intra offsets ``pos (B|1, L)``."""
        if not isinstance(pos, Tensor):
            raise TypeError(
                f"pos must be a torch.Tensor of intra offsets, got {type(pos).__name__}"
            )
        if pos.dtype == torch.bool or pos.is_floating_point() or pos.is_complex():
            raise TypeError(f"pos must be an integer tensor of intra offsets, got {pos.dtype}")
        if pos.numel() and int(pos.min()) < 0:
            raise ValueError(f"pos (intra offsets) must be >= 0, got {int(pos.min())}")
        return self.intra.embed(pos.clamp(max=self.max_intra - 1), dim)

    def positions_from_tokens(self, tokens: Tensor, state: Tensor | None = None) -> TokenPositions:
        """Intra offsets and segment indices of ``tokens (B, L)`` (e.g. ids ``[5, 6, 869,
        7, 8, 9, 13, 10]`` with separators ``(869, 13)`` -> intra ``[0, 1, 2, 0, 1, 2, 3, 0]``,
        segment ``[0, 0, 0, 1, 1, 1, 1, 2]``).

        ``state (B|1, 2)``: the ``TokenPositions.state`` of the tokens before these (a KV
        cache's prefix): the offset and segment of this call's first token, so decoding in
        pieces gives the positions of the whole sequence.
        """
        if self.separators is None:
            raise ValueError(
                f"encoding {self.name!r} derives its positions from token ids and needs the "
                "option separators (the ids that end a segment, e.g. those of '.' and '\\n'): "
                "encoding_options={'separators': [...]}, or pass pos=(intra, segment)"
            )
        intra, segment = bilevel_positions(tokens, self.separators)
        if intra.dim() == 1:
            intra, segment = intra[None], segment[None]
            tokens = tokens[None]
        if state is not None:
            if not isinstance(state, Tensor) or state.dim() != 2 or state.shape[-1] != 2:
                raise ValueError(
                    "state must be the (B, 2) TokenPositions.state of a previous call, got "
                    f"{tuple(state.shape) if isinstance(state, Tensor) else type(state).__name__}"
                )
            start_intra, start_segment = state[:, :1], state[:, 1:]
            intra = torch.where(segment == 0, intra + start_intra, intra)
            segment = segment + start_segment
        if tokens.shape[-1] == 0:
            next_state = state if state is not None else intra.new_zeros(intra.shape[0], 2)
        else:
            seps = torch.tensor(self.separators, dtype=tokens.dtype, device=tokens.device)
            ended = torch.isin(tokens[:, -1], seps)
            next_intra = torch.where(ended, torch.zeros_like(intra[:, -1]), intra[:, -1] + 1)
            next_state = torch.stack((next_intra, segment[:, -1] + ended.long()), dim=-1)
        return TokenPositions(intra, segment, next_state)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, separators={self.separators}, max_intra={self.max_intra}, "
            f"dim={self.intra.dim}"
        )


__all__ = ["BiPERoPE", "TokenPositions"]
