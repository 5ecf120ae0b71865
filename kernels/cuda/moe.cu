// Mixture of experts: routing, the round's (row, expert) pairs sorted by expert, grouped GEMMs over them, and each
// row's experts weighted and summed in rank order.
//
// Batch invariance: a row's router logits are a warp's sum in a fixed lane order; its softmax and top-k run in one
// warp in a fixed order; an expert's GEMM sums each output in ascending k16 steps on mma.sync, whose
// result for a row depends on that row alone, so neither the other rows an expert serves nor a row's place among
// them changes its bits (which is why slots within an expert may be handed out in any order); the combine adds the
// ranks in rank order.

// Experts' weights a routing warp keeps in registers, 32 a lane-register.
#define MOE_MAX_EXPERTS 512
#define MOE_MAX_TOPK 16

// Router logits: grid (rows, experts / 8), one warp per (row, expert), logits = x W_router^T in f32 (x the row's
// normed bf16 values), each a sum in a fixed lane order. Block (0, 0) also zeroes the experts' counts for this layer.
extern "C" __global__ void __launch_bounds__(256) moe_logits(const bf16* __restrict__ normed,
                                                             const float* __restrict__ router, int h, int ne,
                                                             float* __restrict__ logits, u32* __restrict__ counts) {
    wait_prior();
    start_next();
    const int r = blockIdx.x, e = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (blockIdx.x == 0 && blockIdx.y == 0)
        for (int i = threadIdx.x; i < ne; i += blockDim.x) counts[i] = 0;
    if (e >= ne) return;
    const bf16* x = normed + (u64)r * h;
    const float* w = router + (u64)e * h;
    float s = 0.0f;
    for (int i = lane; i < h; i += 32) s += bf2f(x[i]) * w[i];
    s = warp_sum(s);
    if (lane == 0) logits[(u64)r * ne + e] = s;
}

// One warp per row: softmax of its logits, the top_k experts (of equal probabilities the lower index first), their
// probabilities (divided by their sum in rank order with `renorm`), and each pair's place among its expert's pairs.
// A lane holds the probabilities of experts lane, lane + 32, ... in registers.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int ne, int top_k, int renorm,
                                     u32* __restrict__ experts, float* __restrict__ weights, u32* __restrict__ local,
                                     u32* __restrict__ counts) {
    constexpr int PER = MOE_MAX_EXPERTS / 32;
    wait_prior();
    start_next();
    const int r = blockIdx.x, lane = threadIdx.x;
    const float* p = logits + (u64)r * ne;
    float v[PER];
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int e = lane + 32 * j;
        v[j] = e < ne ? p[e] : m;
        m = fmaxf(m, v[j]);
    }
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j)
        if (lane + 32 * j < ne) sum += expf(v[j] - m);
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = lane + 32 * j < ne ? expf(v[j] - m) / sum : -1.0f;
    float chosen[MOE_MAX_TOPK];
    int ids[MOE_MAX_TOPK];
    float total = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        // This lane's best (the lower index on equal values), then the warp's, lower index on equal values.
        float best = -1.0f;
        int id = ne;
#pragma unroll
        for (int j = 0; j < PER; ++j)
            if (v[j] > best) best = v[j], id = lane + 32 * j;
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (ob > best || (ob == best && oi < id)) best = ob, id = oi;
        }
        ids[k] = id;
        chosen[k] = best;
        total += best;
        // Probabilities are at least zero, so a taken expert is never picked again.
#pragma unroll
        for (int j = 0; j < PER; ++j)
            if (lane + 32 * j == id) v[j] = -1.0f;
    }
    // Every lane holds the same choices: lane k writes rank k, so the ranks' atomics are in flight together.
    if (lane >= top_k) return;
    const int at = r * top_k + lane;
    experts[at] = (u32)ids[lane];
    weights[at] = renorm ? chosen[lane] / total : chosen[lane];
    local[at] = atomicAdd(&counts[ids[lane]], 1u);
}

// One block of 1024 threads: each expert's first slot and first row tile (of `bm` rows), by one warp's running sums
// over 32 experts at a time; then every pair's slot and every slot's row.
extern "C" __global__ void __launch_bounds__(1024) moe_plan(const u32* __restrict__ experts, const u32* __restrict__ local,
                                                            u32* __restrict__ counts, int pairs, int top_k, int ne, int bm,
                                                            u32* __restrict__ offsets, u32* __restrict__ tile_start,
                                                            u32* __restrict__ slot_row, u32* __restrict__ pair_slot) {
    extern __shared__ u32 plan_off[];
    wait_prior();
    start_next();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        u32 o = 0, tiles = 0;
        for (int base = 0; base < ne; base += 32) {
            const int e = base + lane;
            const u32 c = e < ne ? counts[e] : 0u;
            u32 so = c, st = (c + bm - 1) / bm;
            for (int d = 1; d < 32; d <<= 1) {
                const u32 uo = __shfl_up_sync(0xffffffffu, so, d), ut = __shfl_up_sync(0xffffffffu, st, d);
                if (lane >= d) so += uo, st += ut;
            }
            // so and st are inclusive sums: this expert's first slot and tile are theirs less its own.
            if (e < ne) {
                offsets[e] = plan_off[e] = o + so - c;
                tile_start[e] = tiles + st - (c + bm - 1) / bm;
            }
            o += __shfl_sync(0xffffffffu, so, 31);
            tiles += __shfl_sync(0xffffffffu, st, 31);
        }
        if (lane == 0) {
            offsets[ne] = plan_off[ne] = o;
            tile_start[ne] = tiles;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += 1024) {
        const u32 slot = plan_off[experts[i]] + local[i];
        slot_row[slot] = (u32)(i / top_k);
        pair_slot[i] = slot;
    }
}

// sorted[slot] = a[slot_row[slot]]: the rows in expert order for the TMA kernels (moe_tma_* in gemm_tma.cu), which
// read A in boxes of whole rows. Grid (slots), 256 threads, h a multiple of 8.
extern "C" __global__ void moe_gather(const bf16* __restrict__ a, const u32* __restrict__ slot_row, int h,
                                      bf16* __restrict__ sorted) {
    wait_prior();
    start_next();
    const uint4* src = reinterpret_cast<const uint4*>(a + (u64)slot_row[blockIdx.x] * h);
    uint4* dst = reinterpret_cast<uint4*>(sorted + (u64)blockIdx.x * h);
    for (int i = threadIdx.x; i < h / 8; i += blockDim.x) dst[i] = src[i];
}

// One expert's rows of one tile of BM rows by BN = WN * NT * 8 columns of its weights (w: ne matrices of n x k,
// row-major), by 4 warps of WM x WN, each MT row tiles of 16 by NT column tiles of 8, through STAGES stages of BK k
// by cp.async. A's rows are `slot_row[slot]` of `a` (or the slots themselves where it is null). Without SWIGLU
// c[slot][col] = the sum; with it, column tiles 2u and 2u + 1 are gate and up of the same 8 intermediate columns (the
// weights' rows interleaved by 8), and act[slot][f] = silu(gate) * up in bf16, n / 2 wide. Every shape sums an output
// in the same ascending k16 steps, so which one a round runs never changes a bit.
template <int BM, int WM, int WN, int MT, int NT, int BK, int STAGES, bool SWIGLU>
__device__ __forceinline__ void moe_gemm(const bf16* __restrict__ a, const u32* __restrict__ slot_row,
                                         const bf16* __restrict__ w, const u32* __restrict__ offsets,
                                         const u32* __restrict__ tile_start, int ne, int n, int k, float* __restrict__ c,
                                         bf16* __restrict__ act) {
    constexpr int BN = WN * NT * 8, ROW = BK + 8, CPR = BK / 8;
    static_assert(WM * WN == 4 && WM * MT * 16 == BM && (!SWIGLU || NT % 2 == 0), "a tile is 4 warps");
    extern __shared__ __align__(16) bf16 moe_smem[];
    wait_prior();
    start_next();
    const u32 tile = blockIdx.y;
    if (tile >= tile_start[ne]) return;
    const int e = expert_of_tile(tile_start, ne, tile);
    const u32 first = offsets[e] + (tile - tile_start[e]) * BM;
    const int rows = min((int)(offsets[e + 1] - first), BM);
    const int n0 = blockIdx.x * BN, t = threadIdx.x;
    const bf16* we = w + (u64)e * n * k;
    constexpr int A_HALVES = BM * ROW, STAGE = (BM + BN) * ROW;
    // This thread's 16-byte copies of a stage: chunk t + 128 i of A's BM x CPR (where it has one) and of W's.
    constexpr int A_CHUNKS = BM * CPR, A_PER = (A_CHUNKS + 127) / 128, W_PER = BN * CPR / 128;
    static_assert(BN * CPR % 128 == 0, "W's chunks fill the threads");
    const bf16* asrc[A_PER];
    const bf16* wsrc[W_PER];
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
        const int at = t + 128 * i;
        const u32 slot = first + min(at / CPR, rows - 1);
        const u32 row = slot_row ? slot_row[slot] : slot;
        asrc[i] = a + (u64)row * k + (at % CPR) * 8;
    }
#pragma unroll
    for (int i = 0; i < W_PER; ++i) {
        const int at = t + 128 * i;
        wsrc[i] = we + (u64)min(n0 + at / CPR, n - 1) * k + (at % CPR) * 8;
    }
    const int kbs = k / BK;
    auto issue = [&](int kb) {
        if (kb < kbs) {
            bf16* st = moe_smem + (kb % STAGES) * STAGE;
#pragma unroll
            for (int i = 0; i < A_PER; ++i) {
                const int at = t + 128 * i;
                if (at < A_CHUNKS)
                    copy16_async(reinterpret_cast<uint4*>(st + (at / CPR) * ROW + (at % CPR) * 8),
                                 reinterpret_cast<const uint4*>(asrc[i] + kb * BK));
            }
#pragma unroll
            for (int i = 0; i < W_PER; ++i) {
                const int at = t + 128 * i;
                copy16_async(reinterpret_cast<uint4*>(st + A_HALVES + (at / CPR) * ROW + (at % CPR) * 8),
                             reinterpret_cast<const uint4*>(wsrc[i] + kb * BK));
            }
        }
        async_commit();
    };
    const int warp = t >> 5, lane = t & 31, g = lane >> 2, q = lane & 3, wm = warp / WN, wn = warp % WN;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int kb = 0; kb < kbs; ++kb) {
        async_wait<STAGES - 2>();
        __syncthreads();
        issue(kb + STAGES - 1);
        const bf16* st = moe_smem + (kb % STAGES) * STAGE;
        const u32* sa = reinterpret_cast<const u32*>(st);
        const u32* sw = reinterpret_cast<const u32*>(st + A_HALVES);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            u32 af[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r0 = (wm * MT + i) * 16 + g;
                af[i][0] = sa[(r0 * ROW + ks * 16 + 2 * q) >> 1];
                af[i][1] = sa[((r0 + 8) * ROW + ks * 16 + 2 * q) >> 1];
                af[i][2] = sa[(r0 * ROW + ks * 16 + 8 + 2 * q) >> 1];
                af[i][3] = sa[((r0 + 8) * ROW + ks * 16 + 8 + 2 * q) >> 1];
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int col = (wn * NT + j) * 8 + g;
                const u32 b0 = sw[(col * ROW + ks * 16 + 2 * q) >> 1];
                const u32 b1 = sw[(col * ROW + ks * 16 + 8 + 2 * q) >> 1];
#pragma unroll
                for (int i = 0; i < MT; ++i) mma_bf16(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], b0, b1);
            }
        }
    }
    async_wait<0>();
    const int c0 = n0 + wn * NT * 8;
    if (c0 >= n) return;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = (wm * MT + i) * 16 + g + 8 * hr;
            if (r >= rows) continue;
            const u64 slot = first + r;
            if (SWIGLU) {
                const int f = n / 2;
#pragma unroll
                for (int u = 0; u < NT / 2; ++u) {
                    const int col = c0 / 2 + u * 8 + 2 * q;
                    const float* gt = acc[i][2 * u];
                    const float* up = acc[i][2 * u + 1];
                    const u32 lo16 = silu_mul(gt[2 * hr], up[2 * hr]), hi16 = silu_mul(gt[2 * hr + 1], up[2 * hr + 1]);
                    *reinterpret_cast<u32*>(act + slot * f + col) = lo16 | (hi16 << 16);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int col = c0 + j * 8 + 2 * q;
                    *reinterpret_cast<float2*>(c + slot * n + col) = make_float2(acc[i][j][2 * hr], acc[i][j][2 * hr + 1]);
                }
            }
        }
}

// Grid (columns / BN, the most row tiles a round can have), 128 threads; tiles past the round's own exit. Each
// shape is named _m{BM}n{BN}k{BK}s{STAGES}: 64-row tiles for rounds where experts serve many rows, 16-row ones with deeper
// rings for decode, where each expert's weights are read for a few rows.
#define MOE_KERNELS(SUFFIX, BM, WM, WN, MT, NT, BK, STAGES)                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                                                 \
        moe_gate_up##SUFFIX(const bf16* a, const u32* slot_row, const bf16* w, const u32* offsets,                   \
                            const u32* tile_start, int ne, int n, int k, bf16* act) {                                 \
        moe_gemm<BM, WM, WN, MT, NT, BK, STAGES, true>(a, slot_row, w, offsets, tile_start, ne, n, k, nullptr, act);  \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) moe_down##SUFFIX(                                               \
        const bf16* a, const bf16* w, const u32* offsets, const u32* tile_start, int ne, int n, int k, float* c) {   \
        moe_gemm<BM, WM, WN, MT, NT, BK, STAGES, false>(a, nullptr, w, offsets, tile_start, ne, n, k, c, nullptr);    \
    }

MOE_KERNELS(_m64n128k64s3, 64, 2, 2, 2, 8, 64, 3)
MOE_KERNELS(_m64n128k32s3, 64, 2, 2, 2, 8, 32, 3)
MOE_KERNELS(_m16n128k64s8, 16, 1, 4, 1, 4, 64, 8)
MOE_KERNELS(_m16n128k32s6, 16, 1, 4, 1, 4, 32, 6)

// delta[r] = the sum over ranks, in rank order, of weight x the expert's output for the row; then, where the layer
// has a shared expert, + sigmoid(its gate logit) x its output. Grid (rows, columns / 256), 256 threads.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const u32* __restrict__ pair_slot,
                                       const float* __restrict__ weights, int top_k, int h, float* __restrict__ delta,
                                       const float* __restrict__ shared_y, const float* __restrict__ shared_gate) {
    wait_prior();
    start_next();
    const int r = blockIdx.x, col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= h) return;
    const float sg = shared_y ? 1.0f / (1.0f + expf(-shared_gate[r])) : 0.0f;
    float s = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        const int at = r * top_k + k;
        s = __fadd_rn(s, __fmul_rn(weights[at], y[(u64)pair_slot[at] * h + col]));
    }
    if (shared_y) s = __fadd_rn(s, __fmul_rn(sg, shared_y[(u64)r * h + col]));
    delta[(u64)r * h + col] = s;
}
