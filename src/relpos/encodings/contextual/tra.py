"""TRA: threshold relative attention (Opper, Fernandez, Smolensky, Gao 2025, "TRA: Better
Length Generalisation with Threshold Relative Attention", TMLR, arXiv 2503.23174).

Selective sparsity (keys whose score is below a threshold leave the softmax) plus a contextualised
relative distance (only the kept keys are counted), modulated by a learnable forget gate. The
official repository mopper97/TRA holds only a README, so the formula was first reconstructed without
code, then checked against the authors' own notebook, the "Jupyter notebook implementing Threshold
Relative Attention ... as presented in this paper" of their MOSS workshop submission
(abhishekpanigrahi1996/MOSS ``submissions/submission-96/TRA_FFL.ipynb``, class ``TRA``: the authors'
code, read through a copy), and follows it (see the class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import alibi_slopes
from ..base import BiasContext, Encoding
from ..options import Bool, Choice, Float, Int
from ..registry import register

__all__ = ["TRA", "TRAData", "TRABlock", "LAYER_INPUT"]

#: the per-call input of a data-dependent forget gate: the attention layer's input hidden
#: states ``(B, Lq, input_dim)``; ``relpos.nn`` layers pass their own input under this name
LAYER_INPUT = "layer_input"


@dataclass
class TRAData:
    """The call's queries and keys (keys repeated to the query heads), from which each block
    takes its keep decisions on float64 scores, and the log forget gates ``(B|1, H, Lq, 1)``
    float64 (one per query and head)."""

    q: Tensor  # (B, H, Lq, D)
    k: Tensor  # (B, H, Lk, D)
    log_gate: Tensor


@dataclass
class TRABlock:
    """One block's float64 scores ``(B, H, T, S)`` (the keep decisions read them, so every
    backend and a cached decoding step keep the same keys whatever its matmul blocking) and
    the log gates of its queries ``(B|1, H, T, 1)``."""

    score: Tensor
    log_gate: Tensor


class _ExampleInputs:
    """``example_inputs`` that knows the instance's ``input_dim`` when called on one (the
    layer input's width); on the class (no sizes known) it gives none. Query ``i`` gets
    ``x[b, i, c] = sin(0.9 n (c + 1) + 1.7 b + 0.3 c)`` at its key index ``n = i + Lk - Lq``,
    so a query's input does not depend on the call's length (KV-cache and single-query
    tests compare calls of different lengths)."""

    def __get__(self, obj: Any, owner: type) -> Any:
        def example_inputs(
            batch: int, length_q: int, length_k: int, generator: torch.Generator
        ) -> dict[str, Tensor]:
            if obj is None or obj.forget_gate != "input":
                return {}
            n = torch.arange(length_q, dtype=torch.float64)[None, :, None] + length_k - length_q
            c = torch.arange(obj.input_dim, dtype=torch.float64)[None, None, :]
            b = torch.arange(batch, dtype=torch.float64)[:, None, None]
            x = torch.sin(0.9 * n * (c + 1) + 1.7 * b + 0.3 * c).to(torch.float32)
            return {LAYER_INPUT: x}

        return example_inputs


GATE = Choice(
    choices=("hard", "straight-through", "soft"),
    doc="keep decision: hard, straight-through gradient, or a sigmoid relaxation",
)
FORGET = Choice(
    choices=("input", "head"),
    doc="forget gate from the layer input (the authors) or one per head",
)


@register("tra")
class TRA(Encoding):
    """TRA, threshold relative attention (Opper et al. 2025, arXiv 2503.23174; the authors'
    notebook, see the module).

        s_ij   = q_i . k_j * scale                               content logits
        m_ij   = 1[s_ij > threshold]                             kept keys (ReLU(s) > 0)
        c_ij   = sum_{t >= j} m_it                               kept keys from j to the query
        logit  = s_ij + delta_hi * c_ij   if m_ij,   -inf otherwise
        delta_hi = log sigmoid(W x_i + b)_h                      the forget gate (<= 0)

    so a kept key's weight is multiplied by ``sigmoid(.) ** c_ij``: it decays with the number
    of *relevant* keys up to the query, not with the raw distance. Masked keys (causal:
    ``j > i``) are neither kept nor counted; without a causal mask every kept key right of
    ``j`` counts. A row with no kept key gives 0 (the authors zero such rows after the
    softmax; relpos's dead rows are 0 with zero gradients).

    As the authors' code: the gate reads the layer's input ``x_i`` (``forget="input"``: a
    ``Linear(input_dim, H)``, PyTorch's default init; per-call input ``inputs["layer_input"]
    (B, Lq, input_dim)``, which ``relpos.nn.MultiHeadAttention`` fills with its own input);
    the count includes ``j`` itself (``c_ij`` is the flip-cumsum-flip of the kept mask, so the
    logits equal theirs, not only the weights); the threshold is 0 on the scaled logit; no
    key is kept by rule. Their layer also RMS-normalises q and k per head (no affine) before
    the scores: that belongs to the model, not to this encoding.

    Options beyond the authors' code: ``forget="head"`` (one learned gate per head, ``delta_h =
    log sigmoid(f_h)``, ``f_h`` starting at ALiBi's slopes: the first reconstruction,
    kept for models without a layer input); ``keep_own`` (the query's own key, equal
    positions, is always kept: no self-attention row is empty); ``threshold``; ``gate``:
    ``"hard"`` (default; the keep decision has no gradient, the kept logits and the gate
    train), ``"straight-through"`` (forward as hard; the count's gradient flows through
    ``sigmoid((s - threshold) / temperature)``), ``"soft"`` (a relaxation: ``m`` is that
    sigmoid and the logit is ``s + log m + delta c`` on every key). Keep decisions are taken
    on float64 scores, so backends agree exactly on which keys are kept.

    Row-dependent (flag ``row_dependent``): backends ``eager`` and ``chunked`` only. Reads
    positions only to find the query's own key with ``keep_own`` (shift-invariant:
    ``relative``).
    """

    paper = "Opper et al. 2025 (TRA)"
    has_bias = True
    row_dependent = True
    continuous = True

    example_inputs = _ExampleInputs()  # type: ignore[assignment]
    #: the gate keeps PyTorch's Linear init, as the authors' model (models must not reset it)
    own_init_modules = ("forget_proj",)

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        threshold: Annotated[
            float, Float(doc="keys with a scaled logit at or below it are removed")
        ] = 0.0,
        gate: Annotated[str, GATE] = "hard",
        temperature: Annotated[
            float, Float(above=0.0, doc="sigmoid temperature of the relaxed gates")
        ] = 1.0,
        forget: Annotated[str, FORGET] = "input",
        input_dim: Annotated[
            int | None, Int(optional=True, doc="width of the layer input (None: H * head_dim)")
        ] = None,
        keep_own: Annotated[bool, Bool(doc="always keep the query's own key")] = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.threshold, self.gate, self.temperature = threshold, gate, temperature
        self.forget_gate, self.keep_own = forget, keep_own
        self.input_dim = num_heads * head_dim if input_dim is None else input_dim
        if forget == "input":
            self.forget_proj = nn.Linear(self.input_dim, num_heads)
            self.required_inputs = {
                LAYER_INPUT: f"(B, Lq, {self.input_dim}) the attention layer's input per query"
            }
        else:
            slopes = alibi_slopes(num_heads).double()
            # -log sigmoid(f) = softplus(-f) starts at the ALiBi slopes
            self.forget = nn.Parameter((-torch.log(torch.expm1(slopes))).float())

    def decay(self) -> Tensor:
        """``forget="head"``: ``lambda_h = -log sigmoid(f_h)``, shape ``(H,)``."""
        if self.forget_gate != "head":
            raise ValueError("decay(): the forget gate reads the layer input (forget='input')")
        return F.softplus(-self.forget)

    def log_gates(self, inputs: dict[str, Tensor], lq: int) -> Tensor:
        """``delta (B|1, H, Lq, 1)`` float64: ``log sigmoid(W x + b)`` of the layer input
        (``forget="input"``) or ``log sigmoid(f_h)`` of every query (``"head"``)."""
        if self.forget_gate == "head":
            return -self.decay().to(torch.float64)[None, :, None, None].expand(1, -1, lq, 1)
        x = inputs[LAYER_INPUT]
        name = f"inputs[{LAYER_INPUT!r}]"
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (B, Lq, {self.input_dim})")
        if x.dim() != 3 or x.shape[1] != lq or x.shape[2] != self.input_dim:
            raise ValueError(
                f"{name} must have shape (B, {lq}, {self.input_dim}) (the layer input of each "
                f"query of this call), got {tuple(x.shape)}"
            )
        w = self.forget_proj
        gate = F.linear(x.to(w.weight.dtype), w.weight, w.bias)  # (B, Lq, H)
        return F.logsigmoid(gate.to(torch.float64)).transpose(1, 2)[..., None]

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return TRAData(q=q, k=k, log_gate=self.log_gates(inputs, q.shape[2]))

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        data = ctx.data
        score = torch.matmul(
            data.q[:, :, i].double(), data.k[:, :, j].double().transpose(-1, -2)
        ) * float(ctx.scale)
        return BiasContext(
            q_pos=ctx.q_pos,
            k_pos=ctx.k_pos,
            data=TRABlock(score, data.log_gate[:, :, i]),
            scale=ctx.scale,
            positions=ctx.positions,
        )

    def _own(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return ctx.q_pos[b, i] == ctx.k_pos[b, j]

    def row_gates(
        self, ctx: BiasContext, s: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        if self.gate == "soft":
            soft = torch.sigmoid((s.double() - self.threshold) / self.temperature)
            return torch.where(self._own(ctx, b, i, j), 1.0, soft) if self.keep_own else soft
        kept = ctx.data.score > self.threshold
        if self.keep_own:
            kept = kept | self._own(ctx, b, i, j)
        kept = kept.double()
        if self.gate == "straight-through":
            soft = torch.sigmoid((s.double() - self.threshold) / self.temperature)
            kept = kept + soft - soft.detach()
        return kept

    def row_bias(
        self,
        ctx: BiasContext,
        s: Tensor,
        g: Tensor,
        count: Tensor,
        b: Tensor,
        h: Tensor,
        i: Tensor,
        j: Tensor,
    ) -> Tensor:
        decayed = ctx.data.log_gate.to(count.dtype) * count  # kept keys from j to the query
        if self.gate == "soft":
            log_gate = F.logsigmoid((s.double() - self.threshold) / self.temperature)
            if self.keep_own:
                log_gate = torch.where(self._own(ctx, b, i, j), 0.0, log_gate)
            return decayed + log_gate
        return torch.where(g.detach() > 0.5, decayed, float("-inf"))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, threshold={self.threshold}, gate={self.gate!r}, "
            f"forget={self.forget_gate!r}, keep_own={self.keep_own}, "
            f"temperature={self.temperature}"
        )
