"""Where a trained coupled-addition model attends, answer digit by answer digit (the diagnosis
of coupled exact match collapsing, docs/tasks.md).

With position coupling (Cho et al. 2024, arXiv 2405.20671) the token that predicts answer
digit ``k`` has coupled id ``s + k`` and needs the two operand digits of significance ``k``,
whose id is ``s + 1 + k``. A training answer has at most ``train_len + 1`` digits, so no
training sequence holds a (query, key) pair whose ids are more than ``train_len + 1`` apart;
at a longer test length such pairs appear, and a learned absolute table never constrained
their logits. For each answer digit this module measures, on the test set of a length
(the same examples as ``relpos tasks``' evaluation):

* ``accuracy``: the digit predicted right (teacher forcing, as the run's token accuracy);
* ``needed``: the attention weight (mean over heads and examples) on the two operand digits
  of the digit's significance;
* ``unseen``: the weight on keys whose coupled id is farther than ``train_len + 1`` from the
  query's, a distance no training pair had (zero at every training length by construction).

Usage::

    python -m relpos_lab.tasks.coupling_attention \\
        runs/tasks-coupling-quick/addition/learned+coupled/seed0 --lengths 10,12,15,20
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..arguments import parse_int, parse_int_list
from ..training import checkpoint as ckpt
from .coupled_addition import addition_example, coupled_batch_positions
from .jobs import EVAL_SEED
from .length_suites import Job, _Data, build_model
from .text import decoder_batch

__all__ = ["digit_attention", "main"]


def _load(folder: Path) -> tuple[Job, _Data, torch.nn.Module]:
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise ValueError(f"{folder} holds no checkpoint (state.json); give a run's seed folder")
    try:
        config = json.loads(state_file.read_text())["config"]
        job = Job(**config)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{state_file}: not a relpos tasks checkpoint ({err})") from err
    if job.suite != "coupling" or job.scheme != "coupled":
        raise ValueError(
            f"{folder}: a coupled-addition model is needed, got {job.model!r} of "
            f"the {job.suite} suite"
        )
    data = _Data(job)
    model = build_model(job, data)
    ckpt.load_checkpoint(folder, model)
    return job, data, model.eval()


@torch.no_grad()
def digit_attention(
    folder: str | Path, lengths: list[int], *, eval_size: int | None = None
) -> list[dict[str, Any]]:
    """One row per (length, answer digit): ``length, digit, accuracy, needed, unseen``,
    averaged over the heads of every layer and the ``eval_size`` test examples (default:
    the run's)."""
    from ..analysis.model_capture import capture_attention

    job, data, model = _load(Path(folder))
    assert data.vocab is not None
    digit_ids = torch.tensor(data.vocab.encode(list(string.digits)))
    seen = job.train_len + 1
    rows: list[dict[str, Any]] = []
    for n in lengths:
        rng = np.random.default_rng([EVAL_SEED, n])
        size = eval_size or job.eval_size
        batch = decoder_batch(
            [addition_example(rng, 1, n, a_digits=n) for _ in range(size)], data.vocab
        )
        pos = coupled_batch_positions(batch, data.vocab, max_position=job.max_position, train=False)
        logits = model(batch.tokens, pos=pos)
        captures = capture_attention(model, batch.tokens, pos)
        attn = torch.stack([c.weights.mean(1) for c in captures]).mean(0)  # (B, T, T)
        prompt = 2 * n + 2  # n digits, '+', n digits, '='
        operand = torch.isin(batch.tokens, digit_ids)
        operand[:, prompt:] = False
        for digit in range(n + 1):
            t = prompt - 1 + digit  # '=' predicts digit 0, answer digit k-1 predicts k
            right = logits[:, t].argmax(-1) == batch.tokens[:, t + 1]
            q_id, k_id = pos[:, t : t + 1], pos[:, : t + 1]
            w = attn[:, t, : t + 1]
            needed = operand[:, : t + 1] & (k_id == q_id + 1)
            unseen = (k_id - q_id).abs() > seen
            rows.append(
                {
                    "length": n,
                    "digit": digit,
                    "accuracy": right.float().mean().item(),
                    "needed": (w * needed).sum(-1).mean().item(),
                    "unseen": (w * unseen).sum(-1).mean().item(),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a coupled model's seed folder (with state.json)")
    parser.add_argument("--lengths", default="10,15,20", help="comma-separated operand lengths")
    parser.add_argument("--eval-size", default=None, help="test examples per length")
    args = parser.parse_args(argv)
    try:
        lengths = parse_int_list(args.lengths, "--lengths")
        size = None if args.eval_size is None else parse_int(args.eval_size, "--eval-size")
        rows = digit_attention(args.folder, lengths, eval_size=size)
    except ValueError as err:
        print(f"relpos: error: {err}", file=sys.stderr)
        return 2
    for n in lengths:
        cells = [r for r in rows if r["length"] == n]
        print(
            f"{n} digits (answer digit: accuracy / weight on the needed digits / on unseen "
            "distances)"
        )
        print(
            "  "
            + "  ".join(
                f"{r['digit']}: {r['accuracy']:.2f}/{r['needed']:.2f}/{r['unseen']:.2f}"
                for r in cells
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
