"""``relpos extrapolate`` end to end (a 3-step run) and its error paths, in-process."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from relpos_lab.cli import main

TINY_ARGS = (
    "--encodings",
    "alibi,nope",
    "--train-len",
    "16",
    "--eval-mult",
    "1,2",
    "--steps",
    "3",
    "--no-progress",
)


def english_text(chars: int = 24_000) -> str:
    """English text that needs no install: the stdlib's pydoc topics."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(english_text(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_file) -> tuple[Path, str]:
    """One tiny finished run (copied by the tests that change it)."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    code = main(["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)])
    assert code == 0
    return out, str(data_file)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def listing(path: Path) -> dict[str, float]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in sorted(path.rglob("*"))}


def test_tiny_end_to_end_run_writes_the_report(finished_run):
    out, data = finished_run
    for name in ("results.json", "results.csv", "ppl_vs_length.png", "report.md", "run.json"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["command"].startswith("relpos extrapolate --data")
    assert results["meta"]["profile"] == "quick" and results["meta"]["seed"] == 0
    assert results["meta"]["wall_seconds"] > 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2  # encodings x lengths x modes
    assert {(r["encoding"], r["eval_len"], r["mode"]) for r in rows} == {
        (e, n, m)
        for e in ("alibi", "nope")
        for n in ("16", "32")
        for m in ("nonoverlapping", "sliding")
    }
    assert all(r["steps"] == "3" and float(r["ppl"]) > 1 for r in rows)
    md = (out / "report.md").read_text()
    assert results["meta"]["command"] in md and "| `alibi` |" in md
    assert (out / "ppl_vs_length.png").stat().st_size < 150_000


def test_resume_of_a_finished_run_reuses_it(finished_run, tmp_path, capsys):
    src, data = finished_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    code, stdout, err = run(
        capsys, "extrapolate", "--data", data, *TINY_ARGS, "--out", str(out), "--resume"
    )
    assert code == 0, err
    assert stdout.count("already trained and evaluated") == 2
    assert "report:" in stdout


def test_force_replaces_a_run(finished_run, tmp_path, capsys):
    src, data = finished_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    (out / "stale.txt").write_text("old")
    args = (
        "--encodings",
        "nope",
        "--train-len",
        "16",
        "--eval-mult",
        "1",
        "--steps",
        "2",
        "--no-progress",
    )
    code, stdout, err = run(
        capsys, "extrapolate", "--data", data, *args, "--out", str(out), "--force"
    )
    assert code == 0, err
    assert not (out / "stale.txt").exists() and not (out / "alibi").exists()
    assert str(out / "report.md") in stdout


def one_line_error(capsys, argv, match: str, out: Path) -> None:
    before = listing(out) if out.exists() else None
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("relpos: error: ") and err.count("\n") == 1, err
    assert match in err, err
    assert stdout == ""
    if before is None:
        assert not out.exists()  # nothing written
    else:
        assert listing(out) == before  # nothing changed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--encodings", "rope,nosuch"), "known encodings: "),
        (("--train-len", "0"), "--train-len must be a positive int"),
        (("--train-len", "-128"), "--train-len must be a positive int"),
        (("--train-len", "abc"), "--train-len must be an int"),
        (("--eval-mult", "1,0"), "--eval-mult must be positive"),
        (("--eval-mult", "1,-2"), "--eval-mult must be positive"),
        (("--steps", "0"), "--steps must be a positive int"),
        (("--profile", "huge"), "known profiles: quick, paper"),
        (("--tokenizer", "words"), "--tokenizer must be one of 'bytes', 'bpe'"),
        (("--data", "/nonexistent/relpos.txt"), "no such file or folder"),
        (("--resume", "--force"), "exclude each other"),
        (("--eval-mult", "1,1000"), "too few"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, data_file, args, match):
    out = tmp_path / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
    one_line_error(capsys, [*argv, *args], match, out)


def test_empty_data_is_refused(capsys, tmp_path):
    empty_file = tmp_path / "empty.txt"
    empty_file.write_text("")
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    out = tmp_path / "run"
    for data in (empty_file, empty_dir):
        argv = ["extrapolate", "--data", str(data), *TINY_ARGS, "--out", str(out)]
        one_line_error(capsys, argv, str(data), out)


def test_existing_run_needs_resume_or_force(capsys, finished_run):
    out, data = finished_run
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out)]
    one_line_error(capsys, argv, "already holds a run; pass --resume", out)


def test_folder_that_is_not_a_run_is_never_cleared(capsys, tmp_path, data_file):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out), "--force"]
    one_line_error(capsys, argv, "holds no relpos run", out)
    assert (out / "notes.txt").read_text() == "precious"


def test_resume_with_other_settings_is_refused(capsys, finished_run, tmp_path):
    src, data = finished_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out), "--resume"]
    one_line_error(capsys, [*argv, "--train-len", "32"], "other settings", out)


def test_resume_from_an_incompatible_checkpoint_is_refused(capsys, finished_run, tmp_path):
    src, data = finished_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    changed = tmp_path / "text.txt"  # same kind of data, other text: another corpus
    changed.write_text(english_text(60_000)[20_000:], encoding="utf-8")
    run_json = json.loads((out / "run.json").read_text())
    run_json["corpus"]["name"] = str(changed)  # so only the checkpoint can tell
    del run_json["corpus"]["fingerprint"]
    (out / "run.json").write_text(json.dumps(run_json))
    argv = ["extrapolate", "--data", str(changed), *TINY_ARGS, "--out", str(out), "--resume"]
    one_line_error(capsys, argv, "incompatible config", out)


def test_demo_attention_only_is_quick(capsys):
    code, stdout, _ = run(capsys, "demo", "--attention-only")
    assert code == 0
    assert "auto picks" in stdout


# ------------------------------------------------------------------------------ run folders
# the command line and run folders: nothing lost, nothing half-written.


def copy_run(finished_run, tmp_path) -> tuple[Path, str]:
    src, data = finished_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    return out, data


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(8, path.stat().st_size // 3)])


def edit_state(change):
    def edit(path: Path) -> None:
        state = json.loads(path.read_text())
        change(state)
        path.write_text(json.dumps(state))

    return edit


CORRUPTIONS = {
    "truncated model": ("alibi/model.safetensors", truncate),
    "truncated optimizer": ("alibi/optimizer.pt", truncate),
    "state not json": ("alibi/state.json", lambda p: p.write_text('{"step": 3, "con')),
    "state without rng": ("alibi/state.json", edit_state(lambda s: s.pop("rng"))),
    "state without losses": ("alibi/state.json", edit_state(lambda s: s.pop("losses"))),
    "step is a string": ("alibi/state.json", edit_state(lambda s: s.update(step="3"))),
    "negative step": ("alibi/state.json", edit_state(lambda s: s.update(step=-5))),
    "rng of floats": ("alibi/state.json", edit_state(lambda s: s["rng"].update(torch=[0.5]))),
    "vocab_size null": ("alibi/state.json", edit_state(lambda s: s.update(vocab_size=None))),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_checkpoint_on_resume_is_one_line_naming_the_file(
    capsys, finished_run, tmp_path, corruption
):
    out, data = copy_run(finished_run, tmp_path)
    name, corrupt = CORRUPTIONS[corruption]
    corrupt(out / name)
    (out / "alibi" / "extrapolation.json").unlink()  # so the checkpoint is read again
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out), "--resume"]
    one_line_error(capsys, argv, str(out / name), out)
    _, _, err = run(capsys, *argv)
    assert "use --force to start over" in err and "Traceback" not in err


def test_force_starts_over_from_a_corrupt_checkpoint(capsys, finished_run, tmp_path):
    out, data = copy_run(finished_run, tmp_path)
    truncate(out / "alibi" / "model.safetensors")
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out), "--force"]
    code, stdout, err = run(capsys, *argv)
    assert code == 0, err
    assert "already trained" not in stdout
    assert (out / "report.md").is_file()


def test_a_corrupt_run_json_does_not_lock_the_folder_against_force(capsys, finished_run, tmp_path):
    out, data = copy_run(finished_run, tmp_path)
    (out / "run.json").write_text('{"kind": "relpos-extr')  # cut short, by hand
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out)]
    one_line_error(capsys, argv, "run.json is corrupt", out)
    one_line_error(capsys, [*argv, "--resume"], "use --force to start over", out)
    code, _, err = run(capsys, *argv, "--force")
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["kind"] == "relpos-extrapolate"


def test_resume_accepts_the_same_data_given_another_way(
    capsys, finished_run, tmp_path, monkeypatch
):
    out, data = copy_run(finished_run, tmp_path)
    monkeypatch.chdir(Path(data).parent.parent)  # a relative path from another folder
    relative = str(Path(data).relative_to(Path.cwd()))
    code, stdout, err = run(
        capsys, "extrapolate", "--data", relative, *TINY_ARGS, "--out", str(out), "--resume"
    )
    assert code == 0, err
    assert stdout.count("already trained and evaluated") == 2


def test_resume_refuses_the_same_path_with_other_content(capsys, finished_run, tmp_path):
    out, data = copy_run(finished_run, tmp_path)
    edited = tmp_path / "text.txt"
    edited.write_text(english_text(30_000)[6_000:], encoding="utf-8")
    run_json = json.loads((out / "run.json").read_text())
    run_json["corpus"]["name"] = str(edited)  # the same path: only the content differs
    (out / "run.json").write_text(json.dumps(run_json))
    argv = ["extrapolate", "--data", str(edited), *TINY_ARGS, "--out", str(out), "--resume"]
    one_line_error(capsys, argv, "other content", out)


def test_resuming_with_more_steps_is_a_note_not_a_python_warning(capsys, finished_run, tmp_path):
    import warnings

    out, data = copy_run(finished_run, tmp_path)
    argv = ["extrapolate", "--data", data, *TINY_ARGS, "--out", str(out), "--resume"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw warning would fail the run
        code, stdout, err = run(capsys, *argv, "--steps", "4")
    assert code == 0, err
    assert "Warning" not in err and "Warning" not in stdout
    assert stdout.count("note: resuming") == 2 and "steps 3 -> 4" in stdout


def test_an_out_that_cannot_be_created_is_refused_before_the_data_loads(
    capsys, tmp_path, data_file, monkeypatch
):
    import relpos_lab.training.data

    def no_loading(*args, **kwargs):
        raise AssertionError("the data was loaded before --out was checked")

    monkeypatch.setattr(relpos_lab.training.data, "load_corpus", no_loading)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker / "run", blocker / "deeper" / "run", blocker):
        argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
        code, stdout, err = run(capsys, *argv)
        assert code == 2 and err.startswith("relpos: error: --out ") and err.count("\n") == 1
        assert stdout == "" and blocker.read_text() == "x"


def test_an_out_without_write_permission_is_refused_first(capsys, tmp_path, data_file, monkeypatch):
    import os

    import relpos_lab.io

    real = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    # as root every folder is writable; simulate the permission the check asks about
    monkeypatch.setattr(
        relpos_lab.io.os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode)
    )
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(locked / "run")]
    one_line_error(capsys, argv, "permission denied", locked / "run")


@pytest.mark.parametrize(
    ("errno_code", "reason"),
    [(errno.EPERM, "Operation not permitted"), (errno.EROFS, "Read-only file system")],
)
def test_an_out_the_system_refuses_is_one_line_naming_the_flag(
    capsys, tmp_path, data_file, monkeypatch, errno_code, reason
):
    """``os.access`` says yes but the file system says no (EPERM on /sys, EROFS on a
    read-only mount): still one line naming --out, before any work, nothing left behind."""
    import relpos_lab.io

    def refuse(*args, **kwargs):
        raise OSError(errno_code, os.strerror(errno_code))

    monkeypatch.setattr(relpos_lab.io.tempfile, "mkdtemp", refuse)
    out = tmp_path / "refused" / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
    one_line_error(capsys, argv, f"--out {out}: cannot be created in {tmp_path} ({reason})", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if not p.name.startswith(".relpos-probe")
    )


def test_an_error_of_the_file_system_later_is_one_line_not_a_traceback(capsys, monkeypatch):
    from relpos_lab import cli

    def full_disk(args):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/model.safetensors")

    monkeypatch.setitem(cli.COMMANDS, "list", cli.COMMANDS["list"]._replace(run=full_disk))
    code, stdout, err = run(capsys, "list")
    assert code == 1 and stdout == "" and err.count("\n") == 1
    assert err.startswith("relpos: error: [Errno 28] No space left on device")


def test_empty_encodings_is_an_error_not_the_defaults(capsys, tmp_path, data_file):
    out = tmp_path / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
    one_line_error(capsys, [*argv, "--encodings", ""], "--encodings is empty", out)
    one_line_error(capsys, [*argv, "--encodings", " , "], "--encodings", out)


def test_messages_name_the_flags(capsys, tmp_path, data_file):
    out = tmp_path / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
    one_line_error(
        capsys, [*argv, "--tokenizer", "bpe", "--bpe-vocab-size", "100"], "--bpe-vocab-size", out
    )
    one_line_error(capsys, [*argv, "--seed", "-1"], "--seed must be an int >= 0", out)
    one_line_error(capsys, [*argv, "--split", "train"], "--split must be one of", out)


def test_sigterm_checkpoints_and_exits_143(capsys, tmp_path, data_file, monkeypatch):
    import importlib
    import os
    import signal

    trainer = importlib.import_module("relpos_lab.training.train")  # the module, not lab.train()
    real = trainer.sample_batch
    calls = []

    def batch_then_sigterm(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # noted by the handler; the step completes
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "sample_batch", batch_then_sigterm)
    out = tmp_path / "run"
    code, _, err = run(
        capsys, "extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)
    )
    assert code == 143
    assert "--resume" in err and "Traceback" not in err
    state = json.loads((out / "alibi" / "state.json").read_text())
    assert state["step"] == 2  # the step in flight finished and was checkpointed


def test_output_files_follow_the_umask(finished_run, tmp_path):
    import os

    from relpos_lab.io import atomic_write

    src, _ = finished_run
    for name in ("results.json", "report.md", "ppl_vs_length.png", "alibi/state.json"):
        mode = (src / name).stat().st_mode & 0o777
        assert mode & 0o044, f"{name} is {oct(mode)}: unreadable by others under umask 022"
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "x.txt", lambda tmp: Path(tmp).write_text("x"))
    finally:
        os.umask(old)
    assert (tmp_path / "x.txt").stat().st_mode & 0o777 == 0o640


# ------------------------------------------------------------------------------ optional deps


def without(monkeypatch, *modules: str) -> None:
    import sys

    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in modules):
            monkeypatch.setitem(sys.modules, name, None)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)  # `import m` raises ImportError


def test_without_matplotlib_everything_but_the_png_is_written(
    capsys, tmp_path, data_file, monkeypatch
):
    without(monkeypatch, "matplotlib")
    out = tmp_path / "run"
    code, stdout, err = run(
        capsys, "extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)
    )
    assert code == 0, err
    assert "matplotlib is not installed" in stdout and "pip install matplotlib" in stdout
    for name in ("results.json", "results.csv", "report.md", "run.json"):
        assert (out / name).is_file(), name
    assert not (out / "ppl_vs_length.png").exists()
    assert "matplotlib was not installed" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("module", "extra"),
    [("safetensors", ()), ("tokenizers", ("--tokenizer", "bpe"))],
)
def test_a_missing_dependency_is_one_line_before_any_work(
    capsys, tmp_path, data_file, monkeypatch, module, extra
):
    without(monkeypatch, module)
    out = tmp_path / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out), *extra]
    one_line_error(capsys, argv, f"needs {module}", out)
    _, _, err = run(capsys, *argv)
    assert f"pip install {module}" in err


def test_without_rich_the_run_prints_plain_tables(capsys, tmp_path, data_file, monkeypatch):
    without(monkeypatch, "rich")
    out = tmp_path / "run"
    argv = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--out", str(out)]
    code, stdout, err = run(capsys, *argv[:-1], str(out))
    assert code == 0, err
    assert "alibi" in stdout and "report:" in stdout


def test_model_flags_and_seeds_give_one_report_with_intervals(tmp_path, data_file, capsys):
    out = tmp_path / "seeds"
    args = ["extrapolate", "--data", str(data_file), *TINY_ARGS, "--encodings", "alibi"]
    args += ["--dim", "32", "--depth", "1", "--heads", "2", "--batch", "4", "--lr", "3e-3"]
    code, _, err = run(capsys, *args, "--seeds", "2", "--out", str(out))
    assert code == 0, err
    for seed in (0, 1):  # one standard run folder per seed
        assert (out / f"seed{seed}" / "run.json").is_file()
        assert (out / f"seed{seed}" / "alibi" / "state.json").is_file()
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert {(r["dim"], r["depth"], r["heads"], r["batch"], r["lr"]) for r in rows} == {
        ("32", "1", "2", "4", "0.003")
    }
    md = (out / "report.md").read_text()
    assert "seeds 0, 1 (cells: mean ± 95% CI)" in md and " ± " in md
    code, _, err = run(capsys, *args, "--dim", "30", "--heads", "4", "--out", str(tmp_path / "x"))
    assert code == 2 and "--dim (30) must be divisible by --heads (4)" in err
    code, _, err = run(capsys, *args, "--seeds", "2", "--out", str(out))
    assert code == 2 and "already holds a run" in err  # checked before any training


def test_xtransformers_profile_is_the_peer_configuration():
    from relpos_lab.training.profiles import get_profile

    p = get_profile("xtransformers")
    assert (p.dim, p.depth, p.num_heads, p.batch_size, p.steps) == (128, 4, 4, 32, 1000)
    assert (p.lr, p.warmup, p.weight_decay, p.min_lr_ratio) == (1e-3, 50, 0.01, 0.1)
