"""Train a ``relpos.nn.TransformerLM`` on a ``Corpus``: the lab's trainer.

* AdamW (betas 0.9, 0.95); weight decay on the weight matrices and the token embedding only,
  never on norms, biases or the parameters of positional encodings;
* learning rate: linear warmup over ``warmup`` steps, then a cosine from ``lr`` down to
  ``lr * min_lr_ratio`` at the last step (``learning_rate``);
* gradient clipping at ``grad_clip`` (global norm; 0 disables);
* determinism: ``torch.manual_seed(seed)`` before the model is built, and a dedicated
  ``torch.Generator`` seeded with ``seed`` draws the batches; both states are checkpointed, so
  N steps + resume to 2N gives the same losses and weights, bit for bit, as 2N steps straight;
* checkpoints (``relpos_lab.training.checkpoint``, atomic) every ``checkpoint_every`` steps, at the
end,
  and on Ctrl-C / SIGTERM: the handlers installed during ``train()`` only note the signal, the
  step in flight completes, the checkpoint is written, then ``TrainingInterrupted`` (a
  ``KeyboardInterrupt``) is raised; a second Ctrl-C stops at once. The old handlers are
  restored on the way out;
* data-parallel under ``torchrun`` (``relpos_lab.training.distributed`` helpers, entry point
  ``relpos_lab.training.torchrun``): ``batch_size`` is global;
* a rich progress bar (step, loss, tokens/s, ETA; ``relpos_lab.training.runtime``), refreshed every
  ``LOG_EVERY`` steps, which is also the only place the loss is read back from the device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import relpos
from relpos.encodings.base import Encoding
from relpos.nn import TransformerLM
from relpos.nn.transformer import INIT_SCHEMES
from relpos.validation import check_choice, check_float, check_int

from . import checkpoint as ckpt
from . import distributed
from .data import Corpus, sample_batch
from .runtime import Progress, SignalStop

LOG_EVERY = 10  # steps between progress updates (and loss read-backs / cross-rank averages)
FINAL_LOSS_WINDOW = 10  # final_loss is the mean training loss of the last steps
BETAS = (0.9, 0.95)
# config keys a checkpoint must share with the config that resumes it
MODEL_KEYS = (
    "encoding", "encoding_options", "dim", "depth", "num_heads", "seq_len", "init", "qkv_conv",
    "qk_norm", "tie_embedding",
)  # fmt: skip
#: what a saved config without a key meant (written before the key existed)
LEGACY_DEFAULTS = {"init": "gpt2", "qkv_conv": None, "qk_norm": None, "tie_embedding": True}
# keys that do not change the numbers (no warning when they differ on resume)
NEUTRAL_KEYS = ("checkpoint_every", "backend", "device")


@dataclass
class TrainConfig:
    """What to train and how. ``batch_size`` is the global batch (split over ranks).

    ``checkpoint_every``: steps between checkpoints (0: only at the end and on a signal).
    ``grad_clip``: max global gradient norm (0: no clipping). ``device``: "auto" (CUDA when
    available, else CPU), "cpu", "cuda" or "cuda:N". ``init``: ``TransformerLM``'s weight
    initialisation (``relpos.nn.transformer.INIT_SCHEMES``; default ``"fan-in"``, as
    ``TransformerLM``); a saved config without it is from before it existed and means
    ``"gpt2"``, the only init then (``LEGACY_DEFAULTS``).
    ``qkv_conv``: kernel size of RCMHA's causal depth-wise q/k/v convolutions in every layer
    (``TransformerLM(qkv_conv=)``), None for none (also what a config without the key means).
    ``qk_norm``: ``"rms"`` normalises q and k per head in every layer (``TransformerLM(qk_norm=)``,
    TRA's layer), None for off (also what a config without the key means).
    ``tie_embedding``: False (default, as ``TransformerLM``) for an output layer of its own,
    True for logits from the token embedding (``TransformerLM(tie_embedding=)``); a config
    without the key is from before the option and means True, the only head then. Every
    config written since records both keys, so a run saved under the earlier defaults
    (``"gpt2"``, tied) loads as what it was.
    """

    encoding: str
    encoding_options: dict = field(default_factory=dict)
    dim: int = 128
    depth: int = 4
    num_heads: int = 4
    seq_len: int = 128
    batch_size: int = 32
    steps: int = 600
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    backend: str = "auto"
    device: str = "auto"
    init: str = "fan-in"
    qkv_conv: int | None = None
    qk_norm: str | None = None
    tie_embedding: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.encoding, str) or not self.encoding:
            raise ValueError(f"encoding must be a registry name, got {self.encoding!r}")
        if not isinstance(self.encoding_options, dict):
            raise TypeError(
                f"encoding_options must be a dict, got {type(self.encoding_options).__name__}"
            )
        for name in ("dim", "depth", "num_heads", "seq_len", "batch_size", "steps"):
            check_int(getattr(self, name), name)
        for name in ("warmup", "checkpoint_every", "seed"):
            check_int(getattr(self, name), name, minimum=0)
        check_float(self.lr, "lr", above=0.0)
        check_float(self.min_lr_ratio, "min_lr_ratio", minimum=0.0, maximum=1.0)
        check_float(self.weight_decay, "weight_decay", minimum=0.0)
        check_float(self.grad_clip, "grad_clip (0 disables it)", minimum=0.0)
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by num_heads ({self.num_heads})")
        if self.init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {', '.join(INIT_SCHEMES)}, got {self.init!r}")
        if self.qkv_conv is not None:
            check_int(self.qkv_conv, "qkv_conv (a kernel size, or None)")
        if self.qk_norm is not None:
            check_choice(self.qk_norm, "qk_norm (or None)", ("rms",))
        if not isinstance(self.tie_embedding, bool):
            raise TypeError(f"tie_embedding must be a bool, got {self.tie_embedding!r}")

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types (what ``state.json`` records)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from ``to_json`` output; unknown keys (from newer versions) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**LEGACY_DEFAULTS, **{k: v for k, v in data.items() if k in names}})


@dataclass
class TrainResult:
    """The trained model (unwrapped, on the training device, in train mode) and its record.

    ``losses``: training loss of every step (averaged over ranks), including steps done before
    a resume. ``final_loss``: mean of the last ``FINAL_LOSS_WINDOW`` losses. ``train_seconds``:
    wall time of all training sessions together; ``tokens_per_second``: global tokens per
    second of this call, timed from the end of its first step (imports and allocator warm-up
    excluded; the checkpoint's value when there was nothing left to train).
    """

    model: TransformerLM
    config: TrainConfig
    steps: int
    final_loss: float
    losses: list[float]
    train_seconds: float
    tokens_per_second: float


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C / SIGTERM after writing a checkpoint at ``step``."""

    def __init__(self, step: int, out_dir: str | None, signum: int | None) -> None:
        where = f"checkpoint in {out_dir}" if out_dir else "no checkpoint (no out_dir)"
        super().__init__(f"training interrupted at step {step}; {where}")
        self.step, self.out_dir, self.signum = step, out_dir, signum


# ------------------------------------------------------------------------------ pieces


def build_model(config: TrainConfig, vocab_size: int) -> TransformerLM:
    """The ``TransformerLM`` that ``config`` describes (random init from the global RNG)."""
    return TransformerLM(
        vocab_size,
        config.dim,
        config.depth,
        config.num_heads,
        encoding=config.encoding,
        encoding_options=config.encoding_options,
        backend=config.backend,
        init=config.init,
        qkv_conv=config.qkv_conv,
        qk_norm=config.qk_norm,
        tie_embedding=config.tie_embedding,
    )


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay for matrices (and the token embedding), none for norms, biases and
    the parameters of positional encodings (``relpos.Encoding`` modules)."""
    no_decay = {id(p) for m in model.modules() if isinstance(m, Encoding) for p in m.parameters()}
    decay, rest = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in no_decay else rest).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]


def learning_rate(step: int, config: TrainConfig) -> float:
    """The learning rate of step ``step`` (0-based): linear warmup, then cosine decay."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(1, config.steps - config.warmup - 1)
    progress = min(1.0, (step - config.warmup) / span)
    ratio = config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (
        1 + math.cos(math.pi * progress)
    )
    return config.lr * ratio


def check_compatible(
    config: TrainConfig, corpus: Corpus, state: dict[str, Any], where: str
) -> str | None:
    """Raise ValueError naming the keys where a checkpoint's ``state`` differs from ``config``
    and ``corpus`` in ways that make it unusable (``MODEL_KEYS``, vocab_size, tokenizer, the
    training tokens). Returns the note about other changed settings (lr, steps, ...), None
    when there are none (``train`` warns with it, or hands it to ``on_change``)."""
    saved = {**LEGACY_DEFAULTS, **state["config"]}
    new = config.to_json()
    differ = [k for k in MODEL_KEYS if saved.get(k) != new[k]]
    saved_corpus = state.get("corpus", {})
    if state.get("vocab_size") != corpus.vocab_size:
        differ.append("vocab_size")
    if saved_corpus.get("tokenizer") != corpus.tokenizer:
        differ.append("tokenizer")
    elif saved_corpus.get("fingerprint") != corpus.fingerprint() and "vocab_size" not in differ:
        differ.append("corpus")
    if differ:
        details = ", ".join(
            f"{k} ({_saved_value(k, saved, state)!r} in the checkpoint, "
            f"{_new_value(k, new, corpus)!r} now)"
            for k in differ
        )
        raise ValueError(f"checkpoint in {where} is from an incompatible config: {details}")
    other = [k for k in new if k not in MODEL_KEYS + NEUTRAL_KEYS and saved.get(k) != new[k]]
    if not other:
        return None
    changes = ", ".join(f"{k} {saved.get(k)!r} -> {new[k]!r}" for k in other)
    return (
        f"resuming {where} with changed settings ({changes}); the result will differ from "
        "an uninterrupted run"
    )


def _saved_value(key: str, saved: dict, state: dict) -> Any:
    if key == "vocab_size":
        return state.get("vocab_size")
    if key in ("tokenizer", "corpus"):
        c = state.get("corpus", {})
        return (
            c.get("tokenizer") if key == "tokenizer" else f"{c.get('name')}#{c.get('fingerprint')}"
        )
    return saved.get(key)


def _new_value(key: str, new: dict, corpus: Corpus) -> Any:
    if key == "vocab_size":
        return corpus.vocab_size
    if key == "tokenizer":
        return corpus.tokenizer
    if key == "corpus":
        return f"{corpus.name}#{corpus.fingerprint()}"
    return new[key]


def _rng_state(device: torch.device, generator: torch.Generator) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state().tolist(), "batch": generator.get_state().tolist()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).tolist()
    return state


def _set_rng_state(rng: dict[str, Any], device: torch.device, generator: torch.Generator) -> None:
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    generator.set_state(torch.tensor(rng["batch"], dtype=torch.uint8))
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(torch.tensor(rng["cuda"], dtype=torch.uint8), device)


# ------------------------------------------------------------------------------ train


def train(
    config: TrainConfig,
    corpus: Corpus,
    out_dir: str | os.PathLike | None,
    *,
    resume: bool = False,
    progress: bool = True,
    callback: Callable[[int, Tensor], None] | None = None,
    on_change: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train ``build_model(config, corpus.vocab_size)`` on ``corpus.train``.

    Args:
        out_dir: run folder for checkpoints (module docstring); None: no checkpoints.
        resume: continue from the checkpoint in ``out_dir`` when there is one (a finished run
            returns at once); ValueError if it comes from an incompatible config or corpus.
            Without ``resume`` training starts from scratch and overwrites the checkpoint
            (the caller decides whether a run folder may be reused).
        progress: show the rich progress bar (rank 0 only).
        callback: ``callback(step, loss)`` after every step (``step`` steps done; ``loss`` the
            step's local loss, still on the device). An exception from it stops training; a
            ``KeyboardInterrupt`` from it is handled like Ctrl-C (checkpoint, then
            ``TrainingInterrupted``).
        on_change: receives the note when a resumed checkpoint had other settings (lr,
            steps, ...); None: a ``UserWarning`` (the CLI prints it as one line instead).

    Raises:
        TrainingInterrupted: on Ctrl-C / SIGTERM, after the checkpoint is written.
    """
    if resume and out_dir is None:
        raise ValueError("resume=True needs an out_dir that holds the checkpoint")
    if corpus.train.numel() <= config.seq_len:
        raise ValueError(
            f"the training split has {corpus.train.numel()} tokens; seq_len ({config.seq_len}) "
            "needs more"
        )
    device = distributed.resolve_device(config.device, int(os.environ.get("LOCAL_RANK", "0")))
    info = distributed.setup(device)
    try:
        result = _train(
            config, corpus, out_dir, resume, progress, callback, on_change, device, info
        )
    except TrainingInterrupted:  # every rank stops at the same step
        distributed.cleanup(info)
        raise
    except BaseException:
        distributed.cleanup(info, barrier=False)
        raise
    distributed.cleanup(info)
    return result


def _train(
    config: TrainConfig,
    corpus: Corpus,
    out_dir: str | os.PathLike | None,
    resume: bool,
    progress: bool,
    callback: Callable[[int, Tensor], None] | None,
    on_change: Callable[[str], None] | None,
    device: torch.device,
    info: Any,  # distributed.DistInfo
) -> TrainResult:
    world, rank = info.world_size, info.rank
    if config.batch_size % world:
        raise ValueError(
            f"batch_size ({config.batch_size}) must be divisible by the number of processes "
            f"({world})"
        )
    local_rows = slice(rank * config.batch_size // world, (rank + 1) * config.batch_size // world)
    out = None if out_dir is None else Path(out_dir)

    torch.manual_seed(config.seed)
    model = build_model(config, corpus.vocab_size).to(device)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, config.weight_decay), lr=config.lr, betas=BETAS, foreach=True
    )
    generator = torch.Generator().manual_seed(config.seed)
    step, losses, previous_seconds, previous_tps = 0, [], 0.0, 0.0
    if resume and out is not None and ckpt.has_checkpoint(out):
        state = ckpt.read_state(out)
        note = check_compatible(config, corpus, state, str(out))
        if note is not None and on_change is not None:
            on_change(note)
        elif note is not None:
            warnings.warn(note, stacklevel=3)
        if state["step"] > config.steps:
            raise ValueError(
                f"checkpoint in {str(out)} is at step {state['step']}, past steps ({config.steps})"
            )
        ckpt.load_checkpoint(out, model, optimizer, map_location=device)
        _set_rng_state(state["rng"], device, generator)
        step, losses = state["step"], [float(x) for x in state["losses"]]
        previous_seconds = float(state.get("elapsed_seconds", 0.0))
        previous_tps = float(state.get("tokens_per_second", 0.0))
    losses = losses[:step]

    ddp_model: nn.Module = model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    model.train()

    tokens_per_step = config.batch_size * config.seq_len
    fingerprint = corpus.fingerprint() if out is not None and info.is_main else ""
    pending = torch.zeros(LOG_EVERY + 1, device=device)  # losses since the last read-back
    pending_from = step
    start_step, start_time = step, time.perf_counter()
    tokens_per_second = previous_tps

    def elapsed() -> float:
        return time.perf_counter() - start_time

    def read_back(stop: bool) -> bool:
        """Append the pending losses (averaged over ranks); return whether any rank stops."""
        nonlocal pending_from
        count = step - pending_from
        pending[LOG_EVERY] = float(stop)
        if info.enabled:
            import torch.distributed as dist

            dist.all_reduce(pending)
            pending[:LOG_EVERY] /= world
        values = pending.tolist()
        losses.extend(values[:count])
        pending.zero_()
        pending_from = step
        return values[LOG_EVERY] > 0

    # throughput is timed from the end of this call's first step (imports, allocator warm-up)
    timed_from: tuple[int, float] | None = None

    def rate() -> float:
        if timed_from is None or step <= timed_from[0]:
            seconds, done = elapsed(), (step - start_step) * tokens_per_step
        else:
            seconds = time.perf_counter() - timed_from[1]
            done = (step - timed_from[0]) * tokens_per_step
        return done / seconds if done and seconds > 0 else previous_tps

    def save() -> None:
        nonlocal saved_at
        saved_at = step
        if out is None or not info.is_main:
            return
        ckpt.save_checkpoint(
            out,
            model,
            optimizer,
            {
                "config": config.to_json(),
                "step": step,
                "vocab_size": corpus.vocab_size,
                "corpus": {
                    "name": corpus.name,
                    "tokenizer": corpus.tokenizer,
                    "fingerprint": fingerprint,
                    "documents": corpus.documents,
                },
                "rng": _rng_state(device, generator),
                "losses": losses,
                "elapsed_seconds": previous_seconds + elapsed(),
                "tokens_per_second": tokens_per_second,
                "world_size": world,
                "complete": step >= config.steps,
                "relpos_version": relpos.__version__,
                "torch_version": torch.__version__,
            },
        )

    def interrupted(signum: int | None) -> TrainingInterrupted:
        return TrainingInterrupted(step, None if out is None else str(out), signum)

    saved_at = step if step > 0 else -1
    in_step = False
    show = progress and info.is_main
    with SignalStop() as stop, Progress(show, config.encoding, config.steps, step) as bar:
        try:
            while step < config.steps:
                in_step = True
                lr = learning_rate(step, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, y = sample_batch(corpus.train, config.batch_size, config.seq_len, generator)
                x, y = x[local_rows].to(device), y[local_rows].to(device)
                logits = ddp_model(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                pending[step - pending_from] = loss.detach()
                step += 1
                in_step = False
                if timed_from is None:
                    timed_from = (step, time.perf_counter())

                checkpoint_due = step == config.steps or (
                    config.checkpoint_every > 0 and step % config.checkpoint_every == 0
                )
                # one process stops at the step after a signal; several agree at a boundary
                signalled = stop.signum is not None and not info.enabled
                if checkpoint_due or signalled or step - pending_from == LOG_EVERY:
                    stopping = read_back(stop.signum is not None)
                    tokens_per_second = rate()
                    recent = losses[-LOG_EVERY:]
                    bar.update(step, sum(recent) / len(recent), tokens_per_second)
                    if checkpoint_due or (stopping and out is not None):
                        save()
                    if stopping and step < config.steps:
                        raise interrupted(stop.signum)
                if callback is not None:
                    callback(step, loss.detach())
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:
            # From the callback: checkpoint the completed step. A second Ctrl-C (a signal was
            # already noted) or one inside a step: stop now, the last checkpoint stands.
            if stop.signum is None and not in_step and not info.enabled and saved_at != step:
                read_back(False)
                tokens_per_second = rate()
                save()
            raise interrupted(stop.signum) from None

    if step > start_step:
        tokens_per_second = rate()
    seconds = previous_seconds + elapsed()
    window = losses[-FINAL_LOSS_WINDOW:]
    return TrainResult(
        model=model,
        config=config,
        steps=step,
        final_loss=sum(window) / len(window) if window else float("nan"),
        losses=list(losses),
        train_seconds=seconds,
        tokens_per_second=tokens_per_second,
    )


def load_trained(
    out_dir: str | os.PathLike, *, device: str | torch.device = "cpu"
) -> tuple[TransformerLM, TrainConfig, dict[str, Any]]:
    """The model of the checkpoint in ``out_dir`` (in eval mode), its config and ``state.json``."""
    state = ckpt.read_state(out_dir)
    config = TrainConfig.from_json(state["config"])
    model = build_model(config, int(state["vocab_size"])).to(device)
    ckpt.load_checkpoint(out_dir, model, None)
    model.eval()
    return model, config, state
