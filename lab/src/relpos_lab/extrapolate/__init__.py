"""Train short, test long: the length-extrapolation experiment behind ``relpos extrapolate``.

The protocol follows Press et al. 2022 (ALiBi, "Train Short, Test Long", arXiv 2108.12409)
at laptop scale: train one small ``TransformerLM`` per encoding at length ``L``, then measure
perplexity on unseen text at ``L, 2L, 4L, ...`` in two modes (``relpos_lab.training.perplexity``:
non-overlapping windows, the paper's headline metric, and sliding windows, its Appendix B).

Modules, shaped like ``relpos_lab.longctx``:

* ``plan``: option parsing and ``plan_extrapolation`` -> ``EvalPlan`` (all validation, the
  corpus loaded after every check that needs none, nothing written);
* ``run``: ``start_run`` (the first write), ``run_plan`` (train, evaluate, keep results for
  ``--resume``) and the façade ``run_extrapolation``;
* ``command``: the CLI options and ``run_command`` (calls the façade, writes the report).

This package re-exports the public names of those modules and the evaluation API.
"""

from ..training.perplexity import (
    EVAL_BATCH_TOKENS,
    MODES,
    evaluate_perplexity,
    sliding_stride,
    window_spans,
)
from .command import add_arguments, run_command
from .plan import (
    CORPUS_PROVIDERS,
    EVAL_FILE,
    RUN_FILE,
    RUN_KIND,
    SEGMENT_ENDS,
    EvalPlan,
    check_out_dir,
    corpus_key,
    encoding_options,
    eval_budget,
    parse_encodings,
    parse_mults,
    plan_extrapolation,
    segment_separators,
)
from .run import run_extrapolation, run_plan, start_run

__all__ = [
    "EVAL_BATCH_TOKENS",
    "MODES",
    "evaluate_perplexity",
    "window_spans",
    "sliding_stride",
    "CORPUS_PROVIDERS",
    "EVAL_FILE",
    "RUN_FILE",
    "RUN_KIND",
    "SEGMENT_ENDS",
    "EvalPlan",
    "check_out_dir",
    "corpus_key",
    "encoding_options",
    "eval_budget",
    "parse_encodings",
    "parse_mults",
    "plan_extrapolation",
    "segment_separators",
    "start_run",
    "run_plan",
    "run_extrapolation",
    "add_arguments",
    "run_command",
]
