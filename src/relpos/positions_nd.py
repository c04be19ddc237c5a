"""Position ids for m-D encodings: grids, multimodal (M-RoPE) ids, scale-normalised grids
and hierarchical (token / sentence / paragraph) ids.

Every helper returns a tensor ``(L, m)`` (add a batch axis for per-sample positions) that
``relpos.attention`` accepts as ``q_pos`` / ``k_pos`` for an encoding with ``dims = m``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_choice, check_float, check_int


def _sizes(sizes: Sequence[int], name: str) -> list[int]:
    """One or more positive int sizes (``TypeError`` for a non-int, ``ValueError`` else)."""
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(f"{name} must be a tuple of positive int sizes, got {sizes!r}")
    if not sizes:
        raise ValueError(f"{name} must be one or more positive sizes, got {list(sizes)}")
    return [check_int(s, f"{name}[{i}]") for i, s in enumerate(sizes)]


def grid_positions(*sizes: int, start: Sequence[int] | int = 0) -> Tensor:
    """Coordinates of a row-major grid: ``grid_positions(T, H, W)`` -> ``(T*H*W, 3)`` with
    rows ``(t, h, w)``, the last axis fastest (patch order of ViT and video models)."""
    dims = _sizes(sizes, "sizes")
    axes = torch.meshgrid(*(torch.arange(n) for n in dims), indexing="ij")
    out = torch.stack([a.reshape(-1) for a in axes], dim=-1)
    offset = torch.as_tensor(start, dtype=torch.long)
    return out + offset


def multimodal_position_ids(
    segments: Sequence[tuple], *, spatial_merge: int = 1, text_after: str = "max_id"
) -> Tensor:
    """(temporal, height, width) ids of Qwen2-VL's M-RoPE for a sequence of segments.

    ``segments``: ``("text", n)`` for ``n`` text tokens, ``("image", (h, w))`` or
    ``("video", (t, h, w))`` / ``("video", (t, h, w), interval)`` for a vision grid (patches,
    before ``spatial_merge``). Text tokens get the running position on all three axes. A
    vision grid starting at ``st`` gets ``(st + t * interval, st + h, st + w)`` for its merged
    grid ``(t, h / m, w / m)`` (``interval`` 1 for Qwen2-VL; ``tokens_per_second *
    second_per_grid`` for Qwen2.5-VL). Text after a grid resumes at ``max(all grid ids) + 1``
    (``text_after="max_id"``, original Qwen2-VL) or ``st + max(h, w)`` (``"max_hw"``, HF 5.x;
    the two agree for images). Returns ``(L, 3)`` int64.
    """
    check_choice(text_after, "text_after", ("max_id", "max_hw"))
    check_int(spatial_merge, "spatial_merge")
    parts: list[Tensor] = []
    st = 0
    for seg in segments:
        if not isinstance(seg, tuple) or len(seg) < 2:
            raise ValueError(f"each segment must be ('text', n) or (kind, grid[, interval]): {seg}")
        kind = seg[0]
        if kind == "text":
            n = check_int(seg[1], "text segment length", minimum=0)
            ids = torch.arange(st, st + n)
            parts.append(ids[:, None].expand(n, 3))
            st += n
            continue
        if kind not in ("image", "video"):
            raise ValueError(f"segment kind must be 'text', 'image' or 'video', got {kind!r}")
        grid = _sizes(seg[1], f"{kind} grid")
        if kind == "image":
            if len(grid) != 2:
                raise ValueError(f"image grid must be (h, w), got {grid}")
            grid = [1, *grid]
        if len(grid) != 3:
            raise ValueError(f"video grid must be (t, h, w), got {grid}")
        t, h, w = grid[0], grid[1] // spatial_merge, grid[2] // spatial_merge
        if h < 1 or w < 1 or grid[1] % spatial_merge or grid[2] % spatial_merge:
            raise ValueError(f"grid {grid} is not divisible by spatial_merge={spatial_merge}")
        interval = check_float(seg[2], "video interval", above=0.0) if len(seg) > 2 else 1
        coords = grid_positions(t, h, w)
        tid = (coords[:, 0].double() * interval).long()
        ids = torch.stack((tid, coords[:, 1], coords[:, 2]), dim=-1) + st
        parts.append(ids)
        st = int(ids.max()) + 1 if text_after == "max_id" else st + max(h, w)
    if not parts:
        return torch.zeros(0, 3, dtype=torch.long)
    return torch.cat(parts).long()


def scale_positions(grids: Sequence[Sequence[int]]) -> Tensor:
    """Normalised (row / ph, col / pw) coordinates of every token of scale-wise grids
    ``[(ph_1, pw_1), (ph_2, pw_2), ...]`` (STAR / Infinity): ``(sum ph*pw, 2)`` float64, for
    ``rope-2d-normalized`` whose ``reference_grid`` is the largest grid."""
    out = []
    for g in grids:
        ph, pw = _sizes(g, "grid")
        coords = grid_positions(ph, pw).double()
        out.append(coords / torch.tensor([ph, pw], dtype=torch.float64))
    if not out:
        raise ValueError("grids must hold at least one (rows, cols) grid")
    return torch.cat(out)


def hierarchical_positions(sentence_ids: Tensor, paragraph_ids: Tensor) -> Tensor:
    """(token, sentence, paragraph) ids ``(L, 3)`` for ``rope-hierarchical`` from per-token
    sentence and paragraph indices ``(L,)`` (non-decreasing integers)."""
    for name, t in (("sentence_ids", sentence_ids), ("paragraph_ids", paragraph_ids)):
        if not isinstance(t, Tensor) or t.dim() != 1 or t.is_floating_point():
            raise ValueError(f"{name} must be an integer tensor (L,), got {t!r}")
        if t.numel() > 1 and bool((t[1:] < t[:-1]).any()):
            raise ValueError(f"{name} must be non-decreasing")
    if sentence_ids.shape != paragraph_ids.shape:
        raise ValueError(
            f"sentence_ids and paragraph_ids must have one shape, got "
            f"{tuple(sentence_ids.shape)} and {tuple(paragraph_ids.shape)}"
        )
    token = torch.arange(sentence_ids.numel(), device=sentence_ids.device)
    return torch.stack((token, sentence_ids.long(), paragraph_ids.long()), dim=-1)
