"""``relpos tasks --suite multiview``: the correspondence task (model, conditions, metric),
RayRoPE with known depth, the target-feature regression task (``nvs``), tiny end-to-end
runs, resume, ``--first-seed``, error paths."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from relpos_lab.cli import main
from relpos_lab.tasks import correspondence as cc
from relpos_lab.tasks import jobs as jobs_module
from relpos_lab.tasks import multiview_report as mv_report
from relpos_lab.tasks import multiview_suite as suite
from relpos_lab.tasks import nvs
from relpos_lab.tasks import scenes as multiview
from relpos_lab.tasks.jobs import run_job
from relpos_lab.tasks.plan import plan_tasks
from relpos_lab.training import checkpoint as ckpt

TINY = ("--dim", "16", "--depth", "1", "--heads", "2", "--batch", "4", "--steps", "3")
TINY += ("--eval-size", "8", "--jobs", "1", "--no-progress")


def _run(tmp_path: Path, *args: str) -> int:
    return main(["tasks", "--suite", "multiview", *TINY, "--out", str(tmp_path / "run"), *args])


def _rows(tmp_path: Path) -> list[dict]:
    with open(tmp_path / "run" / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def scenes():
    return multiview.make_scenes(6, seed=11)


def _logits(model: cc.CorrespondenceModel, scene, condition: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    batch = cc.view_batch(scene, model.encoding, model.plucker_scheme, condition=condition,
                          generator=gen)  # fmt: skip
    with torch.no_grad():
        return model(batch)


def _model(encoding: str, plucker: str | None = None, dim: int = 32) -> cc.CorrespondenceModel:
    torch.manual_seed(0)
    model = cc.CorrespondenceModel(7, dim=dim, depth=1, num_heads=2, encoding=encoding,
                                   plucker=plucker).eval()  # fmt: skip
    if model.plucker is not None:  # the embedding's output starts at zero: wake it up
        torch.nn.init.normal_(model.plucker.out.weight, std=0.5)
    return model


def test_relative_encodings_give_the_same_pointer_logits_under_every_condition(scenes):
    for name in ("prope", "gta", "cape-6dof"):
        model = _model(name)
        ref = _logits(model, scenes, "id")
        assert ref.shape == (6, 16, 32)
        for condition in ("rigid", "ref-swap", "rigid-2"):
            torch.testing.assert_close(_logits(model, scenes, condition), ref, rtol=1e-4,
                                       atol=1e-4)  # fmt: skip


def test_absolute_plucker_moves_with_the_world_and_first_camera_with_the_reference(scenes):
    world = _model("rope-axial", "plucker")
    ref = _logits(world, scenes, "id")
    assert float((_logits(world, scenes, "rigid") - ref).abs().max()) > 1e-2
    first = _model("rope-axial", "plucker-first")
    ref = _logits(first, scenes, "id")
    torch.testing.assert_close(_logits(first, scenes, "rigid"), ref, rtol=1e-4, atol=1e-4)
    assert float((_logits(first, scenes, "ref-swap") - ref).abs().max()) > 1e-2
    # NoPE reads neither positions nor cameras: the same logits everywhere
    nope = _model("nope")
    torch.testing.assert_close(_logits(nope, scenes, "rigid"), _logits(nope, scenes, "id"))


def test_rayrope_with_known_depth_reads_the_true_depth_and_is_invariant(scenes):
    assert cc.parse_model_spec("rayrope-known-depth") == ("rayrope", None)
    depth = cc.known_depth(scenes)
    hit = scenes["hit_id"] >= 0
    assert depth.shape == (*hit.shape, 2) and bool((depth[..., 1] == 0).all())
    torch.testing.assert_close(depth[..., 0][hit], scenes["depth"][hit].log())
    assert bool((depth[..., 0][~hit] == cc.BACKGROUND_LOG_DEPTH).all())
    model = _model("rayrope", dim=48)  # head 24: 3 rays x (3 + 1) coordinates, F = 1
    batch = cc.view_batch(scenes, model.encoding, None)
    assert torch.equal(batch.inputs["k_depth_logsigma"], depth)
    ref = _logits(model, scenes, "id")
    for condition in ("rigid", "ref-swap"):
        torch.testing.assert_close(_logits(model, scenes, condition), ref, rtol=1e-4, atol=1e-4)
    # the depth matters: a wrong depth changes the logits
    moved = dict(scenes, depth=scenes["depth"] * 1.5)
    assert float((_logits(model, moved, "id") - ref).abs().max()) > 1e-3


def test_rayrope_groups_per_batch_row_cost_one_attention_per_view(scenes):
    enc = _model("rayrope", dim=48).encoding
    batch = cc.view_batch(scenes, enc, None)
    groups = enc.prepare_rotary(batch.pos, batch.pos, batch.inputs).groups
    assert len(groups) == 3  # 6 scenes x 3 views: one group per view, not 18


def test_nvs_hides_the_target_features_and_regresses_their_appearance(scenes):
    target = nvs.appearance(scenes)
    assert target.shape == scenes["feat"].shape
    torch.testing.assert_close(target.argmax(-1), scenes["feat"].argmax(-1), rtol=0, atol=0)
    assert bool((target.sum(-1) == 1).all())
    batch = cc.view_batch(scenes, None, None)
    hidden = nvs.hide_targets(batch)
    assert bool((hidden.feat[:, batch.context :] == 0).all())
    assert torch.equal(hidden.feat[:, : batch.context], batch.feat[:, : batch.context])
    torch.manual_seed(0)
    model = nvs.FeatureRegressionModel(7, dim=32, depth=1, num_heads=2, encoding="prope").eval()
    with torch.no_grad():
        pred = model(nvs.hide_targets(cc.view_batch(scenes, model.encoding, None)))
        # the target features do not leak: other target features give the same prediction
        noisy = cc.view_batch(dict(scenes, feat=scenes["feat"] * 3), model.encoding, None)
        noisy.feat[:, : batch.context] = batch.feat[:, : batch.context]
        torch.testing.assert_close(model(nvs.hide_targets(noisy)), pred, rtol=0, atol=0)
    assert pred.shape == (6, 16, 7)


def test_nmse_pools_over_batches_and_predicting_the_mean_scores_one():
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(4, 5, 3, generator=gen)
    p = torch.randn(4, 5, 3, generator=gen)
    keep = torch.rand(4, 5, generator=gen) > 0.3
    pooled = nvs.NMSESums()
    pooled.add(p[:2], y[:2], keep[:2])
    pooled.add(p[2:], y[2:], keep[2:])
    ys, ps = y[keep].double(), p[keep].double()
    expected = ((ps - ys) ** 2).sum() / ((ys - ys.mean(0)) ** 2).sum()
    assert pooled.nmse() == pytest.approx(float(expected), rel=1e-10)
    assert pooled.n == int(keep.sum())
    mean = nvs.NMSESums()
    mean.add(y.mean((0, 1), keepdim=True).expand_as(y), y, torch.ones(4, 5, dtype=torch.bool))
    assert mean.nmse() == pytest.approx(1.0, rel=1e-6)
    assert nvs.NMSESums().nmse() != nvs.NMSESums().nmse()  # nan when nothing was added


def test_default_plan_has_the_spec_models_and_both_tasks(tmp_path):
    plan = plan_tasks("multiview", profile="quick", out_dir=tmp_path / "run")
    assert plan.tasks == ["correspondence", "nvs"] and plan.seeds == 3
    corr = plan.task_models["correspondence"]
    for model in ("rope-axial", "rope-axial+plucker", "rope-axial+plucker-first", "gta",
                  "prope", "rayrope-known-depth", "rope-axial+plucker-aug"):  # fmt: skip
        assert model in corr
    assert plan.task_models["nvs"] == ["nope", "rope-axial+plucker", "prope", "gta", "ucpe"]
    assert len(plan.jobs) == 3 * (len(corr) + 5)
    job = next(j for j in plan.jobs if j.model == "rayrope-known-depth")
    assert (job.encoding, job.task) == ("rayrope", "correspondence")
    assert job.folder.endswith("correspondence/rayrope-known-depth/seed0")
    assert not (tmp_path / "run").exists()


def test_report_tables_and_checks_per_task():
    rows = []
    for seed, (a, b) in enumerate(((0.8, 0.6), (0.7, 0.5))):
        for condition, acc, err in (("id", a, 0.2), ("rigid", b, 0.4)):
            common = {"model": "m", "seed": seed, "condition": condition}
            rows.append({**common, "task": "correspondence", "accuracy": acc, "appearance": 0.2})
            rows.append({**common, "task": "nvs", "nmse": err, "nmse_labelled": err / 2})
    summary = mv_report.summarize(rows)
    assert [(s["task"], s["metric"]) for s in summary] == [
        ("correspondence", "accuracy"), ("nvs", "nmse")
    ]  # fmt: skip
    corr, reg = summary
    assert corr["conditions"]["rigid"]["mean"] == pytest.approx(0.55)
    assert reg["labelled"]["id"]["values"] == [0.1, 0.1]
    table = mv_report.markdown_summary(mv_report.of_task(summary, "nvs"))
    assert "| `m` | 0.200 ± 0.000 | 0.400 ± 0.000 | +0.200 |" in table
    assert "-20.0" in mv_report.markdown_summary(mv_report.of_task(summary, "correspondence"))


def test_conditions_are_rigid_changes_of_the_stated_size():
    gen = torch.Generator().manual_seed(0)
    assert cc.condition_transform("id", 3, gen) is None
    G = cc.condition_transform("rigid-1", 5, gen)
    R, t = G[:, :3, :3], G[:, :3, 3]
    torch.testing.assert_close(
        R @ R.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(5, 3, 3)
    )
    torch.testing.assert_close(t.norm(dim=-1), torch.full((5,), 5.0, dtype=torch.float64))
    angle = torch.arccos((R.diagonal(dim1=1, dim2=2).sum(-1) - 1) / 2)
    torch.testing.assert_close(angle, torch.full((5,), torch.pi / 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="condition must be one of"):
        cc.condition_transform("rigid-3", 1, gen)


def test_metric_and_loss_count_only_labelled_targets():
    logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    label = torch.tensor([[1, 2, -1]])
    assert cc.pointer_accuracy(logits, label) == (1, 2)
    loss = cc.pointer_loss(logits, label)
    expected = torch.nn.functional.cross_entropy(logits[0, :2], label[0, :2])
    torch.testing.assert_close(loss, expected)
    assert float(cc.pointer_loss(logits, torch.full((1, 3), -1))) == 0.0
    # appearance only: 3 context tokens (colours 0, 0, 1), targets of colours 0, 1, 0
    colour = torch.tensor([[0, 0, 1, 0, 1, 0]])
    hits, n = cc.appearance_chance(colour, torch.tensor([[0, 2, -1]]))
    assert n == 2 and hits == pytest.approx(0.5 + 1.0)


def test_tiny_run_writes_the_run_folder_with_seeds_and_intervals(tmp_path, capsys):
    assert _run(tmp_path, "--encodings", "prope", "--seeds", "2", "--tasks", "correspondence") == 0
    out = tmp_path / "run"
    for name in ("run.json", "results.json", "results.csv", "report.md", "correspondence.png"):
        assert (out / name).is_file(), name
    rows = _rows(tmp_path)
    assert len(rows) == 2 * len(cc.CONDITIONS)
    assert {r["condition"] for r in rows} == set(cc.CONDITIONS)
    assert all(int(r["n"]) > 0 and 0 <= float(r["accuracy"]) <= 1 for r in rows)
    # PRoPE is invariant: the same hits in every condition, seed by seed
    for seed in ("0", "1"):
        hits = {r["hits"] for r in rows if r["model"] == "prope" and r["seed"] == seed}
        assert len(hits) == 1
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert [(s["task"], s["seeds"]) for s in summary] == [("correspondence", 2)]
    report = (out / "report.md").read_text()
    assert "--suite multiview" in report and "± " in report and "acceptance" in report
    assert "correspondence top-1 accuracy" in capsys.readouterr().out
    for seed in (0, 1):
        assert ckpt.has_checkpoint(out / "correspondence" / "prope" / f"seed{seed}")


def test_nvs_run_with_first_seed_then_resume_fills_in_the_earlier_seed(tmp_path, capsys):
    args = ("--encodings", "prope", "--tasks", "nvs")
    assert _run(tmp_path, *args, "--seeds", "1", "--first-seed", "1") == 0
    out = tmp_path / "run"
    assert ckpt.has_checkpoint(out / "nvs" / "prope" / "seed1")
    assert not (out / "nvs" / "prope" / "seed0").exists()
    only = _rows(tmp_path)
    assert len(only) == len(cc.CONDITIONS) and {r["task"] for r in only} == {"nvs"}
    assert all(float(r["nmse"]) > 0 and int(r["n_labelled"]) <= int(r["n"]) for r in only)
    # PRoPE is invariant: (nearly) the same NMSE in every condition
    errors = [float(r["nmse"]) for r in only]
    assert max(errors) - min(errors) < 1e-4 * max(errors)
    report = (out / "report.md").read_text()
    assert "Target-feature regression (NMSE" in report and (out / "nvs.png").is_file()
    assert "regression NMSE" in capsys.readouterr().out
    assert _run(tmp_path, *args, "--seeds", "2", "--resume") == 0
    assert "prope seed 1: done (resume)" in capsys.readouterr().out
    rows = _rows(tmp_path)
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert [r for r in rows if r["seed"] == "1"] == only
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert [(s["task"], s["seeds"]) for s in summary] == [("nvs", 2)]
    assert json.loads((out / "run.json").read_text())["tasks"] == ["nvs"]
    assert _run(tmp_path, *args, "--first-seed", "-1", "--resume") == 2
    assert "--first-seed must be" in capsys.readouterr().err


def test_resume_skips_finished_models_and_refuses_other_settings(tmp_path, capsys):
    args = ("--encodings", "cape-6dof", "--seeds", "1", "--tasks", "correspondence")
    assert _run(tmp_path, *args) == 0
    first = _rows(tmp_path)
    capsys.readouterr()
    assert _run(tmp_path, *args, "--resume") == 0
    assert "done (resume)" in capsys.readouterr().out
    assert _rows(tmp_path) == first
    assert _run(tmp_path, *args, "--resume", "--dim", "32") == 2
    assert "other settings (dim 16 -> 32)" in capsys.readouterr().err
    assert _run(tmp_path, *args) == 2
    assert "already holds a run" in capsys.readouterr().err


def _job(folder: Path) -> suite.MultiviewJob:
    return suite.MultiviewJob(
        model="gta", encoding="gta", plucker=None, seed=1, dim=16, depth=1, num_heads=2,
        batch_size=3, steps=4, lr=1e-3, warmup=1, weight_decay=0.01, grad_clip=1.0,
        mlp_ratio=2.0, eval_scenes=4, scene={}, conditions=["id", "rigid"], checkpoint_every=2,
        folder=str(folder),
    )  # fmt: skip


def test_resume_after_an_interruption_is_bit_exact(tmp_path, monkeypatch):
    straight = run_job(suite.MULTIVIEW, _job(tmp_path / "a"), resume=False)
    real = jobs_module.learning_rate

    def stop_at_three(job, step):
        if step == 3:
            raise KeyboardInterrupt
        return real(job, step)

    monkeypatch.setattr(jobs_module, "learning_rate", stop_at_three)
    with pytest.raises(KeyboardInterrupt):
        run_job(suite.MULTIVIEW, _job(tmp_path / "b"), resume=False)
    assert ckpt.read_state(tmp_path / "b")["step"] == 2
    monkeypatch.setattr(jobs_module, "learning_rate", real)
    resumed = run_job(suite.MULTIVIEW, _job(tmp_path / "b"), resume=True)
    a = json.loads((tmp_path / "a" / ckpt.STATE_FILE).read_text())["losses"]
    b = json.loads((tmp_path / "b" / ckpt.STATE_FILE).read_text())["losses"]
    assert a == b and len(a) == 4
    assert resumed["per_condition"] == straight["per_condition"]


def test_training_data_depend_on_seed_and_step_only():
    job = _job(Path("unused"))
    a, b = suite.train_scenes(job, 5), suite.train_scenes(job, 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["points"], suite.train_scenes(job, 6)["points"])
    job.plucker = "plucker-aug"  # augmentation: the same scenes, moved rigidly
    moved = suite.train_scenes(job, 5)
    assert torch.equal(moved["label"], a["label"])
    assert float((moved["viewmats"] - a["viewmats"]).abs().max()) > 0.1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--encodings", "propee"), "unknown encoding 'propee'"),
        (("--encodings", "prope+rays"), "unknown camera scheme 'rays'"),
        (("--encodings", "sinusoidal"), "absolute embedding"),
        (("--encodings", "alibi"), "has 1 position axes"),
        (("--encodings", "pine"), "needs inputs the multiview scenes do not have"),
        (("--encodings", "prope", "--dim", "20"), "cannot run at head dim 10"),
        (("--tasks", "depth"), "unknown multiview task 'depth'; known: correspondence, nvs"),
        (("--encodings", "rayrope"), "the suite feeds the scenes' true depth to"),
        (("--encodings", "prope-known-depth"), "reads no per-token depth"),
        (("--encodings", "rayrope-known-depth"), "cannot run at head dim 8"),
        (("--first-seed", "x"), "--first-seed must be"),
        (("--train-len", "4"), "--train-len does not apply to the multiview suite"),
        (("--profile", "huge"), "unknown profile 'huge'"),
        (("--seeds", "0"), "--seeds must be a positive int, got 0"),
        (("--eval-size", "x"), "--eval-size must be a positive int"),
        (("--encodings", "nope", "--resume", "--force"), "exclude each other"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, args, message):
    assert _run(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("relpos: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.slow
def test_two_worker_processes_give_the_same_rows_as_one(tmp_path):
    args = ["tasks", "--suite", "multiview", *TINY, "--encodings", "nope,gta", "--seeds", "1"]
    one = main([*args, "--out", str(tmp_path / "one")])
    two = main([*args, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert one == two == 0

    def read(p: Path) -> list[dict]:
        with open(p / "results.csv") as f:
            return [{k: v for k, v in r.items() if k != "train_seconds"} for r in csv.DictReader(f)]

    assert read(tmp_path / "one") == read(tmp_path / "two")
