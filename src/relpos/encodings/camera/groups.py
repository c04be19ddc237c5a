"""Query cameras of a call, for the query-grouped camera encodings (RayRoPE, WorldRoPE).

A query-grouped encoding expresses every key in the frame of the *query's* camera, so the
engine runs one attention per distinct query camera (``relpos.encodings.base.QueryGroups``).
``query_camera_groups`` finds those cameras once per call: the distinct rows of the query
side's world-to-camera matrices and (normalised or pixel) intrinsics.

Shapes: ``viewmats (B, Lq, 4, 4)``, ``Ks (B, Lq, 3, 3)`` or None -> ``cameras (G, 4, 4)``,
``intrinsics (G, 3, 3)`` or None, ``index (B, Lq)`` int64 (the group of each query).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["query_camera_groups"]


def query_camera_groups(
    viewmats: Tensor, Ks: Tensor | None, limit: int, name: str
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The distinct query cameras ``(cameras, intrinsics, index)`` (module docstring); a
    ``ValueError`` naming the encoding and ``group_limit`` when there are more than
    ``limit`` (each costs one attention)."""
    batch, length = viewmats.shape[:2]
    rows = [viewmats.reshape(batch * length, 16)]
    if Ks is not None:
        rows.append(Ks.reshape(batch * length, 9))
    key = torch.cat(rows, -1)
    cams, index = torch.unique(key, dim=0, return_inverse=True)
    if cams.shape[0] > limit:
        raise ValueError(
            f"encoding {name!r} runs one attention per query camera: this call has "
            f"{cams.shape[0]} distinct query cameras, above group_limit={limit}"
        )
    views = cams[:, :16].reshape(-1, 4, 4)
    intrinsics = cams[:, 16:].reshape(-1, 3, 3) if Ks is not None else None
    return views, intrinsics, index.reshape(batch, length)
