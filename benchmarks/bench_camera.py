"""Camera encodings in attention: the cost of per-token frames and query groups.

fp32, forward, B=1, H=8, D=64, C cameras x 16x16 patches (L = 256 C), backend auto (fused
SDPA: every camera encoding is rotary-only). Cases, timed in turn in one process:

* ``rope-axial``: 2-D axial RoPE on the patch positions (ratio base 1.0);
* ``prope``: PRoPE (Proj4 on half the head, 2-D RoPE on the rest);
* ``gta``: GTA (se3 32 + so2 32 channels);
* ``cape-6dof``: Proj4 on every channel, q and k only;
* ``rayrope``: one attention per query camera (C groups), expected RoPE with depth doubt;
* ``worldrope``: one attention per query camera, 2 Gaussian primitives per key projected
  into each query camera (expected RoPE, patch footprint on);
* ``flex4dhuman``: PRoPE camera section + (t, h, w, view) RoPE (t = 0, view = camera).

Each case includes building the rotation state from the cameras (``prepare_rotary``).
Usage: .venv/bin/python benchmarks/bench_camera.py [--quick] [--cameras 4]
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
from relpos import cameras

NAME = "camera"
H, D, GRID, IMAGE = 8, 64, 16, 256.0
BASELINE = "rope-axial"


def build(n_cams: int):
    gen = torch.Generator().manual_seed(0)
    P = GRID * GRID
    L = n_cams * P
    q, k, v = (torch.randn(1, H, L, D, generator=gen) for _ in range(3))
    views = cameras.random_se3(n_cams, generator=gen).float()[None]
    K = cameras.intrinsics(IMAGE, IMAGE, IMAGE / 2, IMAGE / 2).float().expand(1, n_cams, 3, 3)
    index = torch.arange(n_cams).repeat_interleave(P)[None]
    view_t, K_t = cameras.expand_cameras(views, index), cameras.expand_cameras(K, index)
    xy = torch.stack(torch.meshgrid(torch.arange(GRID), torch.arange(GRID), indexing="xy"), -1)
    pos = xy.reshape(P, 2).repeat(n_cams, 1)[None]
    depth = torch.stack((torch.full((1, L), 1.0), torch.full((1, L), 0.2)), -1)
    grid_opts = {"grid": (GRID, GRID), "image_size": (IMAGE, IMAGE)}
    specs = {
        "rope-axial": (relpos.create("rope-axial", num_heads=H, head_dim=D, dims=2), {}),
        "prope": (
            relpos.create("prope", num_heads=H, head_dim=D, image_size=(IMAGE, IMAGE)),
            {"k_viewmats": view_t, "k_Ks": K_t},
        ),
        "gta": (
            relpos.create("gta", num_heads=H, head_dim=D, grid=(GRID, GRID)),
            {"k_viewmats": view_t},
        ),
        "cape-6dof": (relpos.create("cape-6dof", num_heads=H, head_dim=D), {"k_viewmats": view_t}),
        "rayrope": (
            relpos.create("rayrope", num_heads=H, head_dim=D, rays_per_patch=1, **grid_opts),
            {"k_viewmats": view_t, "k_Ks": K_t, "k_depth_logsigma": depth},
        ),
        "worldrope": (
            relpos.create("worldrope", num_heads=H, head_dim=D, **grid_opts),
            {
                "k_viewmats": view_t,
                "k_Ks": K_t,
                "k_depths": torch.tensor([2.0, 4.0]).expand(1, L, 2),
                "k_depth_sigma": torch.full((1, L, 2), 0.3),
            },
        ),
        "flex4dhuman": (
            relpos.create("flex4dhuman", num_heads=H, head_dim=D, image_size=(IMAGE, IMAGE)),
            {"k_viewmats": view_t, "k_Ks": K_t},
        ),
    }
    # (t, h, w, view) for the 4-axis encoding: one frame, the camera as the view index
    thwv = torch.cat((torch.zeros_like(pos[..., :1]), pos.flip(-1), index[..., None]), -1)
    fns = {}
    for name, (enc, inputs) in specs.items():
        p = {1: pos[..., 0], 2: pos, 4: thwv}[enc.dims]

        def run(enc=enc, inputs=inputs, p=p):
            with torch.no_grad():
                return relpos.attention(q, k, v, enc, q_pos=p, k_pos=p, inputs=inputs or None)

        fns[name] = run
    return fns, L


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_common_args(parser, NAME)
    parser.add_argument("--cameras", type=int, default=4)
    args = parser.parse_args()
    finish_args(args, NAME, repeats=7, warmup=2)
    n_cams = 2 if args.quick else args.cameras
    info = machine_info()
    fns, L = build(n_cams)
    log(f"timing {len(fns)} cases at L={L}")
    res = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
    base = res[BASELINE]["median_s"]
    rows = [
        [n, fmt(r["median_s"] * 1e3), fmt(r["min_s"] * 1e3), fmt(r["median_s"] / base)]
        for n, r in res.items()
    ]
    settings = {"B": 1, "H": H, "D": D, "cameras": n_cams, "L": L, "repeats": args.repeats}
    print(header("Camera encodings: forward attention", info, settings))
    print()
    print(markdown_table(["case", "median ms", "min ms", f"x {BASELINE}"], rows))
    write_json(args.json, {"settings": settings, "machine": info, "results": res})


if __name__ == "__main__":
    main()
