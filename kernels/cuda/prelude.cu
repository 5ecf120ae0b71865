// Shared helpers: bf16 as raw bits, so the kernels need no CUDA headers under NVRTC.
typedef unsigned short bf16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((u32)h) << 16); }

// Round to nearest even, as torch rounds f32 to bf16.
__device__ __forceinline__ bf16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// The SwiGLU of one gate and up value, rounded to bf16: the same expression in every kernel.
__device__ __forceinline__ bf16 silu_mul(float g, float u) { return f2bf(g / (1.0f + expf(-g)) * u); }

// Butterfly sums: every lane ends with the same value, in an order fixed by the lane layout alone.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of 1024 threads: per-warp butterflies, then the 32 warp sums in warp order.
__device__ __forceinline__ float block_sum_1024(float v, float* scratch) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = scratch[0];
    for (int w = 1; w < 32; ++w) total += scratch[w];
    __syncthreads();
    return total;
}

// Copies 16 bytes from global to shared memory without passing through registers or L1.
__device__ __forceinline__ void copy16_async(uint4* dst, const uint4* src) {
    const u32 at = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// The expert whose row tiles hold `tile`: the last e of the ne with tile_start[e] <= tile (tile_start ascending from
// zero, as moe_plan writes it), so an expert with no tiles is never the answer.
__device__ __forceinline__ int expert_of_tile(const u32* tile_start, int ne, u32 tile) {
    int lo = 0, hi = ne - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile_start[mid] <= tile) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Launches may overlap (programmatic dependent launch): every kernel calls wait_prior before it reads or
// writes memory that earlier kernels use, and start_next once the next kernel may launch.
__device__ __forceinline__ void wait_prior() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void start_next() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#if __CUDA_ARCH__ >= 900
// A wait on a barrier longer than this (ns) traps, so a broken pipeline fails the launch instead of hanging.
#ifndef MBAR_WATCHDOG_NS
#define MBAR_WATCHDOG_NS 4000000000ull
#endif

__device__ __forceinline__ u32 tma_shared(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// The producer's arrival, announcing the bytes the stage's copies will bring.
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbar_try(u32 bar, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ u64 tma_clock() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}

// Waits for the phase of parity `parity` to complete; the timer is read only once the first try fails.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    if (mbar_try(bar, parity)) return;
    const u64 t0 = tma_clock();
    while (!mbar_try(bar, parity))
        if (MBAR_WATCHDOG_NS && tma_clock() - t0 > MBAR_WATCHDOG_NS) asm volatile("trap;\n");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Orders this thread's earlier generic accesses before later bulk copies (the async proxy).
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async;\n" ::: "memory"); }
#endif
