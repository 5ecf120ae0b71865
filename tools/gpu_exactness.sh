#!/usr/bin/env bash
# The three equalities on the GPU, and draft speed: the CUDA test binaries (speech among them), the server's draft,
# prefix-cache and speech tests with --device cuda, bench_concurrent.py's counts and bench_drafts.py on the default
# model; results in $OUT.
#
# Usage (after `bash tools/device_build.sh` here, with .device carried and the default model in $TF_CACHE_DIR):
#     bash tools/gpu_exactness.sh tests                    # the test binaries
#     bash tools/gpu_exactness.sh bench [DRAFT_TOKENS ...]  # the counts, and bench_drafts.py at each (default: 7)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-exactness-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
MODEL="$TF_CACHE_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
[[ -f "$MODEL" ]] || { echo "no default model at $MODEL" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
# tests NAME...: each test binary of .device, one test at a time; the per-test lines and the summary go to $OUT.
tests() {
    for name in "$@"; do
        echo "== $name at $(elapsed) s"
        timeout 400 ".device/$name" --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" |
            tee "$OUT/$name.txt"
    done
}
MODE="${1:-tests}"
shift || true
if [[ "$MODE" == tests ]]; then
    tests cuda-tests cuda-runtime-tests gemm-tests cuda-speech-tests
    TF_TEST_DEVICE=cuda TF_TEST_BINARY="$PWD/.device/tensorfold" tests drafts-tests prefix-cache-tests
    # Log-probabilities on both completion routes, greedy and sampled (a GPU cuts sampled rows short without them).
    echo "== features-tests (logprobs) at $(elapsed) s"
    TF_TEST_DEVICE=cuda TF_TEST_BINARY="$PWD/.device/tensorfold" timeout 400 .device/features-tests logprobs \
        --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" | tee "$OUT/features-tests.txt"
    # The committed Drama checkpoint's heads are too small for the GPU's attention: a two-layer orpheus-3b copy
    # stands in. Listing the models expects the default voice, and `speak` runs on the CPU: both are left out.
    DRAMA="${TMPDIR:-/tmp}/tensorfold-bench/drama"
    [[ -f "$DRAMA/model.safetensors" ]] || timeout 120 python3 tools/make_drama.py --shape orpheus-3b --layers 2 \
        --out "$DRAMA" > "$OUT/drama.log" 2>&1
    echo "== speech-server-tests at $(elapsed) s"
    TF_TEST_DRAMA="$DRAMA" TF_TEST_DEVICE=cuda TF_TEST_BINARY="$PWD/.device/tensorfold" timeout 400 \
        .device/speech-server-tests --test-threads 1 --skip test_models_list --skip test_wav_pcm_sse 2>&1 |
        grep -E "^test |test result|skipped|panicked" | tee "$OUT/speech-server-tests.txt"
    echo "== done at $(elapsed) s"
    exit 0
fi

echo "== bench_concurrent.py on CUDA at $(elapsed) s"
PORT=18311
.device/tensorfold serve --device cuda --model "$MODEL" --port "$PORT" --parallel 32 --no-voice 2> "$OUT/serve.log" &
SERVER=$!
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 0.2
done
# With log-probabilities a greedy lane's rows come back whole; without, the engine picks each row's token.
for logprobs in --logprobs ""; do
    timeout 200 python3 tools/bench_concurrent.py --base-url "http://127.0.0.1:$PORT/v1" $logprobs 2>&1 |
        tail -1 | sed "s/^/${logprobs:-no logprobs}: /" | tee -a "$OUT/concurrent.txt"
done
kill "$SERVER"; wait "$SERVER" 2> /dev/null

for k in "${@:-7}"; do
    echo "== bench_drafts.py --draft-tokens $k at $(elapsed) s"
    timeout 400 python3 tools/bench_drafts.py --binary .device/tensorfold --model "$MODEL" --threads 8 --streams 8 \
        --repeats 5 --max-tokens 128 --serve-arg "--device cuda --draft-tokens $k" > "$OUT/drafts-$k.json" 2>&1
    python3 - "$OUT/drafts-$k.json" <<'PY' 2>&1 | sed "s/^/k=$k /" | tee -a "$OUT/drafts.txt"
import json, sys
report = json.load(open(sys.argv[1]))
for task, runs in report["tasks"].items():
    cells = [f"{n}: {r['ratio']} ({r['plain_tok_s']} -> {r['drafted_tok_s']} tok/s, kept {r['accepted_share']})"
             for n, r in runs.items()]
    print(task, "; ".join(cells))
PY
done
echo "== done at $(elapsed) s"
