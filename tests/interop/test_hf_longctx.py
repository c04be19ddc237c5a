"""``relpos longctx --model hf:...``: the same experiment on a transformers model through the
patch gives the same results table as relpos's own model with the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from relpos.interop.hf import HFCausalLM, load_hf, to_hf  # noqa: E402
from relpos_lab.cli import main  # noqa: E402
from relpos_lab.longctx import random_tiny_model  # noqa: E402

ARGS = ("longctx", "--lengths", "300", "--depths", "0.5", "--ppl-tokens", "16", "--no-progress")


def english_text(chars: int = 24_000) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(english_text(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """The ``random-tiny`` LlamaLM exported with ``to_hf`` and saved as a transformers folder."""
    folder = tmp_path_factory.mktemp("hf") / "tiny"
    lm, _ = random_tiny_model()
    to_hf(lm).save_pretrained(folder)
    return folder


def measure(tmp_path, data_file, model_name):
    """``run_longctx`` (the command's measurements, without its plot) on ``--model``."""
    from relpos_lab.longctx import load_model, plan_longctx, run_longctx
    from relpos_lab.longctx.run import heldout_text

    plan = plan_longctx(
        methods="baseline,self-extend",
        lengths="300",
        depths="0.5",
        seeds=1,
        ppl_tokens=16,
        out_dir=tmp_path / model_name[:2],
        model=model_name,
        data=str(data_file),
    )
    model, tokenizer, _ = load_model(plan.model)
    _, text = heldout_text(plan.data)
    heldout = torch.tensor(tokenizer.encode(text[:4000]))
    return run_longctx(plan, model, tokenizer, heldout)


def test_the_hf_table_matches_the_built_in_models(tmp_path, data_file, tiny_folder):
    own = measure(tmp_path, data_file, "random-tiny")
    hf = measure(tmp_path, data_file, f"hf:{tiny_folder}")
    assert [(r["method"], r["length"]) for r in hf.rows] == [
        (r["method"], r["length"]) for r in own.rows
    ]
    for a, b in zip(hf.rows, own.rows, strict=True):
        assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-6), a["method"]
        assert a["passkey_correct"] == b["passkey_correct"]
    assert [t["generated"] for t in hf.trials] == [t["generated"] for t in own.trials]


def test_a_config_json_runs_through_the_command(tmp_path, data_file, capsys):
    config = tmp_path / "qwen2.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "vocab_size": 256,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 256,
            }
        )
    )
    out = tmp_path / "run"
    argv = [*ARGS, "--methods", "self-extend", "--seeds", "0", "--model", f"hf:{config}"]
    code = main([*argv, "--data", str(data_file), "--out", str(out)])
    text, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["self-extend"]
    assert data["rows"][0]["ppl"] > 1 and "random weights, seed 0" in text
    assert data["meta"]["model"]["source"] == f"hf:{config}"


def test_the_adapter_scores_and_decodes_like_llamalm(tiny_folder):
    lm, _ = random_tiny_model()
    model, tokenizer = load_hf(f"hf:{tiny_folder}")
    assert isinstance(model, HFCausalLM) and tokenizer is None  # the lab reads bytes
    ids = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(0))
    for name, options in (("rope", {}), ("lm-infinite", {"local_branch": 16})):
        lm.set_encoding(name, **options)
        model.set_encoding(name, **options)
        torch.testing.assert_close(
            model.token_nll(ids, start=20, chunk=7), lm.token_nll(ids, start=20), atol=1e-5, rtol=0
        )
        assert torch.equal(model.generate(ids, 5), lm.generate(ids, 5))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("hf:/no/such/folder", "does not exist"),
        ("hf:", "does not exist"),
    ],
)
def test_bad_hf_models_give_one_line(tmp_path, data_file, capsys, model, message):
    out = tmp_path / "run"
    code = main([*ARGS, "--model", model, "--data", str(data_file), "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("relpos: error: ") and message in err
    assert err.count("\n") == 1 and not out.exists()
