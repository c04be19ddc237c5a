"""Run profiles of ``relpos extrapolate``: model size, training length, evaluation budget.

* ``quick`` (default): the seven headline encodings, a small model, a few hundred steps;
  a few minutes on a quiet 2-core CPU, including the
  evaluation at 1-16x the train length.
* ``paper``: a deeper model trained ten times longer, plus xPos, KERPLE-power and learned
  absolute positions; hours on 2 CPU cores.
* ``xtransformers``: the peer configuration recorded in docs/benchmarks.md (x-transformers
  2.31: dim 128, depth 4, 4 heads, L = 128, batch 32, 1000 steps, AdamW 1e-3, weight decay
  0.01, 50 warm-up steps, cosine to 1e-4, clip 1.0), ALiBi and RoPE. It trains and scores on
  the lab's split (a seeded shuffle by play) with the lab's optimizer (betas 0.9/0.95, no decay
  on norms, biases and encodings), not on the peer's last three plays with plain AdamW: for a
  like-for-like comparison with x-transformers use ``benchmarks/bench_lm_quality.py``.

Estimated times come from throughputs measured on a quiet 2-core CPU (torch 2.13): the
``*_tokens_per_second`` fields below. ``--steps`` overrides a profile's step count.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relpos import registry

from ..arguments import optional_int, parse_float

P = TypeVar("P")

HEADLINE = ("rope", "alibi", "kerple-log", "fire", "t5", "sinusoidal", "nope")


@dataclass(frozen=True)
class Profile:
    """One preset of ``relpos extrapolate``."""

    name: str
    description: str
    encodings: tuple[str, ...]
    dim: int
    depth: int
    num_heads: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    checkpoint_every: int
    modes: tuple[str, ...] = ("nonoverlapping", "sliding")
    # scored tokens per evaluation length, per mode (the same for every length)
    eval_tokens: Mapping[str, int] = field(default_factory=dict)
    # measured training throughput (tokens/s) at this size on 2 CPU cores; "*" = others
    train_tokens_per_second: Mapping[str, float] = field(default_factory=dict)
    # measured forward throughput (tokens/s) during evaluation, averaged over 1-16x lengths
    eval_tokens_per_second: Mapping[str, float] = field(default_factory=dict)
    #: attention backend for training and evaluation: ``auto`` picks per encoding and size
    #: (chunked for FIRE's per-distance MLP table at training sizes, see
    #: ``relpos.attention``)
    backend: str = "auto"
    #: AdamW weight decay (matrices and the token embedding) and the cosine's floor
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    #: kernel size of RCMHA's causal depth-wise q/k/v convolutions in every layer
    #: (``TransformerLM(qkv_conv=)``, ``--qkv-conv``); None: no convolution
    qkv_conv: int | None = None
    #: ``"rms"``: q/k RMS normalisation in every layer (``TransformerLM(qk_norm=)``,
    #: ``--qk-norm``; TRA's layer); None: off
    qk_norm: str | None = None
    #: the model's init (``TransformerLM(init=)``, ``--init``): ``"fan-in"`` (its default) or
    #: ``"gpt2"`` (the default before, which the results recorded before then used)
    init: str = "fan-in"
    #: False: an output layer of its own, ``TransformerLM``'s default (``--head untied``);
    #: True: logits from the token embedding (``--head tied``, the head before then)
    tie_embedding: bool = False

    def encoding_options(self, name: str, train_len: int, max_len: int) -> dict[str, Any]:
        """Options for ``relpos.create``, read from what the encoding declares: one that has a
        ``max_positions`` option (a learned table) gets a table long enough for every
        evaluation length (its rows past the train length stay untrained, which is the point
        of the test)."""
        if "max_positions" in registry.encoding_class(name).option_specs:
            return {"max_positions": max(train_len, max_len)}
        return {}

    def estimate_seconds(
        self,
        encodings: Sequence[str],
        steps: int,
        lengths: Sequence[int],
        eval_tokens: Mapping[str, int],
        train_len: int,
    ) -> float:
        """Rough wall time on a quiet 2-core CPU (training + evaluation)."""
        total = 5.0  # imports, loading the corpus, the report
        for name in encodings:
            tps = self.train_tokens_per_second.get(name, self.train_tokens_per_second["*"])
            total += steps * self.batch_size * train_len / tps
            ets = self.eval_tokens_per_second.get(name, self.eval_tokens_per_second["*"])
            for mode, budget in eval_tokens.items():
                # sliding windows cost length/stride = 4 forward tokens per scored token
                cost = 1 if mode == "nonoverlapping" else 4
                total += cost * budget * len(lengths) / ets
        return total


PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick",
        description="small model, short training: the qualitative result in ~6 min on 2 cores",
        encodings=HEADLINE,
        dim=128,
        depth=2,
        num_heads=4,
        batch_size=32,
        steps=300,
        lr=2e-3,
        warmup=30,
        checkpoint_every=100,
        eval_tokens={"nonoverlapping": 16384, "sliding": 4096},
        # throughputs measured on a quiet 2-core CPU (torch 2.13), for the time estimate; FIRE
        # evaluates slower (its bias above the threshold is an MLP per query-key pair)
        train_tokens_per_second={"*": 38000.0, "t5": 25000.0},
        eval_tokens_per_second={"*": 80000.0, "fire": 8000.0},
    ),
    "paper": Profile(
        name="paper",
        description="deeper model, 10x the training, ten encodings (hours on 2 CPU cores)",
        encodings=(*HEADLINE, "xpos", "kerple-power", "learned"),
        dim=128,
        depth=6,
        num_heads=4,
        batch_size=32,
        steps=3000,
        lr=1e-3,
        warmup=150,
        checkpoint_every=250,
        eval_tokens={"nonoverlapping": 65536, "sliding": 16384},
        # depth-6 throughputs measured on a quiet 2-core CPU (ALiBi and RoPE), for the estimate
        train_tokens_per_second={"*": 12500.0, "t5": 8500.0},
        eval_tokens_per_second={"*": 27000.0, "fire": 2700.0},
    ),
    "xtransformers": Profile(
        name="xtransformers",
        description="the x-transformers configuration of docs/benchmarks.md's throughput "
        "section (dim 128, depth 4, 4 heads, batch 32, 1000 steps, AdamW 1e-3, wd 0.01, 50 "
        "warm-up steps, cosine to 1e-4, clip 1.0), to set perplexities beside that peer's",
        encodings=("alibi", "rope"),
        dim=128,
        depth=4,
        num_heads=4,
        batch_size=32,
        steps=1000,
        lr=1e-3,
        warmup=50,
        checkpoint_every=250,
        eval_tokens={"nonoverlapping": 131072, "sliding": 16384},
        # depth 4 at L = 128: about 2/3 of quick's depth-2 throughput (scaled from it)
        train_tokens_per_second={"*": 19000.0, "t5": 12500.0},
        eval_tokens_per_second={"*": 40000.0, "fire": 4000.0},
        weight_decay=0.01,
        min_lr_ratio=0.1,
    ),
}


def lookup_profile(profiles: Mapping[str, P], name: str) -> P:
    """``profiles[name]``; ``ValueError`` listing the known names otherwise (also for an
    unhashable ``name``). Shared by the profile tables of the lab's commands."""
    try:
        return profiles[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown profile {name!r}; known profiles: {', '.join(profiles)}"
        ) from None


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup_profile(PROFILES, name)


# ------------------------------------------------------------------------------ shared flags

#: the model-size and training flags every training lab command takes, and the profile
#: field each one overrides
TRAINING_FLAGS = {
    "--dim": "dim",
    "--depth": "depth",
    "--heads": "num_heads",
    "--batch": "batch_size",
    "--lr": "lr",
    "--steps": "steps",
}


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dim --depth --heads --batch --lr --steps --seeds``: the flags every training lab
    command takes (``relpos extrapolate``, ``relpos tasks``); each defaults to the profile's
    value. Parsed by ``training_overrides`` / ``seeds_flag`` so a bad value is one line naming
    the flag."""
    add = parser.add_argument
    add("--dim", help="model width (default: the profile's)")
    add("--depth", help="number of layers (default: the profile's)")
    add("--heads", help="attention heads; must divide --dim (default: the profile's)")
    add("--batch", help="sequences per training step (default: the profile's)")
    add("--lr", help="peak learning rate (default: the profile's)")
    add("--steps", help="training steps per model (default: the profile's)")
    add("--seeds", help="train every model with N seeds and report mean +- a 95%% CI")


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The profile fields given on the command line (``TRAINING_FLAGS``), parsed and checked:
    ints > 0, ``--lr`` a finite float > 0; ``--dim`` divisible by ``--heads`` is checked where
    both are known (the plan)."""
    out: dict[str, Any] = {}
    for flag, name in TRAINING_FLAGS.items():
        text = getattr(args, flag[2:].replace("-", "_"), None)
        if text is None:
            continue
        out[name] = parse_float(text, flag, above=0.0) if name == "lr" else optional_int(text, flag)
    return out


def seeds_flag(args: argparse.Namespace, default: int) -> int:
    """``--seeds`` as a positive int (``default`` when not given)."""
    value = optional_int(getattr(args, "seeds", None), "--seeds")
    return default if value is None else value


__all__ = [
    "Profile",
    "PROFILES",
    "HEADLINE",
    "TRAINING_FLAGS",
    "add_training_arguments",
    "training_overrides",
    "seeds_flag",
    "get_profile",
    "lookup_profile",
]
