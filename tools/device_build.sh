#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain): the release binary and the CUDA test binaries,
# stripped into .device/, which git ignores; pass `.device` as the device tool's carry path.
#
# Usage: bash tools/device_build.sh
# Then on the GPU machine: bash tools/gpu_check.sh; bash tools/bench_gpu.sh; bash tools/gpu_exactness.sh;
# bash tools/gpu_carveout.sh
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p .device
grep -qxF "/.device/" .gitignore || { echo ".device/ must be ignored by git (add /.device/ to .gitignore)" >&2; exit 1; }
cargo build --release
# test_binary ARGS...: the path of the test binary `cargo test --release ARGS --no-run` builds.
test_binary() {
    cargo test --release "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(m["executable"])'
}
strip -o .device/tensorfold target/release/tensorfold
# The CUDA tests, and the server tests that TF_TEST_DEVICE=cuda runs on the GPU (tools/gpu_exactness.sh).
for pair in cuda:cuda-tests cuda_runtime:cuda-runtime-tests drafts:drafts-tests prefix_cache:prefix-cache-tests \
    cuda_speech:cuda-speech-tests speech_server:speech-server-tests features:features-tests cuda_memory:cuda-memory-tests cuda_tp:cuda-tp-tests cuda_moe:cuda-moe-tests cuda_hybrid:cuda-hybrid-tests \
    moe_serving:moe-serving-tests cuda_gguf:cuda-gguf-tests; do
    binary=$(test_binary --test "${pair%%:*}")
    [[ -n "$binary" ]] || { echo "the test binary ${pair%%:*} was not built" >&2; exit 1; }
    strip -o ".device/${pair##*:}" "$binary"
done
gemm_tests=$(test_binary -p tensorfold-kernels --test gpu_gemm)
[[ -n "$gemm_tests" ]] || { echo "the test binary gpu_gemm was not built" >&2; exit 1; }
strip -o .device/gemm-tests "$gemm_tests"
attention_tests=$(test_binary -p tensorfold-kernels --test gpu_attention)
[[ -n "$attention_tests" ]] || { echo "the test binary gpu_attention was not built" >&2; exit 1; }
strip -o .device/attention-tests "$attention_tests"
deltanet_tests=$(test_binary -p tensorfold-kernels --test gpu_deltanet)
[[ -n "$deltanet_tests" ]] || { echo "the test binary gpu_deltanet was not built" >&2; exit 1; }
strip -o .device/deltanet-tests "$deltanet_tests"
norm_tests=$(test_binary -p tensorfold-kernels --test gpu_norm)
[[ -n "$norm_tests" ]] || { echo "the test binary gpu_norm was not built" >&2; exit 1; }
strip -o .device/norm-tests "$norm_tests"
# The main crate's unit tests, for the device pool's (tools/gpu_carveout.sh runs those whose names contain lend_pool).
lib_tests=$(test_binary -p tensorfold --lib)
[[ -n "$lib_tests" ]] || { echo "the main crate's unit tests were not built" >&2; exit 1; }
strip -o .device/lib-tests "$lib_tests"
ls -l .device
