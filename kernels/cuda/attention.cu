// Attention over the paged KV cache: per-head norm, RoPE and the cache write; then causal attention.
//
// A query row's attention depends only on its own q, its absolute position and the cached keys and
// values. Keys are cut into splits of ATT_SPLIT positions aligned to absolute positions; each split runs
// an online softmax over tiles of 32 keys from a fresh state, and the splits' states are folded in split
// order. Whether one block folds them as it goes or the last of several parallel blocks folds them after,
// the arithmetic is the same, so a row computes the same bits in a round of any size or chunking.

#define MAX_HEAD_DIM 128
#define MAX_GROUP 8
#define ATT_TILE 32
#define ATT_SPLIT 64
// Row stride of a staged key tile: 16-byte aligned rows that lanes read as float4 without bank conflicts.
#define KS_STRIDE (MAX_HEAD_DIM + 4)
// Floats of one staged tile of keys and values.
#define ATT_BUF (ATT_TILE * KS_STRIDE + ATT_TILE * MAX_HEAD_DIM)

// Norms (with `norm`) and rotates one head that one warp holds in shared memory, into out[j] for lane + 32 j;
// a v head (`rotate` false) passes through. Every step is rounded explicitly, so both kernels that call it
// compute the same bits.
__device__ __forceinline__ void rope_head(float* head, const float* norm, float eps, u32 p, const float* inv_freq,
                                          int d, int interleaved, bool rotate, float* out) {
    const int lane = threadIdx.x & 31, half = d / 2;
    if (rotate && norm) {
        float ss = 0.0f;
        for (int i = lane; i < d; i += 32) ss = __fmaf_rn(head[i], head[i], ss);
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)d + eps);
        __syncwarp();
        for (int i = lane; i < d; i += 32) head[i] = __fmul_rn(norm[i], __fmul_rn(head[i], inv));
        __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) {
        const int i = lane + 32 * j;
        if (i >= d) continue;
        if (!rotate) {
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

// One warp per (row, head): heads [0, nh) are q, [nh, nh+nkv) k, then v. q stays in qkv; k and v go to the cache
// at kv_off[row] (the row's page and slot) plus layer_off.
extern "C" __global__ void qkv_rope_store(float* qkv, const u32* pos, const u64* kv_off, const float* inv_freq,
                                          const float* q_norm, const float* k_norm, float eps, float* kcache,
                                          float* vcache, u64 layer_off, int nh, int nkv, int d, int interleaved) {
    start_next();
    wait_prior();
    __shared__ float head[MAX_HEAD_DIM];
    const int row = blockIdx.x, hd = blockIdx.y, lane = threadIdx.x;
    float* x = qkv + (u64)row * (nh + 2 * nkv) * d + hd * d;
    const bool is_q = hd < nh, is_v = hd >= nh + nkv;
    for (int i = lane; i < d; i += 32) head[i] = x[i];
    __syncwarp();
    float out[MAX_HEAD_DIM / 32];
    rope_head(head, is_q ? q_norm : k_norm, eps, pos[row], inv_freq, d, interleaved, !is_v, out);
    const int kvh = is_v ? hd - nh - nkv : hd - nh;
    float* dst = is_q ? x : (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * d;
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
        if (lane + 32 * j < d) dst[lane + 32 * j] = out[j];
}

// Folds a split's softmax state (m, l, acc) into a running one, rounding each step the same way in every kernel.
__device__ __forceinline__ void fold_state(float& big_m, float& big_l, float* big_a, float m, float l, const float* acc,
                                           int d) {
    const float top = fmaxf(big_m, m), a = expf(big_m - top), b = expf(m - top);
    big_l = __fadd_rn(__fmul_rn(big_l, a), __fmul_rn(l, b));
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
        if (j < d / 32) big_a[j] = __fadd_rn(__fmul_rn(big_a[j], a), __fmul_rn(acc[j], b));
    big_m = top;
}

// Where one KV cache row sits: `pid` holds the page of each position of the split starting at s0.
struct KvSpan {
    const float* kcache;
    const float* vcache;
    const u32* pid;
    u32 s0;
    int page_tokens, kv_dim, d;
    u64 page_stride, head_off;
};

// Queues async copies of keys and values [start, start + count) into a tile buffer, as one commit group.
__device__ __forceinline__ void stage_tile(float* buf, const KvSpan& kv, u32 start, int count) {
    const int vec = kv.d / 4;
    for (int e = threadIdx.x; e < count * vec; e += blockDim.x) {
        const int t = e / vec, i = 4 * (e - t * vec);
        const u32 kp = start + t;
        const u64 at = (u64)kv.pid[kp - kv.s0] * kv.page_stride + kv.head_off + (u64)(kp % kv.page_tokens) * kv.kv_dim + i;
        copy16_async(reinterpret_cast<uint4*>(buf + t * KS_STRIDE + i), reinterpret_cast<const uint4*>(kv.kcache + at));
        copy16_async(reinterpret_cast<uint4*>(buf + ATT_TILE * KS_STRIDE + t * MAX_HEAD_DIM + i),
                     reinterpret_cast<const uint4*>(kv.vcache + at));
    }
    async_commit();
}

// One block per (kv head, row, z), one warp per q head of the group; tiles are staged in shared memory once
// for the whole group, and lane j scores key j of a tile. With `partial`, block z runs splits z, z + gridDim.z, ...
// and stores each split's state; the last of the row's blocks, counted in `tickets` (left zero), folds them.
// Rows with more than `nsplit` splits, or every row without `partial`, fold in one block as they go.
// A page holds `page_tokens` positions of every layer and is `page_stride` floats long; layer_off picks the layer.
extern "C" __global__ void __launch_bounds__(256) paged_attention(
    const float* __restrict__ qkv, const u32* __restrict__ pos, const u32* __restrict__ page_table,
    const u32* __restrict__ table_off, float* __restrict__ kcache, float* __restrict__ vcache, bf16* __restrict__ out,
    float* __restrict__ partial, u32* __restrict__ tickets, int nh, int nkv, int d, int page_tokens, u64 page_stride,
    u64 layer_off, float scale, int nsplit, const u64* __restrict__ kv_off, const float* __restrict__ inv_freq,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps, int interleaved, int fuse_rope) {
    start_next();
    wait_prior();
    extern __shared__ float stage[];
    __shared__ float qs[MAX_GROUP][MAX_HEAD_DIM];
    __shared__ u32 pid[ATT_SPLIT];
    const int kvh = blockIdx.x, row = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = nh / nkv, h = kvh * group + warp;
    const u32 p = pos[row];
    const bool split = partial && p / ATT_SPLIT < (u32)nsplit;
    const u32 first = split ? blockIdx.z : 0, step = split ? gridDim.z : 1;
    if (first * ATT_SPLIT > p || (!split && blockIdx.z > 0)) return;
    const float* src = qkv + (u64)row * (nh + 2 * nkv) * d + (u64)h * d;
    for (int i = lane; i < d; i += 32) qs[warp][i] = src[i];
    if (fuse_rope) {
        // A decode round: each block rotates its q heads itself, and the block that runs the row's last split
        // writes the new key and value, as qkv_rope_store would, before it stages them.
        __shared__ float fresh[2][MAX_HEAD_DIM];
        __syncwarp();
        float o[MAX_HEAD_DIM / 32];
        rope_head(qs[warp], q_norm, eps, p, inv_freq, d, interleaved, true, o);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
            if (lane + 32 * j < d) qs[warp][lane + 32 * j] = o[j];
        if (!split || (p / ATT_SPLIT) % gridDim.z == blockIdx.z) {
            for (int which = warp; which < 2; which += blockDim.x >> 5) {
                const bool is_v = which == 1;
                const float* hsrc = qkv + (u64)row * (nh + 2 * nkv) * d + (u64)(nh + which * nkv + kvh) * d;
                for (int i = lane; i < d; i += 32) fresh[which][i] = hsrc[i];
                __syncwarp();
                rope_head(fresh[which], k_norm, eps, p, inv_freq, d, interleaved, !is_v, o);
                float* dst = (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * d;
#pragma unroll
                for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
                    if (lane + 32 * j < d) dst[lane + 32 * j] = o[j];
            }
        }
    }
    const u32* pages = page_table + table_off[row];
    KvSpan kv = {kcache, vcache, pid, 0, page_tokens, nkv * d, d, page_stride, layer_off + (u64)kvh * d};
    const float inf = __int_as_float(0x7f800000);
    float big_m = -inf, big_l = 0.0f, big_a[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) big_a[j] = 0.0f;
    for (u32 s = first; s * ATT_SPLIT <= p; s += step) {
        const u32 s0 = s * ATT_SPLIT, end = min(p + 1, s0 + ATT_SPLIT);
        __syncthreads();
        for (u32 t = threadIdx.x; t < end - s0; t += blockDim.x) pid[t] = pages[(s0 + t) / page_tokens];
        kv.s0 = s0;
        __syncthreads();
        const int tiles = (end - s0 + ATT_TILE - 1) / ATT_TILE;
        stage_tile(stage, kv, s0, min((u32)ATT_TILE, end - s0));
        float m = -inf, l = 0.0f, acc[MAX_HEAD_DIM / 32];
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) acc[j] = 0.0f;
        for (int tile = 0; tile < tiles; ++tile) {
            const u32 start = s0 + tile * ATT_TILE;
            const int count = min((u32)ATT_TILE, end - start);
            if (tile + 1 < tiles) {
                stage_tile(stage + ((tile + 1) & 1) * ATT_BUF, kv, start + ATT_TILE, min((u32)ATT_TILE, end - start - ATT_TILE));
                async_wait<1>();
            } else {
                async_wait<0>();
            }
            __syncthreads();
            const float* ks = stage + (tile & 1) * ATT_BUF;
            const float* vs = ks + ATT_TILE * KS_STRIDE;
            float score = -inf;
            if (lane < count) {
                float dot = 0.0f;
                for (int i = 0; i < d; i += 4) {
                    const float4 k4 = *reinterpret_cast<const float4*>(ks + lane * KS_STRIDE + i);
                    dot += qs[warp][i] * k4.x;
                    dot += qs[warp][i + 1] * k4.y;
                    dot += qs[warp][i + 2] * k4.z;
                    dot += qs[warp][i + 3] * k4.w;
                }
                score = dot * scale;
            }
            const float m_new = fmaxf(m, warp_max(score));
            const float pr = lane < count ? expf(score - m_new) : 0.0f;
            const float rescale = expf(m - m_new);
            l = l * rescale + warp_sum(pr);
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) acc[j] *= rescale;
            for (int t = 0; t < count; ++t) {
                const float pt = __shfl_sync(0xffffffffu, pr, t);
#pragma unroll
                for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
                    if (j < d / 32) acc[j] += pt * vs[t * MAX_HEAD_DIM + lane + 32 * j];
            }
            m = m_new;
            __syncthreads();
        }
        if (split) {
            float* dst = partial + ((u64)(row * nh + h) * nsplit + s) * (d + 2);
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
                if (j < d / 32) dst[lane + 32 * j] = acc[j];
            if (lane == 0) dst[d] = m, dst[d + 1] = l;
        } else {
            fold_state(big_m, big_l, big_a, m, l, acc, d);
        }
    }
    if (split) {
        // The row's last block to finish folds every split's state, in split order, and writes the row.
        __shared__ u32 ticket;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) ticket = atomicAdd(tickets + row * nkv + kvh, 1u);
        __syncthreads();
        if (ticket != min(gridDim.z, p / ATT_SPLIT + 1) - 1) return;
        __threadfence();
        if (threadIdx.x == 0) tickets[row * nkv + kvh] = 0;
        const float* base = partial + (u64)(row * nh + h) * nsplit * (d + 2);
        for (u32 s = 0; s * ATT_SPLIT <= p; ++s) {
            const float* part = base + (u64)s * (d + 2);
            float acc[MAX_HEAD_DIM / 32];
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) acc[j] = j < d / 32 ? __ldcg(part + lane + 32 * j) : 0.0f;
            fold_state(big_m, big_l, big_a, __ldcg(part + d), __ldcg(part + d + 1), acc, d);
        }
    }
    bf16* dst = out + (u64)row * nh * d + (u64)h * d;
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j)
        if (j < d / 32) dst[lane + 32 * j] = f2bf(big_a[j] / big_l);
}
