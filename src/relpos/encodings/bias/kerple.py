"""KERPLE: kernelized relative positional embeddings (Chi et al. 2022, "KERPLE: Kernelized
Relative Positional Embedding for Length Extrapolation", arXiv 2205.09921; chijames/KERPLE).

Two conditionally positive definite kernels turned into biases, per head ``h`` and
``n = |i - j|``:

* logarithmic: ``b_h(n) = -r1_h log(1 + r2_h n)``;
* power:       ``b_h(n) = -r1_h n^(p_h)``.

``r1, r2 > 0`` and ``p in (0, 2]`` are learned per head (``(H,)`` parameters); the official
code clamps them at ``1e-2`` after each step, relpos keeps them in range by
parametrisation. Official code read: chijames/KERPLE ``megatron/mpu/layers.py``
(``ParallelKerpleLog``, ``ParallelKerplePower``).
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...validation import check_finite_tensor, check_float, check_float_sequence
from ..options import Custom
from ..registry import register
from .distance import DistanceBias

__all__ = ["KerpleLog", "KerplePower"]

#: the official clamp: every KERPLE parameter stays >= 1e-2
EPS = 1e-2


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


def per_head_values(*, minimum: float, maximum: float | None = None):
    """Checker of an optional per-head initial value: a number, a sequence of numbers or a
    tensor, each finite and in ``[minimum, maximum]``. Returns a float tensor or None (the
    count against ``num_heads`` is checked by ``_per_head`` in the constructor)."""

    def check(value: object, name: str) -> Tensor | None:
        if value is None:
            return None
        if isinstance(value, Tensor):
            t = check_finite_tensor(value, name, floating=None).detach().to(torch.float32)
            values = [float(v) for v in t.reshape(-1)]
            for n, v in enumerate(values):
                check_float(v, f"{name}[{n}]", minimum=minimum, maximum=maximum)
            return t
        if isinstance(value, (int, float)):  # check_float refuses bools by name
            return torch.tensor(check_float(value, name, minimum=minimum, maximum=maximum))
        values = check_float_sequence(value, name, minimum=minimum)
        for n, v in enumerate(values):
            check_float(v, f"{name}[{n}]", minimum=minimum, maximum=maximum)
        return torch.tensor(values, dtype=torch.float32)

    return check


def _per_head_option(minimum: float, maximum: float | None = None, doc: str = "") -> Custom:
    invalid = [("1.0", TypeError), (True, TypeError), (float("nan"), ValueError)]
    invalid += [(float("inf"), ValueError), (-1.0, ValueError), (0.0, ValueError)]
    if maximum is not None:
        invalid.append((maximum + 1.0, ValueError))
    return Custom(
        checker=per_head_values(minimum=minimum, maximum=maximum),
        invalid=invalid,
        optional=True,
        doc=doc,
    )


def _per_head(values: Tensor | None, num_heads: int, name: str) -> Tensor | None:
    """A checked initial value (scalar or ``(H,)``) as ``(H,)`` float32, or None."""
    if values is None:
        return None
    t = values.to(torch.float32)
    if t.dim() == 0:
        t = t.expand(num_heads).clone()
    if t.shape != (num_heads,):
        raise ValueError(
            f"{name} must be a number or {num_heads} per-head values, got {tuple(t.shape)}"
        )
    return t


class _Kerple(DistanceBias):
    """Shared parametrisation: per-head ``r > eps`` as ``eps + softplus(raw)``."""

    eps = EPS
    paper = "Chi et al. 2022 (KERPLE)"

    def _positive(self, init: Tensor) -> nn.Parameter:
        return nn.Parameter(_inverse_softplus((init - self.eps).clamp(min=1e-6)))

    @property
    def r1(self) -> Tensor:
        """``(H,)`` scale ``r1 = eps + softplus(raw_r1) > eps``."""
        return self.eps + F.softplus(self.raw_r1)

    @staticmethod
    def _abs_float(distance: Tensor, like: Tensor) -> Tensor:
        return distance.abs().to(like.dtype)


@register("kerple-log")
class KerpleLog(_Kerple):
    """KERPLE, logarithmic variant (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE).

    ``b_h(n) = -r1_h * log(1 + r2_h * n)`` with ``n = |i - j|``, per-head learned ``r1, r2 > 0``.
    Official init: ``r1 ~ 2 U(0,1)``, ``r2 ~ U(0,1)``; the official code clamps at 1e-2 each
    step, relpos keeps the constraint by parametrisation ``r = 1e-2 + softplus(raw)``, so an
    initial ``r1`` / ``r2`` (a number or ``H`` values) must be finite and ``>= 1e-2``.
    Causal LMs mask j > i; the ``|i - j|`` form is the bidirectional extension.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        r1: Annotated[
            float | list[float] | None,
            _per_head_option(EPS, doc="initial r1: a number or H values >= 1e-2"),
        ] = None,
        r2: Annotated[
            float | list[float] | None,
            _per_head_option(EPS, doc="initial r2: a number or H values >= 1e-2"),
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        r1_init = _per_head(r1, num_heads, "r1")
        r2_init = _per_head(r2, num_heads, "r2")
        if r1_init is None:
            r1_init = torch.rand(num_heads) * 2
        if r2_init is None:
            r2_init = torch.rand(num_heads)
        self.raw_r1 = self._positive(r1_init)
        self.raw_r2 = self._positive(r2_init)

    @property
    def r2(self) -> Tensor:
        return self.eps + F.softplus(self.raw_r2)

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        r1, r2 = self.r1, self.r2
        n = self._abs_float(distance, r1)
        return -r1[h] * torch.log1p(r2[h] * n)


@register("kerple-power")
class KerplePower(_Kerple):
    """KERPLE, power variant (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE).

    ``b_h(n) = -r1_h * n^(p_h)`` with ``n = |i - j|``, ``r1 > 0`` (``1e-2 + softplus``) and the
    exponent kept in the official range ``[1e-2, 2]`` as ``p = 1e-2 + (2 - 1e-2) sigmoid(raw)``
    (a floor, so a saturated sigmoid cannot freeze the exponent at 0). Official init:
    ``r1 ~ U(0,1)``, ``p ~ 2 U(0,1)``. Initial values (a number or ``H`` values) must lie in
    those ranges: ``r1 >= 1e-2``, ``1e-2 <= power <= 2``.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        r1: Annotated[
            float | list[float] | None,
            _per_head_option(EPS, doc="initial r1: a number or H values >= 1e-2"),
        ] = None,
        power: Annotated[
            float | list[float] | None,
            _per_head_option(EPS, 2.0, doc="initial exponent: a number or H values"),
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        r1_init = _per_head(r1, num_heads, "r1")
        p_init = _per_head(power, num_heads, "power")
        if r1_init is None:
            r1_init = torch.rand(num_heads)
        if p_init is None:
            p_init = torch.rand(num_heads) * 2
        self.raw_r1 = self._positive(r1_init)
        frac = ((p_init - self.eps) / (2 - self.eps)).clamp(1e-6, 1 - 1e-6)
        self.raw_power = nn.Parameter(torch.log(frac) - torch.log1p(-frac))

    @property
    def power(self) -> Tensor:
        """Exponent in ``[1e-2, 2]`` (the official clamp range), as ``eps + (2 - eps) sigmoid``."""
        return self.eps + (2 - self.eps) * torch.sigmoid(self.raw_power)

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        r1, p = self.r1, self.power
        n = self._abs_float(distance, r1)
        # n = 0 gives 0; clamp so pow's gradient w.r.t. p (n^p log n) stays finite there.
        powered = torch.pow(n.clamp(min=1.0), p[h])
        return torch.where(n == 0, torch.zeros_like(powered), -r1[h] * powered)
