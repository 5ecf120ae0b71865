// Weights packed on the GPU: row-major bf16 rows, copied up as the checkpoint stores them, into the GEMM's tiles.

// Copies `rows` rows of `k` bf16 values (rows row0.. of one weight) from `src` into the packed weight `dst`, 16 bytes
// per thread: row r lands on row base + (r / 8) * stride + r % 8 (`packed_vector` in kernels/src/cuda/pack.rs), in the
// tiles or, with `natural`, row-major.
extern "C" __global__ void pack_rows(const uint4* __restrict__ src, uint4* __restrict__ dst, int rows, int k, int row0,
                                     int base, int stride, int natural) {
    start_next();
    wait_prior();
    const u64 per_row = (u64)k / 8;
    const u64 v = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= (u64)rows * per_row) return;
    const u64 r = (u64)row0 + v / per_row, i = (v % per_row) * 8;
    const u64 dest = (u64)base + (r / 8) * (u64)stride + r % 8;
    if (natural) {
        dst[(dest * (u64)k + i) / 8] = src[v];
        return;
    }
    dst[(((dest / 8) * ((u64)k / 32) + i / 32) * 256 + (dest % 8) * 32 + i % 32) / 8] = src[v];
}
