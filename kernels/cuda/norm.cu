// Row-wise kernels: embedding gather, RMSNorm (fused with the residual add), SwiGLU. Norms take one block per row.

// The table is laid out as a GEMM weight (a tied one is also the output projection): packed in the tiles of gemm.cu,
// or with `natural` row-major as the TMA family reads it.
extern "C" __global__ void embed_rows(const bf16* table, const u32* tokens, float* x, int h, int natural) {
    start_next();
    wait_prior();
    const u32 r = tokens[blockIdx.x];
    float* dst = x + (u64)blockIdx.x * h;
    if (natural) {
        for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = bf2f(table[(u64)r * h + i]);
        return;
    }
    const bf16* src = table + (u64)(r >> 3) * h * 8 + (r & 7) * 32;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = bf2f(src[(i >> 5) * 256 + (i & 31)]);
}

// 1 / rms from the sums of a block of 1024 threads, or of 512 holding two each (ss[1] for thread t + 512).
__device__ __forceinline__ float block_rms_inv(float ss0, float ss1, int h, float eps, float* scratch) {
    const float s0 = warp_sum(ss0);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = s0;
    if (blockDim.x == 512) {
        const float s1 = warp_sum(ss1);
        if ((threadIdx.x & 31) == 0) scratch[(threadIdx.x + 512) >> 5] = s1;
    }
    __syncthreads();
    float total = scratch[0];
    for (int i = 1; i < 32; ++i) total += scratch[i];
    __syncthreads();
    return 1.0f / sqrtf(total / (float)h + eps);
}

// v = x + delta (x when delta is null), stored to x_out when given, then out = norm(v) * w, summed as a block
// of 1024 threads would: thread t sums v[t], v[t + 1024], ... in order, then warp butterflies, then the 32 warp
// sums in order. A block of 512 plays threads t and t + 512, so every kernel that norms a row gets the same bits.
// delta is read from L2. Rows up to 8192 wide are read once into registers. x_out may be x.
__device__ void add_norm_row(const float* x, const float* __restrict__ delta, float* x_out, const float* __restrict__ w,
                             bf16* out, int h, float eps, float* scratch) {
    const int nt = blockDim.x;
    const bool twin = nt == 512;
    float ss[2] = {0.0f, 0.0f};
    if (h <= 8192) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const int i = threadIdx.x + k * nt;
            v[k] = i < h ? x[i] : 0.0f;
            if (delta && i < h) v[k] += __ldcg(delta + i);
        }
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const int i = threadIdx.x + k * nt;
            if (i < h) {
                if (x_out) x_out[i] = v[k];
                if (twin && (k & 1)) ss[1] = __fmaf_rn(v[k], v[k], ss[1]);
                else ss[0] = __fmaf_rn(v[k], v[k], ss[0]);
            }
        }
        const float inv = block_rms_inv(ss[0], ss[1], h, eps, scratch);
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const int i = threadIdx.x + k * nt;
            if (i < h) out[i] = f2bf(w[i] * (v[k] * inv));
        }
        return;
    }
    for (int i = threadIdx.x, k = 0; i < h; i += nt, ++k) {
        float val = x[i];
        if (delta) val += __ldcg(delta + i);
        if (x_out) x_out[i] = val;
        if (twin && (k & 1)) ss[1] = __fmaf_rn(val, val, ss[1]);
        else ss[0] = __fmaf_rn(val, val, ss[0]);
    }
    const float inv = block_rms_inv(ss[0], ss[1], h, eps, scratch);
    for (int i = threadIdx.x; i < h; i += nt) {
        // Each thread reads back only what it stored, or sums again the same two values.
        const float val = x_out ? x_out[i] : delta ? x[i] + __ldcg(delta + i) : x[i];
        out[i] = f2bf(w[i] * (val * inv));
    }
}

// add_norm_row's bits from a block of NT < 1024 threads, for rows up to 4096 wide: thread t plays the 1024-thread
// block's threads t + j NT (sum ss[j]), so its warp w plays warps w + j NT / 32. The weights are read before the
// previous kernel ends (they never come from it); the row after.
template <int NT>
__device__ __forceinline__ void add_norm_row_narrow(const float* x, const float* __restrict__ delta, float* x_out,
                                                    const float* __restrict__ w, bf16* out, int h, float eps) {
    constexpr int R = 1024 / NT, V = 4096 / NT;
    __shared__ float scratch[32];
    float wv[V], v[V], ss[R];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = threadIdx.x + k * NT;
        wv[k] = i < h ? w[i] : 0.0f;
    }
    start_next();
    wait_prior();
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = threadIdx.x + k * NT;
        v[k] = i < h ? x[i] : 0.0f;
        if (delta && i < h) v[k] += __ldcg(delta + i);
    }
#pragma unroll
    for (int j = 0; j < R; ++j) ss[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < h) {
            if (x_out) x_out[i] = v[k];
            ss[k % R] = __fmaf_rn(v[k], v[k], ss[k % R]);
        }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
        const float s = warp_sum(ss[j]);
        if ((threadIdx.x & 31) == 0) scratch[(threadIdx.x >> 5) + j * (NT / 32)] = s;
    }
    __syncthreads();
    float total = scratch[0];
    for (int i = 1; i < 32; ++i) total += scratch[i];
    const float inv = 1.0f / sqrtf(total / (float)h + eps);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < h) out[i] = f2bf(wv[k] * (v[k] * inv));
    }
}

// rms_norm and add_rms_norm for rows of at most 4096, a block of NORM_NARROW threads a row.
#define NORM_NARROW 256
extern "C" __global__ void __launch_bounds__(NORM_NARROW) rms_norm_narrow(float* x, const u32* rows, const float* w,
                                                                          bf16* out, int h, float eps) {
    const u64 src = rows ? rows[blockIdx.x] : blockIdx.x;
    add_norm_row_narrow<NORM_NARROW>(x + src * h, nullptr, nullptr, w, out + (u64)blockIdx.x * h, h, eps);
}

extern "C" __global__ void __launch_bounds__(NORM_NARROW) add_rms_norm_narrow(float* x, const float* delta,
                                                                              const float* w, bf16* out, int h,
                                                                              float eps) {
    const u64 r = blockIdx.x;
    add_norm_row_narrow<NORM_NARROW>(x + r * h, delta + r * h, x + r * h, w, out + r * h, h, eps);
}

// out[r] = norm(x[rows[r]]) * w; `rows` may be null for every row in order.
extern "C" __global__ void __launch_bounds__(1024) rms_norm(float* x, const u32* rows, const float* w, bf16* out, int h, float eps) {
    start_next();
    wait_prior();
    __shared__ float scratch[32];
    const u64 src = rows ? rows[blockIdx.x] : blockIdx.x;
    add_norm_row(x + src * h, nullptr, nullptr, w, out + (u64)blockIdx.x * h, h, eps, scratch);
}

// x += delta, then out = norm(x) * w.
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm(float* x, const float* delta, const float* w, bf16* out, int h, float eps) {
    start_next();
    wait_prior();
    __shared__ float scratch[32];
    const u64 r = blockIdx.x;
    add_norm_row(x + r * h, delta + r * h, x + r * h, w, out + r * h, h, eps, scratch);
}

// x += delta.
extern "C" __global__ void add_rows(float* x, const float* delta, int h) {
    start_next();
    wait_prior();
    float* row = x + (u64)blockIdx.x * h;
    const float* d = delta + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) row[i] += d[i];
}

// act = silu(gate) * up; gate_up rows hold gate and up in alternating tiles of 8 columns (`gate_up_order`).
extern "C" __global__ void swiglu(const float* gate_up, bf16* act, int f) {
    start_next();
    wait_prior();
    const float* g = gate_up + (u64)blockIdx.y * 2 * f;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < f) {
        const int at = (i >> 3) * 16 + (i & 7);
        act[(u64)blockIdx.y * f + i] = silu_mul(g[at], g[at + 8]);
    }
}

// Tensor-parallel sum of up to 8 ranks' partials, added in rank order, written back to every rank's buffer.
extern "C" __global__ void sum_ranks(float* p0, float* p1, float* p2, float* p3, float* p4, float* p5, float* p6,
                                     float* p7, int ranks, int n) {
    start_next();
    wait_prior();
    float* parts[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float sum = p0[i];
#pragma unroll
        for (int r = 1; r < 8; ++r) {
            if (r < ranks) sum += parts[r][i];
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            if (r < ranks) parts[r][i] = sum;
        }
    }
}
