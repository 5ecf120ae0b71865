// Row-wise kernels: embedding gather, RMSNorm (fused with the residual add), SwiGLU. Norms take one block of 1024 per row.

extern "C" __global__ void embed_rows(const bf16* table, const u32* tokens, float* x, int h) {
    const bf16* src = table + (u64)tokens[blockIdx.x] * h;
    float* dst = x + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = bf2f(src[i]);
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
    const u64 src = rows ? rows[blockIdx.x] : blockIdx.x;
    rms_norm_row(x + src * h, w, out + (u64)blockIdx.x * h, h, eps);
}

// x += delta, then out = norm(x) * w.
extern "C" __global__ void add_rms_norm(float* x, const float* delta, const float* w, bf16* out, int h, float eps) {
    float* row = x + (u64)blockIdx.x * h;
    const float* d = delta + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += 1024) row[i] += d[i];
    __syncthreads();
    rms_norm_row(row, w, out + (u64)blockIdx.x * h, h, eps);
}

// x += delta.
extern "C" __global__ void add_rows(float* x, const float* delta, int h) {
    float* row = x + (u64)blockIdx.x * h;
    const float* d = delta + (u64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) row[i] += d[i];
}

// act = silu(gate) * up, with each row of gate_up holding gate then up; blocks (column tile, row).
extern "C" __global__ void swiglu(const float* gate_up, bf16* act, int f) {
    const float* g = gate_up + (u64)blockIdx.y * 2 * f;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < f) {
        const float x = g[i];
        act[(u64)blockIdx.y * f + i] = f2bf(x / (1.0f + expf(-x)) * g[f + i]);
    }
}
