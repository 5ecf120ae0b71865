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
