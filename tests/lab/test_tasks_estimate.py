"""The time estimate ``relpos tasks`` prints before a run (``TaskPlan.estimate_seconds``)."""

from __future__ import annotations

import pytest

from relpos_lab.tasks.plan import plan_tasks


def _plan(tmp_path, suite="nope", **kwargs):
    return plan_tasks(suite, profile="quick", out_dir=tmp_path / "run", **kwargs)


def test_estimate_is_cpu_seconds_over_the_workers_on_free_cores(tmp_path):
    plan = _plan(tmp_path, seeds=2, workers=2)
    p = plan.profile
    assert len(plan.jobs) == plan.jobs_left() == 3 * 5 * 2
    assert plan.cpu_seconds() == pytest.approx(30 * p.steps * p.seconds_per_step)
    assert plan.estimate_seconds(cpus=2) == pytest.approx(plan.cpu_seconds() / 2)
    # more workers than cores: the cores are the limit; one job cannot use two workers
    many = _plan(tmp_path, seeds=2, workers=4)
    assert many.estimate_seconds(cpus=2) == pytest.approx(plan.estimate_seconds(cpus=2))
    single = _plan(tmp_path, tasks="copy", encodings="nope", seeds=1, workers=2)
    assert single.estimate_seconds(cpus=2) == pytest.approx(single.cpu_seconds())


def test_quick_nope_study_fits_tens_of_minutes_on_two_free_cores(tmp_path):
    # the issue: "each suite in a few tens of minutes at most" with the quick profile
    minutes = _plan(tmp_path, seeds=2, workers=2).estimate_seconds(cpus=2) / 60
    assert 20 < minutes < 60


def test_resumed_steps_are_not_estimated_again(tmp_path):
    plan = _plan(tmp_path, seeds=1, workers=2)
    steps = plan.profile.steps
    plan.done_steps = [steps] * 13 + [steps // 2, 0]  # 13 finished, one half-way, one not
    assert plan.jobs_left() == 2
    assert plan.cpu_seconds() == pytest.approx(1.5 * steps * plan.profile.seconds_per_step)
    assert plan.estimate_seconds(cpus=2) == pytest.approx(plan.cpu_seconds() / 2)
