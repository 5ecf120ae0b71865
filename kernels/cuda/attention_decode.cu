// Decode attention for wide rounds (every row group one row): one warp per (row, KV head) streams that head's keys
// and values through its own ring of shared-memory tiles, so no warp waits on another and each split's softmax is
// computed once. The per-split arithmetic and the fold are attention_rows' own, step for step: a row decoded here
// gets the bits it gets there, alone, in a prompt chunk or among any other rows.

// Warps a block holds, each an independent (row, KV head); tiles in flight per warp (a tile is one split's keys or
// values), which sets the bytes each SM keeps in flight.
#define DEC_WARPS 4
#define DEC_SLOTS 3

// The page ids of split `s` for stage_tile, lane j holding the split's j-th page (pages of 2 or more positions).
__device__ __forceinline__ u32 split_pages(const KvSpan& kv, u32 s, u32 end, int sh) {
    const u32 lane = threadIdx.x & 31, page = ((s * ATT_SPLIT) >> sh) + lane;
    return lane < max(1, ATT_SPLIT >> sh) && (page << sh) < end ? kv.pages[page] : 0u;
}

// Queues one tile (kind 0 keys, 1 values) of split positions [s0, s0 + ATT_SPLIT) by one warp; zeros past end.
// With pages of 2^sh positions (sh >= 1) the split's page ids come in `pid` (split_pages), else from the table.
template <int D>
__device__ __forceinline__ void stage_tile(bf16* dst, const KvSpan& kv, int kind, u32 s0, u32 end, u32 pid, int sh) {
    constexpr int ST = D + 8, CH = D / 8, PER = ATT_SPLIT * CH / 32;
    const bf16* cache = (kind ? kv.vcache : kv.kcache) + kv.head_off;
    const int lane = threadIdx.x & 31;
    const u32 mask = (1u << max(sh, 0)) - 1;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i, t = e / CH, c = e - t * CH;
        const u32 kp = s0 + t;
        bf16* d = dst + t * ST + c * 8;
        if (sh > 0) {
            const u32 page = __shfl_sync(0xffffffffu, pid, (t >> sh) & 31);
            if (kp < end)
                copy16_async(reinterpret_cast<uint4*>(d),
                             reinterpret_cast<const uint4*>(cache + (u64)page * kv.page_stride +
                                                            (u64)(kp & mask) * kv.kv_dim + c * 8));
            else
                *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        } else if (kp < end) {
            const u64 at = (u64)kv.pages[kp / kv.page_tokens] * kv.page_stride + (u64)(kp % kv.page_tokens) * kv.kv_dim;
            copy16_async(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(cache + at + c * 8));
        } else {
            *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        }
    }
}

template <int D>
__device__ void attention_decode(const float* __restrict__ qkv, const u32* __restrict__ pos,
                                 const u32* __restrict__ groups, const u32* __restrict__ page_table,
                                 const u32* __restrict__ table_off, bf16* kcache, bf16* vcache, bf16* __restrict__ out,
                                 int num_groups, int nh, int nkv, int page_tokens, u64 page_stride, u64 layer_off,
                                 float scale, const u64* __restrict__ kv_off, const float* __restrict__ inv_freq,
                                 const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                                 int interleaved, int fuse_rope) {
    constexpr int ST = D + 8, TILE = ATT_SPLIT * ST, NT = D / 8;
    start_next();
    wait_prior();
    extern __shared__ uint4 smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int unit = blockIdx.x * DEC_WARPS + warp, kvh = unit % nkv, y = unit / nkv;
    if (y >= num_groups) return;
    bf16* ring = reinterpret_cast<bf16*>(smem_raw) + warp * DEC_SLOTS * TILE;
    float* qrot = reinterpret_cast<float*>(reinterpret_cast<bf16*>(smem_raw) + DEC_WARPS * DEC_SLOTS * TILE) +
                  warp * MAX_GROUP * MAX_HEAD_DIM;
    const int group = nh / nkv, width = (nh + 2 * nkv) * D;
    const u32 row = groups[2 * y], last_p = pos[row], nsp = last_p / ATT_SPLIT + 1, end = last_p + 1;
    KvSpan kv = {kcache, vcache, page_table + table_off[row], page_tokens, nkv * D, page_stride,
                 layer_off + (u64)kvh * D};
    if (fuse_rope) {
        // The warp rotates its q heads, then writes the row's new key and value before any tile reads them.
        float o[MAX_HEAD_DIM / 32];
        for (int hh = 0; hh < group; ++hh) {
            float* head = qrot + hh * MAX_HEAD_DIM;
            const float* src = qkv + (u64)row * width + (u64)(kvh * group + hh) * D;
            for (int i = lane; i < D; i += 32) head[i] = src[i];
            __syncwarp();
            rope_head(head, q_norm, eps, last_p, inv_freq, D, interleaved, true, o);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
                if (lane + 32 * j < D) head[lane + 32 * j] = o[j];
        }
        float* fresh = qrot + group * MAX_HEAD_DIM;
        for (int which = 0; which < 2; ++which) {
            const bool is_v = which == 1;
            const float* src = qkv + (u64)row * width + (u64)(nh + which * nkv + kvh) * D;
            __syncwarp();
            for (int i = lane; i < D; i += 32) fresh[i] = src[i];
            __syncwarp();
            rope_head(fresh, k_norm, eps, last_p, inv_freq, D, interleaved, !is_v, o);
            bf16* dst = (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * D;
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
                if (lane + 32 * j < D) dst[lane + 32 * j] = f2bf(o[j]);
        }
        __threadfence_block();
        __syncwarp();
    }
    // Page ids by split parity: a split's ids are loaded while the split before it is staged.
    const int pt = page_tokens, sh = pt >= 2 && (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1;
    u32 pids[2] = {sh > 0 ? split_pages(kv, 0, end, sh) : 0u, 0u};
    // Stages tile n of the ring; with a split's keys, loads the next split's page ids into the other parity.
    auto stage = [&](u32 n) {
        const u32 sn = n >> 1;
        stage_tile<D>(ring + (n % DEC_SLOTS) * TILE, kv, n & 1, sn * ATT_SPLIT, min(end, (sn + 1) * ATT_SPLIT),
                      sn & 1 ? pids[1] : pids[0], sh);
        if (sh > 0 && (n & 1) == 0 && sn + 1 < nsp) {
            const u32 ahead = split_pages(kv, sn + 1, end, sh);
            pids[0] = sn & 1 ? ahead : pids[0];
            pids[1] = sn & 1 ? pids[1] : ahead;
        }
    };
    // The ring's first tiles: keys of split 0, its values, keys of split 1; a group is committed for every tile.
#pragma unroll
    for (int i = 0; i < DEC_SLOTS; ++i) {
        if ((u32)i < 2 * nsp) stage(i);
        async_commit();
    }
    // This lane's two mma rows, g and g + 8: query head r of the KV group for r < group, padding past it.
    const float* qrow[2];
    int prow[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = g + 8 * hr;
        prow[hr] = r < group ? (int)last_p : -1;
        qrow[hr] = r >= group ? nullptr : fuse_rope ? qrot + r * MAX_HEAD_DIM : qkv + (u64)row * width + (u64)(kvh * group + r) * D;
    }
    u32 qa[D / 16][4];
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const int c = k * 16 + 2 * q;
        float2 lo[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)}, hi[2] = {lo[0], lo[1]};
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
            if (qrow[hr]) {
                lo[hr] = *reinterpret_cast<const float2*>(qrow[hr] + c);
                hi[hr] = *reinterpret_cast<const float2*>(qrow[hr] + c + 8);
            }
        qa[k][0] = pack_bf16(lo[0].x, lo[0].y);
        qa[k][1] = pack_bf16(lo[1].x, lo[1].y);
        qa[k][2] = pack_bf16(hi[0].x, hi[0].y);
        qa[k][3] = pack_bf16(hi[1].x, hi[1].y);
    }
    const float inf = __int_as_float(0x7f800000);
    float big_m[2] = {-inf, -inf}, big_l[2] = {0.0f, 0.0f}, big_a[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) big_a[j][0] = big_a[j][1] = big_a[j][2] = big_a[j][3] = 0.0f;
    float mt[2], lt[2];
    u32 pa[4][4];
    for (u32 i = 0; i < 2 * nsp; ++i) {
        const u32 s = i >> 1, s0 = s * ATT_SPLIT;
        async_wait<DEC_SLOTS - 1>();
        __syncwarp();
        const bf16* tile = ring + (i % DEC_SLOTS) * TILE;
        if ((i & 1) == 0) {
            // Keys: scores of 16 rows by the split's 64 keys, their max, exp and sum in attention_rows' order.
            float sc[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
                for (int k = 0; k < D / 16; ++k) {
                    const bf16* kr = tile + (nt * 8 + g) * ST + k * 16 + 2 * q;
                    mma_bf16(sc[nt], qa[k][0], qa[k][1], qa[k][2], qa[k][3], *reinterpret_cast<const u32*>(kr),
                             *reinterpret_cast<const u32*>(kr + 8));
                }
            }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                mt[hr] = -inf, lt[hr] = 0.0f;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& v = sc[nt][2 * hr + e];
                        v = (int)(s0 + nt * 8 + 2 * q + e) <= prow[hr] ? v * scale : -inf;
                        mt[hr] = fmaxf(mt[hr], v);
                    }
                mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 1));
                mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 2));
                const bool active = prow[hr] >= (int)s0;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& v = sc[nt][2 * hr + e];
                        v = active ? att_exp(v - mt[hr]) : 0.0f;
                        lt[hr] += v;
                    }
                lt[hr] += __shfl_xor_sync(0xffffffffu, lt[hr], 1);
                lt[hr] += __shfl_xor_sync(0xffffffffu, lt[hr], 2);
            }
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                pa[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
                pa[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
                pa[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            }
        } else {
            // Values: the split's P V, folded into the running state as attention_rows folds it.
            float fa[2], fb[2], top[2];
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                top[hr] = fmaxf(big_m[hr], mt[hr]);
                fa[hr] = att_exp(big_m[hr] - top[hr]);
                fb[hr] = att_exp(mt[hr] - top[hr]);
            }
            const bf16* vrow = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * ST + (lane >> 4) * 8;
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                float t[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    u32 r0, r1, r2, r3;
                    load_trans_x4(vrow + kk * 16 * ST + jp * 16, r0, r1, r2, r3);
                    mma_bf16(t[0], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r0, r1);
                    mma_bf16(t[1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r2, r3);
                }
#pragma unroll
                for (int u = 0; u < 2; ++u)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int hr = e >> 1, j = 2 * jp + u;
                        if (prow[hr] >= 0) big_a[j][e] = fold(big_a[j][e], fa[hr], t[u][e], fb[hr]);
                    }
            }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                if (prow[hr] < 0) continue;
                big_l[hr] = fold(big_l[hr], fa[hr], lt[hr], fb[hr]);
                big_m[hr] = top[hr];
            }
        }
        // Every lane is done with the slot before the warp refills it with the tile DEC_SLOTS ahead.
        __syncwarp();
        if (i + DEC_SLOTS < 2 * nsp) stage(i + DEC_SLOTS);
        async_commit();
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (prow[hr] < 0) continue;
        u32* dst = reinterpret_cast<u32*>(out + ((u64)row * nh + (u64)kvh * group + g + 8 * hr) * D);
#pragma unroll
        for (int j = 0; j < NT; ++j)
            dst[(8 * j + 2 * q) / 2] = pack_bf16(big_a[j][2 * hr] / big_l[hr], big_a[j][2 * hr + 1] / big_l[hr]);
    }
}

#define DECODE_KERNEL(D)                                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS, 1) attention_decode_d##D(                            \
        const float* qkv, const u32* pos, const u32* groups, const u32* page_table, const u32* table_off,               \
        bf16* kcache, bf16* vcache, bf16* out, int num_groups, int nh, int nkv, int page_tokens, u64 page_stride,       \
        u64 layer_off, float scale, const u64* kv_off, const float* inv_freq, const float* q_norm,                     \
        const float* k_norm, float eps, int interleaved, int fuse_rope) {                                              \
        attention_decode<D>(qkv, pos, groups, page_table, table_off, kcache, vcache, out, num_groups, nh, nkv,       \
                            page_tokens, page_stride, layer_off, scale, kv_off, inv_freq, q_norm, k_norm, eps,         \
                            interleaved, fuse_rope);                                                                   \
    }

DECODE_KERNEL(32)
DECODE_KERNEL(64)
DECODE_KERNEL(96)
DECODE_KERNEL(128)
