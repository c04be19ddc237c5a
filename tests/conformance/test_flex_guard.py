"""Conformance: the flex backend's guards (relpos.attention.flex, docs/numerics.md).

torch 2.13's compiled CPU FlexAttention kernel is wrong or NaN at some short lengths (L = 8
every time in a fresh process; 24 and 40 intermittently). relpos pads every CPU call to whole
kernel blocks (``FLEX_BLOCK``), masks the padded keys and drops the padded rows; dtypes the
kernel cannot take are refused by name.

* the padding is exact for every encoding at short, odd lengths (checked fast, with the
  kernel replaced by the uncompiled ``flex_attention`` that records the shapes it is given);
* the compiled kernel agrees with eager over many lengths around the block boundaries, each
  length in a fresh process (slow);
* float64 raises a ``TypeError`` naming the supported dtypes, before anything compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relpos.attention import flex, supported_backends

from .common import B, Case, D, H, assert_close_rel, attention, build_inputs, make_encoding


@pytest.fixture
def uncompiled_flex(monkeypatch) -> list[tuple[int, int]]:
    """Runs backend='flex' through the uncompiled flex_attention; records (Lq, Lk) of each
    kernel call."""
    from torch.nn.attention.flex_attention import flex_attention

    shapes: list[tuple[int, int]] = []

    def kernel(q, k, v, **kw):
        shapes.append((q.shape[2], k.shape[2]))
        return flex_attention(q, k, v, **kw)

    monkeypatch.setattr(flex, "compiled_flex_attention", lambda device_type="cpu": kernel)
    return shapes


@pytest.mark.parametrize(
    "case",
    [
        Case("l8", 8, 8),
        Case("lq<lk-mask", 5, 24, mask=True),
        Case("l40-batchpos", 40, 40, pos="batch"),
    ],
    ids=lambda c: c.id,
)
@pytest.mark.slow  # the uncompiled kernel and a block mask per call: seconds per encoding
def test_cpu_flex_pads_to_whole_blocks_exactly(name, case, uncompiled_flex):
    _check_padding(name, case)
    assert all(
        lq % flex.FLEX_BLOCK == 0 and lk % flex.FLEX_BLOCK == 0 for lq, lk in uncompiled_flex
    )


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_cpu_flex_padding_is_exact_for_representative_biases(name, uncompiled_flex):
    """The fast subset of the test above (a slope, a bucket table, an MLP over distances)."""
    _check_padding(name, Case("lq<lk-mask", 5, 24, mask=True))
    assert uncompiled_flex and all(lq % flex.FLEX_BLOCK == 0 for lq, _ in uncompiled_flex)


def _check_padding(name: str, case: Case) -> None:
    enc = make_encoding(name)
    if "flex" not in supported_backends(enc):
        pytest.skip("flex cannot run this encoding (needs_probabilities)")
    inputs = build_inputs(case, enc)
    kw = {n: inputs[n] for n in ("q_pos", "k_pos", "mask", "inputs") if n in inputs}
    for causal in [True] if enc.causal_only else [True, False]:
        with torch.no_grad():
            out = attention(
                inputs["q"], inputs["k"], inputs["v"], enc, causal=causal, backend="flex", **kw
            )
            ref = attention(
                inputs["q"], inputs["k"], inputs["v"], enc, causal=causal, backend="eager", **kw
            )
        assert out.shape == ref.shape
        assert_close_rel(out, ref, msg=f"{name} flex {case.id} causal={causal}")


def test_flex_refuses_float64_by_name(name):
    enc = make_encoding(name)
    if "flex" not in supported_backends(enc):
        pytest.skip("flex cannot run this encoding (needs_probabilities)")
    q = torch.randn(B, H, 16, D, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(TypeError, match="float32") as info:
        attention(q, q, q, enc, causal=True, backend="flex")
    assert "float64" in str(info.value) and "bfloat16" in str(info.value)


CHILD = """
import json, sys, torch, relpos
torch.manual_seed(0)
L = int(sys.argv[1])
errors = {}
for name, causal, mask in (("alibi", True, False), ("t5", False, True), ("nope", True, False)):
    enc = relpos.create(name, num_heads=4, head_dim=16)
    q, k, v = (torch.randn(2, 4, L, 16) for _ in range(3))
    m = torch.rand(2, 1, 1, L) > 0.3 if mask else None
    if m is not None:
        m[..., 0] = True
    with torch.no_grad():
        out = relpos.attention(q, k, v, enc, causal=causal, mask=m, backend="flex")
        ref = relpos.attention(q, k, v, enc, causal=causal, mask=m, backend="eager")
    err = (out - ref).abs().max() / ref.abs().max()
    errors[name] = float("nan") if not torch.isfinite(out).all() else float(err)
print(json.dumps(errors))
"""

LENGTHS = [1, 2, 3, 7, 8, 9, 16, 23, 24, 25, 40, 63, 64, 65, 127, 128, 129, 200]


@pytest.mark.slow  # one fresh process (one compile per encoding) per length: minutes
@pytest.mark.parametrize("length", LENGTHS)
def test_compiled_cpu_flex_is_exact_at_every_length_in_a_fresh_process(length):
    src = str(Path(__file__).resolve().parents[2] / "src")
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(length)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    errors = json.loads(res.stdout.strip().splitlines()[-1])
    for name, err in errors.items():
        assert err <= 1e-5, f"flex at L={length}: {name} relative error {err}"
