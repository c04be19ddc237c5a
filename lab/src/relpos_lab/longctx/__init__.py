"""Training-free context extension of a pretrained RoPE model: ``relpos longctx``.

The model is SmolLM2-135M-Instruct (``relpos.interop.load_gguf``: 30 layers, RoPE base 1e5,
trained context 8192). Each *method* (``methods.METHODS``) swaps the positional encoding of
every layer (``LlamaLM.set_encoding``), the weights stay; no method is fine-tuned. At each
prompt length the run measures

* **passkey retrieval** (``relpos_lab.training.passkey``): Landmark-format prompts of that many
tokens
  with the key at several depths (and seeds), greedy decoding, accuracy = the first generated
  integer equals the key (Mohtashami & Jaggi 2023; the protocol of PI, NTK and YaRN);
* **perplexity** on held-out text (the test plays of the built-in Shakespeare, or ``--data``)
  scored with the model's own tokenizer: the same last ``ppl_tokens`` tokens of one text span,
  given ``length`` tokens of context, so a method that handles long context keeps its
  perplexity flat or lowers it, and one that breaks sends it up.

What the full profile should show (measured with ``transformers`` on the same file, greedy):
the baseline finds the key at 4K and 8K and fails at 12K and 16K; PI x2 fails already at 4K;
dynamic NTK x2 and YaRN x2 find it at 12K and 16K.

Memory: rotary encodings run through SDPA's flash kernels (O(L)); the LM head only sees the
last position while decoding and the scored positions for perplexity (``LlamaLM.token_nll``
chunks them), so no ``L x L`` or ``L x vocab`` tensor is built at 16K tokens.

Outputs (each written atomically into ``out_dir``, and rewritten after every measurement so
an interrupted run keeps what it measured; ``--resume`` skips finished measurements):
``results.json`` (meta, rows, per-trial details), ``results.csv`` (one row per method x
length), ``longctx.png`` (accuracy and perplexity vs length), ``report.md``.

Modules:

* ``methods``: ``METHODS`` (name -> encoding and options), their relative cost;
* ``plan``: option parsing, ``PROFILES``, ``plan_longctx`` (all validation, nothing written);
* ``run``: the inputs (held-out text, passkey prompts), the measurements, resume;
* ``report``: tables, CSV, plot, markdown (``write_outputs``);
* ``models``: SmolLM2 / a GGUF file / ``random-tiny`` / ``hf:<spec>``, a transformers model
  (``relpos.interop.hf.HFCausalLM``: each method is applied by ``patch``, so the table of
  ``--model hf:smollm2`` is the built-in model's, measured in transformers);
* ``command``: the CLI options and ``run_command``.

This package re-exports the public names of those modules.
"""

from .command import add_arguments, run_command
from .methods import METHODS, PIECEWISE_COST, ROPE_SCALINGS, Method, available_methods, method_cost
from .models import ByteTokenizer, load_model, random_tiny_model
from .plan import (
    PROFILES,
    RUN_FILE,
    RUN_KIND,
    LongctxPlan,
    LongctxProfile,
    check_out_dir,
    get_profile,
    parse_depths,
    parse_lengths,
    parse_methods,
    plan_longctx,
)
from .report import (
    CSV_COLUMNS,
    PLOT_FILE,
    markdown_tables,
    plot,
    print_table,
    write_csv,
    write_markdown,
    write_outputs,
)
from .run import (
    RunState,
    build_prompts,
    heldout_text,
    run_longctx,
    start_run,
    tail_perplexity,
    trial_keys,
)

__all__ = [
    "METHODS",
    "Method",
    "ROPE_SCALINGS",
    "method_cost",
    "PROFILES",
    "LongctxPlan",
    "LongctxProfile",
    "RunState",
    "available_methods",
    "parse_methods",
    "parse_lengths",
    "parse_depths",
    "plan_longctx",
    "heldout_text",
    "trial_keys",
    "build_prompts",
    "tail_perplexity",
    "run_longctx",
    "start_run",
    "write_outputs",
    "print_table",
    "markdown_tables",
    "load_model",
    "random_tiny_model",
    "add_arguments",
    "run_command",
    # also importable from here, as before the split
    "ByteTokenizer",
    "CSV_COLUMNS",
    "PIECEWISE_COST",
    "PLOT_FILE",
    "RUN_FILE",
    "RUN_KIND",
    "check_out_dir",
    "get_profile",
    "plot",
    "write_csv",
    "write_markdown",
]
