"""Run profiles of ``relpos extrapolate``: model size, training length, evaluation budget.

* ``quick`` (default): the seven headline encodings, a small model, a few hundred steps;
  about 5 minutes on a quiet 2-core CPU (6.7 measured on a busy one) including the
  evaluation at 1-16x the train length.
* ``paper``: a deeper model trained ten times longer, plus xPos, KERPLE-power and learned
  absolute positions; hours on 2 CPU cores.

Estimated times come from throughputs measured on a quiet 2-core CPU (torch 2.13): the
``*_tokens_per_second`` fields below. ``--steps`` overrides a profile's step count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import registry

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
        # measured on a quiet 2-core CPU (torch 2.13): 38-40K tok/s (T5 25K), evaluation ~2 s
        # per encoding (FIRE 20 s: its bias above the threshold is an MLP per query-key pair)
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
        # depth 6 trains at 12-13K tok/s on a quiet 2-core CPU (measured, ALiBi and RoPE)
        train_tokens_per_second={"*": 12500.0, "t5": 8500.0},
        eval_tokens_per_second={"*": 27000.0, "fire": 2700.0},
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


__all__ = ["Profile", "PROFILES", "HEADLINE", "get_profile", "lookup_profile"]
