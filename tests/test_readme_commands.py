"""Every shell command of README.md runs: each line of its ```sh blocks, in README order, in one
scratch folder (so a command finds the folders that earlier commands create).

* ``relpos ...`` runs through ``relpos_lab.cli.main`` and ``python -m MODULE ...`` through
  ``runpy`` (both in this process), ``torchrun ...`` as a subprocess; each gets the tiny
  settings of ``TINY`` appended (argparse: the last flag wins). The tiny settings only shrink
  sizes (steps, widths, lengths, the text); they never change a name the README wrote
  (encodings, methods, tasks, suites, models, folders), so a misspelt name or a stale flag
  fails here.
* ``make X`` checks that the Makefile has the target (``make -n X``).
* ``pip install ...`` lines (the Install section) run in a fresh virtual environment, in
  order, in the slow test ``test_install_lines_in_a_fresh_venv``.
* ``torchrun`` and commands that load SmolLM2 (``--model smollm2``, or ``relpos longctx``'s
  default model) are slow tests; the others are fast.

A command no runner knows, or with no entry in ``TINY``, fails
``test_every_command_has_a_runner``; a code block in another shell dialect (```bash) fails
``test_code_blocks_are_python_or_sh``. Commands quoted inline in the README's prose
(```relpos ...```) must parse with the CLI's own parser (``test_inline_relpos_commands_parse``).
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from relpos_lab.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SRC_PATHS = [str(ROOT / "src"), str(ROOT / "lab" / "src")]
TEXT_FILE = "readme-test-text.txt"  # written into the scratch folder (see the fixture)

#: tiny settings per command prefix (the longest prefix that matches applies)
TINY: dict[tuple[str, ...], tuple[str, ...]] = {
    ("relpos", "extrapolate"): (
        "--train-len", "16", "--eval-mult", "1,2", "--steps", "3", "--dim", "16", "--depth",
        "1", "--heads", "2", "--batch", "4", "--data", TEXT_FILE, "--no-progress",
    ),
    ("relpos", "tasks"): (
        "--dim", "16", "--depth", "1", "--heads", "2", "--batch", "4", "--steps", "3",
        "--train-len", "4", "--test-lengths", "5-6", "--eval-size", "8", "--seeds", "1",
        "--jobs", "1", "--no-progress",
    ),
    ("relpos", "tasks", "--suite", "multiview"): (  # head dim 24: RayRoPE's 3 rays x 8
        "--dim", "48", "--depth", "1", "--heads", "2", "--batch", "4", "--steps", "3",
        "--eval-size", "8", "--seeds", "1", "--jobs", "1", "--no-progress",
    ),
    ("relpos", "longctx"): (
        "--lengths", "300", "--depths", "0.5", "--seeds", "1", "--ppl-tokens", "16",
        "--data", TEXT_FILE, "--no-progress",
    ),
    ("relpos", "analyze", "decay"): ("--max-distance", "64", "--samples", "16"),
    ("relpos", "analyze", "base-bound"): ("--grid-points", "64"),
    ("relpos", "analyze", "resolution"): ("--lengths", "16,64", "--samples", "16"),
    ("relpos", "analyze", "frequencies"): (),
    ("relpos", "analyze", "receptive-field"): (
        "--lengths", "32", "--erf-length", "16", "--texts", "1",
    ),
    ("relpos", "analyze", "positional-heads"): ("--length", "32", "--samples", "1"),
    ("relpos", "analyze", "kv-phase"): (
        "--depths", "0.5", "--prompts", "1", "--context", "320",
    ),
    ("python", "-m", "relpos_lab.tasks.coupling_attention"): (
        "--lengths", "5,6", "--eval-size", "8",
    ),
    ("torchrun",): (
        "--steps", "3", "--dim", "16", "--depth", "1", "--num-heads", "2", "--seq-len", "16",
        "--batch-size", "4", "--data", TEXT_FILE, "--no-progress",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Command:
    """One README shell command: its line in README.md and its words (comments dropped)."""

    line: int
    words: tuple[str, ...]

    @property
    def kind(self) -> str:
        if self.words[:2] == ("pip", "install"):
            return "pip"
        if self.words[0] in ("relpos", "make", "torchrun"):
            return self.words[0]
        if self.words[:2] == ("python", "-m"):
            return "python"
        return "unknown"

    @property
    def label(self) -> str:
        return f"README.md:{self.line}: {shlex.join(self.words)}"

    def tiny(self) -> tuple[str, ...]:
        """The tiny settings of the longest matching ``TINY`` prefix (KeyError: none)."""
        keys = [k for k in TINY if self.words[: len(k)] == k]
        if not keys:
            raise KeyError(self.label)
        return TINY[max(keys, key=len)]

    @property
    def slow(self) -> bool:
        if self.kind in ("pip", "torchrun"):
            return True
        if self.kind == "relpos":
            try:
                args = build_parser().parse_args(list(self.words[1:]))
            except SystemExit:  # a stale flag: the fast test runs it and fails
                return False
            return "smollm2" in str(getattr(args, "model", None) or "").split(",")
        return False


def shell_commands(text: str) -> list[Command]:
    """The commands of every ```sh block of ``text``: backslash continuations joined, ``#``
    comments dropped, one ``Command`` per non-empty line."""
    commands = []
    for match in re.finditer(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        first_line = text.count("\n", 0, match.start(1)) + 1
        pending, start = "", None
        for offset, raw in enumerate(match.group(1).splitlines()):
            if start is None:
                start = first_line + offset
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            words = shlex.split(pending + raw, comments=True)
            if words:
                commands.append(Command(start, tuple(words)))
            pending, start = "", None
        assert not pending, f"README.md:{start}: a sh block ends with a continuation line"
    return commands


COMMANDS = shell_commands(README.read_text(encoding="utf-8"))


def english_text(chars: int = 24_000) -> str:
    """English text that needs no download: the stdlib's pydoc topics."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*SRC_PATHS, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class ReadmeSession:
    """One scratch folder in which the README's commands run in order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / TEXT_FILE).write_text(english_text(), encoding="utf-8")
        self.tried: set[int] = set()

    def run_through(self, index: int, capsys, monkeypatch) -> None:
        """Run the fast commands before ``index`` not yet tried here (a failure there is that
        command's test's failure; this one goes on), then command ``index``."""
        for k in range(index):
            command = COMMANDS[k]
            if k not in self.tried and command.kind in ("relpos", "python") and not command.slow:
                try:
                    self.run(k, capsys, monkeypatch)
                except AssertionError:
                    pass
        self.run(index, capsys, monkeypatch)

    def run(self, index: int, capsys, monkeypatch) -> None:
        command = COMMANDS[index]
        words = [*command.words, *command.tiny()]
        self.tried.add(index)
        t0 = time.perf_counter()
        if command.kind in ("relpos", "python"):
            # in this process (torch is imported once): `relpos ARGS` is main(ARGS),
            # `python -m MODULE ARGS` runs MODULE as __main__ with sys.argv = [MODULE, ARGS]
            monkeypatch.chdir(self.folder)
            try:
                if command.kind == "relpos":
                    code = main(words[1:])
                else:
                    assert words[1] == "-m", f"{command.label}: only `python -m MODULE` runs"
                    monkeypatch.setattr(sys, "argv", [words[2], *words[3:]])
                    runpy.run_module(words[2], run_name="__main__", alter_sys=True)
                    code = 0
            except SystemExit as stop:  # argparse errors, or the module's own exit code
                code = 0 if stop.code is None else stop.code
            out, err = capsys.readouterr()
        else:  # torchrun: N processes
            argv = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
            proc = subprocess.run(
                argv, cwd=self.folder, env=_env(), capture_output=True, text=True, timeout=900
            )
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        seconds = time.perf_counter() - t0
        assert code == 0, (
            f"{command.label}\nwith tiny settings {shlex.join(command.tiny())}\nexit {code} "
            f"after {seconds:.1f} s\n--- stdout (tail)\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
        )


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Iterator[ReadmeSession]:
    # tiny models: one intra-op thread is faster, and much faster on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield ReadmeSession(tmp_path_factory.mktemp("readme"))
    finally:
        torch.set_num_threads(threads)


def _param(index: int) -> pytest.param:
    command = COMMANDS[index]
    marks = [pytest.mark.slow] if command.slow else []
    return pytest.param(index, marks=marks, id=f"line{command.line}-{command.words[0]}")


RUNNABLE = [k for k, c in enumerate(COMMANDS) if c.kind in ("relpos", "python", "torchrun")]


def test_the_readme_has_commands_of_every_kind():
    kinds = {c.kind for c in COMMANDS}
    assert {"pip", "make", "relpos", "python", "torchrun"} <= kinds


def test_code_blocks_are_python_or_sh():
    """Only ```python (tests/test_readme.py runs them) and ```sh (run here) hold code."""
    fences = re.findall(r"^```(.*)$", README.read_text(encoding="utf-8"), flags=re.M)
    opening = fences[::2]
    assert fences and len(fences) % 2 == 0 and set(opening) <= {"python", "sh"}, opening


def test_every_command_has_a_runner():
    for command in COMMANDS:
        assert command.kind != "unknown", f"{command.label}: no runner for this command"
        if command.kind in ("relpos", "python", "torchrun"):
            try:
                command.tiny()
            except KeyError:
                pytest.fail(f"{command.label}: add its tiny settings to TINY")


@pytest.mark.parametrize("index", [k for k, c in enumerate(COMMANDS) if c.kind == "make"])
def test_make_target_exists(index):
    command = COMMANDS[index]
    assert len(command.words) == 2, f"{command.label}: one target per line"
    proc = subprocess.run(
        ["make", "-n", command.words[1]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{command.label}: {proc.stderr}"


@pytest.mark.parametrize("index", [_param(k) for k in RUNNABLE])
def test_readme_command_runs(index, session, capsys, monkeypatch):
    session.run_through(index, capsys, monkeypatch)


def test_readme_commands_parse():
    """Every ``relpos`` command of the sh blocks parses as written (the slow ones included)."""
    for command in COMMANDS:
        if command.kind == "relpos":
            build_parser().parse_args(list(command.words[1:]))


def inline_relpos_commands(text: str) -> list[str]:
    """Inline code spans of the prose that are a ``relpos`` command with arguments."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`([^`]+)`", prose.replace("\n", " "))
    return [s for s in spans if re.fullmatch(r"relpos [a-z-]+ .+", s.strip())]


def test_inline_relpos_commands_parse(capsys):
    spans = inline_relpos_commands(README.read_text(encoding="utf-8"))
    assert spans, "README.md quotes no relpos command inline"
    for span in spans:
        try:
            build_parser().parse_args(shlex.split(span)[1:])
        except SystemExit:
            pytest.fail(f"README.md quotes `{span}`, which relpos rejects: {capsys.readouterr()}")


def test_shell_commands_join_continuations_and_drop_comments():
    text = "x\n```sh\na --b 1 \\\n    --c 'd e'   # note\n\n# only a comment\nmake demo\n```\n"
    assert shell_commands(text) == [
        Command(3, ("a", "--b", "1", "--c", "d e")),
        Command(7, ("make", "demo")),
    ]


# ------------------------------------------------------------------------------ install


def _copy_sources(target: Path) -> None:
    """What `pip install .` and `pip install ./lab` read, without build outputs."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "src", target / "src", ignore=ignore)
    shutil.copytree(ROOT / "lab", target / "lab", ignore=ignore)


PIP = [c for c in COMMANDS if c.kind == "pip"]
LIBRARY_CHECK = "import relpos; relpos.create('alibi', num_heads=2, head_dim=8)"


def pinned(command: Command) -> list[str]:
    """A README pip line with ``-c constraints.txt`` added where it has none: every line then
    installs the torch the tests run with (here the local CPU wheel), never another build."""
    words = list(command.words)
    if "-c" not in words and "--constraint" not in words:
        words[2:2] = ["-c", "constraints.txt"]
    return words


@pytest.mark.slow  # a fresh virtual environment: torch from the local wheel, then the extras
def test_install_lines_in_a_fresh_venv(tmp_path):
    """The Install section's pip lines, in order (each pinned by constraints.txt), in a plain
    venv (no system site-packages) at a copy of the sources: the first gives the library
    alone (``import relpos`` works; no ``relpos`` command, no transformers), the last the
    lab's ``relpos`` command."""
    assert PIP and PIP[0].words == ("pip", "install", "."), "the library's line comes first"
    _copy_sources(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    python = str(bin_dir / "python")

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
        )
        print(f"{shlex.join(argv)}: {time.perf_counter() - t0:.0f} s, exit {proc.returncode}")
        return proc

    def pip(command: Command) -> None:
        proc = run([python, "-m", *pinned(command)])
        assert proc.returncode == 0, f"{command.label}\n{proc.stdout[-3000:]}\n{proc.stderr}"

    pip(PIP[0])
    proc = run([python, "-c", LIBRARY_CHECK])
    assert proc.returncode == 0, proc.stderr
    assert not (bin_dir / "relpos").exists(), "the library alone installed the relpos command"
    proc = run([python, "-c", "import transformers"])
    assert proc.returncode != 0, "the library alone installed transformers"
    for command in PIP[1:]:
        pip(command)
    assert (bin_dir / "relpos").exists(), "the Install section's last line gives no relpos"
    proc = run([str(bin_dir / "relpos"), "list"])
    assert proc.returncode == 0 and "alibi" in proc.stdout, proc.stderr
    proc = run([python, "-c", "import transformers, gguf, relpos.interop.hf"])
    assert proc.returncode == 0, proc.stderr
