"""A transformers Llama patched by ``relpos.interop.hf``: forward time against the unpatched
model (no downloads; random weights from a config).

fp32, B=1, a Llama of SmolLM2-135M's attention shape (hidden 576, 9 query / 3 key-value
heads of 64, MLP 1536) with 4 layers (``--layers``), L=2048 tokens (``--length``), no grad.

Cases, timed in turn in one process (each on its own copy of the model):

* ``hf-sdpa``: the unpatched model (transformers' ``sdpa``; ratio base 1.0);
* ``baseline``: ``patch(model, "baseline")``: the same SDPA call through the registered
  function and mask builder (the patch's own overhead);
* ``baseline-chunked``: ``backend="chunked"``: relpos's O(L x block) backend on the model's
  rotated q/k;
* ``rope``: relpos's RoPE instead of the model's (float64 angle products, raw cache);
* ``self-extend``: Self-Extend G=8, W=512 (piecewise: relpos's chunked piecewise-SDPA kernel).

Usage: .venv/bin/python benchmarks/bench_hf_patch.py [--quick] [--length 2048] [--layers 4]
"""

from __future__ import annotations

import argparse
import copy
import os
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

CASES = {
    "hf-sdpa": None,
    "baseline": ("baseline", {}),
    "baseline-chunked": ("baseline", {"backend": "chunked"}),
    "rope": ("rope", {}),
    "self-extend": ("self-extend", {"group_size": 8, "neighbor_window": 512}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "hf_patch")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    finish_args(args, "hf_patch", repeats=5, warmup=1)
    length = 256 if args.quick else args.length

    from transformers import LlamaConfig, LlamaForCausalLM

    from relpos.interop.hf import patch

    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 4096, (1, length), generator=torch.Generator().manual_seed(1))
    fns = {}
    handles = []
    for name, spec in CASES.items():
        model = copy.deepcopy(base)
        if spec is not None:
            method, options = spec
            handles.append(patch(model, method, **options))

        def run(model=model):
            with torch.no_grad():
                return model(ids, logits_to_keep=1).logits

        fns[name] = run
    info = machine_info()
    log(f"timing {len(fns)} cases at L={length}")
    results = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
    info["loadavg_end"] = list(os.getloadavg())
    base_s = results["hf-sdpa"]["median_s"]
    rows = [
        [name, fmt(r["median_s"] * 1e3, 1), fmt(r["min_s"] * 1e3, 1), fmt(r["median_s"] / base_s)]
        for name, r in results.items()
    ]
    settings = {"length": length, "layers": args.layers, "repeats": args.repeats}
    print(header("relpos.interop.hf.patch: forward time", info, settings))
    print()
    print(markdown_table(["case", "median ms", "min ms", "x hf-sdpa"], rows))
    write_json(args.json, {"machine": info, "settings": settings, "results": results})
    for handle in handles:
        handle.unpatch()


if __name__ == "__main__":
    main()
