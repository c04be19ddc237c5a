"""The context-extension methods of ``relpos longctx``: ``METHODS`` (name -> ``Method``).

Adding one = one entry ``name -> Method(encoding, options)``; the model adds its own ``base``,
``layout`` and ``max_position_embeddings`` where the encoding takes them, see
``LlamaLM.encoding_defaults``:

* ``baseline``: RoPE as trained;
* ``pi``: position interpolation x2 (Chen et al. 2023, arXiv 2306.15595; HF ``linear``);
* ``ntk``: NTK-aware base x2 (bloc97 2023);
* ``dynamic-ntk``: dynamic NTK x2 (emozilla 2023; HF ``dynamic``), frequencies from the
  length of each call;
* ``yarn``: YaRN x2 (Peng et al. 2023, arXiv 2309.00071; HF ``yarn``);
* ``lm-infinite``: LM-Infinite (Han et al. 2023, arXiv 2308.16137): a local branch of the
  trained length plus the first 10 tokens, distances capped at the trained length;
* ``dca``: Dual Chunk Attention (An et al. 2024, arXiv 2402.17463), chunks of 3/4 of the
  trained length with a local window of 1/8;
* ``self-extend``: Self-Extend (Jin et al. 2024, arXiv 2401.01325), groups of 8 beyond a
  neighbour window of 1024;
* ``longheads``: LongHeads (Lu et al. 2024, arXiv 2402.10685), the official defaults: chunks
  of 256 tokens (``Lp / 16`` for ``Lp < 4096``), each head reading ``Lp`` tokens chosen by
  its query from position ``Lp`` on (plain RoPE below);
* ``pine``: PINE (Wang et al. 2024, arXiv 2407.01100): the passkey prompt's filler is cut into
  ``PINE_DOCUMENTS`` documents between the task description (prefix) and the question
  (suffix), which PINE orders per head by attention; running text has no documents, so its
  perplexity rows are plain RoPE's.

The last five are piecewise RoPE schedules: they run on the ``chunked`` backend (O(L x block)
memory), several times slower than the rotary-only methods on SDPA, so the profiles run the first
five (``ROPE_SCALINGS``) and the schedules are opt-in (``--methods all`` or by name).

Formulas: HF ``transformers`` ``modeling_rope_utils.py`` (PI, dynamic NTK, YaRN) and
jquesnelle/yarn (static NTK), through ``relpos.rope_scaling``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from relpos import registry

__all__ = [
    "Method",
    "METHODS",
    "ROPE_SCALINGS",
    "PIECEWISE_COST",
    "PINE_DOCUMENTS",
    "available_methods",
    "method_cost",
]


class Method(NamedTuple):
    """A context-extension method: a relpos encoding name and its options."""

    encoding: str
    options: dict[str, Any]
    label: str = ""


METHODS: dict[str, Method] = {
    "baseline": Method("rope", {}, "RoPE as trained"),
    "pi": Method(
        "rope", {"scaling": {"rope_type": "linear", "factor": 2.0}}, "position interpolation x2"
    ),
    "ntk": Method("rope", {"scaling": {"rope_type": "ntk", "factor": 2.0}}, "NTK-aware x2"),
    "dynamic-ntk": Method(
        "rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic NTK x2"
    ),
    "yarn": Method("rope", {"scaling": {"rope_type": "yarn", "factor": 2.0}}, "YaRN x2"),
    # RoPE schedules (relpos.encodings.rotary_schedules), sized from the trained context Lp
    "lm-infinite": Method("lm-infinite", {"global_branch": 10}, "LM-Infinite, local Lp + 10"),
    "dca": Method("dca", {}, "Dual Chunk Attention, chunk 3Lp/4"),
    "self-extend": Method(
        "self-extend", {"group_size": 8, "neighbor_window": 1024}, "Self-Extend G=8, W=1024"
    ),
    # selecting schedules: per-head layouts from the raw q.k
    "longheads": Method("longheads", {}, "LongHeads, Lp per head in chunks of min(256, Lp/16)"),
    "pine": Method("pine", {}, "PINE, the filler as 8 documents"),
}

#: documents PINE's passkey prompts are cut into (``relpos_lab.training.passkey.passkey_segments``)
PINE_DOCUMENTS = 8


# The rotary-only methods (SDPA, minutes per length); the piecewise schedules are opt-in.
ROPE_SCALINGS = ("baseline", "pi", "ntk", "dynamic-ntk", "yarn")
# Forward time of the piecewise schedules (chunked backend) relative to the rotary-only
# methods (SDPA), for the time estimate: the ratio measured for Self-Extend vs RoPE at 2K tokens.
PIECEWISE_COST = 5.0


def available_methods() -> list[str]:
    """Methods whose encoding is registered (in ``METHODS`` order)."""
    names = set(registry.available())
    return [name for name, m in METHODS.items() if m.encoding in names]


def method_cost(name: str) -> float:
    """Relative forward time of a method: ``PIECEWISE_COST`` for encodings that change the
    attention weights beyond a score term (piecewise schedules: chunked backend), else 1."""
    cls = registry.encoding_class(METHODS[name].encoding)
    slow = cls.piecewise or cls.has_value_term or cls.multiplies_probs
    return PIECEWISE_COST if slow else 1.0
