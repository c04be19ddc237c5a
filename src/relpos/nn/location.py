"""Location and bi-relative cross-attention for seq2seq length generalisation.

Ray Chowdhury & Caragea 2023 ("Monotonic Location Attention for Length Generalization",
ICML 2023, arXiv 2305.20019; official code JRC1995/MonotonicLocationAttention,
``models/attentions/Multiheaded_Monotonic_Attention.py``, ``models/layers/GRUEncoderDecoder.py``,
``models/utils.py``, read). A module, not an ``Encoding``: the location attention's weights
are not a softmax of logits (they mix a Gaussian over key locations with the content
softmax).

* ``reverse_align``: the encoder states reversed within each sequence's length
  (``H^rev[j] = H[len - 1 - j]`` for ``j < len``, 0 beyond: flip, then shift by the padding).
* ``DirectionMix``: ``H_mix = g H + (1 - g) H^rev`` with one gate per sequence from the
  decoder's initial state, ``g = sigmoid(5 (w . h_0 + b))`` (the Bi-Relative model's keys; its
  values are ``leaky_relu(Linear(H_mix))`` and its logits relative, e.g. ``transformer-xl``
  with ``q_pos = t``, ``k_pos = 0 .. S-1``).
* ``LocationAttention`` (the MonoAttn family, one step of the decoder): key locations
  ``j Delta`` with ``Delta = 1 / max(1, len - 1)``; ``q^pos = Linear(h_t)``;
  width ``sigma_t = (relu(q^pos . w_sigma) + 0.27) / len``; step ``act(q^pos . w_rho)``;
  centre ``mu_t = step Delta + mu_{t-1}`` (``mu_0 = 0``); location weights
  ``p_loc ∝ exp(-(j Delta - mu_t)^2 / (2 sigma_t^2)) mask`` normalised with ``+1e-20``;
  with content logits, ``p = m p_loc + (1 - m) softmax(content)``, ``m = sigmoid(w . h_t + b)``;
  the carried centre is ``sum_j p_j j Delta`` (``p_loc``'s in the "PR" variants,
  ``carry="location"``).

Steps ``act``: ``onestep`` ``sigmoid(5 rho)``; ``monotonic`` ``s relu(rho) + (1 - s)
sigmoid(5 rho)`` with ``s = sigmoid(b)``, ``b`` initialised to 20; ``relu``; ``softstair``
``floor(rho) + sigmoid(20 (rho - floor(rho) - 1/2))``.

Shapes: encoder states ``(B, S, D)``, lengths ``(B,)``, decoder state ``(B, D_dec)``, weights
``(B, S)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..validation import check_int

__all__ = ["reverse_align", "DirectionMix", "LocationAttention", "STEPS"]

STEPS = ("onestep", "monotonic", "relu", "softstair")


def _check_lengths(states: Tensor, lengths: Tensor) -> Tensor:
    if not isinstance(states, Tensor) or states.dim() != 3:
        raise ValueError("states must be a tensor (B, S, D)")
    if not isinstance(lengths, Tensor) or lengths.shape != states.shape[:1]:
        raise ValueError(f"lengths must be a tensor of shape ({states.shape[0]},)")
    if lengths.dtype.is_floating_point or bool(((lengths < 1) | (lengths > states.shape[1])).any()):
        raise ValueError(f"lengths must be integers in 1 .. S = {states.shape[1]}")
    return lengths.long()


def reverse_align(states: Tensor, lengths: Tensor) -> Tensor:
    """``H^rev (B, S, D)``: ``H^rev[b, j] = H[b, len_b - 1 - j]`` for ``j < len_b``, else 0."""
    lengths = _check_lengths(states, lengths)
    S = states.shape[1]
    j = torch.arange(S, device=states.device)
    source = (lengths[:, None] - 1 - j).clamp(min=0)  # (B, S)
    out = states.gather(1, source[..., None].expand_as(states))
    return out.masked_fill((j >= lengths[:, None])[..., None], 0.0)


class DirectionMix(nn.Module):
    """``g H + (1 - g) H^rev`` with ``g = sigmoid(5 (w . h_0 + b))`` per sequence.

    Args: ``state_dim`` (the decoder state ``h_0``'s size). ``forward(states (B, S, D),
    lengths (B,), h0 (B, state_dim)) -> (B, S, D)``."""

    def __init__(self, state_dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(check_int(state_dim, "state_dim"), 1)

    def forward(self, states: Tensor, lengths: Tensor, h0: Tensor) -> Tensor:
        g = torch.sigmoid(5.0 * self.gate(h0))[:, :, None]  # (B, 1, 1)
        return g * states + (1.0 - g) * reverse_align(states, lengths)


def step_size(rho: Tensor, kind: str, bias: Tensor | None = None) -> Tensor:
    """The step activations of the MonoAttn family (see the module)."""
    if kind == "onestep":
        return torch.sigmoid(5.0 * rho)
    if kind == "monotonic":
        assert bias is not None
        s = torch.sigmoid(bias)
        return s * F.relu(rho) + (1.0 - s) * torch.sigmoid(5.0 * rho)
    if kind == "relu":
        return F.relu(rho)
    if kind == "softstair":
        floor = torch.floor(rho)
        return floor + torch.sigmoid(20.0 * (rho - floor - 0.5))
    raise ValueError(f"step must be one of {', '.join(STEPS)}, got {kind!r}")


class LocationAttention(nn.Module):
    """One decoder step of monotonic location attention (see the module).

    Args:
        state_dim: size of the decoder state ``h_t``.
        pos_dim: size of ``q^pos = Linear(h_t)`` (with bias).
        step: ``onestep``, ``monotonic``, ``relu`` or ``softstair``.
        mix: mix the location weights with the content softmax through the gate ``m``.
        carry: ``"mixed"`` carries ``sum_j p_j j Delta`` (the mixed weights), ``"location"``
            ``p_loc``'s (the "PR" variants).

    ``forward(h (B, state_dim), lengths (B,), mu (B,) or None, content (B, S) or None,
    size=S) -> (p (B, S), mu (B,))``: ``content`` are the content logits (needed when
    ``mix``), ``mu`` the previous centre (None: 0).
    """

    def __init__(
        self,
        state_dim: int,
        pos_dim: int = 64,
        *,
        step: str = "onestep",
        mix: bool = True,
        carry: str = "mixed",
    ) -> None:
        super().__init__()
        if step not in STEPS:
            raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
        if carry not in ("mixed", "location"):
            raise ValueError(f"carry must be 'mixed' or 'location', got {carry!r}")
        self.step, self.mix, self.carry = step, mix, carry
        self.query = nn.Linear(check_int(state_dim, "state_dim"), check_int(pos_dim, "pos_dim"))
        self.w_sigma = nn.Parameter(torch.randn(pos_dim) / pos_dim**0.5)
        self.w_rho = nn.Parameter(torch.randn(pos_dim) / pos_dim**0.5)
        self.step_bias = nn.Parameter(torch.tensor(20.0)) if step == "monotonic" else None
        self.gate = nn.Linear(state_dim, 1) if mix else None

    def forward(
        self,
        h: Tensor,
        lengths: Tensor,
        mu: Tensor | None = None,
        content: Tensor | None = None,
        *,
        size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        if h.dim() != 2:
            raise ValueError(f"h must have shape (B, state_dim), got {tuple(h.shape)}")
        S = size if size is not None else (content.shape[-1] if content is not None else None)
        if S is None:
            raise ValueError("pass content logits (B, S) or size=S")
        if self.mix and content is None:
            raise ValueError("mix=True needs the content logits: content (B, S)")
        B = h.shape[0]
        lengths = _check_lengths(h.new_zeros(B, S, 1), lengths)
        n = lengths.to(h.dtype)
        delta = 1.0 / (n - 1).clamp(min=1.0)  # (B,)
        qpos = self.query(h)
        sigma = (F.relu(qpos @ self.w_sigma) + 0.27) / n
        step = step_size(qpos @ self.w_rho, self.step, self.step_bias)
        mu = step * delta + (0.0 if mu is None else mu)
        j = torch.arange(S, device=h.device, dtype=h.dtype)
        where = j * delta[:, None]  # (B, S) key locations
        valid = j < lengths[:, None]
        weight = torch.exp(-((where - mu[:, None]) ** 2) / (2.0 * sigma[:, None] ** 2)) * valid
        p_loc = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        p = p_loc
        if self.mix:
            assert self.gate is not None and content is not None
            m = torch.sigmoid(self.gate(h))  # (B, 1)
            c = torch.softmax(content.masked_fill(~valid, -torch.inf), dim=-1)
            p = m * p_loc + (1.0 - m) * c
        carried = p if self.carry == "mixed" else p_loc
        return p, (carried * where).sum(-1)
