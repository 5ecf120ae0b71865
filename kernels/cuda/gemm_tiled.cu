// Many rows (prefill, wide rounds): tiles of BM rows by 128 columns staged through shared memory.
//
// The arithmetic of an element is that of gemm_narrow: its K segments are summed one by one, each in ascending
// 32-wide chunks by chunk_mma from zero, with the same registers per lane (row g or g + 8, k 8 q .. 8 q + 8 of A and
// of W); the segment sums are added in segment order, then the bias. Only where the operands come from differs:
// here shared memory, filled S - 1 stages ahead by cp.async, TILED_CHUNKS chunks a stage.
//
// Shared memory of a stage: A as [chunk][row][32 k] (64 bytes a row), then W as [chunk][8-row tile][8 x 32 k],
// the packed layout itself, so a warp's 16-byte reads of either touch 512 contiguous bytes. Behind the stages,
// each thread's running segment sums, element-major so a warp's accesses are consecutive.

#define TILED_CHUNKS 2
#define TILED_WARPS_M 2
#define TILED_WARPS_N 4
#define TILED_NT 4
#define TILED_BN (TILED_WARPS_N * TILED_NT * 8)
#define TILED_THREADS (32 * TILED_WARPS_M * TILED_WARPS_N)
// Row tiles that neighbouring blocks share, so one wave reads each weight tile for several row tiles at once.
#define TILED_GROUP 8

// One thread's share of a stage's copies: the same 16 bytes of every 32nd row of A and of every 4th weight tile.
template <int BM>
struct TiledCopies {
    static constexpr int A_PER = BM * TILED_CHUNKS * 4 / TILED_THREADS, W_PER = (TILED_BN / 8) * TILED_CHUNKS * 32 / TILED_THREADS;
    const bf16* a;
    const uint4* w;
    // Offsets into A (elements) and W (16 bytes) at chunk 0, the first slots written, and the chunk each copies.
    int a_off[A_PER], w_off[W_PER], a_dst, w_dst, a_chunk, w_chunk;

    __device__ __forceinline__ TiledCopies(const bf16* am, const bf16* wm, int m0, int nb0, int m, int ntiles, int k)
        : a(am), w(reinterpret_cast<const uint4*>(wm)) {
        const int t = threadIdx.x, r = t / (TILED_CHUNKS * 4), j = t / (TILED_CHUNKS * 32);
        a_chunk = (t / 4) % TILED_CHUNKS;
        w_chunk = (t / 32) % TILED_CHUNKS;
        a_dst = (a_chunk * BM + r) * 4 + (t & 3);
        w_dst = (w_chunk * (TILED_BN / 8) + j) * 32 + (t & 31);
#pragma unroll
        for (int i = 0; i < A_PER; ++i) a_off[i] = min(m0 + r + i * (TILED_THREADS / 8), m - 1) * k + a_chunk * 32 + 8 * (t & 3);
#pragma unroll
        for (int i = 0; i < W_PER; ++i)
            w_off[i] = (min(nb0 + j + i * (TILED_THREADS / 64), ntiles - 1) * (k >> 5) + w_chunk) * 32 + (t & 31);
    }

    // Queues the copies of chunks kb .. kb + TILED_CHUNKS that exist into a stage.
    __device__ __forceinline__ void issue(uint4* sa, uint4* sw, int kb, int kbs) const {
        if (kb + a_chunk < kbs) {
#pragma unroll
            for (int i = 0; i < A_PER; ++i)
                copy16_async(sa + a_dst + i * (TILED_THREADS / 8) * 4, reinterpret_cast<const uint4*>(a + a_off[i] + kb * 32));
        }
        if (kb + w_chunk < kbs) {
#pragma unroll
            for (int i = 0; i < W_PER; ++i) copy16_async(sw + w_dst + i * (TILED_THREADS / 64) * 32, w + w_off[i] + kb * 32);
        }
    }
};

// MT row tiles of 16 per warp, TILED_NT column tiles of 8, S stages; FOLD where K has more than one segment.
template <int MT, int S, bool FOLD>
__device__ void gemm_tiled(const bf16* __restrict__ a, const bf16* __restrict__ w, const float* __restrict__ bias,
                           float* __restrict__ c, bf16* __restrict__ act, int m, int n, int k, int segments) {
    constexpr int BM = TILED_WARPS_M * MT * 16, TILES = TILED_BN / 8;
    constexpr int A_VECS = TILED_CHUNKS * BM * 4, W_VECS = TILED_CHUNKS * TILES * 32;
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int wm = warp / TILED_WARPS_N, wn = warp % TILED_WARPS_N;
    // Blocks walk TILED_GROUP row tiles for each column tile before the next column tile.
    const int mtiles = (m + BM - 1) / BM, ntiles = (n + 7) / 8, nblk = (ntiles + TILES - 1) / TILES;
    const int per_group = TILED_GROUP * nblk, grp = blockIdx.x / per_group, in = blockIdx.x % per_group;
    const int rows_here = min(TILED_GROUP, mtiles - grp * TILED_GROUP);
    const int mt = grp * TILED_GROUP + in % rows_here, nt = in / rows_here;
    const int m0 = mt * BM, nb0 = nt * TILES, kbs = k >> 5, per = kbs / segments;
    const int stages = (kbs + TILED_CHUNKS - 1) / TILED_CHUNKS;
    float* running = reinterpret_cast<float*>(smem + S * (A_VECS + W_VECS)) + threadIdx.x;
    wait_prior();
    start_next();
    auto sa = [&](int s) { return smem + s * (A_VECS + W_VECS); };
    auto sw = [&](int s) { return smem + s * (A_VECS + W_VECS) + A_VECS; };
    const TiledCopies<BM> copies(a, w, m0, nb0, m, ntiles, k);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < stages) copies.issue(sa(s), sw(s), s * TILED_CHUNKS, kbs);
        async_commit();
    }
    // Chunks left in the current K segment.
    int left = per;
    float acc[MT][TILED_NT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < TILED_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.0f;
    for (int st = 0; st < stages; ++st) {
        async_wait<S - 2>();
        __syncthreads();
        const uint4* ra = sa(st % S);
        const uint4* rw = sw(st % S);
#pragma unroll 1
        for (int ch = 0; ch < TILED_CHUNKS; ++ch) {
            if (ch == 1) {
                // The slot refilled was read in the last stage, which every warp has left; the copies queue behind mma.
                const int nx = st + S - 1;
                if (nx < stages) copies.issue(sa(nx % S), sw(nx % S), nx * TILED_CHUNKS, kbs);
                async_commit();
            }
            const int kb = st * TILED_CHUNKS + ch;
            if (kb >= kbs) break;
            uint4 b[TILED_NT];
#pragma unroll
            for (int j = 0; j < TILED_NT; ++j) b[j] = rw[(ch * TILES + wn * TILED_NT + j) * 32 + lane];
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                const int r = wm * MT * 16 + t * 16 + g;
                const uint4 lo = ra[(ch * BM + r) * 4 + q], hi = ra[(ch * BM + r + 8) * 4 + q];
#pragma unroll
                for (int j = 0; j < TILED_NT; ++j) chunk_mma(acc[t][j], lo, hi, b[j]);
            }
            if (FOLD && --left == 0) {
                // A segment ends: its sum joins the running one, as sum_segments adds them.
                const bool first = kb + 1 == per;
                left = per;
#pragma unroll
                for (int t = 0; t < MT; ++t)
#pragma unroll
                    for (int j = 0; j < TILED_NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float& r = running[((t * TILED_NT + j) * 4 + e) * TILED_THREADS];
                            r = first ? acc[t][j][e] : r + acc[t][j][e];
                            acc[t][j][e] = 0.0f;
                        }
            }
        }
    }
    async_wait<0>();
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int gm = m0 + wm * MT * 16 + t * 16 + g + 8 * hr;
            if (gm >= m) continue;
#pragma unroll
            for (int j = 0; j < TILED_NT; ++j) {
                const int gn = (nb0 + wn * TILED_NT + j) * 8 + 2 * q;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float s = FOLD ? running[((t * TILED_NT + j) * 4 + 2 * hr + e) * TILED_THREADS] : acc[t][j][2 * hr + e];
                    v[e] = bias && gn + e < n ? s + bias[gn + e] : s;
                }
                if (act) {
                    // Column tiles 2u and 2u + 1 are gate and up of act's columns 8u ..; the gate's lane holds both.
                    if (j & 1) continue;
                    float u[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float s =
                            FOLD ? running[((t * TILED_NT + j + 1) * 4 + 2 * hr + e) * TILED_THREADS] : acc[t][j + 1][2 * hr + e];
                        u[e] = bias && gn + 8 + e < n ? s + bias[gn + 8 + e] : s;
                    }
                    const int col = ((nb0 + wn * TILED_NT + j) / 2) * 8 + 2 * q;
                    if (gn + 8 < n) {
                        const u32 pair = (u32)silu_mul(v[0], u[0]) | ((u32)silu_mul(v[1], u[1]) << 16);
                        *reinterpret_cast<u32*>(act + (u64)gm * (n / 2) + col) = pair;
                    }
                    continue;
                }
                float* out = c + (u64)gm * n + gn;
                if (gn + 1 < n && (n & 1) == 0) *reinterpret_cast<float2*>(out) = make_float2(v[0], v[1]);
                else if (gn < n) {
                    out[0] = v[0];
                    if (gn + 1 < n) out[1] = v[1];
                }
            }
        }
}

// 128 rows by 128 columns a block: with one K segment in 3 stages, two blocks an SM; with more, 4 stages, one.
extern "C" __global__ void __launch_bounds__(TILED_THREADS, 2) gemm_t128(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_tiled<4, 3, false>(a, w, bias, c, act, m, n, k, segments);
}

extern "C" __global__ void __launch_bounds__(TILED_THREADS, 1) gemm_t128_fold(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    gemm_tiled<4, 4, true>(a, w, bias, c, act, m, n, k, segments);
}

// 64 rows by 128 columns in 3 stages, two blocks an SM, where 128-row tiles would leave SMs idle.
extern "C" __global__ void __launch_bounds__(TILED_THREADS, 2) gemm_t64(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    if (segments > 1) gemm_tiled<2, 3, true>(a, w, bias, c, act, m, n, k, segments);
    else gemm_tiled<2, 3, false>(a, w, bias, c, act, m, n, k, segments);
}
