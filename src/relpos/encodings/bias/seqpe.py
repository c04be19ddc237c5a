"""SeqPE: sequential position encoding (H. Li et al. 2025, "SeqPE: Transformer with
Sequential Position Encoding", arXiv 2506.13277; official code ghrua/seqpe).

Each (m-D) position is written as a digit sequence and encoded by a small Transformer
(``seqpe_encoder.SequentialPositionEncoder``); one shared projection maps the encoding to
per-head query and key vectors whose dot product is added to the content logit. Checked
against the released GPT-2 / WikiText-103 code and config (ghrua/seqpe,
``text_seq_pe/src/transformers/custom_modules/sequential_pe.py`` and ``pe_criterion.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext, Encoding
from ..options import Bool, Choice, Float, Int
from ..registry import register
from .seqpe_encoder import SequentialPositionEncoder, check_digit_positions

__all__ = ["SeqPE", "SeqPE2D", "SeqPEData", "SeqPEBlock"]


@dataclass
class SeqPEData:
    """The per-head position vectors of the call: ``pq (B|1, H, Lq, d)``, ``pk (B|1, H, Lk,
    d)`` (batch-shared when both position tensors are)."""

    pq: Tensor
    pk: Tensor
    batch_shared: bool


@dataclass
class SeqPEBlock:
    """One block's bias ``scale * pq[:, :, i] @ pk[:, :, j]^T`` and where it starts."""

    bias: Tensor
    i0: int
    j0: int
    batch_shared: bool


#: the position axes of ``seqpe`` (1) and ``seqpe-2d`` (2)
DATA_DIM = Int(minimum=1, doc="position axes m")


@register("seqpe")
class SeqPE(Encoding):
    """SeqPE (H. Li et al. 2025, arXiv 2506.13277; official code ghrua/seqpe).

        PE(p)        = SequentialPositionEncoder(digits(p))           (D_out,), any p < 10^digits
        [Pq, Pk](p)  = pe_qk(PE(p))            one shared Linear(D_out, 2 H d) -> (H, d) each
                                               (``pe_q``, ``pe_k``; the key half has no bias:
                                               a per-row constant the softmax ignores)
        logit_ij     = (q_i . k_j + Pq_h(p_i) . Pk_h(p_j)) * scale          scale = d^-1/2

    as the released ``attn_scalar`` GPT-2 applies it (one ``pe_qk`` for every layer: share one
    encoding module across layers, ``relpos.nn.TransformerLM``'s default; no ``wpe`` table).

    ``path="channels"`` (default, the exact fast path): ``rotate`` appends ``Pq`` to the
    queries and ``Pk`` to the keys (``(B, H, L, head_dim + d)``, grouped keys repeated to the
    query heads), so fused SDPA / flex run it without a bias while the engine keeps the scale
    of the original ``head_dim`` (the encoding's ``default_scale``, not that of the widened
    q/k), and keys are
    cached with their channels. ``path="bias"``: the same term as an additive bias
    ``ctx.scale * Pq . Pk`` (formed per block). Both paths agree to float rounding.

    Positions: integers in ``[0, 10 ** max_digits)`` (else ``ValueError``), ``(L,)``,
    ``(B, L)`` or, with ``data_dim = m > 1``, ``(B, L, m)`` (``seqpe-2d``: m = 2). Only the
    distinct positions of a call are encoded. Defaults are the released config for the
    attention they serve (GPT-2 small, 12 heads x 64: ``embed_dim 768``, 12 encoder heads):
    ``max_digits 5``, ``embed_dim = num_heads * head_dim`` (the model width), ``encoder_heads =
    num_heads``, 2 layers, ``out_dim = embed_dim``, a final LayerNorm, temperature 1;
    ``d = head_dim``. The regularisers of the paper are
    ``seqpe_encoder.contrastive_loss`` / ``distillation_loss`` (apply them to ``.encoder``);
    ``seqpe_sampler.ContrastiveSampler`` draws the contrastive candidates as the official code.
    """

    paper = "H. Li et al. 2025 (SeqPE)"
    relative = False
    keeps_own_init = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_digits: Annotated[int, Int(minimum=1, maximum=18, doc="decimal digits per axis")] = 5,
        data_dim: Annotated[int, DATA_DIM] = 1,
        embed_dim: Annotated[
            int | None, Int(optional=True, doc="width D of the position encoder (None: H * d)")
        ] = None,
        encoder_heads: Annotated[
            int | None, Int(optional=True, doc="heads of the position encoder (None: H)")
        ] = None,
        layers: Annotated[int, Int(minimum=0, doc="GPT-2 blocks of the position encoder")] = 2,
        out_dim: Annotated[
            int | None, Int(optional=True, doc="encoder output width (None: embed_dim)")
        ] = None,
        final_norm: Annotated[bool, Bool(doc="LayerNorm before the output projection")] = True,
        temperature: Annotated[float, Float(above=0.0, doc="divides the encoder output")] = 1.0,
        path: Annotated[
            str, Choice(choices=("channels", "bias"), doc="extra q/k channels or a bias")
        ] = "channels",
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.max_digits, self.path = max_digits, path
        self.dims = data_dim
        embed_dim = num_heads * head_dim if embed_dim is None else embed_dim
        encoder_heads = num_heads if encoder_heads is None else encoder_heads
        out_dim = embed_dim if out_dim is None else out_dim
        self.encoder = SequentialPositionEncoder(
            max_digits=max_digits,
            data_dim=data_dim,
            dim=embed_dim,
            heads=encoder_heads,
            layers=layers,
            out_dim=out_dim,
            final_norm=final_norm,
            temperature=temperature,
        )
        # pe_qk, split: the key half has no bias (it would add Pq_i . c to every logit of row
        # i, a per-row constant the softmax ignores: its gradient is 0 in the official code)
        self.pe_q = nn.Linear(out_dim, num_heads * head_dim)
        self.pe_k = nn.Linear(out_dim, num_heads * head_dim, bias=False)
        with torch.no_grad():
            self.pe_q.weight.normal_(0.0, 0.02)
            self.pe_q.bias.zero_()
            self.pe_k.weight.normal_(0.0, 0.02)
        self.has_rotary = path == "channels"
        self.has_bias = path == "bias"

    @classmethod
    def example_options(cls) -> dict:
        # a narrower encoder's position vectors are nearly equal for all positions (with the
        # suite's random biases): parameter gradients then cancel to below fp32 agreement
        return {"embed_dim": 64, "encoder_heads": 4, "layers": 1}

    def check_positions(self, pos: Tensor, name: str) -> None:
        check_digit_positions(pos, self.max_digits, name)

    def position_vectors(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``Pq`` at ``q_pos`` and ``Pk`` at ``k_pos`` (``(B|1, L[, m])`` each):
        ``(B|1, H, L, head_dim)`` float32. The distinct positions of both are encoded once."""
        check_digit_positions(q_pos, self.max_digits, "q_pos")
        check_digit_positions(k_pos, self.max_digits, "k_pos")
        flat = torch.cat([q_pos.reshape(-1, self.dims), k_pos.reshape(-1, self.dims)])
        unique, inverse = torch.unique(flat, dim=0, return_inverse=True)
        pe = self.encoder(unique)  # (U, D_out)
        n = q_pos.shape[0] * q_pos.shape[1]

        def heads(proj: nn.Linear, index: Tensor, pos: Tensor) -> Tensor:
            out = proj(pe)[index].view(*pos.shape[:2], self.num_heads, self.head_dim)
            return out.transpose(1, 2)

        return heads(self.pe_q, inverse[:n], q_pos), heads(self.pe_k, inverse[n:], k_pos)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``path="channels"``: ``cat(q, Pq)``, ``cat(k, Pk)`` (grouped keys repeated to the
        query heads)."""
        if self.path != "channels":
            return q, k
        pq, pk = self.position_vectors(q_pos, k_pos)
        if k.shape[1] != self.num_heads:  # grouped keys: one Pk per query head
            k = k.repeat_interleave(self.num_heads // k.shape[1], dim=1)

        def cat(x: Tensor, extra: Tensor) -> Tensor:
            extra = extra.to(x.dtype).expand(x.shape[0], *extra.shape[1:])
            return torch.cat([x, extra], dim=-1)

        return cat(q, pq), cat(k, pk)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        """One side of ``rotate_qk`` (role "q" or "k"); values and outputs are unchanged."""
        if role == "q":
            return self.rotate_qk(x, x[:, :1, :0], pos, pos[:, :0])[0]
        if role == "k":
            return self.rotate_qk(x[:, :, :0], x, pos[:, :0], pos)[1]
        return x

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        qp, kp = ctx.q_pos, ctx.k_pos
        shared = bool((qp[:1] == qp).all() and (kp[:1] == kp).all())
        if shared:
            qp, kp = qp[:1], kp[:1]
        pq, pk = self.position_vectors(qp, kp)
        return SeqPEData(pq=pq, pk=pk, batch_shared=shared)

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        data = ctx.data
        i0, j0 = int(i[0]) if i.numel() else 0, int(j[0]) if j.numel() else 0
        pq = data.pq[:, :, i0 : i0 + i.numel()]
        pk = data.pk[:, :, j0 : j0 + j.numel()]
        bias = torch.matmul(pq, pk.transpose(-1, -2)) * ctx.scale
        return BiasContext(
            q_pos=ctx.q_pos,
            k_pos=ctx.k_pos,
            data=SeqPEBlock(bias, i0, j0, data.batch_shared),
            scale=ctx.scale,
            positions=ctx.positions,
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        blk = ctx.data
        return blk.bias[b, h, i - blk.i0, j - blk.j0]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_digits={self.max_digits}, dims={self.dims}, " + (
            f"path={self.path!r}"
        )


@register("seqpe-2d")
class SeqPE2D(SeqPE):
    """SeqPE over 2-D positions ``(B, L, 2)`` (``data_dim=2``: the image setting of the
    paper, e.g. ``(row, column)`` patch ids); see ``seqpe``."""

    def __init__(
        self, num_heads: int, head_dim: int, *, data_dim: Annotated[int, DATA_DIM] = 2, **options
    ) -> None:
        super().__init__(num_heads, head_dim, data_dim=data_dim, **options)
