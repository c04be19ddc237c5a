"""``relpos extrapolate`` end to end (a 3-step run) and its error paths, in-process."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from relpos.cli import main

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
