"""Training checkpoints: three files in the run folder, each written atomically.

* ``model.safetensors`` — the model's ``state_dict`` (safetensors, shared tensors stored once);
* ``optimizer.pt`` — the optimizer's ``state_dict`` (``torch.save``; read back with
  ``weights_only=True``, so loading runs no pickled code);
* ``state.json`` — everything else: the training config, the step, the RNG states (as lists of
  ints), the losses so far, the elapsed time, a fingerprint of the corpus.

Every file is first written to a temporary file in the same folder, flushed to disk, then moved
over the old one with ``os.replace``, so a crash or an exception never leaves a partial file; a
failed save removes its temporary files and leaves the previous checkpoint as it was. The three
files carry the same random ``checkpoint_id``; ``state.json`` is replaced last, and loading
checks the ids, so a checkpoint whose replacement was cut short between files (a power cut in
that microsecond window) is reported instead of silently mixing two steps.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, safe_open, save_model
from torch import nn

from ..io import atomic_write

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.json"
FORMAT_VERSION = 1


def _write_json(data: dict[str, Any]) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)

    return write


def has_checkpoint(out_dir: str | os.PathLike) -> bool:
    """Whether ``out_dir`` holds a checkpoint (its ``state.json``)."""
    return (Path(out_dir) / STATE_FILE).is_file()


def read_state(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``state.json`` of the checkpoint in ``out_dir`` (ValueError if there is none)."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        raise ValueError(f"no checkpoint in {str(out_dir)!r} (no {STATE_FILE})")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"checkpoint state {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(state, dict) or "config" not in state or "step" not in state:
        raise ValueError(f"{str(path)!r} is not a relpos training checkpoint")
    return state


def save_checkpoint(
    out_dir: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
) -> None:
    """Write ``model``, ``optimizer`` and ``state`` (JSON-able) to ``out_dir`` atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_id = uuid.uuid4().hex
    state = {**state, "checkpoint_id": checkpoint_id, "format_version": FORMAT_VERSION}
    metadata = {"checkpoint_id": checkpoint_id, "step": str(state["step"])}
    atomic_write(out_dir / MODEL_FILE, lambda tmp: save_model(model, tmp, metadata=metadata))
    if optimizer is not None:
        payload = {"checkpoint_id": checkpoint_id, "optimizer": optimizer.state_dict()}
        atomic_write(out_dir / OPTIMIZER_FILE, lambda tmp: torch.save(payload, tmp))
    atomic_write(out_dir / STATE_FILE, _write_json(state))


def load_checkpoint(
    out_dir: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Load the checkpoint in ``out_dir`` into ``model`` (and ``optimizer``); return the state.

    Raises ValueError when a file is missing or the files belong to different saves.
    """
    out_dir = Path(out_dir)
    state = read_state(out_dir)
    checkpoint_id = state.get("checkpoint_id")
    model_path = out_dir / MODEL_FILE
    if not model_path.is_file():
        raise ValueError(f"checkpoint in {str(out_dir)!r} has no {MODEL_FILE}")
    with safe_open(str(model_path), framework="pt") as f:
        model_id = (f.metadata() or {}).get("checkpoint_id")
    if model_id != checkpoint_id:
        raise ValueError(
            f"checkpoint in {str(out_dir)!r} is inconsistent: {MODEL_FILE} and {STATE_FILE} "
            "come from different saves (interrupted while being replaced?)"
        )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    missing, unexpected = load_model(model, str(model_path), strict=False, device=str(device))
    if missing or unexpected:
        raise ValueError(
            f"{str(model_path)!r} does not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    if optimizer is not None:
        opt_path = out_dir / OPTIMIZER_FILE
        if not opt_path.is_file():
            raise ValueError(f"checkpoint in {str(out_dir)!r} has no {OPTIMIZER_FILE}")
        payload = torch.load(opt_path, map_location=map_location, weights_only=True)
        if payload.get("checkpoint_id") != checkpoint_id:
            raise ValueError(
                f"checkpoint in {str(out_dir)!r} is inconsistent: {OPTIMIZER_FILE} and "
                f"{STATE_FILE} come from different saves (interrupted while being replaced?)"
            )
        optimizer.load_state_dict(payload["optimizer"])
    return state
