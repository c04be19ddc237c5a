"""How a transformers decoder rotates q and k, read from what its own code computes.

``probe_rotary(model, facts) -> tuple[LayerRotary | None, ...]`` (one entry per attention
layer) runs the model twice on a known input under a temporary attention function that
records the ``q`` and ``k`` each layer hands to attention (and returns zeros, so every
layer's input is the same in both runs):

* once with the model's RoPE switched off (its rotary modules, ``rotary_modules``, return
  the identity rotation, ``(cos, sin) = (1, 0)``, the complex ``1``, or a position table's
  row 0, ``position_table``): ``q_raw``,
  ``k_raw``, what ``relpos.interop.hf.patch`` receives;
* once as it is: ``q_rot``, ``k_rot``, what the model attends with.

Every row of the batch sits at one position ``p`` (``0, 1, 5, 37`` and the model's last
trained position), so ``q_rot = A(p) q_raw`` with one channel map ``A(p)`` per row. From the
least-squares fit of ``A(1)`` the probe reads which channels rotate, how they pair and in
which sense (``a' = a cos - b sin``, ``b' = a sin + b cos``: ``a`` first). The pairs, ordered
by their first channel, give a channel permutation onto relpos's ``layout="half"`` (pair
``i`` = channels ``(i, i + r/2)``), or no permutation when the model's pairs already are
relpos's ``half`` or ``interleaved`` layout over the first ``r`` channels. Then relpos's own
``rope`` with the config's ``rope_theta`` / scaling of the layer's type, ``r / D`` as
``partial_rotary_factor`` and that layout must reproduce ``q_rot`` and ``k_rot`` from
``q_raw`` and ``k_raw`` at every probed position (float32: to ``1e-4`` of the largest
entry). Conventions found this way (transformers 5.25): half-split pairs (Llama and most),
interleaved pairs (Cohere, Helium, Ernie 4.5), interleaved pairs in the first half of the
head (GLM, GLM-4: partial rotary), interleaved pairs over the first ``rotary_dim`` channels
(GPT-J, CodeGen: ``(sin, cos)`` from a position table, whose base ``table_base`` reads),
half-split pairs rotated the other way (NanoChat: ``R(-p)``, the half-split pairs with their
two channels swapped), layers without RoPE (Llama-4's NoPE
layers, SmolLM3, the full-attention layers of Beam and Ergo), p-RoPE (HF ``"proportional"``,
the global layers of Gemma-4 and LFM-3: half-split pairs ``(i, i + D/2)`` over the whole head
whose trailing frequencies are 0, so only the leading ``r/2`` pairs turn; relpos's ``rope``
with that scaling dict computes the same frequencies, and the probe counts the channels its
nonzero frequencies turn).

A layer whose ``q_rot`` / ``k_rot`` are not a rotation of ``q_raw`` / ``k_raw`` relpos can
state exactly raises ``ValueError`` naming the model, the layer and what was found. A layer
that attends with keys of its own after its tokens' keys (DeepSeek-V4's compressed keys) is
refused with the positions relpos's rope reproduces them at (``_probe_appended_keys``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from .facts import LayerRotary, ModelFacts

__all__ = [
    "LayerRotary",
    "probe_rotary",
    "probe_model",
    "probe_position_axes",
    "identity_rotation",
    "position_table",
    "table_base",
    "TableAtPositionZero",
    "rotary_modules",
    "is_rotary_module",
    "is_rotary_table",
    "hidden_width",
    "holds_inverse_frequencies",
    "PROBE_POSITIONS",
]

#: the positions the probe places its rows at (the model's last trained position is added)
PROBE_POSITIONS = (0, 1, 5, 37)


def holds_inverse_frequencies(module: nn.Module) -> bool:
    """Whether ``module`` keeps RoPE's inverse frequencies itself: a tensor (buffer or plain
    attribute) whose name ends in ``inv_freq`` (transformers' rotary modules: ``inv_freq``;
    ModernBERT's decoder: ``{layer_type}_inv_freq``)."""
    own = itertools.chain(module._buffers.items(), vars(module).items())
    return any(name.endswith("inv_freq") and torch.is_tensor(value) for name, value in own)


def is_rotary_module(name: str, module: nn.Module, hidden_size: int | None = None) -> bool:
    """Whether the submodule ``name`` computes RoPE, judged by what it is, not where it sits:
    it holds inverse frequencies (``holds_inverse_frequencies``), its class is a
    ``*RotaryEmbedding``, it is named ``rotary_emb``, or, given the model's ``hidden_size``,
    it indexes a rotary position table (``is_rotary_table``: RoFormer). transformers 5.25
    also keeps them under other names: LFM2-MoE's ``pos_emb``; ModernBERT's decoder, whose
    ``get_decoder()`` is its LM head; RoFormer's ``embed_positions``."""
    return (
        name.rsplit(".", 1)[-1] == "rotary_emb"
        or type(module).__name__.endswith("RotaryEmbedding")
        or holds_inverse_frequencies(module)
        or (hidden_size is not None and is_rotary_table(module, hidden_size))
    )


def is_rotary_table(module: nn.Module, hidden_size: int) -> bool:
    """Whether ``module`` indexes a table of sines and cosines by position
    (``position_table``) whose rows are narrower than the model's hidden states. An absolute
    sinusoidal embedding (Vaswani et al. 2017; transformers' Marian, BART-family and
    XGLM ``*SinusoidalPositionalEmbedding``) is added to the hidden states, so its rows are
    as wide as they are; a narrower row of ``sin | cos`` is the rotation of one attention
    head: RoFormer's ``RoFormerSinusoidalPositionalEmbedding`` (Su et al. 2021, "RoFormer:
    Enhanced Transformer with Rotary Position Embedding", arXiv:2104.09864; rows of
    ``hidden_size / num_attention_heads``, which its self-attention turns interleaved pairs
    by)."""
    table = position_table(module)
    return table is not None and int(table.shape[-1]) < int(hidden_size)


def hidden_width(module: nn.Module) -> int | None:
    """The width of the hidden states of a transformers model (its text config's
    ``hidden_size``, or ``d_model`` / ``n_embd``), None for a module without a config."""
    config = getattr(module, "config", None)
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            config = get(decoder=True) or config
        except TypeError:
            config = get() or config
    for key in ("hidden_size", "d_model", "n_embd"):
        try:
            value = getattr(config, key, None)
        except Exception:  # noqa: BLE001 - per-layer attributes raise on the global read
            value = None
        if isinstance(value, int) and value > 0:
            return value
    return None


def rotary_modules(decoder: nn.Module, hidden_size: int | None = None) -> list[nn.Module]:
    """The modules under ``decoder`` that compute its RoPE (``is_rotary_module``, with the
    model's ``hidden_size``, read from ``decoder.config`` when not given; the outermost of
    nested ones): the decoder's own rotary module and per-layer ones (Moshi, DeepSeek-V4's
    compressors). Whether each returns a rotation the patch can switch off is checked when it
    runs (``identity_rotation``)."""
    if hidden_size is None:
        hidden_size = hidden_width(decoder)
    found: list[nn.Module] = []
    inside: list[str] = []
    for name, module in decoder.named_modules():
        if not name or any(name.startswith(prefix) for prefix in inside):
            continue
        if is_rotary_module(name, module, hidden_size) and all(module is not m for m in found):
            found.append(module)
            inside.append(name + ".")
    return found


def position_table(module: nn.Module) -> Tensor | None:
    """The table of sines and cosines by position that a rotary module indexes instead of
    keeping inverse frequencies, or None: a 2-D floating buffer or frozen parameter
    (``requires_grad`` False: RoFormer's ``nn.Embedding`` weight) (positions x 2m) whose row 0,
    the rotation at position 0, is ``sin 0 = 0`` in one half of the row and ``cos 0 = 1`` in
    the other. GPT-J's and CodeGen's rotary modules keep such a table, ``embed_positions``
    (``sin | cos`` of ``p * 10000^(-2i/r)``, EleutherAI's mesh-transformer-jax layout;
    transformers ``models/gptj/modeling_gptj.py``, ``create_sinusoidal_positions``), and
    return ``(sin, cos)``, the reverse of the ``(cos, sin)`` of the other rotary modules;
    RoFormer's ``RoFormerSinusoidalPositionalEmbedding`` is such a table (``sin | cos``, one
    attention head wide) and returns its rows."""
    if holds_inverse_frequencies(module):
        return None
    frozen = (p for p in module._parameters.values() if p is not None and not p.requires_grad)
    for table in itertools.chain(module._buffers.values(), frozen):
        if table is None or table.dim() != 2 or not table.is_floating_point() or table.is_meta:
            continue
        rows, width = table.shape
        if rows < 2 or width % 2:
            continue
        first = table[0]
        zeros, ones = first == 0, first == 1
        m = width // 2
        if bool(zeros[:m].all() and ones[m:].all()) or bool(ones[:m].all() and zeros[m:].all()):
            return table
    return None


def table_base(table: Tensor) -> float:
    """The RoPE base ``b`` of a position table (``position_table``): row ``p`` holds ``sin``
    and ``cos`` of ``p * b^(-2i/r)`` for the ``r/2`` pairs ``i`` of its ``r`` channels. Each
    pair's frequency is the least-squares slope of its angle (``atan2(sin, cos)`` unwrapped
    over the positions); ``log b`` is the least-squares fit of ``-(r / 2i) log`` of the
    frequencies ``i >= 1``. The table is float32, so ``b`` is known to float32 precision (the
    probe then checks relpos's rope with it against the model's rotation). ``ValueError``
    when the first frequency is not 1 (a table that is not ``b^(-2i/r)``). With one pair the
    base does not matter (its frequency is 1 for every base): 10000."""
    rows, width = table.shape
    m = width // 2
    t = table.detach().double().cpu()
    sin_first = bool((t[0, :m] == 0).all())
    sin, cos = (t[:, :m], t[:, m:]) if sin_first else (t[:, m:], t[:, :m])
    step = torch.atan2(sin, cos).diff(dim=0)
    step = torch.remainder(step + math.pi, 2 * math.pi) - math.pi  # |frequency| < pi
    angle = torch.cat([torch.zeros(1, m, dtype=t.dtype), step.cumsum(0)])
    p = torch.arange(rows, dtype=t.dtype)[:, None]
    freq = (p * angle).sum(0) / (p * p).sum()
    if not abs(float(freq[0]) - 1.0) <= 1e-5:
        raise ValueError(
            f"relpos.interop.hf: the rotary module's position table turns its first pair by "
            f"{float(freq[0]):.6g} rad per position, not 1: not a RoPE table p * b^(-2i/r)"
        )
    if m == 1:
        return 10000.0
    exponent = 2 * torch.arange(1, m, dtype=t.dtype) / width
    log_base = -(exponent * freq[1:].log()).sum() / (exponent * exponent).sum()
    return float(log_base.exp())


class TableAtPositionZero:
    """While installed, a rotary module that indexes a position table (``position_table``)
    computes its output at position 0 for every position it is asked for: the identity
    rotation, in its own order and dtype, also at positions past the table's last row, which
    its forward could not index (the patch's methods then run there; the model alone cannot).
    Its hooks still receive the positions it was called with. ``remove()`` restores it."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        # a forward set on the instance before (accelerate's device hooks) is put back
        self.previous = vars(module).get("forward")
        forward = module.forward

        def at_position_zero(*args: Any, **kwargs: Any) -> Any:
            if torch.is_tensor(kwargs.get("position_ids")):
                kwargs["position_ids"] = torch.zeros_like(kwargs["position_ids"])
            elif len(args) > 1 and torch.is_tensor(args[1]):
                args = (args[0], torch.zeros_like(args[1]), *args[2:])
            return forward(*args, **kwargs)

        module.forward = self.installed = at_position_zero

    def remove(self) -> None:
        if vars(self.module).get("forward") is not self.installed:
            return  # already removed
        if self.previous is None:
            del vars(self.module)["forward"]
        else:
            self.module.forward = self.previous


def identity_rotation(output: Any, where: str, module: nn.Module | None = None) -> Any:
    """The output of a rotary module with its rotation replaced by the identity: ``(cos,
    sin) -> (1, 0)``, a complex ``e^{i theta}`` tensor (Llama-4) -> ``1``; for a ``module``
    that indexes a position table (``position_table``: GPT-J's ``(sin, cos)``), the table's
    row at position 0 in the module's own order, split as its output is. ``ValueError``
    naming ``where`` for any other output."""
    table = None if module is None else position_table(module)
    if table is not None:
        return _table_identity(output, table[0], where)
    if isinstance(output, tuple) and len(output) == 2 and all(map(torch.is_tensor, output)):
        cos, sin = output
        return torch.ones_like(cos), torch.zeros_like(sin)
    if torch.is_tensor(output) and output.is_complex():
        return torch.ones_like(output)
    raise ValueError(
        f"relpos.interop.hf: {where} returned {type(output).__name__}; expected (cos, sin) or "
        "a complex rotation tensor, so its RoPE cannot be switched off"
    )


def _table_identity(output: Any, first: Tensor, where: str) -> Any:
    """``output`` (a tensor, or a tuple of tensors that split a table row in order) with
    every row replaced by ``first``, the table's row at position 0 (the identity)."""
    parts = (output,) if torch.is_tensor(output) else output
    widths = [t.shape[-1] for t in parts] if isinstance(parts, tuple) else []
    if not widths or not all(map(torch.is_tensor, parts)) or sum(widths) != first.shape[-1]:
        raise ValueError(
            f"relpos.interop.hf: {where} indexes a table of sines and cosines by position, "
            f"but returned {type(output).__name__} that does not split its rows of "
            f"{first.shape[-1]} entries, so its RoPE cannot be switched off"
        )
    out, start = [], 0
    for t, width in zip(parts, widths, strict=True):
        row = first[start : start + width].to(device=t.device, dtype=t.dtype)
        out.append(row.expand(t.shape).clone())
        start += width
    return out[0] if torch.is_tensor(output) else tuple(out)


@contextmanager
def _capture(
    model: nn.Module, records: list[tuple[Any, Tensor, Tensor]], output: str = "zeros"
) -> Iterator[None]:
    """A temporary attention implementation that records ``(layer_idx, q, k)`` per call and
    returns, per query: zeros (``output="zeros"``), one fixed nonzero pattern of heads and
    channels that depends on no input (``"fixed"``), or the value of the query's own token
    (``"own value"``: query ``i`` of a forward without a cache gets value ``i``, its
    key-value head's; keys a layer appends after its tokens' are not read)."""
    import transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = f"relpos_probe_{id(records)}"

    def record(module, query, key, value, attention_mask, **kwargs):
        records.append((getattr(module, "layer_idx", None), query.detach(), key.detach()))
        b, heads, lq, _ = query.shape
        out = query.new_zeros(b, lq, heads, value.shape[-1])
        if output == "fixed":
            pattern = torch.arange(heads * value.shape[-1], device=query.device)
            pattern = (0.7 * pattern.to(query.dtype) + 0.3).sin().view(heads, -1)
            out = out + pattern
        elif output == "own value":
            own = value[:, :, :lq].repeat_interleave(heads // value.shape[1], dim=1)
            out = own.transpose(1, 2).to(out.dtype)
        return out, None

    transformers.AttentionInterface.register(name, record)
    AttentionMaskInterface.register(name, sdpa_mask)
    previous = model.config._attn_implementation
    try:
        model.set_attn_implementation(name)
        yield
    finally:
        model.set_attn_implementation(previous)
        transformers.AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)


def _received_positions(args: tuple, kwargs: dict[str, Any]) -> Tensor | None:
    """The ``position_ids`` a rotary module was called with (``forward(x, position_ids)``)."""
    position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    return position_ids if torch.is_tensor(position_ids) else None


def _run(model, ids, pos, rotary: list[nn.Module], identity: bool, seen: list | None = None):
    """The ``(layer_idx, q, k)`` records of one forward; ``seen`` collects the position ids
    the rotary modules received."""
    records: list[tuple[Any, Tensor, Tensor]] = []
    hooks = []
    if seen is not None:
        for module in rotary:
            hooks.append(
                module.register_forward_pre_hook(
                    lambda m, a, kw: seen.append(_received_positions(a, kw)), with_kwargs=True
                )
            )
    if identity:
        for module in rotary:
            where = type(module).__name__
            hooks.append(
                module.register_forward_hook(
                    lambda m, a, out, w=where: identity_rotation(out, w, m)
                )
            )
    try:
        with _capture(model, records), torch.no_grad():
            model(input_ids=ids, position_ids=pos, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return records


def _calls_of(records, facts: ModelFacts) -> dict[int, list[tuple[Tensor, Tensor]]]:
    """Every attention call's ``(q, k)`` per ``layer_idx``, in call order: modules that number
    their layers alike (HRM-Text's two stacks, BLT's four models) call one ``layer_idx`` more
    than once, and the patch applies one rotation per ``layer_idx``."""
    out: dict[int, list[tuple[Tensor, Tensor]]] = {}
    for layer_idx, q, k in records:
        if layer_idx is None:
            raise ValueError(
                f"relpos.interop.hf: the attention modules of {facts.model_type} have no "
                "layer_idx, so the patch cannot tell its layers apart"
            )
        out.setdefault(int(layer_idx), []).append((q, k))
    return out


def _layer_of(records, facts: ModelFacts) -> dict[int, tuple[Tensor, Tensor]]:
    """The first attention call's ``(q, k)`` per ``layer_idx`` (``_calls_of``)."""
    return {layer: calls[0] for layer, calls in _calls_of(records, facts).items()}


def _rotary_state(module: nn.Module) -> tuple[dict, dict]:
    """A rotary module's buffers and plain attributes (dynamic NTK keeps the longest length
    it has seen and its frequencies there): the probe's far positions must not change them."""
    buffers = {k: None if v is None else v.clone() for k, v in module._buffers.items()}
    plain = {
        k: (v.clone() if torch.is_tensor(v) else v)
        for k, v in vars(module).items()
        if not k.startswith("_") and not isinstance(v, nn.Module)
    }
    return buffers, plain


def _restore(module: nn.Module, state: tuple[dict, dict]) -> None:
    buffers, plain = state
    for k, v in buffers.items():
        module._buffers[k] = v
    for k, v in plain.items():
        setattr(module, k, v)


def _joined_calls(near: dict, far: dict) -> dict[int, list[tuple[Tensor, Tensor]]]:
    """The records of the near and the far run, one batch per call of each layer
    (``_calls_of``): call i of the near run with call i of the far run; a layer called a
    different number of times in the two runs keeps the calls both made (never mixed ones)."""
    return {
        layer: [
            tuple(torch.cat((a, b)) for a, b in zip(n, f, strict=True))
            for n, f in zip(near[layer], far[layer], strict=False)
        ]
        for layer in near
        if layer in far
    }


def _probe_shared_layer(facts, layer, raw_calls, rot_calls, pos, create) -> LayerRotary | None:
    """``_probe_layer`` on every attention call of one ``layer_idx``: the first call's
    rotation, provided every other call of that ``layer_idx`` rotates the same way. Stacks
    that share layer numbers and rotation (HRM-Text) pass; a second call that rotates
    otherwise (another position source, another RoPE) is refused by name, since the patch
    applies one rotation per ``layer_idx`` and would turn that call silently wrong."""
    if len(raw_calls) != len(rot_calls):
        raise ValueError(
            f"relpos.interop.hf: {facts.model_type} layer {layer}: attention is called "
            f"{len(raw_calls)} times with the model's RoPE switched off and {len(rot_calls)} "
            "times with it"
        )
    shared = (
        f"relpos.interop.hf: {facts.model_type} layer {layer}: {len(raw_calls)} attention "
        f"calls share layer_idx {layer} (modules that number their layers alike), and the "
        "patch applies one rotation per layer_idx"
    )
    try:
        found = _probe_layer(facts, layer, raw_calls[0], rot_calls[0], pos, create)
    except ValueError as err:
        if len(raw_calls) == 1:
            raise
        raise ValueError(f"{shared}; call 1: {err}") from None
    for i in range(1, len(raw_calls)):
        try:
            other = _probe_layer(facts, layer, raw_calls[i], rot_calls[i], pos, create)
        except ValueError as err:
            raise ValueError(f"{shared}; call {i + 1}: {err}") from None
        if other != found:
            raise ValueError(f"{shared}; call 1 rotates as {found}, call {i + 1} as {other}")
    return found


def _pairs(raw: Tensor, rot: Tensor, rotated: list[int], what: str) -> list[tuple[int, int]]:
    """The pairs ``(a, b)``, ``a < b``, of the ``rotated`` channels at one position (``raw``,
    ``rot``: samples x D): channel ``j`` pairs with the ``c`` for which
    ``rot_j ~ alpha raw_j + beta raw_c`` fits best (a two-column least-squares fit per
    candidate, robust to q/k that span a subspace, e.g. after a LayerNorm)."""
    x, y = raw.double(), rot.double()
    idx = torch.tensor(rotated, device=x.device)
    xr = x[:, idx]
    gram = xr.T @ xr  # (r, r)
    cross = xr.T @ y[:, idx]  # cross[c, j] = x_c . y_j
    pairs: set[tuple[int, int]] = set()
    partner_of: dict[int, int] = {}
    for n, j in enumerate(rotated):
        a11, a12, a22 = gram[n, n], gram[n], gram.diagonal()
        b1, b2 = cross[n, n], cross[:, n]
        det = a11 * a22 - a12 * a12
        explained = (a22 * b1 * b1 - 2 * a12 * b1 * b2 + a11 * b2 * b2) / det.clamp(min=1e-300)
        explained[n] = -math.inf
        explained[det <= 1e-12 * a11 * a22] = -math.inf
        partner_of[j] = rotated[int(explained.argmax())]
    for j, c in partner_of.items():
        if partner_of.get(c) != j:
            raise ValueError(
                f"{what}: channel {j} rotates with {c}, but {c} with {partner_of.get(c)}"
            )
        pairs.add((min(j, c), max(j, c)))
    return sorted(pairs)


def _layout(
    pairs: list[tuple[int, int]], head_dim: int, span: int
) -> tuple[str, tuple[int, ...] | None]:
    """relpos's layout and the channel permutation (None: the identity) for the pairs ``(a,
    b)`` (``a' = a cos - b sin``), in the order of their first channel. ``span``: the
    channels relpos's encoding of the layer's RoPE pairs over; where it is wider than the
    rotated channels (p-RoPE, HF ``"proportional"``: trailing frequencies 0), the pairs
    ``(i, i + span/2)`` of its leading frequencies are its own ``half`` layout."""
    r = 2 * len(pairs)
    for width in dict.fromkeys((r, span)):
        if width >= r and pairs == [(i, i + width // 2) for i in range(r // 2)]:
            return "half", None
    if pairs == [(2 * i, 2 * i + 1) for i in range(r // 2)]:
        return "interleaved", None
    used = {c for ab in pairs for c in ab}
    order = [a for a, _ in pairs] + [b for _, b in pairs]
    order += [c for c in range(head_dim) if c not in used]
    return "half", tuple(order)


def _describe(pairs: list[tuple[int, int]]) -> str:
    shown = ", ".join(f"({a},{b})" for a, b in pairs[:4])
    return f"{len(pairs)} pairs {shown}{', ...' if len(pairs) > 4 else ''}"


def _config(model: nn.Module, facts: ModelFacts) -> Any:
    """The decoder's config (a vision-language model's text config)."""
    return model.config if facts.config is None else facts.config


def probe_rotary(model: nn.Module, facts: ModelFacts) -> tuple[LayerRotary | None, ...]:
    """The ``LayerRotary`` of each attention layer (None: the layer applies no RoPE); see
    the module docstring. ``ValueError`` naming the model, the layer and what was found
    when relpos's ``rope`` cannot reproduce a layer's rotation exactly."""
    return _probe(model, facts)[0]


def probe_model(model: nn.Module, facts: ModelFacts) -> ModelFacts:
    """``facts`` with what the model's own code shows: each attention layer's rotation
    (``probe_rotary``), which layers call attention, and, for a model whose rotary module
    receives multi-axis position ids (M-RoPE: ``(3, B, L)``), the axis each rotated pair
    follows (``probe_position_axes``)."""
    layers, attention_layers, axes = _probe(model, facts)
    facts = replace(facts, layers=layers, attention_layers=attention_layers, position_axes=axes)
    return probe_position_axes(model, facts) if axes > 1 else facts


def _probe(
    model: nn.Module, facts: ModelFacts
) -> tuple[tuple[LayerRotary | None, ...], tuple[int, ...], int]:
    """The layers' rotations, the attention layers and the number of position axes the
    rotary modules received (1: ``(B, L)`` ids)."""
    from ...encodings.registry import create

    rotary = list(facts.rotary_modules)
    if not rotary:
        raise ValueError(no_rotary_reason(model, facts))
    device = next(iter(model.parameters())).device
    # the last position below the trained length: transformers' dynamic NTK goes back to its
    # base frequencies only for calls shorter than that length
    last = int(getattr(_config(model, facts), "max_position_embeddings", 64) or 64) - 2
    # near positions within the trained length: length-dependent scalings (dynamic NTK,
    # LongRoPE) then use their base frequencies, whatever the rotary module saw before
    near = sorted({p for p in (*PROBE_POSITIONS, last) if p <= last} or {0})
    tokens = facts.head_dim + 8
    vocab = int(getattr(_config(model, facts), "vocab_size", 2) or 2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (len(near) + 1, tokens), generator=gen).to(device)
    pos = torch.tensor([*near, _far_position(facts)], device=device)[:, None]
    pos = pos.expand(-1, tokens).contiguous()
    was_training = model.training
    model.eval()
    saved = [_rotary_state(module) for module in rotary]
    try:
        # the far row alone: length-dependent scalings (dynamic NTK) read the largest position
        # of a call, so it must not set the frequencies of the near rows
        seen: list[Tensor | None] = []
        runs = {
            identity: [
                _calls_of(_run(model, ids[rows], pos[rows], rotary, identity, seen=seen), facts)
                for rows in (slice(0, len(near)), slice(len(near), None))
            ]
            for identity in (True, False)
        }
    finally:
        model.train(was_training)
        for module, state in zip(rotary, saved, strict=True):
            _restore(module, state)
    raw, rot = (_joined_calls(*runs[identity]) for identity in (True, False))
    if set(raw) != set(rot) or not raw:
        raise ValueError(
            f"relpos.interop.hf: the {facts.model_type} model called attention in different "
            "layers with and without its RoPE"
        )
    _refuse_unnumbered_rotation(facts, raw, rot)
    out: list[LayerRotary | None] = []
    for layer in range(facts.num_layers):
        if layer not in raw:
            out.append(None)  # no attention in this layer (a recurrent / linear layer)
            continue
        out.append(_probe_shared_layer(facts, layer, raw[layer], rot[layer], pos, create))
    nope = [layer for layer in sorted(raw) if 0 <= layer < len(out) and out[layer] is None]
    if nope:
        first = {
            layer: (calls[0][0][:1], calls[0][1][:1]) for layer, calls in runs[True][0].items()
        }
        there = near[-1] if len(near) > 1 else _far_position(facts)
        _refuse_hidden_positions(model, facts, ids[:1], there, first, nope, rotary)
    axes = max((int(p.shape[0]) for p in seen if p is not None and p.dim() == 3), default=1)
    return tuple(out), tuple(sorted(raw)), axes


def _refuse_unnumbered_rotation(facts: ModelFacts, raw: dict, rot: dict) -> None:
    """Refuse attention calls that rotate q and k from a module whose ``layer_idx`` is not
    one of the model's layers (``0 .. num_layers - 1``): Zamba2's shared attention block
    (``Zamba2Attention(layer_idx=-1)``, told the calling layer by a forward argument the
    attention function does not receive) rotates with RoPE when ``use_mem_rope`` is set.
    The patch applies one rotation per ``layer_idx``, so it cannot tell which layer such a
    call belongs to; calls that do not rotate are left alone."""
    for layer in sorted(raw):
        if 0 <= layer < facts.num_layers or layer not in rot:
            continue
        for (q_raw, k_raw), (q_rot, k_rot) in zip(raw[layer], rot[layer], strict=False):
            tol = max(_tolerance(q_rot), _tolerance(k_rot))
            moved = max(
                float((q_rot - q_raw).abs().max()) if q_rot.shape == q_raw.shape else math.inf,
                float((k_rot - k_raw).abs().max()) if k_rot.shape == k_raw.shape else math.inf,
            )
            if moved > tol:
                raise ValueError(
                    f"relpos.interop.hf: the {facts.model_type} model rotates q and k in an "
                    f"attention module whose layer_idx ({layer}) is not one of its "
                    f"{facts.num_layers} layers (an attention block shared by several layers "
                    "that is told the calling layer in its forward, e.g. Zamba2's with "
                    "use_mem_rope), so the patch cannot tell which layer a call belongs to"
                )


def _off_scale(before: Tensor, after: Tensor) -> float:
    """How far ``after`` is from a multiple of ``before``, per head and token (the largest
    entry of ``after - c before``, ``c`` fitted per vector): zero for q/k that a
    position-dependent temperature scales (the NoPE layers of Llama-4,
    ``attn_temperature_tuning``, and of Beam), which the model keeps computing from its own
    position ids under the patch; a rotation by any turning pair leaves a remainder."""
    x, y = before.double(), after.double()
    c = (x * y).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True).clamp(min=1e-300)
    return float((y - c * x).abs().max())


def _refuse_hidden_positions(
    model: nn.Module,
    facts: ModelFacts,
    ids: Tensor,
    position: int,
    at_first: dict[int, tuple[Tensor, Tensor]],
    nope_layers: list[int],
    rotary: list[nn.Module],
) -> None:
    """Refuse a layer taken for NoPE (its q/k do not change when the found rotary modules
    return the identity) whose raw q/k still depend on the position ids other than by a
    scale per vector (``_off_scale``): a module the probe
    did not find (``rotary_modules``) rotates it, so any method but ``rope`` would be silently
    wrong there. ``at_first``: each layer's raw ``(q, k)`` of the one row ``ids`` at the
    probe's first position (the identity run); the same row runs again, rotary modules
    switched off, with every token at ``position``."""
    device = ids.device
    pos = torch.full_like(ids, position, device=device)
    was_training = model.training
    model.eval()
    saved = [_rotary_state(module) for module in rotary]
    try:
        there = _layer_of(_run(model, ids, pos, rotary, identity=True), facts)
    finally:
        model.train(was_training)
        for module, state in zip(rotary, saved, strict=True):
            _restore(module, state)
    for layer in nope_layers:
        (q0, k0), (q1, k1) = at_first[layer], there[layer]
        tol = max(_tolerance(q0), _tolerance(k0))
        moved = max(_off_scale(q0, q1), _off_scale(k0, k1))
        if moved > tol:
            found = ", ".join(type(m).__name__ for m in rotary) or "none"
            raise ValueError(
                f"relpos.interop.hf: {facts.model_type} layer {layer}'s queries/keys depend on "
                "position ids through a module the probe did not find: with the rotary "
                f"modules it found ({found}) returning the identity rotation, its q/k at "
                f"position {position} differ from a multiple of those at the first probe "
                f"position by {moved:.3g} (tolerance {tol:.3g}), so the layer is not NoPE "
                "and relpos "
                "cannot replace its position encoding"
            )


def probe_position_axes(model: nn.Module, facts: ModelFacts) -> ModelFacts:
    """The axis (0 = time, 1 = height, 2 = width: the rows of the model's ``(3, B, L)``
    position ids) each rotated pair of each layer follows, read from the model's own code as
    ``probe_rotary`` reads its rotation, into ``LayerRotary.axis_of_pair`` (relpos's
    ``m-rope``, whose pair ``p`` turns by ``pos[axis_of_pair[p]] * theta_p``: Qwen2-VL's
    sections, Qwen3-VL's interleaved cycle, Ernie 4.5 VL's alternation; M-RoPE is Wang et al.
    2024, "Qwen2-VL", arXiv:2409.12191).

    One row per axis sits at the far position on that axis and 0 on the others: the pairs
    that turn in it follow that axis. Then relpos's ``m-rope`` with those axes and the
    layer's probed options must reproduce the model's q and k at near positions that differ
    between axes (constant rows and an image-like grid).

    A layer whose pairs do not each follow one axis (or a model with 4 axes), where the
    config's RoPE dict has ``mrope_section``, is tried as a split of the doubled vector
    ``cat(theta, theta)`` per channel (HunYuanVL, transformers
    ``models/hunyuan_vl/modeling_hunyuan_vl.py``, ``recomposition_frequencies``: bands of
    ``2 * section`` channels, the two channels of a pair possibly on different axes):
    relpos's ``m-rope`` with ``section_split="channels"`` and those sections must reproduce
    the model's q and k at the near rows, into ``LayerRotary.channel_sections``.
    Where it reproduces them only up to one scale per head vector, the model normalizes q and
    k after its RoPE (HunYuanVL's ``query_layernorm`` / ``key_layernorm``, an RMSNorm of each
    head after ``apply_rotary_pos_emb``): on positions that differ between axes that channel
    map is not a rotation, so it changes the vector's norm and the norm the model divides by
    is not the one of the q and k the patch receives, which relpos would turn after it.

    Where no m-rope reproduces the model (or the model takes other than 3 or 4 axes),
    ``facts.axes_refusal`` says why, and the patch refuses position ids that differ between
    axes; text positions (equal on every axis) stay exact."""
    from ...encodings.registry import create

    name = f"relpos.interop.hf: {facts.model_type}"
    n_axes = facts.position_axes
    if n_axes not in (3, 4):
        return replace(
            facts,
            axes_refusal=f"{name}'s rotary module takes {n_axes} position axes; relpos's "
            "m-rope takes 3 (time, height, width) or 4 (sections of 4 axes)",
        )
    rotary = list(facts.rotary_modules)
    device = next(iter(model.parameters())).device
    last = int(getattr(_config(model, facts), "max_position_embeddings", 64) or 64) - 2
    near = sorted({p for p in (*PROBE_POSITIONS, last) if p <= last} or {0})
    tokens = facts.head_dim + 8
    far = torch.zeros(n_axes, n_axes, tokens, dtype=torch.long)
    for axis in range(n_axes):
        far[axis, axis] = _far_position(facts)
    grid = torch.arange(tokens)
    rows = [
        [near[(i + shift) % len(near)] for i in range(n_axes)] for shift in range(1, len(near) + 1)
    ]
    close = torch.tensor(rows)[:, :, None].expand(-1, -1, tokens).permute(1, 0, 2).clone()
    side = max(2, int(math.isqrt(tokens)))  # an image-like grid: one time, rows, columns
    image = [torch.full_like(grid, near[-1] // 2), grid // side, grid % side]
    image += [torch.full_like(grid, 1)] * (n_axes - 3)  # an image index
    image = torch.stack(image)
    close = torch.cat([close, image[:, None].clamp(max=last)], dim=1).to(device)
    far = far.to(device)
    vocab = int(getattr(_config(model, facts), "vocab_size", 2) or 2)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (close.shape[1] + n_axes, tokens), generator=gen).to(device)
    was_training = model.training
    model.eval()
    saved = [_rotary_state(module) for module in rotary]
    try:
        runs = {
            identity: [
                _layer_of(_run(model, ids[:n_axes], far, rotary, identity), facts),
                _layer_of(_run(model, ids[n_axes:], close, rotary, identity), facts),
            ]
            for identity in (True, False)
        }
    except (RuntimeError, ValueError) as err:
        return replace(
            facts, axes_refusal=f"{name} does not run on ({n_axes}, B, L) position ids ({err})"
        )
    finally:
        model.train(was_training)
        for module, state in zip(rotary, saved, strict=True):
            _restore(module, state)
    layers = list(facts.layers or ())
    for layer, spec in enumerate(layers):
        if spec is None:
            continue
        what = f"{name} layer {layer}"
        (q_far, _), (q_far_rot, _) = runs[True][0][layer], runs[False][0][layer]
        if n_axes == 3:
            axes = _axes_of_pairs(spec, q_far, q_far_rot, what)
        else:
            axes = f"{what}: the rotary module takes 4 position axes; relpos's m-rope turns "
            axes += "pairs by 3 (axis_of_pair)"
        options = facts.rope[spec.layer_type].options()
        options.update(layout=spec.layout, partial_rotary_factor=spec.partial_rotary_factor)
        if isinstance(axes, str):
            channels = _channel_sections(facts, spec, runs, layer, far, close, options, what)
            if isinstance(channels, str):
                return replace(facts, axes_refusal=f"{axes}; {channels}")
            layers[layer] = replace(spec, channel_sections=channels)
            continue
        try:
            enc = create(
                "m-rope",
                num_heads=spec.num_heads,
                head_dim=spec.head_dim,
                axis_of_pair=axes,
                **options,
            )
        except (TypeError, ValueError) as err:
            return replace(facts, axes_refusal=f"{what}: relpos's m-rope refuses ({err})")
        (q_raw, k_raw), (q_rot, k_rot) = runs[True][1][layer], runs[False][1][layer]
        tol = max(_tolerance(q_rot), _tolerance(k_rot))
        pos = close.permute(1, 2, 0)  # (B, L, 3), relpos's m-rope positions
        every = slice(0, pos.shape[0])
        err = _rotation_error(enc.to(q_raw.device), spec, q_raw, q_rot, k_raw, k_rot, pos, every)
        if not err <= tol:
            return replace(
                facts,
                axes_refusal=f"{what}: relpos's m-rope with the probed pair axes "
                f"{_describe_axes(axes)} differs from the model's multi-axis rotation by "
                f"{err:.3g} (tolerance {tol:.3g})",
            )
        layers[layer] = replace(spec, axis_of_pair=tuple(axes))
    return replace(facts, layers=tuple(layers))


def _channel_sections(facts, spec, runs, layer, far, close, options, what) -> tuple | str:
    """The config's ``mrope_section`` where relpos's ``m-rope`` with
    ``section_split="channels"`` and those sections reproduces the layer's q and k at the
    near rows, positions that differ between axes (``probe_position_axes``); else the reason
    (str), naming a match up to one scale per head vector (a norm of q and k after RoPE)."""
    from ...encodings.registry import create

    sections = facts.rope[spec.layer_type].mrope_section
    if sections is None:
        return "the config's RoPE dict has no mrope_section to split its channels by"
    if spec.layout != "half" or spec.permutation is not None:
        return (
            f"the config's mrope_section {list(sections)} splits the half layout's doubled "
            f"vector per channel, but the layer's pairs are {spec.layout!r}"
            f"{' permuted' if spec.permutation is not None else ''}"
        )
    if len(sections) != far.shape[0]:
        return (
            f"the config's mrope_section {list(sections)} names {len(sections)} axes, the "
            f"rotary module takes {far.shape[0]}"
        )
    try:
        enc = create(
            "m-rope",
            num_heads=spec.num_heads,
            head_dim=spec.head_dim,
            mrope_section=list(sections),
            section_split="channels",
            **options,
        )
    except (TypeError, ValueError) as err:
        return f"relpos's m-rope with section_split='channels' refuses ({err})"
    worst, worst_scaled, tol = 0.0, 0.0, 0.0
    # the near rows (the far ones have float32 angle error in the model; probe_rotary)
    for run, positions in ((1, close),):
        (q_raw, k_raw), (q_rot, k_rot) = runs[True][run][layer], runs[False][run][layer]
        tol = max(tol, _tolerance(q_rot), _tolerance(k_rot))
        pos = positions.permute(1, 2, 0)  # (B, L, axes)
        every = slice(0, pos.shape[0])
        enc = enc.to(q_raw.device)
        worst = max(worst, _rotation_error(enc, spec, q_raw, q_rot, k_raw, k_rot, pos, every))
        worst_scaled = max(
            worst_scaled,
            _rotation_error(enc, spec, q_raw, q_rot, k_raw, k_rot, pos, every, scaled=True),
        )
    if worst <= tol:
        return tuple(sections)
    described = (
        f"relpos's m-rope with section_split='channels' and the config's mrope_section "
        f"{list(sections)}"
    )
    if worst_scaled <= tol:
        return (
            f"{described} gives the model's multi-axis q and k only up to one scale per head "
            f"vector (off by {worst:.3g}, rescaled {worst_scaled:.3g}; tolerance {tol:.3g}): "
            "the model normalizes q and k after its RoPE (an RMSNorm of each head, e.g. "
            "HunYuanVL's query_layernorm / key_layernorm after apply_rotary_pos_emb), and on "
            "positions that differ between axes that channel map is not a rotation, so it "
            "changes the norm the model divides by; the patch receives q and k normalized "
            "before any rotation"
        )
    return (
        f"{described} differs from the model's multi-axis rotation by {worst:.3g} "
        f"(tolerance {tol:.3g})"
    )


def _axes_of_pairs(spec: LayerRotary, raw: Tensor, rot: Tensor, what: str) -> list[int] | str:
    """The axis of each of relpos's pairs (in ``spec``'s layout after its permutation): row
    ``a`` of ``raw`` / ``rot`` is at the far position on axis ``a`` only. A refusal (str)
    where a pair turns with no axis or with several."""
    perm = list(spec.permutation) if spec.permutation is not None else list(range(raw.shape[-1]))
    tol = _tolerance(rot)
    moved = (rot[..., perm] - raw[..., perm]).abs().amax(dim=(1, 2)) > tol  # (3, D)
    half = spec.rotary_dim // 2
    axes: list[int] = []
    for p in range(half):
        a, b = (p, p + half) if spec.layout == "half" else (2 * p, 2 * p + 1)
        turning = [axis for axis in range(3) if bool(moved[axis, a] or moved[axis, b])]
        if len(turning) != 1:
            return (
                f"{what}: rotated pair {p} turns with position axes {turning}, not with one; "
                "relpos's m-rope turns each pair by one axis"
            )
        axes.append(turning[0])
    return axes


def _describe_axes(axes: list[int]) -> str:
    return "".join("THW"[a] for a in axes)


def no_rotary_reason(model: nn.Module, facts: ModelFacts) -> str:
    """The refusal of a model whose decoder has no rotary module (``rotary_modules``): its
    layers get no RoPE the patch could replace."""
    decoder = facts.decoder
    why = ""
    if hasattr(decoder, "rotary_emb") and decoder.rotary_emb is None:
        kind = getattr(_config(model, facts), "position_embedding_type", "absent")
        why = (
            f"; its rotary_emb is None (config position_embedding_type={kind!r})"
            if kind != "absent"
            else "; its rotary_emb is None"
        )
    return (
        f"relpos.interop.hf: the {facts.model_type} model computes no RoPE: its decoder "
        f"({type(decoder).__name__}) has no rotary module (no submodule holds inverse "
        f"frequencies, inv_freq, or is a *RotaryEmbedding){why}, so there is no RoPE to replace"
    )


def _far_position(facts: ModelFacts) -> int:
    """A position at which even the lowest frequency has turned by about a radian (every
    rotated pair shows; ``64 base``, at most ``2^24``): the probe reads the pairs there. A
    rotary module that indexes a position table (``position_table``: GPT-J, CodeGen) has no
    rotation past its last row: that row then."""
    base = max((r.base for r in facts.rope.values()), default=10000.0)
    factor = max(
        (float((r.scaling or {}).get("factor") or 1.0) for r in facts.rope.values()), default=1.0
    )
    far = int(min(2**24, 64 * base * max(factor, 1.0)))
    tables = [position_table(m) for m in facts.rotary_modules]
    rows = [int(t.shape[0]) for t in tables if t is not None]
    return min([far, *(r - 1 for r in rows)])


def _tolerance(x: Tensor) -> float:
    eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 1e-7
    return max(1e-4, 4 * eps) * float(x.abs().max().clamp(min=1.0))


def _probe_layer(facts, layer, raw_qk, rot_qk, pos, create) -> LayerRotary | None:
    (q_raw, k_raw), (q_rot, k_rot) = raw_qk, rot_qk
    what = f"relpos.interop.hf: {facts.model_type} layer {layer}"
    if q_raw.shape != q_rot.shape or k_raw.shape != k_rot.shape:
        raise ValueError(f"{what}: q/k change shape with the model's RoPE")
    head_dim = q_raw.shape[-1]
    if k_raw.shape[-1] != head_dim:
        raise ValueError(f"{what}: q has {head_dim} channels and k {k_raw.shape[-1]}")
    tokens = pos.shape[-1]
    if q_raw.shape[-2] == tokens and k_raw.shape[-2] > tokens:
        return _probe_appended_keys(facts, layer, raw_qk, rot_qk, pos, create)
    if q_raw.shape[-2] != tokens or k_raw.shape[-2] != tokens:
        raise ValueError(
            f"{what}: attends with {k_raw.shape[-2]} keys for {tokens} tokens, keys that are "
            "not one per token (the model appends keys of its own, e.g. DeepSeek-V4's "
            "compressed keys), whose positions relpos cannot know"
        )
    tol = max(_tolerance(q_rot), _tolerance(k_rot))
    moved = ((q_rot - q_raw).abs().amax(dim=(0, 1, 2)) > tol) | (
        (k_rot - k_raw).abs().amax(dim=(0, 1, 2)) > tol
    )
    rotated = [int(c) for c in torch.nonzero(moved).flatten()]
    if not rotated:
        return None  # NoPE layer: q and k reach attention as they are
    # the pairs, at the far position (the last row: every frequency has turned there)
    samples = torch.cat([q_raw[-1].flatten(0, 1), k_raw[-1].flatten(0, 1)])
    targets = torch.cat([q_rot[-1].flatten(0, 1), k_rot[-1].flatten(0, 1)])
    found = f"rotated channels {rotated[:8]}{'...' if len(rotated) > 8 else ''}"
    try:
        pairs = _pairs(samples, targets, rotated, what)
    except ValueError as err:
        raise ValueError(
            f"{err}; its q/k after RoPE are not pairwise rotations relpos can state ({found})"
        ) from None
    layer_type = facts.layer_type(layer)
    if layer_type not in facts.rope:
        raise ValueError(
            f"{what}: rotates q and k ({found}), but the config gives its layer type "
            f"{layer_type!r} no RoPE (no rope_parameters entry), so relpos cannot state it"
        )
    base_options = facts.rope[layer_type].options()
    try:
        span = create("rope", num_heads=1, head_dim=head_dim, **base_options).rotary_dim
    except ValueError as err:
        raise ValueError(f"{what}: relpos's rope refuses the model's RoPE: {err}") from None
    near = slice(0, pos.shape[0] - 1)  # the far row has float32 angle error in the model
    best: tuple[float, str] = (math.inf, "")
    # the sense of rotation: pair (a, b) turns a towards b, or b towards a
    for oriented in (pairs, [(b, a) for a, b in pairs]):
        layout, permutation = _layout(sorted(oriented, key=min), head_dim, span)
        spec = LayerRotary(
            layer_type, layout, 2 * len(pairs), head_dim, permutation, q_raw.shape[1]
        )
        options = dict(base_options, layout=layout)
        options["partial_rotary_factor"] = spec.partial_rotary_factor
        try:
            enc = create("rope", num_heads=q_raw.shape[1], head_dim=head_dim, **options)
        except ValueError as err:
            raise ValueError(f"{what}: relpos's rope refuses the model's RoPE: {err}") from None
        if _turning_channels(enc) != spec.rotary_dim:
            raise ValueError(
                f"{what}: rotates {spec.rotary_dim} of {head_dim} channels, which relpos's "
                f"partial_rotary_factor cannot state (relpos's rope with the model's options "
                f"turns {_turning_channels(enc)})"
            )
        err = _rotation_error(enc.to(q_raw.device), spec, q_raw, q_rot, k_raw, k_rot, pos, near)
        if err <= tol:
            return spec
        if err < best[0]:
            scaling = (options["scaling"] or {}).get("rope_type", "default")
            best = (
                err,
                f"relpos's rope (base {options['base']:g}, scaling {scaling!r}, layout "
                f"{layout!r}, {spec.rotary_dim}/{head_dim} channels"
                f"{', permuted' if permutation else ''})",
            )
    turns = _turns_at_position_one(raw_qk, rot_qk, pos, pairs)
    measured = ""
    if turns is not None:
        mine = _config_turns(create, base_options, head_dim, len(pairs))
        measured = (
            f"; at position 1 the model turns its pairs by {_show(turns)} rad, relpos's rope "
            f"with the config's RoPE for layer type {layer_type!r} by {_show(mine)}"
        )
    raise ValueError(
        f"{what}: {best[1]} differs from the model's rotation by {best[0]:.3g} (tolerance "
        f"{tol:.3g}); found {_describe(pairs)}{measured}. The model's RoPE is not one relpos "
        "computes"
    )


def _probe_appended_keys(facts, layer, raw_qk, rot_qk, pos, create) -> LayerRotary | None:
    """A layer that attends with more keys than tokens, its tokens' keys first and then keys
    of its own (transformers' DeepSeek-V4, ``models/deepseek_v4/modeling_deepseek_v4.py``:
    the compressor of a compressed layer appends one key per ``compress_rate`` tokens,
    ``DeepseekV4HCACompressor`` / ``DeepseekV4CSACompressor``, rotated at the position of
    its window's first token, ``window * compress_rate``, counted in tokens from the start
    of the cache, not taken from ``position_ids``). The tokens' keys are probed as any
    layer's; the appended keys' positions are then read as the integer position (up to the
    probe's last near position plus its tokens) at which relpos's rope with the found facts
    turns each raw appended key into the model's, per near row. Always ``ValueError``: the
    patch places a call's keys one per token before the queries' positions (``patch``), so
    it cannot place keys the layer adds; None where neither the tokens' keys nor the
    appended ones turn (nothing to place)."""
    (q_raw, k_raw), (q_rot, k_rot) = raw_qk, rot_qk
    tokens = pos.shape[-1]
    extra_raw, extra_rot = k_raw[..., tokens:, :], k_rot[..., tokens:, :]
    count = extra_raw.shape[-2]
    what = f"relpos.interop.hf: {facts.model_type} layer {layer}"
    found = (
        f"{what}: attends with {k_raw.shape[-2]} keys for {tokens} tokens: after its tokens' "
        f"keys it appends {count} keys of its own (e.g. DeepSeek-V4's compressed keys)"
    )
    try:
        spec = _probe_layer(
            facts,
            layer,
            (q_raw, k_raw[..., :tokens, :]),
            (q_rot, k_rot[..., :tokens, :]),
            pos,
            create,
        )
    except ValueError as err:
        raise ValueError(f"{found}; {str(err).removeprefix('relpos.interop.hf: ')}") from None
    tol = _tolerance(extra_rot)
    if spec is None:
        if float((extra_rot - extra_raw).abs().max()) <= tol:
            return None
        raise ValueError(f"{found}, which turn with the model's RoPE while its tokens' do not")
    options = facts.rope[spec.layer_type].options()
    options.update(layout=spec.layout, partial_rotary_factor=spec.partial_rotary_factor)
    enc = create("rope", num_heads=extra_raw.shape[1], head_dim=spec.head_dim, **options)
    enc = enc.to(extra_raw.device)
    perm = list(spec.permutation) if spec.permutation is not None else slice(None)
    near = pos.shape[0] - 1  # the far row has float32 angle error in the model
    raw, rot = extra_raw[:near][..., perm].float(), extra_rot[:near][..., perm].float()
    last = int(pos[:near].max()) + tokens
    candidates = torch.arange(last + 1, device=raw.device)
    # every candidate position for every key of every row, in one call
    at = candidates[:, None, None].expand(-1, near, count).flatten(0, 1)
    with torch.no_grad():
        mine = enc.rotate(raw.repeat(last + 1, 1, 1, 1), at, "k")
    errors = (mine - rot.repeat(last + 1, 1, 1, 1)).abs().amax(dim=(1, 3))
    best, where = errors.view(last + 1, near, count).min(dim=0)
    rows = [int(p) for p in pos[:near, 0]]
    if not bool((best <= tol).all()):
        raise ValueError(
            f"{found}, which relpos's rope with the layer's facts turns into the model's at no "
            f"position 0 .. {last} (off by {float(best.max()):.3g}, tolerance {tol:.3g}); the "
            "patch places a call's keys one per token and cannot place them"
        )
    at_rows = [[int(p) for p in row] for row in where]
    if all(row == at_rows[0] for row in at_rows):
        placed = f"at positions {at_rows[0]} in every row, whatever its position ids"
    else:
        placed = "at positions " + "; ".join(
            f"{row} in the row at {r}" for r, row in zip(rows, at_rows, strict=True)
        )
    raise ValueError(
        f"{found}, rotated with the layer's RoPE {placed} (the probe's rows sit at positions "
        f"{rows}): positions counted in tokens, not the position ids the queries turn by. "
        "The patch places a call's keys one per token before the queries' positions and "
        "cannot place keys a layer appends"
    )


def _show(values: list[float]) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:4])
    return f"[{shown}{', ...' if len(values) > 4 else ''}]"


def _config_turns(create, base_options: dict, head_dim: int, num_pairs: int) -> list[float]:
    """The angles (rad) by which relpos's rope with the config's options turns its pairs from
    one position to the next, fastest first, over the model's ``2 * num_pairs`` channels."""
    options = dict(base_options, partial_rotary_factor=2 * num_pairs / head_dim)
    try:
        enc = create("rope", num_heads=1, head_dim=head_dim, **options)
    except ValueError:
        enc = create("rope", num_heads=1, head_dim=head_dim, **base_options)
    return [float(f) for f in enc.inv_freq]


def _turns_at_position_one(raw_qk, rot_qk, pos, pairs) -> list[float] | None:
    """The angle (rad, in ``(-pi, pi]``) by which the model turns each pair ``(a, b)`` (``a'
    = a cos - b sin``, ``b' = a sin + b cos``) at position 1, from a least-squares fit over
    the q and k of the row at that position, in the order of the pairs; None without such a
    row. What the model computes, for a refusal to name next to what relpos would."""
    rows = torch.nonzero(pos[:, 0] == 1).flatten()
    if rows.numel() == 0:
        return None
    row = int(rows[0])
    raw = torch.cat([t[row].flatten(0, 1) for t in raw_qk]).double()
    rot = torch.cat([t[row].flatten(0, 1) for t in rot_qk]).double()
    turns = []
    for a, b in pairs:
        lhs = torch.cat(
            (torch.stack((raw[:, a], -raw[:, b]), -1), torch.stack((raw[:, b], raw[:, a]), -1))
        )
        rhs = torch.cat((rot[:, a], rot[:, b]))[:, None]
        cos, sin = torch.linalg.lstsq(lhs, rhs).solution.flatten().tolist()
        turns.append(math.atan2(sin, cos))
    return turns


def _turning_channels(enc) -> int:
    """The channels relpos's rope ``enc`` turns: two per nonzero frequency (p-RoPE's zero
    frequencies leave their pairs as they are)."""
    return 2 * int(torch.count_nonzero(enc.inv_freq))


def _rotation_error(enc, spec, q_raw, q_rot, k_raw, k_rot, pos, rows, scaled=False) -> float:
    """The largest entry of relpos's rotation of ``q_raw`` / ``k_raw`` minus the model's
    ``q_rot`` / ``k_rot`` over ``rows``; ``scaled``: after one least-squares scale per head
    vector of relpos's (what a norm of q and k after the rotation would leave)."""
    perm = list(spec.permutation) if spec.permutation is not None else None

    def ordered(x: Tensor) -> Tensor:
        x = x[rows]
        return x if perm is None else x[..., perm]

    def off(mine: Tensor, theirs: Tensor) -> float:
        if scaled:
            mine, theirs = mine.double(), theirs.double()
            c = (mine * theirs).sum(-1, keepdim=True) / (mine * mine).sum(-1, keepdim=True)
            mine = c.nan_to_num(1.0) * mine
        return float((mine - theirs).abs().max())

    with torch.no_grad():
        q_mine = enc.rotate(ordered(q_raw).float(), pos[rows], "q")
        k_mine = enc.rotate(ordered(k_raw).float(), pos[rows], "k")
    err = max(off(q_mine, ordered(q_rot).float()), off(k_mine, ordered(k_rot).float()))
    return err if math.isfinite(err) else math.inf
