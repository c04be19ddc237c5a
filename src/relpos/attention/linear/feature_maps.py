"""Feature maps of kernelized (linear) attention: ``exp(q . k * scale) ~ phi(q) . phi(k)``.

Kernelized attention replaces the softmax kernel by a dot product of non-negative features
``phi: R^d -> R^m`` (``(B, H, L, d) -> (B, H, L, m)``), so that sums over keys can be formed
once and shared by every query (``relpos.attention.linear.kernelized``):

* ``PositiveRandomFeatures`` — Performer's FAVOR+ (Choromanski et al. 2021, "Rethinking
  Attention with Performers"): ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)`` on
  ``x = q * sqrt(scale)`` (``scale = 1/sqrt(d)``: ``x = q / d^(1/4)``), with ``W (m, d)``
  Gaussian rows made orthogonal in blocks of ``d`` (QR of a Gaussian block, rows rescaled by
  the norms of Gaussian vectors so each row keeps its chi(d) length). Then
  ``E_W[phi(q) . phi(k)] = exp(q . k * scale)``. Seeded (``seed``) and redrawable
  (``redraw(generator)``, as Performer redraws during training). Luo et al. 2021 l2-normalise
  q and k before the features (``normalize=True``, the default here; the kernel
  is then ``exp(scale * cos(q, k))`` in expectation).
* ``EluPlusOne`` — ``elu(x) + 1`` (Katharopoulos et al. 2020), ``m = d``, deterministic.
* ``ReLUFeatures`` — ``relu(x)``, ``m = d``, deterministic (rows can have an all-zero
  denominator; the engine returns 0 there, as for a row that sees no key).
* ``LowRankFeatures`` — ``elu(W x) + 1`` with a learnt ``W (r, d)``: low-rank features
  (RoLA's branch).
* ``HeadwiseLowRankFeatures`` — the same with one ``W_h (r, d)`` per head (RoPeSLR's
  head-wise low-rank branch, ``relpos.nn.mixers.ropeslr``).

Stability (``docs/numerics.md`` spirit): the PRF exponent ``W x - |x|^2/2``
overflows for large ``|x|``. Any per-query constant cancels in the ratio of kernelized
attention, so queries subtract their own row maximum; a per-key constant does *not* cancel,
so keys subtract one maximum per (batch, head) and report it as ``log_offset``: the true key
features are ``phi * exp(log_offset)``. One call uses one offset for all its keys (it cancels
between numerator and denominator); the recurrent decoding state
(``relpos.attention.linear.state.LinearState``) rescales its sums when a later call brings a larger
one.
Features are computed in float32 for half inputs (float64 stays float64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...validation import check_bool, check_choice, check_int

__all__ = [
    "FeatureMap",
    "PositiveRandomFeatures",
    "EluPlusOne",
    "ReLUFeatures",
    "LowRankFeatures",
    "HeadwiseLowRankFeatures",
    "FEATURE_MAPS",
    "create_feature_map",
    "orthogonal_gaussian",
]


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class FeatureMap(nn.Module):
    """Base class: ``forward(x, role, scale) -> (phi, log_offset)``.

    ``x (B, H, L, d)``; ``role`` "q" or "k"; ``scale`` the call's logit scale. ``phi
    (B, H, L, m)`` is non-negative, in float32 (float64 for float64 input); ``log_offset`` is
    None or ``(B, H, 1, 1)``: the key features are ``phi * exp(log_offset)`` (see the module
    docstring). ``num_features`` is ``m``."""

    name: str = ""
    #: ``phi(q) . phi(k)`` estimates ``exp(q . k * scale)`` (random features) rather than
    #: being a kernel of its own
    estimates_softmax: bool = False

    def __init__(self, head_dim: int, num_features: int) -> None:
        super().__init__()
        self.head_dim = check_int(head_dim, "head_dim")
        self.num_features = check_int(num_features, "num_features")

    def _check(self, x: object, role: str) -> Tensor:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"feature map input {role} must be a floating-point tensor")
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has head_dim {x.shape[-1]} but feature map {self.name!r} was created "
                f"with head_dim={self.head_dim}"
            )
        check_choice(role, "role", ("q", "k"))
        return x

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_features={self.num_features}"


class EluPlusOne(FeatureMap):
    """``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020, "Transformers are RNNs"); ``m = d``.
    The logit scale is not used (the map defines its own kernel)."""

    name = "elu1"

    def __init__(self, head_dim: int) -> None:
        super().__init__(head_dim, head_dim)

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        x = self._check(x, role)
        return F.elu(x.to(_compute_dtype(x))) + 1.0, None


class ReLUFeatures(FeatureMap):
    """``phi(x) = relu(x)``; ``m = d``. The logit scale is not used."""

    name = "relu"

    def __init__(self, head_dim: int) -> None:
        super().__init__(head_dim, head_dim)

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        x = self._check(x, role)
        return F.relu(x.to(_compute_dtype(x))), None


def orthogonal_gaussian(
    num_features: int, head_dim: int, generator: torch.Generator | None = None
) -> Tensor:
    """``(m, d)`` Gaussian random features orthogonal in blocks of ``d`` rows (Performer's
    ORF): each block is the Q of a Gaussian ``(d, d)`` matrix's QR decomposition, its rows
    rescaled by the norms of independent Gaussian ``d``-vectors (so every row has the
    chi(d) length of a Gaussian row, which keeps the estimator unbiased). float64."""
    m, d = num_features, head_dim
    blocks = []
    for _ in range(math.ceil(m / d)):
        g = torch.randn(d, d, generator=generator, dtype=torch.float64)
        qm, r = torch.linalg.qr(g)
        qm = qm * torch.sign(torch.diagonal(r))[None, :]  # Haar-distributed Q
        blocks.append(qm.T)
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=1)
    return w * norms[:, None]


class PositiveRandomFeatures(FeatureMap):
    """Performer's positive random features (FAVOR+), see the module docstring.

    ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)``, ``x = q * sqrt(scale)`` (after an optional l2
    normalisation of q and k, ``normalize``). ``W (m, d)`` is a buffer (``projection``),
    orthogonal in blocks (``orthogonal=True``) or i.i.d. Gaussian, drawn from ``seed``;
    ``redraw(generator)`` draws a new one in place (training schedules call it)."""

    name = "prf"
    estimates_softmax = True

    def __init__(
        self,
        head_dim: int,
        num_features: int | None = None,
        *,
        normalize: bool = True,
        orthogonal: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(head_dim, head_dim if num_features is None else num_features)
        self.normalize = check_bool(normalize, "normalize")
        self.orthogonal = check_bool(orthogonal, "orthogonal")
        self.seed = check_int(seed, "seed", minimum=0)
        self.register_buffer("projection", self._draw(torch.Generator().manual_seed(self.seed)))

    def _draw(self, generator: torch.Generator | None) -> Tensor:
        if self.orthogonal:
            return orthogonal_gaussian(self.num_features, self.head_dim, generator)
        return torch.randn(
            self.num_features, self.head_dim, generator=generator, dtype=torch.float64
        )

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """Draw a new projection ``W`` in place (from ``generator``, else the global RNG)."""
        w = self._draw(generator)
        self.projection.copy_(w.to(self.projection.dtype))

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        x = self._check(x, role)
        x = x.to(_compute_dtype(x))
        if self.normalize:
            x = F.normalize(x, dim=-1)
        x = x * math.sqrt(scale)
        wx = x @ self.projection.to(device=x.device, dtype=x.dtype).T  # (B, H, L, m)
        exponent = wx - 0.5 * (x * x).sum(-1, keepdim=True)
        if role == "q":  # a per-query constant cancels in the ratio
            offset = exponent.detach().amax(-1, keepdim=True)
            return torch.exp(exponent - offset) / math.sqrt(self.num_features), None
        # keys: one offset per (batch, head), reported to the caller
        if exponent.shape[-2] == 0:
            log_offset = exponent.new_zeros(*exponent.shape[:2], 1, 1)
        else:
            log_offset = exponent.detach().amax(dim=(-2, -1), keepdim=True)
        return torch.exp(exponent - log_offset) / math.sqrt(self.num_features), log_offset

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, normalize={self.normalize}, "
            f"orthogonal={self.orthogonal}, seed={self.seed}"
        )


class LowRankFeatures(FeatureMap):
    """``phi(x) = elu(W x) + 1`` with a learnt ``W (r, d)`` (init ``N(0, 1/d)``, from ``seed``
    when given): a non-negative low-rank feature map (RoLA's branch, ``relpos.efficient.
    rola``); ``num_features = r``. The logit scale is not used. An instance only (not in
    ``FEATURE_MAPS``: a name would draw a new ``W`` per call)."""

    name = "lowrank"

    def __init__(self, head_dim: int, num_features: int, *, seed: int | None = None) -> None:
        super().__init__(head_dim, num_features)
        gen = (
            None
            if seed is None
            else torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
        )
        w = torch.randn(num_features, head_dim, generator=gen) / math.sqrt(head_dim)
        self.weight = nn.Parameter(w)

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        x = self._check(x, role)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(dtype) @ self.weight.to(dtype).T
        return torch.nn.functional.elu(x) + 1.0, None


class HeadwiseLowRankFeatures(FeatureMap):
    """``phi_h(x) = elu(W_h x) + 1`` with one learnt ``W_h (r, d)`` per head (``weight
    (H, r, d)``, init ``N(0, 1/d)``, from ``seed`` when given): a head-wise low-rank feature
    map (RoPeSLR's branch, ``relpos.nn.mixers.ropeslr``). Inputs must have ``num_heads``
    heads. The logit scale is not used. An instance only, like ``LowRankFeatures``."""

    name = "lowrank-headwise"

    def __init__(
        self, num_heads: int, head_dim: int, num_features: int, *, seed: int | None = None
    ) -> None:
        super().__init__(head_dim, num_features)
        self.num_heads = check_int(num_heads, "num_heads")
        gen = (
            None
            if seed is None
            else torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
        )
        w = torch.randn(self.num_heads, num_features, head_dim, generator=gen)
        self.weight = nn.Parameter(w / math.sqrt(head_dim))

    def forward(self, x: Tensor, role: str, scale: float) -> tuple[Tensor, Tensor | None]:
        x = self._check(x, role)
        if x.dim() != 4 or x.shape[1] != self.num_heads:
            raise ValueError(
                f"{role} must be (B, H, L, D) with H = num_heads = {self.num_heads}, got "
                f"{tuple(x.shape)}"
            )
        dtype = _compute_dtype(x)
        x = torch.einsum("bhld,hrd->bhlr", x.to(dtype), self.weight.to(dtype))
        return F.elu(x) + 1.0, None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, {super().extra_repr()}"


FEATURE_MAPS: dict[str, type[FeatureMap]] = {
    "prf": PositiveRandomFeatures,
    "elu1": EluPlusOne,
    "relu": ReLUFeatures,
}


def create_feature_map(
    feature_map: str | FeatureMap, head_dim: int, **options: object
) -> FeatureMap:
    """A ``FeatureMap`` by name (``"prf"``, ``"elu1"``, ``"relu"``) or the instance itself
    (checked against ``head_dim``). ``options`` go to the constructor (``num_features``,
    ``normalize``, ``orthogonal``, ``seed`` for ``"prf"``)."""
    if isinstance(feature_map, FeatureMap):
        if options:
            raise ValueError("feature map options apply to a feature map given by name only")
        if feature_map.head_dim != head_dim:
            raise ValueError(
                f"feature_map was created with head_dim={feature_map.head_dim}, but q has "
                f"head_dim {head_dim}"
            )
        return feature_map
    if not isinstance(feature_map, str):
        raise TypeError(
            f"feature_map must be one of {sorted(FEATURE_MAPS)} or a "
            f"relpos.attention.linear.feature_maps.FeatureMap, got {type(feature_map).__name__}"
        )
    check_choice(feature_map, "feature_map", tuple(FEATURE_MAPS))
    return FEATURE_MAPS[feature_map](head_dim, **options)  # type: ignore[arg-type]
