"""The two distributions and the public import paths: ``pip install relpos`` installs the
library alone (torch + numpy, no lab, no command), the lab ships the ``relpos`` command, and
every import path users had before the split still works or warns with its new path."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import relpos

ROOT = Path(__file__).resolve().parents[1]


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    pytest.importorskip("setuptools")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + [str(source), "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_the_library_wheel_holds_the_library_alone(tmp_path):
    wheel = _wheel(ROOT, tmp_path)
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"relpos", f"relpos-{relpos.__version__}.dist-info"}
    assert "relpos/py.typed" in names
    assert not [n for n in names if n.endswith("entry_points.txt")]  # no `relpos` command
    meta = Parser().parsestr(wheel.read(f"relpos-{relpos.__version__}.dist-info/METADATA").decode())
    required = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("<")[0] for r in required) == ["numpy", "torch"]
    assert {"hf", "gguf"} <= set(meta.get_all("Provides-Extra"))


def test_the_lab_ships_the_command_and_the_library_version():
    relpos_lab = pytest.importorskip("relpos_lab")
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "relpos"]
    assert script.value == "relpos_lab.cli:main"
    assert relpos_lab.__version__ == relpos.__version__


@pytest.mark.parametrize(
    "path",
    ["relpos.attention", "relpos.nn", "relpos.interop.hf", "relpos.registry", "relpos.functional"],
)
def test_public_modules_import(path):
    importlib.import_module(path)


def test_relpos_create_and_attention_stay_at_the_top():
    assert relpos.create is relpos.registry.create
    assert callable(relpos.attention) and callable(relpos.scores)


def test_the_old_efficient_names_resolve_with_a_warning_naming_the_new_path():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        efficient = importlib.import_module("relpos.efficient")
    from relpos.attention.fold import folded_attention
    from relpos.attention.linear import LinearState
    from relpos.nn.mixers.rola import rola_attention

    for name, new in [
        ("LinearState", LinearState),
        ("folded_attention", folded_attention),
        ("rola_attention", rola_attention),
    ]:
        with pytest.warns(DeprecationWarning, match=f"moved to {new.__module__}.{name}"):
            assert getattr(efficient, name) is new
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        efficient.not_a_name  # noqa: B018


def test_the_old_efficient_submodules_are_the_new_modules():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("relpos.efficient.rola")
        state = importlib.import_module("relpos.efficient.state")
    assert old is importlib.import_module("relpos.nn.mixers.rola")
    assert state is importlib.import_module("relpos.attention.linear.state")
