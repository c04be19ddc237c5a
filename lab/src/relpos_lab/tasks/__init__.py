"""The task suites behind ``relpos tasks``: algorithmic length generalisation and multi-view
camera encodings.


* ``chomsky``: the 15 tasks of Delétang et al. 2023 (reused by Ruoss et al. 2023);
* ``nope_study``, ``scan``: copy, reverse, addition, sort and SCAN in the text formats of
  Kazemnejad et al. 2023 (``text``: words, vocabulary, decoder batches);
* ``coupled_addition``: addition with coupled position ids (Cho et al. 2024);
* ``models``: the Chomsky encoder and the position schemes (default, random, random-start,
  coupled) for any 1-D encoding; the decoder tasks use ``relpos.nn.TransformerLM``;
* ``metrics``: masked accuracy, exact match, the test-length score, mean ± CI over seeds;
* ``suite``, ``profiles``, ``plan``, ``jobs``, ``run``, ``report``, ``command``: the
  pipeline every suite shares (one job per task x model x seed, trained in parallel
  processes, checkpointed, resumable), with what each suite supplies in ``length_suites`` /
  ``length_report`` (chomsky, nope, coupling) and ``multiview_suite`` / ``multiview_report``;
* ``references``: the published numbers set beside the cells;
* ``scenes``, ``correspondence``, ``nvs``: the multiview suite's synthetic scenes and its two
  tasks (relative camera encodings against absolute Plücker rays under a rigid change of the
  test scenes): cross-view correspondence and target-feature regression ("tiny NVS").
"""

from .chomsky import CHOMSKY_TASKS, ChomskyTask, TaskBatch, chomsky_task
from .coupled_addition import addition_example, coupled_batch_positions, coupling_vocab
from .metrics import exact_match, masked_accuracy, mean_ci, ood_score
from .models import POSITION_SCHEMES, TaskEncoder
from .nope_study import NOPE_TASKS, TextTask, nope_task
from .scan import scan_commands, scan_meaning, scan_split
from .text import DecoderBatch, Example, Vocab, decoder_batch, words

__all__ = [
    "CHOMSKY_TASKS",
    "ChomskyTask",
    "TaskBatch",
    "chomsky_task",
    "NOPE_TASKS",
    "TextTask",
    "nope_task",
    "scan_commands",
    "scan_meaning",
    "scan_split",
    "addition_example",
    "coupled_batch_positions",
    "coupling_vocab",
    "Example",
    "Vocab",
    "DecoderBatch",
    "decoder_batch",
    "words",
    "POSITION_SCHEMES",
    "TaskEncoder",
    "masked_accuracy",
    "exact_match",
    "ood_score",
    "mean_ci",
]
