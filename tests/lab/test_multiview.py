"""relpos_lab.tasks.scenes: the synthetic multi-view scenes and their
correspondence labels (depth-consistent reprojection)."""

from __future__ import annotations

import pytest
import torch

from relpos import cameras
from relpos_lab.tasks import scenes as multiview


@pytest.fixture(scope="module")
def scene():
    return multiview.make_scenes(24, seed=3)


def test_scenes_are_deterministic_per_seed(scene):
    again = multiview.make_scenes(24, seed=3)
    assert all(torch.equal(scene[k], again[k]) for k in scene)
    other = multiview.make_scenes(24, seed=4)
    assert not torch.equal(scene["points"], other["points"])
    assert not torch.equal(scene["label"], other["label"])


def test_shapes_and_conventions(scene):
    S, T = 24, 3 * 16
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


def test_cast_finds_the_first_sphere_entered():
    o = torch.zeros(1, 1, 3, dtype=torch.float64)
    d = torch.tensor([[[0.0, 0.0, 1.0]]], dtype=torch.float64)
    # a far big sphere whose surface is nearer than a small sphere's closest approach
    pts = torch.tensor([[[0.0, 0.05, 5.0], [0.0, 0.0, 4.0], [0.0, 2.0, 1.0]]], dtype=torch.float64)
    idx, entry = multiview._cast(o, d, pts, 0.5)
    assert int(idx) == 1 and float(entry) == pytest.approx(3.5)
    idx, entry = multiview._cast(o, -d, pts, 0.5)  # behind the camera: nothing
    assert int(idx) == -1 and entry.isinf().all()


def test_label_rate_is_useful_at_the_defaults_and_not_at_the_spec_settings():
    rate = multiview.label_rate(multiview.make_scenes(64, seed=0))
    assert rate >= 0.20, rate  # measured 0.25 on 256 scenes
    spec = multiview.make_scenes(16, points=512, point_radius=0.07, fov_deg=(45, 65), seed=0)
    assert multiview.label_rate(spec) < 0.02  # the first design's settings: under 1 % labelled


def test_labels_point_at_visible_context_tokens_that_see_the_same_sphere(scene):
    label, hit = scene["label"], scene["hit_id"]
    ok = label >= 0
    assert bool(ok.any()) and bool((label < 32).all()) and bool((label >= -1).all())
    # the labelled context token sees the same sphere: the same colour, so appearance matches
    assert torch.equal(torch.gather(hit, 1, label.clamp_min(0))[ok], hit[:, 32:][ok])
    assert torch.equal(
        scene["feat"].argmax(-1).gather(1, label.clamp_min(0))[ok],
        scene["feat"][:, 32:].argmax(-1)[ok],
    )
    # unlabelled target tokens include every background one
    assert bool((label[hit[:, 32:] < 0] == -1).all())
    # same-colour distractors exist: appearance alone does not give the label
    cid = scene["feat"].argmax(-1)
    same = (cid[:, :32][:, None, :] == cid[:, 32:][:, :, None]).sum(-1)
    assert float(same[ok].double().mean()) > 2.0


def test_occluded_points_get_no_label():
    # context camera at +x, target camera at -z, both looking at sphere 0 at the origin;
    # sphere 1 sits between the context camera and sphere 0 (hidden) or far behind it
    look = cameras.look_at(
        torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, -3.0]]], dtype=torch.float64),
        torch.zeros(1, 2, 3, dtype=torch.float64),
    )
    K = cameras.intrinsics(40.0, 40.0, 16.0, 16.0).expand(1, 2, 3, 3).clone()
    for hidden in (False, True):
        pts = [[0.0, 0.0, 0.0], [1.5 if hidden else -30.0, 0.0, 0.0]]
        scene = {"points": torch.tensor([pts], dtype=torch.float64), "viewmats": look, "Ks": K}
        o, d = multiview.scene_rays(look, K, 4, 32)
        scene["rays_o"], scene["rays_d"] = o, d
        scene["hit_id"] = multiview._cast(o, d, scene["points"], 0.8)[0]
        label = multiview.correspondence_labels(scene, 4, 32, 0.8, 8.0)
        seen = scene["hit_id"][0, 16:] == 0
        assert int(seen.sum()) == 4  # the four central target patches see sphere 0
        if hidden:
            assert bool((label[0][seen] == -1).all())
        else:
            assert bool((label[0][seen] >= 0).all())
            assert bool((scene["hit_id"][0, label[0][seen]] == 0).all())


def test_labels_are_exactly_invariant_to_a_rigid_world_change(scene):
    gen = torch.Generator().manual_seed(1)
    for G in cameras.random_se3(3, translation_std=5.0, generator=gen):
        moved = multiview.apply_world_transform(scene, G)
        hit, _ = multiview._cast(moved["rays_o"], moved["rays_d"], moved["points"], 0.25)
        assert torch.equal(hit, scene["hit_id"])
        labels = multiview.correspondence_labels(moved, 4, 32, 0.25, 8.0)
        assert torch.equal(labels, scene["label"])
        assert float((moved["plucker"] - scene["plucker"]).abs().max()) > 0.1  # not invariant
    ref = multiview.set_reference(moved, 0)
    eye = torch.eye(4, dtype=torch.float64).expand(24, 4, 4)
    torch.testing.assert_close(ref["viewmats"][:, 0], eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(ref["plucker"], multiview.set_reference(scene, 0)["plucker"])
    assert torch.equal(multiview.correspondence_labels(ref, 4, 32, 0.25, 8.0), scene["label"])


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="views"):
        multiview.make_scenes(2, views=1)
    with pytest.raises(ValueError, match="fov_deg"):
        multiview.make_scenes(2, fov_deg=(45.0, 190.0))
    with pytest.raises(ValueError, match="pixel_radius"):
        multiview.make_scenes(2, pixel_radius=0.0)
