"""The lab: train short, test long, on real text (``relpos extrapolate``) and on algorithmic
tasks (``relpos tasks``), and context extension of a pretrained model (``relpos longctx``).

* ``data``: the built-in Shakespeare (split by play) or the user's text; byte or BPE tokens;
* ``train``: the trainer (AdamW, warmup + cosine, atomic checkpoints, resume, Ctrl-C);
* ``runtime``: signal handling and the progress bar around the training loop;
* ``checkpoint``: the checkpoint files, each validated when read back;
* ``distributed``: process-group helpers; ``torchrun``: the ``torchrun -m
relpos_lab.training.torchrun``
  entry point;
* ``extrapolate/`` (plan, run, command) and ``longctx/`` (methods, plan, run, report, models,
  command): the two experiments, each with its command; ``demo``: ``relpos demo``;
* ``tasks/``: algorithmic length generalisation (``relpos tasks``: the Chomsky suite, the
  NoPE study's tasks, position coupling), generators, models, jobs, plan, run, report;
* ``perplexity``, ``passkey``: the measurements; ``profiles``: presets and the shared
  training flags (``--dim --depth --heads --batch --lr --steps --seeds``); ``report``: files,
  tables, plots and run folders.
"""

__version__ = "0.1.0"  # released with the library of the same version (tests/lab/test_cli.py)

from .training.data import Corpus, builtin_texts, load_corpus, sample_batch
from .training.train import (
    TrainConfig,
    TrainingInterrupted,
    TrainResult,
    build_model,
    load_trained,
    train,
)

__all__ = [
    "__version__",
    "Corpus",
    "TrainConfig",
    "TrainResult",
    "TrainingInterrupted",
    "build_model",
    "builtin_texts",
    "load_corpus",
    "load_trained",
    "sample_batch",
    "train",
]
