"""The ``relpos`` command, run in-process through ``relpos_lab.cli.main``."""

from __future__ import annotations

import sys

import pytest

import relpos
from relpos_lab.cli import COMMANDS, main, markdown_table


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_registered_encoding(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for name in relpos.available():
        assert name in out


def test_list_without_rich_prints_plain_text(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)  # makes `import rich...` raise ImportError
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    code, out, _ = run(capsys, "list")
    assert code == 0
    title, header, rule, *lines = out.splitlines()
    assert title == f"relpos encodings ({len(relpos.available())})"
    assert header.split() == ["name", "family", "relative", "hooks", "paper"]
    assert set(rule) == {"-", " "}
    assert [line.split()[0] for line in lines] == relpos.available()
    starts = {line.index(line.split()[1], len(line.split()[0])) for line in lines}
    assert len(starts) == 1  # the family column starts at one place: aligned


def test_list_markdown(capsys):
    code, out, _ = run(capsys, "list", "--markdown")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "| name | family | relative | hooks | paper |"
    assert lines[1].startswith("|---|")
    assert len(lines) == 2 + len(relpos.available())
    assert "| `rope` | rotary | yes | rotate | Su et al. 2021 (RoFormer) |" in lines
    assert out.strip() == markdown_table()


def test_list_family_filter(capsys):
    code, out, _ = run(capsys, "list", "--markdown", "--family", "rotary")
    assert code == 0
    names = [line.split("`")[1] for line in out.strip().splitlines()[2:]]
    expected = [
        n for n in relpos.available() if relpos.registry.encoding_class(n).family == "rotary"
    ]
    assert names == expected and "rope" in names


def test_unknown_family_is_one_line_error(capsys):
    code, out, err = run(capsys, "list", "--family", "nosuch")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("relpos: error: unknown family 'nosuch'; known: ")
    assert "bias" in err and "rotary" in err
    assert "Traceback" not in err


def test_errors_from_relpos_inside_a_command_exit_2(capsys, monkeypatch):
    def boom(args):
        relpos.create("nosuch", num_heads=1, head_dim=2)

    monkeypatch.setitem(COMMANDS, "demo", COMMANDS["demo"]._replace(run=boom))
    code, _, err = run(capsys, "demo")
    assert code == 2
    assert err.startswith("relpos: error: unknown encoding 'nosuch'")
    assert err.count("\n") == 1


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["nosuch"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_demo_runs_attention(capsys):
    code, out, _ = run(capsys, "demo", "--attention-only")
    assert code == 0
    assert "extrapolate" in out
    for name in relpos.available():
        assert name in out
    starts = ("  alibi", "  rope", "  t5")
    rows = [line.split() for line in out.splitlines() if line.startswith(starts)]
    assert [r[0] for r in rows] == ["alibi", "rope", "t5", "t5"]
    # the column is what auto takes for that call: the plan of the same call (the measured
    # policy of relpos.attention.policy decides which backend that is on this machine)
    import torch

    from relpos.attention import plan

    expected = []
    for name, length in (("alibi", 128), ("rope", 128), ("t5", 128), ("t5", 2048)):
        enc = relpos.create(name, num_heads=4, head_dim=32)
        q = torch.randn(1, 4, length, 32)
        expected.append(plan(q, q, q, enc, causal=True)[0])
    assert [r[-2] for r in rows] == expected
    for r in rows:  # last column: max |auto - eager|
        assert float(r[-1]) < 1e-4


def test_list_name_prints_the_encodings_card(capsys):
    import relpos

    code, out, _ = run(capsys, "list", "kerple-log")
    assert code == 0 and out.strip() == relpos.describe("kerple-log")


def test_list_of_an_unknown_name_suggests_one_line(capsys):
    code, out, err = run(capsys, "list", "Alibi")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "did you mean 'alibi'" in err
