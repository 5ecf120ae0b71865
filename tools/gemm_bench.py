"""GEMM bench and exactness check on one GPU: cuBLAS, the engine's current kernels, and the new family's variants.

    python3 tools/gemm_bench.py --out DIR [--quick] [--ms 64,128] [--only REGEX] [--skip REGEX] [--shapes REGEX]

Times C = A W^T for the Llama-3.1-8B and Orpheus-3B projection shapes at several M; checks that every variant of
the new family (tools/gemm_tma_variant.py, tools/gemm_stream_variant.py) gives the reference's bits (gemm_ref.cu,
with K in the shape's gemm_cuda.segments(N, K) segments) and that each row's bits do not depend on M. Writes DIR/gemm_bench.json and DIR/gemm_bench.md; exits 1 when a
check fails, 2 when the CUDA context dies mid-run (the partial results are written first).
"""

import argparse
import importlib.util
import json
import os
import re
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_cuda import REPO, Cuda, CudaError, Variant, scratch, segments  # noqa: E402

REF_SOURCE = "kernels/cuda/gemm_ref.cu"
VARIANT_MODULES = ["tools/gemm_tma_variant.py", "tools/gemm_stream_variant.py"]

# (name, N, K) of the projections; gate/up is one stacked matrix, as the engine multiplies it.
SHAPES = [
    ("8B.qkv", 6144, 4096),
    ("8B.o", 4096, 4096),
    ("8B.gate_up", 28672, 4096),
    ("8B.down", 4096, 14336),
    ("8B.lm_head", 128256, 4096),
    ("3B.qkv", 5120, 3072),
    ("3B.o", 3072, 3072),
    ("3B.gate_up", 16384, 3072),
    ("3B.down", 3072, 8192),
    ("3B.lm_head", 156940, 3072),
]
TIME_MS = [1, 4, 16, 64, 128, 256, 512, 2048, 8192]
CHECK_MS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 63, 64, 65, 127, 128, 129, 200, 255, 256, 300]
QUICK_SHAPES = ["8B.qkv", "8B.o", "8B.gate_up", "8B.down", "3B.o"]
QUICK_TIME_MS = [1, 16, 128, 2048]
QUICK_CHECK_MS = [1, 5, 16, 17, 64, 65, 129, 300]
REF_TIME_MAX_M = 512
SWIGLU_MS = [64, 65, 128, 300]


def cdiv(a, b):
    return (a + b - 1) // b


# The engine's dispatch (kernels/src/cuda/gemm.rs, cuda_pack.rs) with its defaults: wgmma off, tuning 16 / 256.
RING_BYTES = 16 * 8 * 512
TILED_WIDE_BLOCKS = 264
TILED_MIN_BLOCKS = 132


def tiled_smem(rows, fold):
    stages = 4 if rows == 128 and fold else 3
    return stages * 2 * (rows + 128) * 64 + (rows * 128 * 4 if fold else 0)


def wide_smem(segments, stages):
    return segments * stages * 12 * 32 * 16


ENGINE_SMEM = {
    "gemm_m8": RING_BYTES,
    "gemm_m16": RING_BYTES,
    "gemm_t128": tiled_smem(128, False),
    "gemm_t128_fold": tiled_smem(128, True),
    "gemm_t64": tiled_smem(64, True),
    "gemm_m64": wide_smem(8, 3),
    "gemm_m64_r2": wide_smem(16, 2),
}


def choose_segments(n, k, min_tiles=16, max_blocks=256):
    tiles = k // 32
    options = [s for s in (16, 8, 4, 2, 1) if tiles % s == 0 and tiles // s >= min_tiles]
    most = options[0] if options else 1
    return next((s for s in options if cdiv(n, 8 * 16 // s) <= max_blocks), most)


def engine_plan(m, n, k, seg):
    """(kernel, grid, threads, shared memory) as Gpu::gemm_launch picks them."""
    col_blocks = cdiv(n, 128)
    if m <= 8:
        return "gemm_m8", (cdiv(n, 8 * 16 // seg), 1, 1), 512, RING_BYTES
    if m <= 16:
        return "gemm_m16", (cdiv(n, 8 * 16 // seg), 1, 1), 512, RING_BYTES
    if cdiv(m, 128) * col_blocks >= TILED_WIDE_BLOCKS:
        name = "gemm_t128" if seg == 1 else "gemm_t128_fold"
        return name, (cdiv(m, 128) * col_blocks, 1, 1), 256, ENGINE_SMEM[name]
    if cdiv(m, 64) * col_blocks >= TILED_MIN_BLOCKS:
        return "gemm_t64", (cdiv(m, 64) * col_blocks, 1, 1), 256, ENGINE_SMEM["gemm_t64"]
    stages = 2 if seg > 8 or m > 64 else 3
    name = "gemm_m64_r2" if stages == 2 else "gemm_m64"
    return name, (cdiv(n, 32), cdiv(m, 64), 1), 32 * seg, wide_smem(seg, stages)


def engine_pack(cuda, w, n, k):
    """The weight in the engine's 8 x 32 tiles, by pack_rows as Gpu::pack_rows launches it (PackPlace::Stacked(0))."""
    packed = torch.zeros(cdiv(n, 8) * 8 * k, dtype=torch.bfloat16, device=w.device)
    args = [("ptr", w.data_ptr()), ("ptr", packed.data_ptr()), ("i32", n), ("i32", k), ("i32", 0), ("i32", 0), ("i32", 8)]
    args += [("i32", 0)]  # natural: 0 packs into the tiles
    cuda.launch("pack_rows", (cdiv(n * k // 8, 256), 1, 1), (256, 1, 1), 0, args)
    return packed


def engine_run(cuda, a, wp, c, m, n, k, seg):
    name, grid, threads, smem = engine_plan(m, n, k, seg)
    args = [("ptr", a.data_ptr()), ("ptr", wp.data_ptr()), ("ptr", 0), ("ptr", c.data_ptr()), ("ptr", 0)]
    args += [("i32", m), ("i32", n), ("i32", k), ("i32", seg)]
    cuda.launch(name, grid, (threads, 1, 1), smem, args)


def ref_run(cuda, a, w, c, m, n, k, segs, bias=None):
    args = [("ptr", a.data_ptr()), ("ptr", w.data_ptr()), ("ptr", 0 if bias is None else bias.data_ptr())]
    args += [("ptr", c.data_ptr()), ("i32", m), ("i32", n), ("i32", k), ("i32", segs)]
    cuda.launch("gemm_ref", (cdiv(cdiv(m, 16) * cdiv(n, 8), 4), 1, 1), (128, 1, 1), 0, args)


REF_VARIANT = Variant(name="ref", sources=[REF_SOURCE], min_m=1, max_m=8192, run=ref_run)


def load_modules(only, skip):
    """Variant lists of the modules that exist and import; a broken one is reported and left out."""
    modules = []
    for rel in VARIANT_MODULES:
        path = os.path.join(REPO, rel)
        if not os.path.exists(path):
            print(f"[variants] {rel}: absent")
            continue
        try:
            spec = importlib.util.spec_from_file_location(os.path.basename(rel)[:-3], path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            vs = [v for v in mod.VARIANTS if re.search(only, v.name) and not (skip and re.search(skip, v.name))]
            print(f"[variants] {rel}: {len(vs)} of {len(mod.VARIANTS)} variants: {' '.join(v.name for v in vs)}")
            modules.append((rel, mod, vs))
        except Exception as e:
            print(f"[variants] {rel}: import failed, left out: {e!r}")
            traceback.print_exc()
    return modules


def sources_of(modules):
    out = [REF_SOURCE]
    for _, _, vs in modules:
        for v in vs:
            out += [s for s in v.sources if s not in out]
    return out


def build(modules, errors):
    """One Cuda of the engine, the reference and every module that compiles; modules that break it are dropped."""
    t0 = time.time()
    try:
        cuda = Cuda(sources_of(modules))
        print(f"[compile] {len(cuda.sources)} files in {time.time() - t0:.1f} s")
        return cuda, modules
    except CudaError as e:
        print(f"[compile] all modules together failed: {e}")
    kept = []
    for entry in modules:
        try:
            Cuda(sources_of([entry]))
            kept.append(entry)
        except CudaError as e:
            print(f"[compile] {entry[0]} left out: {e}")
            errors.append({"module": entry[0], "error": str(e)})
    try:
        return Cuda(sources_of(kept)), kept
    except CudaError as e:
        print(f"[compile] the surviving modules together failed too, baseline only: {e}")
        errors.append({"module": "all", "error": str(e)})
        return Cuda(sources_of([])), []


def setup_variants(cuda, modules, errors):
    variants = [REF_VARIANT]
    for rel, _, vs in modules:
        for v in vs:
            try:
                if v.setup is not None:
                    v.setup(cuda)
                variants.append(v)
            except Exception as e:
                print(f"[setup] {v.name} left out: {e!r}")
                errors.append({"variant": v.name, "error": repr(e)})
    return variants


def for_shape(variants, n, k):
    """The variants with a kernel for the shape's segments, and the workspace of the decode and split kernels
    reserved for it (512 rows at most), so no allocation happens inside a graph capture."""
    if segments(n, k) > 1:
        scratch(torch.device("cuda", torch.cuda.current_device()), segments(n, k) * 512 * n)
    return [v for v in variants if v.fits is None or v.fits(n, k)]


class ContextLost(Exception):
    pass


def alive():
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


_capture_stream = None
_no_graphs = False


def time_us(fn, target_ms=20.0):
    """Median time of one call in µs: reps calls captured in a CUDA graph, replayed several times under events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    t0 = max(start.elapsed_time(end), 1e-3)
    runs = 3 if t0 > 5.0 else 5
    reps = max(1, min(200, int(target_ms / (runs * t0))))
    global _capture_stream, _no_graphs
    if _capture_stream is None:
        _capture_stream = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    try:
        if _no_graphs:
            raise RuntimeError("an earlier capture failed")
        # Captured by hand on one side stream: torch.cuda.graph would collect garbage and empty the cache each time.
        graph = torch.cuda.CUDAGraph()
        _capture_stream.wait_stream(main)
        with torch.cuda.stream(_capture_stream):
            fn()  # per-stream state (cuBLAS's workspace) is set up outside the capture
            graph.capture_begin()
            try:
                for _ in range(reps):
                    fn()
            finally:
                graph.capture_end()
        main.wait_stream(_capture_stream)
        replay = graph.replay
    except Exception as e:
        # Launch gaps then count against the kernel; still a number rather than none.
        if not _no_graphs:
            print(f"  (graph capture failed, timing plain launches from now on: {e!r})")
        _no_graphs = True
        graph = None
        torch.cuda.synchronize()

        def replay():
            for _ in range(reps):
                fn()
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    del graph
    return statistics.median(times) * 1000.0


def copy_bandwidth():
    """Device-to-device copy of 4 GiB, bytes read plus written per second, in GB/s (as the dense torch peer counts)."""
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").fill_(1)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del x, y
    return 10 * 2 * (4 << 30) / seconds / 1e9


def make_inputs(index, n, k, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234 + index)
    w = (torch.randn(n, k, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    a = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
    return a, w


def record(results, shape, n, k, m, kernel, us, out_bytes, cublas_tflops, copy_gbs):
    flops = 2.0 * m * n * k
    tflops = flops / (us * 1e-6) / 1e12
    gbs = (n * k * 2 + m * k * 2 + m * n * out_bytes) / (us * 1e-6) / 1e9
    row = {"shape": shape, "n": n, "k": k, "m": m, "kernel": kernel, "us": round(us, 2), "tflops": round(tflops, 2),
           "gbs": round(gbs, 1), "vs_cublas": round(tflops / cublas_tflops, 3) if cublas_tflops else None,
           "pct_copy": round(100.0 * gbs / copy_gbs, 1) if m <= 16 else None}
    results.append(row)
    ratio = f"{row['vs_cublas']:.2f}x" if row["vs_cublas"] else "-"
    pct = f"{row['pct_copy']:.0f}% copy" if row["pct_copy"] is not None else ""
    print(f"  {shape:12s} M={m:5d} {kernel:24s} {us:10.1f} us {tflops:8.1f} TFLOP/s {gbs:8.0f} GB/s {ratio:>7s} {pct}",
          flush=True)
    return row


def bits_equal(x, y):
    return x.shape == y.shape and torch.equal(x.view(torch.int32), y.view(torch.int32))


def mismatch(x, y):
    if x.shape != y.shape:
        return f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
    bad = x.view(torch.int32) != y.view(torch.int32)
    where = bad.nonzero()[0].tolist()
    diff = (x.double() - y.double()).abs().nan_to_num(float("inf")).max().item()
    return f"{int(bad.sum())} of {x.numel()} differ, first at {where}, max abs diff {diff:.3e}"


def check_shape(cuda, variants, modules, index, shape, n, k, check_ms, checks):
    """Bitwise checks of every variant against the reference on one shape."""
    top = max(check_ms)
    a_full, w = make_inputs(index, n, k, top)
    segs, variants = segments(n, k), for_shape(variants, n, k)
    print(f"  {shape}: K in {segs} segment(s); {len(variants)} variants fit")

    def run(v, a):
        m = a.shape[0]
        c = torch.full((m, n), float("nan"), device="cuda")
        v.run(cuda, a, w, c, m, n, k, segs)
        return c

    def rows_of(v):
        return torch.cat([run(v, a_full[i : i + 1].clone()) for i in range(top)])

    ref_rows = rows_of(REF_VARIANT)
    ref_top = run(REF_VARIANT, a_full.clone())
    exact = (a_full.float() @ w.float().t())
    diff = (ref_top - exact).abs().max().item()
    rel = diff / exact.abs().max().item()
    sanity = {"shape": shape, "m": top, "max_abs_diff": diff, "relative": rel, "ok": rel < 1e-4}
    print(f"  [sanity] {shape}: reference vs torch f32 matmul at M={top}: max abs diff {diff:.3e}, {rel:.2e} relative"
          + ("" if sanity["ok"] else "  <- TOO LARGE: the reference itself is suspect"))
    for v in variants:
        ms = [m for m in check_ms if v.min_m <= m <= v.max_m]
        if not ms:
            continue
        try:
            base, base_name = (rows_of(v), "own M=1") if v.min_m <= 1 and v is not REF_VARIANT else (ref_rows, "ref M=1")
            fails = []
            for m in ms:
                a = a_full[:m].clone()
                c = run(v, a)
                want = ref_top[:m] if v is REF_VARIANT else run(REF_VARIANT, a)
                for kind, other in (("ref", want), ("rows", base[:m])):
                    if v is REF_VARIANT and kind == "ref":
                        continue
                    ok = bits_equal(c, other)
                    entry = {"variant": v.name, "shape": shape, "m": m, "kind": kind, "pass": ok}
                    if not ok:
                        entry["detail"] = mismatch(c, other)
                        fails.append(f"M={m} {kind}: {entry['detail']}")
                    checks.append(entry)
            status = "PASS" if not fails else "FAIL"
            print(f"  {status} {v.name:24s} {shape:12s} M in {ms[0]}..{ms[-1]} ({len(ms)} sizes; rows vs {base_name})")
            for f in fails[:6]:
                print(f"       {f}")
        except CudaError as e:
            print(f"  FAIL {v.name:24s} {shape:12s} launch error: {e}")
            checks.append({"variant": v.name, "shape": shape, "m": None, "kind": "launch", "pass": False, "detail": str(e)})
            if not alive():
                raise ContextLost(f"{v.name} on {shape}: {e}")
        except Exception as e:
            if not alive():
                raise ContextLost(f"{v.name} on {shape}: {e!r}")
            print(f"  FAIL {v.name:24s} {shape:12s} error: {e!r}")
            checks.append({"variant": v.name, "shape": shape, "m": None, "kind": "error", "pass": False, "detail": repr(e)})
    for rel_path, mod, vs in modules:
        swiglu = getattr(mod, "swiglu_run", None)
        if swiglu is None or not vs or "gate_up" not in shape:
            continue
        for m in SWIGLU_MS:
            try:
                a = a_full[:m].clone()
                act = torch.empty(m, n // 2, dtype=torch.bfloat16, device="cuda")
                swiglu(cuda, a, w, act, m, n, k)
                want = torch.empty_like(act)
                ref_c = run(REF_VARIANT, a)
                cuda.launch("gemm_ref_swiglu", (cdiv(m * (n // 2), 256), 1, 1), (256, 1, 1), 0,
                            [("ptr", ref_c.data_ptr()), ("ptr", want.data_ptr()), ("i32", m), ("i32", n)])
                ok = torch.equal(act.view(torch.int16), want.view(torch.int16))
                detail = "" if ok else f"{int((act.view(torch.int16) != want.view(torch.int16)).sum())} differ"
            except Exception as e:
                if not alive():
                    raise ContextLost(f"swiglu of {rel_path} on {shape}: {e!r}")
                ok, detail = False, repr(e)
            checks.append({"variant": f"{os.path.basename(rel_path)}:swiglu", "shape": shape, "m": m, "kind": "swiglu",
                           "pass": ok, "detail": detail})
            print(f"  {'PASS' if ok else 'FAIL'} swiglu ({os.path.basename(rel_path)}) {shape} M={m} {detail}")
    del a_full, w
    return sanity


def time_shape(cuda, variants, index, shape, n, k, time_ms, baseline, results, copy_gbs, cublas, warnings):
    a_full, w = make_inputs(index, n, k, max(time_ms))
    wp = engine_pack(cuda, w, n, k) if baseline else None
    seg = choose_segments(n, k)
    segs, variants = segments(n, k), for_shape(variants, n, k)
    for m in time_ms:
        a = a_full[:m]
        c = torch.empty(m, n, device="cuda")
        if baseline:
            cb = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            us = time_us(lambda: torch.matmul(a, w.t(), out=cb))
            cublas[(shape, m)] = 2.0 * m * n * k / (us * 1e-6) / 1e12
            record(results, shape, n, k, m, "cublas", us, 2, cublas[(shape, m)], copy_gbs)
            del cb
            name = engine_plan(m, n, k, seg)[0]
            us = time_us(lambda: engine_run(cuda, a, wp, c, m, n, k, seg))
            record(results, shape, n, k, m, f"engine:{name}/s{seg}", us, 4, cublas[(shape, m)], copy_gbs)
            if m in (1, 16, 128, 512):
                exact = a.float() @ w.float().t()
                rel = ((c - exact).abs().max() / exact.abs().max()).item()
                if not rel < 1e-4:
                    warnings.append(f"engine {name} on {shape} M={m}: {rel:.2e} relative error: the dispatch mirror is off")
                    print(f"  WARNING {warnings[-1]}")
        for v in variants:
            if (v is REF_VARIANT) != baseline or not v.min_m <= m <= v.max_m:
                continue
            if v is REF_VARIANT and m > REF_TIME_MAX_M:
                continue
            try:
                us = time_us(lambda: v.run(cuda, a, w, c, m, n, k, segs))
                record(results, shape, n, k, m, v.name, us, 4, cublas.get((shape, m)), copy_gbs)
            except Exception as e:
                if not alive():
                    raise ContextLost(f"timing {v.name} on {shape} M={m}: {e!r}")
                print(f"  {v.name} on {shape} M={m}: error {e!r}")
                warnings.append(f"timing {v.name} on {shape} M={m}: {e!r}")
        del c
    del a_full, w, wp
    torch.cuda.empty_cache()


def markdown(report):
    lines = [f"# GEMM bench: {report['device']}", "",
             f"Copy bandwidth (a 4 GiB device copy, read + write): {report['copy_gbs']:.0f} GB/s", ""]
    rows = report["results"]
    lines += ["## Best per shape and M", "",
              "| shape | M | cuBLAS µs | engine µs | best new | µs | TFLOP/s | x cuBLAS | % copy |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    keys = sorted({(r["shape"], r["m"]) for r in rows}, key=lambda s: ([x[0] for x in SHAPES].index(s[0]), s[1]))
    for shape, m in keys:
        here = [r for r in rows if r["shape"] == shape and r["m"] == m]
        cub = next((r for r in here if r["kernel"] == "cublas"), None)
        eng = next((r for r in here if r["kernel"].startswith("engine:")), None)
        new = [r for r in here if r["kernel"] != "cublas" and not r["kernel"].startswith("engine:") and r["kernel"] != "ref"]
        best = min(new, key=lambda r: r["us"]) if new else None
        fmt = lambda r, key: "-" if r is None or r.get(key) is None else f"{r[key]}"  # noqa: E731
        lines.append(f"| {shape} | {m} | {fmt(cub, 'us')} | {fmt(eng, 'us')} | {best['kernel'] if best else '-'} | "
                     f"{fmt(best, 'us')} | {fmt(best, 'tflops')} | {fmt(best, 'vs_cublas')} | {fmt(best, 'pct_copy')} |")
    lines += ["", "## Every measurement", "",
              "| shape | N | K | M | kernel | µs | TFLOP/s | GB/s | x cuBLAS | % copy |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['n']} | {r['k']} | {r['m']} | {r['kernel']} | {r['us']} | {r['tflops']} | "
                     f"{r['gbs']} | {r['vs_cublas'] if r['vs_cublas'] is not None else '-'} | "
                     f"{r['pct_copy'] if r['pct_copy'] is not None else '-'} |")
    checks = report["checks"]
    failed = [c for c in checks if not c["pass"]]
    lines += ["", f"## Exactness: {len(checks) - len(failed)} of {len(checks)} checks pass", ""]
    for c in failed:
        lines.append(f"- FAIL {c['variant']} {c['shape']} M={c['m']} {c['kind']}: {c.get('detail', '')}")
    for s in report["ref_sanity"]:
        lines.append(f"- reference vs f32 matmul, {s['shape']} M={s['m']}: max abs {s['max_abs_diff']:.3e}, "
                     f"relative {s['relative']:.2e}")
    for w in report["warnings"] + [json.dumps(e) for e in report["errors"]]:
        lines.append(f"- {w}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="", help="regex: variants to keep")
    p.add_argument("--skip", default="", help="regex: variants to leave out")
    p.add_argument("--shapes", default="", help="regex: shapes to keep")
    p.add_argument("--ms", default="", help="comma-separated M values to time (default: all, or --quick's)")
    p.add_argument("--no-time", action="store_true", help="checks only")
    p.add_argument("--no-check", action="store_true", help="timing only")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    shapes = [(i, *s) for i, s in enumerate(SHAPES) if re.search(args.shapes, s[0])]
    if args.quick:
        shapes = [s for s in shapes if s[1] in QUICK_SHAPES]
    time_ms = QUICK_TIME_MS if args.quick else TIME_MS
    if args.ms:
        time_ms = [int(m) for m in args.ms.split(",")]
    check_ms = QUICK_CHECK_MS if args.quick else CHECK_MS
    errors, warnings = [], []
    modules = load_modules(args.only, args.skip)
    cuda, modules = build(modules, errors)
    # The engine's kernels take the shared memory Gpu::open allows them (allow_shared_memory in gemm.rs).
    for name, nbytes in ENGINE_SMEM.items():
        cuda.set_smem(name, nbytes)
    variants = setup_variants(cuda, modules, errors)
    report = {"device": torch.cuda.get_device_name(), "sms": cuda.sm_count(), "quick": args.quick,
              "variants": [{"name": v.name, "min_m": v.min_m, "max_m": v.max_m, "sources": v.sources} for v in variants],
              "registers": {}, "results": [], "checks": [], "ref_sanity": [], "errors": errors, "warnings": warnings}
    for name in sorted(set(re.findall(r"\.entry (gemm\w*)\(", cuda.ptx.decode(errors="replace")))):
        regs, local = cuda.registers(name)
        report["registers"][name] = {"registers": regs, "local_bytes": local}
        print(f"[registers] {name}: {regs} registers, {local} bytes local (spills)")

    def write():
        report["seconds"] = round(time.time() - t_start, 1)
        per = {}
        for c in report["checks"]:
            per.setdefault(c["variant"], {"pass": 0, "fail": 0})["pass" if c["pass"] else "fail"] += 1
        failed = sum(v["fail"] for v in per.values())
        report["check_summary"] = {"total": len(report["checks"]), "failed": failed, "per_variant": per}
        with open(os.path.join(args.out, "gemm_bench.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "gemm_bench.md"), "w") as f:
            f.write(markdown(report))

    cublas = {}
    try:
        report["copy_gbs"] = copy_gbs = copy_bandwidth()
        print(f"[copy] device copy bandwidth {copy_gbs:.0f} GB/s (read + write)")
        write()
        if not args.no_time:
            print("[time] cuBLAS, the engine and the reference")
            for index, shape, n, k in shapes:
                time_shape(cuda, variants, index, shape, n, k, time_ms, True, report["results"], copy_gbs, cublas, warnings)
                write()
        if not args.no_check:
            print("[check] every variant against the reference, bit for bit")
            for index, shape, n, k in shapes:
                if "lm_head" in shape:
                    continue
                report["ref_sanity"].append(check_shape(cuda, variants, modules, index, shape, n, k, check_ms, report["checks"]))
                torch.cuda.empty_cache()
                write()
        if not args.no_time and len(variants) > 1:
            print("[time] new-family variants")
            for index, shape, n, k in shapes:
                time_shape(cuda, variants, index, shape, n, k, time_ms, False, report["results"], copy_gbs, cublas, warnings)
                write()
    except ContextLost as e:
        print(f"FATAL: the CUDA context died: {e}; partial results written; rerun with --skip for the variant")
        warnings.append(f"context lost: {e}")
        write()
        sys.exit(2)
    write()
    failed = [c for c in report["checks"] if not c["pass"]]
    print(f"[done] {len(report['checks']) - len(failed)} of {len(report['checks'])} checks pass; "
          f"{len(report['results'])} timings; {report['seconds']} s; results in {args.out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
