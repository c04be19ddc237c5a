"""``relpos extrapolate --qkv-conv K`` (RCMHA's causal depth-wise q/k/v convolutions in every
layer), ``--qk-norm rms`` (TRA's q/k RMS normalisation), ``--init`` and ``--head`` (the
model's init and output layer; defaults fan-in and untied): each flag is parsed with the
flag's name in its errors, recorded in the run's settings and each checkpoint's config, built
into the model, and a resume with another value is refused."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from relpos_lab.cli import main
from relpos_lab.training.train import TrainConfig, build_model, check_compatible

TINY = ("--encodings", "rcmha", "--train-len", "16", "--eval-mult", "1", "--steps", "2",
        "--no-progress", "--dim", "16", "--heads", "2", "--depth", "1")  # fmt: skip


def test_the_config_records_the_kernel_and_the_model_is_built_with_it():
    config = TrainConfig(encoding="rcmha", dim=16, depth=2, num_heads=2, qkv_conv=3)
    assert config.to_json()["qkv_conv"] == 3
    model = build_model(config, 256)
    assert all(len(block.attn.qkv_conv) == 3 for block in model.blocks)
    assert all(conv.kernel_size == 3 for conv in model.blocks[0].attn.qkv_conv)
    plain = build_model(TrainConfig(encoding="rcmha", dim=16, depth=1, num_heads=2), 256)
    assert plain.blocks[0].attn.qkv_conv is None
    legacy = {k: v for k, v in config.to_json().items() if k != "qkv_conv"}
    assert TrainConfig.from_json(legacy).qkv_conv is None  # written before the key existed
    with pytest.raises(ValueError, match="qkv_conv"):
        TrainConfig(encoding="rcmha", qkv_conv=0)


def test_a_checkpoint_with_another_kernel_is_incompatible():
    corpus = SimpleNamespace(vocab_size=256, tokenizer="bytes", fingerprint=lambda: "f")
    saved = TrainConfig(encoding="rcmha", dim=16, depth=1, num_heads=2, qkv_conv=3)
    state = {"config": saved.to_json(), "vocab_size": 256,
             "corpus": {"tokenizer": "bytes", "fingerprint": "f"}}  # fmt: skip
    with pytest.raises(ValueError, match=r"qkv_conv \(3 in the checkpoint, None now\)"):
        check_compatible(TrainConfig(encoding="rcmha", dim=16, depth=1, num_heads=2), corpus,
                         state, "run/rcmha")  # fmt: skip
    legacy = dict(state, config={k: v for k, v in saved.to_json().items() if k != "qkv_conv"})
    check_compatible(TrainConfig(encoding="rcmha", dim=16, depth=1, num_heads=2), corpus, legacy,
                     "run/rcmha")  # fmt: skip


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--qkv-conv", "0"), ("--qkv-conv", "-3"), ("--qkv-conv", "three"), ("--qk-norm", "layer")],
)
def test_a_bad_value_is_one_line_naming_the_flag(capsys, tmp_path, flag, value):
    out = tmp_path / "run"
    code = main(["extrapolate", *TINY, flag, value, "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and f"{flag} must be" in err and err.count("\n") == 1
    assert not out.exists()


def test_qk_norm_is_recorded_and_built_and_a_change_is_incompatible():
    config = TrainConfig(encoding="tra", dim=16, depth=1, num_heads=2, qk_norm="rms")
    assert config.to_json()["qk_norm"] == "rms"
    assert build_model(config, 256).blocks[0].attn.qk_norm == "rms"
    legacy = {k: v for k, v in config.to_json().items() if k != "qk_norm"}
    assert TrainConfig.from_json(legacy).qk_norm is None
    corpus = SimpleNamespace(vocab_size=256, tokenizer="bytes", fingerprint=lambda: "f")
    state = {"config": config.to_json(), "vocab_size": 256,
             "corpus": {"tokenizer": "bytes", "fingerprint": "f"}}  # fmt: skip
    with pytest.raises(ValueError, match=r"qk_norm \('rms' in the checkpoint, None now\)"):
        check_compatible(TrainConfig(encoding="tra", dim=16, depth=1, num_heads=2), corpus,
                         state, "run/tra")  # fmt: skip
    with pytest.raises(ValueError, match="qk_norm"):
        TrainConfig(encoding="tra", qk_norm="layer")


@pytest.mark.slow  # two tiny training runs (seconds)
def test_a_run_records_the_kernel_and_resume_checks_it(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["extrapolate", *TINY, "--qkv-conv", "3", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["settings"]["qkv_conv"] == 3
    assert json.loads((out / "rcmha" / "state.json").read_text())["config"]["qkv_conv"] == 3
    assert "q/k/v convolutions K=3" in capsys.readouterr().out
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    code = main(["extrapolate", *TINY, "--qkv-conv", "2", "--out", str(copy), "--resume"])
    _, err = capsys.readouterr()
    assert code == 2 and "qkv_conv 3 -> 2" in err
    assert main(["extrapolate", *TINY, "--qkv-conv", "3", "--out", str(copy), "--resume"]) == 0
    code = main(["extrapolate", *TINY, "--qkv-conv", "3", "--qk-norm", "rms", "--out", str(copy),
                 "--resume"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "qk_norm None -> 'rms'" in err


@pytest.mark.slow  # two tiny training runs (seconds)
def test_init_and_head_are_recorded_built_and_checked_on_resume(capsys, tmp_path):
    out = tmp_path / "run"
    tiny = [*TINY[2:], "--encodings", "alibi"]
    assert main(["extrapolate", *tiny, "--out", str(out)]) == 0  # the defaults
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert (settings["init"], settings["tie_embedding"]) == ("fan-in", False)
    config = json.loads((out / "alibi" / "state.json").read_text())["config"]
    assert (config["init"], config["tie_embedding"]) == ("fan-in", False)
    assert build_model(TrainConfig.from_json(config), 256).head is not None
    assert "fan-in init, untied head" in capsys.readouterr().out
    code = main(["extrapolate", *tiny, "--head", "tied", "--out", str(out), "--resume"])
    _, err = capsys.readouterr()
    assert code == 2 and "tie_embedding False -> True" in err
    earlier = tmp_path / "earlier"  # the earlier default model, by its flags
    flags = ["--init", "gpt2", "--head", "tied", "--out", str(earlier)]
    assert main(["extrapolate", *tiny, *flags]) == 0
    config = json.loads((earlier / "alibi" / "state.json").read_text())["config"]
    model = build_model(TrainConfig.from_json(config), 256)
    assert (model.init, model.head) == ("gpt2", None)
    assert "gpt2 init, tied head" in capsys.readouterr().out
    code = main(["extrapolate", *tiny, "--init", "fan-in", "--head", "tied", "--out",
                 str(earlier), "--resume"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "init 'gpt2' -> 'fan-in'" in err


def test_init_and_head_flags_name_themselves_in_their_errors(capsys):
    for flag, value in (("--init", "xavier"), ("--head", "both")):
        assert main(["extrapolate", *TINY, flag, value, "--out", "unused"]) == 2
        assert flag in capsys.readouterr().err
