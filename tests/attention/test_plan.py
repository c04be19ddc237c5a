"""``relpos.attention.plan``: which backend and which path a call takes, with the arguments of
``relpos.attention``; it is what the call runs (recorded inside the backends, over every
registered encoding and several policy tables); the facts ``auto`` reads are capabilities,
never encoding names."""

from __future__ import annotations

import pytest
import torch

import relpos
from conformance.common import ENCODINGS, _adapt, make_encoding
from relpos.attention import BACKENDS, api, chunked, fold, frozen_cache, plan, policy, sdpa
from relpos.attention.policy import KINDS, PolicyTable, Segment, table_key
from relpos.nn import LayerCache

H, D = 4, 32


def qkv(batch: int, length: int, grad: bool = False, seed: int = 0, dim: int = D):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, H, length, dim, generator=g).requires_grad_(grad) for _ in range(3)
    )


def test_plan_is_public_under_relpos_attention():
    assert relpos.attention.plan is plan


# ------------------------------------------------------------------------------ facts
def test_the_facts_auto_reads_are_capabilities_not_names():
    q, k, v = qkv(16, 128, grad=True)
    learned = relpos.create("t5", num_heads=H, head_dim=D)
    f = api.facts(q, k, v, learned, causal=True)
    # a per-distance table that takes gradients in this call is a kind of its own
    assert (f.kind, f.training, f.causal) == ("learned-toeplitz", True, True)
    assert f.elements == 16 * H * 128 * 128 and "fold" not in f.candidates
    with torch.no_grad():
        inference = api.facts(q, k, v, learned, causal=True)
        assert (inference.kind, inference.training) == ("toeplitz", False)
    learned.requires_grad_(False)  # trained q, k, v, frozen table: no gradient reaches it
    assert api.facts(q, k, v, learned, causal=True).kind == "toeplitz"
    learned.requires_grad_(True)
    fixed = relpos.create("kerple-log", num_heads=H, head_dim=D).requires_grad_(False)
    frozen = [t.detach() for t in (q, k, v)]
    assert api.facts(*frozen, fixed, causal=True).training is False  # nothing takes gradients
    assert api.facts(q, k, v, fixed, causal=True).training is True  # q, k, v do
    alibi = relpos.create("alibi", num_heads=H, head_dim=D)  # folds exactly
    assert "fold" in api.facts(q, k, v, alibi, causal=True).candidates
    # no per-distance table for batch positions: the bias is evaluated per pair
    pos = torch.arange(128).repeat(16, 1)
    pos[1] += 3
    assert api.facts(q, k, v, learned, q_pos=pos, k_pos=pos, causal=True).kind == "tile"
    rope = relpos.create("rope", num_heads=H, head_dim=D)
    assert api.facts(q, k, v, rope, causal=True).kind == "plain"


@pytest.mark.parametrize(
    ("name", "options", "length", "kind"),
    [
        ("shaw", {}, 64, "probabilities"),
        ("cope", {}, 64, "row-suffix"),
        ("dca", {"pretraining_length": 16}, 64, "piecewise-sdpa"),
        ("deberta", {}, 512, "band"),
        ("fire", {}, 64, "toeplitz"),  # below its threshold: a function of the distance
        # above it: two tables per group of rows in a forward, per pair in a training step
        ("fire", {"init_L": 8.0}, 64, "row-affine"),
    ],
)
def test_the_kind_follows_the_path_of_the_call(name, options, length, kind):
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    q, k, v = qkv(1, length)
    with torch.no_grad():
        assert api.facts(q, k, v, enc, causal=True).kind == kind


def test_fire_above_its_threshold_is_a_tile_call_in_a_training_step():
    enc = relpos.create("fire", num_heads=H, head_dim=D, init_L=8.0)
    q, k, v = qkv(1, 64, grad=True)
    assert api.facts(q, k, v, enc, causal=True).kind == "tile"


def test_candidates_keep_memory_and_precision():
    """Above ``DENSE_BIAS_LIMIT`` no candidate forms an ``Lq x Lk`` tensor; value terms run
    on eager / chunked only; the fold only while it rounds within its tolerance; flex never
    for a training step on CPU; float64 never on flex."""
    shaw = relpos.create("shaw", num_heads=H, head_dim=16)
    alibi = relpos.create("alibi", num_heads=H, head_dim=16)
    small = qkv(1, 64, dim=16)
    large = qkv(1, 1100, dim=16)
    with torch.no_grad():
        assert api.facts(*small, shaw, causal=True).candidates == ("eager", "chunked")
        assert api.facts(*large, shaw, causal=True).candidates == ("chunked",)
        big = api.facts(*large, alibi, causal=True).candidates
        assert "eager" not in big and "sdpa" not in big and "chunked" in big and "fold" in big
        wide = qkv(1, 16000, dim=16)  # the fold's rounding bound exceeds its tolerance here
        assert "fold" not in api.facts(*wide, alibi, causal=True).candidates
        double = [t.double() for t in small]
        assert "flex" not in api.facts(*double, alibi, causal=True).candidates
    train = [t.requires_grad_() for t in qkv(1, 64, dim=16)]
    assert "flex" not in api.facts(*train, alibi, causal=True).candidates


# ------------------------------------------------------------------------------ paths
@pytest.mark.parametrize(
    ("name", "options", "length", "backend", "expected"),
    [
        ("rope", {}, 64, "sdpa", "fused"),
        ("alibi", {}, 64, "sdpa", "dense-bias"),
        ("alibi", {}, 1100, "chunked", "toeplitz"),
        ("alibi", {}, 1100, "fold", "fold-sdpa"),
        ("alibi", {"bidirectional": True}, 256, "fold", "fold-passes"),
        ("kerple-log", {}, 1100, "chunked", "toeplitz"),
        ("shaw", {}, 64, "eager", "dense"),
        ("shaw", {}, 1100, "chunked", "probabilities"),
        ("dca", {"pretraining_length": 16}, 1100, "chunked", "piecewise-sdpa"),
        ("cope", {}, 1100, "chunked", "row-suffix"),
        ("deberta", {}, 512, "fold", "fold-band"),
    ],
)
def test_plan_names_the_path(name, options, length, backend, expected):
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    q, k, v = qkv(1, length)
    with torch.no_grad():
        assert plan(q, k, v, enc, causal=name != "alibi" or not options, backend=backend) == (
            backend,
            expected,
        )


def test_plan_with_an_explicit_backend_and_a_mask():
    enc = relpos.create("alibi", num_heads=H, head_dim=D)
    q, k, v = qkv(1, 64)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    assert plan(q, k, v, enc, backend="chunked") == ("chunked", "toeplitz")
    assert plan(q, k, v, enc, mask=mask, backend="chunked") == ("chunked", "tile")
    assert plan(q, k, v, enc, backend="flex") == ("flex", "score-mod")
    assert plan(q, k, v, enc, backend="eager") == ("eager", "dense")
    with pytest.raises(ValueError, match="backend"):
        plan(q, k, v, enc, backend="fast")
    with pytest.raises(ValueError, match="cannot run encoding"):
        plan(q, k, v, relpos.create("shaw", num_heads=H, head_dim=D), backend="sdpa")


def every_key_table(first: str | None) -> PolicyTable | None:
    """A table ranking ``first`` ahead of the other backends for every CPU key (None: the
    active table). Flex stays last: on CPU each new shape compiles for seconds."""
    if first is None:
        return None
    order = (first, *(b for b in ("eager", "sdpa", "fold", "chunked") if b != first), "flex")
    entries = {
        table_key("cpu", dtype, kind, causal, train): (Segment(None, order),)
        for dtype in ("float32", "bfloat16")
        for kind in KINDS
        for causal in (True, False)
        for train in (True, False)
    }
    return PolicyTable(entries, f"{first} first")


@pytest.fixture
def taken(monkeypatch) -> list[list]:
    """``[backend, path]`` of every backend call, recorded inside the backends: the chunked
    ladder's branch, whether sdpa formed a dense bias, the fold's branch."""
    record: list[list] = []

    def mark(path: str) -> None:
        if record and record[-1][1] is None:
            record[-1][1] = path

    for name, fn in list(BACKENDS.items()):

        def run(call, name=name, fn=fn):
            record.append([name, None])
            out = fn(call)
            mark({"eager": "dense", "flex": "score-mod", "sdpa": "fused"}.get(name, "?"))
            return out

        monkeypatch.setitem(api.BACKENDS, name, run)

    def hook(module, attr: str, path):
        original = getattr(module, attr)

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            mark(path(args, out) if callable(path) else path)
            return out

        monkeypatch.setattr(module, attr, wrapped)

    for attr, path in (
        ("piecewise_sdpa_attention", "piecewise-sdpa"),
        ("_row_suffix_attention", "row-suffix"),
        ("_probability_attention", "probabilities"),
        ("_toeplitz_attention", "toeplitz"),
        ("_tile_attention", "tile"),
    ):
        hook(chunked, attr, path)
    hook(sdpa, "_sink_attention", "dense-bias")  # the sink's column: a dense mask
    dense = lambda args, out: args[0].has_bias or args[0].sinks is not None  # noqa: E731
    hook(sdpa, "_score_mask", lambda args, out: "dense-bias" if dense(args, out) else "fused")
    hook(fold, "_single_pass", lambda args, out: "fold-sdpa" if out else "fold-passes")
    hook(fold, "disentangled_fold_attention", "fold-band")
    return record


def _check_registry(names, first, taken, monkeypatch, **features):
    table = every_key_table(first)
    if table is not None:
        monkeypatch.setattr(policy, "active_table", lambda: table)
    for name in names:
        enc = make_encoding(name)
        for causal in (True, False) if not enc.causal_only else (True,):
            for grad in (False, True):
                q, k, v = (t.requires_grad_(grad) for t in qkv(2, 64, dim=16))
                kw = _adapt(enc, q, k, {"causal": causal, **features})
                with torch.set_grad_enabled(grad):
                    expected = plan(q, k, v, enc, **kw)
                    frozen_cache.clear()  # sdpa forms its mask (recorded) on this call
                    taken.clear()
                    relpos.attention(q, k, v, enc, **kw)
                where = f"{name} causal={causal} grad={grad} table={first}"
                assert taken, where
                assert all(t == list(expected) for t in taken), (where, expected, taken)


#: one encoding of every kind of call and family (the whole registry: the slow tests)
REPRESENTATIVES = (
    "alibi",
    "fire",
    "t5",
    "rope",
    "dca",
    "shaw",
    "cope",
    "deberta",
    "transformer-xl",
    "swin-2d",
    "layoutlmv2",
    "graph-spd",
    "rayrope",
    "learned",
)


def test_plan_is_what_attention_runs(taken, monkeypatch):
    """One encoding of every kind, causal and not, in inference and in a training step, under
    the active table: the backend and the path recorded inside the backends are ``plan``'s."""
    _check_registry(REPRESENTATIVES, None, taken, monkeypatch)


@pytest.mark.parametrize("first", [None, "eager", "sdpa", "fold", "chunked"])
@pytest.mark.parametrize(
    "features",
    [{"softcap": 7.0}, {"sinks": "random"}, {"softcap": 7.0, "sinks": "random"}],
    ids=["softcap", "sinks", "both"],
)
def test_plan_is_what_attention_runs_with_softcap_and_sinks(first, features, taken, monkeypatch):
    """Softcapping and sinks: ``auto`` (under tables that rank each backend first) runs the
    backend and path ``plan`` names, and never one that cannot compute them (those raise)."""
    if features.get("sinks") == "random":
        features = {**features, "sinks": torch.randn(4, generator=torch.Generator().manual_seed(0))}
    names = ("alibi", "t5", "rope", "dca", "cope", "shaw")
    _check_registry(names, first, taken, monkeypatch, **features)  # (sdpa, fold would raise)


@pytest.mark.slow
@pytest.mark.parametrize("first", ["eager", "sdpa", "fold", "chunked"])
def test_plan_is_what_attention_runs_whatever_the_table_ranks_first(first, taken, monkeypatch):
    """The same under tables that rank each backend first: every path ``auto`` may take."""
    _check_registry(REPRESENTATIVES, first, taken, monkeypatch)


@pytest.mark.slow
def test_plan_is_what_attention_runs_for_every_encoding(taken, monkeypatch):
    """The same for every registered encoding, with the active table."""
    _check_registry(ENCODINGS, None, taken, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("first", ["eager", "sdpa", "fold", "chunked"])
def test_plan_is_what_attention_runs_for_every_encoding_under_any_table(first, taken, monkeypatch):
    """The whole registry under tables that rank each backend first."""
    _check_registry(ENCODINGS, first, taken, monkeypatch)


def test_plan_follows_the_grad_mode(taken, monkeypatch):
    """Forward and training step read different keys of the table."""
    enc = relpos.create("alibi", num_heads=H, head_dim=16)
    q, k, v = qkv(1, 256, grad=True, dim=16)
    key = api.facts(q, k, v, enc, causal=True).key
    with torch.no_grad():
        forward_key = api.facts(q, k, v, enc, causal=True).key
    table = PolicyTable(
        {key: (Segment(None, ("fold", "chunked")),), forward_key: (Segment(None, ("chunked",)),)}
    )
    monkeypatch.setattr(policy, "active_table", lambda: table)
    assert plan(q, k, v, enc, causal=True) == ("fold", "fold-sdpa")
    relpos.attention(q, k, v, enc, causal=True).sum().backward()
    assert taken[-1] == ["fold", "fold-sdpa"]
    with torch.no_grad():
        assert plan(q, k, v, enc, causal=True) == ("chunked", "toeplitz")
        relpos.attention(q, k, v, enc, causal=True)
    assert taken[-1] == ["chunked", "toeplitz"]


@pytest.mark.slow
def test_plan_is_what_attention_runs_on_flex(taken, monkeypatch):
    """Compiled flex (CPU, inference) when a table ranks it first."""
    order = ("flex", "chunked")
    enc = relpos.create("kerple-log", num_heads=H, head_dim=16)
    q, k, v = qkv(1, 64, dim=16)
    with torch.no_grad():
        f = api.facts(q, k, v, enc, causal=True)
        if "flex" not in f.candidates:
            pytest.skip("compiled FlexAttention is not available here")
        table = PolicyTable({f.key: (Segment(None, order),)})
        monkeypatch.setattr(policy, "active_table", lambda: table)
        assert plan(q, k, v, enc, causal=True) == ("flex", "score-mod")
        relpos.attention(q, k, v, enc, causal=True)
    assert taken[-1] == ["flex", "score-mod"]


def test_plan_leaves_a_kv_cache_unchanged():
    enc = relpos.create("rope", num_heads=H, head_dim=D)
    q, k, v = qkv(1, 8)
    cache = LayerCache()
    relpos.attention(q, k, v, enc, causal=True, cache=cache)
    before = (cache.k.clone(), cache.length)
    assert plan(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc, causal=True, cache=cache)[0] == "sdpa"
    assert cache.length == before[1] and torch.equal(cache.k, before[0])
