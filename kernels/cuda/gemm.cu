// C[m][n] = sum_k A[m][k] * W[n][k] (+ bias[n]): bf16 in, f32 out, on tensor cores.
//
// Batch invariance: K is cut into S segments fixed by K alone; each segment is summed by one warp in
// ascending 32-wide chunks with the same mma sequence whatever M is, and the segment sums are added in
// segment order. A row's result therefore never depends on M, on its place in the tile, or on other rows.
// Within a chunk, lane group q reads 8 contiguous k (16 bytes) of A and W alike: a fixed permutation of k
// inside the chunk, applied to both operands, so the dot product is unchanged.

#define GEMM_WARPS 8
#define GEMM_TILE_N 32

__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }

template <int MT>
__device__ void gemm_tile(const bf16* a, const bf16* w, const float* bias, float* c, int m, int n, int k, int segments) {
    __shared__ float red[MT * 16][GEMM_TILE_N + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n0 = blockIdx.x * GEMM_TILE_N, m0 = blockIdx.y * 16 * MT;
    float acc[MT][4][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (warp < segments) {
        const int seg = k / segments, kbeg = warp * seg, kend = kbeg + seg;
        const bf16* wrow[4];
        bool wok[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = n0 + j * 8 + g;
            wok[j] = col < n;
            wrow[j] = w + (u64)(wok[j] ? col : 0) * k + 8 * q;
        }
        const bf16* arow[MT][2];
        bool aok[MT][2];
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + t * 16 + g + 8 * h;
                aok[t][h] = row < m;
                arow[t][h] = a + (u64)(aok[t][h] ? row : 0) * k + 8 * q;
            }
#pragma unroll 4
        for (int kc = kbeg; kc < kend; kc += 32) {
            uint4 b[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = wok[j] ? load16(wrow[j] + kc) : zero;
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                const uint4 lo = aok[t][0] ? load16(arow[t][0] + kc) : zero;
                const uint4 hi = aok[t][1] ? load16(arow[t][1] + kc) : zero;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    mma_bf16(acc[t][j], lo.x, hi.x, lo.y, hi.y, b[j].x, b[j].y);
                    mma_bf16(acc[t][j], lo.z, hi.z, lo.w, hi.w, b[j].z, b[j].w);
                }
            }
        }
    }
    for (int s = 0; s < segments; ++s) {
        if (warp == s) {
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = t * 16 + g + 8 * (e >> 1), col = j * 8 + 2 * q + (e & 1);
                        red[row][col] = s == 0 ? acc[t][j][e] : red[row][col] + acc[t][j][e];
                    }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < MT * 16 * GEMM_TILE_N; i += blockDim.x) {
        const int row = i / GEMM_TILE_N, col = i % GEMM_TILE_N;
        const int gm = m0 + row, gn = n0 + col;
        if (gm < m && gn < n) c[(u64)gm * n + gn] = bias ? red[row][col] + bias[gn] : red[row][col];
    }
}

extern "C" __global__ void __launch_bounds__(256) gemm_m16(const bf16* a, const bf16* w, const float* bias, float* c, int m, int n, int k, int segments) {
    gemm_tile<1>(a, w, bias, c, m, n, k, segments);
}

extern "C" __global__ void __launch_bounds__(256) gemm_m64(const bf16* a, const bf16* w, const float* bias, float* c, int m, int n, int k, int segments) {
    gemm_tile<4>(a, w, bias, c, m, n, k, segments);
}
