#!/usr/bin/env bash
# One device-tool command for attention: its exactness tests, the attention bench against torch SDPA, the engine
# alone at 64 and 256 lanes after 2,048 tokens with the wide decode kernel and without, the dense torch peer, the
# server's cold 8K and 32K time to first token beside the peer's prefill, the server at a 131,072-token context
# (a longer prompt refused, a 65,536-token one answered), and ncu of an 8K prompt's attention and a
# 256-lane decode round's; results in $OUT.
#
# Usage (after `bash tools/device_build.sh` here, binaries gzipped in .device/, ../shared/peers/torch_dense.py
# copied to .device/, and .device carried): bash tools/gpu_attention.sh [SECONDS]
# SKIP (e.g. "tests ncu") leaves parts out: tests, bench, engine, peer, ttft, long, ncu.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-560}"
OUT="${OUT:-./gpu-attention-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
source tools/gpu_common.sh
if wants tests; then
    # The CUDA suite with the wide decode kernel on, so its rows meet every server-shaped test.
    echo "== tests at $(elapsed) s" | tee "$OUT/tests.txt"
    for t in attention-tests cuda-tests; do
        echo "-- $t" >> "$OUT/tests.txt"
        TF_CUDA_WIDE_DECODE=1 timeout 240 ".device/$t" --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked|differs" >> "$OUT/tests.txt"
    done
    # The attention tests again with prompt rounds on the wgmma kernel.
    echo "-- attention-tests, TF_CUDA_WG_PROMPT=1" >> "$OUT/tests.txt"
    TF_CUDA_WG_PROMPT=1 timeout 120 .device/attention-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked|differs" >> "$OUT/tests.txt"
    cat "$OUT/tests.txt"
fi
if wants bench; then
    echo "== attention bench at $(elapsed) s"
    timeout 200 python3 tools/attn_bench.py --out "$OUT/bench" > "$OUT/bench.log" 2>&1
    cp "$OUT/bench/attn_bench.md" "$OUT/attn_bench.md" 2>/dev/null
    cat "$OUT/bench.log" | tail -20
    # The wgmma prompt kernel apart, so a fault there costs only this run.
    echo "== wgmma prompt bench at $(elapsed) s"
    timeout 90 python3 tools/attn_bench.py --wg --lanes "" --out "$OUT/bench-wg" > "$OUT/bench-wg.log" 2>&1
    cp "$OUT/bench-wg/attn_bench.md" "$OUT/attn_bench_wg.md" 2>/dev/null
    grep -E "wgmma|prompt|Error|error" "$OUT/bench-wg.log" | grep -v Warning | tail -8
fi
if (wants engine || wants ttft) && [[ ! -f "$CKPT/config.json" ]]; then
    echo "== checkpoint at $(elapsed) s"
    timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out "$CKPT" --init-device cuda > "$OUT/checkpoint.log" 2>&1
fi
if wants engine; then
    # engine NAME LANES SETTINGS...: tensorfold bench alone, decoding 32 tokens after 2,048 in each lane.
    engine() {
        local name="$1" lanes="$2"
        shift 2
        echo "== engine $name, $lanes lanes after 2048, at $(elapsed) s" | tee -a "$OUT/engine.txt"
        timeout 150 env "$@" .device/tensorfold bench --device cuda --model "$CKPT" --decode-after 2048 \
            --decode-tokens 32 --lanes "$lanes" --repeats 1 2>&1 | grep -iE "tok/s|decode|error" | tail -3 | tee -a "$OUT/engine.txt"
    }
    # ENGINES picks which of the two (default both).
    for lanes in 64 256; do
        [[ " ${ENGINES:-wide rows} " == *" wide "* ]] && engine wide "$lanes" TF_CUDA_WIDE_DECODE=1
        [[ " ${ENGINES:-wide rows} " == *" rows "* ]] && engine rows "$lanes" TF_CUDA_WIDE_DECODE=0
    done
fi
if wants peer && (( $(left) > 120 )); then
    echo "== dense torch peer at $(elapsed) s"
    timeout 150 python3 .device/torch_dense.py --ctx 2048 --prefill 8192,32768 > "$OUT/dense.txt" 2>&1
    cat "$OUT/dense.txt"
fi
if wants ttft; then
    # The server's cold time to first token: one warm-up prompt, then two distinct cold ones, at 8K and at 32K.
    for n in 8192 32768; do
        (( $(left) > 90 )) || break
        echo "== server ttft $n at $(elapsed) s"
        timeout $(( $(left) < 150 ? $(left) : 150 )) bash tools/bench_gpu.sh --binary .device/tensorfold --out "$OUT/ttft-$n" --ckpt "$CKPT" \
            --skip peer --skip bandwidth --single-repeats 0 --streams 1 --stream-tokens 2 --ttft-repeats 2 \
            --long-prompt "$n" --context 33280 --deadline 140 > /dev/null 2>&1
        cp "$OUT/ttft-$n/results.md" "$OUT/ttft-$n.md" 2>/dev/null
        grep -E "TTFT" "$OUT/ttft-$n.md" 2>/dev/null
    done
fi
if wants long && (( $(left) > 120 )); then
    echo "== long context at $(elapsed) s"
    timeout $(( $(left) < 260 ? $(left) - 20 : 240 )) python3 tools/long_context.py --binary .device/tensorfold --ckpt "$CKPT" --context 131072 \
        --prompt 65536 --log "$OUT/long-server.txt" | tee "$OUT/long.txt"
    grep -E "kv_tokens" "$OUT/long-server.txt" | tail -1 >> "$OUT/long.txt"
fi
if wants ncu && (( $(left) > 60 )); then
    echo "== ncu at $(elapsed) s"
    timeout $(( $(left) - 20 )) ncu --clock-control none --set full -k regex:attention --launch-count 3 \
        python3 tools/attn_bench.py --once --prompts 8192 --lanes 256 --ctx 2048 --out "$OUT/once" > "$OUT/ncu.txt" 2>&1
    grep -E "attention|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Pipe|Warp Cycles" "$OUT/ncu.txt" | head -80
fi
echo "== done at $(elapsed) s"
tar czf "${TMPDIR:-/tmp}/gpu-attention.tgz" -C "$OUT" . && mv "${TMPDIR:-/tmp}/gpu-attention.tgz" "$OUT/all.tgz"
find "$OUT" -mindepth 1 -type d -exec rm -rf {} + 2>/dev/null
find "$OUT" -type f ! -name all.tgz ! -name '*.md' ! -name '*.txt' -delete
