"""SeqPE's position encoder: positions written as digit sequences, read by a small causal
Transformer (H. Li et al. 2025, "SeqPE: Transformer with Sequential Position Encoding",
arXiv 2506.13277; official code ghrua/seqpe ``SequentialPE``, read).

``position_digits`` writes an m-D integer position as ``m * max_digits`` decimal digits
(each axis left-padded with the digit 0, the padding not masked); ``SequentialPositionEncoder``
embeds the digits, appends a CLS vector and returns the CLS state's projection: one learned
vector per position, for any position below ``10 ** max_digits`` and any number of axes.
Also the two regularisers of the paper (``contrastive_loss``, ``distillation_loss``) and its
training-time position shift (``RandomShift``); the contrastive candidates are drawn by
``seqpe_sampler.ContrastiveSampler``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "position_digits",
    "check_digit_positions",
    "SequentialPositionEncoder",
    "contrastive_labels",
    "contrastive_loss",
    "distillation_loss",
    "RandomShift",
]


def check_digit_positions(pos: Tensor, max_digits: int, name: str = "pos") -> None:
    """Positions must be integers in ``[0, 10 ** max_digits)`` (``ValueError`` / ``TypeError``
    naming ``name``)."""
    if pos.is_floating_point() or pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"{name} must hold integer positions for SeqPE's digits, got {pos.dtype}")
    if pos.numel() == 0:
        return
    lo, hi = int(pos.min()), int(pos.max())
    if lo < 0 or hi >= 10**max_digits:
        raise ValueError(
            f"{name} spans positions {lo}..{hi}, but SeqPE writes positions with "
            f"max_digits={max_digits} decimal digits: they must lie in 0..{10**max_digits - 1}"
        )


def position_digits(pos: Tensor, max_digits: int) -> Tensor:
    """Decimal digits of integer positions ``pos (..., m)``: ``(..., m * max_digits)`` int64,
    most significant first, each axis left-padded with 0 (``123 -> [0, 0, 1, 2, 3]``;
    ``(12, 3) -> [0, 0, 0, 1, 2, 0, 0, 0, 0, 3]``)."""
    powers = 10 ** torch.arange(max_digits - 1, -1, -1, device=pos.device, dtype=torch.int64)
    digits = (pos.to(torch.int64)[..., None] // powers) % 10  # (..., m, max_digits)
    return digits.flatten(-2)


class _Block(nn.Module):
    """A GPT-2 pre-LN block (causal self-attention, 4x MLP with tanh-GELU, "gelu_new")."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm_1 = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm_2 = nn.LayerNorm(dim, eps=eps)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm_1(x)).view(n, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.norm_2(x)), approximate="tanh"))


class SequentialPositionEncoder(nn.Module):
    """SeqPE's encoder (ghrua/seqpe ``SequentialPE``, the released WikiText-103 config).

        x_t    = Emb_digit(10, D)[digit_t] + Emb_index(max_digits * m, D)[t]
                 (+ axis(m, 1, D)[axis of t] when m > 1)
        x      = [x_0 .. x_{T-1}, cls]                 cls: a learned vector, no index embedding
        h      = Blocks_causal(x)                      ``layers`` GPT-2 pre-LN blocks
        PE(p)  = out_proj(LayerNorm(h_cls)) / temperature      (D_out,)

    The attention over the digits is causal, so the CLS vector, appended last, reads every
    digit. Init as the official code: ``N(0, 0.02^2)`` for every weight, embedding, the CLS
    vector and the axis embedding; zero biases; LayerNorm weight 1. The official encoder's
    dropout (residual 0.1) is left out, so the encoder is deterministic.

    ``forward(pos (N, m) int) -> (N, D_out)``.
    """

    def __init__(
        self,
        *,
        max_digits: int,
        data_dim: int,
        dim: int,
        heads: int,
        layers: int,
        out_dim: int,
        final_norm: bool = True,
        temperature: float = 1.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"embed_dim ({dim}) must be a multiple of encoder_heads ({heads})")
        self.max_digits, self.data_dim, self.temperature = max_digits, data_dim, temperature
        self.digit = nn.Embedding(10, dim)
        self.index = nn.Embedding(max_digits * data_dim, dim)
        self.axis = nn.Parameter(torch.zeros(data_dim, 1, dim)) if data_dim > 1 else None
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads, eps) for _ in range(layers))
        self.norm = nn.LayerNorm(dim, eps=eps) if final_norm else None
        self.out_proj = nn.Linear(dim, out_dim)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        self.cls.normal_(0.0, 0.02)
        if self.axis is not None:
            self.axis.normal_(0.0, 0.02)

    def forward(self, pos: Tensor) -> Tensor:
        digits = position_digits(pos, self.max_digits)  # (N, T)
        n, t = digits.shape
        x = self.digit(digits) + self.index.weight[:t]
        if self.axis is not None:
            x = x + self.axis.expand(-1, self.max_digits, -1).flatten(0, 1)
        x = torch.cat([x, self.cls.expand(n, -1, -1)], dim=1)
        for block in self.blocks:
            x = block(x)
        h = x[:, -1]
        if self.norm is not None:
            h = self.norm(h)
        return self.out_proj(h) / self.temperature


def contrastive_labels(pivots: Tensor, candidates: Tensor) -> Tensor:
    """SeqPE's contrastive targets: for pivots ``(N, m)`` and candidates ``(N, C, m)``, the
    candidate nearest in squared Euclidean distance (the first on ties): ``(N,)`` int64."""
    d2 = (candidates.to(torch.int64) - pivots.to(torch.int64)[:, None]).square().sum(-1)
    return torch.argmin(d2, dim=1)


def contrastive_loss(
    encoder: nn.Module, pivots: Tensor, candidates: Tensor, labels: Tensor | None = None
) -> Tensor:
    """``L_ct``: cross-entropy of the logits ``<PE(p), PE(n_c)>`` over the ``C`` candidates of
    each pivot, against the nearest candidate (``contrastive_labels``; or ``labels (N,)`` as
    given, e.g. by ``seqpe_sampler.ContrastiveSampler``). ``pivots (N, m)``, ``candidates
    (N, C, m)`` integer positions; a scalar."""
    n, c, m = candidates.shape
    if labels is None:
        labels = contrastive_labels(pivots, candidates)
    elif labels.shape != (n,):
        raise ValueError(
            f"labels must have shape ({n},) (one per pivot), got {tuple(labels.shape)}"
        )
    pe = encoder(torch.cat([pivots, candidates.reshape(n * c, m)]))
    logits = torch.einsum("nd,ncd->nc", pe[:n], pe[n:].view(n, c, -1))
    return F.cross_entropy(logits, labels)


def distillation_loss(encoder: nn.Module, student: Tensor, teacher: Tensor) -> Tensor:
    """``L_kd``: a block of out-of-distribution positions ``student (K, m)`` (e.g. ``s .. s+K-1``)
    against the in-distribution block ``teacher (K, m)`` (``0 .. K-1``, detached): the KL
    divergence of the row-softmaxes of ``PE PE^T`` in both directions, summed (batch mean)."""
    s = encoder(student)
    with torch.no_grad():
        t = encoder(teacher)
    log_s = torch.log_softmax(s @ s.T, dim=-1)
    log_t = torch.log_softmax(t @ t.T, dim=-1)
    forward = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")
    backward = F.kl_div(log_t, log_s, log_target=True, reduction="batchmean")
    return forward + backward


class RandomShift:
    """SeqPE's random shift of the training positions (ghrua/seqpe ``SeqPeMainTaskPosSampler``,
    1-D, the released config: ``rate 0.1``, ``downsample 320``).

    The admissible starts ``0 .. max_position - length`` are shuffled once and the first
    ``downsample`` kept (all when ``downsample`` is None); each ``next()`` is, with probability
    ``rate``, the window ``[s, s + length)`` of the next start in that list (cycling, a new
    random offset into it each pass, as the official sampler's epochs), else ``0 .. length-1``.
    Returns ``(length,)`` int64 positions for ``relpos.attention(..., q_pos=..., k_pos=...)``.
    """

    def __init__(
        self,
        length: int,
        max_position: int,
        *,
        rate: float = 0.1,
        downsample: int | None = 320,
        generator: torch.Generator | None = None,
    ) -> None:
        if not (0.0 <= rate <= 1.0):
            raise ValueError(f"rate must be a probability in [0, 1], got {rate}")
        if length < 1 or max_position < length:
            raise ValueError(
                f"need 1 <= length <= max_position, got length={length}, "
                f"max_position={max_position}"
            )
        self.length, self.rate, self.generator = length, rate, generator
        starts = torch.randperm(max_position - length + 1, generator=generator)
        self.starts = starts if downsample is None else starts[:downsample]
        self._next = self._offset()

    def _offset(self) -> int:
        return int(torch.randint(0, min(32, len(self.starts)), (), generator=self.generator))

    def next(self) -> Tensor:
        if float(torch.rand((), generator=self.generator)) >= self.rate:
            return torch.arange(self.length)
        if self._next >= len(self.starts):
            self._next = self._offset()
        start = int(self.starts[self._next])
        self._next += 1
        return torch.arange(start, start + self.length)
