"""Running a planned ``relpos tasks``: write ``run.json``, train and evaluate every job (one
process per model when ``workers > 1``, each on one thread), collect the rows; the façade
``run_tasks`` (plan, start, run).

Ctrl-C / SIGTERM: every training loop notes the signal, finishes its step and writes its
checkpoint (``relpos_lab.training.runtime.SignalStop``); the run then raises ``KeyboardInterrupt``
and
``--resume`` continues each model where it stopped (finished models are skipped).
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from .. import report
from ..training.runtime import RaiseOnSignal
from .jobs import Job, eval_lengths, one_thread, run_job, worker
from .plan import RUN_FILE, RUN_KIND, TaskPlan, plan_tasks
from .report import summarize

__all__ = ["start_run", "run_plan", "run_tasks", "job_rows", "run_parallel"]


def start_run(plan: TaskPlan, meta: dict[str, Any]) -> None:
    """The first write: clear an old run (``--force``), then write ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "kind": RUN_KIND,
        "suite": plan.suite,
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


def job_rows(job: Job, result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per evaluated length of a job."""
    rows = []
    per_length = result["per_length"]
    test = set(job.test_lengths)
    for length in eval_lengths(job):
        cell = per_length.get(str(length))
        if cell is None:
            continue
        rows.append(
            {
                "suite": job.suite,
                "task": job.task,
                "model": job.model,
                "encoding": job.encoding,
                "scheme": job.scheme,
                "seed": job.seed,
                "length": length,
                "test": length in test,
                "accuracy": cell["accuracy"],
                "token_accuracy": cell.get("token_accuracy", ""),
                "n": cell["n"],
                "train_len": job.train_len,
                "steps": result["train"]["steps"],
                "final_loss": result["train"]["final_loss"],
                "train_seconds": result["train"]["train_seconds"],
                "dim": job.dim,
                "depth": job.depth,
                "heads": job.num_heads,
                "batch": job.batch_size,
                "lr": job.lr,
            }
        )
    return rows


def run_plan(
    plan: TaskPlan, *, progress: bool = True, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Train and evaluate every job (in ``plan.workers`` processes); returns the rows."""
    total = len(plan.jobs)
    results: dict[int, dict[str, Any]] = {}

    def done(index: int, result: dict[str, Any]) -> None:
        job = plan.jobs[index]
        results[index] = result
        # the report's test score (the NoPE study: the mean over test examples, else lengths)
        summary = summarize(job_rows(job, result))
        score = summary[0]["mean"] if summary else float("nan")
        log(
            f"[{len(results)}/{total}] {job.task} {job.model} seed {job.seed}: test score "
            f"{score:.3f} (loss {result['train']['final_loss']:.3f}, "
            f"{result['train']['train_seconds']:.0f} s)"
        )

    if plan.workers <= 1 or total <= 1:
        with one_thread():
            for index, job in enumerate(plan.jobs):
                done(index, run_job(job, resume=plan.resume, progress=progress, log=log))
    else:
        run_parallel(plan, done)
    rows = []
    for index, job in enumerate(plan.jobs):
        rows.extend(job_rows(job, results[index]))
    return rows


def run_parallel(
    plan: Any,
    done: Callable[[int, dict[str, Any]], None],
    job_worker: Callable[[dict[str, Any], bool], dict[str, Any]] = worker,
) -> None:
    """``plan.jobs`` in ``plan.workers`` spawned processes, each through ``job_worker(job
    JSON, resume)`` (the multiview suite passes its own); on a signal every worker is asked
    to stop (SIGTERM: it checkpoints after its step) and ``KeyboardInterrupt`` is raised."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=plan.workers, mp_context=context)
    pending: dict[Future, int] = {}
    try:
        with RaiseOnSignal():
            for index, job in enumerate(plan.jobs):
                pending[pool.submit(job_worker, job.to_json(), plan.resume)] = index
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
