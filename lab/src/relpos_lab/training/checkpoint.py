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

Every file read back is validated: ``read_state`` checks each key of ``state.json`` and its
type (a negative step, a missing RNG state, losses that are not numbers), and
``verify_checkpoint`` reads the safetensors header and the optimizer file (truncated, not a
checkpoint, from another save). A bad file is one ``CorruptCheckpointError`` (a
``ValueError``) that names it and says to start over with ``--force``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    from safetensors import SafetensorError
    from safetensors.torch import load_model, safe_open, save_model
except ImportError:  # the lab extra is missing: the commands say so before any work
    SafetensorError = OSError
    load_model = safe_open = save_model = None

from relpos.optional import require

from ..io import atomic_write

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.json"
FORMAT_VERSION = 1


FORCE_HINT = "use --force to start over"
#: a file of another save than ``state.json`` (a replacement cut short between files)
INCONSISTENT = f"is inconsistent: it comes from another save than {STATE_FILE} (cut short?)"


class CorruptCheckpointError(ValueError):
    """A checkpoint file is unreadable, truncated or inconsistent (the message names it)."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"checkpoint file {os.fspath(path)} {problem}; {FORCE_HINT}")
        self.path = Path(path)


def _need_safetensors() -> None:
    if save_model is None:
        require("relpos checkpoints", {"safetensors": MODEL_FILE})


def _is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_byte_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(v) and v < 256 for v in value)


def check_state(state: Any, path: str | os.PathLike) -> dict[str, Any]:
    """``state`` (parsed ``state.json``) if every key the trainer reads is there with the
    right type; ``CorruptCheckpointError`` naming the first bad key otherwise."""
    if not isinstance(state, dict):
        raise CorruptCheckpointError(path, "is not a JSON object")
    rng = state.get("rng")
    corpus = state.get("corpus")
    checks = (
        ("config", isinstance(state.get("config"), dict), "an object"),
        ("step", _is_int(state.get("step")), "an int >= 0"),
        ("vocab_size", _is_int(state.get("vocab_size"), 1), "a positive int"),
        ("corpus", isinstance(corpus, dict), "an object"),
        ("rng", isinstance(rng, dict), "an object"),
        ("rng.torch", isinstance(rng, dict) and _is_byte_list(rng.get("torch")), "bytes"),
        ("rng.batch", isinstance(rng, dict) and _is_byte_list(rng.get("batch")), "bytes"),
        (
            "losses",
            isinstance(state.get("losses"), list) and all(map(_is_number, state["losses"])),
            "a list of numbers",
        ),
        ("elapsed_seconds", _is_number(state.get("elapsed_seconds", 0.0)), "a number"),
        ("tokens_per_second", _is_number(state.get("tokens_per_second", 0.0)), "a number"),
        ("checkpoint_id", isinstance(state.get("checkpoint_id", ""), str), "a string"),
    )
    for key, ok, form in checks:
        if not ok:
            where = key.split(".")
            value = state.get(where[0]) if len(where) == 1 else (rng or {}).get(where[1])
            shown = "missing" if value is None else f"{type(value).__name__} {value!r}"[:60]
            raise CorruptCheckpointError(path, f"has a bad {key!r} (must be {form}, got {shown})")
    if len(state["losses"]) < state["step"]:
        raise CorruptCheckpointError(
            path, f"has {len(state['losses'])} losses for step {state['step']}"
        )
    return state


def _write_json(data: dict[str, Any]) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)

    return write


def has_checkpoint(out_dir: str | os.PathLike) -> bool:
    """Whether ``out_dir`` holds a checkpoint (its ``state.json``)."""
    return (Path(out_dir) / STATE_FILE).is_file()


def read_state(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``state.json`` of the checkpoint in ``out_dir``, checked (``check_state``);
    ``ValueError`` if there is none, ``CorruptCheckpointError`` if it is bad."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        raise ValueError(f"no checkpoint in {str(out_dir)!r} (no {STATE_FILE})")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(path, f"is not valid JSON ({err})") from None
    return check_state(state, path)


def _model_id(path: Path) -> str | None:
    """The ``checkpoint_id`` in a safetensors header (``CorruptCheckpointError`` if the file
    is truncated or no safetensors file)."""
    _need_safetensors()
    if not path.is_file():
        raise CorruptCheckpointError(path, "is missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("checkpoint_id")
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptCheckpointError(
            path, f"is unreadable ({' '.join(str(err).split())})"
        ) from None


def _read_optimizer(path: Path, map_location: Any) -> dict[str, Any]:
    if not path.is_file():
        raise CorruptCheckpointError(path, "is missing")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for a truncated zip or pickle
        reason = " ".join(str(err).split())[:120]
        raise CorruptCheckpointError(path, f"is unreadable ({reason})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("optimizer"), dict):
        raise CorruptCheckpointError(path, "is not a relpos optimizer checkpoint")
    return payload


def verify_checkpoint(out_dir: str | os.PathLike, *, optimizer: bool = True) -> dict[str, Any]:
    """Read every file of the checkpoint in ``out_dir`` without loading it into a model:
    ``state.json`` checked, the safetensors header and (``optimizer``) the optimizer file
    readable and from the same save. Returns the state; ``CorruptCheckpointError`` naming the
    bad file otherwise (what ``--resume`` checks before it writes anything)."""
    out_dir = Path(out_dir)
    state = read_state(out_dir)
    checkpoint_id = state.get("checkpoint_id")
    if _model_id(out_dir / MODEL_FILE) != checkpoint_id:
        raise CorruptCheckpointError(
            out_dir / MODEL_FILE,
            INCONSISTENT,
        )
    if optimizer:
        payload = _read_optimizer(out_dir / OPTIMIZER_FILE, "cpu")
        if payload.get("checkpoint_id") != checkpoint_id:
            raise CorruptCheckpointError(
                out_dir / OPTIMIZER_FILE,
                INCONSISTENT,
            )
    return state


def save_checkpoint(
    out_dir: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
) -> None:
    """Write ``model``, ``optimizer`` and ``state`` (JSON-able) to ``out_dir`` atomically."""
    _need_safetensors()
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
    if _model_id(model_path) != checkpoint_id:
        raise CorruptCheckpointError(
            model_path,
            INCONSISTENT,
        )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        missing, unexpected = load_model(model, str(model_path), strict=False, device=str(device))
    except Exception as err:  # a header that parses but data cut short
        reason = " ".join(str(err).split())[:120]
        raise CorruptCheckpointError(model_path, f"is unreadable ({reason})") from None
    if missing or unexpected:
        raise ValueError(
            f"{str(model_path)!r} does not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    if optimizer is not None:
        opt_path = out_dir / OPTIMIZER_FILE
        payload = _read_optimizer(opt_path, map_location)
        if payload.get("checkpoint_id") != checkpoint_id:
            raise CorruptCheckpointError(
                opt_path,
                INCONSISTENT,
            )
        try:
            optimizer.load_state_dict(payload["optimizer"])
        except (ValueError, KeyError, TypeError) as err:
            reason = " ".join(str(err).split())[:120]
            raise CorruptCheckpointError(
                opt_path, f"does not fit the optimizer ({reason})"
            ) from None
    return state
