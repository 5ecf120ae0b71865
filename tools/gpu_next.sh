#!/usr/bin/env bash
# One device-tool command for the hybrid family on the GPU (issue 39): the hybrid CUDA tests, the Qwen3-Next-80B-A3B
# shape cut to LAYERS layers in bf16 made here, the engine alone at 1 and 64 lanes after 512 tokens and a 2,048-token
# prompt, the server at one stream with the MTP head's drafts and without, beside transformers' Qwen3-Next with
# flash-linear-attention's kernels (tools/torch_next.py) in the same command; results in $OUT.
# The checkpoint's head agrees with its model by construction (make_checkpoint.py --agreeing-head: every block's
# output projection is zero), so the drafts bench measures what kept drafts gain; the kernels' speed does not depend
# on the weights' values, though the routing does.
#
# Usage (after `bash tools/device_build.sh` here, binaries gzipped in .device/, the peer's wheels in .whl/ (see
# docs/hybrid.md), and both carried): bash tools/gpu_next.sh [SECONDS] [LAYERS]
# SKIP (e.g. "tests peer") leaves parts out: tests, engine, ab, drafts, ncu, peer. With .device/tensorfold-before (a
# build of other code, carried gzipped), `ab` runs it and the current binary in turn at 1 lane.
# LAYERS (default 8: 2 attention and 6 linear layers, 29 GB with the MTP head) keeps the checkpoint within the
# machine's 64 GB disk.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-560}"
LAYERS="${2:-8}"
OUT="${OUT:-./gpu-next-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/qwen3-next-80b-a3b-$LAYERS-agree"
source tools/gpu_common.sh
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site
fi
if wants tests; then
    echo "== cuda-hybrid-tests at $(elapsed) s" | tee "$OUT/tests.txt"
    TF_CUDA_WIDE_DECODE=1 timeout 200 .device/cuda-hybrid-tests --test-threads 1 2>&1 |
        grep -E "^test |test result|skipped|panicked|differs|agreed|error" | tee -a "$OUT/tests.txt"
    # The runtime's equalities (and KV in lent memory) on a hybrid checkpoint with its MTP head, which drafts too.
    echo "== cuda-runtime-tests on qwen3_next_mtp at $(elapsed) s" | tee -a "$OUT/tests.txt"
    TF_TEST_ARCH=qwen3_next_mtp timeout 200 .device/cuda-runtime-tests --test-threads 1 2>&1 |
        grep -E "^test |test result|skipped|panicked|differs|pages with" | tee -a "$OUT/tests.txt"
fi
if [[ ! -f "$CKPT/tokenizer.json" ]]; then
    # The machine's disk holds one such checkpoint: other benchmark checkpoints, and a partial one, go first.
    find "$(dirname "$CKPT")" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} + 2>/dev/null
    echo "== checkpoint at $(elapsed) s"
    timeout $(( $(left) < 300 ? $(left) : 300 )) python3 tools/make_checkpoint.py --shape qwen3-next-80b-a3b \
        --layers "$LAYERS" --out "$CKPT" --init-device cuda --agreeing-head > "$OUT/checkpoint.log" 2>&1 || tail -5 "$OUT/checkpoint.log"
fi
# engine BINARY LANES: that build's engine alone, 32 tokens decoded after 512 in each lane, and a 2,048-token prompt.
engine() {
    (( $(left) > 60 )) || return 1
    echo "== $1, $2 lanes after 512, at $(elapsed) s" | tee -a "$OUT/engine.txt"
    TF_CUDA_EXPERTS=1 timeout 150 ".device/$1" bench --device cuda --model "$CKPT" --prompt-tokens 2048 \
        --decode-after 512 --decode-tokens 32 --lanes "$2" --repeats 1 2>&1 | grep -iE "tok_s|tok/s|error|weights on" |
        tail -3 | tee -a "$OUT/engine.txt"
}
if wants engine; then
    for lanes in 1 64; do engine tensorfold "$lanes" || break; done
fi
if wants ab && [[ -x .device/tensorfold-before ]]; then
    for binary in tensorfold-before tensorfold tensorfold-before tensorfold; do engine "$binary" 1 || break; done
fi
if wants drafts && (( $(left) > 150 )); then
    echo "== server, one stream, MTP drafts and none, at $(elapsed) s" | tee -a "$OUT/engine.txt"
    TF_CUDA_EXPERTS=1 timeout 140 python3 tools/bench_drafts.py --binary .device/tensorfold --model "$CKPT" \
        --serve-arg "--device cuda" --streams 1 --repeats 2 --tasks code,list --max-tokens 128 2> "$OUT/drafts.err" |
        tee -a "$OUT/engine.txt" | grep -E '"(plain_tok_s|drafted_tok_s|ratio|accepted_share|identical)' | head -20
    tail -3 "$OUT/drafts.err"
fi
if wants ncu && (( $(left) > 100 )); then
    # Whole batch-1 decode rounds after the prompt's and the context's forwards (ncu_summary --rounds).
    echo "== ncu of batch-1 steps at $(elapsed) s"
    TF_CUDA_GRAPHS=0 timeout 90 ncu --clock-control none --csv --launch-skip $(( 3 * 30 * LAYERS )) \
        --launch-count $(( 4 * 30 * LAYERS )) \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed .device/tensorfold bench \
        --model "$CKPT" --device cuda --prompt-tokens 512 --decode-tokens 8 --decode-after 576 --lanes 1 --repeats 1 \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
    python3 tools/ncu_summary.py --rounds "$OUT/ncu.csv" | tee "$OUT/ncu.txt" | tail -30
fi
if wants peer && (( $(left) > 60 )); then
    echo "== transformers peer at $(elapsed) s"
    timeout $(( $(left) - 10 )) python3 tools/torch_next.py --layers "$LAYERS" --ctx 512 --prefill 2048 \
        --batches 1,64 > "$OUT/peer.txt" 2> "$OUT/peer.err"
    cat "$OUT/peer.txt"
    grep -m3 "falling back" "$OUT/peer.err"
fi
echo "== done at $(elapsed) s"
