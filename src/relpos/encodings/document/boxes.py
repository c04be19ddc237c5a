"""Word bounding boxes as per-call inputs: the shared base of the document-layout encodings
(LayoutLMv2, DocPolarBERT), box validation, and small box helpers.

Boxes arrive per call as ``relpos.attention(..., inputs={"boxes": (B|1, Lk, 4)})``: integer
``(x0, y0, x1, y1)`` of every key token (LayoutLM's page coordinates ``0..1000``; y grows
downwards). Queries are the last ``Lq`` tokens of the keys (the default positions' rule, so a
KV-cache step reads the same boxes), or ``inputs["query_boxes"] (B|1, Lq, 4)`` when given.
1-D token positions are the usual ``q_pos`` / ``k_pos``. Relative positions are key minus
query (``j - i``), as in both official codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..base import Encoding

__all__ = [
    "BOX_FORM",
    "QUERY_BOX_FORM",
    "example_boxes",
    "box_centres",
    "padding_boxes",
    "check_boxes",
    "QueryKeyBoxes",
    "BoxEncoding",
]

BOX_FORM = "(B|1, Lk, 4) integer boxes (x0, y0, x1, y1) of the keys, x0 <= x1, y0 <= y1"
QUERY_BOX_FORM = "(B|1, Lq, 4) integer boxes of the queries (default: the last Lq key boxes)"


def example_boxes(batch: int, length: int, generator: torch.Generator) -> Tensor:
    """Random word boxes ``(batch, length, 4)`` on a 1000 x 1000 page; token 0 has the
    ``[0, 0, 0, 0]`` box of a special token (CLS). Drawn token by token, so the boxes of
    the first ``n`` tokens do not depend on ``length`` (KV-cache tests)."""
    raw = torch.randint(0, 10_000, (length, batch, 4), generator=generator)
    x0, y0 = raw[..., 0] % 900, raw[..., 1] % 950
    x1, y1 = x0 + raw[..., 2] % 100, y0 + raw[..., 3] % 40
    boxes = torch.stack((x0, y0, x1, y1), dim=-1).transpose(0, 1).contiguous()
    boxes[:, :1] = 0
    return boxes


def box_centres(boxes: Tensor) -> Tensor:
    """``((x0 + x1) / 2, (y0 + y1) / 2)``: ``(..., 2)`` float32 (exact for coordinates below
    2^23)."""
    return (boxes[..., :2] + boxes[..., 2:]).to(torch.float32) / 2


def padding_boxes(boxes: Tensor) -> Tensor:
    """Tokens without a box (special tokens, padding): ``x0 == x1`` and ``y0 == y1``."""
    return (boxes[..., 0] == boxes[..., 2]) & (boxes[..., 1] == boxes[..., 3])


def check_boxes(boxes: object, name: str, form: str, batch: int, length: int) -> Tensor:
    """``boxes`` checked against ``form`` and expanded to ``(batch, length, 4)``.

    ``TypeError`` for a non-tensor or a non-integer dtype (floating boxes, NaN included, are
    refused: box coordinates are integer page units); ``ValueError`` for a wrong shape, a
    batch that is neither 1 nor ``batch``, or a box with ``x1 < x0`` or ``y1 < y0``. Every
    message names ``name``."""
    if not isinstance(boxes, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {form}, got {type(boxes).__name__}")
    if boxes.is_floating_point() or boxes.is_complex() or boxes.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor {form}, got dtype {boxes.dtype}")
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"{name} must have shape {form}, got {tuple(boxes.shape)}")
    if boxes.shape[1] != length or boxes.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} has shape {tuple(boxes.shape)} but the call has batch {batch} and "
            f"length {length}; expected {form}"
        )
    if bool((boxes[..., 2] < boxes[..., 0]).any() or (boxes[..., 3] < boxes[..., 1]).any()):
        raise ValueError(f"{name} must have x0 <= x1 and y0 <= y1 in every box ({form})")
    return boxes.expand(batch, -1, -1)


@dataclass
class QueryKeyBoxes:
    """Validated boxes of one call on the queries' device: ``query (B, Lq, 4)``,
    ``key (B, Lk, 4)`` (contiguous, integer)."""

    query: Tensor
    key: Tensor


class BoxEncoding(Encoding):
    """Base of the document-layout encodings: reads ``inputs["boxes"]`` (and the optional
    ``inputs["query_boxes"]``) through ``query_key_boxes``.

    ``relative``: the 1-D terms read ``q_pos - k_pos``; the box terms do not read positions
    at all, so shifting the positions never changes the scores."""

    has_bias = True
    relative = True
    required_inputs: ClassVar[dict[str, str]] = {"boxes": BOX_FORM}
    optional_inputs: ClassVar[dict[str, str]] = {"query_boxes": QUERY_BOX_FORM}

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        return {"boxes": example_boxes(batch, length_k, generator)}

    def query_key_boxes(self, q: Tensor, k: Tensor, inputs: dict[str, Tensor]) -> QueryKeyBoxes:
        """The call's validated query and key boxes (``check_boxes``)."""
        if "boxes" not in inputs:
            raise ValueError(f"encoding {self.name!r} needs inputs={{'boxes': {BOX_FORM}}}")
        batch, lq, lk = q.shape[0], q.shape[2], k.shape[2]
        keys = check_boxes(inputs["boxes"], "inputs['boxes']", BOX_FORM, batch, lk)
        if "query_boxes" in inputs:
            queries = check_boxes(
                inputs["query_boxes"], "inputs['query_boxes']", QUERY_BOX_FORM, batch, lq
            )
        elif lq <= lk:
            queries = keys[:, lk - lq :]
        else:
            raise ValueError(
                f"more queries ({lq}) than keys ({lk}): pass inputs['query_boxes'] {QUERY_BOX_FORM}"
            )
        return QueryKeyBoxes(
            query=queries.to(q.device).contiguous(), key=keys.to(q.device).contiguous()
        )
