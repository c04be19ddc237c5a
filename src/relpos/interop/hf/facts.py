"""The facts ``relpos.interop.hf`` reads from a transformers decoder, as records.

* ``RopeFacts``: the RoPE of one layer type, as relpos's ``rope`` options;
* ``LayerRotary``: how one attention layer rotates q and k, as probed from the model's own
  code (``relpos.interop.hf.probe``);
* ``ModelFacts``: the attention sizes, the RoPE of each layer type and the probed layers
  (``relpos.interop.hf.model.inspect_model``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["FULL", "RopeFacts", "LayerRotary", "ModelFacts"]

#: the layer type of models whose every layer has the same RoPE
FULL = "full_attention"


@dataclass(frozen=True)
class LayerRotary:
    """How one attention layer rotates q and k, as relpos's ``rope`` states it.

    Attributes:
        layer_type: the config's layer type, whose ``rope_parameters`` give base and scaling.
        layout: relpos's pair layout (``"half"`` or ``"interleaved"``) after ``permutation``.
        rotary_dim: the number of rotated channels ``r``.
        head_dim: the channels of q and k ``D``.
        num_heads: the query heads of the layer.
        permutation: channel order that turns the model's pairs into relpos's ``layout``
            (``q[..., permutation]``), None when the model's order already is relpos's.
        axis_of_pair: for a model whose RoPE takes multi-axis positions (M-RoPE), the axis
            (0 = time, 1 = height, 2 = width) each of relpos's pairs follows (relpos's
            ``m-rope`` option of that name); None for 1-D RoPE.
        channel_sections: for a multi-axis RoPE whose sections split the doubled vector
            ``cat(theta, theta)`` per channel (HunYuanVL: the two channels of a pair may follow
            different axes), its ``mrope_section`` (relpos's ``m-rope`` with
            ``section_split="channels"``); None otherwise.
    """

    layer_type: str
    layout: str
    rotary_dim: int
    head_dim: int
    permutation: tuple[int, ...] | None = field(default=None)
    num_heads: int = 1
    axis_of_pair: tuple[int, ...] | None = None
    channel_sections: tuple[int, ...] | None = None

    @property
    def partial_rotary_factor(self) -> float:
        return self.rotary_dim / self.head_dim

    def key(self) -> tuple[Any, ...]:
        return (
            self.layer_type,
            self.layout,
            self.rotary_dim,
            self.head_dim,
            self.permutation,
            self.num_heads,
            self.axis_of_pair,
            self.channel_sections,
        )


@dataclass(frozen=True)
class RopeFacts:
    """The RoPE of one layer type, as relpos's ``rope`` options.

    Attributes:
        base: ``rope_theta``.
        partial_rotary_factor: fraction of the head's channels that rotate (Phi-3, NeoX).
        scaling: the HF scaling dict (``rope_type`` and its keys), None for plain RoPE.
        max_position_embeddings: ``config.max_position_embeddings`` (HF's reference length).
        model_applied: keys of the RoPE dict the model's attention applies itself
            (``MODEL_APPLIED_KEYS``), kept out of ``scaling``.
        mrope_section: the dict's M-RoPE sections (``mrope_section``: which position axis
            the channels follow, not their frequencies), kept out of ``scaling``; the probe
            checks them against the model (``probe.probe_position_axes``). None without.
    """

    base: float
    partial_rotary_factor: float = 1.0
    scaling: dict[str, Any] | None = None
    max_position_embeddings: int | None = None
    model_applied: dict[str, Any] = field(default_factory=dict)
    mrope_section: tuple[int, ...] | None = None

    def options(self) -> dict[str, Any]:
        """The keyword options of relpos's ``RoPE`` constructor that state this RoPE."""
        return {
            "base": self.base,
            "layout": "half",
            "partial_rotary_factor": self.partial_rotary_factor,
            "scaling": None if self.scaling is None else dict(self.scaling),
            "max_position_embeddings": self.max_position_embeddings,
        }


@dataclass(frozen=True)
class ModelFacts:
    """The sizes and RoPE of a transformers decoder (see the module docstring).

    ``rope`` maps a layer type to its RoPE; ``per_layer_type`` says that the config keys its
    ``rope_parameters`` by ``layer_types`` (a type absent from ``rope`` has no RoPE) or by
    RoPE labels that the attention modules name (``layer_types`` then holds each layer's
    label: DeepSeek-V4's ``"main"`` / ``"compress"``, ``model.rope_labels``), otherwise
    ``rope`` holds the one RoPE of every layer under ``FULL``. ``rotary_modules``:
    the decoder's modules that compute RoPE (``probe.rotary_modules``; ``rotary``: the first,
    None when it has none). From the probe: ``layers``, ``attention_layers`` (the layers that
    call attention), ``position_axes`` (the axes of the position ids the rotary modules
    receive: 3 for M-RoPE) and ``axes_refusal`` (why multi-axis positions that differ
    between axes cannot be run exactly, None when the layers' ``axis_of_pair`` state them).
    ``config``: the decoder's config (a vision-language model's text config)."""

    model_type: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    rope: dict[str, RopeFacts]
    layer_types: tuple[str, ...]
    decoder: nn.Module = field(repr=False, compare=False)
    rotary: nn.Module | None = field(repr=False, compare=False)
    rotary_modules: tuple[nn.Module, ...] = field(default=(), repr=False, compare=False)
    layers: tuple[LayerRotary | None, ...] | None = None
    per_layer_type: bool = False
    attention_layers: tuple[int, ...] | None = None
    position_axes: int = 1
    axes_refusal: str | None = None
    config: Any = field(default=None, repr=False, compare=False)

    def layer_rotary(self, layer_idx: int | None) -> LayerRotary | None:
        """How attention layer ``layer_idx`` rotates q and k (None: no RoPE); needs the
        facts of ``inspect_model(model, probe=True)``."""
        if self.layers is None:
            raise ValueError("relpos.interop.hf: the model was inspected without probe=True")
        if layer_idx is None or not 0 <= layer_idx < len(self.layers):
            raise ValueError(
                f"attention layer index {layer_idx!r} is not a layer of this {self.model_type} "
                f"model ({len(self.layers)} layers)"
            )
        return self.layers[layer_idx]

    def layer_type(self, layer_idx: int | None) -> str:
        """The layer type of attention layer ``layer_idx``: its RoPE's key in ``rope`` (a
        type missing there has no RoPE), or ``FULL`` for a model with one RoPE."""
        if not self.per_layer_type:
            return next(iter(self.rope))
        if layer_idx is None or not 0 <= layer_idx < len(self.layer_types):
            raise ValueError(
                f"attention layer index {layer_idx!r} is not a layer of this {self.model_type} "
                f"model ({len(self.layer_types)} layers)"
            )
        return self.layer_types[layer_idx]
