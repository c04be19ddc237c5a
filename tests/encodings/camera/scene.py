"""The reference scene of the camera tests: two cameras looking at the origin, 2x2
patches per view, D = 16, fixed q and k."""

from __future__ import annotations

import torch

from relpos import cameras

K_PIX = torch.tensor([[40.0, 0, 16], [0, 40, 16], [0, 0, 1]], dtype=torch.float64)
IMAGE = (32.0, 32.0)


def camera_a() -> torch.Tensor:
    return cameras.look_at(torch.tensor([0.0, 0, -3], dtype=torch.float64))


def camera_b() -> torch.Tensor:
    return cameras.look_at(torch.tensor([2.0, 0.5, -2], dtype=torch.float64))


def world_G() -> torch.Tensor:
    """Rotation 1.1 rad about (0.3, -1, 0.2), translation (5, -2, 7)."""
    G = torch.eye(4, dtype=torch.float64)
    G[:3, :3] = cameras.rotation_about((0.3, -1.0, 0.2), 1.1)
    G[:3, 3] = torch.tensor([5.0, -2.0, 7.0], dtype=torch.float64)
    return G


def tokens() -> dict:
    """Tokens A0..A3, B0..B3 (x fastest): per-token viewmats, Ks and (x, y) positions."""
    view = torch.stack([camera_a()] * 4 + [camera_b()] * 4)[None]
    Ks = K_PIX.expand(1, 8, 3, 3)
    xy = torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1]] * 2)[None]
    return {"viewmats": view, "Ks": Ks, "xy": xy}


def qk() -> tuple[torch.Tensor, torch.Tensor]:
    """``q[l, c] = cos(.7 l + .3 c)``, ``k[l, c] = sin(.5 l - .2 c + .1)``: (1, 1, 8, 16)."""
    l_ = torch.arange(8.0, dtype=torch.float64)[:, None]
    c = torch.arange(16.0, dtype=torch.float64)[None]
    return torch.cos(0.7 * l_ + 0.3 * c)[None, None], torch.sin(0.5 * l_ - 0.2 * c + 0.1)[
        None, None
    ]
