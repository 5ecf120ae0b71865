#!/usr/bin/env bash
# A second device command after gpu_attention.sh on the same warm machine: the other CUDA test binaries, and when
# the wgmma prompt kernel passed there (.device/run1-tests.txt), the CUDA tests, the engine's cold 8K and 32K
# prompt, the server's first token and ncu with it on.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./round2-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
tests() {
    local env="$1"; shift
    for t in "$@"; do
        echo "== $t $env at $(elapsed) s" | tee -a "$OUT/tests2.txt"
        timeout 150 env $env ".device/$t" --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked|differs" | tee -a "$OUT/tests2.txt"
    done
}
wg=0
awk '/TF_CUDA_WG_PROMPT=1/{f=1} f && /test result: ok/{ok=1} END{exit !ok}' .device/run1-tests.txt 2>/dev/null && wg=1
echo "wgmma prompt kernel passed in the first command: $wg" | tee "$OUT/wg.txt"
tests TF_CUDA_WIDE_DECODE=1 cuda-moe-tests cuda-hybrid-tests deltanet-tests cuda-runtime-tests gemm-tests cuda-speech-tests
[[ -f "$CKPT/config.json" ]] || timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out "$CKPT" --init-device cuda > "$OUT/checkpoint.log" 2>&1
prompt() {
    echo "== engine prompt $1 $2 at $(elapsed) s" | tee -a "$OUT/prompt.txt"
    timeout 120 env "$2" .device/tensorfold bench --device cuda --model "$CKPT" --prompt-tokens "$1" --decode-tokens 1 \
        --repeats 2 2>&1 | grep -iE "tok_s|tok/s|error" | tail -2 | tee -a "$OUT/prompt.txt"
}
if (( wg )); then
    tests TF_CUDA_WG_PROMPT=1 cuda-tests
    for n in 8192 32768; do prompt "$n" TF_CUDA_WG_PROMPT=1; prompt "$n" TF_CUDA_WG_PROMPT=0; done
    for n in 8192 32768; do
        echo "== server ttft $n, wgmma prompt, at $(elapsed) s"
        TF_CUDA_WG_PROMPT=1 timeout 150 bash tools/bench_gpu.sh --binary .device/tensorfold --out "$OUT/ttft-$n" --ckpt "$CKPT" \
            --skip peer --skip bandwidth --single-repeats 0 --streams 1 --stream-tokens 2 --ttft-repeats 2 \
            --long-prompt "$n" --context 33280 --deadline 140 > /dev/null 2>&1
        cp "$OUT/ttft-$n/results.md" "$OUT/ttft-wg-$n.md" 2>/dev/null
        grep -E "TTFT" "$OUT/ttft-wg-$n.md" 2>/dev/null
    done
    echo "== ncu of the wgmma prompt kernel at $(elapsed) s"
    timeout 120 ncu --clock-control none --set full -k regex:attention_wg --launch-count 1 \
        python3 tools/attn_bench.py --wg --once --prompts 8192 --lanes "" --out "$OUT/once" > "$OUT/ncu-wg.txt" 2>&1
    grep -E "attention|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Pipe|Warp Cycles" "$OUT/ncu-wg.txt" | head -40
else
    for n in 8192 32768; do prompt "$n" TF_CUDA_WG_PROMPT=0; done
fi
echo "== done at $(elapsed) s"
find "$OUT" -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
