// Attention over the paged KV cache (bf16): per-head norm, RoPE and the cache write; then causal attention on
// tensor cores.
//
// A query row's attention depends only on its own q, its absolute position and the cached keys and values. Keys
// are cut into splits of ATT_SPLIT positions aligned to absolute positions. Each split's state (max, sum, and P V
// with P rounded to bf16) is computed fresh from q and the split's keys, and the states are folded in split order.
// mma rows are (position, query head of the KV group) pairs and an mma row's result never depends on the other
// rows of its tile, so a row decoded alone, in a round of any size or in a prefill chunk computes the same bits;
// and whether one block folds the splits as it goes or the last of several parallel blocks folds them after, the
// arithmetic is the same.

#define MAX_HEAD_DIM 256
#define MAX_GROUP 8
#define ATT_SPLIT 64
#define ATT_WARPS 4
// Norms (with `norm`) and rotates one head that one warp holds in shared memory, into out[j] for lane + 32 j;
// a v head (`rotate` false) passes through, and so do a rotated head's dimensions from `rot` on (partial rotary).
// Every step is rounded explicitly, so both kernels that call it compute the same bits. D bounds the head size.
template <int D>
__device__ __forceinline__ void rope_head(float* head, const float* norm, float eps, u32 p, const float* inv_freq,
                                          int d, int rot, int interleaved, bool rotate, float* out) {
    const int lane = threadIdx.x & 31, half = rot / 2;
    if (rotate && norm) {
        float ss = 0.0f;
        for (int i = lane; i < d; i += 32) ss = __fmaf_rn(head[i], head[i], ss);
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)d + eps);
        __syncwarp();
        for (int i = lane; i < d; i += 32) head[i] = __fmul_rn(norm[i], __fmul_rn(head[i], inv));
        __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
        const int i = lane + 32 * j;
        if (i >= d) continue;
        if (!rotate || i >= rot) {
            out[j] = head[i];
            continue;
        }
        const int pair = interleaved ? i >> 1 : (i < half ? i : i - half);
        const int a = interleaved ? 2 * pair : pair, b = interleaved ? 2 * pair + 1 : pair + half;
        const double angle = (double)__fmul_rn((float)p, inv_freq[pair]);
        const float s = (float)sin(angle), c = (float)cos(angle);
        out[j] = i == a ? __fsub_rn(__fmul_rn(head[a], c), __fmul_rn(head[b], s))
                        : __fadd_rn(__fmul_rn(head[b], c), __fmul_rn(head[a], s));
    }
}

// One warp per (row, head), ROPE_HEADS heads a block: heads [0, nh) are q, [nh, nh+nkv) k, then v. q stays in
// qkv; k and v go to the cache at kv_off[row] (the row's page and slot) plus layer_off.
#define ROPE_HEADS 4
extern "C" __global__ void __launch_bounds__(32 * ROPE_HEADS) qkv_rope_store(
    float* qkv, const u32* pos, const u64* kv_off, const float* inv_freq, const float* q_norm, const float* k_norm,
    float eps, bf16* kcache, bf16* vcache, u64 layer_off, int nh, int nkv, int d, int interleaved, int rot) {
    start_next();
    wait_prior();
    __shared__ float heads[ROPE_HEADS][MAX_HEAD_DIM];
    const int row = blockIdx.x, hd = blockIdx.y * ROPE_HEADS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (hd >= nh + 2 * nkv) return;
    float* head = heads[threadIdx.x >> 5];
    float* x = qkv + (u64)row * (nh + 2 * nkv) * d + hd * d;
    const bool is_q = hd < nh, is_v = hd >= nh + nkv;
    for (int i = lane; i < d; i += 32) head[i] = x[i];
    __syncwarp();
    float out[MAX_HEAD_DIM / 32];
    rope_head<MAX_HEAD_DIM>(head, is_q ? q_norm : k_norm, eps, pos[row], inv_freq, d, rot, interleaved, !is_v, out);
    const int kvh = is_v ? hd - nh - nkv : hd - nh;
    bf16* dst = is_q ? nullptr : (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * d;
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) {
        if (lane + 32 * j >= d) continue;
        if (is_q) x[lane + 32 * j] = out[j];
        else dst[lane + 32 * j] = f2bf(out[j]);
    }
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) { return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16); }

// Four 8x8 bf16 matrices from shared memory address `at`, transposed: the B fragments of two 8-column tiles of a
// k16 step.
__device__ __forceinline__ void load_trans_x4_at(u32 at, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at));
}

// load_trans_x4_at from a generic pointer into shared memory.
__device__ __forceinline__ void load_trans_x4(const bf16* p, u32& r0, u32& r1, u32& r2, u32& r3) {
    load_trans_x4_at((u32)__cvta_generic_to_shared(p), r0, r1, r2, r3);
}

// e^x in every attention kernel: one ex2 of x scaled by log2(e), the same bits wherever a row is computed.
__device__ __forceinline__ float att_exp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.4426950408889634f)));
    return y;
}

// The same fold of a split's state into the running one, wherever the state comes from.
__device__ __forceinline__ float fold(float run, float fa, float part, float fb) {
    return __fadd_rn(__fmul_rn(run, fa), __fmul_rn(part, fb));
}

// One split's softmax for this lane's two mma rows (sc in mma.sync's accumulator layout, keys s0 + 8 nt + 2 q + e):
// mask keys before key0 and past each row's position, scale, the split's max and exp and sum in lane order, P
// rounded to bf16 as the A fragments of P V, and the factors that fold the split into the running state. Every kernel
// of rows calls it, so a row's bits are the same in each.
__device__ __forceinline__ void split_softmax(float (&sc)[8][4], const int (&prow)[2], u32 s0, u32 key0, int q,
                                              float scale, const float (&big_m)[2], bool (&active)[2], float (&mt)[2],
                                              float (&lt)[2], u32 (&pa)[4][4], float (&fa)[2], float (&fb)[2],
                                              float (&top)[2]) {
    const float inf = __int_as_float(0x7f800000);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        mt[hr] = -inf, lt[hr] = 0.0f;
        active[hr] = prow[hr] >= (int)s0;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& v = sc[nt][2 * hr + e];
                const u32 key = s0 + nt * 8 + 2 * q + e;
                v = key >= key0 && (int)key <= prow[hr] ? v * scale : -inf;
                mt[hr] = fmaxf(mt[hr], v);
            }
        mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 1));
        mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 2));
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& v = sc[nt][2 * hr + e];
                v = active[hr] ? att_exp(v - mt[hr]) : 0.0f;
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
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        top[hr] = fmaxf(big_m[hr], mt[hr]);
        fa[hr] = att_exp(big_m[hr] - top[hr]);
        fb[hr] = att_exp(mt[hr] - top[hr]);
    }
}

// Where a block's keys and values sit, and which rows it owns.
struct KvSpan {
    const bf16* kcache;
    const bf16* vcache;
    const u32* pages;
    int page_tokens, kv_dim;
    u64 page_stride, head_off;
};

// Queues async copies of the keys and values of split positions [s0, s0 + ATT_SPLIT) into a buffer, zeros before
// begin and from end, by a block of ATT_WARPS warps; pages of a power of two positions are found with a shift and a
// mask.
template <int D>
__device__ __forceinline__ void stage_split(bf16* buf, const KvSpan& kv, u32 s0, u32 begin, u32 end) {
    constexpr int ST = D + 8, CH = D / 8, N = ATT_SPLIT * CH, THREADS = 32 * ATT_WARPS;
    const int pt = kv.page_tokens, sh = (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1;
    const u32 mask = (u32)pt - 1;
#pragma unroll
    for (int i = 0; i < (N + THREADS - 1) / THREADS; ++i) {
        const int e = threadIdx.x + THREADS * i;
        if (N % THREADS != 0 && e >= N) break;
        const int t = e / CH, c = e - t * CH;
        const u32 kp = s0 + t;
        bf16* kd = buf + t * ST + c * 8;
        bf16* vd = kd + ATT_SPLIT * ST;
        if (kp >= begin && kp < end) {
            const u32 page = sh >= 0 ? kv.pages[kp >> sh] : kv.pages[kp / pt];
            const u32 in_page = sh >= 0 ? kp & mask : kp % pt;
            const u64 at = (u64)page * kv.page_stride + kv.head_off + (u64)in_page * kv.kv_dim + c * 8;
            copy16_async(reinterpret_cast<uint4*>(kd), reinterpret_cast<const uint4*>(kv.kcache + at));
            copy16_async(reinterpret_cast<uint4*>(vd), reinterpret_cast<const uint4*>(kv.vcache + at));
        } else {
            *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
        }
    }
    async_commit();
}

// One block per (KV head, group of rows, z): a group is up to ATT_WARPS * (16 / group size) consecutive positions
// of one lane (groups[2 y] its first row, groups[2 y + 1] its count), staged keys and values shared by all. Warp w
// owns positions w * per_warp .. of the group, each with every query head of the KV group, as 16 mma rows.
// With `partial` (every group one row), block z runs splits z, z + gridDim.z, ... and stores each split's state;
// the last of the row's blocks, counted in `tickets` (left zero), folds them. Otherwise one block folds as it goes.
// A page holds `page_tokens` positions of every layer and is `page_stride` elements long; layer_off picks the layer.
// Rows attend keys key0 to their position (a draft head's start at 1: its keys sit at their tokens' own slots).
template <int D>
__device__ void attention_rows(const float* __restrict__ qkv, const u32* __restrict__ pos, const u32* __restrict__ groups,
                               const u32* __restrict__ page_table, const u32* __restrict__ table_off, bf16* kcache,
                               bf16* vcache, bf16* __restrict__ out, float* __restrict__ partial, u32* __restrict__ tickets,
                               int nh, int nkv, int page_tokens, u64 page_stride, u64 layer_off, float scale, int nsplit,
                               const u64* __restrict__ kv_off, const float* __restrict__ inv_freq,
                               const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                               int interleaved, int fuse_rope, u32 key0) {
    constexpr int ST = D + 8, TILE = ATT_SPLIT * ST, NT = D / 8;
    start_next();
    wait_prior();
    extern __shared__ uint4 smem_raw[];
    bf16* stage = reinterpret_cast<bf16*>(smem_raw);
    __shared__ float qrot[MAX_GROUP][D];
    // Scores that warps sharing rows swap: row, then key pair; 36 pairs a row keeps a half warp's accesses apart.
    __shared__ float2 swap[16][36];
    const int kvh = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nwarps = blockDim.x >> 5, group = nh / nkv, per_warp = 16 / group, width = (nh + 2 * nkv) * D;
    const u32 row0 = groups[2 * blockIdx.y], count = groups[2 * blockIdx.y + 1];
    const u32 last_p = pos[row0 + count - 1], nsp = last_p / ATT_SPLIT + 1;
    const bool split = partial && nsp <= (u32)nsplit;
    const u32 first = split ? blockIdx.z : 0, step = split ? gridDim.z : 1;
    if (first >= nsp || (!split && blockIdx.z > 0)) return;
    KvSpan kv = {kcache, vcache, page_table + table_off[row0], page_tokens, nkv * D, page_stride,
                 layer_off + (u64)kvh * D};
    // The first split's keys load while q is read, unless this block writes the newest key first.
    if (!fuse_rope) stage_split<D>(stage, kv, first * ATT_SPLIT, key0, min(last_p + 1, (first + 1) * ATT_SPLIT));
    if (fuse_rope) {
        // A decode round (one row per group): the block rotates the q heads itself, and the block that runs the
        // row's last split writes the new key and value, as qkv_rope_store would, before it stages them.
        __shared__ float fresh[2][D];
        float o[D / 32];
        for (int hh = warp; hh < group; hh += nwarps) {
            const float* src = qkv + (u64)row0 * width + (u64)(kvh * group + hh) * D;
            for (int i = lane; i < D; i += 32) qrot[hh][i] = src[i];
            __syncwarp();
            rope_head<D>(qrot[hh], q_norm, eps, last_p, inv_freq, D, D, interleaved, true, o);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < D / 32; ++j) qrot[hh][lane + 32 * j] = o[j];
        }
        if (!split || (nsp - 1) % gridDim.z == blockIdx.z) {
            for (int which = warp; which < 2; which += nwarps) {
                const bool is_v = which == 1;
                const float* src = qkv + (u64)row0 * width + (u64)(nh + which * nkv + kvh) * D;
                for (int i = lane; i < D; i += 32) fresh[which][i] = src[i];
                __syncwarp();
                rope_head<D>(fresh[which], k_norm, eps, last_p, inv_freq, D, D, interleaved, !is_v, o);
                bf16* dst = (is_v ? vcache : kcache) + kv_off[row0] + layer_off + (u64)kvh * D;
#pragma unroll
                for (int j = 0; j < D / 32; ++j) dst[lane + 32 * j] = f2bf(o[j]);
            }
        }
        __syncthreads();
    }
    // Where every row fits one warp's tile, all warps take the same rows and split the output columns between them.
    const bool share = (int)count <= per_warp;
    const int jlo = share ? warp * (NT / 2) / nwarps : 0, jhi = share ? (warp + 1) * (NT / 2) / nwarps : NT / 2;
    // This lane's two mma rows, g and g + 8: their q, position (-1 for padding), output row and head.
    const float* qrow[2];
    int prow[2];
    u64 orow[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = g + 8 * hr, pi = r / group, hh = r - pi * group;
        const u32 local = (share ? 0 : warp * per_warp) + pi;
        const bool valid = pi < per_warp && local < count;
        const u64 row = row0 + local, h = (u64)kvh * group + hh;
        prow[hr] = valid ? (int)pos[row] : -1;
        qrow[hr] = !valid ? nullptr : fuse_rope ? qrot[hh] : qkv + row * width + h * D;
        orow[hr] = (row * nh + h);
    }
    const bool busy = jlo < jhi && (share || warp * per_warp < (int)count);
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
    if (fuse_rope) stage_split<D>(stage, kv, first * ATT_SPLIT, key0, min(last_p + 1, (first + 1) * ATT_SPLIT));
    for (u32 s = first, it = 0; s < nsp; s += step, ++it) {
        const u32 s0 = s * ATT_SPLIT, nx = s + step;
        if (nx < nsp) {
            stage_split<D>(stage + ((it + 1) & 1) * 2 * TILE, kv, nx * ATT_SPLIT, key0,
                           min(last_p + 1, (nx + 1) * ATT_SPLIT));
            async_wait<1>();
        } else {
            async_wait<0>();
        }
        __syncthreads();
        const bf16* ks = stage + (it & 1) * 2 * TILE;
        const bf16* vs = ks + TILE;
        // Scores of 16 rows by the split's 64 keys: tile nt holds keys 8 nt .. 8 nt + 7. Where the warps share rows,
        // each computes 8 / ATT_WARPS of the tiles, with the same mma sequence, and they swap them in shared memory.
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            if (share ? nt * ATT_WARPS / 8 != warp : !busy) continue;
#pragma unroll
            for (int k = 0; k < D / 16; ++k) {
                const bf16* kr = ks + (nt * 8 + g) * ST + k * 16 + 2 * q;
                mma_bf16(sc[nt], qa[k][0], qa[k][1], qa[k][2], qa[k][3], *reinterpret_cast<const u32*>(kr),
                         *reinterpret_cast<const u32*>(kr + 8));
            }
            if (share) {
                swap[g][nt * 4 + q] = make_float2(sc[nt][0], sc[nt][1]);
                swap[g + 8][nt * 4 + q] = make_float2(sc[nt][2], sc[nt][3]);
            }
        }
        if (share) {
            __syncthreads();
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const float2 lo = swap[g][nt * 4 + q], hi = swap[g + 8][nt * 4 + q];
                sc[nt][0] = lo.x, sc[nt][1] = lo.y, sc[nt][2] = hi.x, sc[nt][3] = hi.y;
            }
        }
        if (busy) {
            float mt[2], lt[2], fa[2], fb[2], top[2];
            bool active[2];
            u32 pa[4][4];
            split_softmax(sc, prow, s0, key0, q, scale, big_m, active, mt, lt, pa, fa, fb, top);
            const bf16* vrow = vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * ST + (lane >> 4) * 8;
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                if (jp < jlo || jp >= jhi) continue;
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
                        if (split) {
                            if (prow[hr] >= 0)
                                partial[(orow[hr] * nsplit + s) * (D + 2) + 8 * j + 2 * q + (e & 1)] = t[u][e];
                        } else if (active[hr]) {
                            big_a[j][e] = fold(big_a[j][e], fa[hr], t[u][e], fb[hr]);
                        }
                    }
            }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                if (split) {
                    if (prow[hr] >= 0 && q == 0 && jlo == 0) {
                        float* st = partial + (orow[hr] * nsplit + s) * (D + 2) + D;
                        st[0] = mt[hr], st[1] = lt[hr];
                    }
                } else if (active[hr]) {
                    big_l[hr] = fold(big_l[hr], fa[hr], lt[hr], fb[hr]);
                    big_m[hr] = top[hr];
                }
            }
        }
        __syncthreads();
    }
    if (split) {
        // The row's last block to finish folds every split's state, in split order, and writes the row.
        __shared__ u32 ticket;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) ticket = atomicAdd(tickets + row0 * nkv + kvh, 1u);
        __syncthreads();
        if (ticket != min(gridDim.z, nsp) - 1) return;
        __threadfence();
        if (threadIdx.x == 0) tickets[row0 * nkv + kvh] = 0;
        // Every thread folds some (head, element) of the row in split order: the fold of the direct path.
        const u64 head0 = (u64)row0 * nh + (u64)kvh * group;
        for (int e = threadIdx.x; e < group * D; e += blockDim.x) {
            const int hh = e / D, i = e - hh * D;
            const float* st = partial + (head0 + hh) * nsplit * (D + 2);
            float m = -inf, l = 0.0f, acc = 0.0f;
            for (u32 s = 0; s < nsp; ++s, st += D + 2) {
                const float ms = __ldcg(st + D), tp = fmaxf(m, ms), fa = att_exp(m - tp), fb = att_exp(ms - tp);
                acc = fold(acc, fa, __ldcg(st + i), fb);
                l = fold(l, fa, __ldcg(st + D + 1), fb);
                m = tp;
            }
            out[(head0 + hh) * D + i] = f2bf(acc / l);
        }
        return;
    }
    if (!busy) return;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (prow[hr] < 0) continue;
        u32* dst = reinterpret_cast<u32*>(out + orow[hr] * D);
#pragma unroll
        for (int j = 0; j < NT; ++j)
            if (j >= 2 * jlo && j < 2 * jhi)
                dst[(8 * j + 2 * q) / 2] = pack_bf16(big_a[j][2 * hr] / big_l[hr], big_a[j][2 * hr + 1] / big_l[hr]);
    }
}

// One block an SM is all the bound asks: ptxas may otherwise spill registers to fit more blocks.
#define ATTENTION_KERNEL(D)                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS, 1) attention_d##D(                                    \
        const float* qkv, const u32* pos, const u32* groups, const u32* page_table, const u32* table_off,               \
        bf16* kcache, bf16* vcache, bf16* out, float* partial, u32* tickets, int nh, int nkv, int page_tokens,          \
        u64 page_stride, u64 layer_off, float scale, int nsplit, const u64* kv_off, const float* inv_freq,               \
        const float* q_norm, const float* k_norm, float eps, int interleaved, int fuse_rope, u32 key0) {              \
        attention_rows<D>(qkv, pos, groups, page_table, table_off, kcache, vcache, out, partial, tickets, nh, nkv,    \
                          page_tokens, page_stride, layer_off, scale, nsplit, kv_off, inv_freq, q_norm, k_norm, eps,   \
                          interleaved, fuse_rope, key0);                                                               \
    }

ATTENTION_KERNEL(32)
ATTENTION_KERNEL(64)
ATTENTION_KERNEL(96)
ATTENTION_KERNEL(128)
ATTENTION_KERNEL(256)
