"""The README's demo results come from the recorded run: the block between the demo-results
markers is the rendering of docs/runs/demo/results.json, the plot carries that file's hash,
the recorded run is today's ``relpos demo``, and what the README says about it holds.

``make readme-results`` (``python -m relpos_lab.readme_results``) regenerates both; with
``RERUN=1`` it first reruns the demo and records it.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from relpos_lab import readme_results as rr
from relpos_lab.report import ppl_grid
from relpos_lab.training.profiles import HEADLINE, get_profile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = json.loads((ROOT / rr.RESULTS).read_text(encoding="utf-8"))
RECORDING = json.loads((ROOT / rr.RECORDING).read_text(encoding="utf-8"))


def ratios(mode: str) -> dict[str, float]:
    """ppl at the longest length over ppl at the training length, per encoding."""
    train_len = RESULTS["rows"][0]["train_len"]
    return {
        name: values[max(values)] / values[train_len]
        for name, values in ppl_grid(RESULTS["rows"], mode).items()
    }


def test_the_readme_block_is_the_rendering_of_the_recorded_run():
    block = rr.readme_block((ROOT / rr.README).read_text(encoding="utf-8"))
    assert block == rr.render_block(RESULTS, RECORDING), "stale: run `make readme-results`"


def test_the_readme_plot_was_drawn_from_the_recorded_run():
    digest = rr.results_digest(ROOT / rr.RESULTS)
    assert rr.png_text(ROOT / rr.PLOT).get(rr.RESULTS_HASH_KEY) == digest, (
        "docs/img/ppl_vs_length.png was not drawn from the recorded results: "
        "run `make readme-results`"
    )
    assert RECORDING["results_sha256"] == digest
    assert f"]({rr.PLOT.as_posix()})" in rr.readme_block((ROOT / rr.README).read_text())


def test_the_recorded_run_is_the_demo_of_todays_quick_profile():
    rr.check_demo_results(RESULTS, "recorded")
    quick = get_profile("quick")
    rows = RESULTS["rows"]
    assert list(dict.fromkeys(r["encoding"] for r in rows)) == list(HEADLINE)
    assert {(r["dim"], r["depth"], r["heads"], r["batch"], r["steps"]) for r in rows} == {
        (quick.dim, quick.depth, quick.num_heads, quick.batch_size, quick.steps)
    }
    head = "tied" if quick.tie_embedding else "untied"
    assert {(r["init"], r["head"]) for r in rows} == {(quick.init, head)}
    assert {r["mode"] for r in rows} == set(quick.modes)
    assert sorted({r["eval_len"] for r in rows}) == [128, 256, 512, 1024, 2048]
    assert RESULTS["meta"]["wall_seconds"] > 0


def test_what_the_readme_says_about_the_demo_holds_for_the_recorded_run():
    """README: sinusoidal blows up past L and RoPE degrades within a few multiples of L
    (both at least 1.5x at 16L), while ALiBi and KERPLE-log stay flat (within 15%); the
    percentages it quotes for FIRE and NoPE are the recorded ones."""
    for mode in ("nonoverlapping", "sliding"):
        ratio = ratios(mode)
        assert ratio["rope"] >= 1.5 and ratio["sinusoidal"] >= 1.5, (mode, ratio)
        assert ratio["alibi"] <= 1.15 and ratio["kerple-log"] <= 1.15, (mode, ratio)
    prose = " ".join((ROOT / rr.README).read_text(encoding="utf-8").split())
    ratio = ratios("nonoverlapping")
    (fire,) = re.findall(r"FIRE rises (\d+)% by 16L", prose)
    (nope,) = re.findall(r"NoPE rises only (\d+)%", prose)
    assert int(fire) == round(100 * (ratio["fire"] - 1)), ratio["fire"]
    assert int(nope) == round(100 * (ratio["nope"] - 1)), ratio["nope"]


# ------------------------------------------------------------------------------ the tool


def tiny_png() -> bytes:
    """A valid 1x1 grey PNG."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\x80"))
        + chunk(b"IEND", b"")
    )


def test_png_text_round_trip(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(rr.add_png_text(tiny_png(), {"a key": "value 1", "b": "2"}))
    assert rr.png_text(path) == {"a key": "value 1", "b": "2"}
    (tmp_path / "plain.png").write_bytes(tiny_png())
    assert rr.png_text(tmp_path / "plain.png") == {}
    with pytest.raises(ValueError, match="not a PNG"):
        rr.add_png_text(b"GIF89a", {"a": "b"})


def test_replace_block_needs_exactly_one_block():
    text = f"a\n{rr.START}\nold\n{rr.END}\nb\n"
    assert rr.replace_block(text, "new") == f"a\n{rr.START}\nnew\n{rr.END}\nb\n"
    for bad in ("no markers", text + text, f"{rr.END}\n{rr.START}"):
        with pytest.raises(ValueError, match="expected one"):
            rr.replace_block(bad, "new")


def copy_root(tmp_path: Path) -> Path:
    """README.md and the recorded run in a scratch repository root (no plot yet)."""
    root = tmp_path / "repo"
    (root / rr.RESULTS.parent).mkdir(parents=True)
    shutil.copy(ROOT / rr.README, root / rr.README)
    for path in (rr.RESULTS, rr.RECORDING):
        shutil.copy(ROOT / path, root / path)
    return root


def test_regeneration_draws_the_plot_and_leaves_a_current_readme_alone(tmp_path, capsys):
    root = copy_root(tmp_path)
    readme = (root / rr.README).read_text()
    assert rr.main(["--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == f"updated: {rr.PLOT}"  # the README was current
    assert (root / rr.README).read_text() == readme
    digest = rr.results_digest(root / rr.RESULTS)
    assert rr.png_text(root / rr.PLOT)[rr.RESULTS_HASH_KEY] == digest
    assert rr.main(["--root", str(root)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_new_results_rewrite_the_block_and_redraw_the_plot(tmp_path, capsys):
    root = copy_root(tmp_path)
    data = json.loads((root / rr.RESULTS).read_text())
    for row in data["rows"]:
        row["ppl"] *= 2
    (root / rr.RESULTS).write_text(json.dumps(data))
    (root / rr.PLOT.parent).mkdir(parents=True)
    shutil.copy(ROOT / rr.PLOT, root / rr.PLOT)
    assert rr.main(["--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == f"updated: {rr.README}, {rr.PLOT}"
    block = rr.readme_block((root / rr.README).read_text())
    assert block == rr.render_block(data, RECORDING)
    train_len = data["rows"][0]["train_len"]
    rope = ppl_grid(data["rows"], "nonoverlapping")["rope"][train_len]
    assert f"| `rope` | {rope:.2f} |" in block
    assert rr.png_text(root / rr.PLOT)[rr.RESULTS_HASH_KEY] == rr.results_digest(root / rr.RESULTS)


def test_only_a_demo_run_is_recorded(tmp_path, capsys):
    root = copy_root(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    data = json.loads((root / rr.RESULTS).read_text())
    data["meta"]["command"] = "relpos extrapolate --steps 3"
    (other / "results.json").write_text(json.dumps(data))
    before = (root / rr.RESULTS).read_bytes()
    assert rr.main(["--root", str(root), "--from", str(other)]) == 2
    err = capsys.readouterr().err
    assert "relpos extrapolate --steps 3" in err and "`relpos demo`" in err
    assert (root / rr.RESULTS).read_bytes() == before
    assert rr.main(["--root", str(root), "--from", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_recording_a_demo_folder_copies_it_with_its_hash(tmp_path, capsys):
    root = copy_root(tmp_path)
    demo = tmp_path / "runs" / "demo"
    demo.mkdir(parents=True)
    data = json.loads((root / rr.RESULTS).read_text())
    data["meta"]["wall_seconds"] = 1.0
    (demo / "results.json").write_text(json.dumps(data))
    assert rr.main(["--root", str(root), "--from", str(demo)]) == 0
    assert (root / rr.RESULTS).read_bytes() == (demo / "results.json").read_bytes()
    recording = json.loads((root / rr.RECORDING).read_text())
    assert recording["results_sha256"] == rr.results_digest(demo / "results.json")
    assert "It took 0.0 min of wall time" in " ".join(
        rr.readme_block((root / rr.README).read_text()).split()
    )
