"""How a transformers decoder rotates q and k, read from what its own code computes.

``probe_rotary(model, facts) -> tuple[LayerRotary | None, ...]`` (one entry per attention
layer) runs the model twice on a known input under a temporary attention function that
records the ``q`` and ``k`` each layer hands to attention (and returns zeros, so every
layer's input is the same in both runs):

* once with the model's RoPE switched off (its ``rotary_emb`` returns the identity
  rotation, ``(cos, sin) = (1, 0)`` or the complex ``1``): ``q_raw``, ``k_raw``, what
  ``relpos.interop.hf.patch`` receives;
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
head (GLM, GLM-4: partial rotary), half-split pairs rotated the other way (NanoChat: ``R(-p)``,
the half-split pairs with their two channels swapped), layers without RoPE (Llama-4's NoPE
layers, SmolLM3, the full-attention layers of Beam and Ergo), p-RoPE (HF ``"proportional"``,
the global layers of Gemma-4 and LFM-3: half-split pairs ``(i, i + D/2)`` over the whole head
whose trailing frequencies are 0, so only the leading ``r/2`` pairs turn; relpos's ``rope``
with that scaling dict computes the same frequencies, and the probe counts the channels its
nonzero frequencies turn).

A layer whose ``q_rot`` / ``k_rot`` are not a rotation of ``q_raw`` / ``k_raw`` relpos can
state exactly raises ``ValueError`` naming the model, the layer and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from .facts import LayerRotary, ModelFacts

__all__ = ["LayerRotary", "probe_rotary", "identity_rotation", "rotary_modules", "PROBE_POSITIONS"]

#: the positions the probe places its rows at (the model's last trained position is added)
PROBE_POSITIONS = (0, 1, 5, 37)


def rotary_modules(decoder: nn.Module) -> list[nn.Module]:
    """The modules that compute the decoder's RoPE: ``decoder.rotary_emb`` and any other
    submodule named ``rotary_emb`` (per-layer rotary modules)."""
    found: list[nn.Module] = []
    for name, module in decoder.named_modules():
        if name.rsplit(".", 1)[-1] == "rotary_emb" and module not in found:
            found.append(module)
    return found


def identity_rotation(output: Any, where: str) -> Any:
    """The output of a rotary module with its rotation replaced by the identity: ``(cos,
    sin) -> (1, 0)``, a complex ``e^{i theta}`` tensor (Llama-4) -> ``1``. ``ValueError``
    naming ``where`` for any other output."""
    if isinstance(output, tuple) and len(output) == 2 and all(map(torch.is_tensor, output)):
        cos, sin = output
        return torch.ones_like(cos), torch.zeros_like(sin)
    if torch.is_tensor(output) and output.is_complex():
        return torch.ones_like(output)
    raise ValueError(
        f"relpos.interop.hf: {where} returned {type(output).__name__}; expected (cos, sin) or "
        "a complex rotation tensor, so its RoPE cannot be switched off"
    )


@contextmanager
def _capture(model: nn.Module, records: list[tuple[Any, Tensor, Tensor]]) -> Iterator[None]:
    """A temporary attention implementation that records ``(layer_idx, q, k)`` per call and
    returns zeros."""
    import transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = f"relpos_probe_{id(records)}"

    def record(module, query, key, value, attention_mask, **kwargs):
        records.append((getattr(module, "layer_idx", None), query.detach(), key.detach()))
        b, _, lq, _ = query.shape
        out = query.new_zeros(b, lq, query.shape[1], value.shape[-1])
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


def _run(model, ids, pos, rotary: list[nn.Module], identity: bool):
    records: list[tuple[Any, Tensor, Tensor]] = []
    hooks = []
    if identity:
        for module in rotary:
            where = type(module).__name__
            hooks.append(
                module.register_forward_hook(lambda m, a, out, w=where: identity_rotation(out, w))
            )
    try:
        with _capture(model, records), torch.no_grad():
            model(input_ids=ids, position_ids=pos, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return records


def _layer_of(records, facts: ModelFacts) -> dict[int, tuple[Tensor, Tensor]]:
    out: dict[int, tuple[Tensor, Tensor]] = {}
    for layer_idx, q, k in records:
        if layer_idx is None:
            raise ValueError(
                f"relpos.interop.hf: the attention modules of {facts.model_type} have no "
                "layer_idx, so the patch cannot tell its layers apart"
            )
        out.setdefault(int(layer_idx), (q, k))
    return out


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


def _joined(near: dict, far: dict) -> dict[int, tuple[Tensor, Tensor]]:
    """The records of the near and the far run, one batch per layer."""
    return {
        layer: tuple(torch.cat((a, b)) for a, b in zip(near[layer], far[layer], strict=True))
        for layer in near
        if layer in far
    }


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


def probe_rotary(model: nn.Module, facts: ModelFacts) -> tuple[LayerRotary | None, ...]:
    """The ``LayerRotary`` of each attention layer (None: the layer applies no RoPE); see
    the module docstring. ``ValueError`` naming the model, the layer and what was found
    when relpos's ``rope`` cannot reproduce a layer's rotation exactly."""
    from ...encodings.registry import create

    rotary = rotary_modules(facts.decoder)
    if not rotary:
        raise ValueError(
            f"relpos.interop.hf: the {facts.model_type} decoder has no rotary_emb module; the "
            "patch replaces the RoPE a rotary_emb module computes"
        )
    device = next(iter(model.parameters())).device
    # the last position below the trained length: transformers' dynamic NTK goes back to its
    # base frequencies only for calls shorter than that length
    last = int(getattr(model.config, "max_position_embeddings", 64) or 64) - 2
    # near positions within the trained length: length-dependent scalings (dynamic NTK,
    # LongRoPE) then use their base frequencies, whatever the rotary module saw before
    near = sorted({p for p in (*PROBE_POSITIONS, last) if p <= last} or {0})
    tokens = facts.head_dim + 8
    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
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
        runs = {
            identity: [
                _layer_of(_run(model, ids[rows], pos[rows], rotary, identity), facts)
                for rows in (slice(0, len(near)), slice(len(near), None))
            ]
            for identity in (True, False)
        }
    finally:
        model.train(was_training)
        for module, state in zip(rotary, saved, strict=True):
            _restore(module, state)
    raw, rot = (_joined(*runs[identity]) for identity in (True, False))
    if set(raw) != set(rot) or not raw:
        raise ValueError(
            f"relpos.interop.hf: the {facts.model_type} model called attention in different "
            "layers with and without its RoPE"
        )
    out: list[LayerRotary | None] = []
    for layer in range(facts.num_layers):
        if layer not in raw:
            out.append(None)  # no attention in this layer (a recurrent / linear layer)
            continue
        out.append(_probe_layer(facts, layer, raw[layer], rot[layer], pos, create))
    return tuple(out)


def _far_position(facts: ModelFacts) -> int:
    """A position at which even the lowest frequency has turned by about a radian (every
    rotated pair shows; ``64 base``, at most ``2^24``): the probe reads the pairs there."""
    base = max((r.base for r in facts.rope.values()), default=10000.0)
    factor = max(
        (float((r.scaling or {}).get("factor") or 1.0) for r in facts.rope.values()), default=1.0
    )
    return int(min(2**24, 64 * base * max(factor, 1.0)))


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


def _rotation_error(enc, spec, q_raw, q_rot, k_raw, k_rot, pos, rows) -> float:
    perm = list(spec.permutation) if spec.permutation is not None else None

    def ordered(x: Tensor) -> Tensor:
        x = x[rows]
        return x if perm is None else x[..., perm]

    with torch.no_grad():
        q_mine = enc.rotate(ordered(q_raw).float(), pos[rows], "q")
        k_mine = enc.rotate(ordered(k_raw).float(), pos[rows], "k")
    err = max(
        float((q_mine - ordered(q_rot).float()).abs().max()),
        float((k_mine - ordered(k_rot).float()).abs().max()),
    )
    return err if math.isfinite(err) else math.inf
