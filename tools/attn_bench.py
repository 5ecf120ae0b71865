"""Attention bench on one GPU: the engine's kernels (kernels/cuda/attention*.cu) against torch SDPA's best backend.

    python3 tools/attn_bench.py --out DIR [--prompts 8192,32768] [--lanes 64,256] [--ctx 2048,8192] [--once]

Prompt attention: one causal prompt of each length, 32 query heads over 8 KV heads of 128, in TFLOP/s. Decode
attention: every lane's one new row after each context length over a paged bf16 cache, in GB/s of keys and values
read, beside the device's copy rate. Checks that the decode kernel's rows are the bits of the prompt kernel's.
--once runs each kernel once and times nothing (for ncu); --wg adds the wgmma prompt kernel, checked bit for bit
against the row kernel. Writes DIR/attn_bench.json and DIR/attn_bench.md.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_bench import copy_bandwidth, time_us  # noqa: E402
from gemm_cuda import Cuda  # noqa: E402

NH, NKV, D, PAGE = 32, 8, 128, 16
KV_DIM, WIDTH = NKV * D, (NH + 2 * NKV) * D
SPLIT, GROUP_ROWS = 64, 16
# gemm_tma.cu for the wgmma and TMA helpers of attention_wg.cu (TMA_PART 3: only the experts' grouped kernels).
SOURCES = ["kernels/cuda/gemm_tma.cu", "kernels/cuda/attention.cu", "kernels/cuda/attention_decode.cu",
           "kernels/cuda/attention_wg.cu"]
# Shared memory of the wgmma prompt kernel (WG_SMEM in attention.rs).
WG_SMEM = 2 * 8192 + 2 * 4 * 8192 + 1024
# Shared memory of a prompt block and of a decode block (attention_smem and decode_smem in attention.rs).
PROMPT_SMEM = 2 * 2 * SPLIT * (D + 8) * 2
DECODE_WARPS, DECODE_SMEM = 4, 4 * 3 * 32 * (D + 8) * 2


class Paged:
    """A paged cache of one layer for `lanes` lanes of `length` positions, pages scattered over the pool."""

    def __init__(self, lanes, length, seed):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        per = -(-length // PAGE)
        self.k = torch.randn(lanes * per * PAGE, KV_DIM, generator=gen, device="cuda").to(torch.bfloat16)
        self.v = torch.randn(lanes * per * PAGE, KV_DIM, generator=gen, device="cuda").to(torch.bfloat16)
        order = torch.randperm(lanes * per, generator=gen, device="cuda").to(torch.int32)
        self.table = order.view(lanes, per).contiguous()
        self.lanes, self.per = lanes, per

    def contiguous(self, lane, length):
        """(k, v) of one lane as [NKV, length, D] for SDPA."""
        rows = (self.table[lane].long()[:, None] * PAGE + torch.arange(PAGE, device="cuda")[None]).reshape(-1)
        pick = rows[:length]
        return [x[pick].view(length, NKV, D).transpose(0, 1).contiguous() for x in (self.k, self.v)]


def launch_args(cuda, qkv, pos, groups, paged, table_off, out, num_groups, decode, chunked=None):
    common = [("ptr", qkv.data_ptr()), ("ptr", pos.data_ptr()), ("ptr", groups.data_ptr()),
              ("ptr", paged.table.data_ptr()), ("ptr", table_off.data_ptr()), ("ptr", paged.k.data_ptr()),
              ("ptr", paged.v.data_ptr()), ("ptr", out.data_ptr())]
    shape = [("i32", NH), ("i32", NKV), ("i32", PAGE), ("ptr", PAGE * KV_DIM), ("ptr", 0), ("f32", D ** -0.5)]
    rope = [("ptr", 0)] * 4 + [("f32", 0.0), ("i32", 0), ("i32", 0)]
    if decode:
        # chunked: (states, tickets, nsplit, chunks), the warps a (row, KV head) is spread over (decode_chunks).
        states, tickets, nsplit, chunks = chunked or (None, None, 0, 1)
        tail = [("ptr", states.data_ptr() if chunks > 1 else 0), ("ptr", tickets.data_ptr() if chunks > 1 else 0),
                ("i32", nsplit), ("i32", chunks)]
        return common + [("i32", num_groups)] + shape + rope + tail
    return common + [("ptr", 0), ("ptr", 0)] + shape + [("i32", 1)] + rope


def rows_of(lanes_positions, paged):
    """Device tables of rows (lane, position): q in f32, positions, one group per run of a lane, table offsets."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    t = len(lanes_positions)
    qkv = torch.randn(t, WIDTH, generator=gen, device="cuda")
    pos = torch.tensor([p for _, p in lanes_positions], dtype=torch.int32, device="cuda")
    off = torch.tensor([lane * paged.per for lane, _ in lanes_positions], dtype=torch.int32, device="cuda")
    groups, r = [], 0
    while r < t:
        n = 1
        while r + n < t and n < GROUP_ROWS and lanes_positions[r + n] == (lanes_positions[r][0], lanes_positions[r][1] + n):
            n += 1
        groups += [r, n]
        r += n
    return qkv, pos, off, torch.tensor(groups, dtype=torch.int32, device="cuda"), len(groups) // 2


def prompt(cuda, n, once, results, lines, wg=False):
    paged = Paged(1, n, 11)
    qkv, pos, off, groups, ng = rows_of([(0, p) for p in range(n)], paged)
    out = torch.empty(n, NH * D, dtype=torch.bfloat16, device="cuda")
    args = launch_args(cuda, qkv, pos, groups, paged, off, out, ng, False)
    run = lambda: cuda.launch("attention_d128", (NKV, ng, 1), (128,), PROMPT_SMEM, args)  # noqa: E731
    # The wgmma kernel: the cache as rows of KV_DIM (a page's 16 positions consecutive rows), boxes of 16 x 64.
    wg_out = torch.empty_like(out)
    maps = [cuda.tensor_map_2d(t.data_ptr(), t.shape[0], KV_DIM, 16, 64, 128) for t in (paged.k, paged.v)]
    wg_args = [("map", maps[0]), ("map", maps[1]), ("ptr", qkv.data_ptr()), ("ptr", pos.data_ptr()),
               ("ptr", groups.data_ptr()), ("ptr", paged.table.data_ptr()), ("ptr", off.data_ptr()),
               ("ptr", wg_out.data_ptr()), ("i32", NH), ("i32", NKV), ("i32", PAGE), ("i32", 0), ("f32", D ** -0.5)]
    run_wg = lambda: cuda.launch("attention_wg_d128", (NKV, ng, 1), (160,), WG_SMEM, wg_args)  # noqa: E731
    k, v = paged.contiguous(0, n)
    q = qkv[:, : NH * D].view(n, NH, D).transpose(0, 1).to(torch.bfloat16).unsqueeze(0).contiguous()
    k, v = k.unsqueeze(0), v.unsqueeze(0)
    if once:
        run()
        if wg:
            run_wg()
        torch.cuda.synchronize()
        return
    flops = 4 * D * NH * n * (n + 1) / 2
    run()
    same, wg_us = None, None
    if wg:
        run_wg()
        torch.cuda.synchronize()
        same = torch.equal(out.view(torch.int16), wg_out.view(torch.int16))
        wg_us = time_us(run_wg)
        print(f"prompt {n}: wgmma kernel {wg_us / 1e3:.2f} ms, {flops / wg_us / 1e6:.0f} TFLOP/s, "
              f"same bits as the row kernel: {same}", flush=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    err = (out.float() - want[0].transpose(0, 1).reshape(n, NH * D).float()).abs().max().item()
    print(f"prompt {n}: largest difference from SDPA {err:.4f}", flush=True)
    ours = time_us(run)
    best = None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                us = time_us(fn)
        except Exception as e:  # a backend that does not take these shapes
            lines.append(f"- SDPA {name} at {n}: not run ({type(e).__name__})")
            continue
        if best is None or us < best[1]:
            best = (name, us)
    rec = {"kind": "prompt", "tokens": n, "ours_us": ours, "ours_tflops": flops / ours / 1e6, "max_err": err}
    if wg:
        rec.update(wg_us=wg_us, wg_tflops=flops / wg_us / 1e6, wg_same_bits=same)
    if best:
        rec.update(peer=best[0], peer_us=best[1], peer_tflops=flops / best[1] / 1e6, ratio=best[1] / ours)
    results.append(rec)
    wg_cell = f"{wg_us / 1e3:.2f} ms, {rec['wg_tflops']:.0f} TFLOP/s, {'same bits' if same else 'BITS DIFFER'}" if wg else "not run"
    lines.append(f"| prompt {n} | {ours / 1e3:.2f} ms, {rec['ours_tflops']:.0f} TFLOP/s | {wg_cell} | "
                 + (f"{best[0]} {best[1] / 1e3:.2f} ms, {rec['peer_tflops']:.0f} TFLOP/s | {rec['ratio']:.2f} |" if best else "| |"))


def decode(cuda, lanes, ctx, once, copy_gbs, results, lines):
    paged = Paged(lanes, ctx + 1, 13)
    qkv, pos, off, groups, ng = rows_of([(lane, ctx) for lane in range(lanes)], paged)
    outs = {name: torch.empty(lanes, NH * D, dtype=torch.bfloat16, device="cuda") for name in ("rows", "decode")}
    a_rows = launch_args(cuda, qkv, pos, groups, paged, off, outs["rows"], ng, False)
    # Rounds that fill under half the GPU's warps spread each (row, KV head) over a few warps (decode_chunks).
    units, slots = lanes * NKV, torch.cuda.get_device_properties(0).multi_processor_count * 2 * DECODE_WARPS
    chunks = min(16, slots // units) if 2 * units <= slots else 1
    nsplit = -(-(ctx + 1) // SPLIT)
    states = torch.empty(lanes * NH * nsplit * (D + 2), dtype=torch.float32, device="cuda")
    tickets = torch.zeros(lanes * NKV, dtype=torch.int32, device="cuda")
    a_dec = launch_args(cuda, qkv, pos, groups, paged, off, outs["decode"], ng, True, (states, tickets, nsplit, chunks))
    dec_name = "attention_spread_d128" if chunks > 1 else "attention_decode_d128"
    runs = {
        "rows": lambda: cuda.launch("attention_d128", (NKV, ng, 1), (128,), PROMPT_SMEM, a_rows),
        "decode": lambda: cuda.launch(dec_name, (-(-lanes * NKV * chunks // DECODE_WARPS), 1, 1),
                                      (32 * DECODE_WARPS,), DECODE_SMEM, a_dec),
    }
    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    same = torch.equal(outs["rows"].view(torch.int16), outs["decode"].view(torch.int16))
    if once:
        return same
    kv_bytes = lanes * (ctx + 1) * KV_DIM * 2 * 2
    rec = {"kind": "decode", "lanes": lanes, "ctx": ctx, "chunks": chunks, "same_bits": same, "copy_gbs": copy_gbs}
    cells = []
    for name, fn in runs.items():
        us = time_us(fn)
        rec[f"{name}_us"], rec[f"{name}_gbs"] = us, kv_bytes / us / 1e3
        cells.append(f"{us:.0f} µs, {kv_bytes / us / 1e3:.0f} GB/s")
    # The peer: SDPA over each lane's keys and values, contiguous, one query row per head.
    q = qkv[:, : NH * D].view(lanes, NH, 1, D).to(torch.bfloat16)
    k = torch.randn(lanes, NKV, ctx + 1, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    try:
        us = time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rec["peer_us"], rec["peer_gbs"] = us, kv_bytes / us / 1e3
        cells.append(f"{us:.0f} µs, {kv_bytes / us / 1e3:.0f} GB/s")
    except Exception as e:
        cells.append(f"not run ({type(e).__name__})")
    results.append(rec)
    lines.append(f"| decode {lanes} lanes after {ctx} ({chunks} warps a row and head) | " + " | ".join(cells)
                 + f" | {rec['decode_gbs'] / copy_gbs:.0%} | {'yes' if same else 'NO'} |")
    return same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="attn-out")
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--lanes", default="64,256")
    ap.add_argument("--ctx", default="2048,8192")
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--wg", action="store_true", help="also the wgmma prompt kernel (attention_wg.cu)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cuda = Cuda(SOURCES, options=("-DTMA_PART=3",))
    cuda.set_smem("attention_wg_d128", WG_SMEM)
    cuda.set_smem("attention_d128", PROMPT_SMEM)
    cuda.set_smem("attention_decode_d128", DECODE_SMEM)
    cuda.set_smem("attention_spread_d128", DECODE_SMEM)
    for name in ("attention_d128", "attention_decode_d128", "attention_spread_d128"):
        print(name, "registers, local bytes:", cuda.registers(name), flush=True)
    copy_gbs = 0.0 if args.once else copy_bandwidth()
    results, lines, ok = [], [], True
    lines += ["| prompt | row kernel | wgmma kernel | SDPA's best | peer / row kernel |", "|---|---:|---:|---:|---:|"]
    for n in [int(x) for x in args.prompts.split(",") if x]:
        prompt(cuda, n, args.once, results, lines, args.wg)
        print(lines[-1], flush=True)
    errs = [(r["tokens"], r["max_err"]) for r in results if r["kind"] == "prompt"]
    lines += [""] + [f"Prompt {n}: largest difference from SDPA's output {e:.4f}." for n, e in errs]
    ok &= all(e < 0.05 for _, e in errs) and all(r.get("wg_same_bits", True) for r in results)
    lines += ["", f"Copy: {copy_gbs:.0f} GB/s (read plus written).", "",
              "| decode | prompt kernel | decode kernel | SDPA | decode / copy | same bits |", "|---|---:|---:|---:|---:|---|"]
    for lanes in [int(x) for x in args.lanes.split(",") if x]:
        for ctx in [int(x) for x in args.ctx.split(",") if x]:
            ok &= decode(cuda, lanes, ctx, args.once, copy_gbs, results, lines)
            print(lines[-1], flush=True)
    with open(os.path.join(args.out, "attn_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "attn_bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if not ok:
        print("the decode kernel's rows differ from the prompt kernel's, or a prompt from SDPA's", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
