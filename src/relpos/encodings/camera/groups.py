"""Query cameras of a call, for the query-grouped camera encodings (RayRoPE, WorldRoPE).

A query-grouped encoding expresses every key in the frame of the *query's* camera, so the
engine runs one attention per query group (``relpos.encodings.base.QueryGroups``).

* ``query_camera_groups`` finds the distinct query cameras of the whole call: the distinct
  rows of the query side's world-to-camera matrices and (normalised or pixel) intrinsics.
  Shapes: ``viewmats (B, Lq, 4, 4)``, ``Ks (B, Lq, 3, 3)`` or None -> ``cameras (G, 4, 4)``,
  ``intrinsics (G, 3, 3)`` or None, ``index (B, Lq)`` int64 (the group of each query).
* ``row_camera_groups`` groups per batch row: group ``g`` is the ``g``-th distinct camera
  *of each row* (rows are independent scenes), so a batch of ``S`` scenes of ``V`` views
  costs ``V`` attentions, not ``S V``. Shapes: ``cameras (G, B, 4, 4)``, ``intrinsics (G, B,
  3, 3)`` or None, ``index (B, Lq)``; ``G`` is the most cameras of any row, and a row with
  fewer repeats its first camera in the groups it does not use (no query selects them).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["query_camera_groups", "row_camera_groups"]


def _camera_keys(viewmats: Tensor, Ks: Tensor | None) -> Tensor:
    """``(B, Lq, 16 [+ 9])``: each query's camera as one row of numbers."""
    batch, length = viewmats.shape[:2]
    rows = [viewmats.reshape(batch, length, 16)]
    if Ks is not None:
        rows.append(Ks.reshape(batch, length, 9))
    return torch.cat(rows, -1)


def _too_many(name: str, count: int, limit: int, where: str) -> ValueError:
    return ValueError(
        f"encoding {name!r} runs one attention per query camera: this call has {count} "
        f"distinct query cameras{where}, above group_limit={limit}"
    )


def query_camera_groups(
    viewmats: Tensor, Ks: Tensor | None, limit: int, name: str
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The distinct query cameras ``(cameras, intrinsics, index)`` of the call (module
    docstring); a ``ValueError`` naming the encoding and ``group_limit`` when there are more
    than ``limit`` (each costs one attention)."""
    batch, length = viewmats.shape[:2]
    key = _camera_keys(viewmats, Ks)
    key = key.reshape(batch * length, key.shape[-1])  # explicit width: empty calls too
    cams, index = torch.unique(key, dim=0, return_inverse=True)
    if cams.shape[0] > limit:
        raise _too_many(name, cams.shape[0], limit, "")
    views = cams[:, :16].reshape(-1, 4, 4)
    intrinsics = cams[:, 16:].reshape(-1, 3, 3) if Ks is not None else None
    return views, intrinsics, index.reshape(batch, length)


def row_camera_groups(
    viewmats: Tensor, Ks: Tensor | None, limit: int, name: str
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The distinct query cameras of each batch row ``(cameras (G, B, 4, 4), intrinsics (G,
    B, 3, 3) | None, index (B, Lq))`` (module docstring); a ``ValueError`` naming the
    encoding and ``group_limit`` when a row has more than ``limit`` cameras."""
    batch, length = viewmats.shape[:2]
    key = _camera_keys(viewmats, Ks)
    width = key.shape[-1]
    if batch * length == 0:
        empty = key.new_zeros(0, batch, width)
        index = torch.zeros(batch, length, dtype=torch.long, device=key.device)
        return _split(empty, Ks is not None) + (index,)
    row = torch.arange(batch, device=key.device, dtype=key.dtype)
    tagged = torch.cat((row[:, None, None].expand(batch, length, 1), key), -1)
    # unique rows sort lexicographically, so each batch row's cameras are contiguous
    cams, inverse = torch.unique(tagged.reshape(batch * length, -1), dim=0, return_inverse=True)
    owner = cams[:, 0].long()
    counts = torch.bincount(owner, minlength=batch)
    start = counts.cumsum(0) - counts
    groups = int(counts.max())
    if groups > limit:
        raise _too_many(name, groups, limit, " in one batch row")
    rank = torch.arange(cams.shape[0], device=key.device) - start[owner]
    table = cams[start, 1:][None].repeat(groups, 1, 1)  # each row's first camera
    table[rank, owner] = cams[:, 1:]
    index = inverse.reshape(batch, length) - start[:, None]
    return _split(table, Ks is not None) + (index,)


def _split(table: Tensor, with_K: bool) -> tuple[Tensor, Tensor | None]:
    G, B = table.shape[:2]
    views = table[..., :16].reshape(G, B, 4, 4)
    return views, table[..., 16:].reshape(G, B, 3, 3) if with_K else None
