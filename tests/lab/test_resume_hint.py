"""The line an interrupted command prints is a command the CLI accepts and that resumes."""

from __future__ import annotations

import shlex

import pytest

from relpos_lab.cli import build_parser, main
from relpos_lab.training.runtime import resume_command


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["demo"], "relpos demo --resume"),
        (["demo", "--out", "runs/my demo"], "relpos demo --out 'runs/my demo' --resume"),
        (["extrapolate", "--force", "--steps", "10"], "relpos extrapolate --steps 10 --resume"),
        (["tasks", "--resume"], "relpos tasks --resume"),
        (None, "relpos longctx --resume"),
    ],
)
def test_resume_command(argv, expected):
    assert resume_command(argv, "longctx") == expected


def test_an_interrupted_demo_names_a_command_that_resumes_it(monkeypatch, tmp_path, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("relpos_lab.extrapolate.command.run_extrapolation", interrupted)
    code = main(["demo", "--out", str(tmp_path / "demo")])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted; continue with: relpos demo" in err
    hint = err.split("continue with: ", 1)[1].strip()
    args = build_parser().parse_args(shlex.split(hint)[1:])  # the CLI accepts it
    assert args.command == "demo" and args.resume and args.out == str(tmp_path / "demo")

    seen = {}

    def resumed(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr("relpos_lab.extrapolate.command.run_extrapolation", resumed)
    main(shlex.split(hint)[1:])
    assert seen.get("resume") is True and seen.get("force") is False
