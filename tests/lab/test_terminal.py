"""Tables the commands print: whole on a terminal that fits them, aligned plain text on a
pipe, a file or a narrow terminal, and a pipe closed early is not an error."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from relpos_lab.terminal import Table, plain_text, print_table, strip_markup

TABLE = Table(
    "perplexity",
    ("encoding", "128 (1L)", "2048 (16L)"),
    [["alibi", "5.84", "[green]5.75[/]"], ["kerple-log", "5.90", "[red]123.40[/]"]],
    caption="trained at 128",
    right=frozenset({1, 2}),
)


class Terminal(io.StringIO):
    """A terminal of ``columns`` characters (rich reads COLUMNS)."""

    def isatty(self) -> bool:
        return True


def test_plain_text_aligns_columns_and_drops_markup():
    lines = plain_text(TABLE).splitlines()
    assert lines[0] == "perplexity" and lines[-1] == "trained at 128"
    header, rule, *body = lines[1:-1]
    assert header.split() == ["encoding", "128", "(1L)", "2048", "(16L)"]
    assert set(rule) == {"-", " "}
    assert [row.split() for row in body] == [
        ["alibi", "5.84", "5.75"],
        ["kerple-log", "5.90", "123.40"],
    ]
    assert len(body[0]) == len(body[1]) == len(header)  # numbers right-aligned to one edge
    assert "[" not in plain_text(TABLE)


def test_strip_markup_keeps_brackets_that_are_not_styles():
    assert strip_markup("[bold red]x[/] [0, 1)") == "x [0, 1)"


def test_a_pipe_gets_plain_text():
    out = io.StringIO()
    print_table(TABLE, out)
    assert out.getvalue() == plain_text(TABLE) + "\n"


def test_a_wide_terminal_gets_the_whole_rich_table(monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", "120")
    out = Terminal()
    print_table(TABLE, out)
    text = out.getvalue()
    assert "┃" in text or "│" in text  # rich's box
    for cell in ("kerple-log", "123.40", "2048 (16L)"):
        assert cell in text  # nothing cut to "…"
    assert "…" not in text


def test_a_narrow_terminal_gets_plain_text_not_cut_cells(monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", "30")
    out = Terminal()
    print_table(TABLE, out)
    assert out.getvalue() == plain_text(TABLE) + "\n"


def test_a_row_of_the_wrong_width_is_refused_by_name():
    with pytest.raises(ValueError, match="has 1 cells, expected 2"):
        Table("t", ("a", "b"), [["x"]])


def test_relpos_list_into_a_closed_pipe_exits_quietly():
    """`relpos list | head -1`: no BrokenPipeError traceback, exit status 0."""
    script = "import sys; from relpos_lab.cli import main; sys.exit(main(['list']))"
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err
