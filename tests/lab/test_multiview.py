"""relpos.lab.multiview: the synthetic multi-view scenes (camera spec §4)."""

from __future__ import annotations

import pytest
import torch

from relpos import cameras
from relpos.lab import multiview


@pytest.fixture(scope="module")
def scene():
    return multiview.make_scenes(6, points=256, point_radius=0.25, seed=3)


def test_scenes_are_deterministic_per_seed(scene):
    again = multiview.make_scenes(6, points=256, point_radius=0.25, seed=3)
    assert all(torch.equal(scene[k], again[k]) for k in scene)
    other = multiview.make_scenes(6, points=256, point_radius=0.25, seed=4)
    assert not torch.equal(scene["points"], other["points"])


def test_shapes_and_conventions(scene):
    S, T = 6, 3 * 16
    assert scene["viewmats"].shape == (S, 3, 4, 4) and scene["Ks"].shape == (S, 3, 3, 3)
    assert scene["feat"].shape == (S, T, 7) and scene["plucker"].shape == (S, T, 6)
    assert scene["label"].shape == (S, 16)
    cameras.check_viewmats(scene["viewmats"])
    cameras.check_intrinsics(scene["Ks"])
    # cameras on the shell, looking towards the scene: the origin is in front of every camera
    r = cameras.camera_centers(scene["viewmats"]).norm(dim=-1)
    assert float(r.min()) >= 2.5 and float(r.max()) <= 3.5
    assert bool((scene["viewmats"][..., 2, 3] > 0).all())
    # the feature's argmax is the colour of the hit sphere (or background)
    hit = scene["hit_id"]
    colour = torch.where(hit >= 0, torch.gather(scene["colour"], 1, hit.clamp_min(0)), 6)
    assert torch.equal(scene["feat"].argmax(-1), colour)
    assert bool((scene["depth"][hit >= 0] > 0).all())


def test_labels_point_at_context_tokens_that_see_the_same_sphere(scene):
    label, hit = scene["label"], scene["hit_id"]
    ok = label >= 0
    assert bool(ok.any()) and bool((label < 32).all())
    assert torch.equal(torch.gather(hit, 1, label.clamp_min(0))[ok], hit[:, 32:][ok])


def test_world_transform_and_reference_keep_images_and_labels(scene):
    G = cameras.random_se3(1, translation_std=5.0, generator=torch.Generator().manual_seed(1))[0]
    moved = multiview.apply_world_transform(scene, G)
    hit, _ = multiview._cast(moved["rays_o"], moved["rays_d"], moved["points"], 0.25)
    assert torch.equal(hit, scene["hit_id"])
    assert torch.equal(multiview._labels(moved, 4, 32), scene["label"])
    assert float((moved["plucker"] - scene["plucker"]).abs().max()) > 0.1  # not invariant
    ref = multiview.set_reference(moved, 0)
    eye = torch.eye(4, dtype=torch.float64).expand(6, 4, 4)
    torch.testing.assert_close(ref["viewmats"][:, 0], eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(ref["plucker"], multiview.set_reference(scene, 0)["plucker"])


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="views"):
        multiview.make_scenes(2, views=1)
    with pytest.raises(ValueError, match="fov_deg"):
        multiview.make_scenes(2, fov_deg=(45.0, 190.0))
