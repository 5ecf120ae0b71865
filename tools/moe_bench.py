"""The experts' grouped GEMMs on one GPU: our tiles (kernels/cuda/moe.cu) against torch's grouped GEMM.

    python3 tools/moe_bench.py --out DIR [--quick] [--tokens 1,64,256,2048] [--shapes REGEX]

For each expert shape and token count: routes every row to top-k distinct experts (seeded, the same rows at every
count), times gate_up (SwiGLU fused) then down for each of our tiles and torch._grouped_mm's two GEMMs (its SwiGLU
between them left out), and reports microseconds, TFLOP/s and the rate at which the chosen experts' weights are
read. Checks that every tile gives the first tile's bits and that a row's outputs do not depend on the count.
Writes DIR/moe_bench.json and DIR/moe_bench.md; exits 1 when a check fails.
"""

import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_cuda import Cuda  # noqa: E402

SOURCES = ["kernels/cuda/moe.cu", "kernels/cuda/gemm_tma.cu"]
# (kernel, rows, columns, stages): moe.rs's TMA_TILES, in gemm_tma.cu's part 3.
TMA_TILES = [("moe_tma_128x256", 128, 256, 4), ("moe_tma_64x256", 64, 256, 5), ("moe_tma_64x128", 64, 128, 9),
             ("moe_tma_64x64", 64, 64, 14)]
# (name, experts, top_k, hidden, expert intermediate size)
SHAPES = [
    ("qwen3-30b-a3b", 128, 8, 2048, 768),
    ("qwen3-next-80b-a3b", 512, 10, 2048, 512),
]
# (suffix, rows, columns, k, stages): moe.rs's TILES.
TILES = [
    ("_m64n128k64s3", 64, 128, 64, 3),
    ("_m64n128k32s3", 64, 128, 32, 3),
    ("_m16n128k64s8", 16, 128, 64, 8),
    ("_m16n128k32s6", 16, 128, 32, 6),
]
TOKENS = [1, 4, 16, 64, 256, 2048, 8192]
QUICK_TOKENS = [1, 64, 256, 2048]
# torch's grouped GEMM wants each group's rows a multiple of this.
ALIGN = 16


def gate_up_order(f):
    """Rows of the stacked gate-and-up matrix as the kernels read them: 8 of gate, then 8 of up (moe_gate_up_order)."""
    idx = []
    for c in range(2 * f // 16):
        idx += [8 * c + j for j in range(8)] + [f + 8 * c + j for j in range(8)]
    return torch.tensor(idx)


def routes(rows, ne, top_k, seed):
    """Each row's top_k distinct experts, the same for a row at every count."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(ne, generator=g)[:top_k] for _ in range(rows)])


def plan(chosen, ne, bm):
    """(offsets, tile_start, slot_row, pair_slot, tiles) of the pairs sorted by expert, as moe_plan makes them."""
    flat = chosen.flatten()
    counts = torch.bincount(flat, minlength=ne)
    offsets = torch.zeros(ne + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    tiles = (counts + bm - 1) // bm
    tile_start = torch.zeros(ne + 1, dtype=torch.int64)
    tile_start[1:] = tiles.cumsum(0)
    order = torch.argsort(flat, stable=True)
    slot_row = order // chosen.shape[1]
    pair_slot = torch.empty_like(order)
    pair_slot[order] = torch.arange(len(order))
    return offsets, tile_start, slot_row, pair_slot, int(tile_start[-1])


def tma_smem(bm, bn, stages):
    """family.rs's tma_smem: 1 KB of alignment room, then per stage the A and W tiles and a barrier pair."""
    return 1024 + stages * ((bm + bn) * 128 + 16)


def timed(fn, reps):
    """Mean microseconds of fn over `reps` calls captured in one CUDA graph, after a warm-up."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="./moe-bench-out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", default="")
    ap.add_argument("--shapes", default=".")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else QUICK_TOKENS if args.quick else TOKENS
    os.makedirs(args.out, exist_ok=True)
    cuda = Cuda(SOURCES, options=("-DTMA_PART=3",))
    dev = torch.device("cuda")
    for suffix, bm, bn, bk, stages in TILES:
        for kind in ("gate_up", "down"):
            cuda.set_smem(f"moe_{kind}{suffix}", stages * (bm + bn) * (bk + 8) * 2)
    for name, bm, bn, stages in TMA_TILES:
        cuda.set_smem(name, tma_smem(bm, bn, stages))
    results, failures = [], []
    for name, ne, top_k, h, f in SHAPES:
        if not re.search(args.shapes, name):
            continue
        g = torch.Generator(device=dev).manual_seed(1)
        gate_up = (torch.randn(ne, 2 * f, h, generator=g, device=dev) * h**-0.5).to(torch.bfloat16)
        down_dev = (torch.randn(ne, h, f, generator=g, device=dev) * f**-0.5).to(torch.bfloat16)
        gate_up_dev = gate_up[:, gate_up_order(f).to(dev)].contiguous()
        gate_up_t = gate_up.transpose(-2, -1)
        down_t = down_dev.transpose(-2, -1)
        most = max(tokens)
        x_all = torch.randn(most, h, generator=g, device=dev).to(torch.bfloat16)
        chosen_all = routes(most, ne, top_k, 2)
        first_rows = {}
        for t in tokens:
            x, chosen = x_all[:t], chosen_all[:t]
            pairs = t * top_k
            used = int(torch.unique(chosen).numel())
            flops = 6 * pairs * h * f
            weight_bytes = used * 3 * f * h * 2
            row = {"shape": name, "tokens": t, "pairs": pairs, "experts_read": used}
            reference = None
            for suffix, bm, bn, bk, stages in TILES:
                if h % bk or f % bk:
                    continue
                offsets, tile_start, slot_row, pair_slot, tiles = plan(chosen, ne, bm)
                u32 = lambda v: v.to(torch.int32).to(dev)  # noqa: E731
                offs_d, ts_d, sr_d = u32(offsets), u32(tile_start), u32(slot_row)
                act = torch.zeros(pairs, f, dtype=torch.bfloat16, device=dev)
                out = torch.zeros(pairs, h, dtype=torch.float32, device=dev)
                grid_tiles = pairs // bm + 1 + min(ne, pairs)
                smem = stages * (bm + bn) * (bk + 8) * 2

                def run(suffix=suffix, bn=bn, smem=smem, grid_tiles=grid_tiles, offs_d=offs_d, ts_d=ts_d, sr_d=sr_d,
                        act=act, out=out, x=x):
                    cuda.launch(f"moe_gate_up{suffix}", ((2 * f + bn - 1) // bn, grid_tiles), (128,), smem,
                                [("ptr", x.data_ptr()), ("ptr", sr_d.data_ptr()), ("ptr", gate_up_dev.data_ptr()),
                                 ("ptr", offs_d.data_ptr()), ("ptr", ts_d.data_ptr()), ("i32", ne), ("i32", 2 * f),
                                 ("i32", h), ("ptr", act.data_ptr())])
                    cuda.launch(f"moe_down{suffix}", ((h + bn - 1) // bn, grid_tiles), (128,), smem,
                                [("ptr", act.data_ptr()), ("ptr", down_dev.data_ptr()), ("ptr", offs_d.data_ptr()),
                                 ("ptr", ts_d.data_ptr()), ("i32", ne), ("i32", h), ("i32", f),
                                 ("ptr", out.data_ptr())])

                us = timed(run, args.reps)
                row[suffix] = {"us": round(us, 2), "tflops": round(flops / us / 1e6, 2),
                               "weights_tbs": round(weight_bytes / us / 1e6, 3)}
                # Each pair's outputs in pair order, to compare across tiles and counts.
                got = out[pair_slot.to(dev)].cpu()
                if reference is None:
                    reference = got
                elif not torch.equal(got.view(torch.int32), reference.view(torch.int32)):
                    failures.append(f"{name} T={t}: {suffix} differs from {TILES[0][0]}")
                if suffix == TILES[0][0]:
                    if 0 in first_rows and not torch.equal(first_rows[0].view(torch.int32),
                                                            got[:top_k].view(torch.int32)):
                        failures.append(f"{name}: row 0's outputs at T={t} differ from T={tokens[0]}")
                    first_rows.setdefault(0, got[:top_k])
            for tname, bm, bn, stages in TMA_TILES:
                offsets, tile_start, slot_row, pair_slot, tiles = plan(chosen, ne, bm)
                u32 = lambda v: v.to(torch.int32).to(dev)  # noqa: E731
                offs_d, ts_d, sr_d = u32(offsets), u32(tile_start), u32(slot_row)
                sorted_rows = torch.zeros(pairs, h, dtype=torch.bfloat16, device=dev)
                act = torch.zeros(pairs, f, dtype=torch.bfloat16, device=dev)
                out = torch.zeros(pairs, h, dtype=torch.float32, device=dev)
                maps = [
                    (cuda.tensor_map_2d(sorted_rows.data_ptr(), pairs, h, bm, 64, 128),
                     cuda.tensor_map_2d(gate_up_dev.data_ptr(), ne * 2 * f, h, bn, 64, 128), 0, act.data_ptr(), 2 * f, h),
                    (cuda.tensor_map_2d(act.data_ptr(), pairs, f, bm, 64, 128),
                     cuda.tensor_map_2d(down_dev.data_ptr(), ne * h, f, bn, 64, 128), out.data_ptr(), 0, h, f),
                ]

                def run_tma(tname=tname, bm=bm, smem=tma_smem(bm, bn, stages), maps=maps, offs_d=offs_d, ts_d=ts_d,
                            sr_d=sr_d, sorted_rows=sorted_rows, x=x):
                    cuda.launch("moe_gather", (pairs,), (256,), 0, [("ptr", x.data_ptr()), ("ptr", sr_d.data_ptr()),
                                                                   ("i32", h), ("ptr", sorted_rows.data_ptr())])
                    for map_a, map_w, c, a2, n, k in maps:
                        launch_args = [("map", map_a), ("map", map_w), ("ptr", 0), ("ptr", c), ("ptr", a2),
                                       ("ptr", 0), ("ptr", 0), ("i32", pairs), ("i32", n), ("i32", k),
                                       ("i32", 2048 // bm), ("i32", 1), ("ptr", offs_d.data_ptr()),
                                       ("ptr", ts_d.data_ptr()), ("i32", ne)]
                        cuda.launch(tname, (cuda.sm_count(),), (384,), smem, launch_args)

                us = timed(run_tma, args.reps)
                row[tname] = {"us": round(us, 2), "tflops": round(flops / us / 1e6, 2),
                              "weights_tbs": round(weight_bytes / us / 1e6, 3)}
                got = out[pair_slot.to(dev)].cpu()
                if not torch.equal(got.view(torch.int32), reference.view(torch.int32)):
                    bad = (got.view(torch.int32) != reference.view(torch.int32)).sum().item()
                    failures.append(f"{name} T={t}: {tname} differs from {TILES[0][0]} in {bad} outputs")
            # torch: rows sorted by expert, groups padded to ALIGN, its two grouped GEMMs.
            flat = chosen.flatten().to(dev)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=ne)
            ends = ((counts + ALIGN - 1) // ALIGN * ALIGN).cumsum(0).to(torch.int32)
            buf = torch.zeros(int(ends[-1]), h, dtype=torch.bfloat16, device=dev)
            starts = ends.long() - (counts + ALIGN - 1) // ALIGN * ALIGN
            first = counts.cumsum(0) - counts
            dest = starts[flat[order]] + torch.arange(pairs, device=dev) - first[flat[order]]
            buf[dest] = x[order // top_k]
            mid = torch.zeros(int(ends[-1]), f, dtype=torch.bfloat16, device=dev)

            def peer():
                torch._grouped_mm(buf, gate_up_t, offs=ends)
                torch._grouped_mm(mid, down_t, offs=ends)

            if hasattr(torch, "_grouped_mm"):
                us = timed(peer, args.reps)
                row["torch"] = {"us": round(us, 2), "tflops": round(flops / us / 1e6, 2),
                                "weights_tbs": round(weight_bytes / us / 1e6, 3)}
            results.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "moe_bench.json"), "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "results": results, "failures": failures}, fh, indent=1)
    cols = [s for s, *_ in TILES] + [t for t, *_ in TMA_TILES] + ["torch"]
    lines = ["| shape | tokens | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for r in results:
        cells = [f"{r[c]['us']} us, {r[c]['tflops']} TF, {r[c]['weights_tbs']} TB/s" if c in r else "-" for c in cols]
        lines.append(f"| {r['shape']} | {r['tokens']} | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "moe_bench.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    for fail in failures:
        print("FAIL:", fail)
    print(f"{len(failures)} check(s) failed" if failures else "every tile gave the same bits at every count")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
