#!/usr/bin/env bash
# The GEMM issue's server run in one command: the server bench with the TMA family and without it
# (TF_CUDA_TMA=0), the engine alone after 2,048 tokens at 64 and 256 lanes both ways, the dense torch peer
# (--ctx 512,2048), then ncu summaries of a batch-1 decode step and of a 256-lane decode round.
#
# Usage (after bash tools/device_build.sh here, ../shared/peers/torch_dense.py copied to .device/, and .device
# carried): bash tools/gpu_gemm_server.sh; results in $OUT (default ./gpu-gemm-server-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-gemm-server-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
BIN=.device/tensorfold
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
if [[ ! -f "$CKPT/config.json" ]]; then
    echo "== checkpoint at $(elapsed) s"
    timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out "$CKPT" > "$OUT/checkpoint.log" 2>&1
fi
# server NAME SETTINGS...: the server bench at 64 and 256 streams under the settings, its table as OUT/NAME.md.
server() {
    local name="$1"
    shift
    echo "== server $name at $(elapsed) s"
    timeout 150 env "$@" bash tools/bench_gpu.sh --binary "$BIN" --out "$OUT/$name" --ckpt "$CKPT" --skip peer \
        --skip bandwidth --streams 64 --streams 256 --ttft-repeats 1 --deadline 140 > /dev/null 2>&1
    cp "$OUT/$name/results.md" "$OUT/server-$name.md" 2>/dev/null
    grep -E "batch-1 decode tok|streams total|TTFT ms, best" "$OUT/server-$name.md" 2>/dev/null
}
server family TF_CUDA_TMA=1
server older TF_CUDA_TMA=0
# engine NAME LANES SETTINGS...: tensorfold bench alone, decoding 32 tokens after 2,048 in each lane.
engine() {
    local name="$1" lanes="$2"
    shift 2
    echo "== engine $name, $lanes lanes after 2048, at $(elapsed) s" | tee -a "$OUT/engine.txt"
    timeout 120 env "$@" "$BIN" bench --device cuda --model "$CKPT" --decode-after 2048 --decode-tokens 32 \
        --lanes "$lanes" --repeats 1 2>&1 | grep -iE "tok/s|decode" | tail -3 | tee -a "$OUT/engine.txt"
}
for lanes in 64 256; do
    engine family "$lanes" TF_CUDA_TMA=1
    engine older "$lanes" TF_CUDA_TMA=0
done
echo "== dense torch peer at $(elapsed) s"
timeout 150 python3 .device/torch_dense.py --ctx 512,2048 > "$OUT/dense.txt" 2>&1
cat "$OUT/dense.txt"
echo "== ncu at $(elapsed) s"
timeout 150 bash tools/gpu_profile.sh --ckpt "$CKPT" --out "$OUT/ncu-b1" "$BIN" > "$OUT/ncu-b1.log" 2>&1
cp "$OUT"/ncu-b1/*.txt "$OUT/ncu-batch1.txt" 2>/dev/null
timeout 200 bash tools/gpu_profile.sh --ckpt "$CKPT" --lanes 256 --after 64 --skip 12000 --count 330 \
    --out "$OUT/ncu-256" "$BIN" > "$OUT/ncu-256.log" 2>&1
cp "$OUT"/ncu-256/*.txt "$OUT/ncu-256lanes.txt" 2>/dev/null
head -25 "$OUT/ncu-batch1.txt" "$OUT/ncu-256lanes.txt" 2>/dev/null
echo "== done at $(elapsed) s"
tar czf "${TMPDIR:-/tmp}/gemm-server.tgz" -C "$OUT" . && mv "${TMPDIR:-/tmp}/gemm-server.tgz" "$OUT/all.tgz"
find "$OUT" -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
find "$OUT" -type f ! -name all.tgz ! -name '*.md' ! -name '*.txt' -delete
