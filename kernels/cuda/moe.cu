// Mixture of experts: routing, the round's (row, expert) pairs sorted by expert, grouped GEMMs over them, and each
// row's experts weighted and summed in rank order.
//
// Batch invariance: a row's router logits are a warp's sum in a fixed lane order; its softmax and top-k run in one
// warp in a fixed order; an expert's GEMM sums each output in ascending k16 steps on mma.sync, whose
// result for a row depends on that row alone, so neither the other rows an expert serves nor a row's place among
// them changes its bits (which is why slots within an expert may be handed out in any order); the combine adds the
// ranks in rank order.

#define MOE_BN 128
#define MOE_BK 32
#define MOE_STAGES 3
// Halves per staged row: 32 k and 8 of padding, so a warp's fragment loads fall in distinct banks.
#define MOE_ROW 40
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
extern "C" __global__ void moe_route(float* __restrict__ logits, int ne, int top_k, int renorm,
                                     u32* __restrict__ experts, float* __restrict__ weights, u32* __restrict__ local,
                                     u32* __restrict__ counts) {
    wait_prior();
    start_next();
    const int r = blockIdx.x, lane = threadIdx.x;
    float* p = logits + (u64)r * ne;
    float m = -__int_as_float(0x7f800000);
    for (int e = lane; e < ne; e += 32) m = fmaxf(m, p[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < ne; e += 32) sum += expf(p[e] - m);
    sum = warp_sum(sum);
    __syncwarp();
    for (int e = lane; e < ne; e += 32) p[e] = expf(p[e] - m) / sum;
    __syncwarp();
    float chosen[MOE_MAX_TOPK];
    int ids[MOE_MAX_TOPK];
    float total = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        // This lane's best (the lower index on equal values), then the warp's, lower index on equal values.
        float best = -1.0f;
        int id = ne;
        for (int e = lane; e < ne; e += 32)
            if (p[e] > best) best = p[e], id = e;
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (ob > best || (ob == best && oi < id)) best = ob, id = oi;
        }
        ids[k] = id;
        chosen[k] = best;
        total += best;
        // Probabilities are at least zero, so a taken expert is never picked again.
        if (lane == 0) p[id] = -1.0f;
        __syncwarp();
    }
    if (lane != 0) return;
    for (int k = 0; k < top_k; ++k) {
        const int at = r * top_k + k;
        experts[at] = (u32)ids[k];
        weights[at] = renorm ? chosen[k] / total : chosen[k];
        local[at] = atomicAdd(&counts[ids[k]], 1u);
    }
}

// One block of 1024 threads: each expert's first slot and first row tile (of `bm` rows), every pair's slot and
// every slot's row.
extern "C" __global__ void __launch_bounds__(1024) moe_plan(const u32* __restrict__ experts, const u32* __restrict__ local,
                                                            u32* __restrict__ counts, int pairs, int top_k, int ne, int bm,
                                                            u32* __restrict__ offsets, u32* __restrict__ tile_start,
                                                            u32* __restrict__ slot_row, u32* __restrict__ pair_slot) {
    extern __shared__ u32 plan_off[];
    wait_prior();
    start_next();
    if (threadIdx.x == 0) {
        u32 o = 0, tiles = 0;
        for (int e = 0; e < ne; ++e) {
            const u32 c = counts[e];
            offsets[e] = plan_off[e] = o;
            tile_start[e] = tiles;
            o += c;
            tiles += (c + bm - 1) / bm;
        }
        offsets[ne] = plan_off[ne] = o;
        tile_start[ne] = tiles;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += 1024) {
        const u32 slot = plan_off[experts[i]] + local[i];
        slot_row[slot] = (u32)(i / top_k);
        pair_slot[i] = slot;
    }
}

// One expert's rows of one tile of BM rows by MOE_BN columns of its weights (w: ne matrices of n x k, row-major),
// by 4 warps of WM x WN, each MT row tiles of 16 by NT column tiles of 8, through STAGES stages of cp.async. A's rows
// are `slot_row[slot]` of `a` (or the slots themselves where it is null). Without SWIGLU c[slot][col] = the sum;
// with it, column tiles 2u and 2u + 1 are gate and up of the same 8 intermediate columns (the weights' rows
// interleaved by 8), and act[slot][f] = silu(gate) * up in bf16, n / 2 wide. Every shape sums an output in the same
// ascending k16 steps, so which one a round runs never changes a bit.
template <int BM, int WM, int WN, int MT, int NT, int STAGES, bool SWIGLU>
__device__ __forceinline__ void moe_gemm(const bf16* __restrict__ a, const u32* __restrict__ slot_row,
                                         const bf16* __restrict__ w, const u32* __restrict__ offsets,
                                         const u32* __restrict__ tile_start, int ne, int n, int k, float* __restrict__ c,
                                         bf16* __restrict__ act) {
    static_assert(WM * WN == 4 && WM * MT * 16 == BM && WN * NT * 8 == MOE_BN, "a tile is 4 warps");
    extern __shared__ __align__(16) bf16 moe_smem[];
    wait_prior();
    start_next();
    const u32 tile = blockIdx.y;
    if (tile >= tile_start[ne]) return;
    int lo = 0, hi = ne - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile_start[mid] <= tile) lo = mid;
        else hi = mid - 1;
    }
    const int e = lo;
    const u32 first = offsets[e] + (tile - tile_start[e]) * BM;
    const int rows = min((int)(offsets[e + 1] - first), BM);
    const int n0 = blockIdx.x * MOE_BN, t = threadIdx.x;
    const bf16* we = w + (u64)e * n * k;
    constexpr int A_HALVES = BM * MOE_ROW, STAGE = (BM + MOE_BN) * MOE_ROW;
    // This thread's copies of a stage: 16 bytes of A_PER rows of A (where t < BM * 4) and of 4 rows of W.
    constexpr int A_PER = BM * 4 >= 128 ? BM * 4 / 128 : 1;
    const int chunk = t & 3;
    const bool copies_a = t < BM * 4;
    const bf16* asrc[A_PER];
    const bf16* wsrc[4];
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
        const u32 slot = first + min((t >> 2) + 32 * i, rows - 1);
        const u32 row = slot_row ? slot_row[slot] : slot;
        asrc[i] = a + (u64)row * k + chunk * 8;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) wsrc[i] = we + (u64)min(n0 + (t >> 2) + 32 * i, n - 1) * k + chunk * 8;
    const int kbs = k / MOE_BK;
    auto issue = [&](int kb) {
        if (kb < kbs) {
            bf16* st = moe_smem + (kb % STAGES) * STAGE;
            if (copies_a) {
#pragma unroll
                for (int i = 0; i < A_PER; ++i)
                    copy16_async(reinterpret_cast<uint4*>(st + ((t >> 2) + 32 * i) * MOE_ROW + chunk * 8),
                                 reinterpret_cast<const uint4*>(asrc[i] + kb * MOE_BK));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
                copy16_async(reinterpret_cast<uint4*>(st + A_HALVES + ((t >> 2) + 32 * i) * MOE_ROW + chunk * 8),
                             reinterpret_cast<const uint4*>(wsrc[i] + kb * MOE_BK));
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
        for (int ks = 0; ks < 2; ++ks) {
            u32 af[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r0 = (wm * MT + i) * 16 + g;
                af[i][0] = sa[(r0 * MOE_ROW + ks * 16 + 2 * q) >> 1];
                af[i][1] = sa[((r0 + 8) * MOE_ROW + ks * 16 + 2 * q) >> 1];
                af[i][2] = sa[(r0 * MOE_ROW + ks * 16 + 8 + 2 * q) >> 1];
                af[i][3] = sa[((r0 + 8) * MOE_ROW + ks * 16 + 8 + 2 * q) >> 1];
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int col = (wn * NT + j) * 8 + g;
                const u32 b0 = sw[(col * MOE_ROW + ks * 16 + 2 * q) >> 1];
                const u32 b1 = sw[(col * MOE_ROW + ks * 16 + 8 + 2 * q) >> 1];
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

// Grid (columns / MOE_BN, the most row tiles a round can have), 128 threads; tiles past the round's own exit.
// The _m64 kernels take tiles of 64 rows (rounds where experts serve many rows), the _m16 ones tiles of 16 with a
// deeper ring (decode, where each expert's weights are read for a few rows).
#define MOE_KERNELS(SUFFIX, BM, WM, WN, MT, NT, STAGES)                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                                                 \
        moe_gate_up##SUFFIX(const bf16* a, const u32* slot_row, const bf16* w, const u32* offsets,                   \
                            const u32* tile_start, int ne, int n, int k, bf16* act) {                                 \
        moe_gemm<BM, WM, WN, MT, NT, STAGES, true>(a, slot_row, w, offsets, tile_start, ne, n, k, nullptr, act);      \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) moe_down##SUFFIX(                                               \
        const bf16* a, const bf16* w, const u32* offsets, const u32* tile_start, int ne, int n, int k, float* c) {   \
        moe_gemm<BM, WM, WN, MT, NT, STAGES, false>(a, nullptr, w, offsets, tile_start, ne, n, k, c, nullptr);        \
    }

MOE_KERNELS(_m64, 64, 2, 2, 2, 8, 3)
MOE_KERNELS(_m16, 16, 1, 4, 1, 4, 6)

// delta[r] = the sum over ranks, in rank order, of weight x the expert's output for the row; then, where the layer
// has a shared expert, + sigmoid(its gate logit) x its output. Grid (rows), 256 threads.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const u32* __restrict__ pair_slot,
                                       const float* __restrict__ weights, int top_k, int h, float* __restrict__ delta,
                                       const float* __restrict__ shared_y, const float* __restrict__ shared_gate) {
    wait_prior();
    start_next();
    const int r = blockIdx.x;
    const float sg = shared_y ? 1.0f / (1.0f + expf(-shared_gate[r])) : 0.0f;
    for (int col = threadIdx.x; col < h; col += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < top_k; ++k) {
            const int at = r * top_k + k;
            s = __fadd_rn(s, __fmul_rn(weights[at], y[(u64)pair_slot[at] * h + col]));
        }
        if (shared_y) s = __fadd_rn(s, __fmul_rn(sg, shared_y[(u64)r * h + col]));
        delta[(u64)r * h + col] = s;
    }
}
