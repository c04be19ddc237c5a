"""Published reference points set beside ``relpos tasks`` cells.

* ``CHOMSKY_TRANSFORMER``: Delétang et al. 2023, Table 2, Transformer encoder with its default
  sin/cos encoding, score = max over 10 seeds and 3 learning rates, mean accuracy over test
  lengths 41-500 after 1M steps. **Recalled from the paper, not re-read**: treat as a rough
  reference, and note the protocol differs from the quick profile (N = 20, tests to 60,
  1,500 steps).
* ``NOPE_SCAN``: Kazemnejad et al. 2023, ``results/classic.jsonl`` (official results, read), SCAN
  ``mdlen_tr25_ts48`` (the ``Solve:`` prefix, as here), test exact match, mean over 3 seeds of
  a 12-layer t5-base-sized decoder.
* ``NOPE_COPY``: the same study's ``len_gen_experiments.csv`` (read), copy (``rdc``), 20 -> 40,
  base model.
* coupling: only the headline (1-30 -> 200 digits, 6.67x, abstract) is published; no cell.
"""

from __future__ import annotations

__all__ = ["reference", "REFERENCE_NOTES"]

CHOMSKY_TRANSFORMER = {
    "even_pairs": 0.964,
    "modular_arithmetic": 0.242,
    "parity_check": 0.520,
    "cycle_navigation": 0.619,
    "stack_manipulation": 0.575,
    "reverse_string": 0.623,
    "modular_arithmetic_brackets": 0.325,
    "solve_equation": 0.257,
    "duplicate_string": 0.528,
    "missing_duplicate_string": 1.000,
    "odds_first": 0.527,
    "binary_addition": 0.543,
    "binary_multiplication": 0.522,
    "compute_sqrt": 0.524,
    "bucket_sort": 0.919,
}
NOPE_SCAN = {"nope": 0.797, "t5": 0.798, "alibi": 0.438, "rope": 0.283, "sinusoidal": 0.057}
NOPE_COPY = {"nope": 0.96, "t5": 0.66, "sinusoidal": 0.00}

REFERENCE_NOTES = {
    "chomsky": "Delétang et al. 2023 Table 2, Transformer with sin/cos, max over seeds, "
    "lengths 41-500 after 1M steps (recalled, not re-read; another protocol)",
    "nope": "Kazemnejad et al. 2023 results/classic.jsonl (SCAN mdlen_tr25_ts48) and "
    "len_gen_experiments.csv (copy, 20 -> 40), 12-layer model, mean of 3 seeds",
    "coupling": "Cho et al. 2024 publish the headline only: 1-30 -> 200 digits (6.67x)",
}


def reference(suite: str, task: str, model: str) -> float | None:
    """The published value for this cell, or None."""
    if suite == "chomsky" and model == "sinusoidal":
        return CHOMSKY_TRANSFORMER.get(task)
    if suite == "nope" and task == "scan":
        return NOPE_SCAN.get(model)
    if suite == "nope" and task == "copy":
        return NOPE_COPY.get(model)
    return None
