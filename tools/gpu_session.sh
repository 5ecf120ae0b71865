#!/usr/bin/env bash
# One device-tool command for a whole GPU session: the CUDA tests, the engine alone, the server against
# transformers, then greedy agreement; results land in $OUT (all.tgz holds everything, within 8 files).
#
# Usage (after `bash tools/device_build.sh` here, with .device carried): bash tools/gpu_session.sh [SECONDS]
# SECONDS (default 570) bounds the whole run; the agreement check gets what is left (about 100 s on an H200:
# when less is left, run tools/gpu_check.sh as a second command on the same machine).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-570}"
OUT="${OUT:-./gpu-session-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
echo "== CUDA tests at $(elapsed) s, by default and under each tuning switch"
.device/cuda-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" | tee "$OUT/tests.txt"
for switch in TF_CUDA_OVERLAP=0 TF_CUDA_GEMM_MAX_BLOCKS=0 TF_CUDA_FUSE_ROPE=1 TF_CUDA_FOLD_NORMS=0 TF_CUDA_GPU_ARGMAX=0; do
    echo "$switch: $(env "$switch" .device/cuda-tests --test-threads 1 2>&1 | grep "test result")" | tee -a "$OUT/tests.txt"
done
if [[ ! -f "$CKPT/config.json" ]]; then
    timeout 180 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out "$CKPT" > "$OUT/checkpoint.log" 2>&1
fi
echo "== engine alone at $(elapsed) s"
# engine SETTING AFTER: decode tok/s of the engine alone under one switch, from AFTER tokens of context.
engine() {
    timeout 90 env "$1" .device/tensorfold bench --device cuda --model "$CKPT" --prompt-tokens 512 \
        --decode-tokens 128 --decode-after "$2" --repeats 2 2>/dev/null | grep decode_tok_s
}
for setting in TF_CUDA_GRAPHS=1 TF_CUDA_OVERLAP=0 TF_CUDA_GEMM_MAX_BLOCKS=0 TF_CUDA_FUSE_ROPE=1 TF_CUDA_FOLD_NORMS=0; do
    echo "$setting $(engine "$setting" 0)" | tee -a "$OUT/engine.txt"
done
echo "default, after 160: $(engine TF_CUDA_GRAPHS=1 160)" | tee -a "$OUT/engine.txt"
echo "== server against transformers at $(elapsed) s"
timeout 300 bash tools/bench_gpu.sh --out "$OUT/bench" --ckpt "$CKPT" --deadline 280 > /dev/null 2>&1
tail -25 "$OUT/bench/results.md"
echo "== agreement at $(elapsed) s"
mkdir -p "${TMPDIR:-/tmp}/tensorfold-check"
ln -sfn "$CKPT" "${TMPDIR:-/tmp}/tensorfold-check/llama-3.1-8b"
timeout $(( BUDGET - $(elapsed) )) bash tools/gpu_check.sh --out "$OUT/check" > "$OUT/check.log" 2>&1
tail -12 "$OUT/check/agreement.md"
echo "== done at $(elapsed) s"
tar czf "${TMPDIR:-/tmp}/gpu-session.tgz" -C "$OUT" . && mv "${TMPDIR:-/tmp}/gpu-session.tgz" "$OUT/all.tgz"
find "$OUT" -type f ! -name all.tgz ! -name tests.txt ! -name engine.txt -delete
