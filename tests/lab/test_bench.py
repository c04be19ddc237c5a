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


GRID = ["--heads", "2", "--head-dim", "8", "--lengths", "16", "--repeats", "1", "--warmup", "0"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--masks", "diagonal"], "--masks: unknown mask 'diagonal'"),
        (["--modes", "sideways"], "--modes: unknown mode 'sideways'"),
        (["--flex-lengths", "x"], "--flex-lengths"),
        (["--dtypes", "float8"], "--dtypes: unknown dtype 'float8'"),
        (["--merge"], "--merge: only with --calibrate"),
    ],
)
def test_auto_vs_best_flags_are_checked_first(capsys, tmp_path, flags, message):
    argv = ["bench", "--auto-vs-best", *GRID, "--out", str(tmp_path / "o"), *flags]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_auto_vs_best_reports_auto_over_best_per_call_and_the_worst(capsys, tmp_path):
    out_dir = tmp_path / "avb"
    argv = [*GRID, "--encodings", "alibi,rope,shaw", "--masks", "causal", "--modes", "forward"]
    code, out, _ = run(capsys, "bench", "--auto-vs-best", *argv, "--out", str(out_dir))
    assert code == 0
    assert "| auto runs | best | auto/best |" in out and "auto / best over 6 calls" in out
    result = json.loads((out_dir / "results.json").read_text())
    rows = result["rows"]
    assert len(rows) == 6  # 3 encodings x float32 / bfloat16
    for r in rows:
        assert r["best"] in r["times"] and r["auto_over_best"] > 0
        assert r["auto_plan"][0] in r["times"] or r["auto_plan"][0] in r["notes"]
        assert not r.get("auto_outside_eligible")
    shaw = next(r for r in rows if r["encoding"] == "shaw")
    assert "sdpa" not in shaw["times"] and "cannot run encoding 'shaw'" in shaw["notes"]["sdpa"]
    assert result["summary"]["cases"] == 6
    assert len((out_dir / "rows.jsonl").read_text().splitlines()) == 6


@pytest.mark.slow
def test_calibrate_writes_a_table_auto_reads(capsys, tmp_path, monkeypatch):
    from relpos.attention import policy

    table_path = tmp_path / "table.json"
    monkeypatch.setenv(policy.TABLE_ENV, str(table_path))
    argv = [*GRID, "--encodings", "alibi,shaw", "--masks", "causal", "--dtypes", "float32"]
    try:
        code, out, _ = run(capsys, "bench", "--calibrate", *argv, "--out", str(tmp_path / "c"))
        assert code == 0 and f"{table_path} (policy table" in out
        table = policy.load_table(table_path)
        assert set(table.entries) == {
            "cpu/float32/toeplitz/causal/forward",
            "cpu/float32/toeplitz/causal/train",
            "cpu/float32/probabilities/causal/forward",
            "cpu/float32/probabilities/causal/train",
        }
        assert table.meta["command"].startswith("relpos bench --calibrate")
        assert policy.active_table().entries.keys() >= table.entries.keys()  # reloaded
    finally:
        monkeypatch.undo()
        policy.reload()


def test_calibration_runs_merge_with_the_latest_row_of_each_call():
    from relpos.attention import policy
    from relpos_lab.auto_bench import calibration_points, merged_rows

    key = "cpu/float32/toeplitz/causal/train"

    def row(encoding, length, times):
        return {
            "encoding": encoding,
            "length": length,
            "causal": True,
            "mode": "train",
            "dtype": "float32",
            "key": key,
            "elements": 8 * length * length,
            "times": times,
        }

    first = [row("alibi", 64, {"sdpa": 1.0, "chunked": 2.0}), row("alibi", 256, {"sdpa": 3.0})]
    again = [row("alibi", 256, {"sdpa": 3.0, "chunked": 1.0})]  # re-measured: replaces
    added = [
        row("alibi", 128, {"sdpa": 2.0, "chunked": 1.0}),
        row("t5", 64, {"sdpa": 9.0, "chunked": 1.0}),
    ]
    rows = merged_rows(first, again, added)
    assert len(rows) == 4
    assert next(r for r in rows if r["length"] == 256)["times"] == again[0]["times"]
    segs = policy.derive_table(calibration_points(rows)).entries[key]
    # L = 64: t5's 9x rules sdpa out (worst ratio); 128 and 256 measured chunked first
    assert segs == (policy.Segment(None, ("chunked", "sdpa")),)


def test_auto_grid_encodings_carry_options_as_name_colon_option_equals_value():
    from relpos_lab.auto_bench import EncodingCase, parse_case

    case = parse_case("fire:init_L=1.0")
    assert case == EncodingCase("fire", (("init_L", 1.0),))
    assert case.label == "fire(init_L=1.0)"  # the label the reports print
    assert parse_case("t5") == EncodingCase("t5")
    assert parse_case("kerple:kind='log':init_r=2").options == (("kind", "log"), ("init_r", 2))
    with pytest.raises(ValueError, match="name:option=value"):
        parse_case("fire:init_L")


def test_auto_grid_runs_an_encoding_with_options(capsys, tmp_path):
    argv = ["bench", "--auto-vs-best", "--encodings", "fire:init_L=1.0", "--lengths", "16"]
    argv += ["--masks", "causal", "--modes", "forward", "--dtypes", "float32", "--repeats", "1"]
    code, out, err = run(capsys, *argv, "--threads", "1", "--out", str(tmp_path / "g"))
    assert code == 0, err
    assert "fire(init_L=1.0)" in (tmp_path / "g" / "report.md").read_text()


def _scripted_rounds(monkeypatch, first: dict[str, float], later: float):
    """``measure.time_round_robin`` replaced: the first call's rounds read ``first`` (a time
    per backend, default 1.0), every later call's read ``later``; the calls are recorded."""
    from relpos_lab import measure

    calls: list[tuple[list[str], int]] = []

    def fake(fns, *, warmup, repeats, clock):
        calls.append((list(fns), repeats))
        value = (lambda b: first.get(b, 1.0)) if len(calls) == 1 else (lambda b: later)
        return {b: {"samples_s": [value(b)] * repeats} for b in fns}

    monkeypatch.setattr(measure, "time_round_robin", fake)
    return calls


@pytest.mark.parametrize("auto_first", [2.0, 1.05])
def test_a_call_above_the_target_is_timed_again_and_its_medians_span_every_round(
    monkeypatch, auto_first
):
    from relpos_lab import auto_bench

    plan = auto_bench.GridPlan(
        cases=(auto_bench.EncodingCase("alibi"),), lengths=(32,), dtypes=("float32",),
        masks=(True,), modes=(False,), heads=2, head_dim=8, repeats=3, warmup=0, confirm=4,
    )  # fmt: skip
    calls = _scripted_rounds(monkeypatch, {"auto": auto_first}, later=1.0)
    row = auto_bench.run_case(plan, plan.cases[0], 32, True, False, "float32", lambda m: None)
    if auto_first < auto_bench.TARGET:  # within the target: measured once
        assert len(calls) == 1 and "confirmed" not in row
        assert row["auto_over_best"] == pytest.approx(1.05)
        return
    (first_names, _), (again_names, rounds) = calls
    ran = row["auto_plan"][0]
    # the second rounds time the baseline, auto, the best and the backend auto ran, no more
    assert set(again_names) == {auto_bench.BASELINE, "auto", row["best"], ran}
    assert rounds == 4 and len(row["samples"]["auto"]) == 7
    assert row["confirmed"] == {"rounds": 4, "first_auto_over_best": 2.0}
    # median over 7 rounds: [2, 2, 2, 1, 1, 1, 1] -> 1
    assert row["auto_over_best"] == pytest.approx(1.0)
    from relpos_lab import measure

    machine = measure.machine_info()
    report = auto_bench.markdown(
        {"machine": machine, "settings": plan.settings(), "rows": [row]}, "relpos bench"
    )
    assert "2.00 -> 1.00" in report and "(1 timed again)" in report


def test_the_family_grid_holds_an_encoding_of_every_family_the_registry_has():
    import relpos
    from relpos_lab.auto_bench import FAMILY_CASES

    def family(name: str) -> str:  # relpos.encodings.<family>.<module>
        return relpos.registry.encoding_class(name).__module__.split(".")[2]

    families = {family(n) for n in relpos.available()}
    assert {family(c.name) for c in FAMILY_CASES} == families
    for case in FAMILY_CASES:
        case.create(heads=8, head_dim=64)  # each builds with the grid's sizes


def test_calibrate_merge_refuses_a_missing_table_before_any_work(capsys, tmp_path):
    argv = ["bench", "--calibrate", *GRID, "--merge", "--table", str(tmp_path / "none.json")]
    code, out, err = run(capsys, *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and out == "" and "none.json: cannot be read" in err
    assert not (tmp_path / "o").exists()


def test_a_merge_records_which_encodings_and_lengths_measured_each_key():
    """One encoding's calls can fall into several kinds (DeBERTa: ``tile`` where the fold is
    not a candidate, ``band`` where it is); the merge record names what measured each key."""
    from relpos_lab.auto_bench import measured_by

    t = {"sdpa": 1.0}
    rows = [
        {"key": "cpu/float32/tile/full/forward", "encoding": "deberta", "length": 64, "times": t},
        {"key": "cpu/float32/band/full/forward", "encoding": "deberta", "length": 256, "times": t},
        {"key": "cpu/float32/band/full/forward", "encoding": "deberta", "length": 512, "times": t},
        {"key": "cpu/float32/tile/full/forward", "encoding": "swin-2d", "length": 128, "times": t},
        {"encoding": "dca", "length": 64, "skipped": "causal-only encoding"},
    ]
    rows[0]["encoding_name"] = "deberta"  # rows written before encoding keys lack it
    assert measured_by(rows) == {
        "cpu/float32/band/full/forward": {
            "cases": ["deberta"],
            "encodings": [],
            "lengths": [256, 512],
        },
        "cpu/float32/tile/full/forward": {
            "cases": ["deberta", "swin-2d"],
            "encodings": ["deberta"],
            "lengths": [64, 128],
        },
    }


def test_a_merged_table_replaces_the_measured_keys_whole_and_keeps_the_rest():
    from relpos.attention import policy
    from relpos_lab.auto_bench import merged_table

    seg = policy.Segment
    base = policy.PolicyTable(
        {
            "cpu/float32/tile/full/forward": (seg(4096, ("eager", "sdpa")), seg(None, ("sdpa",))),
            "cpu/float32/plain/full/forward": (seg(None, ("sdpa", "chunked")),),
        },
        "shipped",
        {"command": "the first run"},
    )
    measured = policy.PolicyTable({"cpu/float32/tile/full/forward": (seg(None, ("sdpa",)),)})
    by = {"cpu/float32/tile/full/forward": {"cases": ["swin-2d"], "lengths": [64]}}
    table = merged_table(base, measured, {"command": "relpos bench --calibrate --merge"}, by)
    assert table.entries["cpu/float32/tile/full/forward"] == (seg(None, ("sdpa",)),)
    assert (
        table.entries["cpu/float32/plain/full/forward"]
        == base.entries["cpu/float32/plain/full/forward"]
    )
    assert table.meta["command"] == "the first run"  # the base's own record stays
    (record,) = table.meta["merged"]
    assert record["changed"] == ["cpu/float32/tile/full/forward"]
    assert record["command"] == "relpos bench --calibrate --merge"
    assert record["measured_by"] == by
    again = merged_table(table, measured, {"command": "again"})  # nothing changes: recorded
    assert [r["changed"] for r in again.meta["merged"]] == [["cpu/float32/tile/full/forward"], []]
    policy.parse_table(again.to_json(), "merged")  # a valid table file


def test_a_merge_replaces_the_encoding_keys_of_the_encodings_it_measured():
    """A key measured again takes its encoding keys with it: those of the encodings the run
    measured are replaced, or dropped where the run wrote none (the key's ranking now serves
    them); an encoding the run did not measure keeps its own."""
    from relpos.attention import policy
    from relpos_lab.auto_bench import merged_table

    seg = policy.Segment
    key = "cpu/float32/tile/causal/forward"
    base = policy.PolicyTable(
        {
            key: (seg(None, ("chunked", "sdpa")),),
            f"{key}/swin-2d": (seg(None, ("sdpa", "chunked")),),
            f"{key}/gaussian-shift": (seg(None, ("sdpa", "chunked")),),
            f"{key}/layoutlmv2": (seg(None, ("eager", "sdpa")),),
        }
    )
    measured = policy.PolicyTable(
        {
            key: (seg(None, ("sdpa", "chunked")),),
            f"{key}/transformer-xl": (seg(None, ("chunked",)),),
        }
    )
    by = {
        key: {
            "cases": ["gaussian-shift", "swin-2d", "transformer-xl"],
            "encodings": ["gaussian-shift", "swin-2d", "transformer-xl"],
            "lengths": [64],
        }
    }
    table = merged_table(base, measured, {"command": "merge"}, by)
    assert set(table.entries) == {key, f"{key}/transformer-xl", f"{key}/layoutlmv2"}
    assert table.entries[f"{key}/layoutlmv2"] == base.entries[f"{key}/layoutlmv2"]
    (record,) = table.meta["merged"]
    assert record["changed"] == sorted(
        [key, f"{key}/gaussian-shift", f"{key}/swin-2d", f"{key}/transformer-xl"]
    )


def _calibration_row(encoding: str, times: dict[str, float], length: int = 64) -> dict:
    return {
        "encoding": encoding,
        "encoding_name": encoding,
        "length": length,
        "causal": True,
        "mode": "forward",
        "dtype": "float32",
        "key": "cpu/float32/tile/causal/forward",
        "elements": 8 * length * length,
        "baseline_s": 1.0,
        "times": times,
        "ratios": dict(times),
        "best": min(times, key=times.__getitem__),
    }


def test_a_calibration_measures_again_where_a_keys_representatives_disagree():
    """One disturbed measurement decides a key's ranking (or writes an encoding key) only
    where its representatives disagree; those calls, and only those, are measured again."""
    from relpos_lab.auto_bench import disputed_rows

    rows = [
        _calibration_row("a", {"sdpa": 1.0, "chunked": 1.05}),  # agree at L = 64
        _calibration_row("b", {"sdpa": 2.0, "chunked": 2.1}),
        _calibration_row("a", {"sdpa": 1.0, "chunked": 1.05}, 128),  # disagree at L = 128
        _calibration_row("b", {"sdpa": 2.0, "chunked": 1.5}, 128),
        _calibration_row("a", {"sdpa": 1.0, "chunked": 1.2}, 256),  # agree, c alone
        _calibration_row("c", {"sdpa": 3.0, "chunked": 3.5}, 256),
        {"encoding": "c", "length": 64, "skipped": "one candidate to time: ['chunked']"},
    ]
    assert disputed_rows(rows) == [2, 3]


def test_a_call_measured_several_times_pools_every_round():
    """The medians of a disputed call span the rounds of all its measurements: one disturbed
    measurement of three (GTA's sdpa at 15.7 where two others read 11.4 and 11.5) is
    outvoted."""
    from relpos_lab.auto_bench import pooled

    def measurement(sdpa: float, eager: float, base: float = 1.0) -> dict:
        row = _calibration_row("gta", {"sdpa": sdpa, "eager": eager})
        row["baseline_s"] = base
        row["samples"] = {"sdpa-nobias": [base] * 3, "sdpa": [sdpa] * 3, "eager": [eager] * 3}
        return row

    disturbed, normal, third = (
        measurement(15.7, 12.2),
        measurement(11.4, 13.4),
        measurement(11.5, 13.0),
    )
    row = pooled([disturbed, normal, third])
    assert row["times"] == {"sdpa": 11.5, "eager": 13.0} and row["best"] == "sdpa"
    assert row["baseline_s"] == 1.0 and row["ratios"] == row["times"]
    assert [m["times"] for m in row["measurements"]] == [
        disturbed["times"],
        normal["times"],
        third["times"],
    ]
    # a measurement that could not run adds nothing
    skipped = {"encoding": "gta", "skipped": "x"}
    assert pooled([disturbed, skipped]) is disturbed


def test_the_disputed_calls_of_a_calibration_are_measured_again_and_pooled():
    from relpos_lab.auto_bench import EncodingCase, GridPlan, remeasure_disputed, run_case

    plan = GridPlan(
        cases=(EncodingCase("alibi"), EncodingCase("kerple-log")),
        lengths=(32,),
        dtypes=("float32",),
        masks=(True,),
        modes=(False,),
        heads=2,
        head_dim=8,
        repeats=1,
        warmup=0,
        confirm=1,
        with_auto=False,
        calibrate=True,
    )
    rows = [run_case(plan, c, 32, True, False, "float32", lambda m: None) for c in plan.cases]
    assert rows[0]["key"] == rows[1]["key"]  # two representatives of one key
    rows[1]["best"] = next(b for b in rows[1]["times"] if b != rows[0]["best"])  # disagree
    again = remeasure_disputed(plan, rows, lambda m: None)
    for before, after in zip(rows, again, strict=True):
        assert 2 <= len(after["measurements"]) <= 3
        assert after["measurements"][0]["times"] == before["times"]
        assert after["best"] in after["times"] and set(after["times"]) == set(before["times"])
    assert remeasure_disputed(plan, again[:1], lambda m: None) == again[:1]  # nothing disputed
