"""``benchmarks/bench_lm_quality.py``: the model specs of the peer comparison (the peer at
its own defaults and at the matched configuration, every option it is given named), and its
optimizer groups (``enc_lr``: the encoding's own parameters at a multiple of the learning
rate, the knob of docs/benchmarks.md's T5 experiment), on tiny models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import relpos
from relpos_lab.training.train import TrainConfig, learning_rate

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_lm_quality.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_lm_quality", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_lm_quality", module)
    spec.loader.exec_module(module)
    return module


def tiny(encoding: str) -> nn.Module:
    torch.manual_seed(0)
    return relpos.nn.TransformerLM(32, 16, 1, 2, encoding)


def encoding_ids(model: nn.Module) -> set[int]:
    return {
        id(p) for m in model.modules() if isinstance(m, relpos.Encoding) for p in m.parameters()
    }


def test_parse_model_reads_knobs_and_encoding_options(bench):
    assert bench.parse_model("relpos") == ("relpos", {})
    base, knobs = bench.parse_model("relpos[init=gpt2,enc_lr=10,enc.init_L=32]")
    assert base == "relpos" and knobs == {"init": "gpt2", "enc_lr": "10", "enc.init_L": "32"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("relpos[lr=3]", "unknown knob 'lr=3'"),
        ("relpos[enc_lr=]", "unknown knob 'enc_lr='"),
        ("relpos[init=gpt2", "must look like relpos[knob=value,...]"),
        ("x-transformers[init=gpt2]", "unknown knob 'init=gpt2'"),
        ("x-transformers-matched[enc_lr=2]", "unknown knob 'enc_lr=2'"),
        ("gpt", "unknown model 'gpt'"),
    ],
)
def test_parse_model_rejects_bad_specs_naming_models(bench, spec, message):
    with pytest.raises(ValueError, match=r"^--models: ") as err:
        bench.parse_model(spec)
    assert message in str(err.value)


def test_encoding_option_reaches_the_encoding(bench):
    model = bench.build_relpos("fire", {"enc.init_L": "32"})
    fire = next(m for m in model.modules() if isinstance(m, relpos.Encoding))
    assert float(fire.init_L) == 32.0
    assert float(bench.build_relpos("fire", {}).blocks[0].attn.encoding.init_L) == 512.0


@pytest.mark.parametrize("kind", ["plain", "lab"])
def test_enc_lr_puts_exactly_the_encoding_parameters_in_their_own_group(bench, kind):
    model = tiny("t5")
    own = encoding_ids(model)
    assert own, "T5 has a learned table"
    opt = bench.make_optimizer(model, kind, enc_lr=10.0)
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    assert len(seen) == len(set(seen)), "a parameter in two groups"
    fast = [g for g in opt.param_groups if g["lr_mult"] != 1.0]
    assert len(fast) == 1 and fast[0]["lr_mult"] == 10.0 and fast[0]["weight_decay"] == 0.0
    assert {id(p) for p in fast[0]["params"]} == own
    # without the knob the groups are the plain / lab ones, every multiplier 1
    plain = bench.make_optimizer(model, kind)
    assert all(g["lr_mult"] == 1.0 for g in plain.param_groups)
    assert len(plain.param_groups) == (1 if kind == "plain" else 2)


def test_set_learning_rates_scales_the_schedule_per_group(bench):
    model = tiny("t5")
    opt = bench.make_optimizer(model, "plain", enc_lr=10.0)
    schedule = TrainConfig(encoding="t5", steps=100, lr=1e-3, warmup=10, min_lr_ratio=0.1)
    for step in (0, 9, 50, 99):
        bench.set_learning_rates(opt, step, schedule)
        expected = learning_rate(step, schedule)
        lrs = sorted(g["lr"] for g in opt.param_groups)
        assert lrs == pytest.approx([expected, 10 * expected])


def test_enc_lr_moves_the_table_faster_in_one_step(bench):
    """One Adam step from the same weights and batch: the table moves about ``enc_lr`` times
    as far, the other weights the same."""
    moved = {}
    for mult in (1.0, 10.0):
        model = tiny("t5")
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = bench.make_optimizer(model, "plain", enc_lr=mult)
        for g in opt.param_groups:
            g["lr"] = 1e-3 * g["lr_mult"]
        x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
        model(x).logsumexp(-1).mean().backward()
        opt.step()
        moved[mult] = {
            n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()
        }
    table = [n for n in moved[1.0] if ".encoding." in n]
    assert table
    for n in table:
        assert moved[10.0][n] == pytest.approx(10 * moved[1.0][n], rel=1e-2)
    others = [n for n in moved[1.0] if n not in table]
    for n in others:
        assert moved[10.0][n] == pytest.approx(moved[1.0][n], rel=1e-4, abs=1e-9)


def test_peer_at_its_defaults_is_given_only_the_sizes_and_the_stated_options(bench):
    """``x-transformers`` passes nothing that changes a default beyond the sizes, the head
    size (dim // heads) and, for ALiBi, ``use_abs_pos_emb=False``: an untied head and its
    default partial rotary. ``x-transformers-matched`` adds exactly the tied head and the
    whole-head rotary."""
    head_dim = bench.DIM // bench.HEADS
    assert bench.peer_options("x-transformers", "alibi") == {
        "wrapper": {"max_seq_len": bench.SEQ, "use_abs_pos_emb": False},
        "decoder": {"attn_dim_head": head_dim, "alibi_pos_bias": True},
    }
    assert bench.peer_options("x-transformers", "rope") == {
        "wrapper": {"max_seq_len": bench.SEQ},
        "decoder": {"attn_dim_head": head_dim, "rotary_pos_emb": True},
    }
    matched = bench.peer_options("x-transformers-matched", "rope")
    assert matched["wrapper"] == {"max_seq_len": bench.SEQ, "tie_embedding": True}
    assert matched["decoder"]["rotary_emb_dim"] == head_dim
    knob = bench.peer_options("x-transformers[rotary_emb_dim=32]", "rope")
    assert knob["decoder"]["rotary_emb_dim"] == 32 and "tie_embedding" not in knob["wrapper"]
    with pytest.raises(ValueError, match="x-transformers runs alibi and rope"):
        bench.peer_options("x-transformers", "fire")


@pytest.mark.parametrize(
    ("spec", "tied", "rotary_dim"),
    [("x-transformers", False, 16), ("x-transformers-matched", True, 32)],
)
def test_peer_models_build_with_the_head_and_rotary_they_name(bench, spec, tied, rotary_dim):
    pytest.importorskip("x_transformers")
    model = bench.build(spec, "rope", 0)
    assert bench.tied_head(model) is tied
    assert model.attn_layers.rotary_pos_emb.inv_freq.numel() * 2 == rotary_dim
    alibi = bench.build(spec, "alibi", 0)
    assert bench.tied_head(alibi) is tied
    with torch.no_grad():  # no absolute embedding: runs past max_seq_len
        assert alibi(torch.zeros(1, 2 * bench.SEQ, dtype=torch.long)).shape[1] == 2 * bench.SEQ


def test_relpos_head_knob_builds_either_head(bench):
    assert bench.tied_head(bench.build("relpos", "alibi", 0)) is False  # the default
    tied = bench.build("relpos[head=tied]", "alibi", 0)
    assert tied.tie_embedding is True and tied.head is None and bench.tied_head(tied)
    untied = bench.build("relpos[init=gpt2,head=untied]", "alibi", 0)
    assert untied.tie_embedding is False and untied.head is not None
    assert bench.tied_head(untied) is False
    with pytest.raises(ValueError, match="head must be tied or untied, got 'both'"):
        bench.build_relpos("alibi", {"head": "both"})


def test_old_peer_results_are_labelled_as_the_matched_configuration(bench):
    """Before the peer's defaults were run, ``x-transformers`` meant the tied head and
    whole-head rotary; those results (no ``peer_options``) are today's matched model."""
    old = {"model": "x-transformers", "encoding": "alibi"}
    assert bench.normalise(dict(old))["model"] == "x-transformers-matched"
    new = {**old, "peer_options": bench.peer_options("x-transformers", "alibi")}
    assert bench.normalise(dict(new))["model"] == "x-transformers"


def test_relpos_results_are_labelled_with_the_init_and_head_they_recorded(bench):
    """A spec without ``init=`` or ``head=`` meant the defaults of its day: the labels come
    from what the case recorded, so one row is one model across a change of defaults."""
    before = {"model": "relpos", "encoding": "alibi"}  # no init key: GPT-2's, tied
    assert bench.normalise(dict(before))["model"] == "relpos[init=gpt2,head=tied]"
    now = {**before, "init": "fan-in", "tie_embedding": False}
    assert bench.normalise(dict(now))["model"] == "relpos[init=fan-in,head=untied]"
    spelled = {**now, "model": "relpos[init=fan-in,head=untied]"}
    assert bench.normalise(dict(spelled))["model"] == "relpos[init=fan-in,head=untied]"
    half = {"model": "relpos[head=untied]", "encoding": "alibi", "tie_embedding": False}
    assert bench.normalise(dict(half))["model"] == "relpos[init=gpt2,head=untied]"
    # one spelling per model: knobs in KNOBS order, encoding options last
    other = {**now, "model": "relpos[enc.partial_rotary_factor=0.5,head=untied]"}
    assert bench.normalise(dict(other))["model"] == (
        "relpos[init=fan-in,head=untied,enc.partial_rotary_factor=0.5]"
    )


# ------------------------------------------------------------------------------ recorded runs
def case(model: str, encoding: str, seed: int, ppl128: float, ppl2048: float) -> dict:
    return {
        "model": model,
        "encoding": encoding,
        "seed": seed,
        "optimizer": "plain",
        "steps": 1000,
        "ppl": {"128": ppl128, "2048": ppl2048},
        "eval_bytes": 131072,
        "final_loss": 1.5,
        "train_seconds": 1.0,
    }


def test_the_docs_block_is_the_rendering_of_the_recorded_cases(bench):
    """docs/benchmarks.md's lm-quality table is written from docs/runs/lm_quality, never by
    hand (``bench_lm_quality.py --docs`` rewrites it)."""
    text = bench.DOCS_PAGE.read_text()
    recorded = bench.recorded_results()
    assert recorded, "no recorded cases in docs/runs/lm_quality/cases"
    assert bench.replace_block(text, bench.render_block(recorded)) == text


def test_the_block_gives_mean_interval_seeds_and_the_gap_to_the_peer(bench):
    results = [
        bench.normalise(case("relpos", "alibi", s, v, v + 1)) for s, v in enumerate((6, 7, 8))
    ]
    results += [case("x-transformers", "alibi", s, 5.0, 5.5) for s in (0, 1)]
    block = bench.render_block(results)
    lines = block.splitlines()
    relpos_row = next(line for line in lines if "GPT-2 init, tied head" in line)
    # mean 7, t(2 dof) = 4.303, sd 1, n 3: half-width 4.303 / sqrt(3) = 2.484
    assert "7.000 ± 2.484 (6.000 / 7.000 / 8.000)" in relpos_row
    assert "0, 1, 2" in relpos_row and "+40.0%" in relpos_row  # 7 vs the peer's 5
    peer_row = next(line for line in lines if "at its defaults" in line)
    assert "5.000 ± 0.000 (5.000 / 5.000)" in peer_row and "+0.0%" in peer_row
    # the default model first, the peer after the relpos variants
    assert lines.index(relpos_row) < lines.index(peer_row)


def test_runs_at_other_lengths_get_a_table_of_their_own_with_the_rise_beyond_l(bench):
    """Cases evaluated at other lengths (FIRE and KERPLE at 4x and 16x) are not mixed into the
    peer comparison: they get a second table, after it, with ppl(n) / ppl(L) per length."""
    compared = [case("relpos", "alibi", 0, 6.0, 6.0), case("x-transformers", "alibi", 0, 5.0, 5.0)]
    longer = []
    for seed, (at_l, at_4l, at_16l) in enumerate([(5.0, 6.0, 10.0), (5.0, 7.0, 11.0)]):
        result = case("relpos", "fire", seed, at_l, at_16l)
        result["ppl"] = {"128": at_l, "512": at_4l, "2048": at_16l}
        longer.append(result)
    relpos_runs = [bench.normalise(r) for r in [compared[0], *longer]]
    block = bench.render_block([*relpos_runs, compared[1]])
    first, second = block.split("\n\n")
    assert "vs the peer's defaults" in first and "fire" not in first
    assert second.splitlines()[0].endswith("ppl @ 512 / ppl @ 128 | ppl @ 2048 / ppl @ 128 |")
    fire_row = second.splitlines()[2]
    assert "6.500 ± 6.353 (6.000 / 7.000)" in fire_row  # t(1 dof) = 12.706, sd 0.707
    assert fire_row.endswith("| 1.30 | 2.10 |")  # 6.5 / 5 and 10.5 / 5


def test_replace_block_needs_exactly_one_block(bench):
    with pytest.raises(ValueError, match="exactly one"):
        bench.replace_block("no block here", "x")
    one = f"a\n{bench.BLOCK_START}\nold\n{bench.BLOCK_END}\nb"
    assert bench.replace_block(one, "new") == f"a\n{bench.BLOCK_START}\nnew\n{bench.BLOCK_END}\nb"


def test_record_copies_finished_cases_and_refuses_a_corrupt_one(bench, tmp_path):
    run = tmp_path / "run"
    (run / "cases").mkdir(parents=True)
    good = run / "cases" / "relpos.alibi.plain.s1000.e128-2048x131072.seed0.json"
    good.write_text('{"model": "relpos"}')
    (run / "cases" / "relpos.alibi.plain.s300.e128x16384.seed0.json").write_text("{}")
    assert bench.record(run, tmp_path / "docs") == [good.name]
    assert (tmp_path / "docs" / "cases" / good.name).read_text() == '{"model": "relpos"}'
    good.write_text("{not json")
    with pytest.raises(ValueError):
        bench.record(run, tmp_path / "docs")


def test_the_readme_peer_numbers_are_the_recorded_means(bench):
    """The README's "Against a peer" figures are the means (and 95% half-widths) of the
    recorded runs at the training length, to two decimals."""
    readme = (bench.REPO / "README.md").read_text()
    start = readme.index("**Against a peer.**")
    paragraph = readme[start : readme.index("\n\n", start)]
    groups = bench.by_model(bench.recorded_results())

    def figure(encoding: str, model: str) -> str:
        runs = next(m[model] for key, m in groups.items() if key[0] == encoding and model in m)
        mean, half = bench.interval([r["ppl"]["128"] for r in runs])
        return f"{mean:.2f}" if len(runs) < 2 else f"{mean:.2f} ± {half:.2f}"

    for encoding, model in [
        ("alibi", "relpos[init=gpt2,head=tied]"),
        ("alibi", "x-transformers"),
        ("alibi", "relpos[init=fan-in,head=untied]"),
        ("rope", "relpos[init=gpt2,head=tied]"),
        ("rope", "x-transformers"),
        ("rope", "relpos[init=fan-in,head=untied]"),
    ]:
        assert figure(encoding, model) in paragraph, (encoding, model, figure(encoding, model))
