// Decode attention for wide rounds (every row group one row): one warp per (row, KV head) streams that head's keys
// and values through its own ring of shared-memory tiles of half a split, each key row brought by one bulk copy
// (the async proxy) that completes on the slot's barrier, so no warp waits on another and each split's softmax is
// computed once. The per-split arithmetic and the fold are attention_rows' own, step for step: a row decoded here
// gets the bits it gets there, alone, in a prompt chunk or among any other rows. A KV group's query heads fill the
// mma rows 0..7 (MAX_GROUP), so rows 8..15, always padding, are neither loaded nor folded.

#if __CUDA_ARCH__ >= 900

// Warps a block holds, each an independent (row, KV head); tiles in each warp's ring; key rows a tile holds (one per
// lane), half of a split: a split is its keys' two tiles, then its values' two.
#define DEC_WARPS 4
#define DEC_SLOTS 3
#define DEC_KEYS 32

// One bulk copy of `bytes` from global memory into shared memory at dst, completing on barrier bar.
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Four 8x8 bf16 matrices from shared memory, untransposed: the B fragments of two k16 steps of an 8-key tile.
__device__ __forceinline__ void load_x4(const bf16* p, u32& r0, u32& r1, u32& r2, u32& r3) {
    const u32 at = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at));
}

// mma_bf16 on the upper 8 rows only (the lower 8 are zero padding): d[0..1] += A B for row g.
__device__ __forceinline__ void mma_top(float* d, u32 a0, u32 a2, u32 b0, u32 b1) {
    float x, y;  // rows 8..15, unused
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%5}, {%7,%8}, {%9,%10,%11,%11};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(x), "=f"(y)
        : "r"(a0), "r"(0u), "r"(a2), "r"(b0), "r"(b1), "f"(d[0]), "f"(d[1]), "f"(0.0f));
    (void)x, (void)y;
}

// The page of key position kp of this lane's span, 0 past end.
__device__ __forceinline__ u32 page_of(const KvSpan& kv, u32 kp, u32 end, int sh) {
    return kp >= end ? 0u : sh >= 0 ? kv.pages[kp >> sh] : kv.pages[kp / (u32)kv.page_tokens];
}

// SPREAD: rows may be spread over several warps (chunks > 1), storing split states; a kernel of its own, so the
// one-warp form keeps its registers.
template <int D, bool SPREAD>
__device__ void attention_decode(const float* __restrict__ qkv, const u32* __restrict__ pos,
                                 const u32* __restrict__ groups, const u32* __restrict__ page_table,
                                 const u32* __restrict__ table_off, bf16* kcache, bf16* vcache, bf16* __restrict__ out,
                                 int num_groups, int nh, int nkv, int page_tokens, u64 page_stride, u64 layer_off,
                                 float scale, const u64* __restrict__ kv_off, const float* __restrict__ inv_freq,
                                 const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                                 int interleaved, int fuse_rope, float* __restrict__ partial, u32* __restrict__ tickets,
                                 int nsplit, int chunks) {
    constexpr int ST = D + 8, TILE = DEC_KEYS * ST, NT = D / 8;
    start_next();
    wait_prior();
    extern __shared__ uint4 smem_raw[];
    __shared__ u64 bars[DEC_WARPS][DEC_SLOTS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    if (!SPREAD) chunks = 1;
    const int unit = blockIdx.x * DEC_WARPS + warp, part_of = unit % chunks, kvh = unit / chunks % nkv;
    const int y = unit / chunks / nkv;
    if (y >= num_groups) return;
    bf16* ring = reinterpret_cast<bf16*>(smem_raw) + warp * DEC_SLOTS * TILE;
    const u32 bar0 = tma_shared(&bars[warp][0]);
    if (lane == 0)
        for (int i = 0; i < DEC_SLOTS; ++i) mbar_init(bar0 + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
    const int group = nh / nkv, width = (nh + 2 * nkv) * D;
    const u32 row = groups[2 * y], last_p = pos[row], nsp = last_p / ATT_SPLIT + 1, end = last_p + 1;
    // With chunks > 1 the row's splits are cut into that many runs of equal length (the last shorter), one warp
    // each, and every split's state is stored; the last warp of the row to finish folds them in split order. A row
    // with more splits than `partial` has room for is taken whole by its first warp, folding as it goes.
    const bool spread = SPREAD && nsp <= (u32)nsplit;
    const u32 runs = spread ? (u32)chunks : 1u;
    const u32 per = (nsp + runs - 1) / runs, s_lo = part_of * per, s_hi = min(nsp, s_lo + per);
    const u32 parts = (nsp + per - 1) / per;
    if (s_lo >= nsp) return;
    KvSpan kv = {kcache, vcache, page_table + table_off[row], page_tokens, nkv * D, page_stride,
                 layer_off + (u64)kvh * D};
    // With fuse_rope the q heads are rotated into the ring's first slot (free until the first copy).
    float* qrot = reinterpret_cast<float*>(ring);
    if (fuse_rope) {
        // The warp rotates its q heads, then writes the row's new key and value before any copy reads them.
        float o[D / 32];
        for (int hh = 0; hh < group; ++hh) {
            float* head = qrot + hh * D;
            const float* src = qkv + (u64)row * width + (u64)(kvh * group + hh) * D;
            for (int i = lane; i < D; i += 32) head[i] = src[i];
            __syncwarp();
            rope_head<D>(head, q_norm, eps, last_p, inv_freq, D, D, interleaved, true, o);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < D / 32; ++j) head[lane + 32 * j] = o[j];
        }
        float* fresh = qrot + group * D;
        for (int which = 0; which < 2 && s_hi == nsp; ++which) {
            const bool is_v = which == 1;
            const float* src = qkv + (u64)row * width + (u64)(nh + which * nkv + kvh) * D;
            __syncwarp();
            for (int i = lane; i < D; i += 32) fresh[i] = src[i];
            __syncwarp();
            rope_head<D>(fresh, k_norm, eps, last_p, inv_freq, D, D, interleaved, !is_v, o);
            bf16* dst = (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * D;
#pragma unroll
            for (int j = 0; j < D / 32; ++j) dst[lane + 32 * j] = f2bf(o[j]);
        }
        __syncwarp();
    }
    // This lane's mma row g: query head g of the KV group for g < group, padding past it; q rounded to bf16.
    const int prow = g < group ? (int)last_p : -1;
    const float* qrow = g >= group ? nullptr : fuse_rope ? qrot + g * D : qkv + (u64)row * width + (u64)(kvh * group + g) * D;
    u32 qa[D / 16][2];
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const int c = k * 16 + 2 * q;
        float2 lo = make_float2(0.0f, 0.0f), hi = lo;
        if (qrow) {
            lo = *reinterpret_cast<const float2*>(qrow + c);
            hi = *reinterpret_cast<const float2*>(qrow + c + 8);
        }
        qa[k][0] = pack_bf16(lo.x, lo.y);
        qa[k][1] = pack_bf16(hi.x, hi.y);
    }
    // Every lane is done with qrot and has written its key and value before the first copy.
    fence_async();
    __syncwarp();
    // Tile n: split n / 4, part n % 4 (keys 0..31, keys 32..63, their values); lane i copies key row i. A split's
    // page ids (both halves) are loaded a split ahead of its copies.
    const int pt = page_tokens, sh = pt >= 1 && (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1;
    const u32 in_mask = (u32)pt - 1;
    const u32 k_lo = s_lo * ATT_SPLIT;
    u32 now0 = page_of(kv, k_lo + lane, end, sh), now1 = page_of(kv, k_lo + DEC_KEYS + lane, end, sh);
    u32 next0 = page_of(kv, k_lo + ATT_SPLIT + lane, end, sh);
    u32 next1 = page_of(kv, k_lo + ATT_SPLIT + DEC_KEYS + lane, end, sh);
    const u32 ntiles = 4 * (s_hi - s_lo);
    auto stage = [&](u32 n) {
        const u32 s = s_lo + (n >> 2), part = n & 3, half = part & 1, first = s * ATT_SPLIT + half * DEC_KEYS;
        const u32 kp = first + lane, slot = n % DEC_SLOTS, bar = bar0 + 8 * slot;
        bf16* dst = ring + slot * TILE + lane * ST;
        const u32 valid = end > first ? min(end - first, (u32)DEC_KEYS) : 0u;
        // Generic accesses to the slot (reads of its last tile, zero rows) come before the copies into it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if (lane == 0) mbar_expect(bar, valid * D * 2);
        if (kp < end) {
            const u32 page = half ? now1 : now0, slot_in = sh >= 0 ? kp & in_mask : kp % (u32)pt;
            const bf16* src = (part >= 2 ? kv.vcache : kv.kcache) + (u64)page * kv.page_stride + kv.head_off +
                              (u64)slot_in * kv.kv_dim;
            bulk_copy(tma_shared(dst), src, D * 2, bar);
        } else if (part >= 2) {
            // Values past the row's end are zero, so their zero weights add nothing (keys past it are masked).
#pragma unroll
            for (int c = 0; c < D / 8; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
        }
        if (part == 3) {
            now0 = next0, now1 = next1;
            next0 = page_of(kv, (s + 2) * ATT_SPLIT + lane, end, sh);
            next1 = page_of(kv, (s + 2) * ATT_SPLIT + DEC_KEYS + lane, end, sh);
        }
    };
    for (u32 n = 0; n < DEC_SLOTS && n < ntiles; ++n) stage(n);
    // Waits for tile n, and returns it.
    auto tile_of = [&](u32 n) -> const bf16* {
        mbar_wait(bar0 + 8 * (n % DEC_SLOTS), (n / DEC_SLOTS) & 1);
        __syncwarp();
        return ring + (n % DEC_SLOTS) * TILE;
    };
    // Every lane is done with tile n's slot (and zero rows are written) before the warp refills it.
    auto refill = [&](u32 n) {
        __syncwarp();
        if (n + DEC_SLOTS < ntiles) stage(n + DEC_SLOTS);
    };
    const float inf = __int_as_float(0x7f800000);
    float big_m = -inf, big_l = 0.0f, big_a[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) big_a[j][0] = big_a[j][1] = 0.0f;
    for (u32 s = s_lo; s < s_hi; ++s) {
        const u32 s0 = s * ATT_SPLIT, n0 = 4 * (s - s_lo);
        // Keys: scores of the row by the split's 64 keys (tile nt holds keys 8 nt .. 8 nt + 7), a half at a time.
        float sc[8][2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const bf16* tile = tile_of(n0 + half);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float* acc = sc[4 * half + i];
                acc[0] = acc[1] = 0.0f;
                const bf16* kr = tile + (i * 8 + (lane & 7)) * ST + (lane >> 3) * 8;
#pragma unroll
                for (int k2 = 0; k2 < D / 32; ++k2) {
                    u32 b0, b1, b2, b3;
                    load_x4(kr + 32 * k2, b0, b1, b2, b3);
                    mma_top(acc, qa[2 * k2][0], qa[2 * k2][1], b0, b1);
                    mma_top(acc, qa[2 * k2 + 1][0], qa[2 * k2 + 1][1], b2, b3);
                }
            }
            refill(n0 + half);
        }
        // The split's max, exp and sum in attention_rows' order.
        float mt = -inf, lt = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& v = sc[nt][e];
                v = (int)(s0 + nt * 8 + 2 * q + e) <= prow ? v * scale : -inf;
                mt = fmaxf(mt, v);
            }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const bool active = prow >= (int)s0;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& v = sc[nt][e];
                v = active ? att_exp(v - mt) : 0.0f;
                lt += v;
            }
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        u32 pa[4][2];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            pa[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
            pa[kk][1] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        }
        // Values: the split's P V (16 keys a k16 step, in key order), a half at a time.
        float t[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) t[j][0] = t[j][1] = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const bf16* tile = tile_of(n0 + 2 + half);
            const bf16* vrow = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * ST + (lane >> 4) * 8;
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp)
#pragma unroll
                for (int kl = 0; kl < 2; ++kl) {
                    const int kk = 2 * half + kl;
                    u32 r0, r1, r2, r3;
                    load_trans_x4(vrow + kl * 16 * ST + jp * 16, r0, r1, r2, r3);
                    mma_top(t[2 * jp], pa[kk][0], pa[kk][1], r0, r1);
                    mma_top(t[2 * jp + 1], pa[kk][0], pa[kk][1], r2, r3);
                }
            refill(n0 + 2 + half);
        }
        if (spread) {
            // The split's state, stored as attention_rows stores it.
            if (prow >= 0) {
                float* st = partial + (((u64)row * nh + (u64)kvh * group + g) * nsplit + s) * (D + 2);
#pragma unroll
                for (int j = 0; j < NT; ++j) *reinterpret_cast<float2*>(st + 8 * j + 2 * q) = make_float2(t[j][0], t[j][1]);
                if (q == 0) st[D] = mt, st[D + 1] = lt;
            }
            continue;
        }
        // The split's state folded into the running one, as attention_rows folds it.
        const float top = fmaxf(big_m, mt), fa = att_exp(big_m - top), fb = att_exp(mt - top);
        if (prow >= 0) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) big_a[j][e] = fold(big_a[j][e], fa, t[j][e], fb);
            big_l = fold(big_l, fa, lt, fb);
            big_m = top;
        }
    }
    if (spread) {
        // The row's last warp to finish folds every split's state in split order: attention_rows' split fold.
        __threadfence();
        __syncwarp();
        u32 ticket = 0;
        if (lane == 0) ticket = atomicAdd(tickets + (u64)row * nkv + kvh, 1u);
        if (__shfl_sync(0xffffffffu, ticket, 0) != parts - 1) return;
        __threadfence();
        if (lane == 0) tickets[(u64)row * nkv + kvh] = 0;
        // Lane i folds elements i + 32 j of every head; a split's states load while the one before is folded.
        constexpr int PER = D / 32;
        const float* st0 = partial + ((u64)row * nh + (u64)kvh * group) * nsplit * (D + 2);
        float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][PER], ms[MAX_GROUP], ls[MAX_GROUP], pv[MAX_GROUP][PER];
        auto load = [&](u32 s) {
#pragma unroll
            for (int hh = 0; hh < MAX_GROUP; ++hh) {
                if (hh >= group) break;
                const float* st = st0 + ((u64)hh * nsplit + s) * (D + 2);
                ms[hh] = __ldcg(st + D), ls[hh] = __ldcg(st + D + 1);
#pragma unroll
                for (int j = 0; j < PER; ++j) pv[hh][j] = __ldcg(st + lane + 32 * j);
            }
        };
#pragma unroll
        for (int hh = 0; hh < MAX_GROUP; ++hh) {
            m[hh] = -inf, l[hh] = 0.0f;
#pragma unroll
            for (int j = 0; j < PER; ++j) acc[hh][j] = 0.0f;
        }
        load(0);
        for (u32 s = 0; s < nsp; ++s) {
            float cm[MAX_GROUP], cl[MAX_GROUP], cp[MAX_GROUP][PER];
#pragma unroll
            for (int hh = 0; hh < MAX_GROUP; ++hh) {
                cm[hh] = ms[hh], cl[hh] = ls[hh];
#pragma unroll
                for (int j = 0; j < PER; ++j) cp[hh][j] = pv[hh][j];
            }
            if (s + 1 < nsp) load(s + 1);
#pragma unroll
            for (int hh = 0; hh < MAX_GROUP; ++hh) {
                if (hh >= group) break;
                const float tp = fmaxf(m[hh], cm[hh]), fa = att_exp(m[hh] - tp), fb = att_exp(cm[hh] - tp);
#pragma unroll
                for (int j = 0; j < PER; ++j) acc[hh][j] = fold(acc[hh][j], fa, cp[hh][j], fb);
                l[hh] = fold(l[hh], fa, cl[hh], fb);
                m[hh] = tp;
            }
        }
#pragma unroll
        for (int hh = 0; hh < MAX_GROUP; ++hh) {
            if (hh >= group) break;
            bf16* o = out + ((u64)row * nh + (u64)kvh * group + hh) * D;
#pragma unroll
            for (int j = 0; j < PER; ++j) o[lane + 32 * j] = f2bf(acc[hh][j] / l[hh]);
        }
        return;
    }
    if (prow < 0) return;
    u32* dst = reinterpret_cast<u32*>(out + ((u64)row * nh + (u64)kvh * group + g) * D);
#pragma unroll
    for (int j = 0; j < NT; ++j) dst[(8 * j + 2 * q) / 2] = pack_bf16(big_a[j][0] / big_l, big_a[j][1] / big_l);
}

#define DECODE_KERNEL(NAME, D, SPREAD)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS, 2) NAME(                                             \
        const float* qkv, const u32* pos, const u32* groups, const u32* page_table, const u32* table_off,               \
        bf16* kcache, bf16* vcache, bf16* out, int num_groups, int nh, int nkv, int page_tokens, u64 page_stride,       \
        u64 layer_off, float scale, const u64* kv_off, const float* inv_freq, const float* q_norm,                     \
        const float* k_norm, float eps, int interleaved, int fuse_rope, float* partial, u32* tickets, int nsplit,     \
        int chunks) {                                                                                                  \
        attention_decode<D, SPREAD>(qkv, pos, groups, page_table, table_off, kcache, vcache, out, num_groups, nh,     \
                                    nkv, page_tokens, page_stride, layer_off, scale, kv_off, inv_freq, q_norm, k_norm, \
                                    eps, interleaved, fuse_rope, partial, tickets, nsplit, chunks);                    \
    }

DECODE_KERNEL(attention_decode_d32, 32, false)
DECODE_KERNEL(attention_decode_d64, 64, false)
DECODE_KERNEL(attention_decode_d96, 96, false)
DECODE_KERNEL(attention_decode_d128, 128, false)
DECODE_KERNEL(attention_decode_d256, 256, false)
DECODE_KERNEL(attention_spread_d32, 32, true)
DECODE_KERNEL(attention_spread_d64, 64, true)
DECODE_KERNEL(attention_spread_d96, 96, true)
DECODE_KERNEL(attention_spread_d128, 128, true)
DECODE_KERNEL(attention_spread_d256, 256, true)

#endif
