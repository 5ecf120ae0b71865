#!/usr/bin/env bash
# GPU benchmark entry point: our server against transformers on one seeded random checkpoint.
#
# Usage: bash tools/bench_gpu.sh [--shape llama-3.1-8b] [--binary .device/tensorfold] [--out DIR] [MORE...]
#   --out defaults to $OUT when set, else ./bench-out; the checkpoint is made once under
#   ${TMPDIR:-/tmp}/tensorfold-bench (or --work DIR) and reused. MORE goes to `tools/bench_gpu.py run`
#   (--layers N, --device cpu|none, --commit SHA, --skip peer, --deadline S, --streams N, ...).
# Environment: PYTHON (python3), TF_COMMIT (the commit to name in the report).
# Writes four files to OUT: results.json, results.md, bench.log (progress) and server.log.
set -euo pipefail

BENCH_T0="$(date +%s.%N)"
export BENCH_T0
cd "$(dirname "$0")/.."

SHAPE="llama-3.1-8b"
BINARY=".device/tensorfold"
OUT_DIR="${OUT:-./bench-out}"
REST=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --shape) SHAPE="$2"; shift 2 ;;
        --shape=*) SHAPE="${1#*=}"; shift ;;
        --binary) BINARY="$2"; shift 2 ;;
        --binary=*) BINARY="${1#*=}"; shift ;;
        --out) OUT_DIR="$2"; shift 2 ;;
        --out=*) OUT_DIR="${1#*=}"; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) REST+=("$1"); shift ;;
    esac
done

mkdir -p "$OUT_DIR"
if [[ -z "${TF_COMMIT:-}" ]] && git rev-parse --git-dir >/dev/null 2>&1; then
    TF_COMMIT="$(git describe --always --dirty 2>/dev/null || true)"
    export TF_COMMIT
fi
# Progress goes to the terminal and to OUT/bench.log; the report's files are written either way.
"${PYTHON:-python3}" -u tools/bench_gpu.py run --shape "$SHAPE" --binary "$BINARY" --out "$OUT_DIR" \
    ${REST[@]+"${REST[@]}"} 2>&1 | tee "$OUT_DIR/bench.log"
