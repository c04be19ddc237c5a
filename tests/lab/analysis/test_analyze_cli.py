"""``relpos analyze``: each mode writes a PNG and a JSON and prints a table; bad input is one
error line (exit 2) and writes nothing."""

from __future__ import annotations

import json
import math
import sys

import pytest

from relpos_lab.cli import COMMANDS, main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read(path):
    # Strict JSON: NaN / Infinity would fail here.
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=pytest.fail)


def assert_written(out_dir, stem: str) -> dict:
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == [f"{stem}.json", f"{stem}.png"]  # no temporary files left behind
    assert (out_dir / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = read(out_dir / f"{stem}.json")
    assert data["meta"]["command"].startswith(f"relpos analyze {stem.replace('_', '-')}")
    return data


def test_analyze_is_one_command_entry():
    assert "analyze" in COMMANDS


def test_decay(capsys, tmp_path):
    out = tmp_path / "a"
    code, stdout, err = run(
        capsys, "analyze", "decay", "--encodings", "rope,xpos,nope", "--max-distance", "64",
        "--head-dim", "16", "--samples", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    data = assert_written(out, "decay")
    curves = {c["encoding"]: c for c in data["curves"]}
    assert list(curves) == ["rope", "xpos", "nope"]
    assert len(curves["rope"]["bound"]) == 65 and curves["rope"]["samples"] == 16
    assert curves["nope"]["bound"] == [pytest.approx(4.5)] * 65
    assert "rope" in stdout and "xpos" in stdout and "long-term decay" in stdout


def test_base_bound(capsys, tmp_path):
    code, stdout, err = run(
        capsys, "analyze", "base-bound", "--context", "4096,1024", "--out", str(tmp_path)
    )
    assert code == 0, err
    data = assert_written(tmp_path, "base_bound")
    assert [b["context"] for b in data["bounds"]] == [1024, 4096]
    # Spec section 11: 4299.0 at 1024, 26959.3 at 4096.
    assert [b["base"] for b in data["bounds"]] == [
        pytest.approx(4299.0, abs=0.06),
        pytest.approx(26959.3, abs=0.06),
    ]
    assert "26,959.3" in stdout


def test_resolution(capsys, tmp_path):
    code, stdout, err = run(
        capsys, "analyze", "resolution", "--encodings", "rope,nope", "--lengths", "16,64",
        "--head-dim", "16", "--samples", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = assert_written(tmp_path, "resolution")
    results = {r["encoding"]: r for r in data["results"]}
    assert results["nope"]["resolution"] == [0.0, 0.0]
    assert all(v > 0 for v in results["rope"]["resolution"])
    assert "L=64" in stdout


def test_frequencies_with_a_scaling(capsys, tmp_path):
    scaling = '{"rope_type":"yarn","factor":4,"original_max_position_embeddings":2048}'
    code, stdout, err = run(
        capsys, "analyze", "frequencies", "--scaling", scaling, "--out", str(tmp_path)
    )
    assert code == 0, err
    data = assert_written(tmp_path, "frequencies")
    assert [p["label"] for p in data["profiles"]] == ["default", "yarn"]
    yarn = data["profiles"][1]
    assert yarn["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert len(yarn["wavelength"]) == 64
    assert "yarn" in stdout


def test_frequencies_presets_serialise_infinite_wavelengths_as_null(capsys, tmp_path):
    code, _, err = run(capsys, "analyze", "frequencies", "--head-dim", "32", "--out", str(tmp_path))
    assert code == 0, err
    data = assert_written(tmp_path, "frequencies")
    labels = [p["label"] for p in data["profiles"]]
    assert labels == ["default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope",
                      "proportional"]  # fmt: skip
    assert None in data["profiles"][-1]["wavelength"]  # p-RoPE's zero frequencies


@pytest.mark.parametrize(
    "argv,message",
    [
        (["decay", "--max-distance", "0"], "--max-distance must be a positive int, got 0"),
        (["decay", "--max-distance", "ten"], "--max-distance must be a positive int, got 'ten'"),
        (["decay", "--encodings", "rope,nosuch"], "unknown encoding 'nosuch'"),
        (["decay", "--encodings", "rope,,xpos"], "--encodings has an empty name"),
        (
            ["decay", "--key-correlation", "2"],
            "--key-correlation must be a finite number >= -1 and <= 1",
        ),
        (["resolution", "--lengths", "16,1"], "--lengths must be an int >= 2, got 1"),
        (["base-bound", "--context", "1024,x"], "--context must be a positive int, got 'x'"),
        (["base-bound", "--head-dim", "127"], "--head-dim must be even, got 127"),
        (["frequencies", "--scaling", "{bad"], "--scaling must be a JSON object"),
        (["frequencies", "--scaling", "[1]"], "--scaling must be a JSON object"),
        (["frequencies", "--scaling", '{"rope_type":"nosuch"}'], "nosuch"),
        (["frequencies", "--scaling", '{"rope_type":"linear"}'], "factor"),
        (["frequencies", "--base", "1"], "--base must be a finite number > 1"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "analyze", *argv, "--out", str(out))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("relpos: error: ")
    assert message in err
    assert "Traceback" not in err and stdout == ""
    assert not out.exists()


def test_out_must_not_be_a_file(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    code, _, err = run(capsys, "analyze", "base-bound", "--context", "64", "--out", str(target))
    assert code == 2 and "exists and is not a folder" in err
    assert target.read_text() == "x"


def test_unknown_mode_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["analyze", "nosuch"])
    assert exc.value.code == 2


def test_table_without_rich_is_plain_text(capsys, tmp_path, monkeypatch):
    for name in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)  # `import rich...` raises ImportError
    code, stdout, err = run(
        capsys, "analyze", "base-bound", "--context", "1024", "--out", str(tmp_path)
    )
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[1].startswith("RoPE base lower bound")
    assert lines[2].split()[:2] == ["context", "lower"]
    assert set(lines[3]) == {"-", " "}  # the rule under the header
    assert lines[4].split()[:2] == ["1,024", "4,299.0"]
