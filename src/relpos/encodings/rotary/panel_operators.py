"""OPRO: orthogonal panel-relative operators composed onto a frozen RoPE (S. Lee, M. Lee, Shin,
Kim, Choi, Choo 2026, "OPRO: Orthogonal Panel-Relative Operators for Panel-Aware In-Context
Image Generation", arXiv 2603.27637; no code was found, and only the abstract and the
introduction of the paper could be read, so the operator's form below is a reconstruction).

What the abstract states: learnable, panel-specific orthogonal operators are composed onto
the backbone's frozen positional encoding; they are isometric (norms and the geometry of the
features are kept) and same-panel invariant (pairs of tokens in one panel score as the frozen
model did); the method works across positional-encoding regimes.

Reconstruction (the assumptions):

* the operator acts after the frozen rotation, per token: ``x -> O_{p(t)} R(pos_t) x`` for q
  and k (values untouched), so ``logit_ij = q^T R_i^T O_{p(i)}^T O_{p(j)} R_j k``: same panel
  ``O^T O = I`` gives the frozen logit exactly (same-panel invariance), any orthogonal ``O``
  keeps norms (isometry);
* ``O_p`` is taken in the **commuting form**: a rotation of each of the frozen encoding's
  channel pairs by a learned phase ``phi[p, h, c]`` (per panel, head and pair). Among
  orthogonal maps these are the ones that commute with every RoPE rotation (distinct
  frequencies), and only they keep the cross-panel logits relative in position:
  ``logit_ij = q^T R(theta (n - m) + phi[p(j)] - phi[p(i)]) k`` (a general ``SO(d)`` operator
  after RoPE would make cross-panel pairs depend on absolute positions). So the method is the
  frozen rotation followed by a per-panel phase on the same pairs, and it runs on every
  backend, fused SDPA included;
* ``phi = 0`` at initialisation (``O = I``): step 0 equals the frozen model. RoPE has no
  parameters, so "frozen" holds by construction; only ``phases`` learn.

Inputs: ``panel (B, Lk)`` int64 panel ids of the call's key tokens in ``[0, panels)``;
``query_panel (B, Lq)`` optionally (default: the last ``Lq`` key panels, as relpos's default
query positions are the last ``Lq`` key positions). With a KV cache pass the new tokens'
panels: cached keys keep their rotation. Batch size 1 broadcasts.

Grouped-query attention: one operator per key head exists, so with ``Hkv < H`` the phases of
the ``H / Hkv`` query heads of a group are averaged (``headwise.group_mean``) and used for the
group's queries and its key alike (same-panel invariance needs the same operator on both).

Reference (one pair, theta = 0.7, q = (1, .5), k = (.3, -1.2), m = 5, n = 2, phases
{0: 0, 1: 0.4}): panels (0, 0) and (1, 1) give -1.013879 (RoPE); (0, 1) -1.300094; (1, 0)
-0.567594.

``rotate`` / ``rotate_qk`` called without a state (directly, outside the engine, which always
builds one from the required ``panel`` input) apply the frozen RoPE alone (``O = I``), as the
camera encodings apply no camera block without theirs.

Two frozen encodings ("across positional-encoding regimes"): ``opro`` over RoPE (1-D) and
``opro-axial`` over axial N-D RoPE (``rope-axial``: 2-D image patches, ``dims=3`` for the
(index, row, column) ids of FLUX-style DiTs). ``PanelOperators`` is the shared part (a mixin
before the frozen class: it rotates with the base, then applies the phases to the same
pairs).

Shapes: ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``; ``phases (panels, H | 1, P)`` for the
base's ``P`` rotated pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ..options import Bool, Int
from ..registry import register
from .headwise import group_mean
from .nd import RoPEAxial
from .rope import RoPE, refuse_length_dependent, rotate_pairs, scaling_option

__all__ = ["PanelOperators", "PanelOperatorRoPE", "PanelOperatorAxialRoPE", "PanelState"]


#: the options both OPRO encodings take
PANELS = Int(minimum=1, doc="number of panels")
PER_HEAD = Bool(doc="one operator per head (else shared)")


@dataclass
class PanelState:
    """The call's panel ids (``prepare_rotary``): ``query (B|1, Lq)``, ``key (B|1, Lk)``
    int64."""

    query: Tensor
    key: Tensor


class PanelOperators:
    """OPRO's panel operators on top of a frozen rotary encoding (mixin, listed before it).

    ``rotate(x_t) = O_{p(t)} R(pos_t) x_t``: the base rotates, then channel pair ``c`` of head
    ``h`` turns by ``phi[p(t), h, c]`` on the base's own pairing (``layout``). Subclasses call
    ``_init_panels(panels, per_head, pairs)`` after the base's constructor.
    """

    required_inputs = {"panel": "(B, Lk) int64 panel id of each key token"}
    optional_inputs = {"query_panel": "(B, Lq) int64 panel id of each query token"}
    option_overrides = {
        "scaling": scaling_option(
            refuse_length_dependent("a re-rotated cache needs every cached key's panel"),
            refused=({"rope_type": "dynamic", "factor": 2.0},),
        ),
    }

    num_heads: int
    layout: str
    name: str
    phases: nn.Parameter

    def _init_panels(self, panels: int, per_head: bool, pairs: int) -> None:
        self.panels, self.per_head = panels, per_head
        shape = (panels, self.num_heads if per_head else 1, pairs)
        self.phases = nn.Parameter(torch.zeros(shape))

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Key token ``n`` in panel ``(n // 4) % 2`` (a prefix's panels do not depend on the
        length); query panels by the same rule in key coordinates when ``Lq > Lk``."""

        def panel(index: Tensor) -> Tensor:
            return (torch.div(index, 4, rounding_mode="floor") % 2).expand(batch, -1)

        out = {"panel": panel(torch.arange(length_k))}
        if length_q > length_k:
            out["query_panel"] = panel(torch.arange(length_q) + length_k - length_q)
        return out

    # ------------------------------------------------------------------ inputs
    def _panel_ids(self, inputs: dict[str, Tensor], name: str, length: int) -> Tensor | None:
        value = inputs.get(name)
        if value is None:
            return None
        key = f"inputs[{name!r}]"
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{key} must be an integer tensor of panel ids, got {value.dtype}")
        if value.dim() != 2 or value.shape[1] != length:
            side = "query" if name == "query_panel" else "key"
            raise ValueError(
                f"{key} must have shape (B, {length}) (one panel id per {side} token of this "
                f"call), got {tuple(value.shape)}"
            )
        if value.numel() and (int(value.min()) < 0 or int(value.max()) >= self.panels):
            raise ValueError(
                f"{key} must hold panel ids in [0, {self.panels}) (panels={self.panels}), got "
                f"values in [{int(value.min())}, {int(value.max())}]"
            )
        return value.to(torch.int64)

    def prepare_rotary(self, q_pos: Tensor, k_pos: Tensor, inputs: dict[str, Tensor]) -> PanelState:
        Lq, Lk = q_pos.shape[1], k_pos.shape[1]
        key = self._panel_ids(inputs, "panel", Lk)
        assert key is not None  # required: the engine checked its presence
        query = self._panel_ids(inputs, "query_panel", Lq)
        if query is None:
            if Lk < Lq:
                raise ValueError(
                    f"inputs['query_panel'] is needed: the queries ({Lq}) outnumber the keys "
                    f"({Lk}), so they cannot default to the last Lq key tokens' panels"
                )
            query = key[:, Lk - Lq :]
        if query.shape[0] != key.shape[0] and 1 not in (query.shape[0], key.shape[0]):
            raise ValueError(
                "inputs['query_panel'] and inputs['panel'] must share the batch size, got "
                f"{query.shape[0]} and {key.shape[0]}"
            )
        return PanelState(query=query, key=key)

    # ------------------------------------------------------------------ rotation
    def head_phases(self, kv_heads: int) -> Tensor:
        """The phases of a call whose keys have ``kv_heads`` heads: ``(panels, H', P)`` with
        one operator per key head (GQA groups averaged); the queries repeat them per group."""
        if not self.per_head or kv_heads == self.phases.shape[1]:
            return self.phases
        return group_mean(self.phases.transpose(0, 1), kv_heads).transpose(0, 1)

    def _panel_phase(self, x: Tensor, panel: Tensor, phases: Tensor) -> Tensor:
        """``x (B, Hx, L, D)`` (already rotated by the base) turned by ``phi[panel]`` on the
        base's pairs; cos / sin from float64 phases."""
        phi = phases.to(torch.float64)[panel]  # (B|1, L, H', P)
        if phi.shape[2] not in (1, x.shape[1]):
            phi = phi.repeat_interleave(x.shape[1] // phi.shape[2], dim=2)
        phi = phi.permute(0, 2, 1, 3)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return rotate_pairs(x, phi.cos().to(dtype), phi.sin().to(dtype), self.layout)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None
    ) -> tuple[Tensor, Tensor]:
        qr, kr = super().rotate_qk(q, k, q_pos, k_pos)  # type: ignore[misc]  # the frozen base
        if state is None:  # called directly, without the engine's state: O = I
            return qr, kr
        state = self._state(state)
        phases = self.head_phases(kr.shape[1])
        return self._panel_phase(qr, state.query, phases), self._panel_phase(kr, state.key, phases)

    def rotate(self, x: Tensor, pos: Tensor, role: str, state: Any = None) -> Tensor:
        """One of q / k alone (``Hkv = H`` assumed for the operator); values pass."""
        out = super().rotate(x, pos, role)  # type: ignore[misc]
        if role not in ("q", "k") or state is None:
            return out
        state = self._state(state)
        panel = state.query if role == "q" else state.key
        return self._panel_phase(out, panel, self.head_phases(out.shape[1]))

    def _state(self, state: Any) -> PanelState:
        if not isinstance(state, PanelState):
            raise TypeError(
                f"state must be a PanelState (prepare_rotary), got {type(state).__name__}"
            )
        return state

    def extra_repr(self) -> str:
        base = super().extra_repr()  # type: ignore[misc]
        return f"{base}, panels={self.panels}, per_head={self.per_head}"


@register("opro")
class PanelOperatorRoPE(PanelOperators, RoPE):
    """OPRO over a frozen 1-D RoPE (Lee et al. 2026, arXiv 2603.27637; a reconstruction, see
    the module): pair ``c`` of head ``h`` turns by ``theta_c pos_t + phi[p(t), h, c]``.

    Args:
        panels: number of panels (ids ``0 .. panels - 1`` in ``inputs["panel"]``).
        per_head: one operator per head (else one shared by the heads).
        base, layout, partial_rotary_factor, scaling, max_position_embeddings: the frozen
            RoPE's options (``RoPE``); length-dependent scalings are refused (their cache is
            re-rotated, which needs every cached key's panel).

    Parameter ``phases (panels, H | 1, r/2)``, zero at init (``O = I``).
    """

    paper = "Lee et al. 2026 (OPRO)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        panels: Annotated[int, PANELS] = 2,
        per_head: Annotated[bool, PER_HEAD] = True,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self._init_panels(panels, per_head, self.rotary_dim // 2)


@register("opro-axial")
class PanelOperatorAxialRoPE(PanelOperators, RoPEAxial):
    """OPRO over a frozen axial N-D RoPE (``rope-axial``; the DiT setting: panels of 2-D
    patches, ``dims=3`` for (index, row, column) ids); see ``opro`` and the module.

    Args: ``panels``, ``per_head`` as ``opro``; ``dims``, ``sections`` and the RoPE options
    of ``rope-axial``. Parameter ``phases (panels, H | 1, sum(sections))``, zero at init.
    """

    paper = "Lee et al. 2026 (OPRO)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        panels: Annotated[int, PANELS] = 2,
        per_head: Annotated[bool, PER_HEAD] = True,
        **axial_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **axial_options)
        self._init_panels(panels, per_head, sum(self.sections))
