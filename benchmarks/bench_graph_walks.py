"""Graph attention with AW-RoPE: the cost of the walk transport, sparse and exact.

fp32, forward, B=4 graphs of N nodes (random connected graphs with cycles, ``example_walk_graphs``),
H=8, D=32, every node attending to every node, backend auto. Cases, timed in turn in one
process (each includes building the per-call graph state, ``prepare_rotary``):

* ``nope``: plain attention (ratio base 1.0);
* ``graph-spd``: the shortest-path ALiBi bias from the adjacency (a bias baseline);
* ``aw-rope``: the sparse walk sum, K = 8 message-passing steps (official default);
* ``aw-rope-exact``: the dense resolvent, one (2N x 2N) real solve per graph and channel.

Usage: .venv/bin/python benchmarks/bench_graph_walks.py [--quick] [--nodes 32 64 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    add_common_args,
    finish_args,
    fmt,
    header,
    log,
    machine_info,
    markdown_table,
    time_round_robin,
    write_json,
)

import relpos
from relpos.encodings.graph.aw_rope import example_walk_graphs

NAME = "graph_walks"
B, H, D, F = 4, 8, 32, 16
BASELINE = "nope"


def build(nodes: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, nodes, D, generator=gen) for _ in range(3))
    adjacency = example_walk_graphs(B, nodes, gen)
    features = torch.randn(B, nodes, F, generator=gen)
    walk_inputs = {"adjacency": adjacency, "node_features": features}
    specs = {
        "nope": (relpos.create("nope", num_heads=H, head_dim=D), None),
        "graph-spd": (
            relpos.create("graph-spd", num_heads=H, head_dim=D),
            {"adjacency": adjacency},
        ),
        "aw-rope": (relpos.create("aw-rope", num_heads=H, head_dim=D, feature_dim=F), walk_inputs),
        "aw-rope-exact": (
            relpos.create("aw-rope-exact", num_heads=H, head_dim=D, feature_dim=F),
            walk_inputs,
        ),
    }
    fns = {}
    for name, (enc, inputs) in specs.items():

        def run(enc=enc, inputs=inputs):
            with torch.no_grad():
                return relpos.attention(q, k, v, enc, inputs=inputs)

        fns[name] = run
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_common_args(parser, NAME)
    parser.add_argument("--nodes", type=int, nargs="+", default=[32, 64, 128])
    args = parser.parse_args()
    finish_args(args, NAME, repeats=7, warmup=2)
    sizes = [32] if args.quick else args.nodes
    info = machine_info()
    rows, results = [], {}
    for n in sizes:
        fns = build(n)
        log(f"timing {len(fns)} cases at N={n}")
        res = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
        base = res[BASELINE]["median_s"]
        results[str(n)] = res
        for name, r in res.items():
            rows.append(
                [
                    n,
                    name,
                    fmt(r["median_s"] * 1e3),
                    fmt(r["min_s"] * 1e3),
                    fmt(r["median_s"] / base),
                ]
            )
    settings = {"B": B, "H": H, "D": D, "F": F, "nodes": sizes, "repeats": args.repeats}
    print(header("Graph walks (AW-RoPE): forward attention", info, settings))
    print()
    print(markdown_table(["N", "case", "median ms", "min ms", f"x {BASELINE}"], rows))
    write_json(args.json, {"settings": settings, "machine": info, "results": results})


if __name__ == "__main__":
    main()
