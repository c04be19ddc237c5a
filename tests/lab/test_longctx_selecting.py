"""``relpos longctx`` with the selecting schedules (LongHeads, PINE): PINE's segments of a
passkey prompt, both methods end to end on the untrained tiny model, and on the real model
(slow)."""

from __future__ import annotations

import json
import math

import pytest

from relpos_lab.cli import main
from relpos_lab.longctx import ByteTokenizer
from relpos_lab.training.passkey import (
    FINAL_QUESTION,
    TASK_DESCRIPTION,
    passkey_prompt,
    passkey_segments,
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_passkey_segments_are_prefix_documents_of_the_filler_and_the_question():
    tok = ByteTokenizer()
    prompt = passkey_prompt(tok, 600, key=12345, depth=0.5)
    ids = passkey_segments(tok, prompt, documents=8)
    assert len(ids) == prompt.n_tokens
    prefix = len(TASK_DESCRIPTION.encode())
    suffix = len(("\n" + FINAL_QUESTION).encode())
    assert ids[:prefix] == [-1] * prefix and ids[prefix] == 0
    assert ids[-suffix:] == [8] * suffix and ids[-suffix - 1] == 7
    sizes = [ids.count(d) for d in range(8)]
    assert max(sizes) - min(sizes) <= 1  # nearly equal documents
    assert sorted(ids) == ids  # contiguous, in order


def test_llama_passes_pine_segments_to_every_layer_and_every_decoding_step():
    import torch

    from relpos_lab.longctx import random_tiny_model

    model, _ = random_tiny_model()
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    rope_nll = model.token_nll(tokens)
    model.set_encoding("pine")
    text = torch.full((1, 39), -1)
    text[0, -1] = 0  # running text: a prefix and a one-token suffix, plain RoPE
    torch.testing.assert_close(model.token_nll(tokens, inputs={"segments": text}), rope_nll)
    docs = torch.tensor([[-1] * 4 + [0] * 10 + [1] * 10 + [2] * 12 + [3] * 4])
    nll = model.token_nll(tokens, inputs={"segments": docs[:, :39]})
    assert not torch.allclose(nll, rope_nll)  # the documents see each other
    out = model.generate(tokens, 3, inputs={"segments": docs})
    full = model(out[:, :-1], inputs={"segments": docs})  # generated keys are suffix
    assert torch.equal(full[0, 39:].argmax(-1), out[0, 40:])


@pytest.mark.slow
def test_tiny_run_measures_longheads_and_pine_beside_the_baseline(tmp_path, capsys):
    """The CLI end to end (seconds)."""
    out = tmp_path / "run"
    argv = ["longctx", "--model", "random-tiny", "--methods", "baseline,longheads,pine"]
    argv += ["--lengths", "300", "--depths", "0.5", "--ppl-tokens", "32", "--out", str(out)]
    code, _, err = run(capsys, *argv, "--no-progress")
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"baseline", "longheads", "pine"}
    # running text has no documents: PINE's perplexity is plain RoPE's
    assert math.isclose(rows["pine"]["ppl"], rows["baseline"]["ppl"], rel_tol=1e-5)
    # beyond the trained 256 tokens LongHeads selects chunks: another perplexity
    assert not math.isclose(rows["longheads"]["ppl"], rows["baseline"]["ppl"], rel_tol=1e-4)
    assert all(r["passkey_trials"] == 1 for r in rows.values())


@pytest.mark.slow
def test_real_model_runs_longheads_and_pine_in_longctx(tmp_path, capsys):
    """SmolLM2 (trained context 8K) at 1K tokens: LongHeads is RoPE inside the trained context
    (the same perplexity and answer as the baseline); PINE orders the filler's 8 documents and
    still finds the key; its perplexity (no documents) is RoPE's. About 15 minutes on 2 busy
    cores (PINE's passkey prompt is the slowest part)."""
    pytest.importorskip("gguf")
    from relpos.interop import ModelNotInstalledError, smollm2_path

    try:
        smollm2_path()
    except ModelNotInstalledError as err:
        pytest.skip(str(err))
    out = tmp_path / "real"
    argv = ["longctx", "--methods", "baseline,longheads,pine", "--lengths", "1024"]
    argv += ["--depths", "0.5", "--ppl-tokens", "64", "--out", str(out), "--no-progress"]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert {m: r["passkey_correct"] for m, r in rows.items()} == {
        "baseline": 1,
        "longheads": 1,
        "pine": 1,
    }
    for name in ("longheads", "pine"):
        assert math.isclose(rows[name]["ppl"], rows["baseline"]["ppl"], rel_tol=1e-4)
