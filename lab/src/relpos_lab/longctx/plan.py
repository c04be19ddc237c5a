"""What a ``relpos longctx`` run measures: option parsing, profiles and the validated plan.

* ``parse_methods`` / ``parse_lengths`` / ``parse_depths``: the comma-separated options;
* ``PROFILES`` (``quick``, ``full``): presets of methods, lengths, passkey trials and the
  perplexity budget, with a wall-time model of a 2-core CPU;
* ``plan_longctx`` -> ``LongctxPlan``: every option resolved and validated (``ValueError``)
  before anything is loaded or written; ``check_out_dir`` checks ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relpos.optional import require
from relpos.validation import check_int

from ..arguments import parse_float_list
from ..report import check_run_folder
from ..training.passkey import MAX_NEW_TOKENS, landmark_prompt
from ..training.profiles import lookup_profile
from .methods import ROPE_SCALINGS, available_methods, method_cost

__all__ = [
    "RUN_FILE",
    "RUN_KIND",
    "parse_methods",
    "parse_lengths",
    "parse_depths",
    "LongctxProfile",
    "PROFILES",
    "get_profile",
    "LongctxPlan",
    "check_out_dir",
    "plan_longctx",
]

RUN_FILE = "run.json"
RUN_KIND = "relpos-longctx"


# ------------------------------------------------------------------------------ parsing


def parse_methods(value: str | Sequence[str]) -> list[str]:
    """Method names from ``"baseline,yarn"`` (``"all"``: every available method) or a list;
    unknown names raise ``ValueError``."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    known = available_methods()
    names = [m for n in names for m in (known if n == "all" else [n])]
    names = list(dict.fromkeys(n for n in names if n))
    if not names:
        raise ValueError(f"--methods is empty; known methods: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown method{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known methods: {', '.join(known)}"
        )
    return names


def parse_lengths(value: str | Sequence[int]) -> list[int]:
    """Prompt lengths in tokens (``"1024,2048"``; a ``k``/``K`` suffix means x1024), sorted."""
    items = value.split(",") if isinstance(value, str) else list(value)
    parsed: list[int] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        mult = 1024 if text[-1] in "kK" else 1
        number = parse_float_list(text[:-1] if mult > 1 else text, "--lengths")[0]
        if number != int(number) and mult == 1:
            raise ValueError(f"--lengths must be whole numbers of tokens, got {text!r}")
        length = int(number * mult)
        if length < 64:
            raise ValueError(f"--lengths must be >= 64 tokens, got {text!r}")
        parsed.append(length)
    if not parsed:
        raise ValueError("--lengths is empty")
    return sorted(set(parsed))


def parse_depths(value: str | Sequence[float]) -> list[float]:
    """Key depths in [0, 1] (``"0.1,0.5,0.9"``)."""
    depths = parse_float_list(value, "--depths")
    bad = [d for d in depths if not 0 <= d <= 1]
    if bad:
        raise ValueError(f"--depths must lie in [0, 1], got {bad[0]!r}")
    return list(dict.fromkeys(depths))


# ------------------------------------------------------------------------------ profiles


@dataclass(frozen=True)
class LongctxProfile:
    """A preset of ``relpos longctx``: methods, lengths, passkey trials, perplexity budget."""

    name: str
    description: str
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    seeds: int
    ppl_tokens: int
    methods: tuple[str, ...] = ROPE_SCALINGS
    # SmolLM2-135M forward on a quiet 2-core CPU, seconds = a * L + b * L^2 (fit to 6-8 s at
    # 2K tokens and about 90-100 s at 16K with SDPA)
    seconds_per_token: float = 3.0e-3
    seconds_per_token2: float = 2.0e-7


PROFILES: dict[str, LongctxProfile] = {
    "quick": LongctxProfile(
        name="quick",
        description="1K and 2K tokens, 2 passkey depths: a few minutes on 2 cores",
        lengths=(1024, 2048),
        depths=(0.25, 0.75),
        seeds=1,
        ppl_tokens=256,
    ),
    "full": LongctxProfile(
        name="full",
        description="2K..16K tokens (past the trained 8K), 3 depths: about 1.5 h on 2 cores",
        lengths=(2048, 4096, 8192, 12288, 16384),
        depths=(0.1, 0.5, 0.9),
        seeds=1,
        ppl_tokens=1024,
    ),
}


def get_profile(name: str) -> LongctxProfile:
    """The profile called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup_profile(PROFILES, name)


# ------------------------------------------------------------------------------ the plan


@dataclass
class LongctxPlan:
    """A validated run: what to measure and where to write it."""

    methods: list[str]
    lengths: list[int]
    depths: list[float]
    seeds: int
    ppl_tokens: int
    out_dir: Path
    profile: LongctxProfile
    max_new_tokens: int = MAX_NEW_TOKENS
    resume: bool = False
    clear: bool = False
    model: str = "smollm2"
    data: str | None = None
    #: what identifies the held-out text: the resolved path of ``--data`` and a hash of its
    #: content (None: the built-in Shakespeare)
    data_key: dict[str, str] | None = None
    #: what an earlier run in ``out_dir`` measured (``--resume``: validated by the plan)
    previous: dict[str, list] = field(default_factory=lambda: {"rows": [], "trials": []})

    @property
    def trials(self) -> int:
        return len(self.depths) * self.seeds

    def settings(self) -> dict[str, Any]:
        """What the measurements depend on (compared on ``--resume``)."""
        return {
            "depths": self.depths,
            "seeds": self.seeds,
            "ppl_tokens": self.ppl_tokens,
            "max_new_tokens": self.max_new_tokens,
            "model": self.model,
            "data": self.data_key,
            "max_length": max(self.lengths),
        }

    def estimate_seconds(self) -> float:
        """Rough wall time on a quiet 2-core CPU: one perplexity forward and ``trials``
        passkey prefills per method and length."""
        p = self.profile
        per_method = sum(
            p.seconds_per_token * n + p.seconds_per_token2 * n * n for n in self.lengths
        )
        passes = (1 if self.ppl_tokens else 0) + self.trials
        cost = sum(method_cost(name) for name in self.methods)
        return 10.0 + cost * passes * per_method


def check_out_dir(out_dir: Path, *, resume: bool, force: bool) -> bool:
    """Validate ``--out``; returns True when ``--force`` will clear an old run."""
    return check_run_folder(
        out_dir,
        resume=resume,
        force=force,
        run_file=RUN_FILE,
        run_kind=RUN_KIND,
        what="relpos longctx run",
    )


def available_memory() -> int | None:
    """Bytes of memory this machine can give a run (``MemAvailable`` of /proc/meminfo, else
    the physical memory), None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_lengths(
    lengths: Sequence[int],
    model: str,
    *,
    seeds: int,
    ppl_tokens: int,
    data: str | os.PathLike | None = None,
) -> None:
    """``ValueError`` naming ``--lengths`` when a length cannot run, known before the model is
    loaded: shorter than the passkey prompt's fixed part (task, key line, question: a lower
    bound on its tokens, ``models.prompt_floor``); longer than the held-out text can give
    (a token is at least one byte); or needing more memory than the machine has
    (``models.bytes_per_token`` of the model's config, read from the GGUF header only)."""
    from .models import bytes_per_token, model_config, prompt_floor

    if seeds:
        floor = max(prompt_floor(model, landmark_prompt(0, 1, depth)) for depth in (0.0, 1.0))
        if min(lengths) < floor:
            raise ValueError(
                f"--lengths {min(lengths)} is shorter than the prompt without filler (at "
                f"least {floor} tokens for --model {model}); use longer --lengths"
            )
    config = model_config(model)
    need = max(lengths) * bytes_per_token(config)
    have = available_memory()
    if have is not None and need > have:
        fit = have // bytes_per_token(config)
        raise ValueError(
            f"--lengths {max(lengths):,} needs about {_gib(need)} of memory for --model "
            f"{model} ({config.depth} layers), this machine has {_gib(have)} available; "
            f"use --lengths of at most about {fit:,} tokens"
        )
    if ppl_tokens and data is not None:
        from ..training.data import read_texts

        size = sum(len(t.encode("utf-8")) for t in read_texts(data).values())
        if max(lengths) + 1 > size:
            raise ValueError(
                f"--lengths {max(lengths)} is longer than --data {data} can give ({size} bytes, "
                "at most as many tokens); use shorter --lengths or more text"
            )


def plan_longctx(
    *,
    methods: str | Sequence[str] | None = None,
    profile: str | LongctxProfile = "quick",
    lengths: str | Sequence[int] | None = None,
    depths: str | Sequence[float] | None = None,
    seeds: int | None = None,
    ppl_tokens: int | None = None,
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    force: bool = False,
    model: str = "smollm2",
    data: str | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> LongctxPlan:
    """Resolve and validate a run (raises ``ValueError``); writes nothing."""
    prof = profile if isinstance(profile, LongctxProfile) else get_profile(profile)
    names = parse_methods(methods if methods is not None else prof.methods)
    lens = parse_lengths(lengths) if lengths is not None else list(prof.lengths)
    deps = parse_depths(depths) if depths is not None else list(prof.depths)
    n_seeds = prof.seeds if seeds is None else seeds
    n_ppl = prof.ppl_tokens if ppl_tokens is None else ppl_tokens
    n_seeds = check_int(n_seeds, "--seeds", minimum=0)
    n_ppl = check_int(n_ppl, "--ppl-tokens", minimum=0)
    if n_seeds == 0 and n_ppl == 0:
        raise ValueError("--seeds 0 and --ppl-tokens 0 leave nothing to measure")
    out = Path(out_dir or f"runs/longctx-{prof.name}")
    clear = check_out_dir(out, resume=resume, force=force)
    if data is not None and not Path(data).exists():
        raise ValueError(f"--data {data}: no such file or folder")
    if model.startswith("hf:"):
        require("relpos longctx", {"transformers": f"--model {model}"})
        from relpos.interop.hf.lab_model import parse_hf_spec

        spec = parse_hf_spec(model)
        if spec == "smollm2" or spec.endswith(".gguf"):
            require("relpos longctx", {"gguf": f"--model {model}", "tokenizers": "its tokenizer"})
    elif model not in ("smollm2", "random-tiny") and not Path(model).is_file():
        raise ValueError(
            f"--model must be smollm2, random-tiny or a .gguf file (or hf:<transformers model "
            f"folder, config .json, .gguf or smollm2>), got {model!r}"
        )
    elif model != "random-tiny":
        require(
            "relpos longctx",
            {"gguf": f"--model {model}", "tokenizers": f"the tokenizer of --model {model}"},
        )
    check_lengths(lens, model, seeds=n_seeds, ppl_tokens=n_ppl, data=data)
    plan = LongctxPlan(
        methods=names,
        lengths=lens,
        depths=deps,
        seeds=n_seeds,
        ppl_tokens=n_ppl,
        out_dir=out,
        profile=prof,
        max_new_tokens=max_new_tokens,
        resume=resume,
        clear=clear,
        model=model,
        data=data,
        data_key=data_key(data),
    )
    if resume and (out / RUN_FILE).exists():
        plan.previous = read_previous(plan)
    return plan


def data_key(data: str | os.PathLike | None) -> dict[str, str] | None:
    """The resolved path and a content hash of ``--data`` (so the same text named another
    way, or from another folder, resumes, and an edited one does not)."""
    if data is None:
        return None
    from ..training.data import read_texts

    digest = hashlib.sha256()
    for name, text in sorted(read_texts(data).items()):
        digest.update(f"{Path(name).name}:{len(text)}:".encode())
        digest.update(text.encode("utf-8"))
    return {"path": str(Path(data).resolve()), "fingerprint": digest.hexdigest()[:16]}


def _same_settings(old: dict[str, Any], new: dict[str, Any]) -> bool:
    old, new = dict(old), dict(new)
    old_data, new_data = old.pop("data", None), new.pop("data", None)
    if isinstance(old_data, dict) and isinstance(new_data, dict):
        same_data = old_data.get("fingerprint") == new_data.get("fingerprint")
    else:
        same_data = old_data == new_data
    return same_data and old == new


def read_previous(plan: LongctxPlan) -> dict[str, list]:
    """What the run in ``plan.out_dir`` measured, for ``--resume``: ``run.json`` must hold the
    same settings, ``results.json`` (if any) rows and trials. ``ValueError`` naming the file
    and ``--force`` for a corrupt one, before the model is loaded or anything written."""
    path = plan.out_dir / RUN_FILE
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("settings"), dict):
        raise ValueError(f"--resume: {path} is corrupt; use --force to start over")
    if not _same_settings(old["settings"], plan.settings()):
        raise ValueError(
            f"--resume: {plan.out_dir} was run with other settings ({old.get('settings')}); "
            "use --force to replace it"
        )
    results = plan.out_dir / "results.json"
    if not results.exists():
        return {"rows": [], "trials": []}
    try:
        saved = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        saved = None
    ok = isinstance(saved, dict) and all(
        isinstance(saved.get(k, []), list) and all(isinstance(r, dict) for r in saved.get(k, []))
        for k in ("rows", "trials")
    )
    rows_ok = ok and all(
        isinstance(r.get("method"), str) and isinstance(r.get("length"), int)
        for r in saved.get("rows", [])
    )
    if not rows_ok:
        raise ValueError(f"--resume: {results} is corrupt; use --force to start over")
    return {"rows": list(saved.get("rows", [])), "trials": list(saved.get("trials", []))}
