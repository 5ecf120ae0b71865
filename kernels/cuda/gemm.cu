// C[m][n] = sum_k A[m][k] * W[n][k] (+ bias[n]): bf16 in, f32 out, on tensor cores.
//
// Batch invariance: K is cut into S segments fixed by K alone; each segment is summed by one warp in
// ascending 32-wide chunks with the same mma sequence whatever M is, and the segment sums are added in
// segment order. A row's result therefore never depends on M, on its place in the tile, or on other rows.
// Within a chunk, lane group q reads 8 contiguous k (16 bytes) of A and W alike: a fixed permutation of k
// inside the chunk, applied to both operands, so the dot product is unchanged.


__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }

// The products of one 32-wide chunk, in the one order every kernel uses: row tile, column tile, half.
template <int MT, int NSUB>
__device__ __forceinline__ void chunk(float (&acc)[MT][NSUB][4], const uint4* lo, const uint4* hi, const uint4* b) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NSUB; ++j) {
            mma_bf16(acc[t][j], lo[t].x, hi[t].x, lo[t].y, hi[t].y, b[j].x, b[j].y);
            mma_bf16(acc[t][j], lo[t].z, hi[t].z, lo[t].w, hi[t].w, b[j].z, b[j].w);
        }
}

// A block has one warp per segment; it covers MT tiles of 16 rows and NSUB tiles of 8 columns.
template <int MT, int NSUB, int G>
__device__ void gemm_tile(const bf16* __restrict__ a, const bf16* __restrict__ w, const float* __restrict__ bias,
                          float* __restrict__ c, int m, int n, int k, int segments) {
    constexpr int TILE_N = NSUB * 8;
    __shared__ float red[MT * 16][TILE_N + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n0 = blockIdx.x * TILE_N, m0 = blockIdx.y * 16 * MT;
    float acc[MT][NSUB][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NSUB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (warp < segments) {
        const int seg = k / segments, kbeg = warp * seg, kend = kbeg + seg;
        const bf16* wrow[NSUB];
        bool wok[NSUB];
#pragma unroll
        for (int j = 0; j < NSUB; ++j) {
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
        // Loads of G chunks are issued before their products, so many loads are in flight per warp.
        int kc = kbeg;
        for (; kc + 32 * G <= kend; kc += 32 * G) {
            uint4 b[G][NSUB], lo[G][MT], hi[G][MT];
#pragma unroll
            for (int u = 0; u < G; ++u) {
#pragma unroll
                for (int j = 0; j < NSUB; ++j) b[u][j] = wok[j] ? load16(wrow[j] + kc + 32 * u) : zero;
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    lo[u][t] = aok[t][0] ? load16(arow[t][0] + kc + 32 * u) : zero;
                    hi[u][t] = aok[t][1] ? load16(arow[t][1] + kc + 32 * u) : zero;
                }
            }
#pragma unroll
            for (int u = 0; u < G; ++u) chunk<MT, NSUB>(acc, lo[u], hi[u], b[u]);
        }
        for (; kc < kend; kc += 32) {
            uint4 b[NSUB], lo[MT], hi[MT];
#pragma unroll
            for (int j = 0; j < NSUB; ++j) b[j] = wok[j] ? load16(wrow[j] + kc) : zero;
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                lo[t] = aok[t][0] ? load16(arow[t][0] + kc) : zero;
                hi[t] = aok[t][1] ? load16(arow[t][1] + kc) : zero;
            }
            chunk<MT, NSUB>(acc, lo, hi, b);
        }
    }
    for (int s = 0; s < segments; ++s) {
        if (warp == s) {
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NSUB; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = t * 16 + g + 8 * (e >> 1), col = j * 8 + 2 * q + (e & 1);
                        red[row][col] = s == 0 ? acc[t][j][e] : red[row][col] + acc[t][j][e];
                    }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < MT * 16 * TILE_N; i += blockDim.x) {
        const int row = i / TILE_N, col = i % TILE_N;
        const int gm = m0 + row, gn = n0 + col;
        if (gm < m && gn < n) c[(u64)gm * n + gn] = bias ? red[row][col] + bias[gn] : red[row][col];
    }
}

// Few rows (decode): narrow column tiles, so the weights stream through many blocks at once.
extern "C" __global__ void __launch_bounds__(512) gemm_m16(const bf16* a, const bf16* w, const float* bias, float* c, int m, int n, int k, int segments) {
    gemm_tile<1, 2, 4>(a, w, bias, c, m, n, k, segments);
}

// Many rows (prefill, wide batches): each weight fragment feeds 64 rows.
extern "C" __global__ void __launch_bounds__(512) gemm_m64(const bf16* a, const bf16* w, const float* bias, float* c, int m, int n, int k, int segments) {
    gemm_tile<4, 4, 1>(a, w, bias, c, m, n, k, segments);
}
