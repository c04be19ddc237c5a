"""Target-feature regression ("tiny NVS"), the secondary task of the multiview experiment: can the
model say what the target view shows from the context views and the cameras alone?

**Task.** The scenes, conditions and model specs of ``correspondence`` (2 context views with
their appearance features, 1 target view, ``grid^2`` patch tokens each). The target view's
tokens get *no* appearance features (their feature rows are zeros): they carry only the
role embedding and what the position scheme gives them (their rays: the camera encoding in
attention, or the Plücker embedding). The ``MultiviewEncoder`` trunk is followed by a linear
head that regresses each target token's appearance ``y``: the noise-free one-hot colour of
the sphere its patch-centre ray hits first, or the background class (``appearance``; width
palette + 1; the inputs' ``N(0, 0.05^2)`` noise is not a target, it would only add a floor).
Loss: the mean squared error over all target tokens (background ones too).

**Metric.** ``NMSE = sum ||y_hat - y||^2 / sum ||y - mean(y)||^2`` pooled over the target
tokens of all test scenes that see a sphere (``hit_id >= 0``; the mean over the same tokens),
so predicting the mean colour scores 1 and a perfect prediction 0 (``nmse``). A second
number, ``nmse_labelled``, pools only the target tokens that have a correspondence label (the
sphere is visible and unoccluded in a context view: ``multiview.correspondence_labels``), the
tokens whose colour the context *can* tell; the other sphere tokens are occluded or out of
the context views, and their colour is only guessable from the palette's frequencies.
Lower is better. Relative ``se3_invariant`` encodings score the same under every condition
up to float32 rounding; world-frame Plücker rays do not.

Shapes: ``appearance (S, T, F)``; ``FeatureRegressionModel.forward(batch) -> (B, P, F)``;
``NMSESums`` pools per-feature sums over batches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .correspondence import MultiviewEncoder, ViewBatch

__all__ = [
    "appearance",
    "hide_targets",
    "FeatureRegressionModel",
    "regression_loss",
    "NMSESums",
]


def appearance(scene: dict[str, Tensor]) -> Tensor:
    """The noise-free appearance ``(S, T, palette + 1)`` of every token: the one-hot colour
    of the first sphere on its centre ray, the last class for background."""
    width = scene["feat"].shape[-1]
    hit = scene["hit_id"]
    colour = torch.gather(scene["colour"], 1, hit.clamp_min(0))
    cid = torch.where(hit >= 0, colour, torch.full_like(colour, width - 1))
    return nn.functional.one_hot(cid, width).float()


def hide_targets(batch: ViewBatch) -> ViewBatch:
    """The batch with the target view's feature rows set to zero (positions, rays, cameras
    and labels unchanged)."""
    feat = batch.feat.clone()
    feat[:, batch.context :] = 0.0
    return dataclasses.replace(batch, feat=feat)


class FeatureRegressionModel(MultiviewEncoder):
    """The ``MultiviewEncoder`` trunk (same arguments) and a linear head ``dim -> feat_dim``
    on the target tokens: ``forward(batch) -> (B, P, feat_dim)`` predicted appearance. Give
    it ``hide_targets(batch)``."""

    def __init__(self, feat_dim: int, **options: Any) -> None:
        super().__init__(feat_dim, **options)
        self.head = nn.Linear(self.dim, feat_dim)

    def forward(self, batch: ViewBatch) -> Tensor:
        return self.head(self.encode(batch)[:, batch.context :])


def regression_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error over every target token and feature: ``pred, target (B, P, F)``."""
    return nn.functional.mse_loss(pred, target)


@dataclass
class NMSESums:
    """Pooled sums for ``NMSE = SSE / (sum ||y||^2 - ||sum y||^2 / n)`` over the selected
    tokens of many batches (``add``, then ``nmse``)."""

    sse: float = 0.0
    n: int = 0
    total: Tensor | None = None  # (F,) sum of y, float64
    squares: float = 0.0  # sum ||y||^2

    def add(self, pred: Tensor, target: Tensor, select: Tensor) -> None:
        """Add the tokens ``select (B, P)`` of ``pred, target (B, P, F)``."""
        y = target[select].to(torch.float64)
        p = pred[select].to(torch.float64)
        self.sse += float(((p - y) ** 2).sum())
        self.n += int(y.shape[0])
        s = y.sum(0)
        self.total = s if self.total is None else self.total + s
        self.squares += float((y**2).sum())

    def variance_sum(self) -> float:
        """``sum ||y - mean(y)||^2`` over the pooled tokens."""
        if self.n == 0 or self.total is None:
            return 0.0
        return self.squares - float((self.total**2).sum()) / self.n

    def nmse(self) -> float:
        """The normalised MSE (``nan`` when no token was selected or the targets are all
        equal)."""
        var = self.variance_sum()
        return self.sse / var if var > 0 else float("nan")
