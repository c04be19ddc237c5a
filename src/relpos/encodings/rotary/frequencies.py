"""RoPE with a changed frequency set: LeRoPE (learned scale), HoPE and p-RoPE (masked).

Each is RoPE (``rotary.rope.RoPE``, Su et al. 2021) with the frequencies of its options
(``base``, ``partial_rotary_factor``, an HF ``scaling`` dict: YaRN, Llama 3, dynamic NTK ...)
changed in one way:

* ``lerope``: a learned per-frequency scale, applied at call time (``angle_frequencies``);
* ``hope``: only the high frequencies rotate, the other pairs are identity ("NoPE") pairs;
* ``p-rope``: the fraction ``p`` of highest frequencies (Barbero et al., HF ``proportional``).

HoPE and p-RoPE share ``FrequencyMaskRoPE``, which masks the frequencies the scaling produced
(also those a length-dependent scaling recomputes per call).

Sources: p-RoPE follows HF ``modeling_rope_utils.py`` (``proportional``, as Gemma 4 uses it);
LeRoPE and HoPE's cutoff are reconstructions from their abstracts (no code was found).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import rope_frequencies
from ..options import Float, Int, Refused
from ..registry import register
from .rope import RoPE

__all__ = ["LeRoPE", "FrequencyMaskRoPE", "HoPE", "PRoPE", "high_frequency_pairs"]


@register("lerope")
class LeRoPE(RoPE):
    """LeRoPE ("Learned RoPE"): RoPE with a learned scale per frequency (abstract only, no code).

    ``theta_i = exp(u_i) * theta0_i`` with ``u`` learned, ``(r/2,)``, initialised to 0
    (RoPE at init) and ``theta0`` RoPE's frequencies after the options (``base``,
    ``partial_rotary_factor``, ``scaling``: the learned scale multiplies the scaled
    frequencies, the attention factor applies). Assumed, since the abstract states only "a
    scalar per frequency": a multiplicative scale in log space (relpos's choice;
    it keeps gradients well-scaled and the frequencies positive), shared by all heads of a
    layer. Any ``theta`` keeps the score relative. Angles as for RoPE; the gradient of
    ``u_i`` grows with the position.

    Args: ``**rope_options`` as for ``rope`` (default layout ``half``).
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``; parameter ``log_scale (r/2,)``.
    """

    paper = "LeRoPE (learned per-frequency scale)"

    def __init__(self, num_heads: int, head_dim: int, **rope_options) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.log_scale = nn.Parameter(torch.zeros(self.inv_freq.numel()))

    @property
    def learned_inv_freq(self) -> Tensor:
        """The frequencies in use: ``inv_freq * exp(log_scale)``, ``(r/2,)``."""
        return self.angle_frequencies(self.inv_freq)

    def angle_frequencies(self, inv_freq: Tensor) -> Tensor:
        return inv_freq * self.log_scale.exp()


class FrequencyMaskRoPE(RoPE):
    """RoPE whose frequencies beyond the first ``rotated_pairs`` are 0: those pairs are the
    identity, position-independent channels. The mask applies to the frequencies every
    option produces (``frequencies``), so a scaling composes with it. Subclasses choose
    ``rotated_pairs`` and call ``keep_pairs``."""

    #: the number of rotating pairs (None while the constructor builds the unmasked set)
    rotated_pairs: int | None = None

    def frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        inv_freq, factor = super().frequencies(seq_len)
        if self.rotated_pairs is None:
            return inv_freq, factor
        keep = torch.arange(inv_freq.numel()) < self.rotated_pairs
        return torch.where(keep, inv_freq, torch.zeros_like(inv_freq)), factor

    def method_frequencies(self) -> Tensor:
        """The frequencies of the options without the scaling dict (``base``, or a
        ``rope_theta`` inside the dict, and ``partial_rotary_factor``): ``(r/2,)``."""
        base = (self.scaling or {}).get("rope_theta", self.base)
        return rope_frequencies(
            self.head_dim, base, partial_rotary_factor=self.partial_rotary_factor
        )[0]

    def keep_pairs(self, rotated_pairs: int) -> None:
        """Keep the first ``rotated_pairs`` frequencies of the stored set, zero the rest."""
        self.rotated_pairs = rotated_pairs
        self.inv_freq = self.frequencies(None)[0]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rotated_pairs={self.rotated_pairs}"


def high_frequency_pairs(inv_freq: Tensor, train_length: float) -> int:
    """HoPE's cutoff: the number of pairs whose wavelength ``2 pi / theta_i`` fits in
    ``train_length`` (the frequencies are sorted from high to low)."""
    return int((2 * math.pi / inv_freq.double() <= train_length).sum())


@register("hope")
class HoPE(FrequencyMaskRoPE):
    """HoPE, high-frequency rotary PE (Chen et al. 2024, arXiv 2410.21216).

    ``R(m) = diag(R(m theta_0), ..., R(m theta_{r-1}), I, ..., I)``: the ``r`` highest
    frequencies rotate (RoPE's ``theta_i``, after the options); the other pairs are identity,
    position-independent channels. With no low frequency the score has no long-term decay:
    every remaining component oscillates with a period that fits in the training length, the
    removed ones are constant in the distance.

    Reconstruction: the paper's cutoff rule was not found in a primary source. Two cutoffs are
    offered: ``rotated_pairs = r`` explicitly, or ``train_length = L``, keeping the pairs with
    wavelength ``2 pi / theta_i <= L`` (the default, ``L = 4096``). The cutoff is taken on
    the unscaled frequencies (``base``, ``partial_rotary_factor``): a ``scaling`` dict is a
    context extension of the trained method, so it rescales the kept pairs and keeps the
    same ones (HoPE with linear scaling ``s`` at ``p`` is HoPE at ``p / s``). With an
    explicit ``r`` and default options this equals ``p-rope`` with ``p = 2 r / head_dim``.

    Args:
        train_length: keep the pairs whose wavelength fits in it (default 4096).
        rotated_pairs: keep exactly this many pairs instead (``0 .. r/2``).
        **rope_options: as for ``rope`` (default layout ``half``).
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Chen et al. 2024 (HoPE, high-frequency RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        train_length: Annotated[
            float | None, Float(above=0.0, optional=True, doc="keep wavelengths <= this")
        ] = None,
        rotated_pairs: Annotated[
            int | None, Int(minimum=0, optional=True, doc="keep exactly this many pairs")
        ] = None,
        **rope_options,
    ) -> None:
        if train_length is not None and rotated_pairs is not None:
            raise ValueError("give either train_length or rotated_pairs, not both")
        super().__init__(num_heads, head_dim, **rope_options)
        pairs = self.inv_freq.numel()
        if rotated_pairs is None:
            self.train_length: float | None = 4096.0 if train_length is None else train_length
            rotated_pairs = high_frequency_pairs(self.method_frequencies(), self.train_length)
        elif rotated_pairs > pairs:
            raise ValueError(
                f"rotated_pairs must be an int in [0, {pairs}] (the rotated pairs), "
                f"got {rotated_pairs!r}"
            )
        else:
            self.train_length = None
        self.keep_pairs(rotated_pairs)


@register("p-rope")
class PRoPE(FrequencyMaskRoPE):
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go!", arXiv 2410.06205;
    HF ``modeling_rope_utils.py``, ``proportional``).

    Keeps the fraction ``p`` of highest frequencies and sets the rest to 0 (identity
    "NoPE" pairs): ``r = int(p * head_dim // 2)``, ``theta_i = base^(-2i/head_dim)`` for
    ``i < r`` (exponent over **head_dim**, unlike partial rotary), else 0. With default
    options this is Hugging Face's ``"proportional"`` rope type (Gemma 4: ``p = 0.25``,
    ``base = 1e6`` on global layers), bit for bit; a ``scaling`` dict scales the
    frequencies before the mask.

    Args:
        p: in ``[0, 1]`` (default 0.25).
        **rope_options: as for ``rope`` (default layout ``half``), except
            ``partial_rotary_factor``: ``p`` is p-RoPE's (HF's proportional) rotary factor.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Barbero et al. 2024 (p-RoPE)"
    option_overrides = {
        "partial_rotary_factor": Refused(
            "p-rope keeps the fraction p of frequencies over the whole head (HF's "
            "proportional partial_rotary_factor): give p",
            default=1.0,
        )
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        p: Annotated[
            float, Float(minimum=0.0, maximum=1.0, doc="fraction of frequencies kept")
        ] = 0.25,
        **rope_options,
    ) -> None:
        self.p = p
        super().__init__(num_heads, head_dim, **rope_options)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for p-rope, got {head_dim}")
        self.keep_pairs(int(p * head_dim // 2))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p:g}"
