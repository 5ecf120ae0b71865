// Greedy picks on the GPU, so a round returns token ids instead of rows of logits.

// The better of two candidates (value, index; index -1 for none): the larger value, the smaller index on equals.
__device__ __forceinline__ void better(float& v, int& at, float ov, int oat) {
    if (oat >= 0 && (at < 0 || ov > v || (ov == v && oat < at))) {
        v = ov;
        at = oat;
    }
}

// out[r] = the index of row r's largest logit, as a scan from index 0 that moves only to larger values picks it:
// the first on ties (-0 and +0 tie), NaNs never picked, and index 0 when the row starts with a NaN.
extern "C" __global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ logits, int vocab,
                                                                u32* __restrict__ out) {
    start_next();
    wait_prior();
    __shared__ float vals[32];
    __shared__ int ats[32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float v = 0.0f;
    int at = -1;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x == x && (at < 0 || x > v)) {
            v = x;
            at = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) better(v, at, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, at, o));
    if ((threadIdx.x & 31) == 0) {
        vals[threadIdx.x >> 5] = v;
        ats[threadIdx.x >> 5] = at;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const bool held = threadIdx.x < (blockDim.x >> 5);
    v = held ? vals[threadIdx.x] : 0.0f;
    at = held ? ats[threadIdx.x] : -1;
    for (int o = 16; o > 0; o >>= 1) better(v, at, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, at, o));
    if (threadIdx.x == 0) out[blockIdx.x] = row[0] != row[0] || at < 0 ? 0u : (u32)at;
}

// A sampled row cut to the tokens its draw can take (sampling.rs: `sample` = `kept` then `sample_kept`): first the
// repetition penalty on the row's distinct history ids, rounded as the host rounds it; then, in id order, every
// token whose (logit - max) / temperature in f64 reaches -keep_below, as (id, logit bits) pairs at out + 2 vocab r,
// and their number in counts[r]. One block of 1024 threads a row; rows[r] is the row within logits.
extern "C" __global__ void __launch_bounds__(1024) keep_rows(float* logits, const u32* rows, const float* params,
                                                              const u32* hist_off, const u32* history, int vocab,
                                                              double keep_below, u32* out, u32* counts) {
    start_next();
    wait_prior();
    __shared__ float maxes[32];
    __shared__ u32 totals[32];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float* row = logits + (u64)rows[r] * vocab;
    const float t = params[2 * r], penalty = params[2 * r + 1];
    if (penalty != 1.0f) {
        for (u32 j = hist_off[r] + tid; j < hist_off[r + 1]; j += blockDim.x) {
            const u32 id = history[j];
            if (id < (u32)vocab) row[id] = row[id] > 0.0f ? __fdiv_rn(row[id], penalty) : __fmul_rn(row[id], penalty);
        }
        __syncthreads();
    }
    float m = -__int_as_float(0x7f800000);
    for (int i = tid; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
    m = warp_max(m);
    if (lane == 0) maxes[warp] = m;
    __syncthreads();
    m = maxes[0];
    for (int w = 1; w < 32; ++w) m = fmaxf(m, maxes[w]);
    // Each thread takes a contiguous stretch of ids, so the pairs come out in id order.
    const int chunk = (vocab + 1023) / 1024, from = min(tid * chunk, vocab), to = min(from + chunk, vocab);
    const double top = (double)m, temp = (double)t;
    u32 n = 0;
    for (int i = from; i < to; ++i) n += ((double)row[i] - top) / temp >= -keep_below;
    u32 incl = n;
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) totals[warp] = incl;
    __syncthreads();
    u32 before = incl - n;
    for (int w = 0; w < warp; ++w) before += totals[w];
    u32* dst = out + (u64)r * 2 * vocab + 2 * before;
    for (int i = from; i < to; ++i) {
        if (((double)row[i] - top) / temp >= -keep_below) {
            dst[0] = (u32)i;
            dst[1] = __float_as_uint(row[i]);
            dst += 2;
        }
    }
    if (tid == 1023) counts[r] = before + n;
}
