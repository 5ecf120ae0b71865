// Prompt attention on Hopper (sm_90a) for head size 128 and pages of 16 positions: a producer warp brings each
// split's keys and values by TMA (128-byte swizzle, one box per page and half head) into a ring of stages, and one
// consumer warpgroup scores the block's 64 rows (positions x query heads of the KV group, as attention_rows packs
// them) against the split's 64 keys with wgmma, from q and the keys in shared memory.
//
// The arithmetic is attention_rows' own: q rounded to bf16, each score the k16 chain over the head in ascending k
// from +0 (wgmma sums a k16 step as mma.sync does, and its accumulator puts a row's scores in the lanes mma.sync
// does), then the same mask, max, exp and sum in lane order, P rounded to bf16, P V on mma.sync from the values
// through ldmatrix, and the fold in split order. So a row gets the same bits here as from attention_rows or the
// decode kernels.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#define WG_STAGES 2
// Bytes of one half head (64 dims) of 64 positions, swizzled: a TMA box of 16 positions per page, four pages.
#define WG_HALF 8192
// A stage: keys (two halves), then values (two halves).
#define WG_STAGE (4 * WG_HALF)

// The byte offset of (row, dim) in a swizzled half-head tile: rows of 128 bytes, 16-byte chunks XORed by row % 8.
__device__ __forceinline__ u32 swz(int row, int dim) {
    return (u32)row * 128u + ((u32)(((dim & 63) >> 3) ^ (row & 7)) << 4) + (u32)(dim & 7) * 2u;
}

// Grid (KV head, row group); 160 threads: warps 0-3 the consumer warpgroup, warp 4 the producer.
extern "C" __global__ void __launch_bounds__(160, 2) attention_wg_d128(
    const __grid_constant__ TmaMap kmap, const __grid_constant__ TmaMap vmap, const float* __restrict__ qkv,
    const u32* __restrict__ pos, const u32* __restrict__ groups, const u32* __restrict__ page_table,
    const u32* __restrict__ table_off, bf16* __restrict__ out, int nh, int nkv, u32 page_rows, u32 layer_row,
    float scale) {
    constexpr int D = 128, NT = D / 8;
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    __shared__ u64 bars[2 * WG_STAGES];
    const u32 base = (tma_shared(wg_smem_raw) + 1023u) & ~1023u;
    const u32 qs = base, stages = base + 2 * WG_HALF;
    const u32 full = tma_shared(&bars[0]), empty = full + 8 * WG_STAGES;
    const int kvh = blockIdx.x, t = threadIdx.x, group = nh / nkv, width = (nh + 2 * nkv) * D;
    if (t == 0) {
        for (int s = 0; s < WG_STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    start_next();
    wait_prior();
    const u32 row0 = groups[2 * blockIdx.y], count = groups[2 * blockIdx.y + 1];
    const u32 last_p = pos[row0 + count - 1], nsp = last_p / ATT_SPLIT + 1, end = last_p + 1;
    const u32* pages = page_table + table_off[row0];
    if (t >= 128) {
        // The producer: lane 0 copies each split's pages (keys, then values) into the next free stage; pages past
        // the group's last position are not copied (their values are zeroed by the consumers).
        if (t != 128) return;
        asm volatile("prefetch.tensormap [%0];\nprefetch.tensormap [%1];\n" ::"l"((u64)&kmap), "l"((u64)&vmap)
                     : "memory");
        u32 slot = 0, phase = 0;
        for (u32 s = 0; s < nsp; ++s) {
            if (s >= WG_STAGES) mbar_wait(empty + 8 * slot, phase ^ 1);
            const u32 valid = min(4u, (end - s * ATT_SPLIT + 15) / 16), st = stages + slot * WG_STAGE;
            mbar_expect(full + 8 * slot, valid * 4 * 2048);
            for (u32 p = 0; p < valid; ++p) {
                const int row = (int)(pages[s * 4 + p] * page_rows + layer_row);
                for (int h = 0; h < 2; ++h) {
                    tma_load(st + h * WG_HALF + p * 2048, &kmap, full + 8 * slot, kvh * D + 64 * h, row);
                    tma_load(st + 2 * WG_HALF + h * WG_HALF + p * 2048, &vmap, full + 8 * slot, kvh * D + 64 * h, row);
                }
            }
            if (++slot == WG_STAGES) slot = 0, phase ^= 1;
        }
        return;
    }
    const int warp = t >> 5, lane = t & 31, g = lane >> 2, q = lane & 3;
    // q of the block's 64 rows, rounded to bf16, into two swizzled half heads; rows past the group are zero.
    for (int e = t; e < 64 * 16; e += 128) {
        const int r = e >> 4, c = e & 15, pi = r / group, hh = r - pi * group;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (pi < (int)count) {
            const float* src = qkv + (u64)(row0 + pi) * width + (u64)(kvh * group + hh) * D + c * 8;
            const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
            v = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
        }
        const u32 at = qs + (c >> 3) * WG_HALF + swz(r, c * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    }
    // wgmma reads q through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    // This lane's two rows, g and g + 8 of the warp's 16: position (-1 for padding) and output row.
    int prow[2];
    u64 orow[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = 16 * warp + g + 8 * hr, pi = r / group, hh = r - pi * group;
        prow[hr] = pi < (int)count ? (int)pos[row0 + pi] : -1;
        orow[hr] = (u64)(row0 + pi) * nh + (u64)kvh * group + hh;
    }
    const float inf = __int_as_float(0x7f800000);
    float big_m[2] = {-inf, -inf}, big_l[2] = {0.0f, 0.0f}, big_a[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) big_a[j][0] = big_a[j][1] = big_a[j][2] = big_a[j][3] = 0.0f;
    const u64 dq = tma_desc(qs);
    u32 slot = 0, phase = 0;
    for (u32 s = 0; s < nsp; ++s) {
        const u32 s0 = s * ATT_SPLIT, st = stages + slot * WG_STAGE, vs = st + 2 * WG_HALF;
        mbar_wait(full + 8 * slot, phase);
        // Values at or past the group's end are zero, so their zero weights add nothing (keys there are masked).
        if (s0 + ATT_SPLIT > end) {
            for (int e = t; e < 64 * 16; e += 128) {
                const int r = e >> 4, c = e & 15;
                if (s0 + r >= end)
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(vs + (c >> 3) * WG_HALF + swz(r, c * 8)),
                                 "r"(0u)
                                 : "memory");
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
        }
        // Scores: 64 rows by the split's 64 keys, the k16 steps over the head in ascending k from +0.
        float acc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
        const u64 dk = tma_desc(st);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            const u64 off = (u64)(((k >> 2) * WG_HALF + 32 * (k & 3)) >> 4);
            tma_mma64(acc, dq + off, dk + off);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[nt][e] = acc[4 * nt + e];
        float mt[2], lt[2], fa[2], fb[2], top[2];
        bool active[2];
        u32 pa[4][4];
        split_softmax(sc, prow, s0, 0, q, scale, big_m, active, mt, lt, pa, fa, fb, top);
        // P V: the values' rows through ldmatrix (transposed), swizzled addresses, keys in k16 steps in order.
        const int vkey = (lane & 7) + ((lane >> 3) & 1) * 8, vdim = (lane >> 4) * 8;
#pragma unroll
        for (int jp = 0; jp < NT / 2; ++jp) {
            float tt[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const int key = kk * 16 + vkey, dim = jp * 16 + vdim;
                u32 r0, r1, r2, r3;
                load_trans_x4_at(vs + (dim >> 6) * WG_HALF + swz(key, dim), r0, r1, r2, r3);
                mma_bf16(tt[0], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r0, r1);
                mma_bf16(tt[1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r2, r3);
            }
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int hr = e >> 1, j = 2 * jp + u;
                    if (active[hr]) big_a[j][e] = fold(big_a[j][e], fa[hr], tt[u][e], fb[hr]);
                }
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
            if (active[hr]) {
                big_l[hr] = fold(big_l[hr], fa[hr], lt[hr], fb[hr]);
                big_m[hr] = top[hr];
            }
        // Every consumer is done with the stage (zeroed rows included) before the producer refills it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        if (t == 0) mbar_arrive(empty + 8 * slot);
        if (++slot == WG_STAGES) slot = 0, phase ^= 1;
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (prow[hr] < 0) continue;
        u32* dst = reinterpret_cast<u32*>(out + orow[hr] * D);
#pragma unroll
        for (int j = 0; j < NT; ++j)
            dst[(8 * j + 2 * q) / 2] = pack_bf16(big_a[j][2 * hr] / big_l[hr], big_a[j][2 * hr + 1] / big_l[hr]);
    }
}

#endif
