"""``relpos.attention.policy``: the rule ``auto`` applies is a pure function of a call's facts
and a measured table; tables are derived from measurements by a fixed rule, checked when
read, and a bad machine table is reported by name and ignored."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

import relpos
from relpos.attention import api, policy
from relpos.attention.policy import (
    CallFacts,
    Point,
    PolicyTable,
    PolicyTableError,
    Segment,
    derive_table,
    parse_table,
    select_backend,
)

KEY = "cpu/float32/toeplitz/causal/forward"


def facts(candidates, elements=1000, device="cpu", key_kind="toeplitz") -> CallFacts:
    return CallFacts(device, "float32", key_kind, True, False, elements, tuple(candidates))


def table(*segments: tuple[int | None, tuple[str, ...]], key: str = KEY) -> PolicyTable:
    return PolicyTable({key: tuple(Segment(u, r) for u, r in segments)}, "test")


# ------------------------------------------------------------------------------ the rule
def test_the_first_ranked_candidate_wins():
    t = table((None, ("fold", "chunked", "sdpa")))
    assert select_backend(facts(["sdpa", "chunked", "fold"]), t) == "fold"
    # fold is not a candidate for this call (e.g. it rounds too much): the next ranked one
    assert select_backend(facts(["sdpa", "chunked"]), t) == "chunked"


def test_segments_are_chosen_by_size_with_inclusive_bounds():
    t = table((4096, ("sdpa", "chunked")), (65536, ("chunked", "sdpa")), (None, ("fold",)))
    cands = ["sdpa", "chunked", "fold"]
    assert select_backend(facts(cands, elements=4096), t) == "sdpa"
    assert select_backend(facts(cands, elements=4097), t) == "chunked"
    assert select_backend(facts(cands, elements=65536), t) == "chunked"
    assert select_backend(facts(cands, elements=10**9), t) == "fold"


def test_an_unmeasured_key_follows_the_device_order():
    t = table((None, ("eager",)), key="cpu/float32/tile/causal/forward")  # another key
    cands = ["sdpa", "eager", "chunked", "flex"]
    assert select_backend(facts(cands), t) == "sdpa"
    assert select_backend(facts(["chunked", "flex"]), t) == "chunked"  # never flex on CPU
    assert select_backend(facts(["chunked", "flex"], device="cuda"), t) == "flex"


def test_a_ranking_without_any_candidate_falls_back_to_the_order():
    t = table((None, ("fold",)))
    assert select_backend(facts(["chunked"]), t) == "chunked"


def test_no_candidate_is_an_error():
    with pytest.raises(ValueError, match="candidate"):
        select_backend(facts([]), table((None, ("sdpa",))))


# ------------------------------------------------------------------------------ derivation
def test_crossovers_lie_at_the_geometric_mean_of_the_measured_sizes():
    pts = [
        Point(KEY, 8 * 64 * 64, "a", {"sdpa": 1.0, "chunked": 2.0}),
        Point(KEY, 8 * 128 * 128, "a", {"sdpa": 1.0, "chunked": 1.5}),
        Point(KEY, 8 * 256 * 256, "a", {"sdpa": 2.0, "chunked": 1.0}),
        Point(KEY, 8 * 512 * 512, "a", {"chunked": 1.0}),  # sdpa not measured there
    ]
    segs = derive_table(pts).entries[KEY]
    # 64 and 128 rank alike and merge; the crossover to chunked lies between 128 and 256
    assert segs[0] == Segment(8 * 128 * 256, ("sdpa", "chunked"))
    assert segs[1] == Segment(8 * 256 * 512, ("chunked", "sdpa"))
    assert segs[2] == Segment(None, ("chunked",))


def test_a_call_reads_the_ranking_of_the_nearest_measured_length_on_a_log_scale():
    # four measured lengths, neighbours ranked differently: every measured length reads its
    # own measurement, and a length between two reads the nearer one in log L (the boundary
    # sqrt(L1 * L2) holds for the size 8 * L^2 too)
    lengths = (64, 128, 256, 512)
    rankings = (("sdpa", "chunked"), ("chunked", "sdpa"), ("sdpa", "chunked"), ("chunked",))
    pts = [
        Point(KEY, 8 * n * n, "a", {b: 1.0 + i for i, b in enumerate(r)})
        for n, r in zip(lengths, rankings, strict=True)
    ]
    t = derive_table(pts)
    cands = ["sdpa", "chunked"]
    for n, r in zip(lengths, rankings, strict=True):
        assert select_backend(facts(cands, elements=8 * n * n), t) == r[0]
    # sqrt(64 * 128) = 90.5: 90 tokens are nearer 64, 91 nearer 128
    assert select_backend(facts(cands, elements=8 * 90 * 90), t) == "sdpa"
    assert select_backend(facts(cands, elements=8 * 91 * 91), t) == "chunked"
    # sqrt(128 * 256) = 181.02
    assert select_backend(facts(cands, elements=8 * 181 * 181), t) == "chunked"
    assert select_backend(facts(cands, elements=8 * 182 * 182), t) == "sdpa"
    # beyond the longest measured length the last ranking holds
    assert select_backend(facts(cands, elements=8 * 8192 * 8192), t) == "chunked"


def test_representatives_are_ranked_by_their_worst_ratio():
    pts = [
        Point(KEY, 100, "fast-dense", {"sdpa": 1.0, "chunked": 1.2}),
        Point(KEY, 100, "slow-dense", {"sdpa": 3.0, "chunked": 1.0}),
        Point(KEY, 100, "folds", {"sdpa": 1.0, "chunked": 1.1, "fold": 0.9}),
    ]
    # worst ratios: sdpa 3.0, chunked 1.2 (1.2 / 1.0 on fast-dense), fold 1.0 (where it runs)
    assert derive_table(pts).entries[KEY] == (Segment(None, ("fold", "chunked", "sdpa")),)


def test_an_encoding_the_key_serves_badly_gets_its_own_key():
    # two representatives of one key whose costs differ: the key ranks by the worst ratio,
    # which runs "cheap" 1.25x slower than its fastest backend; it gets its own key, measured
    # on it alone, and "costly" (within ENCODING_KEY_ABOVE under the key) does not
    pts = [
        Point(KEY, 100, "cheap", {"sdpa": 1.0, "chunked": 1.25}, "cheap"),
        Point(KEY, 100, "costly", {"sdpa": 2.0, "chunked": 1.0}, "costly"),
        Point(KEY, 400, "cheap", {"sdpa": 1.0, "chunked": 1.05}, "cheap"),
        Point(KEY, 400, "costly", {"sdpa": 2.0, "chunked": 1.0}, "costly"),
    ]
    t = derive_table(pts)
    assert t.entries[KEY] == (Segment(None, ("chunked", "sdpa")),)
    assert set(t.entries) == {KEY, f"{KEY}/cheap"}
    assert t.entries[f"{KEY}/cheap"] == (Segment(None, ("sdpa", "chunked")),)
    cands = ["sdpa", "chunked"]
    own = CallFacts("cpu", "float32", "toeplitz", True, False, 100, tuple(cands), "cheap")
    assert select_backend(own, t) == "sdpa"
    for other in ("costly", "never-measured", ""):  # every other encoding reads the key
        f = CallFacts("cpu", "float32", "toeplitz", True, False, 100, tuple(cands), other)
        assert select_backend(f, t) == "chunked"
    # within the factor everywhere: no encoding key
    calm = [Point(KEY, 100, "a", {"sdpa": 1.0, "chunked": 1.08}, "a"), pts[1]]
    assert set(derive_table(calm).entries) == {KEY}
    # a point without a registered name never gets one
    anonymous = [Point(KEY, 100, "x", {"sdpa": 1.0, "chunked": 1.5}), pts[1]]
    assert set(derive_table(anonymous).entries) == {KEY}


def test_an_encoding_key_ranks_only_where_it_was_measured():
    # the encoding's own key measured at one size: above it (a size it never measured, in
    # its own key the last ranking holds), below it the same
    t = PolicyTable(
        {KEY: (Segment(None, ("chunked", "sdpa")),), f"{KEY}/e": (Segment(None, ("sdpa",)),)}
    )
    big = CallFacts("cpu", "float32", "toeplitz", True, False, 10**9, ("sdpa", "chunked"), "e")
    assert select_backend(big, t) == "sdpa"
    # its ranking holds no candidate of the call: the key's ranking decides, not the order
    only = CallFacts("cpu", "float32", "toeplitz", True, False, 100, ("chunked", "fold"), "e")
    assert select_backend(only, t) == "chunked"


def test_encoding_keys_round_trip_and_are_checked(tmp_path):
    t = PolicyTable(
        {KEY: (Segment(None, ("sdpa",)),), f"{KEY}/swin-2d": (Segment(None, ("eager",)),)}
    )
    back = parse_table(t.to_json(), "t.json")
    assert back.entries == t.entries
    with pytest.raises(PolicyTableError, match="encoding"):
        parse_table({"format": 1, "entries": {f"{KEY}/": [[None, ["sdpa"]]]}}, "t.json")


def test_a_machine_table_key_takes_the_shipped_encoding_keys_under_it_away():
    shipped = PolicyTable(
        {
            KEY: (Segment(None, ("sdpa", "chunked")),),
            f"{KEY}/e": (Segment(None, ("chunked", "sdpa")),),
            "cpu/float32/tile/full/forward/e": (Segment(None, ("eager",)),),
        }
    )
    machine = PolicyTable({KEY: (Segment(None, ("sdpa", "chunked")),)})
    active = shipped.merged(machine)
    # this machine measured KEY and found no encoding that needs its own ranking there
    assert set(active.entries) == {KEY, "cpu/float32/tile/full/forward/e"}
    f = CallFacts("cpu", "float32", "toeplitz", True, False, 100, ("sdpa", "chunked"), "e")
    assert select_backend(f, active) == "sdpa"


def test_a_call_reads_the_registered_name_of_its_encodings_own_class():
    enc = relpos.create("alibi", num_heads=4, head_dim=16)
    q, k, v = _qkv()
    assert api.facts(q, k, v, enc, causal=True).encoding == "alibi"
    assert api.facts(q, k, v, None, causal=True).encoding == ""

    class Mine(type(enc)):  # a user's subclass: its costs are its own, it reads the key
        pass

    mine = Mine(num_heads=4, head_dim=16)
    assert api.facts(q, k, v, mine, causal=True).encoding == ""


def test_derived_tables_round_trip_through_json(tmp_path):
    pts = [Point(KEY, 4096, "a", {"sdpa": 1.0, "chunked": 2.0}), Point(KEY, 65536, "a", {})]
    t = derive_table(pts, {"machine": {"cpu": "x"}})
    path = policy.write_table(t, tmp_path / "t.json")
    back = policy.load_table(path)
    assert back.entries == t.entries and back.meta["machine"] == {"cpu": "x"}


# ------------------------------------------------------------------------------ files
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        ({"format": 99, "entries": {}}, "format 99"),
        ({"format": 1, "entries": {"cpu/float32/toeplitz": []}}, "is not device/dtype"),
        (
            {"format": 1, "entries": {"cpu/float32/warp/causal/forward": [[None, ["sdpa"]]]}},
            "kind in",
        ),  # fmt: skip
        ({"format": 1, "entries": {KEY: [[None, ["fast"]]]}}, "segment 0"),
        (
            {"format": 1, "entries": {KEY: [[10, ["sdpa"]], [5, ["eager"]], [None, ["sdpa"]]]}},
            "segment 1",
        ),  # fmt: skip
        ({"format": 1, "entries": {KEY: [[10, ["sdpa"]]]}}, "null for the last"),
        ({"format": 1, "entries": {KEY: [[None, ["sdpa", "sdpa"]]]}}, "distinct"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_problem(data, message):
    with pytest.raises(PolicyTableError, match="where.json") as err:
        parse_table(data, "where.json")
    assert message in str(err.value)


def test_the_shipped_table_parses_and_says_what_measured_it():
    t = policy.load_table(policy.SHIPPED_PATH)
    assert t.entries, "the shipped table holds measurements"
    meta = t.meta
    assert meta["machine"]["cpu"] and meta["machine"]["torch_threads"] >= 1
    assert meta["command"].startswith("relpos bench --calibrate")
    for segs in t.entries.values():
        for s in segs:
            assert set(s.ranking) <= set(policy.BACKEND_NAMES)


def test_machine_table_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(policy.TABLE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert policy.machine_table_path() == tmp_path / "relpos" / "auto_table.json"
    monkeypatch.setenv(policy.TABLE_ENV, str(tmp_path / "mine.json"))
    assert policy.machine_table_path() == tmp_path / "mine.json"
    monkeypatch.setenv(policy.TABLE_ENV, "")
    assert policy.machine_table_path() is None


@pytest.fixture
def machine_table(monkeypatch, tmp_path):
    """Points ``$RELPOS_AUTO_TABLE`` at a file of the test's own; the tables are re-read
    around the test."""
    path = tmp_path / "auto_table.json"
    monkeypatch.setenv(policy.TABLE_ENV, str(path))
    policy.reload()
    yield path
    monkeypatch.undo()
    policy.reload()


def _qkv(length: int = 64, heads: int = 4, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, length, dim, generator=g) for _ in range(3)]


def test_a_machine_table_replaces_the_shipped_keys(machine_table):
    enc = relpos.create("kerple-log", num_heads=4, head_dim=16)
    q, k, v = _qkv()
    with torch.no_grad():
        f = api.facts(q, k, v, enc, causal=True)
        assert f.kind == "toeplitz" and {"eager", "sdpa", "chunked"} <= set(f.candidates)
        for first in ("eager", "chunked", "sdpa"):
            order = (first, *(b for b in ("eager", "sdpa", "chunked") if b != first))
            policy.write_table(PolicyTable({f.key: (Segment(None, order),)}, "test"), machine_table)
            policy.reload()
            assert relpos.attention.plan(q, k, v, enc, causal=True)[0] == first


def test_a_corrupt_machine_table_is_reported_by_name_and_ignored(machine_table):
    machine_table.write_text('{"format": 1, "entries": {')  # truncated
    with pytest.warns(RuntimeWarning, match=str(machine_table)) as record:
        active = policy.reload()
    assert "not JSON" in str(record[0].message)
    assert active.entries == policy.shipped_table().entries
    enc = relpos.create("alibi", num_heads=4, head_dim=16)
    q, k, v = _qkv()
    out = relpos.attention(q, k, v, enc, causal=True)  # auto still runs
    assert torch.isfinite(out).all()


def test_a_missing_machine_table_is_not_an_error(machine_table):
    assert not machine_table.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert policy.reload().entries == policy.shipped_table().entries


def test_a_machine_table_with_a_wrong_backend_name_is_ignored(machine_table):
    machine_table.write_text(json.dumps({"format": 1, "entries": {KEY: [[None, ["warp"]]]}}))
    with pytest.warns(RuntimeWarning, match="segment 0"):
        policy.reload()


def test_segment_bounds_compare_as_integers():
    t = table((2**40, ("sdpa",)), (None, ("chunked",)))
    assert t.ranking(KEY, 2**40) == ("sdpa",) and t.ranking(KEY, 2**40 + 1) == ("chunked",)
    assert math.isinf(t._bounds[KEY][-1])


def test_a_size_measured_between_two_replaces_the_ranking_between_their_geometric_means():
    sizes = (64, 256, 1024)
    rankings = (("sdpa", "chunked"), ("chunked", "sdpa"), ("sdpa", "chunked"))
    pts = [
        Point(KEY, 8 * n * n, "a", {b: 1.0 + i for i, b in enumerate(r)})
        for n, r in zip(sizes, rankings, strict=True)
    ]
    table = derive_table(pts)
    # measuring 512 as well, with its own ranking, from all the points ...
    middle = Point(KEY, 8 * 512 * 512, "a", {"chunked": 1.0, "sdpa": 2.0})
    want = derive_table([*pts, middle]).entries[KEY]
    # ... equals splicing it between its neighbours' geometric means
    low, high = 8 * 256 * 512, 8 * 512 * 1024
    got = table.with_size_measured(KEY, low, high, ("chunked", "sdpa")).entries[KEY]
    assert got == want
    # a size beyond the longest measured one takes over from its geometric mean on
    beyond = Point(KEY, 8 * 4096 * 4096, "a", {"chunked": 1.0, "sdpa": 3.0})
    want = derive_table([*pts, beyond]).entries[KEY]
    got = table.with_size_measured(KEY, 8 * 1024 * 4096, None, ("chunked", "sdpa"))
    assert got.entries[KEY] == want
    with pytest.raises(ValueError, match="must exceed"):
        table.with_size_measured(KEY, 10, 10, ("sdpa",))
