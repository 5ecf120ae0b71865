#!/usr/bin/env bash
# The GEMM issue's GPU run in one command: the GEMM bench (our kernels and cuBLAS in one process, with the
# exactness checks), then the completion routes' log-probabilities, the CUDA tests and the server's draft and
# prefix-cache tests on a seeded two-layer Llama-3.1-8B (the default model is too large to carry to the GPU machine).
#
# Usage (after bash tools/device_build.sh here; carry DIR with tensorfold, cuda-tests, cuda-runtime-tests,
# features-tests, drafts-tests, prefix-cache-tests): bash tools/gpu_gemm.sh [DIR] [gemm_bench.py words...]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.device}"
shift || true
OUT="${OUT:-./gpu-gemm-out}"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# SKIP_BENCH=1 runs only the tests.
if [[ -z "${SKIP_BENCH:-}" ]]; then
    echo "== gemm bench at $(elapsed) s"
    timeout 300 python3 tools/gemm_bench.py --out "$OUT" "$@" > "$OUT/gemm_bench.log" 2>&1
    echo "gemm bench exit $?: $(tail -1 "$OUT/gemm_bench.log")"
fi
CKPT="${TMPDIR:-/tmp}/tensorfold-gemm/llama-3.1-8b-2"
if [[ ! -f "$CKPT/config.json" ]]; then
    timeout 180 python3 tools/make_checkpoint.py --shape llama-3.1-8b --layers 2 --init-device cuda --out "$CKPT" \
        > "$OUT/checkpoint.log" 2>&1 || echo "checkpoint failed: $(tail -2 "$OUT/checkpoint.log")"
fi
# tests NAME [FILTER]: a test binary, one test at a time, its per-test lines and summary into $OUT/tests.txt.
tests() {
    echo "== $1 ${2:-} at $(elapsed) s" | tee -a "$OUT/tests.txt"
    timeout 200 "$BIN/$1" ${2:+"$2"} --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" |
        tee -a "$OUT/tests.txt"
}
export TF_TEST_MODEL="$CKPT" TF_TEST_DEVICE=cuda TF_TEST_BINARY="$PWD/$BIN/tensorfold" TF_CACHE_DIR=/tmp/tfc
tests gemm-tests
tests features-tests logprobs
tests cuda-tests
tests cuda-runtime-tests
tests drafts-tests
tests prefix-cache-tests
echo "== the issue's request at $(elapsed) s" | tee -a "$OUT/tests.txt"
"$BIN/tensorfold" serve --device cuda --model "$CKPT" --port 18411 --no-voice 2> "$OUT/serve.log" &
SERVER=$!
for _ in $(seq 300); do curl -sf http://127.0.0.1:18411/health > /dev/null && break; sleep 0.2; done
for body in '{"prompt":"Hello","max_tokens":4,"temperature":0,"logprobs":1}' \
    '{"prompt":"Hello","max_tokens":4,"temperature":0.7,"seed":3,"logprobs":1}'; do
    curl -s -o "$OUT/reply.json" -w "%{http_code} " http://127.0.0.1:18411/v1/completions \
        -H 'content-type: application/json' -d "$body" | tee -a "$OUT/tests.txt"
    head -c 300 "$OUT/reply.json" | tee -a "$OUT/tests.txt"; echo | tee -a "$OUT/tests.txt"
done
kill "$SERVER"; wait "$SERVER" 2> /dev/null
echo "== done at $(elapsed) s" | tee -a "$OUT/tests.txt"
