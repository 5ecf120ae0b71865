// Row-wise kernels: embedding gather, RMSNorm (fused with the residual add), SwiGLU. Norms take one block of 1024 per row.

// The table is packed in GEMM weight tiles (gemm.cu), since a tied one is also the output projection.
extern "C" __global__ void embed_rows(const bf16* table, const u32* tokens, float* x, int h) {
    start_next();
    wait_prior();
    const u32 r = tokens[blockIdx.x];
    const bf16* src = table + (u64)(r >> 3) * h * 8 + (r & 7) * 32;
    float* dst = x + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = bf2f(src[(i >> 5) * 256 + (i & 31)]);
}

__device__ void rms_norm_row(const float* x, const float* w, bf16* out, int h, float eps) {
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < h; i += 1024) ss += x[i] * x[i];
    const float total = block_sum_1024(ss, scratch);
    const float inv = 1.0f / sqrtf(total / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += 1024) out[i] = f2bf(w[i] * (x[i] * inv));
}

// out[r] = norm(x[rows[r]]) * w; `rows` may be null for every row in order.
extern "C" __global__ void rms_norm(const float* x, const u32* rows, const float* w, bf16* out, int h, float eps) {
    start_next();
    wait_prior();
    const u64 src = rows ? rows[blockIdx.x] : blockIdx.x;
    rms_norm_row(x + src * h, w, out + (u64)blockIdx.x * h, h, eps);
}

// x += delta, then out = norm(x) * w. Rows up to 8192 wide stay in registers: x, delta and w are read once.
extern "C" __global__ void add_rms_norm(float* x, const float* delta, const float* w, bf16* out, int h, float eps) {
    start_next();
    wait_prior();
    float* row = x + (u64)blockIdx.x * h;
    const float* d = delta + (u64)blockIdx.x * h;
    if (h > 8 * 1024) {
        for (int i = threadIdx.x; i < h; i += 1024) row[i] += d[i];
        __syncthreads();
        rms_norm_row(row, w, out + (u64)blockIdx.x * h, h, eps);
        return;
    }
    __shared__ float scratch[32];
    float v[8], wv[8], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = threadIdx.x + j * 1024;
        v[j] = i < h ? row[i] + d[i] : 0.0f;
        wv[j] = i < h ? w[i] : 0.0f;
    }
    // The same order as rms_norm_row: each thread sums its values in index order, then the block sum.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = threadIdx.x + j * 1024;
        if (i < h) {
            row[i] = v[j];
            ss += v[j] * v[j];
        }
    }
    const float inv = 1.0f / sqrtf(block_sum_1024(ss, scratch) / (float)h + eps);
    bf16* o = out + (u64)blockIdx.x * h;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = threadIdx.x + j * 1024;
        if (i < h) o[i] = f2bf(wv[j] * (v[j] * inv));
    }
}

// x += delta.
extern "C" __global__ void add_rows(float* x, const float* delta, int h) {
    start_next();
    wait_prior();
    float* row = x + (u64)blockIdx.x * h;
    const float* d = delta + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) row[i] += d[i];
}

// act = silu(gate) * up, with each row of gate_up holding gate then up; blocks (column tile, row).
extern "C" __global__ void swiglu(const float* gate_up, bf16* act, int f) {
    start_next();
    wait_prior();
    const float* g = gate_up + (u64)blockIdx.y * 2 * f;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < f) {
        const float x = g[i];
        act[(u64)blockIdx.y * f + i] = f2bf(x / (1.0f + expf(-x)) * g[f + i]);
    }
}
