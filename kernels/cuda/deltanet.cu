// Gated DeltaNet linear attention (Qwen3-Next's layers between its attention layers), on the state plane of the
// paged pool: per page and linear layer, each position's row (its convolution inputs, then each value head's decay
// input and beta) and the state after the page's last position (a dk x dv matrix per value head, row-major in k).
//
// The steps and their order are the CPU's (engine/src/llama/deltanet.rs), with the GPU's own rounding (fused
// multiply-adds, its exp): one position at a time in absolute-position order, a step that starts inside a page
// replaying the page's earlier positions from the previous page's state, every sum in a fixed order (a state
// column's sums over k ascending in one thread). A pool's states are therefore the GPU's, never mixed with the CPU's. So a position's state and output are
// the same bits whether its prompt came whole, in chunks, token by token, from the prefix cache, or beside other
// lanes.

__device__ __forceinline__ float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float dn_silu(float x) { return x / (1.0f + expf(-x)); }

// One block of 128 threads per row: the row's convolution inputs (qkv, conv_dim wide) and its gates, from `ba` (each
// key head's group of 2 ratio values: betas, then decay inputs), written to the row's slot in its page.
extern "C" __global__ void __launch_bounds__(128) deltanet_rows(
    const float* __restrict__ qkv, const float* __restrict__ ba, const float* __restrict__ neg_a,
    const float* __restrict__ dt_bias, const u32* __restrict__ pos, const u32* __restrict__ table_off,
    const u32* __restrict__ page_table, float* __restrict__ states, u64 state_elems, u32 base, u32 p, int conv_dim,
    int nv, int ratio) {
    wait_prior();
    start_next();
    const int r = blockIdx.x;
    const u32 at = pos[r], page = page_table[table_off[r] + at / p];
    const int width = conv_dim + 2 * nv;
    float* row = states + page * state_elems + base + (u64)(at % p) * width;
    for (int c = threadIdx.x; c < conv_dim; c += blockDim.x) row[c] = qkv[(u64)r * conv_dim + c];
    for (int h = threadIdx.x; h < nv; h += blockDim.x) {
        const int g = h / ratio, i = h - g * ratio;
        const float b = ba[(u64)r * 2 * nv + g * 2 * ratio + i], a = ba[(u64)r * 2 * nv + g * 2 * ratio + ratio + i];
        row[conv_dim + h] = neg_a[h] * dn_softplus(a + dt_bias[h]);
        row[conv_dim + nv + h] = 1.0f / (1.0f + expf(-b));
    }
}

// Positions whose convolutions and norms a block computes side by side before their recurrence steps.
#define DN_TILE 16

// One block per (lane, value head), max(dv, 32) threads (dv at most 256); thread j < dv keeps column j of the head's
// state. `lanes` holds per lane its first row in the round, start position, row count and page-table offset (4 u32).
// Outputs go to core[row][h dv + j], f32. Positions go in tiles of DN_TILE: their convolutions and norms side by
// side, each with the arithmetic of one position alone, then their recurrence steps in order.
template <int DK>
__device__ __forceinline__ void deltanet_heads(const float* __restrict__ conv, const u32* __restrict__ lanes,
                                               const u32* __restrict__ page_table, float* __restrict__ states,
                                               u64 state_elems, u32 base, u32 p, int taps, int nk, int nv, int dv,
                                               float* __restrict__ core) {
    // Each tile position's q, k and v after the convolution: DK, DK and up to 256 floats.
    __shared__ float xs[DN_TILE][2 * DK + 256];
    __shared__ float scales[DN_TILE][2];
    wait_prior();
    start_next();
    const int lane = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const u32 r0 = lanes[4 * lane], start = lanes[4 * lane + 1], count = lanes[4 * lane + 2];
    const u32* pages = page_table + lanes[4 * lane + 3];
    const int kh = h / (nv / nk), key_dim = nk * DK, conv_dim = 2 * key_dim + nv * dv, width = conv_dim + 2 * nv;
    const u64 head_state = base + (u64)p * width + (u64)h * DK * dv;
    const u32 first = start / p * p, end = start + count;
    float s[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) s[i] = 0.0f;
    if (first > 0 && j < dv) {
        const float* src = states + pages[first / p - 1] * state_elems + head_state + j;
#pragma unroll
        for (int i = 0; i < DK; ++i) s[i] = src[(u64)i * dv];
    }
    const int channels = 2 * DK + dv;
    for (u32 t0 = first; t0 < end; t0 += DN_TILE) {
        const int n = (int)min((u32)DN_TILE, end - t0);
        // The convolution over the taps that exist, oldest first, then silu, for every (position, channel).
        for (int e = j; e < n * channels; e += blockDim.x) {
            const int pi = e / channels, c = e - pi * channels;
            const u32 t = t0 + pi;
            const int ch = c < DK       ? kh * DK + c
                           : c < 2 * DK ? key_dim + kh * DK + c - DK
                                        : 2 * key_dim + h * dv + c - 2 * DK;
            float x = 0.0f;
            for (int tap = 0; tap < taps; ++tap) {
                if (t + tap + 1 < (u32)taps) continue;
                const u32 src = t + tap + 1 - taps;
                const float u = states[pages[src / p] * state_elems + base + (u64)(src % p) * width + ch];
                x += conv[ch * taps + tap] * u;
            }
            xs[pi][c] = dn_silu(x);
        }
        __syncthreads();
        // Unit length with the epsilon inside the root, sums in k order (a thread a position); q then scaled by
        // 1 / sqrt(dk).
        if (j < n) {
            float sq = 0.0f, sk = 0.0f;
            for (int i = 0; i < DK; ++i) sq += xs[j][i] * xs[j][i];
            for (int i = 0; i < DK; ++i) sk += xs[j][DK + i] * xs[j][DK + i];
            scales[j][0] = 1.0f / sqrtf(sq + 1e-6f);
            scales[j][1] = 1.0f / sqrtf(sk + 1e-6f);
        }
        __syncthreads();
        for (int e = j; e < n * DK; e += blockDim.x) {
            const int pi = e / DK, i = e - pi * DK;
            xs[pi][i] = xs[pi][i] * scales[pi][0] * (1.0f / sqrtf((float)DK));
            xs[pi][DK + i] = xs[pi][DK + i] * scales[pi][1];
        }
        __syncthreads();
        for (int pi = 0; pi < n && j < dv; ++pi) {
            const u32 t = t0 + pi;
            const float *xq = xs[pi], *xk = xs[pi] + DK;
            const float* gates = states + pages[t / p] * state_elems + base + (u64)(t % p) * width + conv_dim;
            const float decay = expf(gates[h]), beta = gates[nv + h];
            // The delta rule: decay the state, then move its answer for k toward v by beta.
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; ++i) {
                s[i] *= decay;
                kv += s[i] * xk[i];
            }
            const float d = (xs[pi][2 * DK + j] - kv) * beta;
#pragma unroll
            for (int i = 0; i < DK; ++i) s[i] += xk[i] * d;
            if (t >= start) {
                float o = 0.0f;
#pragma unroll
                for (int i = 0; i < DK; ++i) o += s[i] * xq[i];
                core[(u64)(r0 + t - start) * nv * dv + (u64)h * dv + j] = o;
                if (t % p == p - 1) {
                    float* dst = states + pages[t / p] * state_elems + head_state + j;
#pragma unroll
                    for (int i = 0; i < DK; ++i) dst[(u64)i * dv] = s[i];
                }
            }
        }
        __syncthreads();
    }
}

#define DELTANET_HEADS(DK)                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) deltanet_heads_k##DK(                                         \
        const float* conv, const u32* lanes, const u32* page_table, float* states, u64 state_elems, u32 base, u32 p, \
        int taps, int nk, int nv, int dv, float* core) {                                                             \
        deltanet_heads<DK>(conv, lanes, page_table, states, state_elems, base, p, taps, nk, nv, dv, core);            \
    }

DELTANET_HEADS(16)
DELTANET_HEADS(32)
DELTANET_HEADS(64)
DELTANET_HEADS(128)

// The gated norm: each value head's output (dv wide) scaled to unit mean square with `eps`, by the norm's weight,
// and by silu of its output gate z; bf16 for the output projection. Grid (rows, value heads), one warp.
extern "C" __global__ void deltanet_gated_norm(const float* __restrict__ core, const float* __restrict__ z,
                                               const float* __restrict__ w, bf16* __restrict__ out, int nv, int dv,
                                               float eps) {
    wait_prior();
    start_next();
    const u64 at = ((u64)blockIdx.x * nv + blockIdx.y) * dv;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < dv; j += 32) sum += core[at + j] * core[at + j];
    const float inv = rsqrtf(warp_sum(sum) / (float)dv + eps);
    for (int j = threadIdx.x; j < dv; j += 32) out[at + j] = f2bf(core[at + j] * inv * w[j] * dn_silu(z[at + j]));
}

// Gated attention: each attention output value times the sigmoid of its gate, which the query projection gave.
// Grid (rows), 256 threads.
extern "C" __global__ void attention_output_gate(bf16* __restrict__ attn, const float* __restrict__ gate, int width) {
    wait_prior();
    start_next();
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        const u64 i = (u64)blockIdx.x * width + c;
        attn[i] = f2bf(bf2f(attn[i]) / (1.0f + expf(-gate[i])));
    }
}

// The draft head (Qwen3-Next's MTP) reads each position's final hidden state, f32, h floats a position from float
// `base` of its page's state. A row's 1 / rms with `eps`, by a block of 256: thread t sums elements t, t + 256, ...
// in order, then the warps' sums in order.
__device__ __forceinline__ float mtp_rms_inv(const float* x, int h, float eps, float* scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) ss = __fmaf_rn(x[i], x[i], ss);
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = scratch[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) total += scratch[w];
    __syncthreads();
    return 1.0f / sqrtf(total / (float)h + eps);
}

// Entry i: x's row rows[i] (row i where rows is null), normed with w, becomes the hidden state of position at[i] of
// the lane whose page table starts at table_off[i]. Grid (entries), 256 threads.
extern "C" __global__ void __launch_bounds__(256) mtp_hidden_store(
    const float* __restrict__ x, const u32* __restrict__ rows, const u32* __restrict__ at,
    const u32* __restrict__ table_off, const u32* __restrict__ page_table, float* __restrict__ states,
    u64 state_elems, u32 base, u32 p, const float* __restrict__ w, float eps, int h) {
    __shared__ float scratch[32];
    wait_prior();
    start_next();
    const u32 i = blockIdx.x, pos = at[i];
    const float* src = x + (u64)(rows ? rows[i] : i) * h;
    float* dst = states + page_table[table_off[i] + pos / p] * state_elems + base + (u64)(pos % p) * h;
    const float inv = mtp_rms_inv(src, h, eps, scratch);
    for (int c = threadIdx.x; c < h; c += blockDim.x) dst[c] = w[c] * (src[c] * inv);
}

// A head row's input: its token's embedding (x, f32) and the hidden state of position pos[r] (the one before the
// token's), each normed with its own weights, joined as bf16 [embedding | hidden]. Grid (rows), 256 threads.
extern "C" __global__ void __launch_bounds__(256) mtp_join(
    const float* __restrict__ x, const u32* __restrict__ pos, const u32* __restrict__ table_off,
    const u32* __restrict__ page_table, const float* __restrict__ states, u64 state_elems, u32 base, u32 p,
    const float* __restrict__ w_embed, const float* __restrict__ w_hidden, float eps, int h, bf16* __restrict__ out) {
    __shared__ float scratch[32];
    wait_prior();
    start_next();
    const u32 r = blockIdx.x, at = pos[r];
    const float* e = x + (u64)r * h;
    const float* hid = states + page_table[table_off[r] + at / p] * state_elems + base + (u64)(at % p) * h;
    bf16* dst = out + (u64)r * 2 * h;
    const float ie = mtp_rms_inv(e, h, eps, scratch);
    for (int c = threadIdx.x; c < h; c += blockDim.x) dst[c] = f2bf(w_embed[c] * (e[c] * ie));
    const float ih = mtp_rms_inv(hid, h, eps, scratch);
    for (int c = threadIdx.x; c < h; c += blockDim.x) dst[h + c] = f2bf(w_hidden[c] * (hid[c] * ih));
}
