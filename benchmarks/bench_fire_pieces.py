"""A/B in one process: FIRE above its threshold at L = 4096 (B=1, H=8, D=64, causal, fp32),
forward and training step. ``fire-new``: the MLP read as its linear pieces (the library);
``fire-old``: the previous per-pair hidden layer + matmul, monkeypatched back in; baselines
no-bias SDPA and, for training, the dense materialised mask + SDPA (docs/benchmarks.md,
"Folded biases and fast paths").

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_fire_pieces.py [L]
"""

import json
import sys

import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.bias.fire import FIRE
from relpos_lab import measure

print("machine:", measure.machine_line(measure.machine_info()))

B, H, L, D = 1, 8, int(sys.argv[1]) if len(sys.argv) > 1 else 4096, 64
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
enc = relpos.create("fire", num_heads=H, head_dim=D)
new_readout = FIRE.readout


def old_readout(self, u, h):
    w_in, b_in = self.mlp_in.weight[:, 0], self.mlp_in.bias
    if u.dim() == 4 and u.shape[1] == 1 and h.dim() == 4 and h.shape[1] == self.num_heads:
        hidden = torch.relu(u[..., None] * w_in + b_in)
        out = torch.matmul(hidden[:, 0], self.mlp_out.weight.t()) + self.mlp_out.bias
        return out.permute(0, 3, 1, 2)
    return new_readout(self, u, h)


def with_readout(fn, r):
    def run():
        FIRE.readout = r
        try:
            return fn()
        finally:
            FIRE.readout = new_readout

    return run


def fwd():
    return relpos.attention(q, k, v, enc, causal=True)


def nograd(f):
    def g():
        with torch.no_grad():
            return f()

    return g


print(relpos.attention.plan(q, k, v, enc, causal=True))
with torch.no_grad():
    a = with_readout(fwd, old_readout)()
    b = fwd()
    print("max |new-old|", float((a - b).abs().max()))
fns = {
    "sdpa-nobias": nograd(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "fire-new": nograd(fwd),
    "fire-old": nograd(with_readout(fwd, old_readout)),
}
t = measure.time_round_robin(fns, warmup=1, repeats=3)
base = t["sdpa-nobias"]["median_s"]
res = {n: {"ms": x["median_s"] * 1e3, "ratio": x["median_s"] / base} for n, x in t.items()}
print("forward", json.dumps(res))
# training step: auto (chunked tile) vs dense materialised mask + SDPA
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
i = torch.arange(L)


def dense_step():
    for p in [qg, kg, vg, *enc.parameters()]:
        p.grad = None
    bias = enc.readout(
        enc.mlp_input(i[:, None], i[None, :])[None, None], torch.arange(H).view(1, -1, 1, 1)
    )
    bias = bias.masked_fill(i[None, :] > i[:, None], float("-inf"))
    out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias)
    out.sum().backward()
    return out.detach()


def auto_step():
    for p in [qg, kg, vg, *enc.parameters()]:
        p.grad = None
    out = relpos.attention(qg, kg, vg, enc, causal=True)
    out.sum().backward()
    return out.detach()


def nobias_step():
    for p in [qg, kg, vg]:
        p.grad = None
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    out.sum().backward()
    return out.detach()


fns = {
    "sdpa-nobias-train": nobias_step,
    "fire-dense-mask-train": dense_step,
    "fire-auto-train": auto_step,
}
t = measure.time_round_robin(fns, warmup=1, repeats=3)
base = t["sdpa-nobias-train"]["median_s"]
res = {n: {"ms": x["median_s"] * 1e3, "ratio": x["median_s"] / base} for n, x in t.items()}
print("train", json.dumps(res))
print("load", __import__("os").getloadavg())
