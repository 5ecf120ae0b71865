// Does wgmma (Hopper's warpgroup MMA) sum a bf16 dot product bit for bit as mma.sync does?
//
// A tensor-core GEMM on wgmma could only join the decode kernels (mma.sync m16n8k16) if every output element gets
// the same bits from both for the same k order. This probe multiplies 64 x 16 by 16 x N tiles (N = 8 and 64),
// chained over STEPS k16 steps from a given C, both ways, and compares them: first on small integers (every order
// exact), which checks the shared-memory layout against an exact host sum; then on random bf16 over wide
// exponent ranges.
//
// Build and run on an H200:
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/wgmma_probe tools/wgmma_probe.cu && /tmp/wgmma_probe

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#endif

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define STEPS 8
#define K (16 * STEPS)

// A matrix descriptor for a no-swizzle K-major tile: start, leading (k) and stride (m or n) byte offsets, over 16.
__device__ u64 descriptor(const void* p, u32 lbo, u32 sbo) {
    const u32 at = (u32)__cvta_generic_to_shared(p);
    return (u64)((at & 0x3ffff) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

__device__ void mma_sync(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ void wgmma(float* d, u64 da, u64 db, int n) {
    if (n == 8) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(da), "l"(db), "r"(1));
        return;
    }
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1));
}

// One warpgroup per trial: A is 64 x K and B is N x K, both k-contiguous; C and both results are 64 x N.
// `swap` exchanges the two descriptor offsets, for the reading of their roles that the layout check confirms.
template <int N>
__global__ void probe(const u16* a, const u16* b, const float* c, float* wg, float* ms, int swap) {
    __shared__ __align__(128) u16 as[STEPS][64 * 16];
    __shared__ __align__(128) u16 bs[STEPS][N * 16];
    const int t = threadIdx.x, trial = blockIdx.x;
    a += (u64)trial * 64 * K, b += (u64)trial * N * K, c += trial * 64 * N, wg += trial * 64 * N, ms += trial * 64 * N;
    // Core matrices of 8 rows by 8 k (128 bytes): (row block i, k block j) at (2 i + j) * 128 bytes of a step.
    for (int e = t; e < 64 * K; e += 128) {
        const int m = e / K, k = e % K, s = k / 16, kk = k % 16;
        as[s][((m / 8) * 2 + kk / 8) * 64 + (m % 8) * 8 + kk % 8] = a[e];
    }
    for (int e = t; e < N * K; e += 128) {
        const int n = e / K, k = e % K, s = k / 16, kk = k % 16;
        bs[s][((n / 8) * 2 + kk / 8) * 64 + (n % 8) * 8 + kk % 8] = b[e];
    }
    // The tiles were written through the generic proxy; wgmma reads them through the async one.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4, r0 = 16 * warp + g;
    // Element j of a thread's N / 2 is row r0 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 q + j % 2, as mma.sync lays them.
    constexpr int PER = N / 2;
    int at[PER];
    for (int j = 0; j < PER; ++j) at[j] = (r0 + 8 * ((j / 2) % 2)) * N + 8 * (j / 4) + 2 * q + j % 2;
    float d[PER], e[PER];
    for (int j = 0; j < PER; ++j) d[j] = e[j] = c[at[j]];
    const u32 lbo = swap ? 256 : 128, sbo = swap ? 128 : 256;
    for (int s = 0; s < STEPS; ++s) {
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma(d, descriptor(as[s], lbo, sbo), descriptor(bs[s], lbo, sbo), N);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    // The same products by mma.sync, fragments straight from global memory in the same k order.
    auto pair = [](const u16* p) { return (u32)p[0] | ((u32)p[1] << 16); };
    for (int s = 0; s < STEPS; ++s) {
        const int k0 = 16 * s;
        const u16* lo = a + (u64)r0 * K + k0;
        const u16* hi = a + (u64)(r0 + 8) * K + k0;
        for (int nt = 0; nt < N / 8; ++nt) {
            const u16* bn = b + (u64)(8 * nt + g) * K + k0;
            mma_sync(e + 4 * nt, pair(lo + 2 * q), pair(hi + 2 * q), pair(lo + 2 * q + 8), pair(hi + 2 * q + 8),
                     pair(bn + 2 * q), pair(bn + 2 * q + 8));
        }
    }
    for (int j = 0; j < PER; ++j) wg[at[j]] = d[j], ms[at[j]] = e[j];
}

#ifndef __CUDACC_RTC__
static u16 bf16_of(float f) {
    u32 u;
    memcpy(&u, &f, 4);
    return (u16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float f32_of(u16 h) {
    const u32 u = (u32)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static u64 state = 88172645463325252ull;
static u64 next() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
}

// Trials of random A, B and C: `exact` draws small integers, else signed values with exponents over +-2^spread.
template <int N>
static int run(int trials, bool exact, int spread, int swap, bool report) {
    std::vector<u16> a((size_t)trials * 64 * K), b((size_t)trials * N * K);
    std::vector<float> c((size_t)trials * 64 * N), wg(c.size()), ms(c.size());
    auto draw = [&](void) -> float {
        if (exact) return (float)((int)(next() % 9) - 4);
        const float mant = 1.0f + (float)(next() % 128) / 128.0f;
        const int e = (int)(next() % (2 * spread + 1)) - spread;
        return ((next() & 1) ? -1.0f : 1.0f) * ldexpf(mant, e);
    };
    for (auto& v : a) v = bf16_of(draw());
    for (auto& v : b) v = bf16_of(draw());
    for (auto& v : c) v = exact ? (float)((int)(next() % 9) - 4) : draw();
    u16 *da, *db;
    float *dc, *dwg, *dms;
    cudaMalloc(&da, a.size() * 2), cudaMalloc(&db, b.size() * 2);
    cudaMalloc(&dc, c.size() * 4), cudaMalloc(&dwg, c.size() * 4), cudaMalloc(&dms, c.size() * 4);
    cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
    probe<N><<<trials, 128>>>(da, db, dc, dwg, dms, swap);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        printf("launch failed: %s\n", cudaGetErrorString(err));
        exit(1);
    }
    cudaMemcpy(wg.data(), dwg, c.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ms.data(), dms, c.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dwg), cudaFree(dms);
    int wrong_wg = 0, wrong_ms = 0, differ = 0;
    for (int tr = 0; tr < trials; ++tr)
        for (int m = 0; m < 64; ++m)
            for (int n = 0; n < N; ++n) {
                const size_t i = ((size_t)tr * 64 + m) * N + n;
                double want = c[i];
                for (int k = 0; k < K; ++k)
                    want += (double)f32_of(a[((size_t)tr * 64 + m) * K + k]) * f32_of(b[((size_t)tr * N + n) * K + k]);
                wrong_wg += exact && (double)wg[i] != want;
                wrong_ms += exact && (double)ms[i] != want;
                u32 x, y;
                memcpy(&x, &wg[i], 4), memcpy(&y, &ms[i], 4);
                differ += x != y;
            }
    if (report && exact) printf("integers, N %d: against the exact sum wgmma %d wrong, mma.sync %d wrong\n", N, wrong_wg, wrong_ms);
    if (report && !exact)
        printf("random bf16, N %d, exponents within +-%d, %d trials of 64 x %d outputs over %d k: wgmma differs from "
               "mma.sync in %d\n", N, spread, trials, N, K, differ);
    return exact ? wrong_wg : differ;
}

template <int N>
static int compare() {
    // The layout check: with integers every order is exact, so wgmma must match the host's sum.
    int swap = -1;
    for (int s = 0; s < 2 && swap < 0; ++s)
        if (run<N>(64, true, 0, s, false) == 0) swap = s;
    if (swap < 0) {
        run<N>(64, true, 0, 0, true);
        printf("N %d: no descriptor reading gives the exact sums: the layout is wrong, nothing to compare\n", N);
        exit(1);
    }
    printf("N %d: layout confirmed (offsets %s)\n", N, swap ? "swapped" : "as written");
    int total = 0;
    for (int spread : {0, 4, 12, 30}) total += run<N>(N == 8 ? 2048 : 512, false, spread, swap, true);
    return total;
}

int main() {
    const int total = compare<8>() + compare<64>();
    printf(total == 0 ? "SAME: wgmma and mma.sync gave the same bits for every output\n"
                      : "DIFFERENT: wgmma and mma.sync disagree on some outputs\n");
    return 0;
}
#endif
