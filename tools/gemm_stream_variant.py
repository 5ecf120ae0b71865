"""Variants of kernels/cuda/gemm_stream.cu (decode, M = 1..64: TMA weight ring + mma.sync) for tools/gemm_bench.py.

Every variant computes C = A W^T in the reference's order (K in S = gemm_cuda.segments(N, K) segments, each from +0
in k16 steps ascending, the segment sums added in order, then the bias); they differ only in the weight bytes a
stage holds and in blocks per SM, so one run picks the best.

Launch (plan below): R = min(SMs * per_sm // S, T) tile runs for T = ceil(N / 8) 8-row tiles, grid = R S blocks
(block b owns segment b % S of run r = b / S: tiles [r T / R, (r + 1) T / R), walked in passes of at most
pt <= 32 tiles, and k [s K / S, (s + 1) K / S)), 288 threads (8 consumer warps of up to 4 tiles each and a producer
warp), dynamic shared memory 1024 + slots * (kc * (32 MT + 16 pt) * 64 + 16). A stage is kc chunks of 64 k: one A
box of 16 MT rows and one weight box of 8 pt rows (the weight map's box) per chunk. With S > 1 the kernel also takes
an f32 workspace of S M N floats and R zeroed int32 arrival counters (gemm_cuda.scratch), which it leaves zero.
Kernels by M: gemm_stream_m16 / _m32 / _m48 / _m64 (A tiles of 16 MT rows, MT = 1..4); two blocks an SM use
gemm_stream_m16_x2 / _m32_x2, whose register budget stops at 32 rows.
"""


from gemm_cuda import Variant, scratch, segments, sm_count, swizzled_map

SOURCE = "kernels/cuda/gemm_stream.cu"
THREADS = 288
# GS_WARPS * GS_TPW in the .cu file: tiles a pass holds, so the weight box stays within TMA's 256 rows.
PASS_TILES = 32
# Shared memory a block may have with one block an SM, and with two (228 KB an SM, 1 KB of it reserved a block).
MAX_SMEM = {1: 232448, 2: 115712}
MAX_SLOTS = 16
MAX_KC = 16
KERNELS = {
    1: {16: "gemm_stream_m16", 32: "gemm_stream_m32", 48: "gemm_stream_m48", 64: "gemm_stream_m64"},
    2: {16: "gemm_stream_m16_x2", 32: "gemm_stream_m32_x2"},
}


def cdiv(a, b):
    return (a + b - 1) // b


def plan(m, n, k, sms, per_sm=1, stage_bytes=32 << 10, min_slots=4, segs=1):
    """(kernel, A box rows, grid, pt, kc, slots, shared memory) of a launch: stages aim at stage_bytes of weights,
    fewer where that would leave under min_slots stages in the ring."""
    rows = next(r for r in sorted(KERNELS[per_sm]) if m <= r)
    mt = rows // 16
    tiles = cdiv(n, 8)
    runs = min(max(1, sms * per_sm // segs), tiles)
    grid = runs * segs
    most = cdiv(tiles, runs)
    k = k // segs
    # Passes of equal size, each one weight box a chunk.
    pt = cdiv(most, cdiv(most, PASS_TILES))
    w_chunk, a_chunk = pt * 1024, mt * 2048
    kc = max(1, min(k // 64, MAX_KC, round(stage_bytes / w_chunk)))
    budget = MAX_SMEM[per_sm] - 1024
    # A stage's A boxes (16 MT rows a chunk) can outweigh a few weight rows: the ring keeps enough stages in flight.
    while kc > 1 and budget // (kc * (w_chunk + a_chunk) + 16) < min_slots:
        kc -= 1
    slots = min(MAX_SLOTS, budget // (kc * (w_chunk + a_chunk) + 16))
    assert slots >= 2, "gemm_stream: two stages do not fit"
    smem = 1024 + slots * (kc * (w_chunk + a_chunk) + 16)
    return KERNELS[per_sm][rows], rows, grid, pt, kc, slots, smem


def launch(cuda, a, w, bias, c, m, n, k, per_sm=1, stage_bytes=32 << 10, min_slots=4, segs=None):
    """C (f32 [m, n]) = A W^T (+ bias) for 1 <= m <= 64 (32 with two blocks an SM), in segments(n, k) segments."""
    segs = segments(n, k) if segs is None else segs
    assert 1 <= m <= max(KERNELS[per_sm]), "gemm_stream: M within the kernels'"
    assert k % (64 * segs) == 0, "gemm_stream: K / S a multiple of 64"
    assert a.is_contiguous() and w.is_contiguous() and c.is_contiguous()
    kernel, rows, grid, pt, kc, slots, smem = plan(m, n, k, sm_count(a.device), per_sm, stage_bytes, min_slots, segs)
    ws, counters = (None, None)
    if segs > 1:
        ws, counters = scratch(a.device, segs * m * n)
        assert counters.numel() >= grid // segs, "gemm_stream: more tile runs than arrival counters"
    args = [
        ("map", swizzled_map(cuda, a, m, k, rows)),
        ("map", swizzled_map(cuda, w, n, k, 8 * pt)),
        ("ptr", 0 if bias is None else bias.data_ptr()),
        ("ptr", c.data_ptr()),
        ("ptr", 0 if ws is None else ws.data_ptr()),
        ("ptr", 0 if counters is None else counters.data_ptr()),
        ("i32", m),
        ("i32", n),
        ("i32", k),
        ("i32", slots),
        ("i32", kc),
        ("i32", pt),
        ("i32", segs),
    ]
    cuda.launch(kernel, (grid, 1, 1), (THREADS, 1, 1), smem, args)


def _setup(cuda):
    for per_sm, kernels in KERNELS.items():
        for kernel in kernels.values():
            cuda.set_smem(kernel, MAX_SMEM[per_sm])


def _variant(name, stage_kb, per_sm=1, min_slots=4):
    def run(cuda, a, w, c, m, n, k, segs):
        launch(cuda, a, w, None, c, m, n, k, per_sm=per_sm, stage_bytes=stage_kb << 10, min_slots=min_slots, segs=segs)

    return Variant(name=name, sources=[SOURCE], min_m=1, max_m=max(KERNELS[per_sm]), run=run, setup=_setup)


VARIANTS = [
    _variant("stream_s16", 16),
    _variant("stream_s32", 32),
    # Longer runs of each weight row a stage (fewer, larger DRAM bursts), fewer stages in the ring.
    _variant("stream_s64", 64, min_slots=3),
    # Two blocks an SM: half the tiles a block, so the small shapes (o, down) split finer.
    _variant("stream_2x_s16", 16, per_sm=2, min_slots=3),
]
