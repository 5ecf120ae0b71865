// Attention over the paged KV cache: per-head norm, RoPE and the cache write; then causal attention.
//
// A query row's attention depends only on its own q, its absolute position and the cached keys and
// values: keys are visited in tiles of 32 aligned to absolute positions, with an online softmax in
// block order, so a row computes the same bits in a prefill chunk of any size as decoded alone.

#define MAX_HEAD_DIM 128
#define MAX_GROUP 8
#define ATT_TILE 32

// One warp per (row, head): heads [0, nh) are q, [nh, nh+nkv) k, then v. q stays in qkv; k and v go to the cache
// at kv_off[row] (the row's page and slot) plus layer_off.
extern "C" __global__ void qkv_rope_store(float* qkv, const u32* pos, const u64* kv_off, const float* inv_freq,
                                          const float* q_norm, const float* k_norm, float eps, float* kcache,
                                          float* vcache, u64 layer_off, int nh, int nkv, int d, int interleaved) {
    start_next();
    wait_prior();
    __shared__ float head[MAX_HEAD_DIM];
    const int row = blockIdx.x, hd = blockIdx.y, lane = threadIdx.x;
    const int width = (nh + 2 * nkv) * d;
    float* x = qkv + (u64)row * width + hd * d;
    const bool is_q = hd < nh, is_v = hd >= nh + nkv;
    for (int i = lane; i < d; i += 32) head[i] = x[i];
    __syncwarp();
    const float* norm = is_q ? q_norm : k_norm;
    if (!is_v && norm) {
        float ss = 0.0f;
        for (int i = lane; i < d; i += 32) ss += head[i] * head[i];
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)d + eps);
        __syncwarp();
        for (int i = lane; i < d; i += 32) head[i] = norm[i] * (head[i] * inv);
        __syncwarp();
    }
    float out[MAX_HEAD_DIM / 32];
    const int half = d / 2;
    for (int j = 0, i = lane; i < d; i += 32, ++j) {
        if (is_v) {
            out[j] = head[i];
            continue;
        }
        const int pair = interleaved ? i >> 1 : (i < half ? i : i - half);
        const int a = interleaved ? 2 * pair : pair, b = interleaved ? 2 * pair + 1 : pair + half;
        const double angle = (double)((float)pos[row] * inv_freq[pair]);
        const float s = (float)sin(angle), c = (float)cos(angle);
        out[j] = i == a ? head[a] * c - head[b] * s : head[b] * c + head[a] * s;
    }
    if (is_q) {
        for (int j = 0, i = lane; i < d; i += 32, ++j) x[i] = out[j];
        return;
    }
    const int kvh = is_v ? hd - nh - nkv : hd - nh;
    float* dst = (is_v ? vcache : kcache) + kv_off[row] + layer_off + (u64)kvh * d;
    for (int j = 0, i = lane; i < d; i += 32, ++j) dst[i] = out[j];
}

// One block per (kv head, row), one warp per q head of the group. Each tile of 32 keys and values is
// staged in shared memory once for the whole group; lane j scores key j of the tile.
// A page holds `page_tokens` positions of every layer and is `page_stride` floats long; layer_off picks the layer.
extern "C" __global__ void paged_attention(const float* __restrict__ qkv, const u32* __restrict__ pos,
                                           const u32* __restrict__ page_table, const u32* __restrict__ table_off,
                                           const float* __restrict__ kcache, const float* __restrict__ vcache,
                                           bf16* __restrict__ out, int nh, int nkv, int d, int page_tokens,
                                           u64 page_stride, u64 layer_off, float scale) {
    start_next();
    wait_prior();
    __shared__ float ks[ATT_TILE][MAX_HEAD_DIM + 1];
    __shared__ float vs[ATT_TILE][MAX_HEAD_DIM];
    __shared__ float qs[MAX_GROUP][MAX_HEAD_DIM];
    const int kvh = blockIdx.x, row = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = nh / nkv, h = kvh * group + warp, kv_dim = nkv * d;
    const float* src = qkv + (u64)row * (nh + 2 * nkv) * d + (u64)h * d;
    for (int i = lane; i < d; i += 32) qs[warp][i] = src[i];
    const u32 p = pos[row];
    const u32* pages = page_table + table_off[row];
    float acc[MAX_HEAD_DIM / 32];
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) acc[j] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    for (u32 start = 0; start <= p; start += ATT_TILE) {
        const int count = min((u32)ATT_TILE, p - start + 1);
        __syncthreads();
        for (int e = threadIdx.x; e < count * d; e += blockDim.x) {
            const int t = e / d, i = e - t * d;
            const u32 kp = start + t;
            const u64 at = pages[kp / page_tokens] * page_stride + layer_off + (u64)(kp % page_tokens) * kv_dim
                           + (u64)kvh * d + i;
            ks[t][i] = kcache[at];
            vs[t][i] = vcache[at];
        }
        __syncthreads();
        float score = -__int_as_float(0x7f800000);
        if (lane < count) {
            float dot = 0.0f;
            for (int i = 0; i < d; ++i) dot += qs[warp][i] * ks[lane][i];
            score = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(score));
        const float pr = lane < count ? expf(score - m_new) : 0.0f;
        const float rescale = expf(m - m_new);
        l = l * rescale + warp_sum(pr);
        for (int j = 0; j < d / 32; ++j) acc[j] *= rescale;
        for (int t = 0; t < count; ++t) {
            const float pt = __shfl_sync(0xffffffffu, pr, t);
            for (int j = 0, i = lane; i < d; i += 32, ++j) acc[j] += pt * vs[t][i];
        }
        m = m_new;
    }
    bf16* dst = out + (u64)row * nh * d + (u64)h * d;
    for (int j = 0, i = lane; i < d; i += 32, ++j) dst[i] = f2bf(acc[j] / l);
}
