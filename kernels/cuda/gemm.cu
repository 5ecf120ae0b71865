// C[m][n] = sum_k A[m][k] * W[n][k] (+ bias[n]): bf16 in, f32 out, on tensor cores. With `act`, C is not
// written: column tiles 2u and 2u + 1 are gate and up, and act gets their SwiGLU in bf16, n / 2 wide.
//
// Batch invariance: K is cut into S segments fixed by the weight shape alone; each segment is summed by one warp in
// ascending 32-wide chunks with the same mma sequence whatever M is, and the segment sums are added in
// segment order. A row's result therefore never depends on M, on its place in the tile, or on other rows.
// Within a chunk, lane group q reads 8 contiguous k (16 bytes) of A and W alike: a fixed permutation of k
// inside the chunk, applied to both operands, so the dot product is unchanged.
//
// W is packed in tiles of 8 rows by 32 k (512 bytes), tiles of a row group in k order: lane l of a warp
// reads bytes [16 l, 16 l + 16) of a tile, which hold row l / 4 and k 8 (l % 4) .. + 8 of it.

__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }

// Slots of the decode kernels' per-warp weight rings.
#define GEMM_RING 8

// Weights are read once per pass: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_weight(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// One 32-wide chunk of one 16x8 tile: the two k16 products, low half first.
__device__ __forceinline__ void chunk_mma(float* acc, uint4 lo, uint4 hi, uint4 b) {
    mma_bf16(acc, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    mma_bf16(acc, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

// Adds the segment partials of one output in segment order, then the bias.
__device__ __forceinline__ float sum_segments(const float* part, int stride, int segments, const float* bias, int col) {
    float v = part[0];
    for (int s = 1; s < segments; ++s) v += part[s * stride];
    return bias ? v + bias[col] : v;
}

// What a norm-folding GEMM makes its A from: norm(x + delta) * w row by row, as add_rms_norm would.
struct NormIn {
    const float* x;
    const float* delta;
    const float* w;
    float* x_out;
    float eps;
};

// Few rows (decode): each warp owns one tile of 8 columns and one segment, and streams its weight tiles
// through a ring of R slots in shared memory, so R - 1 tiles per warp are always in flight. Each lane reads
// back only the 16 bytes it copied, so the ring needs no barrier. HI says whether rows 8..15 exist;
// P is how many steps ahead the activations load. With NORM, every block norms the rows into shared memory
// behind the ring and multiplies those: the bits add_rms_norm would give, without its launch.
template <bool HI, int R, int P, bool NORM>
__device__ void gemm_narrow(const bf16* __restrict__ a, const bf16* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ c, bf16* __restrict__ act, int m, int n, int k, int segments,
                            NormIn nrm) {
    extern __shared__ uint4 ring[];
    __shared__ float part[16][16][9];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int tiles = (blockDim.x >> 5) / segments, seg = warp % segments, ct = warp / segments;
    const int nb = blockIdx.x * tiles + ct, kbs = k >> 5, per = kbs / segments, kb0 = seg * per;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const bool live = nb * 8 < n;
    const uint4* src = reinterpret_cast<const uint4*>(w) + ((u64)nb * kbs + kb0) * 32 + lane;
    uint4* slots = ring + warp * R * 32 + lane;
    // The weights are no kernel's output, so their first tiles load while the previous kernel finishes.
#pragma unroll
    for (int i = 0; i < R - 1; ++i) {
        if (live && i < per) copy16_async(slots + i * 32, src + i * 32);
        async_commit();
    }
    wait_prior();
    start_next();
    const bf16* av = a;
    if (NORM) {
        __shared__ float scratch[32];
        bf16* normed = reinterpret_cast<bf16*>(ring + (blockDim.x >> 5) * R * 32);
        for (int r = 0; r < m; ++r) {
            // Block 0 alone stores the residual sum, to a buffer no block of this grid reads.
            float* keep = blockIdx.x == 0 && nrm.delta ? nrm.x_out + (u64)r * k : nullptr;
            const float* d = nrm.delta ? nrm.delta + (u64)r * k : nullptr;
            add_norm_row(nrm.x + (u64)r * k, d, keep, nrm.w, normed + (u64)r * k, k, nrm.eps, scratch);
        }
        __syncthreads();
        av = normed;
    }
    if (live) {
        // Rows past m read row m - 1: their results are never stored, and no row affects another.
        const bf16* alo = av + (u64)min(g, m - 1) * k + kb0 * 32 + 8 * q;
        const bf16* ahi = av + (u64)min(g + 8, m - 1) * k + kb0 * 32 + 8 * q;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        // Activations are loaded P steps ahead into registers, so their latency overlaps the weights'.
        uint4 lo[P], hi[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            lo[j] = j < per ? load16(alo + j * 32) : zero;
            hi[j] = HI && j < per ? load16(ahi + j * 32) : zero;
        }
        for (int i0 = 0; i0 < per; i0 += P) {
#pragma unroll
            for (int j = 0; j < P; ++j) {
                const int i = i0 + j;
                if (i < per) {
                    // Refill the slot read in the last step, then wait for this step's tile.
                    if (i + R - 1 < per) copy16_async(slots + ((i + R - 1) % R) * 32, src + (u64)(i + R - 1) * 32);
                    async_commit();
                    async_wait<R - 1>();
                    const uint4 b = slots[(i % R) * 32];
                    const uint4 x = lo[j], y = hi[j];
                    if (i + P < per) {
                        lo[j] = load16(alo + (i + P) * 32);
                        if (HI) hi[j] = load16(ahi + (i + P) * 32);
                    }
                    chunk_mma(acc, x, y, b);
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][g + 8 * (e >> 1)][2 * q + (e & 1)] = acc[e];
    __syncthreads();
    if (act) {
        // Tiles 2u and 2u + 1 hold gate and up of the same 8 columns of act.
        for (int i = threadIdx.x; i < m * tiles * 4; i += blockDim.x) {
            const int row = i / (tiles * 4), u = (i % (tiles * 4)) >> 3, col = i & 7;
            const int gn = (blockIdx.x * tiles + 2 * u) * 8 + col;
            if (gn < n) {
                const float g = sum_segments(&part[2 * u * segments][row][col], 16 * 9, segments, bias, gn);
                const float v = sum_segments(&part[(2 * u + 1) * segments][row][col], 16 * 9, segments, bias, gn + 8);
                act[(u64)row * (n / 2) + (blockIdx.x * tiles / 2 + u) * 8 + col] = silu_mul(g, v);
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < m * tiles * 8; i += blockDim.x) {
        const int row = i / (tiles * 8), t = (i % (tiles * 8)) >> 3, col = i & 7;
        const int gn = (blockIdx.x * tiles + t) * 8 + col;
        if (gn < n) c[(u64)row * n + gn] = sum_segments(&part[t * segments][row][col], 16 * 9, segments, bias, gn);
    }
}

// Rounds of tens of rows: one warp per segment over a tile of 64 rows by 32 columns, for grids too small to tile.
// Each lane streams its own 16 bytes of every operand of a chunk through a ring of R stages in shared memory, so
// R - 1 chunks per warp are in flight; a lane reads back only what it copied, so the ring needs no barrier.
#define WIDE_MT 4
#define WIDE_NSUB 4
#define WIDE_STAGE ((WIDE_NSUB + 2 * WIDE_MT) * 32)
template <int R>
__device__ void gemm_wide(const bf16* __restrict__ a, const bf16* __restrict__ w, const float* __restrict__ bias,
                          float* __restrict__ c, bf16* __restrict__ act, int m, int n, int k, int segments) {
    constexpr int MT = WIDE_MT, NSUB = WIDE_NSUB;
    extern __shared__ uint4 ring[];
    __shared__ float red[MT * 16][NSUB * 8 + 1];
    wait_prior();
    start_next();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nb0 = blockIdx.x * NSUB, m0 = blockIdx.y * 16 * MT, kbs = k >> 5, per = kbs / segments;
    float acc[MT][NSUB][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NSUB; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;
    // Tiles past n or m read the last real one: their results are never stored.
    const uint4* wp[NSUB];
#pragma unroll
    for (int j = 0; j < NSUB; ++j)
        wp[j] = reinterpret_cast<const uint4*>(w) + ((u64)min(nb0 + j, (n - 1) / 8) * kbs + warp * per) * 32 + lane;
    const uint4* arow[MT][2];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            arow[t][h] = reinterpret_cast<const uint4*>(a + (u64)min(m0 + t * 16 + g + 8 * h, m - 1) * k + warp * per * 32 + 8 * q);
    uint4* slots = ring + warp * R * WIDE_STAGE + lane;
    // Queues chunk i of this warp's segment into its stage (i % R): the weight tiles, then rows g and g + 8 of each
    // row tile.
    auto issue = [&](int i) {
        if (i < per) {
            uint4* s = slots + (i % R) * WIDE_STAGE;
#pragma unroll
            for (int j = 0; j < NSUB; ++j) copy16_async(s + j * 32, wp[j] + (u64)i * 32);
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) copy16_async(s + (NSUB + 2 * t + h) * 32, arow[t][h] + i * 4);
        }
        async_commit();
    };
#pragma unroll
    for (int i = 0; i < R - 1; ++i) issue(i);
    for (int i = 0; i < per; ++i) {
        // Refill the stage read in the last step, then wait for this step's.
        issue(i + R - 1);
        async_wait<R - 1>();
        const uint4* s = slots + (i % R) * WIDE_STAGE;
        uint4 b[NSUB], lo[MT], hi[MT];
#pragma unroll
        for (int j = 0; j < NSUB; ++j) b[j] = s[j * 32];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            lo[t] = s[(NSUB + 2 * t) * 32];
            hi[t] = s[(NSUB + 2 * t + 1) * 32];
        }
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int j = 0; j < NSUB; ++j) chunk_mma(acc[t][j], lo[t], hi[t], b[j]);
    }
    async_wait<0>();
    // Segment sums are added in segment order, as sum_segments adds them.
    for (int s = 0; s < segments; ++s) {
        if (warp == s) {
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NSUB; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float& r = red[t * 16 + g + 8 * (e >> 1)][j * 8 + 2 * q + (e & 1)];
                        r = s == 0 ? acc[t][j][e] : r + acc[t][j][e];
                    }
        }
        __syncthreads();
    }
    constexpr int COLS = NSUB * 8;
    if (act) {
        for (int i = threadIdx.x; i < MT * 16 * COLS / 2; i += blockDim.x) {
            const int row = i / (COLS / 2), u = (i % (COLS / 2)) >> 3, col = i & 7, gm = m0 + row;
            const int gn = (nb0 + 2 * u) * 8 + col;
            if (gm < m && gn < n) {
                const float g = bias ? red[row][2 * u * 8 + col] + bias[gn] : red[row][2 * u * 8 + col];
                const float v = bias ? red[row][(2 * u + 1) * 8 + col] + bias[gn + 8] : red[row][(2 * u + 1) * 8 + col];
                act[(u64)gm * (n / 2) + (nb0 / 2 + u) * 8 + col] = silu_mul(g, v);
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < MT * 16 * COLS; i += blockDim.x) {
        const int row = i / COLS, col = i % COLS, gm = m0 + row, gn = nb0 * 8 + col;
        if (gm < m && gn < n) c[(u64)gm * n + gn] = bias ? red[row][col] + bias[gn] : red[row][col];
    }
}

// Up to 8 rows: the upper half of each row tile is zero.
extern "C" __global__ void __launch_bounds__(512, 2) gemm_m8(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_narrow<false, GEMM_RING, 4, false>(a, w, bias, c, act, m, n, k, segments, NormIn{});
}

extern "C" __global__ void __launch_bounds__(512, 2) gemm_m16(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_narrow<true, GEMM_RING, 4, false>(a, w, bias, c, act, m, n, k, segments, NormIn{});
}

// Up to 8 rows of A = norm(x + delta) * nw (delta may be null); block 0 stores x + delta to x_out.
extern "C" __global__ void __launch_bounds__(512, 2) gemm_norm_m8(const float* x, const float* delta, const float* nw, float* x_out, float eps, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_narrow<false, GEMM_RING, 4, true>(nullptr, w, bias, c, act, m, n, k, segments, NormIn{x, delta, nw, x_out, eps});
}

// Three stages a warp; two where the host asks (16 segments, or grids of several blocks an SM).
extern "C" __global__ void __launch_bounds__(256) gemm_m64(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_wide<3>(a, w, bias, c, act, m, n, k, segments);
}

extern "C" __global__ void __launch_bounds__(512) gemm_m64_r2(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_wide<2>(a, w, bias, c, act, m, n, k, segments);
}

