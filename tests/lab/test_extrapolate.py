"""relpos_lab.extrapolate: the evaluation protocol, the run plan, and the report files."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from relpos.nn import TransformerLM
from relpos_lab import extrapolate as ex
from relpos_lab import report
from relpos_lab.training.profiles import PROFILES, get_profile


class UniformLM(nn.Module):
    """Equal logits for every token: perplexity must equal the vocabulary size."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab) + 0 * self.dummy


class RecordingLM(UniformLM):
    """A uniform LM that records every window it is given."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab)
        self.windows: list[torch.Tensor] = []

    def forward(self, tokens):
        self.windows.extend(tokens.clone())
        return super().forward(tokens)


def test_nonoverlapping_windows_tile_the_text_and_score_every_token():
    spans, stride, start = ex.window_spans(1001, 100)
    assert (stride, start) == (100, 0)
    assert spans == [(s, s + 100, 100) for s in range(0, 1000, 100)]
    # a budget that is not a multiple of the length: the last window is shorter
    spans, _, _ = ex.window_spans(1001, 100, max_tokens=250)
    assert spans == [(0, 100, 100), (100, 200, 100), (200, 250, 50)]


def test_sliding_windows_score_only_tokens_with_full_context():
    length, n = 64, 1000
    spans, stride, start = ex.window_spans(n, length, mode="sliding", max_tokens=200)
    assert stride == 16 and start == 48  # a quarter window; first index with full context
    assert sum(k for _, _, k in spans) == 200
    assert len(spans) == math.ceil(200 / 16)
    scored = []
    for s, e, k in spans:
        assert e - s == length - stride + k  # full windows, but a last one cut by the budget
        scored += list(range(e - k, e))
        assert e - k - s >= length - stride  # each scored target sees >= 48 earlier tokens
    assert scored == list(range(48, 248))  # consecutive targets, none twice
    assert [e - s for s, e, _ in spans[:-1]] == [length] * (len(spans) - 1)


def test_sliding_start_must_leave_room_for_a_full_window():
    with pytest.raises(ValueError, match="start"):
        ex.window_spans(1000, 64, mode="sliding", start=10)
    with pytest.raises(ValueError, match="stride"):
        ex.window_spans(1000, 64, mode="sliding", stride=65)
    with pytest.raises(ValueError, match="too short"):
        ex.window_spans(40, 64, mode="sliding")
    with pytest.raises(ValueError, match="mode"):
        ex.window_spans(1000, 64, mode="strided")


@pytest.mark.parametrize("mode", ex.MODES)
def test_uniform_model_perplexity_equals_vocab_size(mode):
    tokens = torch.randint(0, 50, (3000,))
    r = ex.evaluate_perplexity(UniformLM(50), tokens, 128, mode=mode, max_tokens=1024)
    assert r["ppl"] == pytest.approx(50.0, rel=1e-5)
    assert r["nll"] == pytest.approx(math.log(50), rel=1e-6)
    assert r["tokens_scored"] == 1024
    assert r["windows"] == (1024 // 128 if mode == "nonoverlapping" else 1024 // 32)


def test_evaluation_feeds_the_expected_windows():
    tokens = torch.arange(500) % 97
    model = RecordingLM(97)
    r = ex.evaluate_perplexity(model, tokens, 40, mode="sliding", stride=10, max_tokens=95)
    assert r["windows"] == 10 and r["tokens_scored"] == 95 and r["start"] == 30
    # windows of 40 end every 10 tokens; the last, cut short by the budget, keeps 30 of context
    expected = [tokens[10 * k : 10 * k + 40] for k in range(9)] + [tokens[90:125]]
    got = sorted(model.windows, key=lambda w: int(w[0]))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_real_model_perplexity_does_not_depend_on_batching():
    torch.manual_seed(0)
    model = TransformerLM(64, dim=16, depth=1, num_heads=2, encoding="alibi")
    tokens = torch.randint(0, 64, (2000,))
    for mode in ex.MODES:
        a = ex.evaluate_perplexity(model, tokens, 64, mode=mode, max_tokens=512, batch_size=1)
        b = ex.evaluate_perplexity(model, tokens, 64, mode=mode, max_tokens=512)
        assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-5)
        assert a["tokens_scored"] == b["tokens_scored"] == 512
    assert model.training  # restored after evaluation


def test_eval_budget_is_the_same_for_every_length_and_fits_the_longest_window():
    profile = get_profile("quick")
    lengths = [128, 256, 512, 1024, 2048]
    budgets, starts = ex.eval_budget(profile, 100_000, lengths, 128)
    assert budgets["nonoverlapping"] == profile.eval_tokens["nonoverlapping"]
    assert budgets["nonoverlapping"] % 2048 == 0
    assert starts["sliding"] == 2048 - 512
    for mode in ex.MODES:
        for n in lengths:
            spans, _, _ = ex.window_spans(
                100_000, n, mode=mode, start=starts[mode], max_tokens=budgets[mode]
            )
            assert sum(k for _, _, k in spans) == budgets[mode]
    with pytest.raises(ValueError, match="too few"):
        ex.eval_budget(profile, 1500, lengths, 128)


def test_parse_encodings_and_mults():
    assert ex.parse_encodings("rope, alibi,rope") == ["rope", "alibi"]
    with pytest.raises(ValueError, match="known encodings: .*alibi"):
        ex.parse_encodings("rope,nosuch")
    assert ex.parse_mults("4,1,2") == [1.0, 2.0, 4.0]
    for bad in ("0", "1,-2", "x", ""):
        with pytest.raises(ValueError, match="eval-mult"):
            ex.parse_mults(bad)


def test_profiles_cover_the_headline_encodings():
    quick, paper = PROFILES["quick"], PROFILES["paper"]
    assert set(quick.encodings) == {
        "rope",
        "alibi",
        "kerple-log",
        "fire",
        "t5",
        "sinusoidal",
        "nope",
    }
    assert {"xpos", "kerple-power", "learned"} <= set(paper.encodings)
    assert paper.steps > quick.steps
    assert paper.encoding_options("learned", 128, 2048) == {"max_positions": 2048}
    with pytest.raises(ValueError, match="known profiles: quick, paper"):
        get_profile("slow")


# ------------------------------------------------------------------------------ a tiny run


def fake_corpus(n: int = 40_000):
    from relpos_lab.training.data import Corpus

    g = torch.Generator().manual_seed(0)
    # a learnable stream: mostly "next = previous + 1 (mod 32)" with some noise
    steps = torch.where(
        torch.rand(n, generator=g) < 0.8, 1, torch.randint(0, 32, (n,), generator=g)
    )
    stream = torch.cumsum(steps, 0) % 32
    third = n // 3
    return Corpus(
        name="fake",
        train=stream[:third],
        valid=stream[third : 2 * third],
        test=stream[2 * third :],
        vocab_size=32,
        tokenizer="bytes",
        documents={"train": ["a"], "valid": ["b"], "test": ["c"]},
    )


TINY = replace(
    PROFILES["quick"],
    name="tiny",
    dim=16,
    depth=1,
    num_heads=2,
    batch_size=4,
    steps=3,
    warmup=1,
    eval_tokens={"nonoverlapping": 256, "sliding": 64},
)


def test_run_extrapolation_rows_and_resume(tmp_path):
    corpus = fake_corpus()
    kw = dict(
        train_len=16,
        eval_mults="1,2,4",
        profile=TINY,
        corpus=corpus,
        progress=False,
        log=lambda s: None,
    )
    rows = ex.run_extrapolation(["alibi", "nope"], out_dir=tmp_path / "run", **kw)
    assert len(rows) == 2 * 3 * 2
    keys = {(r["encoding"], r["eval_len"], r["mode"]) for r in rows}
    assert len(keys) == len(rows)
    for r in rows:
        assert r["family"] == {"alibi": "bias", "nope": "none"}[r["encoding"]]
        assert r["mult"] == r["eval_len"] / 16 and r["steps"] == 3 and r["seed"] == 0
        assert r["tokens_scored"] == TINY.eval_tokens[r["mode"]]
        assert math.isfinite(r["ppl"]) and r["ppl"] > 1
        assert (r["dim"], r["depth"], r["heads"], r["batch"]) == (16, 1, 2, 4)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["kind"] == ex.RUN_KIND
    # an existing run needs --resume or --force
    with pytest.raises(ValueError, match="--resume"):
        ex.run_extrapolation(["alibi"], out_dir=tmp_path / "run", **kw)
    # resume: nothing left to do, the saved evaluation comes back
    again = ex.run_extrapolation(["alibi", "nope"], out_dir=tmp_path / "run", resume=True, **kw)
    assert again == rows


def test_write_report_files(tmp_path):
    rows = []
    for name, growth in (("alibi", 1.0), ("sinusoidal", 3.0)):
        for mode in ex.MODES:
            for mult in (1, 2, 4):
                rows.append(
                    {
                        "encoding": name,
                        "family": "bias",
                        "train_len": 16,
                        "eval_len": 16 * mult,
                        "mult": float(mult),
                        "mode": mode,
                        "ppl": 5.0 * growth ** (mult - 1),
                        "nll": 1.6,
                        "tokens_scored": 64,
                        "windows": 4,
                        "stride": 4,
                        "seed": 0,
                        "steps": 3,
                        "final_loss": 2.0,
                        "train_seconds": 1.0,
                        "tokens_per_second": 100.0,
                        "dim": 16,
                        "depth": 1,
                        "heads": 2,
                        "batch": 4,
                        "lr": 1e-3,
                        "split": "test",
                        "profile": "tiny",
                    }
                )
    meta = report.run_metadata(command="relpos extrapolate --steps 3", profile="tiny")
    paths = report.write_report(tmp_path, rows, meta)
    data = json.loads(paths["json"].read_text())
    assert data["rows"] == rows and data["meta"]["command"] == "relpos extrapolate --steps 3"
    assert {"versions", "machine"} <= set(data["meta"])
    with paths["csv"].open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and float(table[0]["ppl"]) == rows[0]["ppl"]
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 150_000
    md = paths["md"].read_text()
    assert "relpos extrapolate --steps 3" in md and "ppl_vs_length.png" in md
    assert "| `sinusoidal` | 5.00 | 15.00 | 135.00 | 27.00x |" in md
    assert "How to read it" in md
