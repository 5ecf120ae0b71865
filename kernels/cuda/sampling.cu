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

// Sampled rows cut to the tokens their draws can take (sampling.rs: `sample` = `kept` then `sample_kept`), in two
// launches of one 1024-thread block a row, so every row's pairs land packed after the previous row's. keep_count:
// the repetition penalty on the row's distinct history ids, rounded as the host rounds it; the row's max; and how
// many tokens of each thread's contiguous stretch of ids have (logit - max) / temperature in f64 reaching
// -keep_below. `scratch` holds KEEP_SCRATCH u32 a row: the thread counts, then the max's bits. rows[r] is the row
// within logits; params[2r] and params[2r + 1] are its temperature and penalty.
#define KEEP_SCRATCH 1025

__device__ __forceinline__ bool keep_token(float logit, double top, double temp, double keep_below) {
    return ((double)logit - top) / temp >= -keep_below;
}

extern "C" __global__ void __launch_bounds__(1024) keep_count(float* logits, const u32* rows, const float* params,
                                                               const u32* hist_off, const u32* history, int vocab,
                                                               double keep_below, u32* scratch, u32* counts) {
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
    const int chunk = (vocab + 1023) / 1024, from = min(tid * chunk, vocab), to = min(from + chunk, vocab);
    const double top = (double)m, temp = (double)t;
    u32 n = 0;
    for (int i = from; i < to; ++i) n += keep_token(row[i], top, temp, keep_below);
    scratch[(u64)r * KEEP_SCRATCH + tid] = n;
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if (lane == 0) totals[warp] = n;
    __syncthreads();
    if (tid == 0) {
        u32 total = 0;
        for (int w = 0; w < 32; ++w) total += totals[w];
        counts[r] = total;
        scratch[(u64)r * KEEP_SCRATCH + 1024] = __float_as_uint(m);
    }
}

// keep_write: each row's kept tokens, in id order, as (id, logit bits) pairs at out + 2 (the counts of the rows
// before it + the thread counts before this thread's).
extern "C" __global__ void __launch_bounds__(1024) keep_write(const float* logits, const u32* rows,
                                                               const float* params, int vocab, double keep_below,
                                                               const u32* scratch, const u32* counts, u32* out) {
    start_next();
    wait_prior();
    __shared__ u32 totals[32];
    __shared__ u32 row_start;
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* row = logits + (u64)rows[r] * vocab;
    const u32* mine = scratch + (u64)r * KEEP_SCRATCH;
    if (warp == 0) {
        u32 before = 0;
        for (int j = lane; j < r; j += 32) before += counts[j];
        for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
        if (lane == 0) row_start = before;
    }
    const u32 n = mine[tid];
    u32 incl = n;
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) totals[warp] = incl;
    __syncthreads();
    u32 before = row_start + incl - n;
    for (int w = 0; w < warp; ++w) before += totals[w];
    const double top = (double)__uint_as_float(mine[1024]), temp = (double)params[2 * r];
    const int chunk = (vocab + 1023) / 1024, from = min(tid * chunk, vocab), to = min(from + chunk, vocab);
    u32* dst = out + 2 * (u64)before;
    for (int i = from; i < to; ++i) {
        if (keep_token(row[i], top, temp, keep_below)) {
            dst[0] = (u32)i;
            dst[1] = __float_as_uint(row[i]);
            dst += 2;
        }
    }
}
