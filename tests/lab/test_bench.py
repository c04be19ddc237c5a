"""``relpos bench``: flags are checked before anything runs (one line, exit 2, naming the
flag), and a tiny grid writes its table, JSON, CSV and plots."""

from __future__ import annotations

import csv
import json

import pytest

from relpos_lab import bench
from relpos_lab.cli import main

TINY = ["--lengths", "16,32", "--repeats", "1", "--warmup", "0", "--heads", "2", "--head-dim", "8"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lengths", "0"], "--lengths"),
        (["--lengths", "16,,32"], "--lengths"),
        (["--backends", "fast"], "--backends: unknown backend 'fast'"),
        (["--dtypes", "float8"], "--dtypes: unknown dtype 'float8'"),
        (["--encodings", "nonexistent"], "nonexistent"),
        (["--repeats", "0"], "--repeats"),
        (["--heads", "x"], "--heads"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(capsys, tmp_path, flags, message):
    code, out, err = run(capsys, "bench", *TINY, "--out", str(tmp_path / "o"), *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("relpos: error:") and message in err
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_refused_before_any_work(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    code, _, err = run(capsys, "bench", *TINY, "--out", str(target))
    assert code == 2 and "--out" in err and "not a folder" in err


def test_tiny_grid_writes_ratios_json_and_csv(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "write_plots", lambda out, result: [])  # test_plots (slow)
    out_dir = tmp_path / "bench"
    code, out, _ = run(
        capsys,
        "bench",
        *TINY,
        "--encodings",
        "alibi,t5",
        "--backends",
        "auto,fold",
        "--out",
        str(out_dir),
    )
    assert code == 0
    assert "machine:" in out and "| alibi | fold | fold-sdpa | float32 | 16 |" in out
    assert "refused: backend 'fold' cannot run encoding 't5'" in out
    result = json.loads((out_dir / "results.json").read_text())
    assert result["machine"]["cpu"] and result["settings"]["lengths"] == [16, 32]
    timed = [c for c in result["cases"] if "median_s" in c]
    # baseline + alibi/auto, alibi/fold, t5/auto at two lengths; t5/fold refused
    assert len(timed) == 8 and all(c["ratio"] > 0 and "extra_mb" in c for c in timed)
    base = [c for c in timed if c["backend"] == "sdpa-nobias"]
    assert all(c["ratio"] == 1.0 for c in base)
    rows = list(csv.DictReader((out_dir / "results.csv").open()))
    assert len(rows) == len(result["cases"]) == 10


@pytest.mark.slow
def test_plots_are_log_log_pngs_one_line_per_backend(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "bench"
    argv = [*TINY, "--encodings", "alibi", "--backends", "auto,fold", "--no-memory"]
    code, out, _ = run(capsys, "bench", *argv, "--out", str(out_dir))
    assert code == 0 and "time_vs_length.png" in out
    for name in ("time_vs_length.png", "memory_vs_length.png"):
        if name.startswith("memory"):  # --no-memory: no memory plot
            assert not (out_dir / name).exists()
            continue
        assert (out_dir / name).read_bytes()[:4] == b"\x89PNG"
