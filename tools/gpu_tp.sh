#!/usr/bin/env bash
# Tensor parallelism on one GPU: ranks from their shards on the GPU's one stream (tests/cuda_tp.rs), then the CUDA
# tests, which the tensor-parallel changes to the CUDA engine must leave as they were.
#
# Usage (after bash tools/device_build.sh here; .device carried): bash tools/gpu_tp.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-tp-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
mkdir -p "$OUT"
# NCCL from torch's wheel, under the name the loader looks for; NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
if [[ -f "$NCCL_LIB/libnccl.so.2" ]]; then
    mkdir -p /tmp/tf-nccl && ln -sf "$NCCL_LIB/libnccl.so.2" /tmp/tf-nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/tf-nccl:${LD_LIBRARY_PATH:-}"
fi
echo "NCCL: ${NCCL_LIB:-none found}" | tee "$OUT/nccl.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
echo "== tensor-parallel ranks on one GPU"
timeout 240 .device/cuda-tp-tests --test-threads 1 --nocapture 2>&1 | grep -vE "^\s*$" | tee "$OUT/cuda-tp.txt"
echo "== CUDA tests"
timeout 300 .device/cuda-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" |
    tee "$OUT/cuda-tests.txt"
