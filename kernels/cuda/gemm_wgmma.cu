// Many rows on Hopper's warpgroup MMA (wgmma, sm_90a): the weights are the M side, 64 rows a warpgroup, held in
// registers as mma.sync's A fragments; the activations are the N side, WG_TOKENS rows a block, in shared memory.
//
// An element's arithmetic is gemm_narrow's: K segments one by one, each in ascending 32-wide chunks from zero, two
// k16 steps a chunk over the k that chunk_mma gives them, the segment sums added in order, then the bias; wgmma sums
// a k16 step as mma.sync does for the same k order (tools/wgmma_probe.cu). The activations get that order in shared
// memory: a core-matrix row holds 8 k of one step, 4 pairs at stride 8 of the chunk, a 4 x 4 transpose of the chunk
// row's 32-bit words.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#define WG_TOKENS 128
#define WG_GROUPS 2
#define WG_THREADS (128 * WG_GROUPS)
// Bytes of one chunk's activation tile: 2 steps of (WG_TOKENS / 8) x 2 core matrices of 128 bytes.
#define WG_CHUNK_BYTES (2 * WG_TOKENS * 32)

__device__ __forceinline__ u64 wg_descriptor(const void* p) {
    const u32 at = (u32)__cvta_generic_to_shared(p);
    // No swizzle, K-major: 128 bytes between core matrices along k, 256 along the rows.
    return (u64)((at & 0x3ffff) >> 4) | ((u64)(128 >> 4) << 16) | ((u64)(256 >> 4) << 32);
}

#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// d += W (64 x 16, registers) times the activations' step (16 x WG_TOKENS, shared memory), accumulating into d.
__device__ __forceinline__ void wg_step(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
        "%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,"
        "%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

// Loads this thread's row of activations (row threadIdx % WG_TOKENS of chunk threadIdx / WG_TOKENS) into registers.
__device__ __forceinline__ void wg_load(uint4* v, const bf16* a, int m0, int m, int k, int kb, int kbs) {
    const int row = threadIdx.x % WG_TOKENS, c = threadIdx.x / WG_TOKENS;
    if (kb + c >= kbs) return;
    const uint4* src = reinterpret_cast<const uint4*>(a + (u64)min(m0 + row, m - 1) * k + (kb + c) * 32);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = src[i];
}

// Stores the row in the steps' k order: step s, core j takes word 2 s + j of each 16 bytes.
__device__ __forceinline__ void wg_store(unsigned char* stage, const uint4* v, int kb, int kbs) {
    const int row = threadIdx.x % WG_TOKENS, c = threadIdx.x / WG_TOKENS;
    if (kb + c >= kbs) return;
    unsigned char* base = stage + c * WG_CHUNK_BYTES + ((row / 8) * 2) * 128 + (row % 8) * 16;
    const uint4 s0j0 = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x), s0j1 = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
    const uint4 s1j0 = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z), s1j1 = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
    *reinterpret_cast<uint4*>(base) = s0j0;
    *reinterpret_cast<uint4*>(base + 128) = s0j1;
    *reinterpret_cast<uint4*>(base + WG_CHUNK_BYTES / 2) = s1j0;
    *reinterpret_cast<uint4*>(base + WG_CHUNK_BYTES / 2 + 128) = s1j1;
}

// One stage: two chunks of activations; WG_STAGES of them in shared memory, then with FOLD the running sums.
#define WG_STAGES 3
#define WG_STAGE_BYTES (2 * WG_CHUNK_BYTES)

// Queues stage st's products: its activations in shared memory at `x`, its weight fragments in `wf`. Where a chunk
// ends a K segment, waits for its products and adds their sum to the running one (FOLD).
template <bool FOLD>
__device__ __forceinline__ void wg_issue(float* acc, const uint4* wf, const unsigned char* x, int st, int kbs, int per,
                                         int& left, float* running) {
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
        const int kb = 2 * st + ch;
        if (kb >= kbs) break;
        const uint4 l = wf[2 * ch], h = wf[2 * ch + 1];
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wg_step(acc, l.x, h.x, l.y, h.y, wg_descriptor(x + ch * WG_CHUNK_BYTES));
        wg_step(acc, l.z, h.z, l.w, h.w, wg_descriptor(x + ch * WG_CHUNK_BYTES + WG_CHUNK_BYTES / 2));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (FOLD && --left == 0) {
            // A segment ends: its sum joins the running one, as sum_segments adds them.
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            const bool first = kb + 1 == per;
            left = per;
#pragma unroll
            for (int j = 0; j < 64; ++j) {
                float& r = running[j * WG_THREADS];
                r = first ? acc[j] : r + acc[j];
                acc[j] = 0.0f;
            }
        }
    }
}

// Loads the weight fragments of stage st's chunks: tiles lo and hi of each.
__device__ __forceinline__ void wg_weights(uint4* wf, const uint4* wlo, const uint4* whi, int st, int kbs) {
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
        const int kb = 2 * st + ch;
        if (kb < kbs) wf[2 * ch] = load_weight(wlo + (u64)kb * 32), wf[2 * ch + 1] = load_weight(whi + (u64)kb * 32);
    }
}

// One block: 64 x WG_GROUPS weight rows (column tiles of the output) by WG_TOKENS activation rows. Stage st's
// products run while stage st + 1's activations are stored and stage st + 2's are loaded, with its weights.
template <bool FOLD>
__device__ void gemm_wg(const bf16* __restrict__ a, const bf16* __restrict__ w, const float* __restrict__ bias,
                        float* __restrict__ c, bf16* __restrict__ act, int m, int n, int k, int segments) {
    extern __shared__ __align__(128) unsigned char wg_smem[];
    float* running = reinterpret_cast<float*>(wg_smem + WG_STAGES * WG_STAGE_BYTES) + threadIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int ntiles = (n + 7) / 8, kbs = k >> 5, per = kbs / segments;
    const int nb0 = blockIdx.x * (8 * WG_GROUPS), m0 = blockIdx.y * WG_TOKENS;
    // This warp's two 8-row weight tiles: rows 0..7 and 8..15 of its 16.
    const int nb_lo = nb0 + 2 * warp, nb_hi = nb_lo + 1;
    const uint4* wlo = reinterpret_cast<const uint4*>(w) + (u64)min(nb_lo, ntiles - 1) * kbs * 32 + lane;
    const uint4* whi = reinterpret_cast<const uint4*>(w) + (u64)min(nb_hi, ntiles - 1) * kbs * 32 + lane;
    wait_prior();
    start_next();
    const int stages = (kbs + 1) / 2;
    uint4 wf[WG_STAGES][4], v[4];
    wg_weights(wf[0], wlo, whi, 0, kbs);
    wg_weights(wf[1], wlo, whi, 1, kbs);
    wg_load(v, a, m0, m, k, 0, kbs);
    wg_store(wg_smem, v, 0, kbs);
    wg_load(v, a, m0, m, k, 2, kbs);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float acc[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = 0.0f;
    int left = per;
    // The slot of stage st is st % WG_STAGES; unrolled so every register index is fixed.
#define WG_STAGE(S)                                                                                                   \
    {                                                                                                                \
        const int st = st0 + S;                                                                                      \
        if (st < stages) {                                                                                           \
            wg_issue<FOLD>(acc, wf[S], wg_smem + S * WG_STAGE_BYTES, st, kbs, per, left, running);                  \
            /* Stage st - 1's products are done, so its weights and stage st - 2's slot are free. */                 \
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");                                        \
            if (st + 2 < stages) wg_weights(wf[(S + 2) % WG_STAGES], wlo, whi, st + 2, kbs);                           \
            if (st + 1 < stages) {                                                                                   \
                wg_store(wg_smem + ((S + 1) % WG_STAGES) * WG_STAGE_BYTES, v, 2 * (st + 1), kbs);                   \
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");                                      \
            }                                                                                                        \
            if (st + 2 < stages) wg_load(v, a, m0, m, k, 2 * (st + 2), kbs);                                         \
            __syncthreads();                                                                                         \
        }                                                                                                            \
    }
    for (int st0 = 0; st0 < stages; st0 += WG_STAGES) {
        WG_STAGE(0)
        WG_STAGE(1)
        WG_STAGE(2)
    }
#undef WG_STAGE
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // Element j: weight row g + 8 ((j / 2) % 2) of the warp's 16, activation row 8 (j / 4) + 2 q + j % 2.
#pragma unroll
    for (int j = 0; j < 64; ++j) {
        const int hr = (j >> 1) & 1, tok = m0 + 8 * (j >> 2) + 2 * q + (j & 1);
        const int col = (hr ? nb_hi : nb_lo) * 8 + g;
        if (tok >= m || col >= n) continue;
        const float s = FOLD ? running[j * WG_THREADS] : acc[j];
        const float v0 = bias ? s + bias[col] : s;
        if (act) {
            // The gate (rows 0..7) and up (rows 8..15) of act column nb_lo / 2 * 8 + g sit in one thread.
            if (hr) continue;
            const float u = FOLD ? running[(j + 2) * WG_THREADS] : acc[j + 2];
            const float v1 = bias ? u + bias[col + 8] : u;
            act[(u64)tok * (n / 2) + (nb_lo / 2) * 8 + g] = silu_mul(v0, v1);
            continue;
        }
        c[(u64)tok * n + col] = v0;
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) gemm_wg128(const bf16* a, const bf16* w, const float* bias, float* c, bf16* act, int m, int n, int k, int segments) {
    if (segments > 1) gemm_wg<true>(a, w, bias, c, act, m, n, k, segments);
    else gemm_wg<false>(a, w, bias, c, act, m, n, k, segments);
}

#endif
