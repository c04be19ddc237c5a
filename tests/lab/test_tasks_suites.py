"""The suites of ``relpos tasks`` share one pipeline (``relpos_lab.tasks.suite``): every suite
with profiles is registered, plans both profiles into jobs that survive their JSON, and
trains with the optimizer its suite declares."""

from __future__ import annotations

import pytest
import torch

from relpos_lab.tasks.jobs import make_optimizer
from relpos_lab.tasks.plan import get_suite, plan_tasks
from relpos_lab.tasks.profiles import SUITES
from relpos_lab.tasks.suite import JobRecord


def test_the_suites_are_the_profile_tables_and_a_bad_name_is_refused():
    assert SUITES == ("chomsky", "nope", "coupling", "multiview")
    assert [get_suite(name).name for name in SUITES] == list(SUITES)
    with pytest.raises(ValueError, match="--suite must be one of chomsky, nope, coupling, multi"):
        get_suite("lisp")


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("profile", ["quick", "full"])
def test_every_profile_plans_one_job_per_task_model_and_seed(tmp_path, suite, profile):
    plan = plan_tasks(suite, profile=profile, out_dir=tmp_path / "run")
    found = get_suite(suite)
    assert plan.suite is found and plan.settings()["suite"] == suite
    per_task = sum(len(plan.task_models[t]) for t in plan.tasks)
    assert len(plan.jobs) == per_task * plan.seeds
    assert plan.models == list(dict.fromkeys(m for t in plan.tasks for m in plan.task_models[t]))
    for job in plan.jobs:
        assert isinstance(job, found.job_type) and isinstance(job, JobRecord)
        assert job.folder == str(tmp_path / "run" / job.task / job.model / f"seed{job.seed}")
        assert found.job_type(**job.to_json()) == job  # what a worker process rebuilds
        assert "folder" not in job.key() and "checkpoint_every" not in job.key()
    assert not (tmp_path / "run").exists()


def _parameters(suite: str, encoding: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    tasks = "correspondence" if suite == "multiview" else "copy"
    plan = plan_tasks(
        suite, tasks=tasks, encodings=encoding, seeds=1, out_dir="unused",
        overrides={"dim": 16, "depth": 1, "num_heads": 2},
    )  # fmt: skip
    found, job = plan.suite, plan.jobs[0]
    model = found.build_model(job, found.prepare(job))
    return model, make_optimizer(job, model, decay_encodings=found.decay_encodings)


def test_multiview_decays_the_encodings_weight_matrices_and_the_nope_study_does_not():
    model, opt = _parameters("multiview", "rope-mixed")
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert opt.param_groups[0]["weight_decay"] == 0.01
    assert id(model.encoding.freq) in decayed  # RoPE-Mixed's learned (2, heads, F) frequencies
    model, opt = _parameters("nope", "t5")
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    table = [p for n, p in model.named_parameters() if "encoding" in n and p.dim() >= 2]
    assert table and not any(id(p) in decayed for p in table)  # T5's bias table is spared
