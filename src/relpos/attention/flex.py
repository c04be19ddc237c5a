"""FlexAttention backend: the encoding's ``bias`` is the ``score_mod``, masks are block masks.

The compiled ``flex_attention`` is created once per process and device type and reused;
score_mod closures share one code object, so new calls with new tensors of the same shapes do
not recompile (dynamo lifts the captured tensors to graph inputs). torch 2.13 has no
FlexAttention backward on CPU: asking for gradients there raises a ``RuntimeError`` that
names the ``chunked`` backend instead.

Guards (docs/numerics.md):

* **Short lengths on CPU.** The compiled CPU kernel of torch 2.13 returns wrong values or
  NaN for some lengths below its block size (``L = 8`` every time in a fresh process,
  ``24`` and ``40`` intermittently; upstream). On CPU every call is therefore padded to
  whole kernel blocks (``FLEX_BLOCK`` = 128 rows and keys): padded keys are masked out by
  the block mask, padded query rows are dropped, and the encoding's hooks only ever see
  indices of real tokens (clamped), so the result is that of the unpadded call.
* **dtypes.** The kernel takes ``FLEX_DTYPES`` (float16, bfloat16, float32); float64 is
  refused with a ``TypeError`` that names them (inductor raised a raw error).
* **Empty calls** (``Lq = 0`` or ``Lk = 0``) do not reach the kernel: the result is SDPA's
  (empty, or zeros with zero gradients).

Softcapping is part of the ``score_mod`` (``c * tanh(s / c)`` of the score with the bias
added, as ``dense.block_attention`` computes it). A sink is one more key: a zero key and
value appended at index ``Lk``, which the block mask lets every row see and whose score the
``score_mod`` replaces by the head's sink logit (its value adds nothing).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .call import AttentionCall
from .dense import empty_attention

FLEX_RECOMPILE_LIMIT = 64
#: the kernel's block size (``flex_attention._DEFAULT_SPARSE_BLOCK_SIZE``): CPU calls are
#: padded to whole blocks of it
FLEX_BLOCK = 128
#: dtypes the compiled FlexAttention kernel takes
FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@lru_cache(maxsize=4)
def compiled_flex_attention(device_type: str = "cpu"):
    """``torch.compile(flex_attention)`` for one device type, built on first use.

    On CUDA shapes are dynamic after the first recompile. On CPU, inductor's dynamic-shape
    FlexAttention kernel fails to build in torch 2.13, so shapes stay static: each new
    (Lq, Lk) compiles once (seconds), and dynamo's per-function recompile limit is raised to
    ``FLEX_RECOMPILE_LIMIT`` so varying lengths do not silently fall back to the unfused,
    O(L^2) ``flex_attention``.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):
            if getattr(dynamo_config, name, FLEX_RECOMPILE_LIMIT) < FLEX_RECOMPILE_LIMIT:
                setattr(dynamo_config, name, FLEX_RECOMPILE_LIMIT)
        return torch.compile(flex_attention, dynamic=False)
    return torch.compile(flex_attention, dynamic=None)


@lru_cache(maxsize=1)
def flex_available() -> bool:
    """True when FlexAttention can be imported (torch >= 2.5)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=4)
def flex_compiles(device_type: str) -> bool:
    """Whether compiled FlexAttention can be built for ``device_type`` here, without trying:
    FlexAttention imports, and inductor finds its code generator (a C++ compiler on CPU:
    ``$CXX``, ``g++``, ``c++`` or ``clang++``; Triton on CUDA)."""
    if not flex_available():
        return False
    if device_type == "cpu":
        names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
        return any(name and shutil.which(name) for name in names)
    if device_type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return False


def flex_needs_backward(call: AttentionCall) -> bool:
    """Gradients are on and reach q, k, v or the encoding's parameters (FlexAttention has
    no backward on CPU in torch 2.13)."""
    return torch.is_grad_enabled() and (
        call.q.requires_grad
        or call.k.requires_grad
        or call.v.requires_grad
        or (call.sinks is not None and call.sinks.requires_grad)
        or (call.encoding is not None and call.encoding.learnable)
    )


def flex_accepts(call: AttentionCall) -> bool:
    """The flex backend runs this call without refusing it: an additive score term only, a
    dtype of ``FLEX_DTYPES``, no float mask, a device whose compiler is present, and on CPU
    no gradients."""
    if call.needs_probabilities or call.q.dtype not in FLEX_DTYPES:
        return False
    if call.mask is not None and call.mask.dtype != torch.bool:
        return False
    device = call.q.device.type
    if device == "cpu" and flex_needs_backward(call):
        return False
    return device in ("cpu", "cuda") and flex_compiles(device)


def _padded(length: int, device: torch.device) -> int:
    """The length the kernel runs at: whole ``FLEX_BLOCK`` s on CPU (see module docstring)."""
    if device.type != "cpu":
        return length
    return -(-length // FLEX_BLOCK) * FLEX_BLOCK


def _score_mod(call: AttentionCall):
    """The bias as a ``score_mod``: a read of the call's per-distance table when it has one
    that needs no gradient (one gather per score, whatever the encoding computes), else the
    encoding's element-wise ``bias``."""
    table = call.distance_table(causal=False)
    if table is not None and not (torch.is_grad_enabled() and table.requires_grad):
        return _table_score_mod(table, call.q.shape[2], call.k.shape[2])
    enc = call.encoding
    dev = call.q.device
    ctx = call.bias_context(
        torch.arange(call.q.shape[2], device=dev), torch.arange(call.k.shape[2], device=dev)
    )
    last_q, last_k = call.q.shape[2] - 1, call.k.shape[2] - 1

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        # padded rows / keys (CPU) read the last real token; they are masked or dropped
        i, j = i.clamp(max=last_q), j.clamp(max=last_k)
        return score + enc.bias(ctx, b, h, i, j).to(score.dtype)

    return score_mod


def _table_score_mod(table: Tensor, length_q: int, length_k: int):
    """``score + table[h, i - j + Lk - 1]`` (padded rows and keys clamped to real ones)."""
    last_q, last_k = length_q - 1, length_k - 1

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        i, j = i.clamp(max=last_q), j.clamp(max=last_k)
        return score + table[h, i - j + last_k].to(score.dtype)

    return score_mod


def _full_score_mod(call: AttentionCall):
    """The call's ``score_mod``: the bias (``_score_mod``), then the softcap, and the sink
    logit at the appended key ``Lk``; None when the score is ``q . k * scale`` alone."""
    bias_mod = _score_mod(call) if call.has_bias else None
    softcap, sinks = call.softcap, call.sinks
    if softcap is None and sinks is None:
        return bias_mod
    Lk = call.k.shape[2]
    sink = None if sinks is None else sinks.to(call.q.dtype)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        if bias_mod is not None:
            score = bias_mod(score, b, h, i, j)
        if softcap is not None:
            score = torch.tanh(score / softcap) * softcap
        if sink is not None:
            score = torch.where(j == Lk, sink[h].to(score.dtype), score)
        return score

    return score_mod


def _block_mask(call: AttentionCall):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = call.causal_offset
    user, user_mod = call.mask, call.mask_mod
    causal = call.causal
    if user is not None and user.dtype != torch.bool:
        raise ValueError("the flex backend takes a bool mask (True = attend); got a float mask")
    B, H, Lq = call.q.shape[:3]
    Lk = call.k.shape[2]
    sink = call.sinks is not None
    dev = call.q.device
    Pq, Pk = _padded(Lq, dev), _padded(Lk + sink, dev)

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        keep = j < Lk  # padded keys (CPU)
        is_sink = j == Lk
        i, j = i.clamp(max=Lq - 1), j.clamp(max=Lk - 1)
        if causal:
            keep = keep & (j <= i + offset)
        if user is not None:
            keep = keep & user[b, h, i, j]
        if user_mod is not None:  # queries in key coordinates, as on the other backends
            keep = keep & user_mod(b, h, i + offset, j)
        return keep | is_sink if sink else keep

    if not call.has_user_mask:
        return _plain_block_mask(Lq, Lk, Pq, Pk, causal, str(dev), sink)
    return create_block_mask(mask_mod, B, H, Pq, Pk, device=dev)


@lru_cache(maxsize=32)
def _plain_block_mask(
    Lq: int, Lk: int, Pq: int, Pk: int, causal: bool, device: str, sink: bool = False
):
    """Block mask over the padded ``(Pq, Pk)``: padded keys masked, and bottom-right
    aligned causal if ``causal``; with ``sink`` the appended key ``Lk`` seen by every row;
    built once per shape (building one is slow)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = Lk - Lq
    last = Lk + 1 if sink else Lk

    def real_keys(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return j < last

    def causal_real_keys(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        keep = (j <= i + offset) & (j < Lk)
        return keep | (j == Lk) if sink else keep

    mod = causal_real_keys if causal else real_keys
    return create_block_mask(mod, None, None, Pq, Pk, device=device)


def flex_attention_backend(call: AttentionCall) -> Tensor:
    """``(B, H, Lq, Dv)`` through compiled FlexAttention."""
    if not flex_available():
        raise RuntimeError("backend='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention)")
    if call.q.dtype not in FLEX_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in FLEX_DTYPES)
        raise TypeError(
            f"backend='flex' takes q, k, v in {names}, got {call.q.dtype}; use backend "
            f"'chunked', 'sdpa' or 'eager' for {call.q.dtype}"
        )
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    if Lq == 0 or Lk == 0:
        return empty_attention(call)
    if call.q.device.type == "cpu" and flex_needs_backward(call):
        raise RuntimeError(
            "backend='flex' has no backward on CPU in this torch; use backend='chunked' for "
            "training (or run the forward under torch.no_grad())"
        )
    score_mod = _full_score_mod(call)
    sink = call.sinks is not None  # the sink: an appended zero key and value at index Lk
    Pq, Pk = _padded(Lq, call.q.device), _padded(Lk + sink, call.q.device)
    q, k, v = call.q, call.k, call.v
    if Pq != Lq:
        q = F.pad(q, (0, 0, 0, Pq - Lq))
    if Pk != Lk:
        k, v = F.pad(k, (0, 0, 0, Pk - Lk)), F.pad(v, (0, 0, 0, Pk - Lk))
    masked = call.causal or call.has_user_mask or Pk != Lk + sink
    block_mask = _block_mask(call) if masked else None
    out = compiled_flex_attention(call.q.device.type)(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=call.scale,
        enable_gqa=call.groups > 1,
    )
    return out[:, :, :Lq]
