#!/usr/bin/env bash
# One device-tool command that holds a change to "unchanged within noise": the CUDA tests, then the server bench of
# two binaries on one checkpoint, alternated (after, before, after), then the dense torch peer; results in $OUT.
#
# Usage (after `bash tools/device_build.sh` here, and the before binary copied to .device/tensorfold-before, with
# ../shared/peers/torch_dense.py copied to .device/, and .device carried): bash tools/gpu_ab.sh [SECONDS]
# SECONDS (default 580) bounds the whole run; each server bench gets --deadline from what is left.
# STREAM_ARGS (default --streams 256) sets the stream counts, e.g. "--streams 64 --streams 256"; BENCH_SECONDS
# (default 150) bounds each server bench.
# BEFORE_ENV (e.g. TF_CUDA_TMA=0): without a before binary, the before run is the same binary under these settings.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-580}"
OUT="${OUT:-./gpu-ab-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
echo "== CUDA tests at $(elapsed) s"
timeout 150 .device/cuda-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" | tee "$OUT/tests.txt"
if [[ ! -f "$CKPT/config.json" ]]; then
    echo "== checkpoint at $(elapsed) s"
    timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out "$CKPT" > "$OUT/checkpoint.log" 2>&1
fi
# bench NAME BINARY MORE...: the server bench of one binary, its table kept as OUT/NAME.md.
bench() {
    local name="$1" binary="$2" settings=()
    shift 2
    [[ "$name" == before && ! -f "$binary" ]] && binary=.device/tensorfold && read -ra settings <<< "${BEFORE_ENV:-}"
    echo "== $name ($binary ${settings[*]}) at $(elapsed) s"
    timeout "${BENCH_SECONDS:-150}" env "${settings[@]}" bash tools/bench_gpu.sh --binary "$binary" --out "$OUT/$name" \
        --ckpt "$CKPT" --skip peer ${STREAM_ARGS:---streams 256} --ttft-repeats 1 --deadline $(( ${BENCH_SECONDS:-150} - 10 )) "$@" > /dev/null 2>&1
    cp "$OUT/$name/results.md" "$OUT/$name.md" 2>/dev/null
    grep -E "batch-1|streams|TTFT|ready|load" "$OUT/$name.md" 2>/dev/null | head -8
}
bench after-1 .device/tensorfold
bench before .device/tensorfold-before --skip bandwidth
# AGAIN=0 leaves out the second after run, for a budget that holds only one pair and the peer.
[[ "${AGAIN:-1}" == 1 ]] && bench after-2 .device/tensorfold --skip bandwidth
if (( $(elapsed) + 90 < BUDGET )) && [[ -f .device/torch_dense.py ]]; then
    echo "== dense torch peer at $(elapsed) s"
    timeout $(( BUDGET - $(elapsed) - 10 )) python3 .device/torch_dense.py > "$OUT/dense.txt" 2>&1
    cat "$OUT/dense.txt"
fi
echo "== done at $(elapsed) s"
tar czf "${TMPDIR:-/tmp}/gpu-ab.tgz" -C "$OUT" . && mv "${TMPDIR:-/tmp}/gpu-ab.tgz" "$OUT/all.tgz"
# At most 8 files come back: the tables, the tests, the peer, and everything else inside all.tgz.
find "$OUT" -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
find "$OUT" -type f ! -name all.tgz ! -name tests.txt ! -name '*.md' ! -name dense.txt -delete
