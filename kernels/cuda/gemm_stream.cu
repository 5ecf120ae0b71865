// Decode rounds (M = 1..64) of the exact family: weights stream once through a TMA-fed shared-memory ring, mma.sync sums them in gemm_ref.cu's order.
// K in `segs` segments fixed per weight shape (gemm_ref.cu's order), never by M, so a row's bits never depend on M or on the other rows.
// Persistent: block b owns segment b % segs of a contiguous run of 8-row weight tiles, so each weight byte is read once and every
// SM streams the same amount; small N gets segs times the rows in flight. With segs > 1 each block writes its segment's partial
// sums to a workspace and the run's last block to arrive adds them in segment order (then the bias) into C.
// A stage is a few 64-k chunks; each chunk is one TMA box of all of a pass's weight rows (up to 256) and one box of A,
// so a block issues two copies a chunk however many tiles it owns (many small boxes bound the copy rate).
// TMA's 128-byte swizzle puts the 8 rows of every ldmatrix in 8 distinct bank groups while the k order stays natural.

#if __CUDA_ARCH__ >= 900

// A CUtensorMap: 128 opaque bytes encoded on the host (cuTensorMapEncodeTiled), a __grid_constant__ parameter.
struct alignas(64) GsMap {
    unsigned long long data[16];
};

#define GS_WARPS 8
#define GS_THREADS (32 * (GS_WARPS + 1))
// Tiles a warp holds at once: their accumulator chains interleave, so the mma latency hides behind the other chains.
#define GS_TPW 4
__device__ __forceinline__ void gs_load(u32 dst, const GsMap* map, u32 bar, int col, int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"((u64)map), "r"(col), "r"(row), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void gs_ldmatrix4(u32* r, u32 at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

__device__ __forceinline__ void gs_mma(float* d, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Where 16-byte chunk `chunk` of row `row` of a 128-byte-swizzled box starting 1024-aligned at `box` lies.
__device__ __forceinline__ u32 gs_swizzled(u32 box, int row, int chunk) {
    return box + row * 128 + ((chunk ^ (row & 7)) << 4);
}

// How a block walks its tiles: passes of at most `pt` tiles (the weight box is 8 pt rows), each over its K segment in
// stages of `kc` chunks of 64 k. A stage holds kc A boxes (16 MT rows each), then kc weight boxes (8 pt rows each).
struct GsPlan {
    int t0, cnt, passes, kst, kbs, kc, k0;
    u32 abytes, wbytes, stage_bytes;
    // First tile of pass p: the block's tiles split evenly, so no pass exceeds pt tiles.
    __device__ __forceinline__ int first(int p) const { return t0 + (int)((long long)p * cnt / passes); }
};

template <int MT>
__device__ __forceinline__ GsPlan gs_plan(int n, int k, int kc, int pt, int segs) {
    GsPlan P;
    // Block b: segment b % segs of tile run b / segs.
    const int tiles = (n + 7) / 8, runs = gridDim.x / segs, run = blockIdx.x / segs;
    P.t0 = (int)((long long)run * tiles / runs);
    P.cnt = (int)((long long)(run + 1) * tiles / runs) - P.t0;
    P.passes = (P.cnt + pt - 1) / pt;
    P.kbs = k / segs / 64;
    P.k0 = (blockIdx.x % segs) * (k / segs);
    P.kc = kc;
    P.kst = (P.kbs + kc - 1) / kc;
    P.abytes = MT * 16 * 128;
    P.wbytes = pt * 8 * 128;
    P.stage_bytes = kc * (P.abytes + P.wbytes);
    return P;
}

// One half-chunk (32 k, two k16 steps) of fragments for a warp: B of each of its tiles, A of both steps.
template <int MT>
struct GsFrags {
    u32 b[GS_TPW][4];
    u32 a[2][MT][4];
};

// Half h of the stage: chunk h / 2, k16 steps 2 (h % 2) and 2 (h % 2) + 1. Lane l addresses row l % 8 of matrix
// l / 8: B's matrices are 16-byte chunks 4 (h % 2) + 0..3 of the tile's 8 rows (b0, b1 of the first step, then the
// second); A's are rows 0-7 and 8-15 of chunk 2 step, then the same rows of chunk 2 step + 1 (mma.sync's a0..a3).
template <int MT>
__device__ __forceinline__ void gs_fetch(GsFrags<MT>& f, const GsPlan& P, u32 stage, int h, int g, int warp, int lr, int li) {
    const int j = h >> 1, p = h & 1;
    const u32 wbox = stage + P.kc * P.abytes + j * P.wbytes;
#pragma unroll
    for (int i = 0; i < GS_TPW; ++i)
        if (warp + i * GS_WARPS < g) gs_ldmatrix4(f.b[i], gs_swizzled(wbox + (warp + i * GS_WARPS) * 1024, lr, 4 * p + li));
    const u32 abox = stage + j * P.abytes;
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int t = 0; t < MT; ++t)
            gs_ldmatrix4(f.a[s][t], gs_swizzled(abox, t * 16 + (li & 1) * 8 + lr, 2 * (2 * p + s) + (li >> 1)));
}

// The half's two k16 steps in ascending order on every accumulator of the warp; the tiles' chains interleave.
template <int MT>
__device__ __forceinline__ void gs_steps(float (*acc)[MT][4], const GsFrags<MT>& f, int g, int warp) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int i = 0; i < GS_TPW; ++i)
            if (warp + i * GS_WARPS < g) {
#pragma unroll
                for (int t = 0; t < MT; ++t) gs_mma(acc[i][t], f.a[s][t], f.b[i][2 * s], f.b[i][2 * s + 1]);
            }
}

// Stage s of the block's walk: its pass, first chunk, chunks, ring slot.
struct GsStage {
    int pass, j0, nj, slot;
};

__device__ __forceinline__ GsStage gs_stage(const GsPlan& P, int s, int slots) {
    GsStage S;
    S.pass = s / P.kst;
    S.j0 = (s - S.pass * P.kst) * P.kc;
    S.nj = min(P.kc, P.kbs - S.j0);
    S.slot = s % slots;
    return S;
}

// The weight boxes of stage s, announcing the whole stage's bytes (A's too): rows past N arrive zero-filled and count.
__device__ __forceinline__ void gs_issue_w(const GsPlan& P, const GsMap* map_w, u32 base, u32 full, int s, int slots) {
    const GsStage S = gs_stage(P, s, slots);
    const u32 stage = base + S.slot * P.stage_bytes, bar = full + 8 * S.slot;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(S.nj * (P.abytes + P.wbytes))
                 : "memory");
    const int row0 = P.first(S.pass) * 8;
    for (int j = 0; j < S.nj; ++j) gs_load(stage + P.kc * P.abytes + j * P.wbytes, map_w, bar, P.k0 + (S.j0 + j) * 64, row0);
}

__device__ __forceinline__ void gs_issue_a(const GsPlan& P, const GsMap* map_a, u32 base, u32 full, int s, int slots) {
    const GsStage S = gs_stage(P, s, slots);
    const u32 stage = base + S.slot * P.stage_bytes, bar = full + 8 * S.slot;
    for (int j = 0; j < S.nj; ++j) gs_load(stage + j * P.abytes, map_a, bar, P.k0 + (S.j0 + j) * 64, 0);
}

// The run's last block to arrive adds the segs partials of its columns in segment order, then the bias, into C;
// the counter goes back to zero for the next launch. Consumer warps only (named barrier 1).
__device__ __forceinline__ void gs_fold(const GsPlan& P, const float* __restrict__ bias, float* __restrict__ c,
                                        const float* ws, int* counters, int m, int n, int segs) {
    const int run = blockIdx.x / segs;
    // Every thread's partials reach L2 before the block's arrival is counted.
    __threadfence();
    asm volatile("bar.sync 1, %0;\n" ::"n"(GS_WARPS * 32) : "memory");
    u32 last = 0;
    if (threadIdx.x == 0) {
        last = atomicAdd(counters + run, 1) == segs - 1;
        if (last) counters[run] = 0;
        __threadfence();
    }
    // A barrier that also hands thread 0's verdict to every consumer thread (no static shared memory: the host
    // gives the dynamic ring all a block may have).
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\nbar.red.popc.u32 %0, 1, %2, p;\n}\n"
                 : "=r"(last)
                 : "r"(last), "n"(GS_WARPS * 32)
                 : "memory");
    if (!last) return;
    const int col0 = P.t0 * 8, cols = min(n, (P.t0 + P.cnt) * 8) - col0;
    const u64 plane = (u64)m * n;
    for (int i = threadIdx.x; i < m * cols; i += GS_WARPS * 32) {
        const int row = i / cols, col = col0 + i % cols;
        const u64 at = (u64)row * n + col;
        // Other blocks' partials: read from L2 (ld.global.cg), never a stale L1 line.
        float v = __ldcg(ws + at);
        for (int s = 1; s < segs; ++s) v = v + __ldcg(ws + s * plane + at);
        c[at] = bias ? v + bias[col] : v;
    }
}

// MT tiles of 16 rows of A (M <= 16 MT); `slots` stages of `kc` chunks in the ring and passes of at most `pt` tiles,
// as the host sized the shared memory and the weight map's box (8 pt rows, pt <= GS_WARPS GS_TPW); DB: the next
// half's fragments load while this half's mma chains run (where two halves fit the register budget).
template <int MT, bool DB>
__device__ __forceinline__ void gemm_stream(const GsMap& map_a, const GsMap& map_w, const float* __restrict__ bias,
                                            float* __restrict__ c, float* ws, int* counters, int m, int n, int k,
                                            int slots, int kc, int pt, int segs) {
    extern __shared__ __align__(1024) unsigned char gs_smem_raw[];
    const GsPlan P = gs_plan<MT>(n, k, kc, pt, segs);
    // The swizzle pattern follows address bits, so stages start 1024-aligned (the host adds 1024 bytes of room).
    const u32 base = (tma_shared(gs_smem_raw) + 1023) & ~1023u;
    const u32 full = base + slots * P.stage_bytes, empty = full + 8 * slots;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int total = P.passes * P.kst;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full + 8 * s) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(empty + 8 * s), "r"(GS_WARPS) : "memory");
        }
        // The TMA unit (async proxy) must see the initialised barriers.
        asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if (warp == GS_WARPS) {
        if (lane != 0) return;
        asm volatile("prefetch.tensormap [%0];\nprefetch.tensormap [%1];\n" ::"l"((u64)&map_a), "l"((u64)&map_w) : "memory");
        // Weights never come from the previous kernel: the first ring's worth streams in before waiting for it.
        const int pre = min(slots, total);
        for (int s = 0; s < pre; ++s) gs_issue_w(P, &map_w, base, full, s, slots);
        wait_prior();
        start_next();
        for (int s = 0; s < pre; ++s) gs_issue_a(P, &map_a, base, full, s, slots);
        for (int s = pre; s < total; ++s) {
            // Reuse a slot only once every consumer warp has released its previous stage.
            mbar_wait(empty + 8 * (s % slots), ((s / slots) + 1) & 1);
            gs_issue_w(P, &map_w, base, full, s, slots);
            gs_issue_a(P, &map_a, base, full, s, slots);
        }
        return;
    }
    // C may still be read by the previous kernel.
    wait_prior();
    start_next();
    const int gq = lane >> 2, q = lane & 3, lr = lane & 7, li = lane >> 3;
    int s = 0;
    for (int pass = 0; pass < P.passes; ++pass) {
        const int f0t = P.first(pass), g = P.first(pass + 1) - f0t;
        float acc[GS_TPW][MT][4];
#pragma unroll
        for (int i = 0; i < GS_TPW; ++i)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.0f;
        for (int js = 0; js < P.kst; ++js, ++s) {
            const int slot = s % slots, halves = 2 * min(P.kc, P.kbs - js * P.kc);
            // Idle warps wait too: each warp's releases stay in stage order, one per barrier phase.
            mbar_wait(full + 8 * slot, (s / slots) & 1);
            const u32 stage = base + slot * P.stage_bytes;
            if (warp < g && DB) {
                GsFrags<MT> fa, fb;
                gs_fetch<MT>(fa, P, stage, 0, g, warp, lr, li);
                for (int h = 0; h < halves; h += 2) {
                    gs_fetch<MT>(fb, P, stage, h + 1, g, warp, lr, li);
                    gs_steps<MT>(acc, fa, g, warp);
                    if (h + 2 < halves) gs_fetch<MT>(fa, P, stage, h + 2, g, warp, lr, li);
                    gs_steps<MT>(acc, fb, g, warp);
                }
            } else if (warp < g) {
                // One half at a time: the other warps' mma fill the wait for its fragments.
                for (int h = 0; h < halves; ++h) {
                    GsFrags<MT> fa;
                    gs_fetch<MT>(fa, P, stage, h, g, warp, lr, li);
                    gs_steps<MT>(acc, fa, g, warp);
                }
            }
            __syncwarp();
            if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty + 8 * slot) : "memory");
        }
        // One segment writes C directly; more write their partials to plane b % segs of ws (f32 [segs][m][n]), no bias
        // (worked out here, not kept live through the k loop: the two-block kernels have no registers to spare).
        float* const out = segs == 1 ? c : ws + (u64)(blockIdx.x % segs) * m * n;
        const float* const add = segs == 1 ? bias : nullptr;
        // acc[i][t][e] is row 16 t + gq + 8 (e / 2), column 2 q + e % 2 of the warp's tile i.
#pragma unroll
        for (int i = 0; i < GS_TPW; ++i) {
            if (warp + i * GS_WARPS >= g) continue;
            const int col0 = (f0t + warp + i * GS_WARPS) * 8 + 2 * q;
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 16 * t + gq + 8 * (e >> 1), col = col0 + (e & 1);
                    if (row < m && col < n) out[(u64)row * n + col] = add ? acc[i][t][e] + add[col] : acc[i][t][e];
                }
        }
    }
    if (segs > 1) gs_fold(P, bias, c, ws, counters, m, n, segs);
}

#define GS_PARAMS const __grid_constant__ GsMap map_a, const __grid_constant__ GsMap map_w, const float* bias, float* c, float* ws, int* counters, int m, int n, int k, int slots, int kc, int pt, int segs
#define GS_ARGS map_a, map_w, bias, c, ws, counters, m, n, k, slots, kc, pt, segs
// Nine warps leave one SM sub-partition three, so a block may use at most 168 registers a thread.
extern "C" __global__ void __launch_bounds__(GS_THREADS, 1) gemm_stream_m16(GS_PARAMS) { gemm_stream<1, true>(GS_ARGS); }
extern "C" __global__ void __launch_bounds__(GS_THREADS, 1) gemm_stream_m32(GS_PARAMS) { gemm_stream<2, true>(GS_ARGS); }
extern "C" __global__ void __launch_bounds__(GS_THREADS, 1) gemm_stream_m48(GS_PARAMS) { gemm_stream<3, false>(GS_ARGS); }
extern "C" __global__ void __launch_bounds__(GS_THREADS, 1) gemm_stream_m64(GS_PARAMS) { gemm_stream<4, false>(GS_ARGS); }
// Two blocks an SM (at most 96 registers a thread): each streams half the rows with half the shared memory.
extern "C" __global__ void __launch_bounds__(GS_THREADS, 2) gemm_stream_m16_x2(GS_PARAMS) { gemm_stream<1, true>(GS_ARGS); }
extern "C" __global__ void __launch_bounds__(GS_THREADS, 2) gemm_stream_m32_x2(GS_PARAMS) { gemm_stream<2, false>(GS_ARGS); }

#endif
