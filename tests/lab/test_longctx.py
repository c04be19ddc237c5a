"""``relpos longctx``: passkey prompts, the method registry, the tail perplexity, the CLI run."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from relpos.rope_scaling import ntk_scaled_base
from relpos_lab import longctx
from relpos_lab.cli import main
from relpos_lab.longctx import METHODS, ByteTokenizer, Method, random_tiny_model
from relpos_lab.training.passkey import (
    FINAL_QUESTION,
    GARBAGE,
    TASK_DESCRIPTION,
    first_integer,
    garbage,
    information_line,
    landmark_prompt,
    passkey_prompt,
)

# ------------------------------------------------------------------------------ passkey


def test_landmark_prompt_is_the_papers_five_lines():
    text = landmark_prompt(500, 31337, 0.3)
    parts = text.split("\n")
    assert parts == [
        TASK_DESCRIPTION,
        garbage(150),
        information_line(31337),
        garbage(350),
        FINAL_QUESTION,
    ]
    assert information_line(7) == "The pass key is 7. Remember it. 7 is the pass key."
    # the Landmark code's filler: " ".join([garbage] * 2000), cut in characters
    assert garbage(200) == " ".join([GARBAGE] * 3)[:200]
    assert len(garbage(300_000)) == 300_000  # longer than 2000 copies when asked


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_the_key_appears_once_at_the_requested_depth(depth):
    prompt = passkey_prompt(ByteTokenizer(), 3000, key=4242, depth=depth)
    text = prompt.text
    assert text.count(information_line(4242)) == 1
    assert re.findall(r"\d+", text) == ["4242", "4242"]  # nowhere but in its line
    before = text.index(information_line(4242)) - len(TASK_DESCRIPTION) - 2  # two newlines
    assert before == round(depth * prompt.n_garbage)
    assert abs(prompt.n_tokens - 3000) <= 1 and prompt.ids == list(text.encode())


def test_first_integer_is_the_answer():
    assert first_integer(" 12345. Remember") == 12345
    assert first_integer("The key is 7 or 8") == 7
    assert first_integer("no digits") is None


def test_prompts_shorter_than_the_task_text_are_refused():
    with pytest.raises(ValueError, match="shorter than the prompt without filler"):
        passkey_prompt(ByteTokenizer(), 100, key=1, depth=0.5)
    with pytest.raises(ValueError, match="depth must be a finite number >= 0 and <= 1"):
        landmark_prompt(10, 1, 1.5)
    with pytest.raises(TypeError, match="encode"):
        passkey_prompt(object(), 1000, key=1, depth=0.5)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from relpos.interop.gguf import ModelNotInstalledError, build_tokenizer, open_gguf, smollm2_path

    try:
        return build_tokenizer(open_gguf(smollm2_path()))
    except ModelNotInstalledError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("target", [1024, 4096, 16384])
def test_prompt_length_is_close_to_the_target_in_smollm2_tokens(smollm2_tokenizer, target):
    for depth in (0.1, 0.9):
        prompt = passkey_prompt(smollm2_tokenizer, target, key=50000, depth=depth)
        assert abs(prompt.n_tokens - target) <= 2
        assert prompt.ids == smollm2_tokenizer.encode(prompt.text).ids
        # the key's line starts `depth` of the way through the filler tokens
        encode = smollm2_tokenizer.encode
        key_at = prompt.text.index(information_line(50000))
        prefix_tokens = len(encode(prompt.text[:key_at]).ids)
        filler_tokens = prompt.n_tokens - len(encode(landmark_prompt(0, 50000, depth)).ids)
        expected = len(encode(TASK_DESCRIPTION + "\n").ids) + depth * filler_tokens
        assert abs(prefix_tokens - expected) <= 3 + 0.002 * target


def test_trial_keys_are_the_same_for_every_method_and_differ_across_lengths():
    a = longctx.trial_keys(4096, [0.1, 0.5], seeds=2)
    assert a == longctx.trial_keys(4096, [0.1, 0.5], seeds=2)
    assert [(d, s) for d, s, _ in a] == [(0.1, 0), (0.5, 0), (0.1, 1), (0.5, 1)]
    assert all(1 <= k <= 50000 for _, _, k in a)
    assert [k for *_, k in a] != [k for *_, k in longctx.trial_keys(8192, [0.1, 0.5], 2)]


# ------------------------------------------------------------------------------ methods


def test_the_registry_holds_the_rope_scalings_and_schedules_of_the_experiment():
    scalings = ["baseline", "pi", "ntk", "dynamic-ntk", "yarn"]
    assert list(METHODS) == [*scalings, "lm-infinite", "dca", "self-extend", "longheads", "pine"]
    assert longctx.available_methods() == list(METHODS)
    assert {METHODS[n].encoding for n in scalings} == {"rope"}
    types = {n: METHODS[n].options.get("scaling", {}).get("rope_type") for n in scalings}
    assert types == {
        "baseline": None,
        "pi": "linear",
        "ntk": "ntk",
        "dynamic-ntk": "dynamic",
        "yarn": "yarn",
    }
    assert all(METHODS[n].options["scaling"]["factor"] == 2.0 for n in scalings[1:])


def test_each_method_builds_its_encoding_on_the_models_rope():
    model, _ = random_tiny_model()
    base = model.set_encoding("rope").inv_freq.clone()
    half = model.config.head_dim
    encs = {}
    for name, method in METHODS.items():
        encs[name] = model.set_encoding(method.encoding, **method.options)
        assert encs[name].base == model.config.rope_base
        assert encs[name].max_position_embeddings == model.config.max_position_embeddings
    # the schedules are sized from the model's trained context
    assert encs["lm-infinite"].local_branch == model.config.max_position_embeddings
    assert encs["dca"].chunk_size == 3 * model.config.max_position_embeddings // 4
    assert encs["self-extend"].group_size == 8
    torch.testing.assert_close(encs["baseline"].inv_freq, base)
    torch.testing.assert_close(encs["pi"].inv_freq, base / 2)
    b2 = ntk_scaled_base(model.config.rope_base, 2.0, half)
    assert math.isclose(encs["ntk"].inv_freq[-1].item(), b2 ** (-(half - 2) / half), rel_tol=1e-5)
    assert encs["dynamic-ntk"].length_dependent and not encs["yarn"].length_dependent
    assert math.isclose(encs["yarn"].attention_factor, 0.1 * math.log(2.0) + 1)


@pytest.mark.slow  # runs every profile's methods
def test_profiles_run_the_rope_scalings_and_all_adds_the_slower_schedules():
    assert longctx.plan_longctx(out_dir="unused-folder").methods == list(longctx.ROPE_SCALINGS)
    assert longctx.parse_methods("all") == list(METHODS)
    assert longctx.parse_methods("yarn,all")[0] == "yarn"
    assert longctx.method_cost("yarn") == 1.0 and longctx.method_cost("dca") > 1.0
    full = longctx.plan_longctx(profile="full", out_dir="unused-folder")
    assert full.lengths == [2048, 4096, 8192, 12288, 16384]
    assert 0 < longctx.plan_longctx(out_dir="unused-folder").estimate_seconds() < 600


def test_adding_a_method_is_one_registry_entry(monkeypatch):
    monkeypatch.setitem(
        METHODS, "ntk-x4", Method("rope", {"scaling": {"rope_type": "ntk", "factor": 4.0}})
    )
    assert longctx.parse_methods("baseline, ntk-x4") == ["baseline", "ntk-x4"]
    monkeypatch.setitem(METHODS, "unregistered", Method("no-such-encoding", {}))
    assert "unregistered" not in longctx.available_methods()
    with pytest.raises(ValueError, match="unknown method 'unregistered'; known methods: "):
        longctx.parse_methods("unregistered")


def test_lengths_and_depths_parse_and_reject_bad_values():
    assert longctx.parse_lengths("4k, 2048,16K") == [2048, 4096, 16384]
    assert longctx.parse_depths("0.1,0.9") == [0.1, 0.9]
    for bad, match in (("1.5k2", "comma-separated"), ("12", ">= 64"), ("", "empty")):
        with pytest.raises(ValueError, match=match):
            longctx.parse_lengths(bad)
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        longctx.parse_depths("0.5,2")


# ------------------------------------------------------------------------------ perplexity


def test_tail_perplexity_scores_the_same_tokens_at_every_length():
    model, _ = random_tiny_model()
    ids = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(0))
    results = {}
    for length in (40, 120):
        results[length] = longctx.tail_perplexity(model, ids, length, 16, end=150)
        with torch.no_grad():
            logits = model(ids[150 - length : 150][None])[0, -16:]
        nll = F.cross_entropy(logits, ids[135:151]).item()
        assert math.isclose(results[length]["nll"], nll, rel_tol=1e-5)
        assert results[length]["ppl_tokens"] == 16
    with pytest.raises(ValueError, match="held-out text has 200 tokens"):
        longctx.tail_perplexity(model, ids, 250, 16)


# ------------------------------------------------------------------------------ CLI

TINY = (
    "longctx",
    "--model",
    "random-tiny",
    "--methods",
    "baseline,yarn",
    "--lengths",
    "300,400",
    "--depths",
    "0.5",
    "--ppl-tokens",
    "16",
    "--no-progress",
)


def english_text(chars: int = 24_000) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(english_text(), encoding="utf-8")
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tiny_end_to_end_run_writes_results_table_and_plot(tmp_path, data_file, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run(capsys, *TINY, "--data", str(data_file), "--out", str(out))
    assert code == 0
    assert "passkey (correct/trials) and perplexity" in stdout
    for name in ("results.json", "results.csv", "longctx.png", "report.md", "run.json"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    assert [(r["method"], r["length"]) for r in rows] == [
        ("baseline", 300),
        ("yarn", 300),
        ("baseline", 400),
        ("yarn", 400),
    ]
    assert all(r["passkey_trials"] == 1 and r["prompt_tokens"] == r["length"] for r in rows)
    assert all(r["ppl"] > 1 and r["ppl_tokens"] == 16 for r in rows)
    assert len(data["trials"]) == 4 and data["meta"]["model"]["source"] == "random-tiny"
    with open(out / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["method"] for r in table] == ["baseline", "yarn", "baseline", "yarn"]
    assert json.loads(table[1]["options"]) == {"scaling": {"factor": 2.0, "rope_type": "yarn"}}
    assert (out / "longctx.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second run into the same folder needs --resume (nothing to redo) or --force
    code, _, err = run(capsys, *TINY, "--data", str(data_file), "--out", str(out))
    assert code == 2 and "--resume" in err
    before = (out / "results.json").read_text()
    code, stdout, _ = run(capsys, *TINY, "--data", str(data_file), "--out", str(out), "--resume")
    assert code == 0
    assert json.loads((out / "results.json").read_text())["rows"] == json.loads(before)["rows"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--methods", "baseline,nope-x9"), "unknown method 'nope-x9'"),
        (("--lengths", "abc"), "--lengths must be comma-separated numbers"),
        (("--seeds", "-1"), "--seeds must be an int >= 0"),
        (("--model", "missing.gguf"), "--model must be smollm2, random-tiny or a .gguf file"),
        (("--profile", "huge"), "unknown profile 'huge'"),
        (("--quick", "--profile", "full"), "--quick is --profile quick"),
        (("--lengths", "100"), "shorter than the prompt without filler"),
    ],
)
def test_bad_options_give_one_line_and_write_nothing(tmp_path, data_file, capsys, extra, message):
    out = tmp_path / "run"
    argv = [*TINY, "--data", str(data_file), "--out", str(out), *extra]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("relpos: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_quick_flag_is_the_quick_profile(tmp_path, data_file, capsys):
    out = tmp_path / "run"
    argv = [*TINY, "--quick", "--data", str(data_file), "--out", str(out)]
    code, text, _ = run(capsys, *argv)
    assert code == 0, text
    assert "profile quick" in text
    assert json.loads((out / "results.json").read_text())["meta"]["profile"] == "quick"


@pytest.mark.slow
def test_real_model_finds_the_key_at_4k_with_baseline_and_yarn(tmp_path, capsys):
    """SmolLM2 (trained context 8K) retrieves the key at 4K tokens, as plain RoPE and as
    YaRN x2 (minutes on 2 cores)."""
    pytest.importorskip("gguf")
    from relpos.interop import ModelNotInstalledError, smollm2_path

    try:
        smollm2_path()
    except ModelNotInstalledError as err:
        pytest.skip(str(err))
    out = tmp_path / "real"
    argv = ["longctx", "--methods", "baseline,yarn", "--lengths", "4096", "--depths", "0.5"]
    code, _, err = run(capsys, *argv, "--ppl-tokens", "256", "--out", str(out), "--no-progress")
    assert code == 0, err
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["method"]: r["passkey_correct"] for r in rows} == {"baseline": 1, "yarn": 1}
    assert all(5 < r["ppl"] < 100 for r in rows)


# ------------------------------------------------------------------------------ checked first


@pytest.fixture
def no_model_loading(monkeypatch):
    import relpos_lab.longctx.command as command

    def refuse(name):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(command, "load_model", refuse)


@pytest.mark.parametrize(
    "lengths, message",
    [
        ("1000000000", "needs about"),  # the machine's memory, from the model's size
        ("100", "shorter than the prompt without filler"),  # the prompt's fixed part
        ("30000", "longer than --data"),  # more tokens than the held-out text has bytes
    ],
)
def test_lengths_are_checked_before_the_model_loads(
    tmp_path, data_file, capsys, no_model_loading, lengths, message
):
    out = tmp_path / "run"
    argv = [*TINY, "--data", str(data_file), "--out", str(out), "--lengths", lengths]
    code, stdout, err = run(capsys, *argv)
    assert code == 2 and err.startswith("relpos: error: --lengths ") and err.count("\n") == 1
    assert message in err and stdout == "" and not out.exists()


def test_lengths_bound_names_what_fits(tmp_path, data_file, capsys, monkeypatch):
    import relpos_lab.longctx.plan as plan

    monkeypatch.setattr(plan, "available_memory", lambda: 2**30)  # a 1 GiB machine
    argv = [*TINY, "--data", str(data_file), "--out", str(tmp_path / "run")]
    _, _, err = run(capsys, *argv, "--lengths", "1000000")
    assert "1.0 GiB available" in err and "at most about 645,277 tokens" in err


@pytest.mark.parametrize("command", ["longctx", "analyze"])
def test_an_out_that_cannot_be_created_is_refused_first(tmp_path, data_file, capsys, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    argv = [*TINY, "--data", str(data_file)] if command == "longctx" else ["analyze", "decay"]
    code, stdout, err = run(capsys, *argv, "--out", str(blocker / "run"))
    assert code == 2 and err.startswith("relpos: error: --out ") and err.count("\n") == 1
    assert "is a file" in err and stdout == ""


def without(monkeypatch, module: str) -> None:
    import sys

    for name in [n for n in sys.modules if n == module or n.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError


def test_a_gguf_model_without_gguf_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    without(monkeypatch, "gguf")
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "longctx", "--model", "smollm2", "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and not out.exists() and stdout == ""
    assert "needs gguf" in err and "pip install 'relpos[gguf]'" in err


def test_without_matplotlib_longctx_writes_all_but_the_png(
    tmp_path, data_file, capsys, monkeypatch
):
    without(monkeypatch, "matplotlib")
    out = tmp_path / "run"
    code, stdout, _ = run(capsys, *TINY, "--data", str(data_file), "--out", str(out))
    assert code == 0
    assert "matplotlib is not installed" in stdout
    assert (out / "results.json").is_file() and (out / "report.md").is_file()
    assert not (out / "longctx.png").exists()


def test_without_matplotlib_analyze_writes_the_json_and_says_so(tmp_path, capsys, monkeypatch):
    without(monkeypatch, "matplotlib")
    out = tmp_path / "out"
    argv = ["analyze", "base-bound", "--context", "1024", "--grid-points", "50"]
    code, stdout, _ = run(capsys, *argv, "--out", str(out))
    assert code == 0
    assert (out / "base_bound.json").is_file() and not (out / "base_bound.png").exists()
    assert "matplotlib is not installed" in stdout


@pytest.fixture(scope="module")
def finished_longctx(tmp_path_factory, data_file):
    out = tmp_path_factory.mktemp("longctx") / "run"
    assert main([*TINY, "--data", str(data_file), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(
    "name, text",
    [("results.json", '{"rows": [1, 2]}'), ("results.json", "[]"), ("run.json", "{")],
)
def test_a_corrupt_file_on_resume_is_one_line_before_the_model_loads(
    tmp_path, data_file, capsys, finished_longctx, no_model_loading, name, text
):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(finished_longctx, out)
    (out / name).write_text(text)
    code, stdout, err = run(capsys, *TINY, "--data", str(data_file), "--out", str(out), "--resume")
    assert code == 2 and err.count("\n") == 1 and stdout == ""
    assert str(out / name) in err or f"its {name} is corrupt" in err
    assert "use --force to start over" in err


def test_resume_accepts_the_same_data_from_another_folder(
    tmp_path, data_file, capsys, finished_longctx, monkeypatch
):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(finished_longctx, out)
    monkeypatch.chdir(data_file.parent)
    code, _, err = run(capsys, *TINY, "--data", data_file.name, "--out", str(out), "--resume")
    assert code == 0, err


def test_sigterm_keeps_the_measurements_and_exits_143(tmp_path, data_file, capsys, monkeypatch):
    import os
    import signal

    import relpos_lab.longctx.command as command

    real = command.run_longctx

    def measure_then_sigterm(*args, on_measurement, **kwargs):
        def save_then_stop(state):
            on_measurement(state)
            os.kill(os.getpid(), signal.SIGTERM)

        return real(*args, on_measurement=save_then_stop, **kwargs)

    monkeypatch.setattr(command, "run_longctx", measure_then_sigterm)
    out = tmp_path / "run"
    code, _, err = run(capsys, *TINY, "--data", str(data_file), "--out", str(out))
    assert code == 143 and "--resume" in err and "Traceback" not in err
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["method"], r["length"]) for r in rows] == [("baseline", 300)]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
