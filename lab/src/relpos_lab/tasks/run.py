"""Running a planned ``relpos tasks``, for every suite: write ``run.json``, train and evaluate
every job (one process per model when ``workers > 1``, each on one thread), collect the rows
(``Suite.rows``); the façade ``run_tasks`` (plan, start, run).

Ctrl-C / SIGTERM: every training loop notes the signal, finishes its step and writes its
checkpoint (``relpos_lab.training.runtime.SignalStop``); the run then raises
``KeyboardInterrupt`` and ``--resume`` continues each model where it stopped (finished models
are skipped).
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

import torch

from .. import report
from ..training.runtime import RaiseOnSignal
from .jobs import one_thread, run_job
from .plan import RUN_FILE, RUN_KIND, TaskPlan, get_suite, plan_tasks

__all__ = ["start_run", "run_plan", "run_tasks", "run_parallel", "worker"]


def start_run(plan: TaskPlan, meta: dict[str, Any]) -> None:
    """The first write: clear an old run (``--force``), then write ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "kind": RUN_KIND,
        "suite": plan.suite.name,
        "profile": plan.profile.name,
        "settings": plan.settings(),
        "tasks": plan.tasks,
        "models": plan.models,
        "seeds": plan.seeds,
        **meta,
    }
    path = plan.out_dir / RUN_FILE
    if plan.resume and path.exists():
        try:
            old = json.loads(path.read_text())
            record["tasks"] = list(dict.fromkeys(old.get("tasks", []) + plan.tasks))
            record["models"] = list(dict.fromkeys(old.get("models", []) + plan.models))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    report.write_json_file(path, record)


def run_plan(
    plan: TaskPlan, *, progress: bool = True, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Train and evaluate every job (in ``plan.workers`` processes); returns the rows."""
    total = len(plan.jobs)
    results: dict[int, dict[str, Any]] = {}
    suite = plan.suite

    def done(index: int, result: dict[str, Any]) -> None:
        job = plan.jobs[index]
        results[index] = result
        log(
            f"[{len(results)}/{total}] {job.task} {job.model} seed {job.seed}: "
            f"{suite.result_text(job, result)} (loss {result['train']['final_loss']:.3f}, "
            f"{result['train']['train_seconds']:.0f} s)"
        )

    if plan.workers <= 1 or total <= 1:
        with one_thread():
            for index, job in enumerate(plan.jobs):
                done(index, run_job(suite, job, resume=plan.resume, progress=progress, log=log))
    else:
        run_parallel(plan, done)
    rows = []
    for index, job in enumerate(plan.jobs):
        rows.extend(suite.rows(job, results[index]))
    return rows


def worker(suite: str, job_data: dict[str, Any], resume: bool) -> dict[str, Any]:
    """Entry point of a worker process: one job of ``suite`` from its JSON, on one thread
    (one thread per model is faster than two on a loaded machine), no progress bar."""
    torch.set_num_threads(1)
    found = get_suite(suite)
    job = found.job_type(**job_data)
    return run_job(found, job, resume=resume, progress=False, log=lambda _: None)


def run_parallel(plan: TaskPlan, done: Callable[[int, dict[str, Any]], None]) -> None:
    """``plan.jobs`` in ``plan.workers`` spawned processes (``worker``), ``done(index,
    result)`` as each finishes; on a signal every worker is asked to stop (SIGTERM: it
    checkpoints after its step) and ``KeyboardInterrupt`` is raised."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=plan.workers, mp_context=context)
    pending: dict[Future, int] = {}
    try:
        with RaiseOnSignal():
            for index, job in enumerate(plan.jobs):
                job_data = job.to_json()
                pending[pool.submit(worker, plan.suite.name, job_data, plan.resume)] = index
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = pending.pop(future)
                    done(index, future.result())
    except KeyboardInterrupt:
        for future in pending:
            future.cancel()
        for process in list(getattr(pool, "_processes", {}).values()):
            if process.is_alive():
                process.terminate()  # SIGTERM: the worker checkpoints after its step
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def run_tasks(
    suite: str,
    *,
    out_dir: Any,
    tasks: Any = None,
    encodings: Any = None,
    profile: str = "quick",
    seeds: int | None = None,
    first_seed: int = 0,
    resume: bool = False,
    force: bool = False,
    workers: int | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    meta: dict[str, Any] | None = None,
    on_plan: Callable[[TaskPlan], None] | None = None,
) -> tuple[TaskPlan, list[dict[str, Any]]]:
    """Plan (nothing written before every check passed), start, run; returns the plan and
    the rows. The report is written by ``relpos_lab.tasks.report.write_report``."""
    plan = plan_tasks(
        suite,
        tasks=tasks,
        encodings=encodings,
        profile=profile,
        seeds=seeds,
        first_seed=first_seed,
        out_dir=out_dir,
        resume=resume,
        force=force,
        workers=workers,
        overrides=overrides,
    )
    if on_plan is not None:
        on_plan(plan)
    start_run(plan, meta or {})
    return plan, run_plan(plan, progress=progress, log=log)
