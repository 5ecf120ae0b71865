#!/usr/bin/env bash
# One device-tool command for the experts on the GPU (issue 37): the CUDA tests of every part the experts touch, the
# grouped-GEMM microbenchmark against torch's (tools/moe_bench.py), the Qwen3-30B-A3B shape in bf16 made here, the
# engine alone at 1 and 4 lanes with the experts' split decode tiles (TF_CUDA_MOE_SPLIT) and without and at 1 with
# RoPE inside attention, an ncu breakdown of a batch-1 step, and the engine at 1, 64 and 256 lanes after 512 tokens
# and a 2,048-token prompt beside the torch grouped-GEMM peer (tools/torch_moe.py) in the same command; results in
# $OUT.
#
# Usage (after `bash tools/device_build.sh` here, binaries gzipped in .device/, and .device carried):
#     bash tools/gpu_moe.sh [SECONDS] [LAYERS]
# LAYERS (default 48) truncates the shape; the peer runs the same number of layers.
# SKIP (e.g. "tests ncu") leaves parts out: tests, micro, ab, ncu, engine, peer.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-560}"
LAYERS="${2:-48}"
OUT="${OUT:-./gpu-moe-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/qwen3-30b-a3b-$LAYERS"
source tools/gpu_common.sh
if wants tests; then
    echo "== tests at $(elapsed) s" | tee "$OUT/tests.txt"
    # binary SETTINGS...: one test binary, its per-test lines and totals.
    tests() {
        local binary="$1"
        shift
        echo "-- $binary $*" >> "$OUT/tests.txt"
        timeout 150 env "$@" ".device/$binary" --test-threads 1 2>&1 |
            grep -E "^test |test result|skipped|panicked|differs|agreed" >> "$OUT/tests.txt"
    }
    tests cuda-moe-tests
    tests cuda-moe-tests TF_CUDA_MOE_SPLIT=1
    tests cuda-hybrid-tests
    tests attention-tests
    tests cuda-runtime-tests
    tests cuda-runtime-tests TF_TEST_ARCH=qwen3_moe
    tests cuda-runtime-tests TF_TEST_ARCH=mixtral
    tests gemm-tests
    tests cuda-tests
    # The server on the GPU: experts and the hybrid (its head drafting) serve chat, streams, tools and schemas, and
    # keep each request's bits alone, among others, resumed and drafted.
    tests moe-serving-tests TF_TEST_DEVICE=cuda TF_TEST_BINARY="$PWD/.device/tensorfold"
    cat "$OUT/tests.txt"
fi
if wants micro; then
    echo "== grouped GEMMs at $(elapsed) s"
    timeout 150 python3 tools/moe_bench.py --out "$OUT/micro" > "$OUT/micro.log" 2>&1
    cp "$OUT/micro/moe_bench.md" "$OUT/moe_bench.md" 2>/dev/null
    tail -3 "$OUT/micro.log"
fi
if [[ ! -f "$CKPT/config.json" ]]; then
    echo "== checkpoint at $(elapsed) s"
    timeout $(( $(left) < 300 ? $(left) : 300 )) python3 tools/make_checkpoint.py --shape qwen3-30b-a3b --layers "$LAYERS" \
        --out "$CKPT" --init-device cuda > "$OUT/checkpoint.log" 2>&1 || tail -5 "$OUT/checkpoint.log"
fi
# engine NAME LANES SETTINGS...: tensorfold bench alone, 32 tokens decoded after 512 in each lane.
engine() {
    local name="$1" lanes="$2"
    shift 2
    echo "== engine $name, $lanes lanes after 512, at $(elapsed) s" | tee -a "$OUT/engine.txt"
    timeout 150 env "$@" .device/tensorfold bench --device cuda --model "$CKPT" --prompt-tokens 2048 --decode-after 512 \
        --decode-tokens 32 --lanes "$lanes" --repeats 2 2>&1 | grep -iE "tok_s|error" | tail -3 | tee -a "$OUT/engine.txt"
}
if wants ab; then
    for lanes in 1 4; do
        engine plain "$lanes"
        engine moe-split "$lanes" TF_CUDA_MOE_SPLIT=1
    done
    engine fused-rope 1 TF_CUDA_FUSE_ROPE=1
fi
if wants ncu && (( $(left) > 90 )); then
    # Three forwards come before decoding (the prompt, the context in two chunks): about 12 launches a layer each.
    echo "== ncu of batch-1 steps at $(elapsed) s"
    skip=$(( 3 * (12 * LAYERS + 8) + 20 ))
    TF_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --csv --launch-skip "$skip" --launch-count $(( 3 * (12 * LAYERS + 8) )) \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed .device/tensorfold bench \
        --model "$CKPT" --device cuda --prompt-tokens 512 --decode-tokens 8 --decode-after 576 --lanes 1 --repeats 1 \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
    python3 tools/ncu_summary.py --rounds "$OUT/ncu.csv" | tee "$OUT/ncu.txt" | tail -25
fi
if wants engine; then
    for lanes in 1 64 256; do
        (( $(left) > 60 )) || break
        engine default "$lanes"
    done
fi
if wants peer && (( $(left) > 60 )); then
    echo "== torch grouped-GEMM peer at $(elapsed) s"
    timeout $(( $(left) - 10 )) python3 tools/torch_moe.py --layers "$LAYERS" --ctx 512 --prefill 2048 \
        --batches 1,64,256 > "$OUT/peer.txt" 2>&1
    cat "$OUT/peer.txt"
fi
echo "== done at $(elapsed) s"
find "$OUT" -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
