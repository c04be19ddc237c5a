"""Shared helpers of the conformance suite (parametrized over ``relpos.available()``).

Every test here reads only the public API and the capability flags of the encodings
(``relative``, ``continuous``, ``causal_only``, ``has_rotary``, ``has_bias``,
``distance_only``, ``adds_to_input``, ``max_positions``, ``learnable``, ``dims``,
``required_inputs``, ``needs_probabilities``): an encoding that is registered later is covered
with no new test code, and skips are per capability, never per name.

Tests call ``attention`` / ``scores`` from here: they are ``relpos.attention`` /
``relpos.scores`` with two adaptations, so one test serves every encoding: 1-D positions are
lifted to the encoding's ``dims`` axes (``lift_positions``), and encodings with
``required_inputs`` get valid random ones (``Encoding.example_inputs``) unless given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import relpos
from relpos.encodings.base import QueryGroups
from relpos.registry import encoding_class
from relpos.schedules import anchor_mask_mod

ENCODINGS = relpos.available()

B, H, D = 2, 4, 16  # batch, heads, head_dim used throughout
RTOL = 1e-5  # fp32 agreement, relative to the largest magnitude of the reference


def lift_positions(enc: relpos.Encoding, pos):
    """1-D positions ``(L,)`` / ``(B, L)`` as ``(B|1, L, m)`` for an m-D encoding: axis 0 keeps
    the positions, axis ``a`` uses ``(a + 2) * p + a`` (distinct, still shifted by the same
    constant on every axis when ``p`` is), reduced into a learned table if there is one.
    Anything else (already m-D, bool, non-tensors: error tests) is returned unchanged."""
    if enc.dims == 1 or not isinstance(pos, torch.Tensor) or pos.dim() not in (1, 2):
        return pos
    if pos.dtype == torch.bool or pos.is_complex():
        return pos
    axes = [pos] + [(a + 2) * pos + a for a in range(1, enc.dims)]
    if enc.max_positions is not None and not pos.is_floating_point():
        axes = [axes[0]] + [x % enc.max_positions for x in axes[1:]]
    out = torch.stack(axes, dim=-1)
    return out[None] if pos.dim() == 1 else out


def in_table(enc: relpos.Encoding, pos):
    """Integer test positions reduced into the encoding's learned table (``pos %
    max_positions``; unchanged without a table or for float positions). Window encodings
    (Swin, MViTv2: a table per window of a few positions per axis) get repeated coordinates,
    which they accept; the test lengths stay the same for every encoding."""
    if enc.max_positions is None or not isinstance(pos, torch.Tensor):
        return pos
    if pos.is_floating_point() or pos.dtype == torch.bool:
        return pos
    return pos % enc.max_positions


def table_holds(enc: relpos.Encoding, length: int) -> bool:
    """Whether the default positions ``0..length-1`` fit the encoding's learned table."""
    return enc.max_positions is None or length <= enc.max_positions


def _adapt(enc, q, k, kw: dict) -> dict:
    if not isinstance(enc, relpos.Encoding):
        return kw
    lk = k.shape[-2] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
    if lk is not None and not table_holds(enc, lk) and kw.get("k_pos") is None:
        # default positions would leave the table: the same ones, reduced into it
        kw["k_pos"] = in_table(enc, torch.arange(lk))
        if kw.get("q_pos") is None and isinstance(q, torch.Tensor) and q.dim() == 4:
            kw["q_pos"] = kw["k_pos"][lk - q.shape[-2] :]
    for n in ("q_pos", "k_pos"):
        if kw.get(n) is not None:
            kw[n] = lift_positions(enc, kw[n])
    needs = enc.required_inputs or enc.needs_inputs
    if needs and "inputs" not in kw and isinstance(q, torch.Tensor):
        gen = torch.Generator().manual_seed(0)
        kw["inputs"] = enc.example_inputs(q.shape[0], q.shape[-2], k.shape[-2], gen)
    return kw


def rotary_state(enc: relpos.Encoding, q_pos, k_pos, batch: int, lq: int, lk: int):
    """The rotation state (``Encoding.prepare_rotary``) of a call of these sizes with the
    example inputs that ``attention`` / ``scores`` pass (camera frames); None for rotations
    that read positions only. ``q_pos`` / ``k_pos`` as the engine normalises them."""
    inputs = {}
    if enc.required_inputs or enc.needs_inputs:
        gen = torch.Generator().manual_seed(0)
        inputs = enc.example_inputs(batch, lq, lk, gen)
    return enc.prepare_rotary(q_pos, k_pos, inputs)


def rotation_groups(enc: relpos.Encoding, q_pos, k_pos, batch: int, lq: int, lk: int) -> list:
    """``[(rows, state)]``: the query groups of a query-grouped rotation (``QueryGroups``:
    one attention per group, ``rows (B|1, Lq)`` bool), else ``[(None, state)]``."""
    state = rotary_state(enc, q_pos, k_pos, batch, lq, lk)
    if isinstance(state, QueryGroups):
        return list(state.groups)
    return [(None, state)]


def merge_groups(parts: list) -> torch.Tensor:
    """``[(rows, tensor (B, H, Lq, ...))]`` -> each query's row from its own group."""
    out = None
    for rows, value in parts:
        if rows is None:
            return value
        keep = rows[:, None, :, None]
        out = torch.where(keep, value, 0.0 if out is None else out)
    return out


def rotate(enc: relpos.Encoding, x, pos, role: str, state=None):
    """``enc.rotate`` as the engine calls it (the state only when there is one; for a
    query-grouped state, the first group's)."""
    if isinstance(state, QueryGroups):
        state = state.groups[0][1]
    return enc.rotate(x, pos, role) if state is None else enc.rotate(x, pos, role, state)


def rotate_qk(enc: relpos.Encoding, q, k, q_pos, k_pos):
    """``enc.rotate_qk`` with the state of the example inputs (``rotary_state``; for a
    query-grouped state, the first group's)."""
    state = rotary_state(enc, q_pos, k_pos, q.shape[0], q.shape[-2], k.shape[-2])
    if isinstance(state, QueryGroups):
        state = state.groups[0][1]
    if state is None:
        return enc.rotate_qk(q, k, q_pos, k_pos)
    return enc.rotate_qk(q, k, q_pos, k_pos, state)


def head_dim_refused(name: str, head_dim: int) -> str | None:
    """Why the encoding (with its ``example_options``) refuses ``head_dim`` by name (the
    small models of the suite have head_dim 8; RayNova needs 16), or None when it takes it."""
    try:
        relpos.create(
            name, num_heads=1, head_dim=head_dim, **encoding_class(name).example_options()
        )
    except ValueError as err:
        if "head_dim" in str(err):
            return f"the encoding cannot take head_dim={head_dim}: {err}"
        raise
    return None


def model_inputs(name: str, batch: int, length: int) -> dict:
    """Keyword ``inputs`` for a ``TransformerLM`` forward with this encoding ({} if none)."""
    enc = encoding_class(name)
    if not (enc.required_inputs or enc.needs_inputs):
        return {}
    gen = torch.Generator().manual_seed(0)
    return {"inputs": enc.example_inputs(batch, length, length, gen)}


def attention(q, k, v, enc=None, **kw):
    """``relpos.attention`` with positions lifted to the encoding's axes and example inputs."""
    return relpos.attention(q, k, v, enc, **_adapt(enc, q, k, kw))


def scores(q, k, enc=None, **kw):
    """``relpos.scores`` with positions lifted to the encoding's axes and example inputs."""
    return relpos.scores(q, k, enc, **_adapt(enc, q, k, kw))


def make_encoding(name: str, seed: int = 0, **options) -> relpos.Encoding:
    """``relpos.create(name)`` with defaults, its random init drawn from ``seed``.

    ``example_options`` of the encoding are applied (short-test sizes that exercise every
    part). Parameters that are initialised to exactly zero (iRPE and tree tables, LeRoPE's log
    scales, ...) get small random values: at zero their terms would vanish and every backend
    would agree trivially."""
    torch.manual_seed(seed)
    options = {**encoding_class(name).example_options(), **options}
    enc = relpos.create(name, num_heads=H, head_dim=D, **options)
    with torch.no_grad():
        for p in enc.parameters():
            if p.requires_grad and p.is_floating_point() and bool((p == 0).all()):
                p.copy_(0.1 * torch.randn_like(p))
    return enc


def assert_close_rel(actual, expected, rtol: float = RTOL, scale=None, msg: str = "") -> None:
    """``|actual - expected| <= rtol * (|expected| + max|expected|)`` elementwise.

    ``scale`` overrides ``max|expected|`` (e.g. the largest gradient of a tensor family).
    """
    if scale is None:
        scale = expected.detach().abs().max() if expected.numel() else 0.0
    torch.testing.assert_close(
        actual,
        expected,
        rtol=rtol,
        atol=rtol * float(scale) + 1e-30,
        msg=(lambda m: f"{msg}\n{m}") if msg else None,
    )


def increasing_positions(batch: int, length: int, gen: torch.Generator, limit: int) -> torch.Tensor:
    """Per-batch strictly increasing integer positions ``(batch, length)`` with gaps and
    different starts (never one shared arange), all below ``limit``."""
    steps = torch.randint(1, 4, (batch, length), generator=gen)
    start = torch.randint(0, 5, (batch,), generator=gen) + 3 * torch.arange(batch)
    pos = start[:, None] + steps.cumsum(1) - steps[:, :1]
    if int(pos.max()) >= limit:  # squeeze into a learned table, still not an arange
        pos = torch.arange(length).expand(batch, length) + torch.arange(batch)[:, None]
        pos = pos + (torch.arange(length) >= length // 2)
    return pos


@dataclass(frozen=True)
class Case:
    """One attention problem: query/key lengths, kv heads, mask, position kind."""

    id: str
    lq: int
    lk: int
    hkv: int = H
    mask: bool = False  # a random (B, 1, 1, Lk) bool padding mask
    docs: bool = False  # a mask_mod: packed documents behind an anchor key (AnchorAttention)
    # "default" (None), "arange" (explicit), "offset" (arange from 400), "batch" (B, L),
    # "float" (B, L) floating-point
    pos: str = "default"

    def needs(self, enc: relpos.Encoding) -> str | None:
        """Why the encoding cannot run this case (capability), or None."""
        if self.pos == "float" and not enc.continuous:
            return "float positions need a continuous encoding"
        return None


def build_inputs(case: Case, enc: relpos.Encoding, seed: int = 0, dtype=torch.float32) -> dict:
    """q, k, v and keyword arguments of ``relpos.attention`` for ``case``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, case.lq, D, generator=gen, dtype=dtype)
    k = torch.randn(B, case.hkv, case.lk, D, generator=gen, dtype=dtype)
    v = torch.randn(B, case.hkv, case.lk, D, generator=gen, dtype=dtype)
    kw: dict = {}
    limit = enc.max_positions if enc.max_positions is not None else 1 << 20
    if case.pos in ("arange", "offset"):
        kp = torch.arange(case.lk) + (400 if case.pos == "offset" else 0)
        kw["k_pos"], kw["q_pos"] = kp, kp[case.lk - case.lq :]
    elif case.pos == "batch":
        kp = increasing_positions(B, case.lk, gen, limit)
        kw["k_pos"], kw["q_pos"] = kp, kp[:, case.lk - case.lq :]
    elif case.pos == "float":
        steps = 0.25 + torch.rand(B, case.lk, generator=gen, dtype=torch.float64)
        kp = steps.cumsum(1).to(dtype)
        kw["k_pos"], kw["q_pos"] = kp, kp[:, case.lk - case.lq :]
    for n in ("q_pos", "k_pos"):
        if n in kw:
            kw[n] = in_table(enc, kw[n])
    if case.mask:
        m = torch.rand(B, 1, 1, case.lk, generator=gen) > 0.3
        m[..., 0] = True  # every query row keeps a key (no all-masked rows, even causal)
        kw["mask"] = m
    if case.docs:
        kw["mask_mod"] = anchor_mask_mod(random_documents(B, case.lk, gen), causal=False)
    kw = _adapt(enc, q, k, kw)
    return dict(q=q, k=k, v=v, **kw)


def random_documents(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Document ids ``(batch, length)``: key 0 is the anchor (id 0), then documents 1, 2, ...
    of random lengths 1..12, different per batch row."""
    starts = torch.rand(batch, length, generator=gen) < 0.15
    starts[:, :2] = True
    return (starts.long().cumsum(1) - 1).clamp(min=0)


def encoding_params(enc: relpos.Encoding) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in enc.named_parameters() if p.requires_grad]
