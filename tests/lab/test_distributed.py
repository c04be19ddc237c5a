"""Data-parallel training: 2 processes under torchrun equal 1 process with the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from relpos_lab.training import distributed
from relpos_lab.training.data import load_corpus
from relpos_lab.training.train import TrainConfig, load_trained, train

DATA = Path(__file__).resolve().parents[1] / "data" / "sonnets.txt"
TINY = dict(dim=32, depth=2, num_heads=2, seq_len=32, batch_size=8, steps=10, warmup=3)
TINY.update(checkpoint_every=4, device="cpu")


def torchrun(out: Path, encoding: str, *extra: str) -> subprocess.CompletedProcess:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", "-m", "relpos_lab.training.torchrun"]
    command += [f"--encoding={encoding}", *args, f"--data={DATA}", f"--out={out}"]
    command += ["--no-progress", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    if done.returncode != 0 and "Signal 6 (SIGABRT)" in done.stderr:
        # a gloo worker aborted twice in ~60 runs on an overloaded machine, never when
        # reproduced on purpose; one retry, loudly
        message = f"torchrun: a worker aborted; retrying once:\n{done.stderr[-2000:]}"
        warnings.warn(message, stacklevel=2)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    return done


@pytest.mark.parametrize("encoding", ["alibi"])
def test_two_processes_under_torchrun_equal_one_process_with_the_same_global_batch(
    tmp_path, encoding
):
    done = torchrun(tmp_path / "ddp", encoding)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["steps"] == 10

    config = TrainConfig(encoding=encoding, **TINY)
    single = train(config, load_corpus(DATA), tmp_path / "single", progress=False)
    model, loaded_config, state = load_trained(tmp_path / "ddp")
    assert loaded_config == config and state["world_size"] == 2
    assert state["losses"] == pytest.approx(single.losses, abs=1e-5, rel=1e-5)
    assert summary["final_loss"] == pytest.approx(single.final_loss, abs=1e-5)
    reference = single.model.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, reference[key], atol=1e-5, rtol=1e-5, msg=key)


def test_without_torchrun_setup_is_a_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = distributed.setup(torch.device("cpu"))
    assert (info.rank, info.world_size, info.enabled, info.owns_group) == (0, 1, False, False)
    assert distributed.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        distributed.resolve_device("tpu:x")


def test_the_global_batch_must_split_evenly_over_ranks(monkeypatch):
    monkeypatch.setattr(distributed, "setup", lambda device: distributed.DistInfo(0, 3, 0))
    config = TrainConfig(encoding="alibi", **TINY)
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        train(config, load_corpus(DATA), None, progress=False)


def imported_modules(module: str) -> set[str]:
    """The relpos_lab modules ``module``'s source imports (at any depth of the file)."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec(module).origin).read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.add(node.module or "")
            names.update(a.name for a in node.names if not node.module)
    return names


def test_the_trainer_and_the_torchrun_entry_point_do_not_import_each_other():
    assert not {"train", "torchrun"} & imported_modules("relpos_lab.training.distributed")
    assert "torchrun" not in imported_modules("relpos_lab.training.train")
    assert {"train", "distributed"} <= imported_modules("relpos_lab.training.torchrun")
