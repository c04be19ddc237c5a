"""ECHO's Nyquist-normalised band embedding for machine signals (``echo``).

Zhang et al. 2025, ECHO, a band-split foundation model for machine signals (official code
yucongzh/ECHO, ``models/ECHO/audioMAE_band_upgrade.py``, ``models/ECHO/utils.py``
``get_sincos_encoding_1d``, read).
Its "relative frequency positional embedding" is *relative to the sampling rate* (each band's
centre frequency over the Nyquist frequency), not a relative attention term: an absolute
embedding over two axes, added to the patch tokens.

* Bands (``band_centres``): a log-magnitude STFT with ``n_fft = int(0.025 sr)`` has
  ``F = n_fft // 2 + 1`` bins, cut into bands of 32 bins (the last one partial); band ``b``
  covering bins ``start .. end - 1`` has ``f_norm = 2 c / n_fft``, ``c = (start + end - 1) / 2``.
* Frequency code, interleaved: ``FPE[2m] = sin(25 f_norm 10000^(-2m/D))``,
  ``FPE[2m+1] = cos(.)`` (``freq_scale = 25``); added to every patch of the band and to the
  band's CLS token.
* Time code, concatenated (the MAE table): ``[sin(t w_m) | cos(t w_m)]``,
  ``w_m = 10000^(-2m/D)``, over the patch index ``t``; the CLS token gets zeros (the caller
  adds no time code to it).

``embed(pos (B|1, L, 2), dim) -> (B|1, L, dim)`` with ``pos[..., 0]`` the patch (time) index
and ``pos[..., 1]`` the band's ``f_norm``; ``dim`` even. ``pos (B|1, L)`` (patch indices
only, as ``relpos.nn.TransformerLM`` passes them) gives the time code alone. The encoding
acts on the input only (``dims = 1``: it adds no attention term). Pitfalls of the official code (not
reproduced): its time table has ``2000 / 16 + 1 = 126`` rows, so longer inputs are cut into
2000-frame segments; here the time code is analytic at any index. Equal frequencies in Hz at
different sampling rates get different codes (by design: the code is Nyquist-relative).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ..validation import check_float, check_int
from .base import Encoding
from .options import Float
from .registry import register

__all__ = ["EchoBandEmbedding", "band_centres"]


def band_centres(sample_rate: float, band_bins: int = 32) -> Tensor:
    """``f_norm (n_bands,)`` float64 of the 32-bin bands of ECHO's STFT at ``sample_rate``
    (``n_fft = int(0.025 sr)``, ``hop = int(0.01 sr)``). Example: 16 kHz gives 7 bands
    ``[0.0775, 0.2375, .., 0.98]``."""
    check_float(sample_rate, "sample_rate", above=0.0)
    check_int(band_bins, "band_bins")
    n_fft = int(0.025 * sample_rate)
    if n_fft < 2:
        raise ValueError(f"sample_rate must give n_fft = int(0.025 sr) >= 2, got {sample_rate}")
    bins = n_fft // 2 + 1
    start = torch.arange(0, bins, band_bins, dtype=torch.float64)
    end = torch.clamp(start + band_bins, max=bins)
    return (start + end - 1) / n_fft  # 2 c / n_fft with c = (start + end - 1) / 2


@register("echo")
class EchoBandEmbedding(Encoding):
    """ECHO's band embedding: MAE time code of the patch index plus the interleaved frequency
    code of the band's Nyquist-normalised centre (see the module docstring).

    Args:
        freq_scale: the frequency code's multiplier (25, the official ``freq_scale``).
        base: the wavelength base of both codes (10000).
    """

    family = "absolute"
    paper = "Zhang et al. 2025 (ECHO, machine-signal foundation model)"
    relative = False
    continuous = True
    adds_to_input = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        freq_scale: Annotated[
            float, Float(above=0.0, doc="multiplier of f_norm in the frequency code")
        ] = 25.0,
        base: Annotated[float, Float(above=1.0, doc="wavelength base of both codes")] = 10000.0,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.freq_scale, self.base = freq_scale, base

    def _omega(self, dim: int, device: torch.device) -> Tensor:
        return self.base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)

    def time_code(self, t: Tensor, dim: int) -> Tensor:
        """``[sin(t w) | cos(t w)] (..., dim)`` (concatenated, the MAE table)."""
        ang = t.to(torch.float64)[..., None] * self._omega(dim, t.device)
        return torch.cat([ang.sin(), ang.cos()], dim=-1)

    def frequency_code(self, f_norm: Tensor, dim: int) -> Tensor:
        """``FPE (..., dim)``: interleaved ``sin, cos`` of ``freq_scale f_norm w_m``."""
        ang = (
            self.freq_scale * f_norm.to(torch.float64)[..., None] * self._omega(dim, f_norm.device)
        )
        return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        check_int(dim, "dim")
        if dim % 2:
            raise ValueError(f"dim must be even (sin/cos pairs), got {dim}")
        if pos.dim() == 3 and pos.shape[-1] == 2:
            out = self.time_code(pos[..., 0], dim) + self.frequency_code(pos[..., 1], dim)
        elif pos.dim() == 2:  # patch indices only: the time code (e.g. a model over one band)
            out = self.time_code(pos, dim)
        else:
            raise ValueError(
                f"pos must be (B|1, L, 2) (patch index, f_norm) or (B|1, L) patch indices, got "
                f"{tuple(pos.shape)}"
            )
        dtype = pos.dtype if pos.is_floating_point() else torch.get_default_dtype()
        return out.to(dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, freq_scale={self.freq_scale:g}"
