"""A/B in one process: RoPE on q and k of (1, 32, 4096, 128) fp32, half layout, against a
copy into preallocated buffers. ``fused-old``: two ``apply_rotary_fused`` calls; ``rotate-old``:
``enc.rotate`` per tensor with angles through the float64 remainder (the previous code);
``fused-pair`` / ``rotate_qk-new``: one compiled call for q and k, cos/sin once
(docs/benchmarks.md, "Folded biases and fast paths").

Usage: MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296
       MALLOC_TOP_PAD_=1073741824 OMP_NUM_THREADS=1 python benchmarks/bench_rope_pair.py
"""

import json
import math

import torch

import relpos
from relpos.functional import apply_rotary_fused, apply_rotary_pair_fused
from relpos_lab import measure

print("machine:", measure.machine_line(measure.machine_info()))

B, H, L, D = 1, 32, 4096, 128
q = torch.randn(B, H, L, D)
k = torch.randn(B, H, L, D)
qb, kb = torch.empty_like(q), torch.empty_like(k)
enc = relpos.create("rope", num_heads=H, head_dim=D)
pos = torch.arange(L)[None]
cos, sin = enc.cos_sin(pos)
inv, _ = enc.call_frequencies(None, pos.device)


def old_angles():
    ang = pos.to(torch.float64)[..., None] * inv.to(torch.float64)
    red = torch.remainder(ang, 2 * math.pi)
    small = (pos.abs() <= 65536)[..., None]
    a = torch.where(small, ang, red).to(torch.float32)[:, None]
    return a.cos(), a.sin()


def old_rotate():
    c, s = old_angles()
    q2 = apply_rotary_fused(q, c, s)
    c, s = old_angles()
    return q2, apply_rotary_fused(k, c, s)


fns = {
    "copy": lambda: (qb.copy_(q), kb.copy_(k)),
    "fused-old (two calls)": lambda: (
        apply_rotary_fused(q, cos, sin),
        apply_rotary_fused(k, cos, sin),
    ),
    "fused-pair (one call)": lambda: apply_rotary_pair_fused(q, k, cos, sin, cos, sin),
    "rotate-old (angles per tensor)": old_rotate,
    "rotate_qk-new": lambda: enc.rotate_qk(q, k, pos, pos),
}
ref = fns["fused-old (two calls)"]()
for n in ["fused-pair (one call)", "rotate-old (angles per tensor)", "rotate_qk-new"]:
    o = fns[n]()
    print(n, "max diff", max(float((a - b).abs().max()) for a, b in zip(o, ref, strict=True)))
t = measure.time_round_robin(fns, warmup=2, repeats=15)
base = t["copy"]["median_s"]
print(
    json.dumps(
        {
            n: {
                "ms": x["median_s"] * 1e3,
                "ratio": x["median_s"] / base,
                "min_ratio": x["min_s"] / t["copy"]["min_s"],
            }
            for n, x in t.items()
        },
        indent=1,
    )
)
print("load", __import__("os").getloadavg())
