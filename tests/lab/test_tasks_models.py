"""The task models, position schemes and metrics (``relpos_lab.tasks.models``,
``jobs``, ``metrics``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relpos.nn import TransformerLM
from relpos_lab.tasks.chomsky import TaskBatch, chomsky_task
from relpos_lab.tasks.length_suites import Job, _Data, build_model, positions
from relpos_lab.tasks.metrics import exact_match, masked_accuracy, mean_ci, ood_score
from relpos_lab.tasks.models import TaskEncoder, check_encoding_for_tasks
from relpos_lab.tasks.text import DecoderBatch


def test_masked_accuracy_counts_only_masked_outputs():
    targets = torch.tensor([[1, 0, 2, 0], [2, 1, 1, 1]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 1, 2, 0], [0, 1, 1, 1]]), 3).float()
    # row 0: 2 of 3 masked right; row 1: 0 of 1
    assert masked_accuracy(logits, TaskBatch(targets, targets, mask)) == pytest.approx(2 / 4)


def test_exact_match_equals_greedy_decoding():
    torch.manual_seed(0)
    model = TransformerLM(12, 16, 1, 2, "alibi").eval()
    prompts = torch.randint(2, 12, (4, 5))
    greedy = model.generate(prompts, 4)  # the model's own continuation
    tokens = greedy.clone()
    tokens[1, 7] = (tokens[1, 7] + 1) % 12  # row 1: one target token differs from greedy
    tokens[3, 6] = (tokens[3, 6] + 1) % 12  # row 3 too
    mask = torch.zeros(4, 9, dtype=torch.bool)
    mask[:, 4:8] = True  # positions 4..7 predict tokens 5..8
    batch = DecoderBatch(tokens, mask, torch.zeros(4), torch.full((4,), 5))
    with torch.no_grad():
        ok = exact_match(model(tokens), batch)
    assert ok.tolist() == [True, False, True, False]


def test_ood_score_includes_the_first_test_length():
    # example.py's np.mean(accuracies[N + 1:]) drops length N + 1; relpos does not
    per_length = {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.5}
    assert ood_score(per_length, [3, 4]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no accuracy measured at test lengths \\[5\\]"):
        ood_score(per_length, [4, 5])


def test_mean_ci_is_the_student_t_interval():
    mean, half = mean_ci([0.5, 0.7])
    assert mean == pytest.approx(0.6)
    assert half == pytest.approx(12.706 * 0.1414213562 / 2**0.5, rel=1e-6)
    assert mean_ci([0.4]) == (0.4, 0.0)
    assert mean_ci([1.0, 2.0, 3.0])[1] == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-4)


def test_task_encoder_reads_logits_from_the_empty_tokens_and_is_bidirectional():
    torch.manual_seed(0)
    model = TaskEncoder(2, 2, dim=16, depth=1, num_heads=2, encoding="rope", dropout=0.0)
    x = torch.randint(0, 2, (3, 6))
    out = model(x, 6)
    assert out.shape == (3, 6, 2)
    y = x.clone()
    y[:, -1] = 1 - y[:, -1]  # the last input token reaches the first output (non-causal)
    assert not torch.allclose(model(y, 6)[:, 0], out[:, 0])


def _job(**kw) -> Job:
    base = dict(
        suite="chomsky", task="reverse_string", model="rope+random", encoding="rope",
        scheme="random", seed=0, dim=16, depth=1, num_heads=2, batch_size=4, steps=2,
        lr=1e-3, warmup=0, train_len=4, test_lengths=[5, 6], eval_size=4, max_length=64,
    )  # fmt: skip
    base.update(kw)
    return Job(**base)


def test_randomized_positions_are_sorted_distinct_shared_and_fresh_per_pass():
    job = _job()
    data = _Data(job)
    batch = chomsky_task("reverse_string").sample(np.random.default_rng(0), 4, 5)
    g = torch.Generator().manual_seed(0)
    p1 = positions(job, data, batch, train=True, generator=g)
    p2 = positions(job, data, batch, train=False, generator=g)  # drawn at test time too
    assert p1.shape == (10,)  # one sample shared across the batch
    assert (p1.diff() > 0).all() and int(p1.max()) < 64
    assert not p1.equal(p2)


def test_learned_tables_cover_every_position_of_the_scheme():
    job = _job(model="learned+random", encoding="learned")
    model = build_model(job, _Data(job))
    assert model.input_encoding.max_positions == 64
    job = _job(model="learned", encoding="learned", scheme="default")
    assert build_model(job, _Data(job)).input_encoding.max_positions == 12  # 6 in + 6 out
    job = _job(
        suite="coupling", task="addition", model="learned+coupled", encoding="learned",
        scheme="coupled", max_position=20, test_lengths=[6],
    )  # fmt: skip
    assert build_model(job, _Data(job)).input_encoding.max_positions == 21


def test_encodings_the_task_models_cannot_run_are_refused_by_name():
    with pytest.raises(ValueError, match="'nope' reads no positions"):
        check_encoding_for_tasks("nope", "random", causal=False)
    with pytest.raises(ValueError, match="'swin-2d' has 2 position axes"):
        check_encoding_for_tasks("swin-2d", "default", causal=False)
    with pytest.raises(ValueError, match="'graph-spd' needs per-call inputs"):
        check_encoding_for_tasks("graph-spd", "default", causal=True)
    with pytest.raises(ValueError, match="'xpos' is for causal attention only"):
        check_encoding_for_tasks("xpos", "default", causal=False)
    check_encoding_for_tasks("xpos", "random", causal=True)  # the decoder takes it


def test_decoder_scores_report_token_accuracy_beside_exact_match(tmp_path):
    from relpos_lab.tasks.length_suites import evaluate_job

    job = _job(
        suite="coupling", task="addition", model="nope", encoding="nope", scheme="default",
        test_lengths=[5], eval_size=6, folder=str(tmp_path),
    )  # fmt: skip
    data = _Data(job)
    scores = evaluate_job(job, data, build_model(job, data).eval())
    assert set(scores) == {2, 4, 5}
    for cell in scores.values():
        assert cell["n"] == 6 and 0.0 <= cell["accuracy"] <= cell["token_accuracy"] <= 1.0


def test_the_chomsky_encoder_uses_the_two_sided_form_of_declared_bidirectional_biases():
    for name in ("t5", "alibi"):
        job = _job(model=name, encoding=name, scheme="default")
        enc = build_model(job, _Data(job)).blocks[0].attn.encoding
        assert enc.bidirectional in (True, "symmetric"), name
    job = _job(suite="nope", task="copy", model="t5", encoding="t5", scheme="default")
    assert build_model(job, _Data(job)).blocks[0].attn.encoding.bidirectional is False


def test_learning_rate_schedules_after_the_warmup():
    from relpos_lab.tasks.jobs import learning_rate

    job = _job(steps=100, warmup=10, lr=1e-3, schedule="linear")
    assert learning_rate(job, 0) == pytest.approx(1e-4)  # warmup: (step + 1) / warmup
    assert learning_rate(job, 9) == pytest.approx(1e-3)
    assert learning_rate(job, 10) == pytest.approx(1e-3)  # then linear to 0 at `steps`
    assert learning_rate(job, 55) == pytest.approx(0.5e-3)
    assert learning_rate(job, 100) == pytest.approx(0.0)
    job.schedule = "cosine"  # to lr / 10
    assert learning_rate(job, 55) == pytest.approx(0.55e-3)
    assert learning_rate(job, 100) == pytest.approx(1e-4)
    job.schedule = "constant"
    assert learning_rate(job, 99) == pytest.approx(1e-3)
    job.schedule = "step"
    with pytest.raises(ValueError, match="schedule must be one of constant, cosine, linear"):
        learning_rate(job, 50)


def test_the_nope_study_profiles_decay_the_learning_rate_as_the_official_trainer():
    # configs/trainer/default.jsonnet: warmup_ratio 0.06, lr_scheduler_type polynomial (power 1)
    from relpos_lab.tasks.profiles import get_task_profile

    for name in ("quick", "full"):
        profile = get_task_profile("nope", name)
        assert profile.schedule == "linear"
        assert profile.warmup == pytest.approx(0.06 * profile.steps)


def test_wilson_interval_matches_the_closed_form_and_is_not_empty_at_the_edges():
    from relpos_lab.tasks.metrics import wilson_interval

    # 0 of 640 (a collapsed model on the quick copy test set): [0, z^2 / (n + z^2)]
    low, high = wilson_interval(0, 640)
    assert low == 0.0 and high == pytest.approx(1.96**2 / (640 + 1.96**2))
    assert wilson_interval(640, 640)[0] == pytest.approx(640 / (640 + 1.96**2))
    # 8 of 10: Wilson (1927) -> [0.4902, 0.9433]
    assert wilson_interval(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-4)
    with pytest.raises(ValueError, match="n >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="hits must be in"):
        wilson_interval(11, 10)


def test_exact_match_summaries_pool_the_test_examples_of_every_seed():
    from relpos_lab.tasks.length_report import markdown_summary, summarize
    from relpos_lab.tasks.metrics import wilson_interval

    def row(seed, length, acc, n, suite="nope"):
        return {"suite": suite, "task": "copy", "model": "nope", "seed": seed,
                "length": length, "test": length > 2, "accuracy": acc, "n": n}  # fmt: skip

    rows = [row(0, 2, 1.0, 8), row(0, 3, 0.5, 8), row(0, 4, 0.25, 4),
            row(1, 2, 1.0, 8), row(1, 3, 0.0, 8), row(1, 4, 0.5, 4)]  # fmt: skip
    (s,) = summarize(rows)
    assert s["scores"] == pytest.approx([5 / 12, 2 / 12])  # mean over test examples
    assert s["test_examples"] == 24
    assert s["examples_ci"] == pytest.approx(list(wilson_interval(7, 24)))
    assert "| 24 [" in markdown_summary([s])
    chomsky = [dict(r, suite="chomsky") for r in rows]
    (c,) = summarize(chomsky)
    assert c["examples_ci"] is None and "| - |" in markdown_summary([c])
