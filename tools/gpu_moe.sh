#!/usr/bin/env bash
# One device-tool command for the experts on the GPU (issue 37): the MoE CUDA tests, the Qwen3-30B-A3B shape in
# bf16 made here, the engine alone at 1, 64 and 256 lanes after 512 tokens and a 2,048-token prompt, beside the torch
# grouped-GEMM peer (tools/torch_moe.py) in the same command; results in $OUT.
#
# Usage (after `bash tools/device_build.sh` here, binaries gzipped in .device/, and .device carried):
#     bash tools/gpu_moe.sh [SECONDS] [LAYERS]
# LAYERS (default 48) truncates the shape, for a short run; the peer runs the same number of layers.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-560}"
LAYERS="${2:-48}"
OUT="${OUT:-./gpu-moe-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/qwen3-30b-a3b-$LAYERS"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
left() { echo "$(( BUDGET - $(elapsed) ))"; }
mkdir -p "$OUT"
(cd .device && for f in *.gz; do [[ -f "$f" ]] && gunzip -f "$f"; done; chmod +x ./* 2>/dev/null)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
echo "== cuda-moe-tests at $(elapsed) s" | tee "$OUT/tests.txt"
timeout 200 .device/cuda-moe-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked|differs|agreed" |
    tee -a "$OUT/tests.txt"
if [[ ! -f "$CKPT/config.json" ]]; then
    echo "== checkpoint at $(elapsed) s"
    timeout $(( $(left) < 300 ? $(left) : 300 )) python3 tools/make_checkpoint.py --shape qwen3-30b-a3b --layers "$LAYERS" \
        --out "$CKPT" --init-device cuda > "$OUT/checkpoint.log" 2>&1 || tail -5 "$OUT/checkpoint.log"
fi
for lanes in 1 64 256; do
    (( $(left) > 60 )) || break
    echo "== engine, $lanes lanes after 512, at $(elapsed) s" | tee -a "$OUT/engine.txt"
    TF_CUDA_EXPERTS=1 timeout 150 .device/tensorfold bench --device cuda --model "$CKPT" --prompt-tokens 2048 --decode-after 512 \
        --decode-tokens 32 --lanes "$lanes" --repeats 1 2>&1 | grep -iE "tok_s|tok/s|error|weights on" | tail -3 | tee -a "$OUT/engine.txt"
done
if (( $(left) > 60 )); then
    echo "== torch grouped-GEMM peer at $(elapsed) s"
    timeout $(( $(left) - 10 )) python3 tools/torch_moe.py --layers "$LAYERS" --ctx 512 --prefill 2048 \
        --batches 1,64,256 > "$OUT/peer.txt" 2>&1
    cat "$OUT/peer.txt"
fi
echo "== done at $(elapsed) s"
