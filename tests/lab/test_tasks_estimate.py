"""The time estimate ``relpos tasks`` prints before a run (``TaskPlan.estimate_seconds``)."""

from __future__ import annotations

import pytest

from relpos.lab.tasks.plan import plan_tasks


def _plan(tmp_path, suite="nope", **kwargs):
    return plan_tasks(suite, profile="quick", out_dir=tmp_path / "run", **kwargs)


def test_estimate_is_cpu_seconds_over_the_workers_on_free_cores(tmp_path):
    plan = _plan(tmp_path, seeds=2, workers=2)
    p = plan.profile
    assert len(plan.jobs) == 3 * 5 * 2
    assert plan.cpu_seconds() == pytest.approx(30 * p.steps * p.seconds_per_step)
    assert plan.estimate_seconds(cpus=2) == pytest.approx(plan.cpu_seconds() / 2)
    # more workers than cores: the cores are the limit
    many = _plan(tmp_path, seeds=2, workers=4)
    assert many.estimate_seconds(cpus=2) == pytest.approx(plan.estimate_seconds(cpus=2))


def test_quick_nope_study_fits_tens_of_minutes_on_two_free_cores(tmp_path):
    # the issue: "each suite in a few tens of minutes at most" with the quick profile
    minutes = _plan(tmp_path, seeds=2, workers=2).estimate_seconds(cpus=2) / 60
    assert 20 < minutes < 60


def test_estimate_accounts_for_other_runnable_threads(tmp_path):
    plan = _plan(tmp_path, seeds=2, workers=2)
    free = plan.estimate_seconds(cpus=2)
    # 2 other threads + 2 workers on 2 cores: each worker gets half a core
    assert plan.estimate_seconds(load=2.0, cpus=2) == pytest.approx(2 * free)
    # one worker next to one other thread on 2 cores still has a whole core
    one = _plan(tmp_path, seeds=2, workers=1)
    assert one.estimate_seconds(load=1.0, cpus=2) == pytest.approx(one.cpu_seconds())
    # a single job cannot use the second worker
    single = _plan(tmp_path, tasks="copy", encodings="nope", seeds=1, workers=2)
    assert single.estimate_seconds(cpus=2) == pytest.approx(single.cpu_seconds())


def test_the_plan_line_gives_free_and_loaded_estimates(tmp_path, monkeypatch, capsys):
    from relpos.lab.tasks import command

    plan = _plan(tmp_path, seeds=2, workers=2)
    monkeypatch.setattr(command.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(command.os, "getloadavg", lambda: (6.0, 5.0, 4.0))
    command._print_plan(plan)
    line = capsys.readouterr().out.splitlines()[-1]
    free = plan.estimate_seconds(cpus=2) / 60
    loaded = plan.estimate_seconds(load=6.0, cpus=2) / 60
    assert f"~{free:.0f} min on 2 free CPUs" in line
    assert f"~{loaded:.0f} min at the load average 6.0" in line
    monkeypatch.setattr(command.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    command._print_plan(plan)
    assert "load average" not in capsys.readouterr().out
