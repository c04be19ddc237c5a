"""Long-term decay of rotary encodings: the RoFormer bound and expected scores vs distance.

RoFormer (Su et al. 2021, arXiv 2104.09864, section 3.4.3) writes the rotary score as a sum
over channel pairs, ``<R(m) q, R(n) k> = Re sum_i h_i e^{i (m - n) theta_i}`` with
``h_i = q_[2i:2i+1] conj(k_[2i:2i+1])`` (a pair read as a complex number), and bounds it by
Abel summation:

    |sum_i h_i e^{i r theta_i}| <= (max_i |h_{i+1} - h_i|) * sum_{j=1}^{d/2} |S_j|,
    S_j = sum_{i<j} e^{i r theta_i}.

Its figure plots the *relative upper bound* ``(1 / (d/2)) * sum_j |S_j|`` against the relative
distance ``r``; it decays (on average) as ``r`` grows.

Here the bound is measured through the encoding itself, for any registered encoding, with no
knowledge of its frequencies or layout:

1. *Pairs.* Basis vectors are rotated at a few probe positions (``rotate_qk``); channels that
   the rotation mixes form a pair ``(a, b)``, ``a < b``; channels it never mixes are
   position-independent and are paired in index order (their phasor is constant). Pairs are
   ordered by their first channel: for RoPE (either layout) that is ``theta_i`` descending,
   as in the paper. An encoding whose rotation mixes a channel with two or more others has
   no pair structure and no bound (``bound`` is ``None``).
2. *Phasors.* One all-ones query at position ``N = max_distance`` and all-ones keys at
   positions ``0..N`` are rotated together (the last row of a causal forward pass of length
   ``N + 1``; key ``n`` is at distance ``r = N - n``). Each pair gives
   ``z_q conj(z_k) / h`` with ``z = x_a + i x_b`` and ``h`` the same product without
   rotation: ``e^{i r theta_i}`` for RoPE, times any scale the encoding applies (xPos's
   ``zeta^(r/B)``, YaRN's attention factor squared).
3. ``bound[r] = (1 / n_pairs) * sum_j |S_j(r)|``, averaged over heads.

Besides the bound, the curves hold the plain score of the all-ones vectors,
``ones_score[r] = <R(N) 1, R(N - r) 1>``, and ``expected_score[r]``, a Monte-Carlo estimate
of ``E <R(N) q, R(N - r) k>`` for random ``q ~ N(0, I)`` and keys
``k = rho q + sqrt(1 - rho^2) w`` (``w ~ N(0, I)`` drawn per key, ``rho`` =
``key_correlation``). For RoPE it equals ``2 rho sum_i cos(r theta_i)``, twice Men et al.'s
``B_r`` (section 11): with ``rho = 1`` (the default, "a similar key") it is the expected
advantage of the similar key; independent keys (``rho = 0``) average to zero. Dot products
are unscaled (no ``1/sqrt(d)``) and contain the rotary part only (``rotate_qk``); additive
biases are not included. ``expected_logits`` gives the full logits (``relpos.scores``: scale
and biases included).

All positions of a curve go through one ``rotate_qk`` call, as in a forward pass of length
``max_distance + 1`` (length-dependent scalings see that length; encodings whose queries take
the phase of their own key, such as CARoPE, find it as the last key). Encodings with
learnable parts are measured at their initialisation. Positions of m-D encodings move along
axis 0 (the other axes stay 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from relpos import config
from relpos.encodings.base import Encoding
from relpos.validation import check_float, check_int

from ..io import save_figure

__all__ = [
    "DecayCurves",
    "PairStructure",
    "pair_structure",
    "decay_curves",
    "expected_scores",
    "expected_logits",
    "sample_count",
    "plot_decay",
]

# Probe positions for the pair structure: small and large, pairwise incommensurate, small
# enough that xPos-like scales (zeta^(p/512)) stay far from underflow.
_PROBES = (1, 3, 37, 1009)
# A channel is mixed into another when its share of the rotated basis vector exceeds this.
_COUPLING_TOL = 1e-9
# Random-vector batches per rotate call in the Monte-Carlo estimates.
_SAMPLE_BATCH = 16


@dataclass(frozen=True)
class PairStructure:
    """Channel pairs of an encoding's rotation: ``pairs`` lists ``(a, b)`` with ``a < b``
    (``b = -1`` for a lone channel); ``rotated[p]`` says whether pair ``p`` is mixed by the
    rotation; ``None`` pairs mean the rotation is not pairwise (``reason`` says why)."""

    pairs: list[tuple[int, int]] | None
    rotated: list[bool] | None
    reason: str = ""


def _positions(enc: Encoding, pos: Tensor) -> Tensor:
    """1-D positions ``(B, L)`` as the encoding expects them (axis 0 moves, others stay 0)."""
    if enc.dims == 1:
        return pos
    out = torch.zeros(*pos.shape, enc.dims, dtype=pos.dtype)
    out[..., 0] = pos
    return out


@contextmanager
def _eager() -> Iterator[None]:
    """No gradients, and the rotation eager (``relpos.config.FUSED_ROTARY`` off while inside):
    a one-off measurement would otherwise wait for ``torch.compile`` on every new shape."""
    saved = config.FUSED_ROTARY
    config.FUSED_ROTARY = False
    try:
        with torch.no_grad():
            yield
    finally:
        config.FUSED_ROTARY = saved


def _rotate(enc: Encoding, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor):
    with _eager():
        return enc.rotate_qk(q, k, _positions(enc, q_pos), _positions(enc, k_pos))


def pair_structure(encoding: Encoding) -> PairStructure:
    """Find which channels the rotation of ``encoding`` mixes, by rotating basis vectors."""
    h, d, n = encoding.num_heads, encoding.head_dim, len(_PROBES)
    # Basis vector c at probe position p is batch row p * d + c: one token per row.
    eye = torch.eye(d).repeat(n, 1)[:, None, None, :].expand(n * d, h, 1, d).contiguous()
    pos = torch.tensor(_PROBES, dtype=torch.long).repeat_interleave(d)[:, None]
    rotated, _ = _rotate(encoding, eye, eye, pos, pos)
    if rotated.shape[-1] != d:  # SeqPE appends channels, positional attention replaces q
        return PairStructure(
            None,
            None,
            f"rotate_qk maps {d} channels to {rotated.shape[-1]}: not a rotation of channel "
            "pairs, the RoFormer bound is undefined",
        )
    rotated = rotated.double().reshape(n, d, h, d).transpose(1, 2)  # (probe, H, c_in, c_out)
    norm = rotated.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    share = (rotated / norm).abs().amax(dim=(0, 1))  # (d, d): [input channel, output channel]
    coupled = (share > _COUPLING_TOL) & ~torch.eye(d, dtype=torch.bool)
    coupled = coupled | coupled.T
    partners = [torch.nonzero(coupled[c]).flatten().tolist() for c in range(d)]
    many = [c for c in range(d) if len(partners[c]) > 1]
    if many:
        return PairStructure(
            None,
            None,
            f"the rotation mixes channel {many[0]} with channels {partners[many[0]]}: not a "
            "rotation of channel pairs, the RoFormer bound is undefined",
        )
    pairs: list[tuple[int, int]] = []
    flags: list[bool] = []
    lone: list[int] = []
    for c in range(d):
        if partners[c]:
            if partners[c][0] > c:
                pairs.append((c, partners[c][0]))
                flags.append(True)
        else:
            lone.append(c)
    # Channels the rotation never mixes are position-independent: pair them in index order.
    for i in range(0, len(lone), 2):
        pairs.append((lone[i], lone[i + 1] if i + 1 < len(lone) else -1))
        flags.append(False)
    order = sorted(range(len(pairs)), key=lambda p: pairs[p][0])
    return PairStructure([pairs[p] for p in order], [flags[p] for p in order])


def _key_positions(max_distance: int) -> tuple[Tensor, Tensor]:
    """``q_pos (1, 1) = [[N]]`` and ``k_pos (1, N + 1) = 0..N``: key ``n`` is at distance
    ``N - n``."""
    k_pos = torch.arange(max_distance + 1, dtype=torch.long)[None]
    return k_pos[:, -1:], k_pos


def _check_encoding(encoding: object) -> Encoding:
    if not isinstance(encoding, Encoding):
        raise TypeError(f"encoding must be a relpos.Encoding, got {type(encoding).__name__}")
    return encoding


def sample_count(samples: int, head_dim: int, key_correlation: float = 1.0) -> int:
    """Random draws made for ``samples`` requested: rounded up to whole blocks of
    ``head_dim`` queries (twice that when keys carry noise, for the antithetic ``-w``)."""
    block = head_dim if key_correlation**2 == 1.0 else 2 * head_dim
    return -(-samples // block) * block


def _random_qk(
    samples: int, h: int, d: int, length: int, key_correlation: float, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Batches of queries ``q (S_b, H, 1, D)`` and keys ``(S_b, H, length, D)``,
    ``k = rho q + sqrt(1 - rho^2) w`` with ``w ~ N(0, I)`` per key.

    Variance reduction: queries come in blocks of ``D``, ``sqrt(D)`` times the columns of a
    Haar-random orthogonal matrix per head (each ``q`` is uniform on the sphere of radius
    ``sqrt(D)``, ``E[q q^T] = I``), and every noise ``w`` is used twice, as ``+w`` and ``-w``.
    For an encoding linear in q and k (``<R q, R' k> = q^T K k``) the mean over a block is
    then exactly ``rho tr(K)``, the expectation.
    """
    gen = torch.Generator().manual_seed(seed)
    noise = (1.0 - key_correlation**2) ** 0.5
    for _ in range(sample_count(samples, d, key_correlation) // (d if noise == 0 else 2 * d)):
        a = torch.randn(h, d, d, generator=gen, dtype=torch.float64)
        basis, r = torch.linalg.qr(a)
        basis = basis * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
        rows = (d**0.5 * basis.transpose(-1, -2)).transpose(0, 1)  # (D, H, D): sqrt(D) Q[:, s]
        for start in range(0, d, _SAMPLE_BATCH):
            q = rows[start : start + _SAMPLE_BATCH, :, None, :].float()
            k = key_correlation * q.expand(-1, -1, length, -1)
            if noise == 0:
                yield q, k.contiguous()
                continue
            w = noise * torch.randn(q.shape[0], h, length, d, generator=gen)
            yield q, k + w
            yield q, k - w


class _Draws(NamedTuple):
    enc: Encoding
    max_distance: int
    q_pos: Tensor
    k_pos: Tensor
    qk: Iterator[tuple[Tensor, Tensor]]  # lazy: ``_random_qk``
    count: int  # draws x heads: the divisor of the summed scores


def _draws(
    encoding: Encoding, max_distance: int, samples: int, key_correlation: float, seed: int
) -> _Draws:
    """The checked arguments of the Monte-Carlo means, the query / key positions (query at
    ``N``, keys at ``0..N``) and the random ``(q, k)`` batches."""
    enc = _check_encoding(encoding)
    max_distance = check_int(max_distance, "max_distance")
    samples = check_int(samples, "samples")
    rho = check_float(key_correlation, "key_correlation", minimum=-1.0, maximum=1.0)
    h, d = enc.num_heads, enc.head_dim
    q_pos, k_pos = _key_positions(max_distance)
    qk = _random_qk(samples, h, d, max_distance + 1, rho, seed)
    return _Draws(enc, max_distance, q_pos, k_pos, qk, sample_count(samples, d, rho) * h)


def expected_scores(
    encoding: Encoding,
    max_distance: int,
    *,
    samples: int = 256,
    key_correlation: float = 1.0,
    seed: int = 0,
) -> Tensor:
    """Monte-Carlo ``E <R(N) q, R(N - r) k>`` for ``r = 0..N = max_distance``, float64,
    averaged over heads (rotary part only, unscaled; see the module docstring)."""
    enc, max_distance, q_pos, k_pos, draws, count = _draws(
        encoding, max_distance, samples, key_correlation, seed
    )
    total = torch.zeros(max_distance + 1, dtype=torch.float64)
    for q, k in draws:
        qr, kr = _rotate(enc, q, k, q_pos, k_pos)
        total += (qr.double() * kr.double()).sum(-1).sum(dim=(0, 1))
    return total.flip(0) / count


def expected_logits(
    encoding: Encoding,
    max_distance: int,
    *,
    samples: int = 256,
    key_correlation: float = 1.0,
    seed: int = 0,
) -> Tensor:
    """Monte-Carlo mean logit ``E relpos.scores(q at N, k at N - r)``, ``r = 0..N = max_distance``
    (default scale and additive biases included), float64 ``(r,)``, averaged over heads."""
    from relpos.attention import scores

    enc, max_distance, q_pos, k_pos, draws, count = _draws(
        encoding, max_distance, samples, key_correlation, seed
    )
    total = torch.zeros(max_distance + 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed + 1)
    for q, k in draws:
        kw: dict[str, Any] = {}
        inputs = enc.example_inputs(q.shape[0], 1, max_distance + 1, gen)
        if inputs:  # encodings that read per-call inputs get valid random ones
            kw["inputs"] = inputs
        with _eager():
            logits = scores(
                q, k, enc, q_pos=_positions(enc, q_pos), k_pos=_positions(enc, k_pos), **kw
            )
        total += logits.double()[:, :, 0].sum(dim=(0, 1))
    return total.flip(0) / count


@dataclass(frozen=True)
class DecayCurves:
    """Decay curves of one encoding over ``distances = 0..max_distance``.

    ``bound``: RoFormer's relative upper bound ``(1/n_pairs) sum_j |S_j|`` (``None`` when
    the rotation is not pairwise, see ``note``); ``ones_score``: ``<R(N) 1, R(N - r) 1>``;
    ``expected_score``: Monte-Carlo ``E <R(N) q, R(N - r) k>`` (``samples`` draws made,
    ``key_correlation`` rho, ``seed``). All averaged over heads, float lists.
    """

    encoding: str
    num_heads: int
    head_dim: int
    distances: list[int]
    bound: list[float] | None
    ones_score: list[float]
    expected_score: list[float] | None
    samples: int
    key_correlation: float
    seed: int
    rotated_pairs: int
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decay_curves(
    encoding: Encoding,
    max_distance: int = 4096,
    *,
    samples: int = 256,
    key_correlation: float = 1.0,
    seed: int = 0,
) -> DecayCurves:
    """RoFormer's relative upper bound and the expected scores of ``encoding`` vs distance.

    Args:
        encoding: any relpos encoding (an encoding without rotation gives a flat bound).
        max_distance: the largest relative distance ``r`` (curves cover ``0..max_distance``).
        samples: random ``(q, k)`` draws for ``expected_score``, rounded up to whole blocks of
            ``head_dim`` (``2 head_dim`` when ``key_correlation**2 < 1``); see ``_random_qk``.
            0 skips the Monte-Carlo curve (``expected_score`` is then ``None``).
        key_correlation: ``rho`` in ``[-1, 1]``, ``k = rho q + sqrt(1 - rho^2) w``.
        seed: seed of the random draws.
    """
    enc = _check_encoding(encoding)
    max_distance = check_int(max_distance, "max_distance")
    samples = check_int(samples, "samples", minimum=0)
    rho = check_float(key_correlation, "key_correlation", minimum=-1.0, maximum=1.0)
    h, d = enc.num_heads, enc.head_dim
    q_pos, k_pos = _key_positions(max_distance)
    ones = torch.ones(1, h, 1, d)
    qr, kr = _rotate(
        enc, ones, ones.expand(-1, -1, max_distance + 1, -1).contiguous(), q_pos, k_pos
    )
    qr, kr = qr.double()[0], kr.double()[0].flip(1)  # (H, 1, D), (H, R, D) with R = distance
    ones_score = (qr * kr).sum(-1).mean(0)

    structure = pair_structure(enc)
    bound = None
    if structure.pairs is not None:
        phasors = []
        for a, b in structure.pairs:
            if b < 0:  # a lone channel: a real "pair"
                phasors.append(qr[..., a] * kr[..., a])
                continue
            zq = torch.complex(qr[..., a], qr[..., b])
            zk = torch.complex(kr[..., a], kr[..., b])
            phasors.append(zq * zk.conj() / 2.0)  # h = (1 + i)(1 - i) = 2 for all-ones pairs
        partial = torch.cumsum(torch.stack(phasors, dim=-1), dim=-1)  # S_j: (H, R, pairs)
        bound = partial.abs().mean(-1).mean(0).tolist()
    expected = None
    if samples:
        expected = expected_scores(
            enc, max_distance, samples=samples, key_correlation=rho, seed=seed
        ).tolist()
    return DecayCurves(
        encoding=enc.name or type(enc).__name__,
        num_heads=h,
        head_dim=d,
        distances=list(range(max_distance + 1)),
        bound=bound,
        ones_score=ones_score.tolist(),
        expected_score=expected,
        samples=sample_count(samples, d, rho) if samples else 0,
        key_correlation=rho,
        seed=seed,
        rotated_pairs=sum(structure.rotated) if structure.rotated is not None else 0,
        note=structure.reason,
    )


def plot_decay(curves: Sequence[DecayCurves], path: str | Path) -> None:
    """Two panels vs relative distance: the RoFormer bound and the expected similar-key score
    (normalised by its value at distance 0). Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curves:
        raise ValueError("curves must not be empty")
    fig, (ax_b, ax_e) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    colors = plt.get_cmap("tab10")
    for n, c in enumerate(curves):
        color = colors(n % 10)
        if c.bound is not None:
            ax_b.plot(c.distances, c.bound, color=color, linewidth=1.0, label=c.encoding)
        if c.expected_score is None:
            continue
        e0 = c.expected_score[0] if c.expected_score[0] != 0 else 1.0
        ax_e.plot(
            c.distances,
            [v / e0 for v in c.expected_score],
            color=color,
            linewidth=0.8,
            label=c.encoding,
        )
    ax_b.set_title("RoFormer relative upper bound (1/(d/2)) sum_j |S_j|", fontsize=10)
    ax_b.set_ylabel("bound")
    rho = curves[0].key_correlation
    keys = "k = q, a similar key" if rho == 1.0 else f"k = {rho:g} q + noise"
    ax_e.set_title(f"expected <R q, R k> / value at 0 ({keys})", fontsize=10)
    ax_e.axhline(0.0, color="0.5", linewidth=0.6)
    for ax in (ax_b, ax_e):
        ax.set_xlabel("relative distance")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8, frameon=False)
    d = curves[0].head_dim
    fig.suptitle(f"long-term decay, head_dim {d}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
