// SNAC's decoder over many windows in one launch. Rows are time steps, packed window after window; a row's
// window is seg_of[row / rate] (rate: rows per latent step at that layer), and positions outside its window read
// as zeros. Every output is one sum in an order fixed by the weight's shape, so a window's samples never depend
// on the windows beside it.

// Where output row `row` sits: its position in its window, and its window's first input row and input length.
__device__ __forceinline__ void window_place(long row, int rate_out, int rate_in, const int* seg_of,
                                             const int* seg_start, const int* seg_len, int* t, long* base_in,
                                             int* len_in) {
    const int s = seg_of[row / rate_out];
    *t = (int)(row - (long)seg_start[s] * rate_out);
    *base_in = (long)seg_start[s] * rate_in;
    *len_in = seg_len[s] * rate_in;
}

// z[l] = sum over the three codebooks, in order, of out_proj(embedding[code]) + bias; codes hold three a row.
extern "C" __global__ void snac_latent(const u32* codes, const float* emb0, const float* emb1, const float* emb2,
                                       const float* w0, const float* w1, const float* w2, const float* b0,
                                       const float* b1, const float* b2, float* z, int width, int dim) {
    wait_prior();
    start_next();
    const long l = blockIdx.x;
    const float* embs[3] = {emb0, emb1, emb2};
    const float* ws[3] = {w0, w1, w2};
    const float* bs[3] = {b0, b1, b2};
    for (int o = threadIdx.x; o < width; o += blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < 3; ++b) {
            const float* e = embs[b] + (long)codes[l * 3 + b] * dim;
            const float* w = ws[b] + (long)o * dim;
            float p = 0.0f;
            for (int d = 0; d < dim; ++d) p = __fmaf_rn(w[d], e[d], p);
            acc = __fadd_rn(acc, __fadd_rn(p, bs[b][o]));
        }
        z[l * width + o] = acc;
    }
}

// Snake as the CPU writes it: x + inv_alpha * sin(alpha * x)^2, with no fused multiply-add.
__device__ __forceinline__ float snake(float v, float alpha, float inv) {
    const float s = sinf(__fmul_rn(alpha, v));
    return __fadd_rn(v, __fmul_rn(inv, __fmul_rn(s, s)));
}

// y = snake(x) over n values of rows of c channels; y may be x.
extern "C" __global__ void snac_snake(const float* x, float* y, const float* alpha, const float* inv, int c, int n) {
    wait_prior();
    start_next();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const int ch = (int)(i % c);
        y[i] = snake(x[i], alpha[ch], inv[ch]);
    }
}

// y[t, c] = bias[c] + sum over taps k of w[k, c] * x[t - padding + k * dilation, c]; then snake when alpha is given.
extern "C" __global__ void snac_depthwise(const float* x, float* y, const float* w, const float* bias,
                                          const float* alpha, const float* inv, const int* seg_of,
                                          const int* seg_start, const int* seg_len, int rate, int c, int kernel,
                                          int dilation, int padding, int n) {
    wait_prior();
    start_next();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / c;
        const int ch = (int)(i - row * c);
        int t, len;
        long base;
        window_place(row, rate, rate, seg_of, seg_start, seg_len, &t, &base, &len);
        float acc = 0.0f;
        for (int k = 0; k < kernel; ++k) {
            const int idx = t - padding + k * dilation;
            const float v = (idx >= 0 && idx < len) ? x[(base + idx) * c + ch] : 0.0f;
            acc = __fmaf_rn(w[k * c + ch], v, acc);
        }
        if (bias) acc = __fadd_rn(acc, bias[ch]);
        y[i] = alpha ? snake(acc, alpha[ch], inv[ch]) : acc;
    }
}

// The geometry both convolution kernels share. Output row t of phase r = (t + pad_a) % stride reads input rows
// (t + pad_a) / stride - pad_b + j * dilation for taps j, through the phase's weight [c_out][taps][c_in]:
// a stride-1 convolution is one phase with pad_a 0 and pad_b its padding; a transposed one has a phase per
// stride step, pad_a its padding and pad_b taps - 1, as kernels/src/conv.rs lays out its weights.
struct ConvArgs {
    const float* x;
    const float* w;
    const float* bias;
    float* out;
    const int* seg_of;
    const int* seg_start;
    const int* seg_len;
    int rate_out, rate_in, c_in, c_out, taps, stride, pad_a, pad_b, dilation;
    int accumulate, act;
};

__device__ __forceinline__ float conv_out(const ConvArgs& a, float acc, int o, float prior) {
    float v = a.bias ? __fadd_rn(acc, a.bias[o]) : acc;
    if (a.act == 1) v = tanhf(v);
    return a.accumulate ? __fadd_rn(prior, v) : v;
}

// The input value of patch element k for a row whose first tap reads input idx0, or zero outside the window.
__device__ __forceinline__ float conv_in(const ConvArgs& a, long base, int len, int idx0, int k) {
    const int j = k / a.c_in;
    const int i = k - j * a.c_in;
    const int idx = idx0 + j * a.dilation;
    return (idx >= 0 && idx < len) ? a.x[(base + idx) * a.c_in + i] : 0.0f;
}

#define CONV_TILE 64
#define CONV_STEP 16

// One 64 x 64 tile of outputs of one phase per block of 256 threads, each summing its 4 x 4 outputs over the
// patch in order, 16 elements a step.
extern "C" __global__ void __launch_bounds__(256) snac_conv_gemm(const float* x, const float* w, const float* bias,
                                                                 float* out, const int* seg_of, const int* seg_start,
                                                                 const int* seg_len, int rate_out, int rate_in,
                                                                 int c_in, int c_out, int taps, int stride, int pad_a,
                                                                 int pad_b, int dilation, int accumulate, int act,
                                                                 int rows) {
    wait_prior();
    start_next();
    const ConvArgs a = {x,       w,        bias,    out,   seg_of, seg_start, seg_len, rate_out, rate_in,
                        c_in,    c_out,    taps,    stride, pad_a, pad_b,     dilation, accumulate, act};
    __shared__ float as[CONV_STEP][CONV_TILE + 1];
    __shared__ float bs[CONV_STEP][CONV_TILE + 1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, kk = tid & 15;
    const int phase = blockIdx.z;
    const int first = ((phase - pad_a) % stride + stride) % stride;
    const long m0 = (long)blockIdx.x * CONV_TILE;
    const int n0 = blockIdx.y * CONV_TILE;
    const long per_phase = rows / stride;
    const int patch = taps * c_in;
    const float* wp = w + (long)phase * c_out * patch;
    long base[4];
    int len[4], idx0[4];
    for (int q = 0; q < 4; ++q) {
        const long m = m0 + (tid >> 4) + 16 * q;
        len[q] = -1;
        if (m < per_phase) {
            int t;
            window_place(m * stride + first, rate_out, rate_in, seg_of, seg_start, seg_len, &t, &base[q], &len[q]);
            idx0[q] = (t + pad_a) / stride - pad_b;
        }
    }
    float acc[4][4] = {};
    for (int k0 = 0; k0 < patch; k0 += CONV_STEP) {
        const int k = k0 + kk;
        for (int q = 0; q < 4; ++q) {
            const int r = (tid >> 4) + 16 * q;
            as[kk][r] = (k < patch && len[q] >= 0) ? conv_in(a, base[q], len[q], idx0[q], k) : 0.0f;
            const int o = n0 + r;
            bs[kk][r] = (k < patch && o < c_out) ? wp[(long)o * patch + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int s = 0; s < CONV_STEP; ++s) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[s][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[s][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const long m = m0 + ty + 16 * i;
        if (m >= per_phase) continue;
        const long row = m * stride + first;
        for (int j = 0; j < 4; ++j) {
            const int o = n0 + tx + 16 * j;
            if (o >= c_out) continue;
            float* dst = out + row * c_out + o;
            *dst = conv_out(a, acc[i][j], o, accumulate ? *dst : 0.0f);
        }
    }
}

// The same sums, one thread an output, for layers with few output channels (the last convolution).
extern "C" __global__ void snac_conv_rows(const float* x, const float* w, const float* bias, float* out,
                                          const int* seg_of, const int* seg_start, const int* seg_len, int rate_out,
                                          int rate_in, int c_in, int c_out, int taps, int stride, int pad_a, int pad_b,
                                          int dilation, int accumulate, int act, int rows) {
    wait_prior();
    start_next();
    const ConvArgs a = {x,       w,        bias,    out,   seg_of, seg_start, seg_len, rate_out, rate_in,
                        c_in,    c_out,    taps,    stride, pad_a, pad_b,     dilation, accumulate, act};
    const int patch = taps * c_in;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (long)rows * c_out; i += (long)gridDim.x * blockDim.x) {
        const long row = i / c_out;
        const int o = (int)(i - row * c_out);
        int t, len;
        long base;
        window_place(row, rate_out, rate_in, seg_of, seg_start, seg_len, &t, &base, &len);
        const int phase = (t + pad_a) % stride;
        const int idx0 = (t + pad_a) / stride - pad_b;
        const float* wo = w + ((long)phase * c_out + o) * patch;
        float acc = 0.0f;
        for (int k = 0; k < patch; ++k) acc = __fmaf_rn(conv_in(a, base, len, idx0, k), wo[k], acc);
        out[i] = conv_out(a, acc, o, accumulate ? out[i] : 0.0f);
    }
}
