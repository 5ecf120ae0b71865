// Many rows on Hopper (sm_90a), built as the fast Hopper GEMMs are: the tensor memory accelerator (TMA) brings
// k-blocks of 64 of the activation tile A and the weight tile W into a ring of shared-memory stages, one producer
// thread issuing the copies and two consumer warpgroups issuing wgmma with both operands in shared memory (128-byte
// swizzle, K-major); persistent CTAs walk the output tiles in a fixed order, a cluster of 2 can share (multicast)
// the weight tile of two M tiles or the activation tile of two N tiles.
//
// An element's arithmetic is the reference's: K in `segs` segments fixed per weight shape (1 for the plain kernels,
// any count for the _s and _k kernels), each in an f32 accumulator from +0 (registers zeroed, scale-d always 1) over its
// k16 steps in ascending k, each over its 16 k in natural order; the segment sums added in segment order, then the
// bias. The _s kernels fold the segments in registers; the _k kernels give each (tile, segment) pair its own unit,
// write its sum to a workspace plane, and the tile's last unit to arrive adds the planes in order, then the bias.
// A row's bits never depend on M, on its tile or on the other rows. wgmma sums a k16 step as mma.sync does
// (tools/wgmma_probe.cu).
//
// C[m][n] = sum_k A[m][k] W[n][k] (+ bias[n]), A [M][K] bf16, W [N][K] bf16, C [M][N] f32; or, with `act`, the
// SwiGLU of W's interleaved 8-row gate and up tiles: act[m][n / 2] = silu_mul(gate, up), no C.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A CUtensorMap: 128 opaque bytes encoded on the host (cuTensorMapEncodeTiled), a __grid_constant__ parameter.
struct alignas(64) TmaMap {
    unsigned long long data[16];
};

// Bytes of one tile row of a stage: 64 bf16 of k, the 128-byte swizzle's row.
#define TMA_ROW 128

// Arrives on the barrier at the same offset in the cluster's CTA `rank` (this CTA included).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 rank) {
    asm volatile(
        "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n}\n" ::"r"(bar), "r"(rank)
        : "memory");
}

// Box (col, row) of a 2-D map into shared memory at dst, completing its bytes on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TmaMap* map, u32 bar, int col, int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"((u64)map), "r"(col), "r"(row), "r"(bar)
        : "memory");
}

// The same box into dst of every CTA in `mask`, each completing the bytes on its own barrier at bar's offset.
__device__ __forceinline__ void tma_load_multicast(u32 dst, const TmaMap* map, u32 bar, int col, int row,
                                                   unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst), "l"((u64)map), "r"(col), "r"(row), "r"(bar), "h"(mask)
        : "memory");
}

// K-major under the 128-byte swizzle (type 1, bits 62-63): 8-row groups 1024 bytes apart (SBO), LBO unused.
__device__ __forceinline__ u64 tma_desc(u32 at) {
    return (u64)((at & 0x3ffff) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

#define TMA_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x N of f32) += A step (64 x 16, descriptor da) times W step (N x 16, descriptor db); scale-d is always 1.
__device__ __forceinline__ void tma_mma16(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7},"
        " %8, %9, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma32(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15},"
        " %16, %17, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma64(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"
        " %32, %33, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8), TMA_F8(16), TMA_F8(24)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma128(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
        " %64, %65, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8), TMA_F8(16), TMA_F8(24), TMA_F8(32), TMA_F8(40), TMA_F8(48), TMA_F8(56)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma192(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95},"
        " %96, %97, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8), TMA_F8(16), TMA_F8(24), TMA_F8(32), TMA_F8(40), TMA_F8(48), TMA_F8(56), TMA_F8(64), TMA_F8(72), TMA_F8(80), TMA_F8(88)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma224(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %114, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111},"
        " %112, %113, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8), TMA_F8(16), TMA_F8(24), TMA_F8(32), TMA_F8(40), TMA_F8(48), TMA_F8(56), TMA_F8(64), TMA_F8(72), TMA_F8(80), TMA_F8(88), TMA_F8(96), TMA_F8(104)
        : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void tma_mma256(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,"
        "%120,%121,%122,%123,%124,%125,%126,%127},"
        " %128, %129, p, 1, 1, 0, 0;\n}\n"
        : TMA_F8(0), TMA_F8(8), TMA_F8(16), TMA_F8(24), TMA_F8(32), TMA_F8(40), TMA_F8(48), TMA_F8(56), TMA_F8(64), TMA_F8(72), TMA_F8(80), TMA_F8(88), TMA_F8(96), TMA_F8(104), TMA_F8(112), TMA_F8(120)
        : "l"(da), "l"(db), "r"(1));
}

template <int N>
__device__ __forceinline__ void tma_mma(float* d, u64 da, u64 db) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 192 || N == 224 || N == 256, "a wgmma width");
    if constexpr (N == 16) tma_mma16(d, da, db);
    else if constexpr (N == 32) tma_mma32(d, da, db);
    else if constexpr (N == 64) tma_mma64(d, da, db);
    else if constexpr (N == 128) tma_mma128(d, da, db);
    else if constexpr (N == 192) tma_mma192(d, da, db);
    else if constexpr (N == 224) tma_mma224(d, da, db);
    else tma_mma256(d, da, db);
}

// Unit u (one cluster's tiles) as (um, un): `group` M units per N unit, so CTAs at work together share L2 tiles.
__device__ __forceinline__ void tma_unit(int u, int mu, int nu, int group, int& um, int& un) {
    const int span = group * nu, first = (u / span) * group, rows = min(group, mu - first), r = u - (u / span) * span;
    un = r / rows;
    um = first + r - un * rows;
}

// After a split unit's plane is written: the tile's last unit to arrive (its counter, left zero for the next launch)
// adds the tile's segs planes in segment order, then the bias, into C. Both consumer warpgroups (named barrier 1).
template <int BM, int BN>
__device__ __forceinline__ void tma_split_fold(const float* __restrict__ bias, float* __restrict__ c, const float* ws,
                                               int* counter, int m, int n, int segs, int m0, int n0, int t) {
    // Every thread's partials reach L2 before the unit's arrival is counted.
    __threadfence();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    u32 last = 0;
    if (t == 0) {
        last = atomicAdd(counter, 1) == segs - 1;
        if (last) *counter = 0;
        __threadfence();
    }
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\nbar.red.popc.u32 %0, 1, 256, p;\n}\n"
                 : "=r"(last)
                 : "r"(last)
                 : "memory");
    if (!last) return;
    const u64 plane = (u64)m * n;
    const int rows = min(BM, m - m0), cols = min(BN, n - n0);
    if ((n & 3) == 0 && (cols & 3) == 0) {
        // Four columns a load, many loads in flight: the fold is one SM's read of segs planes of the tile.
        const int quads = cols / 4;
#pragma unroll 8
        for (int i = t; i < rows * quads; i += 256) {
            const int row = m0 + i / quads, col = n0 + 4 * (i % quads);
            const u64 at = (u64)row * n + col;
            float4 v = __ldcg(reinterpret_cast<const float4*>(ws + at));
            for (int s = 1; s < segs; ++s) {
                const float4 p = __ldcg(reinterpret_cast<const float4*>(ws + s * plane + at));
                v = make_float4(v.x + p.x, v.y + p.y, v.z + p.z, v.w + p.w);
            }
            if (bias) v = make_float4(v.x + bias[col], v.y + bias[col + 1], v.z + bias[col + 2], v.w + bias[col + 3]);
            *reinterpret_cast<float4*>(c + at) = v;
        }
        return;
    }
#pragma unroll 4
    for (int i = t; i < rows * cols; i += 256) {
        const int row = m0 + i / cols, col = n0 + i % cols;
        const u64 at = (u64)row * n + col;
        // Other units' partials: read from L2 (ld.global.cg), never a stale L1 line.
        float v = __ldcg(ws + at);
        for (int s = 1; s < segs; ++s) v = v + __ldcg(ws + s * plane + at);
        c[at] = bias ? v + bias[col] : v;
    }
}

// Warpgroup 0 produces (one thread), 1 and 2 consume MI m64 blocks by WN columns each of a BM x BN tile.
// Consumer c: rows 64 MI c, all columns (BM = 128 MI), or all rows, columns WN c (BM = 64 MI).
// A cluster pair shares the weight tile (CM = 2) or the activation tile (CN = 2): each CTA copies half to both.
// SEG: every K / segs / 64 k-blocks the consumer folds its accumulator into a running sum (a second register set).
// SPLIT: a unit is one segment of one tile (tma_split_fold), for rounds whose tiles alone would leave SMs idle.
// GROUP: experts (moe.cu): A's rows sorted by expert, expert e's `offsets[e]..offsets[e + 1]` in row tiles from
// `tile_start[e]`; W is ne matrices of n x k stacked; a tile multiplies its expert's matrix and stores its own rows.
template <int BM, int BN, int WN, int MI, int STAGES, int CM, int CN, bool SEG = false, bool SPLIT = false,
          bool GROUP = false>
__device__ __forceinline__ void gemm_tma(const TmaMap& map_a, const TmaMap& map_w, const float* __restrict__ bias,
                                         float* __restrict__ c, bf16* __restrict__ act, float* ws, int* counters,
                                         int m, int n, int k, int group, int segs, const u32* offsets = nullptr,
                                         const u32* tile_start = nullptr, int ne = 0) {
    static_assert(!(SEG && SPLIT) && (!SPLIT || CM * CN == 1), "a split kernel is a single CTA's");
    static_assert(!GROUP || (!SEG && !SPLIT && CM * CN == 1), "a grouped kernel is a plain single CTA's");
    constexpr bool SPLIT_N = BM == 64 * MI;
    static_assert(SPLIT_N ? BN == 2 * WN : (BM == 128 * MI && BN == WN), "two consumers cover the tile");
    constexpr int CLUSTER = CM * CN;
    static_assert(CLUSTER == 1 || CLUSTER == 2, "pairs at most");
    constexpr u32 STAGE_A = BM * TMA_ROW, STAGE = (BM + BN) * TMA_ROW;
    extern __shared__ __align__(1024) unsigned char tma_smem_raw[];
    // The swizzle pattern follows address bits, so stages start 1024-aligned (the host adds 1024 bytes of room).
    const u32 base = (tma_shared(tma_smem_raw) + 1023u) & ~1023u;
    const u32 full = base + STAGES * STAGE, empty = full + 8 * STAGES;
    const int wg = threadIdx.x / 128;
    u32 rank = 0;
    if constexpr (CLUSTER > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            // Every consumer warpgroup of every CTA that the stage's multicast writes into frees it.
            mbar_init(empty + 8 * s, 2 * CLUSTER);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CLUSTER > 1) {
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else {
        __syncthreads();
    }
    start_next();
    // A grouped round's tiles come from the kernel before: every thread waits for it first.
    if constexpr (GROUP) wait_prior();
    const int mu = GROUP ? (int)tile_start[ne] : ((m + BM - 1) / BM + CM - 1) / CM, nu = ((n + BN - 1) / BN + CN - 1) / CN;
    const int units = mu * nu * (SPLIT ? segs : 1);
    const int kbs = k / 64, cid = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
    // Unit u's tile (um, un) and k-blocks [kb0, kb1): a split unit takes segment u % segs of tile u / segs.
    auto unit = [&](int u, int& um, int& un, int& kb0, int& kb1) {
        tma_unit(SPLIT ? u / segs : u, mu, nu, group, um, un);
        kb0 = SPLIT ? (u % segs) * (kbs / segs) : 0;
        kb1 = SPLIT ? kb0 + kbs / segs : kbs;
    };
    // The first row and column of unit (um, un)'s tile in this CTA.
    auto tile_m = [&](int um) { return (um * CM + (CM > 1 ? (int)rank : 0)) * BM; };
    auto tile_n = [&](int un) { return (un * CN + (CN > 1 ? (int)rank : 0)) * BN; };
    // Tile um's first row and end, and the first row of W its columns from n0 take (grouped: its expert's).
    auto rows_of = [&](int um, int n0, int& m0, int& mend, int& w0) {
        if constexpr (GROUP) {
            const int e = expert_of_tile(tile_start, ne, (u32)um);
            m0 = (int)offsets[e] + (um - (int)tile_start[e]) * BM;
            mend = (int)offsets[e + 1];
            w0 = e * n + n0;
        } else {
            m0 = tile_m(um), mend = m, w0 = n0;
        }
    };
    if (wg == 0) {
        // The producer needs few registers: give them to the consumers.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0) {
            asm volatile("prefetch.tensormap [%0];\nprefetch.tensormap [%1];\n" ::"l"((u64)&map_a), "l"((u64)&map_w)
                         : "memory");
            // The weights' copy into stage `slot`; a shared tile: this CTA's half, to both CTAs.
            auto load_w = [&](u32 slot, int kb, int n0) {
                const u32 st = base + slot * STAGE + STAGE_A, bar = full + 8 * slot;
                if constexpr (CM == 1) {
                    tma_load(st, &map_w, bar, kb * 64, n0);
                } else {
                    constexpr int HALF = BN / 2;
                    tma_load_multicast(st + rank * HALF * TMA_ROW, &map_w, bar, kb * 64, n0 + (int)rank * HALF, 3);
                }
            };
            // The activations' copy, the same way.
            auto load_a = [&](u32 slot, int kb, int m0) {
                const u32 st = base + slot * STAGE, bar = full + 8 * slot;
                if constexpr (CN == 1) {
                    tma_load(st, &map_a, bar, kb * 64, m0);
                } else {
                    constexpr int HALF = BM / 2;
                    tma_load_multicast(st + rank * HALF * TMA_ROW, &map_a, bar, kb * 64, m0 + (int)rank * HALF, 3);
                }
            };
            // The weights never come from the previous kernel: the first stages' copies start before waiting on it.
            int pre = 0;
            if (cid < units) {
                int um, un, kb0, kb1, m0, mend, w0;
                unit(cid, um, un, kb0, kb1);
                rows_of(um, tile_n(un), m0, mend, w0);
                pre = min(STAGES, kb1 - kb0);
                for (int s = 0; s < pre; ++s) {
                    mbar_expect(full + 8 * s, STAGE);
                    load_w(s, kb0 + s, w0);
                }
            }
            wait_prior();
            u32 slot = 0, phase = 0;
            int it = 0;
            for (int u = cid; u < units; u += clusters) {
                int um, un, kb0, kb1, m0, mend, w0;
                unit(u, um, un, kb0, kb1);
                rows_of(um, tile_n(un), m0, mend, w0);
                for (int kb = kb0; kb < kb1; ++kb, ++it) {
                    if (it >= pre) {
                        // A slot is free once the consumers of every CTA it feeds have released it.
                        mbar_wait(empty + 8 * slot, phase ^ 1);
                        mbar_expect(full + 8 * slot, STAGE);
                        load_w(slot, kb, w0);
                    }
                    // Rows past M come back as zeros, never stored.
                    load_a(slot, kb, m0);
                    if (++slot == STAGES) slot = 0, phase ^= 1;
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        wait_prior();
        const int cw = wg - 1, t = threadIdx.x % 128, warp = t / 32, g = (t % 32) / 4, q = t % 4;
        const int a_row = SPLIT_N ? 0 : cw * 64 * MI, w_col = SPLIT_N ? cw * WN : 0;
        const u64 da0 = tma_desc(base + a_row * TMA_ROW), dw0 = tma_desc(base + STAGE_A + w_col * TMA_ROW);
        // Frees a stage: one thread per consumer warpgroup arrives on each CTA's barrier.
        auto release = [&](u32 slot) {
            if constexpr (CLUSTER == 1) {
                if (t == 0) mbar_arrive(empty + 8 * slot);
            } else {
                if (t < CLUSTER) mbar_arrive_cluster(empty + 8 * slot, t);
            }
        };
        float acc[MI][WN / 2], sum[SEG ? MI : 1][SEG ? WN / 2 : 1];
        const int kseg = SEG ? kbs / segs : kbs;
        u32 slot = 0, phase = 0;
        for (int u = cid; u < units; u += clusters) {
            int um, un, kb0, kb1, m0, mend, w0;
            unit(u, um, un, kb0, kb1);
            const int n0 = tile_n(un);
            rows_of(um, n0, m0, mend, w0);
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < WN / 2; ++j) acc[i][j] = 0.0f;
            u32 prev = STAGES;
            for (int kb = kb0; kb < kb1; ++kb) {
                mbar_wait(full + 8 * slot, phase);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                const u64 so = (slot * STAGE) >> 4;
                // The stage's four k16 steps in ascending k: the descriptors' start moves 32 bytes a step.
#pragma unroll
                for (int s = 0; s < 4; ++s)
#pragma unroll
                    for (int i = 0; i < MI; ++i)
                        tma_mma<WN>(acc[i], da0 + so + ((i * 64 * TMA_ROW + 32 * s) >> 4), dw0 + so + ((32 * s) >> 4));
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                // The previous stage's products are done once at most this one is in flight: free its slot.
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                if (prev != STAGES) release(prev);
                prev = slot;
                if (++slot == STAGES) slot = 0, phase ^= 1;
                if constexpr (SEG) {
                    if ((kb + 1) % kseg == 0) {
                        // The segment's products are all in acc: fold it (the first as it is), restart acc from +0.
                        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                        release(prev);
                        prev = STAGES;
                        const bool first = kb + 1 == kseg;
#pragma unroll
                        for (int i = 0; i < MI; ++i)
#pragma unroll
                            for (int j = 0; j < WN / 2; ++j) {
                                sum[i][j] = first ? acc[i][j] : sum[i][j] + acc[i][j];
                                acc[i][j] = 0.0f;
                            }
                    }
                }
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (prev != STAGES) release(prev);
            if constexpr (SEG) {
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < WN / 2; ++j) acc[i][j] = sum[i][j];
            }
            if constexpr (SPLIT) {
                // The segment's sum to its plane of ws (f32 [segs][m][n]); the tile's last unit adds the planes.
                float* plane = ws + (u64)(u % segs) * m * n;
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = m0 + a_row + 64 * i + 16 * warp + g + 8 * h;
#pragma unroll
                        for (int j = 0; j < WN / 8; ++j) {
                            const int col = n0 + w_col + 8 * j + 2 * q;
                            if (row >= m || col >= n) continue;
                            plane[(u64)row * n + col] = acc[i][4 * j + 2 * h];
                            if (col + 1 < n) plane[(u64)row * n + col + 1] = acc[i][4 * j + 2 * h + 1];
                        }
                    }
                tma_split_fold<BM, BN>(bias, c, ws, counters + u / segs, m, n, segs, m0, n0, threadIdx.x - 128);
            }
            // Element 4 j + e of an m64 block: row 16 warp + g + 8 (e / 2), column 8 j + 2 q + e % 2 (split: none).
#pragma unroll
            for (int i = 0; i < (SPLIT ? 0 : MI); ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = m0 + a_row + 64 * i + 16 * warp + g + 8 * h;
                    if (row >= mend) continue;
                    if (act) {
                        // Gate block j (even) and up block j + 1 hold act columns (n0 + w_col + 8 j) / 2 + 2 q, + 1.
                        bf16* out = act + (u64)row * (n / 2);
#pragma unroll
                        for (int j = 0; j < WN / 8; j += 2) {
                            const int col = n0 + w_col + 8 * j + 2 * q;
                            if (col >= n) continue;
                            float g0 = acc[i][4 * j + 2 * h], g1 = acc[i][4 * j + 2 * h + 1];
                            float u0 = acc[i][4 * j + 4 + 2 * h], u1 = acc[i][4 * j + 4 + 2 * h + 1];
                            if (bias) g0 += bias[col], g1 += bias[col + 1], u0 += bias[col + 8], u1 += bias[col + 9];
                            const u32 pair = (u32)silu_mul(g0, u0) | ((u32)silu_mul(g1, u1) << 16);
                            *reinterpret_cast<u32*>(out + (n0 + w_col + 8 * j) / 2 + 2 * q) = pair;
                        }
                        continue;
                    }
                    float* out = c + (u64)row * n;
#pragma unroll
                    for (int j = 0; j < WN / 8; ++j) {
                        const int col = n0 + w_col + 8 * j + 2 * q;
                        if (col >= n) continue;
                        float v0 = acc[i][4 * j + 2 * h], v1 = acc[i][4 * j + 2 * h + 1];
                        if (bias) {
                            v0 += bias[col];
                            if (col + 1 < n) v1 += bias[col + 1];
                        }
                        // An even N keeps every pair 8-byte aligned and whole.
                        if ((n & 1) == 0) {
                            *reinterpret_cast<float2*>(out + col) = make_float2(v0, v1);
                        } else {
                            out[col] = v0;
                            if (col + 1 < n) out[col + 1] = v1;
                        }
                    }
                }
            }
        }
    }
    // No CTA leaves while its peer may still write its shared memory or arrive on its barriers.
    if constexpr (CLUSTER > 1) asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The engine launches the single-CTA kernels and two split ones; the 256-row, clustered and other split ones are built
// for the bench (GEMM_TMA_ALL).
// <BM, BN, WN, MI, STAGES, CM, CN>: 384 threads, 1024 + STAGES * ((BM + BN) * 128 + 16) bytes, cluster (CM CN, 1, 1).
#define TMA_PARAMS                                                                                                    \
    const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_w, const float* bias, float* c,         \
        bf16* act, float* ws, int* counters, int m, int n, int k, int group, int segs
#define TMA_ARGS map_a, map_w, bias, c, act, ws, counters, m, n, k, group, segs
// _s: segmented twins where acc and the running sum together fit the consumers' 232 registers; _k: split twins.
// The engine compiles these in four programs side by side (TMA_PART 0 to 3); without TMA_PART all are built.
#if !defined(TMA_PART) || TMA_PART == 0
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x256(TMA_PARAMS) { gemm_tma<128, 256, 256, 1, 4, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x224(TMA_PARAMS) { gemm_tma<128, 224, 224, 1, 5, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x32(TMA_PARAMS) { gemm_tma<64, 32, 16, 1, 18, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x32_s(TMA_PARAMS) { gemm_tma<64, 32, 16, 1, 18, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x64(TMA_PARAMS) { gemm_tma<64, 64, 32, 1, 14, 1, 1>(TMA_ARGS); }
#endif
#if !defined(TMA_PART) || TMA_PART == 1
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x192(TMA_PARAMS) { gemm_tma<128, 192, 192, 1, 5, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x192_s(TMA_PARAMS) { gemm_tma<128, 192, 192, 1, 5, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x64_s(TMA_PARAMS) { gemm_tma<64, 64, 32, 1, 14, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x256(TMA_PARAMS) { gemm_tma<64, 256, 128, 1, 5, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_k(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 1, 1, false, true>(TMA_ARGS); }
#endif
#if !defined(TMA_PART) || TMA_PART == 2
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x128(TMA_PARAMS) { gemm_tma<128, 128, 128, 1, 7, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x128_s(TMA_PARAMS) { gemm_tma<128, 128, 128, 1, 7, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x256_s(TMA_PARAMS) { gemm_tma<64, 256, 128, 1, 5, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_s(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 1, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x128_k(TMA_PARAMS) { gemm_tma<128, 128, 128, 1, 7, 1, 1, false, true>(TMA_ARGS); }
#endif
#if !defined(TMA_PART) || TMA_PART == 3
// The experts' grouped GEMMs (moe.rs): after TMA_PARAMS, each expert's first row and first row tile, and the count.
#define MOE_TMA(NAME, BM, BN, WN, STAGES)                                                                            \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                              \
        NAME(TMA_PARAMS, const u32* offsets, const u32* tile_start, int ne) {                                        \
        gemm_tma<BM, BN, WN, 1, STAGES, 1, 1, false, false, true>(TMA_ARGS, offsets, tile_start, ne);                 \
    }
MOE_TMA(moe_tma_128x256, 128, 256, 256, 4)
MOE_TMA(moe_tma_64x256, 64, 256, 128, 5)
MOE_TMA(moe_tma_64x128, 64, 128, 64, 9)
MOE_TMA(moe_tma_64x64, 64, 64, 32, 14)
#endif
#if defined(GEMM_TMA_ALL) && !defined(TMA_PART)
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x256_k(TMA_PARAMS) { gemm_tma<128, 256, 256, 1, 4, 1, 1, false, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x256_k(TMA_PARAMS) { gemm_tma<64, 256, 128, 1, 5, 1, 1, false, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x256_c2(TMA_PARAMS) { gemm_tma<128, 256, 256, 1, 4, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x224_c2(TMA_PARAMS) { gemm_tma<128, 224, 224, 1, 5, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x192_c2(TMA_PARAMS) { gemm_tma<128, 192, 192, 1, 5, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_256x128(TMA_PARAMS) { gemm_tma<256, 128, 128, 2, 4, 1, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_256x128_c2(TMA_PARAMS) { gemm_tma<256, 128, 128, 2, 4, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_c2(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_c2_s(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 2, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x128_c2(TMA_PARAMS) { gemm_tma<128, 128, 128, 1, 7, 2, 1>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_128x128_c2_s(TMA_PARAMS) { gemm_tma<128, 128, 128, 1, 7, 2, 1, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_a2(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 1, 2>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x64_a2(TMA_PARAMS) { gemm_tma<64, 64, 32, 1, 14, 1, 2>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x32_a2(TMA_PARAMS) { gemm_tma<64, 32, 16, 1, 18, 1, 2>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x128_a2_s(TMA_PARAMS) { gemm_tma<64, 128, 64, 1, 9, 1, 2, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x64_a2_s(TMA_PARAMS) { gemm_tma<64, 64, 32, 1, 14, 1, 2, true>(TMA_ARGS); }
extern "C" __global__ void __launch_bounds__(384, 1) gemm_tma_64x32_a2_s(TMA_PARAMS) { gemm_tma<64, 32, 16, 1, 18, 1, 2, true>(TMA_ARGS); }
#endif
#endif
