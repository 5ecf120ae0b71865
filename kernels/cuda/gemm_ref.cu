// The family's reference, C = A W^T (+ bias) in the canonical order at its plainest, so every fast kernel is checked bit for bit against code anyone can read.
// K in `segments` equal segments (fixed per weight shape, never by M); each segment in its own f32 accumulator from +0,
// k16 steps ascending, each step's 16 k in natural order (mma.sync m16n8k16); the segment sums added in segment
// order (s0 + s1, then + s2, ...), then the bias. segments = 1 is one accumulator over all of K; (K / segments) % 16 == 0.

__device__ __forceinline__ void ref_mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two consecutive k of one row; rows past the matrix read as zero so they add nothing to the rows that exist.
__device__ __forceinline__ u32 ref_pair(const bf16* row, int k0, bool live) {
    return live ? *reinterpret_cast<const u32*>(row + k0) : 0u;
}

// Each warp one 16x8 tile of C; lane (g, q) holds rows g, g + 8 and k 2q, 2q + 1, 2q + 8, 2q + 9 of each step.
extern "C" __global__ void __launch_bounds__(128) gemm_ref(const bf16* a, const bf16* w, const float* bias, float* c,
                                                          int m, int n, int k, int segments) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const long long ntn = (n + 7) / 8, tile = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (tile >= (long long)((m + 15) / 16) * ntn) return;
    const int r0 = (int)(tile / ntn) * 16, c0 = (int)(tile % ntn) * 8;
    const bool lo_live = r0 + g < m, hi_live = r0 + g + 8 < m, w_live = c0 + g < n;
    const bf16* alo = a + (u64)min(r0 + g, m - 1) * k;
    const bf16* ahi = a + (u64)min(r0 + g + 8, m - 1) * k;
    const bf16* wr = w + (u64)min(c0 + g, n - 1) * k;
    const int ks = k / segments;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < segments; ++s) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        // Unrolled only so the loads of later steps overlap the mma chain; the order of the sums is unchanged.
#pragma unroll 4
        for (int k0 = s * ks; k0 < (s + 1) * ks; k0 += 16) {
            const int lo = k0 + 2 * q, hi = k0 + 2 * q + 8;
            ref_mma(p, ref_pair(alo, lo, lo_live), ref_pair(ahi, lo, hi_live), ref_pair(alo, hi, lo_live),
                    ref_pair(ahi, hi, hi_live), ref_pair(wr, lo, w_live), ref_pair(wr, hi, w_live));
        }
        // The first segment's sum as it is (one segment: exactly the single accumulator), later ones added in order.
#pragma unroll
        for (int e = 0; e < 4; ++e) d[e] = s == 0 ? p[e] : d[e] + p[e];
    }
    // d[e] is row g + 8 (e / 2), column 2q + e % 2 of the tile.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int row = r0 + g + 8 * (e >> 1), col = c0 + 2 * q + (e & 1);
        if (row < m && col < n) c[(u64)row * n + col] = bias ? d[e] + bias[col] : d[e];
    }
}

// The SwiGLU of the reference's C with W's 8-row gate and up tiles interleaved: the epilogue's bits, via prelude's silu_mul.
extern "C" __global__ void gemm_ref_swiglu(const float* c, bf16* act, int m, int n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, half = n / 2;
    if (i >= (long long)m * half) return;
    const long long row = i / half, j = i % half, col = (j / 8) * 16 + j % 8;
    act[i] = silu_mul(c[row * n + col], c[row * n + col + 8]);
}
