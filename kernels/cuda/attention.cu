// Attention over the paged KV cache: per-head norm, RoPE and the cache write; then causal attention.
//
// A query row's attention depends only on its own q, its absolute position and the cached keys and
// values: keys are visited in blocks of 32 aligned to absolute positions, with an online softmax in
// block order, so a row computes the same bits in a prefill chunk of any size as decoded alone.

#define MAX_HEAD_DIM 256

// One warp per (row, head): heads [0, nh) are q, [nh, nh+nkv) k, then v. q stays in qkv; k and v go to the cache
// at kv_off[row] (the row's page and slot) plus layer_off.
extern "C" __global__ void qkv_rope_store(float* qkv, const u32* pos, const u64* kv_off, const float* inv_freq,
                                          const float* q_norm, const float* k_norm, float eps, float* kcache,
                                          float* vcache, u64 layer_off, int nh, int nkv, int d, int interleaved) {
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

// One warp per (head, row). kv_off is the layer's offset of (page 0, slot 0); pages hold `page_tokens`
// positions and each page's layers are `layer_stride` floats apart (num_layers * page_tokens * kv_dim per page).
extern "C" __global__ void paged_attention(const float* qkv, const u32* pos, const u32* page_table,
                                           const u32* table_off, const float* kcache, const float* vcache,
                                           bf16* out, int nh, int nkv, int d, int page_tokens, u64 page_stride,
                                           u64 layer_off, float scale) {
    __shared__ float q[MAX_HEAD_DIM];
    const int h = blockIdx.x, row = blockIdx.y, lane = threadIdx.x;
    const int kv_dim = nkv * d, kvh = h / (nh / nkv);
    const float* src = qkv + (u64)row * (nh + 2 * nkv) * d + h * d;
    for (int i = lane; i < d; i += 32) q[i] = src[i];
    __syncwarp();
    const u32 p = pos[row];
    const u32* pages = page_table + table_off[row];
    float acc[MAX_HEAD_DIM / 32];
    for (int j = 0; j < MAX_HEAD_DIM / 32; ++j) acc[j] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    for (u32 start = 0; start <= p; start += 32) {
        const u32 kp = start + lane;
        float score = -__int_as_float(0x7f800000);
        if (kp <= p) {
            const float* key = kcache + pages[kp / page_tokens] * page_stride + layer_off
                               + (u64)(kp % page_tokens) * kv_dim + (u64)kvh * d;
            float dot = 0.0f;
            for (int i = 0; i < d; ++i) dot += q[i] * key[i];
            score = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(score));
        const float pr = kp <= p ? expf(score - m_new) : 0.0f;
        const float rescale = expf(m - m_new);
        l = l * rescale + warp_sum(pr);
        for (int j = 0; j < d / 32; ++j) acc[j] *= rescale;
        const int count = min(32u, p - start + 1);
        for (int t = 0; t < count; ++t) {
            const float pt = __shfl_sync(0xffffffffu, pr, t);
            const u32 vp = start + t;
            const float* val = vcache + pages[vp / page_tokens] * page_stride + layer_off
                               + (u64)(vp % page_tokens) * kv_dim + (u64)kvh * d;
            for (int j = 0, i = lane; i < d; i += 32, ++j) acc[j] += pt * val[i];
        }
        m = m_new;
    }
    bf16* dst = out + (u64)row * nh * d + h * d;
    for (int j = 0, i = lane; i < d; i += 32, ++j) dst[i] = f2bf(acc[j] / l);
}
