"""Variants of kernels/cuda/gemm_tma.cu (TMA + wgmma, persistent, warp-specialized) for tools/gemm_bench.py.

Every variant computes C = A W^T in the reference's order (K in S = gemm_cuda.segments(N, K) segments, each from +0
in k16 steps ascending, the segment sums added in order, then the bias); they differ only in tile shape, stage count,
cluster and walk, so the bench can pick the fastest per shape. S = 1 runs the plain kernels; S > 1 runs a kernel's
segmented twin (_s: a running sum beside the accumulator), which exists only where both fit the registers, so the
other variants fit only S = 1 shapes. A split twin (_k) gives each (tile, segment) pair its own CTA, writes the
segment's sum to a workspace plane and lets the tile's last CTA add the planes in order (gemm_cuda.scratch).

Launch of each: grid = min(SMs, units * cluster) CTAs (a multiple of the cluster), 384 threads (a producer
warpgroup, two consumer warpgroups), dynamic shared memory 1024 + stages * ((BM + BN) * 128 + 16) bytes, cluster
(2, 1, 1) for the _c2 (pair shares the weight tile) and _a2 (pair shares the activation tile) kernels; the last
argument is S (the plain kernels ignore it).

swiglu_run(cuda, a, w, act, m, n, k, kernel=..., bias=None) runs the SwiGLU epilogue: W's rows interleave 8-row
gate and up tiles (N a multiple of 16), act is bf16 [m, n // 2], act[r][j] = silu_mul(gate + bias, up + bias); the
bench checks it against the reference's C passed through silu_mul on the host.
"""


from gemm_cuda import Variant, scratch, segments, sm_count, swizzled_map

SOURCE = "kernels/cuda/gemm_tma.cu"
THREADS = 384

# Kernel: (BM, BN, stages, CM, CN), as the TMA_ENTRY lines of the .cu file declare them.
KERNELS = {
    "gemm_tma_128x256": (128, 256, 4, 1, 1),
    "gemm_tma_128x256_c2": (128, 256, 4, 2, 1),
    "gemm_tma_128x224": (128, 224, 5, 1, 1),
    "gemm_tma_128x224_c2": (128, 224, 5, 2, 1),
    "gemm_tma_128x192": (128, 192, 5, 1, 1),
    "gemm_tma_128x192_c2": (128, 192, 5, 2, 1),
    "gemm_tma_256x128": (256, 128, 4, 1, 1),
    "gemm_tma_256x128_c2": (256, 128, 4, 2, 1),
    "gemm_tma_128x128": (128, 128, 7, 1, 1),
    "gemm_tma_128x128_c2": (128, 128, 7, 2, 1),
    "gemm_tma_64x256": (64, 256, 5, 1, 1),
    "gemm_tma_64x128": (64, 128, 9, 1, 1),
    "gemm_tma_64x128_c2": (64, 128, 9, 2, 1),
    "gemm_tma_64x128_a2": (64, 128, 9, 1, 2),
    "gemm_tma_64x64": (64, 64, 14, 1, 1),
    "gemm_tma_64x64_a2": (64, 64, 14, 1, 2),
    "gemm_tma_64x32": (64, 32, 18, 1, 1),
    "gemm_tma_64x32_a2": (64, 32, 18, 1, 2),
}
# The segmented twins (gemm_tma<..., SEG = true>): the same tiles, stages and clusters.
SEGMENTED = ["gemm_tma_128x192", "gemm_tma_128x128", "gemm_tma_128x128_c2", "gemm_tma_64x256", "gemm_tma_64x128",
             "gemm_tma_64x128_c2", "gemm_tma_64x128_a2", "gemm_tma_64x64", "gemm_tma_64x64_a2", "gemm_tma_64x32",
             "gemm_tma_64x32_a2"]
KERNELS.update({f"{name}_s": KERNELS[name] for name in SEGMENTED})
# The split twins (gemm_tma<..., SPLIT = true>).
SPLIT = ["gemm_tma_128x256", "gemm_tma_128x128", "gemm_tma_64x256", "gemm_tma_64x128"]
KERNELS.update({f"{name}_k": KERNELS[name] for name in SPLIT})


def kernel_for(kernel, segs):
    """The kernel that computes S = segs segments: the plain one for 1, else its segmented or split twin (None if
    none); a name ending in _k asks for the split twin."""
    if kernel.endswith("_k"):
        return kernel if segs > 1 else None
    if segs == 1:
        return kernel
    return kernel + "_s" if kernel in SEGMENTED else None

# Rows of A that one group of the walk spans: the CTAs at work together share those A tiles and a few W tiles in L2.
GROUP_ROWS = 2048


def smem_bytes(kernel):
    bm, bn, stages, _, _ = KERNELS[kernel]
    return 1024 + stages * ((bm + bn) * 128 + 16)


def launch(cuda, kernel, a, w, bias, c, act, m, n, k, group_rows=GROUP_ROWS, ctas=None, segs=None):
    """One launch of `kernel` (or its segmented twin where segments(n, k) > 1): C (f32 [m, n]) when act is None,
    else the SwiGLU act (bf16 [m, n // 2]).

    ctas caps the grid (a multiple of the cluster): with 1 or 2, one CTA or pair walks every tile, for debugging.
    """
    segs = segments(n, k) if segs is None else segs
    kernel = kernel_for(kernel.removesuffix("_s"), segs)
    assert kernel is not None, f"no segmented kernel for S = {segs}"
    bm, bn, _, cm, cn = KERNELS[kernel]
    assert k % (64 * segs) == 0, "K / S must be a multiple of 64"
    assert a.is_contiguous() and w.is_contiguous()
    if act is not None:
        assert n % 16 == 0, "SwiGLU needs whole 16-row gate/up pairs"
    cluster = cm * cn
    mu = ((m + bm - 1) // bm + cm - 1) // cm
    nu = ((n + bn - 1) // bn + cn - 1) // cn
    split = kernel.endswith("_k")
    units = mu * nu * (segs if split else 1)
    ws, counters = scratch(a.device, segs * m * n) if split else (None, None)
    if split:
        assert counters.numel() >= mu * nu, "gemm_tma: more tiles than arrival counters"
    sms = sm_count(a.device)
    grid = min(sms // cluster, units) * cluster
    if ctas is not None:
        grid = min(grid, ctas // cluster * cluster)
    group = max(1, min(mu, group_rows // (bm * cm)))
    args = [
        ("map", swizzled_map(cuda, a, m, k, bm // cn)),
        ("map", swizzled_map(cuda, w, n, k, bn // cm)),
        ("ptr", 0 if bias is None else bias.data_ptr()),
        ("ptr", 0 if c is None else c.data_ptr()),
        ("ptr", 0 if act is None else act.data_ptr()),
        ("ptr", 0 if ws is None else ws.data_ptr()),
        ("ptr", 0 if counters is None else counters.data_ptr()),
        ("i32", m),
        ("i32", n),
        ("i32", k),
        ("i32", group),
        ("i32", segs),
    ]
    cuda.launch(kernel, (grid, 1, 1), (THREADS, 1, 1), smem_bytes(kernel), args, cluster=(cluster, 1, 1))


def swiglu_run(cuda, a, w, act, m, n, k, kernel="gemm_tma_128x256", bias=None):
    """act[r][j] = silu_mul(gate, up) of W's interleaved 8-row gate/up tiles; no C is written."""
    launch(cuda, kernel, a, w, bias, None, act, m, n, k)


def _setup(kernels):
    def setup(cuda):
        for kernel in kernels:
            cuda.set_smem(kernel, smem_bytes(kernel))

    return setup


def _variant(kernel, min_m, max_m, group_rows=GROUP_ROWS, suffix=""):
    def run(cuda, a, w, c, m, n, k, segs):
        launch(cuda, kernel, a, w, None, c, None, m, n, k, group_rows, segs=segs)

    def fits(n, k):
        return kernel_for(kernel, segments(n, k)) is not None

    name = kernel.replace("gemm_tma_", "tma_") + suffix
    kernels = [kernel] + ([kernel + "_s"] if kernel in SEGMENTED else [])
    return Variant(name=name, sources=[SOURCE], min_m=min_m, max_m=max_m, run=run, setup=_setup(kernels), fits=fits)


VARIANTS = [
    _variant("gemm_tma_128x256", 64, 1 << 20),
    _variant("gemm_tma_128x256", 64, 1 << 20, group_rows=512, suffix="_g512"),
    _variant("gemm_tma_128x256_c2", 128, 1 << 20),
    _variant("gemm_tma_128x224", 64, 1 << 20),
    _variant("gemm_tma_128x224_c2", 128, 1 << 20),
    _variant("gemm_tma_128x192", 64, 1 << 20),
    _variant("gemm_tma_128x192_c2", 128, 1 << 20),
    _variant("gemm_tma_256x128", 128, 1 << 20),
    _variant("gemm_tma_256x128_c2", 256, 1 << 20),
    _variant("gemm_tma_128x128", 64, 1 << 20),
    _variant("gemm_tma_128x128_c2", 256, 1 << 20),
    _variant("gemm_tma_64x256", 64, 2048),
    _variant("gemm_tma_64x128", 64, 2048),
    _variant("gemm_tma_64x128_c2", 128, 2048),
    _variant("gemm_tma_64x128_a2", 64, 2048),
    _variant("gemm_tma_64x64", 64, 1024),
    _variant("gemm_tma_64x64_a2", 64, 1024),
    _variant("gemm_tma_64x32", 64, 512),
    _variant("gemm_tma_64x32_a2", 64, 512),
    _variant("gemm_tma_128x256_k", 64, 512),
    _variant("gemm_tma_128x128_k", 64, 512),
    _variant("gemm_tma_64x256_k", 64, 512),
    _variant("gemm_tma_64x128_k", 64, 512),
]
