"""The lab: train short, test long, on real text (``relpos extrapolate``).

* ``data``: the built-in Shakespeare (split by play) or the user's text; byte or BPE tokens;
* ``train``: the trainer (AdamW, warmup + cosine, atomic checkpoints, resume, Ctrl-C);
* ``checkpoint``: the checkpoint files; ``distributed``: data-parallel under ``torchrun``;
* ``extrapolate``, ``report``: the evaluation and its report.
"""

from .data import Corpus, builtin_texts, load_corpus, sample_batch
from .train import TrainConfig, TrainingInterrupted, TrainResult, build_model, load_trained, train

__all__ = [
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
