#!/usr/bin/env bash
# Where a batch-1 decode step's time goes, per kernel, under ncu, for one or more of our binaries in one command.
#
# Usage: bash tools/gpu_profile.sh [--ckpt DIR] [--after N] [--lanes N] [--skip N] [--count N] [--out DIR] BINARY...
# Each binary runs `tensorfold bench`: a 512-token prompt, then 32 tokens decoded from --after tokens of context
# (default 576) in each of --lanes lanes (default 1) side by side, with CUDA graphs off so ncu sees each launch.
# ncu skips --skip launches (default 1000: both prefills; more lanes prefill more, so raise it with them) and
# times the next --count (default 300, about a token and a half), with clocks unlocked; only whole decode rounds count.
# Writes OUT/NAME.csv and OUT/NAME.txt (per kernel: launches, total and mean microseconds, DRAM throughput).
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT="${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b"
AFTER=576
LANES=1
SKIP=1000
COUNT=300
OUT_DIR="${OUT:-./gpu-profile-out}"
BINARIES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --ckpt) CKPT="$2"; shift 2 ;;
        --after) AFTER="$2"; shift 2 ;;
        --lanes) LANES="$2"; shift 2 ;;
        --skip) SKIP="$2"; shift 2 ;;
        --count) COUNT="$2"; shift 2 ;;
        --out) OUT_DIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        -*) echo "unknown argument: $1" >&2; exit 2 ;;
        *) BINARIES+=("$1"); shift ;;
    esac
done
[[ ${#BINARIES[@]} -gt 0 ]] || { echo "name at least one binary to profile" >&2; exit 2; }
[[ -f "$CKPT/config.json" ]] || { echo "no checkpoint at $CKPT: run tools/make_checkpoint.py first" >&2; exit 1; }
command -v ncu > /dev/null || { echo "ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
mkdir -p "$OUT_DIR"
for binary in "${BINARIES[@]}"; do
    name="$(basename "$binary")"
    TF_CUDA_GRAPHS=0 ncu --clock-control none --csv --launch-skip "$SKIP" --launch-count "$COUNT" \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        "$binary" bench --model "$CKPT" --device cuda --prompt-tokens 512 --decode-tokens 32 \
        --decode-after "$AFTER" --lanes "$LANES" --repeats 1 > "$OUT_DIR/$name.csv" 2> "$OUT_DIR/$name.log"
    python3 tools/ncu_summary.py --rounds "$OUT_DIR/$name.csv" | tee "$OUT_DIR/$name.txt"
done
