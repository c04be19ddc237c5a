"""``relpos tasks`` end to end (tiny models, a few steps, in-process), resume, error paths."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from relpos_lab.cli import main
from relpos_lab.tasks import jobs as jobs_module
from relpos_lab.tasks.jobs import run_job
from relpos_lab.tasks.length_suites import LENGTH_SUITES, Job
from relpos_lab.training import checkpoint as ckpt

TINY = ("--dim", "16", "--depth", "1", "--heads", "2", "--batch", "4", "--steps", "3")
TINY += ("--train-len", "4", "--test-lengths", "5-6", "--eval-size", "8")
TINY += ("--jobs", "1", "--no-progress")


def _run(tmp_path: Path, *args: str) -> int:
    """``relpos tasks`` with the tiny settings; ``args`` come last, so they override them."""
    return main(["tasks", *TINY, "--out", str(tmp_path / "run"), *args])


def _rows(tmp_path: Path) -> list[dict]:
    with open(tmp_path / "run" / "results.csv") as f:
        return list(csv.DictReader(f))


def test_chomsky_run_writes_the_run_folder_with_seeds_and_intervals(tmp_path, capsys):
    code = _run(
        tmp_path, "--suite", "chomsky", "--tasks", "parity_check", "--encodings",
        "nope,rope+random", "--seeds", "2",
    )  # fmt: skip
    assert code == 0
    out = tmp_path / "run"
    for name in ("run.json", "results.json", "results.csv", "report.md"):
        assert (out / name).is_file(), name
    assert (out / "accuracy_parity_check.png").is_file()
    rows = _rows(tmp_path)
    assert len(rows) == 2 * 2 * 6  # models x seeds x lengths 1..6 (test 5-6)
    assert {r["model"] for r in rows} == {"nope", "rope+random"}
    assert [r["test"] for r in rows[:6]] == ["False"] * 4 + ["True"] * 2
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert [s["seeds"] for s in summary] == [2, 2]
    assert all(s["ci"] >= 0 and s["max"] >= s["mean"] for s in summary)
    report = (out / "report.md").read_text()
    assert "relpos tasks --dim 16" in report and "--suite chomsky" in report and "± " in report
    assert "test-length score" in capsys.readouterr().out
    for seed in (0, 1):
        assert ckpt.has_checkpoint(out / "parity_check" / "rope+random" / f"seed{seed}")


def test_nope_and_coupling_suites_run_end_to_end(tmp_path):
    args = ("--suite", "nope", "--tasks", "copy", "--encodings", "alibi", "--seeds", "1")
    assert _run(tmp_path, *args) == 0
    rows = _rows(tmp_path)
    assert sorted({int(r["length"]) for r in rows if r["test"] == "True"}) == [5, 6]
    assert sorted({int(r["length"]) for r in rows if r["test"] == "False"}) == [1, 2, 3, 4]
    other = tmp_path / "coupling"
    args = ["tasks", "--suite", "coupling", *TINY, "--seeds", "1", "--out", str(other)]
    assert main(args) == 0
    models = {s["model"] for s in json.loads((other / "results.json").read_text())["summary"]}
    assert models == {"learned+coupled", "nope", "learned+random-start"}


@pytest.mark.slow
def test_scan_is_scored_on_every_test_command(tmp_path):
    assert _run(tmp_path, "--suite", "nope", "--tasks", "scan", "--encodings", "alibi") == 0
    rows = _rows(tmp_path)
    from relpos_lab.tasks.scan import scan_split

    test = sorted({int(r["length"]) for r in rows if r["test"] == "True"})
    assert test == sorted({len(m) for _, m in scan_split(0)["test"]})  # 26..48, some absent
    assert sum(int(r["n"]) for r in rows if r["test"] == "True") == 2 * 3_136  # 2 seeds
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert summary[0]["reference"] == 0.438  # ALiBi's published SCAN score


def test_resume_skips_finished_models_and_refuses_other_settings(tmp_path, capsys):
    args = ("--suite", "coupling", "--encodings", "nope", "--seeds", "1")
    assert _run(tmp_path, *args) == 0
    first = _rows(tmp_path)
    capsys.readouterr()
    assert _run(tmp_path, *args, "--resume") == 0
    out = capsys.readouterr().out
    assert "done (resume)" in out
    assert "estimated ~0 min for the 0 left" in out  # finished models cost nothing
    assert _rows(tmp_path) == first
    tiny = list(TINY)
    tiny[tiny.index("--dim") + 1] = "32"
    code = main(["tasks", *args, *tiny, "--resume", "--out", str(tmp_path / "run")])
    assert code == 2
    assert "other settings (dim 16 -> 32)" in capsys.readouterr().err
    assert _run(tmp_path, *args) == 2  # an existing run needs --resume or --force
    assert "already holds a run" in capsys.readouterr().err
    assert _run(tmp_path, *args, "--force") == 0


def test_first_seed_runs_later_seeds_and_resume_fills_in_the_earlier_ones(tmp_path, capsys):
    args = ("--suite", "nope", "--tasks", "copy", "--encodings", "alibi")
    assert _run(tmp_path, *args, "--first-seed", "1", "--seeds", "1") == 0
    out = capsys.readouterr().out
    assert "1 seeds = 1 models (seed 1)" in out
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert f"copy alibi seed 1: test score {summary[0]['mean']:.3f}" in out  # the report's
    out = tmp_path / "run" / "copy" / "alibi"
    assert sorted(p.name for p in out.iterdir()) == ["seed1"]
    later = _rows(tmp_path)
    assert {r["seed"] for r in later} == {"1"}
    assert _run(tmp_path, *args, "--seeds", "2", "--resume") == 0  # seeds 0 and 1
    assert "done (resume)" in capsys.readouterr().out  # seed 1 is not trained again
    rows = _rows(tmp_path)
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert [r for r in rows if r["seed"] == "1"] == later
    summary = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert [s["seeds"] for s in summary] == [2]


CHOMSKY = LENGTH_SUITES["chomsky"]


def _tiny_job(folder: Path, **kw) -> Job:
    base = dict(
        suite="chomsky", task="reverse_string", model="sinusoidal+random",
        encoding="sinusoidal", scheme="random", seed=3, dim=16, depth=1, num_heads=2,
        batch_size=4, steps=4, lr=1e-3, warmup=1, train_len=4, test_lengths=[5],
        eval_size=4, dropout=0.1, max_length=32, checkpoint_every=2, folder=str(folder),
    )  # fmt: skip
    base.update(kw)
    return Job(**base)


def test_resume_after_an_interruption_is_bit_exact(tmp_path, monkeypatch):
    straight = run_job(CHOMSKY, _tiny_job(tmp_path / "a"), resume=False)
    real = jobs_module.learning_rate

    def stop_at_three(job, step):
        if step == 3:
            raise KeyboardInterrupt
        return real(job, step)

    monkeypatch.setattr(jobs_module, "learning_rate", stop_at_three)
    with pytest.raises(KeyboardInterrupt):
        run_job(CHOMSKY, _tiny_job(tmp_path / "b"), resume=False)
    assert ckpt.read_state(tmp_path / "b")["step"] == 2
    monkeypatch.setattr(jobs_module, "learning_rate", real)
    resumed = run_job(CHOMSKY, _tiny_job(tmp_path / "b"), resume=True)
    a = json.loads((tmp_path / "a" / ckpt.STATE_FILE).read_text())["losses"]
    b = json.loads((tmp_path / "b" / ckpt.STATE_FILE).read_text())["losses"]
    assert a == b and len(a) == 4
    assert resumed["per_length"] == straight["per_length"]
    from safetensors.torch import load_file

    wa, wb = (
        load_file(tmp_path / "a" / ckpt.MODEL_FILE),
        load_file(tmp_path / "b" / ckpt.MODEL_FILE),
    )
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--suite", "lisp"), "--suite must be one of chomsky, nope, coupling, multiview; got"),
        (("--suite", "chomsky", "--profile", "huge"), "unknown profile 'huge'"),
        (("--suite", "chomsky", "--tasks", "parity"), "unknown chomsky task 'parity'"),
        (("--suite", "nope", "--encodings", "ropee"), "unknown encoding 'ropee'"),
        (("--suite", "chomsky", "--encodings", "learned+coupled"), "not 'coupled'"),
        (("--suite", "chomsky", "--encodings", "rope+noisy"), "unknown position scheme"),
        (("--suite", "chomsky", "--encodings", "nope+random"), "reads no positions"),
        (("--suite", "chomsky", "--encodings", "xpos"), "causal attention only"),
        (
            ("--suite", "nope", "--dim", "30", "--heads", "4"),
            "--dim (30) must be divisible by --heads (4)",
        ),
        (("--suite", "nope", "--seeds", "0"), "--seeds must be a positive int, got 0"),
        (("--suite", "nope", "--lr", "-1"), "--lr must be a finite number > 0"),
        (("--suite", "nope", "--jobs", "x"), "--jobs must be a positive int"),
        (("--suite", "nope", "--first-seed", "-1"), "--first-seed must be"),
        (("--suite", "nope", "--resume", "--force"), "exclude each other"),
        (("--suite", "nope", "--train-len", "9"), "--test-lengths must all be longer"),
        (("--suite", "coupling", "--test-lengths", "9-7"), "must be A-B with A <= B"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, args, message):
    assert _run(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("relpos: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_randomized_range_must_hold_the_longest_test_sequence(tmp_path, capsys):
    # duplicate_string at length 60 is 60 + 120 tokens; quick's L = 256 holds it, 64 does not
    from relpos_lab.tasks.plan import plan_tasks

    with pytest.raises(ValueError, match="longest test sequence has 180 tokens"):
        plan_tasks(
            "chomsky", tasks="duplicate_string", encodings="rope+random",
            out_dir=tmp_path / "x", overrides={"max_length": 64},
        )  # fmt: skip


@pytest.mark.slow
def test_two_worker_processes_give_the_same_rows_as_one(tmp_path):
    args = ["--suite", "coupling", "--encodings", "nope,learned+coupled", "--seeds", "1"]
    one = main(["tasks", *args, *TINY, "--out", str(tmp_path / "one")])
    tiny = list(TINY)
    tiny[tiny.index("--jobs") + 1] = "2"
    two = main(["tasks", *args, *tiny, "--out", str(tmp_path / "two")])
    assert one == two == 0

    def read(p: Path) -> list[dict]:
        with open(p / "results.csv") as f:
            return [{k: v for k, v in r.items() if k != "train_seconds"} for r in csv.DictReader(f)]

    assert read(tmp_path / "one") == read(tmp_path / "two")


def test_models_trained_in_this_process_use_one_thread_like_a_worker():
    from relpos_lab.tasks.jobs import one_thread

    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
